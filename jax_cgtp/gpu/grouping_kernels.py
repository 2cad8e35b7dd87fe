"""The edge grouping of :mod:`jax_cgtp.core.grouping` on the GPU: a counting sort
(``cuda/group_edges.cu``).

Each edge takes its rank in its bucket (atomic adds on the bucket's count, one per warp and
bucket), the counts are summed into ``offsets``, and ``cgtp_group_place`` puts each edge at its
bucket's start plus its rank, or, where the edges came grouped already (no edge in a lower bucket
than the one before it), returns the identity. Up to :data:`SCAN_TILE` counts, the last block of
the counting launch (``cgtp_group_count``) sums them and finds the longest run: two launches in
all. Above that, ``cgtp_group_rank`` counts and ``cgtp_group_scan`` sums the tiles in parallel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.interpreters import mlir

from ..core import settings
from ..core.grouping import reference_lowering
from . import codegen, cuda_lowering, nvrtc

COUNT_KERNEL, RANK_KERNEL, SCAN_KERNEL, PLACE_KERNEL = (
    "cgtp_group_count", "cgtp_group_rank", "cgtp_group_scan", "cgtp_group_place")
BLOCK = 1024
SCAN_ITEMS = 8  # counts per thread of a scan tile
SCAN_TILE = BLOCK * SCAN_ITEMS  # counts a block sums at once
SHARED_BYTES = 34 * 8  # one index per warp for the block's sum, and two more
_SOURCE = "group_edges.cu"


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


def lowering(ctx, index, *, rows, backend):
    """The counting sort, except for ``backend="reference"`` (the core's stable argsort)."""
    if backend == "reference":
        return reference_lowering(ctx, index, rows=rows, backend=backend)
    return mlir.lower_fun(functools.partial(_on_gpu, rows=rows), multiple_results=True)(ctx, index)
