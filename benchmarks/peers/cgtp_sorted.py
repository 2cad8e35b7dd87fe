"""jax_cgtp's convolution given the sorted graph (``conv(x, y, w, graph=jax_cgtp.sort_graph(...))``).

Not peers: selected with ``--libs ...,jax_cgtp_graph,jax_cgtp_det`` to compare them with the
default call on ``src, dst`` (their "speedup" column is then ``variant ms / default ms``):

* ``jax_cgtp_graph``: atomics allowed; the forward walks each destination's run of edges and
  writes the node's row once (no zero fill, no atomic adds);
* ``jax_cgtp_det``: ``deterministic=True``, no atomics in any phase.

The sorted graph is built once per graph, outside the timed region, as a training loop would.
The plain product has no graph: those rows say "unsupported".
"""

from __future__ import annotations

import jax_cgtp

from .. import problems
from . import Impl, Unsupported


def version() -> str:
    return jax_cgtp.__version__


def build(tp, dtype, conv: bool, options: dict, *, deterministic: bool) -> Impl:
    if not conv:
        raise Unsupported("only the convolution takes a sorted graph")
    problem = tp.problem
    op = jax_cgtp.TensorProductConv(
        problem.irreps_in1, problem.irreps_in2, problem.irreps_out, problems.instruction_tuples(problem),
        irrep_normalization=problem.irrep_normalization, path_normalization=problem.path_normalization,
        backend=tp.backend, deterministic=deterministic,
    )
    if op.problem != problem:
        raise Unsupported(f"the sorted-graph convolution's problem differs: {op.problem}")

    def prepare_graph(src, dst, nodes):
        return jax_cgtp.sort_graph(src, dst, nodes), None

    def apply(x, y, w, graph, _):
        return op(x, y, w, graph=graph)

    note = "deterministic" if deterministic else "sorted graph"
    return Impl(apply=apply, prepare_graph=prepare_graph, note=f"backend={tp.backend}, {note}")
