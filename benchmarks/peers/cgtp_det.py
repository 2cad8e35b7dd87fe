"""jax_cgtp's deterministic convolution (``TensorProductConv(..., deterministic=True)``).

Not a peer: selected with ``--libs ...,jax_cgtp_det`` to compare it with the atomic default
(its "speedup" column is then ``deterministic ms / atomic ms``). The edge orderings come from
``jax_cgtp.sort_graph``, built once per graph outside the timed region as a training loop
would. The plain product has no deterministic variant: those rows say "unsupported".
"""

from __future__ import annotations

import jax_cgtp

from .. import problems
from . import Impl, Unsupported

NAME = "jax_cgtp_det"


def version() -> str:
    return jax_cgtp.__version__


def build_on_sorted_graph(tp, deterministic: bool) -> Impl:
    """jax_cgtp's convolution of ``tp``'s problem, called with ``graph=jax_cgtp.sort_graph(...)``."""
    problem = tp.problem
    op = jax_cgtp.TensorProductConv(
        problem.irreps_in1, problem.irreps_in2, problem.irreps_out, problems.instruction_tuples(problem),
        irrep_normalization=problem.irrep_normalization, path_normalization=problem.path_normalization,
        backend=tp.backend, deterministic=deterministic,
    )
    if op.problem != problem:
        raise Unsupported(f"the convolution's problem differs: {op.problem}")

    def prepare_graph(src, dst, nodes):
        return jax_cgtp.sort_graph(src, dst, nodes), None

    def apply(x, y, w, graph, _):
        return op(x, y, w, graph=graph)

    variant = "deterministic" if deterministic else "atomic, graph sorted once"
    return Impl(apply=apply, prepare_graph=prepare_graph, note=f"backend={tp.backend}, {variant}")


def build(tp, dtype, conv: bool, options: dict) -> Impl:
    if not conv:
        raise Unsupported("only the convolution has a deterministic variant")
    return build_on_sorted_graph(tp, deterministic=True)
