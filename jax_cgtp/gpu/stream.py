"""The weight-stream plan of a launch of ``uvw`` paths with per-edge weights.

A fully connected product over spherical harmonics (DiffDock: ``uvw`` paths, one-channel ``y``
blocks, a weight block ``W[e, u, w]`` per path and edge) moves mostly weights: DiffDock-L=2 reads
7,128 weights per edge against 321 elements of x, y and z. Per path, every member of the family
goes through two small per-edge matrices over the path's ``u`` channels,

    t[u, k] = sum_ij pw C[i, j, k] x[u, i] y[j]        h[u, k] = sum_w W[u, w] z̄[w, k]

as ``z[w, k] += sum_u W[u, w] t[u, k]`` (forward), ``w̄[u, w] = sum_k t[u, k] z̄[w, k]``,
``x̄[u, i] += sum_jk pw C[i, j, k] y[j] h[u, k]`` and ``ȳ[j] += sum_uik pw C[i, j, k] x[u, i] h[u, k]``.

So the launch streams each edge's weight row through the warp's shared memory exactly once, in
*items* (a path's rows ``u`` in ``[first, first + rows)``, a few KiB each), copied
asynchronously ``stages - 1`` items ahead of the one being computed, across path and edge
boundaries, into a ring of ``stages`` slots (``Settings.stream_stages``). Each slot row is padded to an odd stride, so lanes
over ``w`` (the forward) and lanes over ``u`` (``h``) both read it without bank conflicts.
The edge's x, y and z̄ rows are copied the same way, together with the previous edge's first
item, into double buffers. The output that lanes build channel by channel (``z`` forward,
``x̄`` backward) is summed in a shared-memory row and flushed once per edge, or once per run of
one destination (source) node when it is scattered.
"""

from __future__ import annotations

import dataclasses

from ..core.call import common_arguments
from ..core.operands import BATCHED, INDEXED
from ..core.problem import cg_nonzeros

WARP = 32  # lanes of a warp
# row kinds the one-pass walks (weight streams and joint passes) handle: y and w per edge, x and z
# per edge or indexed (a convolution)
WALK_KINDS = {"x": (BATCHED, INDEXED), "y": (BATCHED,), "w": (BATCHED,), "z": (BATCHED, INDEXED)}


@dataclasses.dataclass(frozen=True)
class StreamPath:
    """One ``uvw`` path: offsets into the rows of x, y, z and w, multiplicities and dims."""

    ins_index: int
    x_offset: int
    x_mul: int
    x_dim: int
    y_offset: int
    y_dim: int
    z_offset: int
    z_mul: int
    z_dim: int
    w_offset: int
    nonzeros: tuple[tuple[int, int, int, float], ...]  # (i, j, k, pw * C[i, j, k])


@dataclasses.dataclass(frozen=True)
class StreamItem:
    """Rows ``u`` in ``[first, first + rows)`` of ``path``'s weight block (``rows <= 32``: lanes
    take one row each when they run over ``u``)."""

    path: StreamPath
    first: int
    rows: int

    @property
    def size(self) -> int:
        return self.rows * self.path.z_mul


@dataclasses.dataclass(frozen=True)
class WeightStream:
    """The items of one edge, in order, and what the launch reads and writes.

    ``outputs`` and ``arrays`` map roles to kernel outputs and call inputs; ``slot`` is the
    shared-memory elements of one ring slot (the largest item, rows padded to an odd stride).
    """

    outputs: tuple[tuple[str, int], ...]
    arrays: tuple[tuple[str, int], ...]
    items: tuple[StreamItem, ...]
    slot: int
    stages: int  # ring slots (Settings.stream_stages)

    @property
    def row_role(self) -> str | None:
        """The output that lanes build channel by channel in a shared-memory row: ``z`` in the
        forward, ``x̄`` in a backward that produces it."""
        outputs = dict(self.outputs)
        return "z" if "z" in outputs else ("x" if "x" in outputs else None)

    @property
    def row_inputs(self) -> tuple[str, ...]:
        """The inputs whose edge rows the launch stages: every one it reads but the weights."""
        return tuple(role for role in ("x", "y", "z") if role in dict(self.arrays))


def stage_width(row: int) -> int:
    """Shared-memory stride of a staged row of ``row`` elements: odd, so that lane-strided reads
    hit distinct banks."""
    return row if row % 2 else row + 1


def split_rows(mul: int, row: int, itemsize: int, item_bytes: int) -> list[tuple[int, int]]:
    """``(first, rows)`` of the items covering ``mul`` rows of ``row`` weights: at most 32 rows
    and about ``item_bytes`` each, balanced.

    >>> split_rows(48, 48, 4, 4096), split_rows(48, 10, 4, 4096), split_rows(10, 48, 8, 4096)
    ([(0, 16), (16, 16), (32, 16)], [(0, 24), (24, 24)], [(0, 10)])
    """
    most = max(1, min(WARP, item_bytes // (row * itemsize)))
    count = -(-mul // most)
    rows = -(-mul // count)
    return [(first, min(rows, mul - first)) for first in range(0, mul, rows)]


def weight_stream(call, outputs, itemsize: int) -> WeightStream | None:
    """The weight-stream plan of a launch, or None (its slots then run output by output).

    It applies when every active path is ``uvw``, weighted, with a one-channel ``y`` block; the
    weights are per edge (BATCHED), y is per edge, x and z are per edge or indexed (a
    convolution); every output has one term over the same inputs; and the launch is the forward
    (``z``) or a backward that reads the weights (any of x̄, ȳ, w̄ but w̄ alone); and the warp's
    buffers fit in ``Settings.stream_max_warp_bytes``.
    """
    roles = {o.role: k for k, o in enumerate(outputs)}
    if len(roles) != len(outputs) or ("z" in roles and len(roles) > 1) or set(roles) == {"w"}:
        return None
    if any(call.kind(role) not in kinds for role, kinds in WALK_KINDS.items()):
        return None
    arrays = common_arguments(call, [out.call_output for out in outputs])
    if arrays is None:
        return None
    problem = call.problem
    active = [(n, ins) for n, ins in enumerate(problem.instructions) if ins.is_active]
    if not active or any(ins.mode != "uvw" or ins.mul_in2 != 1 or not ins.has_weight for _, ins in active):
        return None
    settings = call.settings
    items = []
    for n, ins in active:
        (xo, xm, xd), (yo, _, yd), (zo, zm, zd) = (problem.block(ins, r) for r in "xyz")
        path = StreamPath(n, xo, xm, xd, yo, yd, zo, zm, zd, ins.weight_offset, tuple(cg_nonzeros(problem, ins)))
        items += [StreamItem(path, first, rows) for first, rows in split_rows(xm, zm, itemsize, settings.stream_item_bytes)]
    slot = max(item.rows * stage_width(item.path.z_mul) for item in items)
    stream = WeightStream(tuple(sorted(roles.items())), tuple(sorted(arrays.items())), tuple(items), slot,
                          settings.stream_stages)
    if sum(stream_buffers(stream, problem).values()) * itemsize > settings.stream_max_warp_bytes:
        return None  # rows too wide to stage per warp
    return stream


def stream_buffers(stream: WeightStream, problem) -> dict[str, int]:
    """Shared-memory elements per warp: the ring of weight slots, two of each staged x, y and z̄
    row (the inputs it reads: this edge's and the next one's), the shared-memory output row, and
    ``t`` of one item (32 rows of the widest z irrep)."""
    buffers = {"ring": stream.stages * stream.slot}
    for role in stream.row_inputs:  # double: the next edge's rows arrive while this edge computes
        buffers[role] = 2 * problem.operand_dim(role)
    if stream.row_role is not None:
        buffers["row"] = problem.operand_dim(stream.row_role)
    if "z" in dict(stream.outputs) or "w" in dict(stream.outputs):
        buffers["t"] = WARP * max(item.path.z_dim for item in stream.items)
    return buffers
