"""jax_cgtp's atomic convolution called with ``graph=jax_cgtp.sort_graph(src, dst, nodes)``.

Not a peer: selected with ``--libs ...,jax_cgtp_graph`` to compare it with the same variant
called with ``src, dst`` (its "speedup" column is then ``ms with the graph / ms without``).
Given the sorted graph, the forward may walk each destination's run of edges, where that kernel
is the faster one; the derivatives keep the atomic kernels. The graph is built once outside the
timed region, as a training loop or an MD run between neighbour-list updates would.
"""

from __future__ import annotations

import jax_cgtp

from . import Impl, Unsupported
from .cgtp_det import build_on_sorted_graph

NAME = "jax_cgtp_graph"


def version() -> str:
    return jax_cgtp.__version__


def build(tp, dtype, conv: bool, options: dict) -> Impl:
    if not conv:
        raise Unsupported("only the convolution takes a graph")
    return build_on_sorted_graph(tp, deterministic=False)
