"""The fused graph convolution: gather by source, tensor product, scatter-sum by destination."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from .core import mesh_axes, primitives
from .core.call import forward_call
from .core.graph import SortedGraph, check_index, check_node_count, graph_endpoints, host_index, sort_graph
from .core.grouping import group_edges
from .core.operands import BATCHED, INDEXED, SHARED
from .tensor_product import (TensorProduct, as_array, check_float_operands, check_static_shapes, check_trailing_dim,
                             no_weights_or_array)


class TensorProductConv(TensorProduct):
    r"""Graph convolution ``out[n] = sum_{e: dst[e] == n} T(x_nodes[src[e]], y_edges[e], w[e])``.

    ``T`` is the tensor product of the same problem arguments as :class:`TensorProduct`. The
    gather and the scatter are part of the operation (no ``(edges, dim)`` intermediate), and
    so are all its derivatives: the transpose of the gather by ``src`` is a scatter by ``src``.
    ``w`` is per edge ``(E, weight_numel)`` or shared ``(weight_numel,)``. Edges whose ``src``
    or ``dst`` lies outside the node range contribute nothing and are never dereferenced;
    :func:`check_graph` reports them eagerly for users who prefer an error.

    >>> import jax.numpy as jnp
    >>> conv = TensorProductConv("2x0e", "0e", "2x0e", [(0, 0, 0, "uvu", True)])
    >>> out = conv(jnp.ones((3, 2)), jnp.ones((4, 1)), jnp.ones(2), jnp.array([0, 1, 2, 2]),
    ...            jnp.array([1, 1, 0, 7]), num_nodes=3)
    >>> out.tolist()
    [[1.0, 1.0], [2.0, 2.0], [0.0, 0.0]]
    """

    def __init__(self, *args, deterministic: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(deterministic, bool):
            raise TypeError(f"deterministic: expected a bool, got {deterministic!r}")
        self.deterministic = deterministic

    def __repr__(self) -> str:
        return f"TensorProductConv({self.problem}, backend={self.backend!r}, deterministic={self.deterministic})"

    def __call__(self, x_nodes, y_edges, w=None, src=None, dst=None, num_nodes=None, *, graph: SortedGraph | None = None):
        """Node features ``x_nodes (N_src, dim1)``, edge features ``y_edges (E, dim2)``, weights,
        int index arrays ``src, dst (E,)`` and the static output node count -> ``(num_nodes, dim_out)``.

        Instead of ``src, dst, num_nodes``, pass ``graph=jax_cgtp.sort_graph(src, dst, num_nodes)``,
        built once per graph: it saves ordering the edges on every call. The edges may come in any
        order. The atomic (default) variant visits them grouped by ``dst`` (the graph's ordering, or
        a counting sort on the GPU at each call, :mod:`jax_cgtp.core.grouping`): its forward walks each
        destination's run of edges where that kernel is the faster one, and its other kernels
        (every derivative) add or stage each run's z or z̄ chunks once. The deterministic variant
        sorts ``src`` and ``dst`` (stable) when no graph is given.
        """
        problem = self.problem
        src, dst, num_nodes = graph_endpoints(graph, src, dst, num_nodes)
        if src is None or dst is None or num_nodes is None:
            raise ValueError("src, dst, num_nodes: all three are needed (or graph=)")
        num_nodes = check_node_count("num_nodes", num_nodes)
        x_nodes, y_edges = as_array("x_nodes", x_nodes), as_array("y_edges", y_edges)
        w = no_weights_or_array(problem, w, x_nodes)
        dtype = check_float_operands(x_nodes=x_nodes, y_edges=y_edges, w=w)
        check_static_shapes(x_nodes=x_nodes, y_edges=y_edges, w=w)
        check_trailing_dim("x_nodes", x_nodes, problem.irreps_in1.dim, f"irreps_in1 {problem.irreps_in1}")
        check_trailing_dim("y_edges", y_edges, problem.irreps_in2.dim, f"irreps_in2 {problem.irreps_in2}")
        check_trailing_dim("w", w, problem.weight_numel, "the weights")
        if jnp.ndim(x_nodes) != 2 or jnp.ndim(y_edges) != 2:
            raise ValueError(
                f"x_nodes, y_edges: expected 2-D arrays (rows, dim), got shapes "
                f"{jnp.shape(x_nodes)} and {jnp.shape(y_edges)}"
            )
        num_edges = jnp.shape(y_edges)[0]
        if jnp.ndim(w) not in (1, 2) or (jnp.ndim(w) == 2 and jnp.shape(w)[0] != num_edges):
            raise ValueError(
                f"w: expected shape ({problem.weight_numel},) or ({num_edges}, {problem.weight_numel}), "
                f"got {jnp.shape(w)}"
            )
        num_src_nodes = jnp.shape(x_nodes)[0]
        src, dst = host_index("src", src, num_src_nodes), host_index("dst", dst, num_nodes)
        check_static_shapes(src=src, dst=dst)
        check_index("src", src, num_edges, "y_edges")
        check_index("dst", dst, num_edges, "y_edges")
        if graph is not None and graph.num_src_nodes != num_src_nodes:
            raise ValueError(
                f"x_nodes: graph was sorted for {graph.num_src_nodes} source nodes, got {num_src_nodes} rows"
            )
        x_nodes, y_edges, w = (jnp.asarray(a, dtype) for a in (x_nodes, y_edges, w))
        src, dst = jnp.asarray(src), jnp.asarray(dst)
        if mesh_axes.explicit_axes([x_nodes, y_edges, w, src, dst]):
            return self._on_explicit_edges(x_nodes, y_edges, w, src, dst, num_nodes)
        inputs, indices = [x_nodes, y_edges, w], {"x": src, "z": dst}
        kinds = (INDEXED, BATCHED, SHARED if w.ndim == 1 else BATCHED, INDEXED)
        rows = (num_src_nodes, None, None, num_nodes)
        if self.deterministic:
            graph = graph or sort_graph(src, dst, num_nodes, num_src_nodes)
            call = forward_call(problem, kinds, rows, deterministic=True)
            (out,) = primitives.bind(call, inputs, indices, {"x": graph.by_src, "z": graph.by_dst},
                                     backend=self.backend)
            return out
        by_dst = graph.by_dst if graph is not None else group_edges(dst, num_nodes, backend=self.backend)
        atomic = forward_call(problem, kinds, rows, orderings=("z",))
        (out,) = primitives.bind(atomic, inputs, indices, {"z": by_dst}, backend=self.backend)
        return out

    def _on_explicit_edges(self, x_nodes, y_edges, w, src, dst, num_nodes: int):
        """The convolution where an operand is sharded over explicit mesh axes: the edges split as
        the first edge operand sharded there is, ``x_nodes`` and shared weights replicated, each
        device the convolution of its own edges (``jax.shard_map`` over those axes; the
        deterministic variant orders each device's edges itself), and the devices' node outputs
        summed (``psum``): a replicated result."""
        shared = w.ndim == 1
        (entry,) = mesh_axes.leading_spec([y_edges, src, dst] + ([] if shared else [w]), 1)
        rows, edges, whole = PartitionSpec(entry, None), PartitionSpec(entry), PartitionSpec()
        specs = (whole, rows, whole if shared else rows, edges, edges)
        return mesh_axes.split_over_axes(functools.partial(self, num_nodes=num_nodes),
                                         (x_nodes, y_edges, w, src, dst), specs, whole, summed=True)


def check_graph(src, dst, num_nodes: int, num_src_nodes: int | None = None) -> None:
    """Eagerly raise ``ValueError`` if an edge index is outside the node range.

    ``src`` must lie in ``[0, num_src_nodes)`` (default ``num_nodes``) and ``dst`` in
    ``[0, num_nodes)``, and both must be 1-D of one length. The convolution itself treats such
    edges as padding (they contribute nothing).
    """
    num_nodes = check_node_count("num_nodes", num_nodes)
    num_src_nodes = num_nodes if num_src_nodes is None else check_node_count("num_src_nodes", num_src_nodes)
    src, dst = np.asarray(src), np.asarray(dst)
    if src.ndim != 1 or src.shape != dst.shape:
        raise ValueError(f"src, dst: expected 1-D arrays of one index per edge, got shapes {src.shape} and {dst.shape}")
    for name, index, rows in (("src", src, num_src_nodes), ("dst", dst, num_nodes)):
        if index.dtype.kind not in "iu" and index.size:
            raise TypeError(f"{name}: expected an integer array, got dtype {index.dtype}")
        bad = np.flatnonzero((index < 0) | (index >= rows))
        if bad.size:
            raise ValueError(
                f"{name}: {bad.size} edge(s) index outside [0, {rows}), first at edge "
                f"{bad[0]} with value {index[bad[0]]}"
            )
