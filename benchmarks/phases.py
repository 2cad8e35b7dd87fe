"""The timed phases, built the same way on top of any library's product.

With ``T`` a library's product ``z = T(x, y, w)`` (or its convolution
``out[n] = sum_{e: dst[e] == n} T(x[src[e]], y[e], w[e])``) and ``g`` a random cotangent of ``z``:

- ``fwd``: ``z``;
- ``bwd``: the gradients of ``sum(z * g)`` w.r.t. ``(x, y, w)`` (one VJP);
- ``dbwd``: the gradient w.r.t. ``(w, x)`` of ``|d/dy sum(z * g)|^2``, the pattern of training
  on forces;
- ``train`` (not run by default): the gradients w.r.t. ``(x, y, w)`` of the squared gradients of
  the energy ``|z|^2 / 2``, the pattern of training on forces when ``x``, ``y`` and ``w`` all
  depend on the positions (a second layer's node features, the spherical harmonics, the radial
  network's weights);
- ``conv_fwd``, ``conv_bwd``, ``conv_dbwd``, ``conv_train``: the same for the convolution.

Every library gets exactly these functions; only ``T`` differs, so the timings compare the
libraries' products and their derivative rules, not different loss code.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from .cost import base_phase

# Which operand each result of a phase is the size and layout of (``z`` for ``g``-shaped results).
OUTPUT_KINDS = {"fwd": ("z",), "bwd": ("x", "y", "w"), "dbwd": ("w", "x"), "train": ("x", "y", "w")}
INPUT_NAMES = {"fwd": ("x", "y", "w"), "bwd": ("x", "y", "w", "g"), "dbwd": ("x", "y", "w", "g"),
               "train": ("x", "y", "w")}


def is_conv(phase: str) -> bool:
    return phase.startswith("conv_")


def input_names(phase: str) -> tuple[str, ...]:
    """Names of the arrays the phase function takes, in order (``src, dst`` last for a conv)."""
    return INPUT_NAMES[base_phase(phase)] + (("src", "dst") if is_conv(phase) else ())


def output_kinds(phase: str) -> tuple[str, ...]:
    return OUTPUT_KINDS[base_phase(phase)]


def _fwd(product):
    return lambda x, y, w: (product(x, y, w),)


def _bwd(product):
    def bwd(x, y, w, g):
        _, pullback = jax.vjp(product, x, y, w)
        return pullback(g)

    return bwd


def _dbwd(product):
    def dbwd(x, y, w, g):
        def force_loss(w_, x_):
            _, pullback = jax.vjp(lambda y_: product(x_, y_, w_), y)
            (y_bar,) = pullback(g)
            return jnp.sum(y_bar * y_bar)

        return jax.grad(force_loss, argnums=(0, 1))(w, x)

    return dbwd


def _train(product):
    def energy(x, y, w):
        return 0.5 * jnp.sum(product(x, y, w) ** 2)

    def force_loss(x, y, w):
        return sum(jnp.sum(g * g) for g in jax.grad(energy, argnums=(0, 1, 2))(x, y, w))

    def train(x, y, w):
        return jax.grad(force_loss, argnums=(0, 1, 2))(x, y, w)

    return train


_BUILDERS = {"fwd": _fwd, "bwd": _bwd, "dbwd": _dbwd, "train": _train}


def phase_function(phase: str, apply: Callable) -> Callable:
    """The un-jitted function of ``phase`` taking :func:`input_names` and returning a tuple.

    ``apply`` is ``apply(x, y, w)`` for the plain phases and ``apply(x, y, w, src, dst)`` for
    the convolution phases.
    """
    builder = _BUILDERS[base_phase(phase)]
    if not is_conv(phase):
        return builder(apply)

    def conv_phase(*args):
        *operands, src, dst = args
        return builder(lambda x, y, w: apply(x, y, w, src, dst))(*operands)

    return conv_phase
