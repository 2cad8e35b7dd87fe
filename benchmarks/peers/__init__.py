"""One small adapter per library, all with the same interface.

An adapter module has ``NAME``, ``version()`` (raises :class:`Missing` when the library cannot
be imported or cannot run on this device) and ``build(tp, dtype, conv, options)`` returning an
:class:`Impl`: the library's product (or convolution) on arrays in the library's own layout,
plus the conversions between e3nn's layout (``mul_ir``, e3nn weight order) and the library's.
The conversions run outside the timed region; each adapter's docstring says whether a user of
that library would keep data in its layout throughout a model.

``build`` derives the library's problem from the jax_cgtp problem (``tp.irreps_in1/in2/out``,
``tp.instructions``) and raises :class:`Unsupported` when the library cannot express it.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

LIBRARIES = ("jax_cgtp", "e3nn", "cueq", "oeq")
# Selectable with --libs, not run by default: jax_cgtp's deterministic convolution, its atomic
# one called with a sorted graph, and InstaDeep's e3j.
OPTIONAL_LIBRARIES = ("jax_cgtp_det", "jax_cgtp_graph", "e3j")

_MODULES = {"jax_cgtp": "cgtp", "e3nn": "e3nn_jax_peer", "cueq": "cueq", "oeq": "oeq", "jax_cgtp_det": "cgtp_det",
            "jax_cgtp_graph": "cgtp_graph", "e3j": "e3j"}


class Missing(Exception):
    """The library is not importable here, or cannot run on this device."""


class Unsupported(Exception):
    """The library cannot express this problem (the row says why)."""


def _identity(kind, array):
    return array


def _same_graph(src, dst, nodes):
    return src, dst


@dataclasses.dataclass
class Impl:
    """A library's product, ready to be wrapped by :func:`benchmarks.phases.phase_function`.

    ``apply(x, y, w)`` (or ``apply(x, y, w, src, dst)`` for the convolution, with ``x`` the node
    features and the node count ``x.shape[0]``) takes library-layout arrays. ``to_library(kind,
    a)`` and ``from_library(kind, a)`` convert an operand of kind ``"x"``, ``"y"``, ``"w"`` or
    ``"z"`` (also used for ``g``) between e3nn's layout and the library's. ``prepare_graph(src,
    dst, nodes)`` returns the two graph arguments ``apply`` takes in place of ``src, dst`` (work
    done once per graph, outside the timed region).
    """

    apply: Callable
    to_library: Callable = _identity
    from_library: Callable = _identity
    prepare_graph: Callable = _same_graph
    note: str = ""

    def arguments(self, inputs) -> dict:
        """The benchmark's ``inputs`` (:class:`benchmarks.inputs.Inputs`) as this library takes
        them: ``x, y, w, g`` in its layout and, for a convolution, its graph arguments."""
        arguments = {name: self.to_library("z" if name == "g" else name, getattr(inputs, name))
                     for name in ("x", "y", "w", "g")}
        if inputs.src is not None:
            arguments["src"], arguments["dst"] = self.prepare_graph(inputs.src, inputs.dst, inputs.nodes)
        return arguments


def adapter(name: str):
    """The adapter module of library ``name`` (one of :data:`LIBRARIES`)."""
    return importlib.import_module(f"{__name__}.{_MODULES[name]}")
