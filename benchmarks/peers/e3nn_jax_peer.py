"""e3nn-jax: ``e3nn_jax.legacy.FunctionalTensorProduct`` vmapped over edges.

The problem is the same instruction list with the same normalisation settings; ``build``
checks that e3nn-jax's normalised path weights equal jax_cgtp's. The convolution is what an
e3nn-jax model writes: gather ``x[src]``, the vmapped product, ``jax.ops.segment_sum`` by
``dst``. Layout and weight order are e3nn's own, so nothing is converted.
"""

from __future__ import annotations

import math

import jax

from .. import problems
from . import Impl, Unsupported

NAME = "e3nn"


def version() -> str:
    import e3nn_jax

    return e3nn_jax.__version__


def _functional_tp(problem):
    from e3nn_jax.legacy import FunctionalTensorProduct

    tp = FunctionalTensorProduct(
        problem.irreps_in1, problem.irreps_in2, problem.irreps_out,
        problems.instruction_tuples(problem),
        irrep_normalization=problem.irrep_normalization,
        path_normalization=problem.path_normalization,
        gradient_normalization="path",
    )
    for ours, theirs in zip(problem.instructions, tp.instructions):
        if not math.isclose(ours.path_weight, theirs.path_weight, rel_tol=1e-12, abs_tol=1e-300):
            raise Unsupported(
                f"e3nn-jax normalises path {ours} to {theirs.path_weight}, jax_cgtp to {ours.path_weight}"
            )
    return tp


def build(tp, dtype, conv: bool, options: dict) -> Impl:
    import e3nn_jax as e3nn

    problem = tp.problem
    functional = _functional_tp(problem)

    def single(x, y, w):
        return functional.left_right(
            w, e3nn.IrrepsArray(problem.irreps_in1, x), e3nn.IrrepsArray(problem.irreps_in2, y)
        ).array

    def product(x, y, w):  # per-edge weights, or one row shared by every edge
        return jax.vmap(single, in_axes=(0, 0, 0 if w.ndim == 2 else None))(x, y, w)

    if not conv:
        return Impl(apply=product)

    def apply(x, y, w, src, dst):
        return jax.ops.segment_sum(product(x[src], y, w), dst, num_segments=x.shape[0])

    return Impl(apply=apply, note="gather + vmapped product + segment_sum")
