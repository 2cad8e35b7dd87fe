"""Run code written for e3nn-jax on jax_cgtp without editing it: :func:`replacing_e3nn`.

Model code often imports e3nn-jax's tensor products by name (``from e3nn_jax.legacy import
FunctionalTensorProduct``), so replacing the attributes of ``e3nn_jax`` alone would miss the names
already bound in the model's modules. Inside the context, every loaded module's attribute that *is*
one of e3nn-jax's tensor products (the object itself, whatever the name it was imported under) is
jax_cgtp's drop-in (:mod:`jax_cgtp.e3nn`); on exit each is restored.

Models trace their tensor products when they are initialised or first called under ``jax.jit``: put
both inside the context (a function jitted before keeps e3nn-jax's operations). Parameters are the
same pytrees, in the same layout, so a model trained on e3nn-jax runs on jax_cgtp unchanged.
"""

from __future__ import annotations

import contextlib
import sys

import e3nn_jax
import e3nn_jax.legacy

from . import e3nn as dropin


def _replacements() -> dict[int, tuple[object, object]]:
    """``{id(e3nn-jax's object): (e3nn-jax's object, jax_cgtp's)}``."""
    pairs = [
        (e3nn_jax.tensor_product, dropin.tensor_product),
        (e3nn_jax.legacy.FunctionalTensorProduct, dropin.FunctionalTensorProduct),
        (e3nn_jax.legacy.FunctionalFullyConnectedTensorProduct, dropin.FunctionalFullyConnectedTensorProduct),
    ]
    return {id(original): (original, replacement) for original, replacement in pairs}


@contextlib.contextmanager
def replacing_e3nn():
    """Within the block, e3nn-jax's ``tensor_product``, ``legacy.FunctionalTensorProduct`` and
    ``legacy.FunctionalFullyConnectedTensorProduct`` are jax_cgtp's, under every name a loaded
    module binds them to (import the model's modules before entering).

    >>> import e3nn_jax, jax_cgtp
    >>> with jax_cgtp.replacing_e3nn():
    ...     e3nn_jax.tensor_product is jax_cgtp.e3nn.tensor_product
    True
    >>> e3nn_jax.tensor_product is jax_cgtp.e3nn.tensor_product
    False
    """
    replacements = _replacements()
    replaced = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)  # sys.modules may hold objects that are not modules
        if not isinstance(namespace, dict) or str(getattr(module, "__name__", "")).startswith("jax_cgtp"):
            continue
        for name, value in list(namespace.items()):
            pair = replacements.get(id(value))
            if pair is not None and value is pair[0]:
                setattr(module, name, pair[1])
                replaced.append((module, name, value))
    try:
        yield
    finally:
        for module, name, value in reversed(replaced):
            setattr(module, name, value)
