"""Edges grouped by an index on the GPU, on every call: the ordering an atomic convolution walks
when it is given no sorted graph.

``group_edges(index, rows)`` returns ``(perm, offsets)`` laid out as
:func:`jax_cgtp.graph.sort_edges`'s (CSR ``offsets`` over ``rows`` nodes; edges below the range
first, edges above it last), except that within a node's run the edges come in no fixed order (the
atomic kernels sum them in no fixed order anyway), and that ``offsets`` has one more entry,
``offsets[rows + 1]``, the longest run: a walk that adds the edges past each run's first few
(``Settings.owned_run_cap``) returns at once where no run is that long. On a GPU it is
a counting sort (``cuda/group_edges.cu``): each edge takes its rank in its bucket (atomic adds on
the bucket's count, one per warp and bucket), the counts are summed into ``offsets``, and
``cgtp_group_place`` puts each edge at its bucket's start plus its rank, or, where the edges came
grouped already (no edge in a lower bucket than the one before it), returns the identity. Up to
:data:`SCAN_TILE` counts, the last block of the counting launch (``cgtp_group_count``) sums them
and finds the longest run: two launches in all. Above that, ``cgtp_group_rank`` counts and
``cgtp_group_scan`` sums the tiles in parallel. Elsewhere, under ``vmap``, and for
``backend="reference"`` (whose lowering does not read the ordering, so XLA drops it) it is
``sort_edges``'s stable argsort, one valid grouping.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax._src import dispatch  # apply_primitive: eager evaluation through the lowering
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import codegen, cuda_lowering, mesh_axes, nvrtc, settings
from .graph import sort_edges

COUNT_KERNEL, RANK_KERNEL, SCAN_KERNEL, PLACE_KERNEL = (
    "cgtp_group_count", "cgtp_group_rank", "cgtp_group_scan", "cgtp_group_place")
BLOCK = 1024
SCAN_ITEMS = 8  # counts per thread of a scan tile
SCAN_TILE = BLOCK * SCAN_ITEMS  # counts a block sums at once
SHARED_BYTES = 34 * 8  # one index per warp for the block's sum, and two more
_SOURCE = "group_edges.cu"

group_p = Primitive("cgtp_group")
group_p.multiple_results = True
group_p.def_impl(functools.partial(dispatch.apply_primitive, group_p))


def group_edges(index, rows: int, *, backend: str = "auto") -> tuple[jax.Array, jax.Array]:
    """``(perm, offsets)`` of ``index`` (int32 or int64, shape ``(E,)``) over ``rows`` nodes: the
    edges grouped by node, in no fixed order within a node, and ``offsets`` of ``rows + 2``
    entries, the CSR offsets and the longest run (see the module's docstring).

    >>> perm, offsets = group_edges(jnp.array([2, 0, 2, 1]), 3)
    >>> offsets.tolist()
    [0, 1, 2, 4, 2]
    """
    return tuple(group_p.bind(jnp.asarray(index), rows=int(rows), backend=backend))


def _abstract_eval(index, *, rows, backend):
    del backend
    mesh_axes.check_not_explicitly_sharded([index])
    return [mesh_axes.shaped_like(index, index.shape, index.dtype),
            mesh_axes.shaped_like(index, (rows + 2,), index.dtype)]


group_p.def_abstract_eval(_abstract_eval)


def _jvp(primals, tangents, *, rows, backend):
    del tangents
    outputs = group_p.bind(*primals, rows=rows, backend=backend)
    return outputs, [ad.Zero.from_primal_value(o) for o in outputs]


ad.primitive_jvps[group_p] = _jvp


def _batch(args, dims, *, rows, backend):
    del backend
    (index,), (axis,) = args, dims
    return jax.vmap(functools.partial(_sorted, rows=rows), in_axes=axis)(index), (0, 0)


batching.primitive_batchers[group_p] = _batch


@functools.lru_cache(maxsize=None)
def kernel_source(index_ctype: str) -> str:
    """The grouping kernels' source for indices of C type ``index_ctype``."""
    return (f"typedef {index_ctype} I;\n#define CGTP_GROUP_BLOCK {BLOCK}\n#define CGTP_SCAN_ITEMS {SCAN_ITEMS}\n"
            f"{codegen.cuda_source(_SOURCE)}")


@functools.lru_cache(maxsize=None)
def _image(index_ctype: str, arch: str):
    return cuda_lowering.image_of(nvrtc.compile_cubin(kernel_source(index_ctype), arch, "the edge grouping"))


def grid(edges: int) -> int:
    """Blocks of a launch over the edges: one thread per edge."""
    return -(-edges // BLOCK)


def scan_tiles(rows: int) -> int:
    """Tiles of the ``rows + 1`` counts that become offsets: the blocks of ``cgtp_group_scan``."""
    return -(-(rows + 1) // SCAN_TILE)


def run_kernel(name: str, args, shapes, *, grid: int, edges: int, rows: int, zero_outputs=()):
    """One launch of kernel ``name`` of ``cuda/group_edges.cu`` on ``grid`` blocks and ``args`` (the
    index or the counts first): its outputs of ``shapes``, those flagged in ``zero_outputs`` zeroed
    first."""
    _, ctype = cuda_lowering.common_index_dtype([args[0]])
    image, image_id = _image(ctype, cuda_lowering.device_arch())
    return cuda_lowering.ffi_launch(image, image_id, name, args, shapes, grid=grid, block=BLOCK,
                                    shared_bytes=SHARED_BYTES, scalars=[edges, rows], zero_outputs=zero_outputs,
                                    capture=settings.active().command_buffers)


def _on_gpu(index, *, rows):
    edges, dtype = index.shape[0], index.dtype
    if edges == 0:
        return [jnp.zeros(0, dtype), jnp.zeros(rows + 2, dtype)]
    shape = functools.partial(jax.ShapeDtypeStruct, dtype=dtype)
    launch = functools.partial(run_kernel, edges=edges, rows=rows)
    counted = shape((rows + 4,))  # the counts, the order flag, the blocks done counting
    tiles = scan_tiles(rows)
    if tiles == 1:
        rank, offsets, state = launch(COUNT_KERNEL, [index], [shape((edges,)), shape((rows + 2,)), counted],
                                      grid=grid(edges), zero_outputs=[0, 0, 1])
    else:
        rank, state = launch(RANK_KERNEL, [index], [shape((edges,)), counted], grid=grid(edges), zero_outputs=[0, 1])
        published = jax.ShapeDtypeStruct((tiles + 3,), jnp.int64)  # per tile, tiles taken, longest run, blocks done
        offsets, _ = launch(SCAN_KERNEL, [state], [shape((rows + 2,)), published], grid=tiles, zero_outputs=[0, 1])
    (perm,) = launch(PLACE_KERNEL, [index, rank, offsets, state], [shape((edges,))], grid=grid(edges))
    return [perm, offsets]


def _sorted(index, *, rows):
    perm, offsets = sort_edges(index, rows)
    longest = jnp.max(jnp.diff(offsets), initial=0)
    return [perm, jnp.append(offsets, longest.astype(offsets.dtype))]


def lowering(ctx, index, *, rows, backend, on_gpu=False):
    """The counting sort where the kernels run (``on_gpu``, not ``backend="reference"``), else the
    stable argsort."""
    fun = _on_gpu if on_gpu and backend != "reference" else _sorted
    return mlir.lower_fun(functools.partial(fun, rows=rows), multiple_results=True)(ctx, index)


mlir.register_lowering(group_p, lowering)
mlir.register_lowering(group_p, functools.partial(lowering, on_gpu=True), platform="cuda")
