"""Edge orderings for deterministic scatter-sums, computed once per graph.

A scatter-sum ``out[n] = sum_{e: index[e] == n} m[e]`` is deterministic when every ``n`` is
reduced by one thread in a fixed order. :func:`sort_edges` gives that order: ``perm`` lists the
edges sorted by ``index`` (stable, so ties keep their input order) and ``offsets[n]`` is where
node ``n``'s run starts in ``perm`` (CSR). Edges with an index outside ``[0, rows)`` fall
outside every run and are never visited.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from . import mesh_axes


def sort_edges(index: jax.Array, rows: int) -> tuple[jax.Array, jax.Array]:
    """``(perm, offsets)`` of ``index`` (int32 or int64, shape ``(E,)``) over ``rows`` nodes.

    >>> perm, offsets = sort_edges(jnp.array([2, 0, 2, 1]), 3)
    >>> perm.tolist(), offsets.tolist()
    ([1, 3, 0, 2], [0, 1, 2, 4])
    """
    index = jnp.asarray(index)
    return jnp.argsort(index, stable=True).astype(index.dtype), edge_offsets(index, rows)


def edge_offsets(index: jax.Array, rows: int) -> jax.Array:
    """``offsets[n]``, for ``n`` in ``[0, rows]``: how many edges have an index below ``n`` (the
    count of each bucket, below the range, node by node, above it, summed cumulatively)."""
    bucket = jnp.where(index < 0, 0, jnp.where(index < rows, index + 1, rows + 1))
    counts = jnp.zeros(rows + 2, index.dtype).at[bucket].add(1)
    return jnp.cumsum(counts)[: rows + 1].astype(index.dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SortedGraph:
    """A graph's edges with both orderings a deterministic convolution needs.

    ``src``/``dst`` are the edge endpoints; ``by_dst`` orders the forward scatter into
    destination nodes, ``by_src`` the transposed scatter into source nodes (gradients of the
    node features). It is a pytree, so it can be built once outside a training step and passed
    in. Build it with :func:`sort_graph`.
    """

    src: jax.Array
    dst: jax.Array
    by_src: tuple[jax.Array, jax.Array]
    by_dst: tuple[jax.Array, jax.Array]
    num_nodes: int = dataclasses.field(metadata=dict(static=True))
    num_src_nodes: int = dataclasses.field(metadata=dict(static=True))


def check_node_count(name: str, count) -> int:
    """``count`` as an int; ``TypeError`` naming ``name`` unless it is a static non-negative int."""
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise TypeError(f"{name}: expected a static non-negative int, got {count!r}")
    return int(count)


def check_index(name: str, index, num_edges: int, per_edge_of: str) -> None:
    """Raise unless ``index`` is an int32 or int64 array of shape ``(num_edges,)``, one index per
    edge of the array ``per_edge_of``."""
    dtype = jnp.result_type(index)
    if dtype not in (jnp.int32, jnp.int64):
        raise TypeError(f"{name}: expected an int32 or int64 array, got dtype {dtype}")
    if jnp.shape(index) != (num_edges,):
        raise ValueError(
            f"{name}: expected shape ({num_edges},), one index per edge of {per_edge_of}, got {jnp.shape(index)}"
        )


def host_index(name: str, index, rows: int):
    """An edge index as the convolution takes it: a JAX array (or tracer) as it is; host data
    (NumPy arrays, lists) as a NumPy array whose values outside ``[0, rows)`` become ``-1`` where JAX
    would convert it to int32 (64-bit values with x64 off): a value at or beyond ``2**31`` stays
    padding instead of wrapping onto a real node. An empty list is an empty int32 index."""
    if isinstance(index, jax.Array):
        return index
    array = np.asarray(index)
    if array.size == 0 and array.dtype.kind == "f" and not hasattr(index, "dtype"):
        return np.zeros(array.shape, np.int32)
    if array.dtype.kind != "i":
        raise TypeError(f"{name}: expected an int32 or int64 array, got dtype {array.dtype}")
    if array.dtype.itemsize == 8 and not jax.config.jax_enable_x64:
        array = np.where((array >= 0) & (array < rows), array, -1).astype(np.int32)
    return array


def valid_edges(src, dst, num_src_nodes: int, num_nodes: int):
    """Mask of the edges that contribute: ``src`` in ``[0, num_src_nodes)`` and ``dst`` in
    ``[0, num_nodes)``."""
    return (src >= 0) & (src < num_src_nodes) & (dst >= 0) & (dst < num_nodes)


def graph_endpoints(graph, src, dst, num_nodes):
    """``(src, dst, num_nodes)`` of a convolution call: ``graph``'s when one is given (then the
    others must be left out), else the arguments as they are."""
    if graph is None:
        return src, dst, num_nodes
    if not isinstance(graph, SortedGraph):
        raise TypeError(f"graph: expected a jax_cgtp.SortedGraph from sort_graph(), got {type(graph).__name__}")
    if src is not None or dst is not None or num_nodes is not None:
        raise ValueError("src, dst, num_nodes: pass either them or graph=, not both")
    return graph.src, graph.dst, graph.num_nodes


def sort_graph(src, dst, num_nodes: int, num_src_nodes: int | None = None) -> SortedGraph:
    """Sort a graph's edges once, for :class:`jax_cgtp.TensorProductConv` with ``deterministic=True``.

    ``src`` indexes ``num_src_nodes`` source rows (default ``num_nodes``), ``dst`` indexes
    ``num_nodes`` destination rows: int32 or int64 arrays of one index per edge. An index out of
    range is allowed, as in the convolution, which never visits that edge
    (:func:`jax_cgtp.check_graph` reports such edges). Indices sharded over explicit mesh axes
    are sorted whole (replicated).

    >>> g = sort_graph(jnp.array([0, 1, 1]), jnp.array([1, 0, 1]), 2)
    >>> g.by_dst[0].tolist(), g.by_src[1].tolist()
    ([1, 0, 2], [0, 1, 3])
    """
    num_nodes = check_node_count("num_nodes", num_nodes)
    num_src_nodes = num_nodes if num_src_nodes is None else check_node_count("num_src_nodes", num_src_nodes)
    src, dst = host_index("src", src, num_src_nodes), host_index("dst", dst, num_nodes)
    src, dst = jnp.asarray(src), jnp.asarray(dst)
    if src.ndim != 1:
        raise ValueError(f"src: expected a 1-D array, one index per edge, got shape {src.shape}")
    check_index("src", src, src.shape[0], "src")
    check_index("dst", dst, src.shape[0], "src")
    if mesh_axes.explicit_axes([src, dst]):  # a sort of every edge: replicated indices
        src, dst = (jax.sharding.reshard(a, PartitionSpec()) for a in (src, dst))
    return SortedGraph(src, dst, sort_edges(src, num_src_nodes), sort_edges(dst, num_nodes),
                       num_nodes, num_src_nodes)
