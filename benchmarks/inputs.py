"""Random inputs of one benchmark row, in e3nn's ``mul_ir`` layout and e3nn's weight order.

Every library gets these same arrays (converted to its own layout outside the timed region, see
:mod:`benchmarks.peers`). Values are standard normal, never zeros. The graph has ``nodes =
edges // 16`` nodes. Four graphs:

* ``random`` (the default): ``dst`` sorted, as a neighbour list grouped by receiver is, and ``src``
  uniform at random, 16 edges per node on average;
* ``by_source``: the same edges grouped by sender instead (``src`` sorted, ``dst`` uniform at
  random), as in MACE, whose edge list is a neighbour list sorted by its first index (the sender)
  and whose messages are summed into the second (the receiver);
* ``spatial``: points on a jittered cubic lattice, numbered in lattice order, each receiving an
  edge from each of its 16 nearest points (``dst`` sorted). Neighbours have nearby numbers, as the
  atoms of a crystal built cell by cell, or of a system sorted in space, do;
* ``padded``: the ``random`` graph padded as ``jraph.pad_with_graphs`` pads a batch: its last
  eighth of the edges (the padding) joins the last node (a padding node, in range) to itself, so
  that one node has thousands of edges (``dst`` still sorted);
* ``dense``: the ``spatial`` lattice with neighbour lists as long as an interatomic potential's
  with a 5-6 Å cutoff in a liquid or a metal: 64 edges per node on average, each node receiving
  from between 32 and 96 of its nearest points (``dst`` sorted), so that about half of the runs
  are longer than 64 edges.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import scipy.spatial

from .configs import EDGES_PER_NODE


@dataclasses.dataclass
class Inputs:
    """Operands of a row: ``x`` (per edge, or per node for a convolution), ``y``, ``w``, the output
    cotangent ``g`` and, for a convolution, ``src``/``dst`` (int32) and ``nodes``."""

    x: jax.Array
    y: jax.Array
    w: jax.Array
    g: jax.Array
    src: jax.Array | None = None
    dst: jax.Array | None = None
    nodes: int | None = None


def num_nodes(edges: int) -> int:
    return max(1, edges // EDGES_PER_NODE)


# Arrays below this many elements in all are drawn with NumPy: no XLA compilation, which is what
# dominates a tiny (smoke) run; larger ones are drawn on the device by one compiled call.
_HOST_DRAW_SIZE = 1 << 22


GRAPHS = ("random", "by_source", "spatial", "padded", "dense")
PADDING_FRACTION = 8  # the padded graph's padding: its last edges // 8
DENSE_EDGES_PER_NODE = (32, 64, 96)  # the dense graph's fewest, mean and most edges per node


def graph_nodes(edges: int, graph: str) -> int:
    """Nodes of ``graph`` on ``edges`` edges: 16 edges per node on average, 64 on the dense graph."""
    return max(1, edges // DENSE_EDGES_PER_NODE[1]) if graph == "dense" else num_nodes(edges)


def spatial_graph(nodes: int, edges: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` (int32, ``dst`` sorted) of the ``spatial`` graph: ``nodes`` points on a cubic
    lattice, numbered in lattice order and moved by up to a quarter of the spacing, node ``n``
    receiving an edge from each of its ``edges // nodes`` nearest other points."""
    per_node = edges // nodes if nodes else 0
    if per_node * nodes != edges or not 0 < per_node < nodes:
        raise ValueError(f"a spatial graph of {nodes} nodes needs edges = a multiple of the nodes, with fewer "
                         f"edges per node than nodes; got {edges} edges")
    return _nearest_on_lattice(np.full(nodes, per_node), seed)


def dense_graph(nodes: int, edges: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` (int32, ``dst`` sorted) of the ``dense`` graph: the ``spatial`` lattice's
    ``nodes`` points, node ``n`` receiving from its ``counts[n]`` nearest other points, the counts
    drawn uniformly from :data:`DENSE_EDGES_PER_NODE`'s range and moved by one until they sum to
    ``edges``."""
    low, _, high = DENSE_EDGES_PER_NODE
    if not (nodes > high and low * nodes <= edges <= high * nodes):
        raise ValueError(f"a dense graph of {nodes} nodes needs more than {high} nodes and {low} to {high} edges "
                         f"per node; got {edges} edges")
    rng = np.random.default_rng(seed)
    counts = rng.integers(low, high + 1, nodes)
    while (gap := edges - int(counts.sum())) != 0:
        movable = np.flatnonzero(counts < high if gap > 0 else counts > low)
        counts[rng.choice(movable, min(abs(gap), movable.size), replace=False)] += np.sign(gap)
    return _nearest_on_lattice(counts, seed)


def _nearest_on_lattice(counts: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` of ``len(counts)`` points on a cubic lattice, numbered in lattice order and moved
    by up to a quarter of the spacing: node ``n`` receives from its ``counts[n]`` nearest others."""
    nodes, most = len(counts), int(counts.max())
    side = math.ceil(round(nodes ** (1 / 3), 9))
    lattice = np.stack(np.unravel_index(np.arange(nodes), (side,) * 3), axis=1).astype(np.float64)
    points = lattice + np.random.default_rng(seed).uniform(-0.25, 0.25, lattice.shape)
    _, nearest = scipy.spatial.cKDTree(points).query(points, k=most + 1)  # column 0: the point itself
    src = nearest[:, 1:][np.arange(most)[None, :] < counts[:, None]].astype(np.int32)
    dst = np.repeat(np.arange(nodes, dtype=np.int32), counts)
    return src, dst


def make_inputs(problem, dtype, edges: int, conv: bool, seed: int = 0, graph: str = "random",
                shared_weights: bool = False) -> Inputs:
    """Standard normal operands for ``edges`` rows; for ``conv``, node features and a graph (one of
    :data:`GRAPHS`); with ``shared_weights``, one row of weights for every edge."""
    if graph not in GRAPHS:
        raise ValueError(f"graph {graph!r}: expected one of {GRAPHS}")
    nodes = graph_nodes(edges, graph)
    rows = nodes if conv else edges  # rows of x and of z (g)
    dims = (problem.irreps_in1.dim, problem.irreps_in2.dim, problem.weight_numel, problem.irreps_out.dim)
    dtype = jnp.dtype(dtype)
    if (rows + edges) * sum(dims) < _HOST_DRAW_SIZE:
        arrays = _generate_on_host(seed, dtype, edges, nodes, rows, dims)
    else:
        arrays = _generate(jax.random.PRNGKey(seed), dtype, edges, nodes, rows, dims)
    x, y, w, g, src, dst = arrays
    if shared_weights:
        w = w[0]
    if not conv:
        return Inputs(x, y, w, g)
    if graph == "spatial":
        src, dst = (jax.device_put(a) for a in spatial_graph(nodes, edges, seed))
    elif graph == "dense":
        src, dst = (jax.device_put(a) for a in dense_graph(nodes, edges, seed))
    elif graph == "by_source":
        src, dst = dst, src
    elif graph == "padded":
        padding = edges // PADDING_FRACTION
        src, dst = (a.at[edges - padding:].set(nodes - 1) for a in (src, dst))
    return Inputs(x, y, w, g, src, dst, nodes)


def _generate_on_host(seed, dtype, edges, nodes, rows, dims):
    rng = np.random.default_rng(seed)
    d1, d2, dw, d3 = dims
    shapes = ((rows, d1), (edges, d2), (edges, dw), (rows, d3))
    arrays = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
    arrays.append(rng.integers(0, nodes, edges, dtype=np.int32))
    arrays.append(np.sort(rng.integers(0, nodes, edges, dtype=np.int32)))
    return tuple(jax.device_put(a) for a in arrays)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def _generate(key, dtype, edges, nodes, rows, dims):
    """All arrays of a row in one compiled call (one compilation per shape, not one per array)."""
    keys = jax.random.split(key, 6)
    d1, d2, dw, d3 = dims
    return (
        jax.random.normal(keys[0], (rows, d1), dtype),
        jax.random.normal(keys[1], (edges, d2), dtype),
        jax.random.normal(keys[2], (edges, dw), dtype),
        jax.random.normal(keys[3], (rows, d3), dtype),
        jax.random.randint(keys[4], (edges,), 0, nodes, jnp.int32),
        jnp.sort(jax.random.randint(keys[5], (edges,), 0, nodes, jnp.int32)),
    )
