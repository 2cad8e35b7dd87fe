"""CUDA source for one :class:`~jax_cgtp.gpu.schedule.KernelSchedule`.

The kernel is straight-line code over the sparse CG structure: every path (instruction) of every
slot becomes a block that loads the operand components it needs into registers, then
accumulates ``pw * C[i,j,k]`` products for the CG nonzeros only, fully unrolled. A joint pass
(:mod:`jax_cgtp.gpu.codegen_joint`) or a weight stream (:mod:`jax_cgtp.gpu.codegen_stream`) takes the
place of the slots where the schedule plans one. Comments name the slots, paths and irreps.
Device helpers (staging, flushes, warp sums) come from ``cuda/cgtp_device.cuh``.

The kernel's parameters are its signature's (:mod:`jax_cgtp.gpu.signature`).
"""

from __future__ import annotations

import functools
import pathlib

from ..core.operands import BATCHED, INDEXED, SHARED
from .codegen_joint import emit_joint
from .codegen_stream import emit_stream
from .cuda_text import (Writer, emit_chunk_flush, emit_chunk_lanes, emit_edge_header, literal, owned_end, put, row_of,
                        tile_value)
from .schedule import WARP, Contribution, Factor, KernelSchedule, Slot, slot_chunks, stage_width
from .signature import kernel_signature

_HEADER = "cgtp_device.cuh"
_BUFFERS = {"ahead": "ring of look-ahead slots (x rows, weights)", "ring": "ring of weight items",
            "row": "output row summed over paths", "t": "t[u, k] of one item"}
KERNEL_NAME = "cgtp_kernel"


@functools.lru_cache(maxsize=None)
def cuda_source(name: str) -> str:
    """The text of ``cuda/<name>`` (source tree first, then the installed copy)."""
    package = pathlib.Path(__file__).resolve().parent.parent
    folders = (package.parent / "cuda", package / "cuda")
    for folder in folders:
        path = folder / name
        if path.is_file():
            return path.read_text()
    raise FileNotFoundError(f"jax_cgtp: {name} is missing from {folders[0]} and {folders[1]}")


def _streamed_inputs(schedule: KernelSchedule) -> tuple[int, ...]:
    """The inputs whose loads are marked evict-first in L2: the per-edge y and w rows of the
    convolution's forward by destination, each read once.

    Then the streamed rows do not push out of L2 the node rows of x that later edges gather again,
    nor the z rows that the walk adds to. On an H100 (same process, interleaved) that took the
    atomic forward 0.90-0.97x its time and the deterministic one 0.94-0.99x, on seven of the eight
    ``uvu`` public configs (not l5-c32) in both dtypes. Marked one by one (``ld.global.cs``), the
    loads became opaque to the compiler: nequip-revmd17-benzene's float64 forward went from 168 to
    194 registers and took 1.37x its time; through a pointer with an access property they stay
    ordinary loads. The same marks in the backward walks (and on their ȳ and w̄ stores) changed
    their times by -2% to +2%, and on the deterministic backward's stores of x̄ rows to its slice
    (mace-medium and nequip-lips, float64) -0.4% to +0.3%.
    """
    joint = schedule.joint
    if joint is None or not joint.by_destination or dict(joint.outputs).keys() != {"z"}:
        return ()
    return tuple(a for role in ("y", "w") if schedule.call.kind(role) == BATCHED for a in joint.reads(role))




def generate(schedule: KernelSchedule) -> str:
    """The CUDA C++ source of ``schedule``'s kernel, named :data:`KERNEL_NAME`."""
    call = schedule.call
    problem = call.problem
    w = Writer()
    w(f"// jax_cgtp kernel: {problem}")
    w(f"//   irreps_in1 (x) = {problem.irreps_in1}, irreps_in2 (y) = {problem.irreps_in2}, "
      f"irreps_out (z) = {problem.irreps_out}")
    kinds = ", ".join(f"{r}: {call.kind(r)}" for r in "xywz")
    w(f"//   operand kinds: {kinds}; inputs: {', '.join(f'in{n}={r}' for n, r in enumerate(call.roles))}")
    for k, out in enumerate(schedule.outputs):
        terms = " + ".join(
            f"d/d{out.role}[{', '.join(f'in{a}' for a in t.args)}]{' (weighted paths)' if t.weighted_only else ''}"
            for t in call.outputs[out.call_output].terms
        )
        w(f"//   out{k} ({out.role}, {out.kind}, flush by {out.flush}) = {terms}")
    w(f"//   tiling: {schedule.tiling}, tile {schedule.tile} edges, {schedule.warps_per_block} warps per block")
    w(f"typedef {schedule.dtype} T;")
    w(f"typedef {schedule.index_dtype} I;")
    w(cuda_source(_HEADER))
    params = [param.declaration() for param in kernel_signature(schedule)]
    bounds = f"{schedule.block}, {schedule.min_blocks}" if schedule.min_blocks else f"{schedule.block}"
    w(f'extern "C" __global__ void __launch_bounds__({bounds}) {KERNEL_NAME}(')
    for n, p in enumerate(params):
        w("    " + p + ("," if n + 1 < len(params) else ") {"))
    w.depth += 1
    if schedule.chunk_sum:
        _emit_chunk_sums(w, schedule)
    elif schedule.tile_sum:
        _emit_tile_sums(w, schedule)
    elif schedule.slice_sum:
        _emit_slice_sums(w, schedule)
    else:
        if schedule.reads_longest_run:
            r, cap = schedule.call.walk, schedule.beyond_cap
            w(f"if ((long long)off_{r}[rows_{r} + 1] <= {cap}) return;  // no run is longer than the cap")
        _emit_prologue(w, schedule)
        _emit_tiles(w, schedule)
    w.close()
    return w.text()


def _emit_warp_indices(w: Writer) -> None:
    """``lane``, ``warp`` (the grid's warp index) and ``num_warps``, for a launch whose warps loop
    over items grid-stride."""
    w("const int lane = threadIdx.x & 31;")
    w("const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;")
    w("const long long num_warps = ((long long)gridDim.x * blockDim.x) >> 5;")


def _open_item_runs(w: Writer, schedule: KernelSchedule, selected: str) -> None:
    """Open the loops of a chunk or tile sum: warp items of 32 nodes of the segment role (the lane's
    ``node``, its run ``[run_begin, run_end)``) and a block of 32 columns (``column_block``), then the
    item's nodes for which ``selected`` holds, in order (``seg``, its run ``[seg_begin, seg_end)``).
    The caller closes both."""
    r, blocks = schedule.segment_role, schedule.chunk_sum_blocks
    _emit_warp_indices(w)
    w(f"// warp item: 32 {r}-nodes (item / {blocks}) and a block of 32 columns (item % {blocks})")
    w.open(f"for (long long item = warp; item < (rows_{r} + 31) / 32 * {blocks}; item += num_warps)")
    w(f"const long long node = item / {blocks} * 32 + lane;")
    w(f"const int column_block = (int)(item % {blocks});")
    w("long long run_begin, run_end;")
    w(f"cgtp_run(off_{r}, node, rows_{r}, run_begin, run_end);")
    w(f"unsigned nodes = __ballot_sync(CGTP_FULL_MASK, {selected});")
    w.open("while (nodes)")
    w("const int t = __ffs(nodes) - 1;")
    w("nodes &= nodes - 1;")
    w("const long long seg = node - lane + t;")
    w("const long long seg_begin = __shfl_sync(CGTP_FULL_MASK, run_begin, t);")
    w("const long long seg_end = __shfl_sync(CGTP_FULL_MASK, run_end, t);")


def _emit_chunk_sums(w: Writer, schedule: KernelSchedule) -> None:
    """Each node whose run is longer than the chunk: its row plus its chunks' rows, in chunk order
    (chunk k >= 1 of the run starting at ``off[node]`` is row ``(off[node] + k * chunk) / chunk``).
    A warp takes 32 nodes and 32 columns: the lanes find the nodes with long runs, then add each one's
    columns, a lane per column."""
    chunk = schedule.chunk_sum
    _open_item_runs(w, schedule, f"run_end - run_begin > {chunk}")
    w(f"const long long rows_after = (seg_end - seg_begin - 1) / {chunk};  // the chunks after the first")
    first = 0
    for k, out in enumerate(schedule.outputs):
        count = -(-out.dim // WARP)
        w.open(f"if (column_block >= {first} && column_block < {first + count})")
        w(f"const int q = (column_block - {first}) * 32 + lane;  // out{k} ({out.role})")
        w(f"if (q < {out.dim}) out{k}[seg * {out.dim}LL + q] = cgtp_add_rows_in_order("
          f"out{k}[seg * {out.dim}LL + q], chunks{k} + q, (seg_begin + {chunk}) / {chunk}, rows_after, {out.dim});")
        w.close()
        first += count
    w.close()
    w.close()


def _emit_tile_sums(w: Writer, schedule: KernelSchedule) -> None:
    """The rows the tiled walk left (:attr:`~jax_cgtp.gpu.schedule.KernelSchedule.tile_sum`): each node
    whose run crosses a tile's edge gets the sum of its partial rows in tile order (the first tile's
    row 2 t + 1, then each later tile's row 2 t), a node without edges zeros, and every node zeros in
    the components no path writes. A warp takes 32 nodes and 32 columns: the lanes find the nodes
    to write, then write each one's columns, a lane per column."""
    r, tile = schedule.segment_role, schedule.tile_sum
    (out,) = schedule.outputs
    no_path = " || ".join(f"(q >= {start} && q < {end})" for start, end in out.zero_ranges)
    crosses = f"run_end > run_begin && run_begin / {tile} != (run_end - 1) / {tile}"
    empty = f"node < rows_{r} && run_end == run_begin"
    _open_item_runs(w, schedule, f"node < rows_{r}" if no_path else f"({crosses}) || ({empty})")
    w("const int q = column_block * 32 + lane;  // the lane's column")
    w(f"if (q >= {out.dim}) continue;")
    w(f"T* const row = out0 + seg * {out.dim}LL + q;")
    if no_path:
        w(f"if ({no_path}) {{ *row = T(0); continue; }}  // no path writes the component")
    w(f"const long long first_tile = seg_begin / {tile}, last_tile = (seg_end - 1) / {tile};")
    w("if (seg_end == seg_begin) *row = T(0);  // no edges")
    w(f"else if (first_tile != last_tile) *row = cgtp_add_rows_in_order("
      f"tile_rows[(2 * first_tile + 1) * {out.dim}LL + q], tile_rows + q, first_tile + 1, last_tile - first_tile, "
      f"{2 * out.dim});")
    w.close()
    w.close()


def _emit_slice_sums(w: Writer, schedule: KernelSchedule) -> None:
    """Each source node's x̄ row: the rows of its edges in the slice of dst-sorted positions (an
    edge whose destination is out of range has none), added in src-sorted order to what the earlier
    slices wrote; with ``run_cap``, its run's first ``run_cap`` edges alone, and with ``chunk_walk``,
    each later chunk of a run to a chunk row of its own (``chunk_rows``, which the next launch adds
    in chunk order, :func:`jax_cgtp.gpu.schedule._sliced`). A warp takes a node (or chunk) and a group
    of 32-column blocks, a lane per column of each block: it finds the run's edges once per group
    and loads a row's columns of the group at once."""
    (out,) = schedule.outputs
    groups, per_group = schedule.slice_sum_groups, schedule.slice_sum_group_blocks
    chunk = schedule.chunk_walk
    _emit_slice_bounds(w)
    _emit_warp_indices(w)
    w(f"// warp item: an x-node (item / {groups}) and a group of {per_group} blocks of 32 columns (item % {groups})")
    w(f"const long long node_items = rows_x * {groups};")
    if chunk:
        w(f"// then the chunk rows: the chunk of a run that starts among sorted positions [row * {chunk},")
        w(f"// row * {chunk} + {chunk}), if one does")
        w(f"const long long num_items = node_items + (num_edges + {chunk - 1}) / {chunk} * {groups};")
    else:
        w("const long long num_items = node_items;")
    w.open("for (long long item = warp; item < num_items; item += num_warps)")
    if chunk:
        w("const bool in_chunk = item >= node_items;  // (the same on every lane)")
        w(f"const long long node = (in_chunk ? item - node_items : item) / {groups};  // or the chunk row")
    else:
        w(f"const long long node = item / {groups};")
    w(f"const int q0 = (int)(item % {groups}) * {per_group * WARP} + lane;  // column j * 32 + q0 of each row")
    w("long long run_begin, run_end;")
    if chunk:
        w.open("if (in_chunk)")
        w("long long seg;")
        w(f"if (!cgtp_chunk(off_x, rows_x, node, {chunk}, lane, seg, run_begin, run_end)) continue;")
        w.close()
        w.open("else")
    w("run_begin = (long long)off_x[node];")
    cap = schedule.run_cap
    w("run_end = " + (f"(long long)off_x[node + 1] - run_begin > {cap} ? run_begin + {cap} : "
                      "(long long)off_x[node + 1];  // the later chunks add the rest" if cap else
                      "(long long)off_x[node + 1];"))
    if chunk:
        w.close()
    w(f"T sum[{per_group}];")
    w("#pragma unroll")
    w(f"for (int j = 0; j < {per_group}; ++j) sum[j] = T(0);")
    ahead = schedule.slice_sum_rows_ahead
    w("// 32 edges at a time: each lane finds one edge's row of the slice (-1: none), then the warp loads")
    w(f"// {ahead} rows at a time and adds them in order (a missing row adds +0, which leaves the sum as it is)")
    w.open("for (long long first = run_begin; first < run_end; first += 32)")
    w("const int count = (int)(run_end - first < 32 ? run_end - first : 32);")
    w("long long my_row = -1;")
    w.open("if (lane < count)")
    w("const I e = perm_x[first + lane];")
    w("const long long p = (long long)pos_z[e] - slice_begin;")
    w("if (p >= 0 && p < slice_count && cgtp_valid(idx_z[e], rows_z)) my_row = p;")
    w.close()
    w.open(f"for (int t = 0; t < count; t += {ahead})")
    w(f"T v[{ahead}][{per_group}];")
    w("#pragma unroll")
    w.open(f"for (int a = 0; a < {ahead}; ++a)")
    w("const long long row = __shfl_sync(CGTP_FULL_MASK, my_row, (t + a) & 31);")
    w(f"const T* __restrict__ from = slice_rows + (row < 0 ? 0 : row) * {out.dim}LL + q0;")
    w("#pragma unroll")
    w(f"for (int j = 0; j < {per_group}; ++j) v[a][j] = t + a < count && row >= 0 && j * 32 + q0 < {out.dim} "
      "? from[j * 32] : T(0);")
    w.close()
    w("#pragma unroll")
    w(f"for (int a = 0; a < {ahead}; ++a)")
    w("#pragma unroll")
    w(f"for (int j = 0; j < {per_group}; ++j) sum[j] += v[a][j];")
    w.close()
    w.close()
    kept = f"walked0[node * {out.dim}LL + q] + " if schedule.kept else ""
    w("#pragma unroll")
    w.open(f"for (int j = 0; j < {per_group}; ++j)")
    w("const int q = j * 32 + q0;")
    w(f"if (q >= {out.dim}) continue;")
    if chunk:
        w(f"if (in_chunk) chunk_rows[node * {out.dim}LL + q] = sum[j];")
        w(f"else out0[node * {out.dim}LL + q] = {kept}sum[j];")
    else:
        w(f"out0[node * {out.dim}LL + q] = {kept}sum[j];")
    w.close()
    w.close()


def _emit_slice_bounds(w: Writer) -> None:
    """``slice_begin`` and ``slice_count``: the slice's dst-sorted positions, at most ``slice_size``
    from the one the launch reads from ``slice_at`` (so that a loop over slices runs one program)."""
    w("const long long slice_begin = (long long)slice_at[0];")
    w("const long long slice_count = num_edges - slice_begin < slice_size ? num_edges - slice_begin : slice_size;")


def _emit_prologue(w: Writer, schedule: KernelSchedule) -> None:
    w("extern __shared__ __align__(16) unsigned char cgtp_smem[];")
    w("const int lane = threadIdx.x & 31;")
    w(f"T* const warp_smem = reinterpret_cast<T*>(cgtp_smem) + (threadIdx.x >> 5) * {schedule.smem_per_warp};")
    offset = 0
    for role, size in schedule.stage_sizes:
        w(f"T* const stage_{role} = warp_smem + {offset};  // {_BUFFERS.get(role, f'staged {role} rows')}")
        offset += size
    if schedule.transpose_size:
        w(f"T* const obuf = warp_smem + {offset};  // output transposition")
        offset += schedule.transpose_size
    if schedule.edge_sums_size:
        w(f"T* const ysum = warp_smem + {offset};  // the tile's ȳ rows, summed over chunks")
    for a in _streamed_inputs(schedule):
        w(f"in{a} = cgtp_evict_first(in{a});  // {schedule.call.roles[a]} rows, read once")
    w("const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;")
    w("const long long num_warps = ((long long)gridDim.x * blockDim.x) >> 5;")
    if schedule.writes_positions:
        w("// each edge's dst-sorted position, which the sums by source of every slice read")
        w("for (long long p = warp * 32 + lane; p < num_edges; p += num_warps * 32) pos_z[perm_z[p]] = (I)p;")


def _emit_tiles(w: Writer, schedule: KernelSchedule) -> None:
    call = schedule.call
    groups = schedule.num_groups
    if schedule.tiling == "segments" and not schedule.chunk_walk:
        _emit_outside_zeros(w, schedule)
    if groups > 1:
        share = "32-channel chunks" if schedule.chunk_warps else "paths" if schedule.path_groups else "slots"
        w(f"// {groups} warps share each tile, each running its group of {share}")
        w(f"const int group = (int)(warp % {groups});")
        w(f"const long long walker = warp / {groups};")
        w(f"const long long num_walkers = num_warps / {groups};")
        w("if (walker >= num_walkers) return;  // the grid's last warps, fewer than a group")
    first, step = ("walker", "num_walkers") if groups > 1 else ("warp", "num_warps")
    if schedule.tiling == "segments" and schedule.lockstep:
        r, warps = schedule.segment_role, schedule.warps_per_block
        w(f"// one warp reduces each {r}-node: its edges in sorted order, 32 at a time. The block's {warps} warps")
        w("// walk consecutive runs in step, as long as the longest, and meet before each group of paths")
        w(f"const long long step = (long long)gridDim.x * {warps};")
        w.open(f"for (long long base = (long long)blockIdx.x * {warps}; base < rows_{r}; base += step)")
        w("const long long seg = base + (threadIdx.x >> 5);")
        w("long long seg_begin, seg_end;")
        w(f"cgtp_run(off_{r}, seg, rows_{r}, seg_begin, seg_end);")
        _emit_own_row(w, schedule, "seg")
        if schedule.run_cap:
            cap = schedule.run_cap
            w(f"// the runs' first {cap} edges: the next launches add the rest of a longer run")
            w(f"if (seg_end - seg_begin > {cap}) seg_end = seg_begin + {cap};")
            w(f"const long long runs_longest = cgtp_longest_run(off_{r}, base, {warps}, rows_{r}, lane);")
            w(f"const long long longest = runs_longest > {cap} ? {cap} : runs_longest;")
        else:
            w(f"const long long longest = cgtp_longest_run(off_{r}, base, {warps}, rows_{r}, lane);")
        w.open("for (long long walked = 0; walked < longest; walked += 32)")
        w("const long long first = seg_begin + walked;")
        w("const bool fresh = walked == 0;  // the run's first edges store, later ones add")
        w("const int count = (int)(seg_end - first < 32 ? (seg_end > first ? seg_end - first : 0) : 32);")
        edge = f"lane < count ? perm_{r}[first + lane] : I(0)"
    elif schedule.tiling == "segments" and schedule.chunk_walk:
        r, chunk = schedule.segment_role, schedule.chunk_walk
        w(f"// one warp per chunk of {chunk} edges after a {r}-run's first (the walk before wrote those): the")
        w(f"// chunk that starts among sorted positions [slot * {chunk}, slot * {chunk} + {chunk}), if one does, its")
        w("// owned rows to row slot (the next launch adds them to the node's), in sorted order, 32 at a time")
        w(f"const long long num_slots = (num_edges + {chunk - 1}) / {chunk};")
        w.open(f"for (long long slot = {first}; slot < num_slots; slot += {step})")
        w("long long seg, seg_begin, seg_end;")
        w(f"if (!cgtp_chunk(off_{r}, rows_{r}, slot, {chunk}, lane, seg, seg_begin, seg_end)) continue;")
        edge = _open_run_walk(w, schedule, "slot", "chunk")
    elif schedule.tiling == "segments":
        r = schedule.segment_role
        w(f"// one warp (per group) reduces each {r}-node: its edges in sorted order, 32 at a time")
        w.open(f"for (long long seg = {first}; seg < rows_{r}; seg += {step})")
        w(f"const long long seg_begin = (long long)off_{r}[seg], seg_next = (long long)off_{r}[seg + 1];")
        cap = schedule.run_cap
        w("const long long seg_end = " + (f"seg_next - seg_begin > {cap} ? seg_begin + {cap} : seg_next;  // the run's "
                                          f"first {cap} edges: the next launches add the rest" if cap else "seg_next;"))
        edge = _open_run_walk(w, schedule, "seg", "run")
    else:
        tile = schedule.tile
        edges = "num_edges"
        if schedule.slice_walk:
            _emit_slice_bounds(w)
            edges = "slice_count"
        if schedule.fill:
            w(f"// the edges spread evenly over the warps: rounds of one tile per warp, spans of at most {tile} edges")
            w(f"const long long rounds = ({edges} + num_warps * {tile} - 1) / (num_warps * {tile});")
            w(f"const long long span = rounds > 0 ? ({edges} + num_warps * rounds - 1) / (num_warps * rounds) "
              f": {tile};")
        else:
            w(f"const long long span = {tile};")
        w(f"const long long num_tiles = ({edges} + span - 1) / span;")
        w.open(f"for (long long tile = {first}; tile < num_tiles; tile += {step})")
        w("const long long first = tile * span;")
        w(f"const int count = (int)({edges} - first < span ? {edges} - first : span);")
        if schedule.slice_walk:
            w("// the tile's edges are positions slice_begin + [first, first + count) of the edges sorted by z;")
            w("// position slice_begin + p writes x̄ row p of the slice")
            edge = "lane < count ? perm_z[slice_begin + first + lane] : I(0)"
        elif call.walk:
            w(f"// the tile's edges are positions [first, first + count) of the edges sorted by {call.walk}")
            edge = f"lane < count ? perm_{call.walk}[first + lane] : I(0)"
        else:
            edge = "first + lane"
    _emit_lane_edges(w, schedule, edge)
    if schedule.joint is not None:
        emit_joint(w, schedule)
    elif schedule.stream is not None:
        emit_stream(w, schedule)
    elif groups > 1:
        for g, units in enumerate(schedule.groups):
            w.open(f"if (group == {g})")
            for k, begin, end in units:
                _emit_slot(w, schedule, schedule.slots[k], (begin, end))
            w.close()
    else:
        for slot in schedule.slots:
            _emit_slot(w, schedule, slot)
    for k, out in enumerate(schedule.outputs):
        if out.kind != BATCHED and out.flush != "slice":
            continue
        for start, end in out.zero_ranges:
            w(f"// out{k} ({out.role}) components [{start}, {end}) have no path: zeros")
            w.open("for (int t = 0; t < count; ++t)" if groups == 1 else "for (int t = 0; group == 0 && t < count; ++t)")
            w("const long long e = first + t;  // the slice's row" if out.flush == "slice" else
              f"const long long e = {tile_value(schedule, 'my_edge', 't')};")
            w(f"for (int q = lane; q < {end - start}; q += 32) "
              f"out{k}[e * {out.dim}LL + {start} + q] = T(0);")
            w.close()
    if schedule.tiling == "segments":
        w.close()
    w.close()


def _open_run_walk(w: Writer, schedule: KernelSchedule, own_row: str, walked: str) -> str:
    """Open the loop over sorted positions ``[seg_begin, seg_end)`` of the segment role, 32 at a
    time, the owned outputs written to row ``own_row`` (zeros first where no edge or path writes);
    the lane's edge of the tile."""
    _emit_own_row(w, schedule, own_row)
    w.open("for (long long first = seg_begin; first < seg_end; first += 32)")
    w(f"const bool fresh = first == seg_begin;  // the {walked}'s first edges store, later ones add")
    w("const int count = (int)(seg_end - first < 32 ? seg_end - first : 32);")
    return f"lane < count ? perm_{schedule.segment_role}[first + lane] : I(0)"


def _emit_own_row(w: Writer, schedule: KernelSchedule, own_row: str) -> None:
    """Declare ``own_row``, the row of the owned outputs this warp writes, and write its zeros."""
    w(f"const long long own_row = {own_row};  // the row of the owned outputs this warp writes")
    _emit_owned_zeros(w, schedule)


def _emit_lane_edges(w: Writer, schedule: KernelSchedule, edge: str) -> None:
    """The lane's edge of the tile (``my_edge``: ``edge``, below ``count``), whether it is valid
    (``my_ok``), and its index of each INDEXED role (``my_ix_{role}``, in the index type, -1 when
    invalid); ``tile_ok``, the valid edges of the tile as bits (:func:`~jax_cgtp.gpu.cuda_text.edge_ok`)."""
    w(f"const {'I' if schedule.permuted else 'long long'} my_edge = {edge};")
    w("bool my_ok = lane < count;")
    for r in schedule.call.indexed_roles:
        w(f"const I my_ix_{r} = my_ok ? idx_{r}[my_edge] : I(-1);")
    for r in schedule.call.indexed_roles:
        w(f"my_ok = my_ok && cgtp_valid(my_ix_{r}, rows_{r});")
    if schedule.beyond_cap:
        r, cap = schedule.call.walk, schedule.beyond_cap
        w(f"// only the edges past the first {cap} of their {r}-run: the walk before added the others")
        w(f"my_ok = my_ok && first + lane - (long long)off_{r}[my_ix_{r}] >= {cap};")
    w("const unsigned tile_ok = __ballot_sync(CGTP_FULL_MASK, my_ok);  // bit t: the tile's edge t is valid")
    if schedule.beyond_cap:
        w("if (tile_ok == 0u) continue;  // no edge of the tile is past its run's cap")


def _emit_outside_zeros(w: Writer, schedule: KernelSchedule) -> None:
    """A walk over sorted runs walks the nodes' runs only: the edges whose index is out of range
    (sorted first and last) add to no node, and their per-edge outputs get zeros here, one warp per
    edge over every warp of the grid (one warp walking them all would take as long as a node with
    that many edges: a padded graph's padding edges)."""
    r = schedule.segment_role
    batched = [(k, out) for k, out in enumerate(schedule.outputs) if out.kind == BATCHED]
    if not batched:
        w(f"// edges whose {r}-index is out of range (sorted first and last) add to no node: not walked")
        return
    w(f"// edges whose {r}-index is out of range (sorted first and last) add to no node: their per-edge")
    w("// outputs get zeros, one warp per edge")
    w(f"const long long below = off_{r}[0], above = off_{r}[rows_{r}];")
    w.open("for (long long i = warp; i < below + num_edges - above; i += num_warps)")
    w(f"const long long e = perm_{r}[i < below ? i : above + i - below];")
    for k, out in batched:
        w(f"for (int q = lane; q < {out.dim}; q += 32) out{k}[e * {out.dim}LL + q] = T(0);  // {out.role}")
    w.close()


def _emit_owned_zeros(w: Writer, schedule: KernelSchedule) -> None:
    """Zeros where a run's node gets no flush: its whole row when the run is empty, and the
    components no path writes (group 0 of a grouped launch)."""
    r = schedule.segment_role
    w(f"const bool owned = seg >= 0 && seg < rows_{r};  // the node whose run this warp walks")
    guard = "owned" if schedule.num_groups == 1 else "owned && group == 0"
    for k, out in enumerate(schedule.outputs):
        if out.flush != "own":
            continue
        w(f"if ({guard} && seg_begin == seg_end) "
          f"for (int q = lane; q < {out.dim}; q += 32) out{k}[own_row * {out.dim}LL + q] = T(0);  // no edges")
        for start, end in out.zero_ranges:
            w(f"if ({guard}) for (int q = lane; q < {end - start}; q += 32) "
              f"out{k}[own_row * {out.dim}LL + {start} + q] = T(0);  // components [{start}, {end}) have no path")


def _emit_pointers(w: Writer, schedule: KernelSchedule, slot: Slot) -> None:
    call = schedule.call
    arrays = sorted({f.array for c in slot.contributions for f in c.factors})
    for a in arrays:
        role = call.roles[a]
        dim = call.problem.operand_dim(role)
        w(f"const T* const p{a} = in{a} + {row_of(schedule, role)} * {dim}LL;  // {role} row")


def _accumulators(slot: Slot) -> list[str]:
    if slot.role == "w":
        return ["acc"]
    if slot.mode == "reduce":
        return [f"acc_{m}_{q}" for m in range(slot.mul) for q in range(slot.dim)]
    return [f"acc_{q}" for q in range(slot.dim)]


def _emit_slot(w: Writer, schedule: KernelSchedule, slot: Slot, chunks: tuple[int, int] | None = None) -> None:
    """One slot over the tile's edges; ``chunks``: its ``[first, end)`` 32-channel chunks (all)."""
    out = schedule.outputs[slot.output]
    k = slot.output
    w()
    paths = ", ".join(str(c.ins_index) for c in slot.contributions)
    w(f"// ---- out{k}: {slot.name}, {slot.mode} lanes, paths [{paths}]")
    w.open("")
    lane_mul = slot.lane_mul
    if slot.mode == "output":
        begin, end = chunks or (0, slot_chunks(slot))
        w("#pragma unroll 1")
        w.open(f"for (int c = {begin}; c < {end}; ++c)")
        emit_chunk_lanes(w, lane_mul)
    for letter in slot.outer_letters:
        w("#pragma unroll 1")
        w.open(f"for (int o_{letter} = 0; o_{letter} < {slot.muls[slot.letters.index(letter)]}; ++o_{letter})")
    accs = _accumulators(slot)
    w(f"T {', '.join(a + ' = T(0)' for a in accs)};")
    if out.kind != BATCHED and out.flush != "own":  # an owned run has one node: no row to track
        w("long long cur = -1;")
    w("#pragma unroll 1")
    w.open("for (int t = 0; t < count; ++t)")
    emit_edge_header(w, schedule)
    if out.kind == INDEXED:
        w("if (!ok) continue;")
        if out.flush != "own":
            w.open(f"if (cur >= 0 && ix_{out.role} != cur)")
            _emit_flush(w, schedule, slot, "cur")
            w.close()
            w(f"cur = ix_{out.role};")
    elif out.kind == SHARED:
        w("if (!ok) continue;")
        w(f"cur = {'walker' if schedule.num_groups > 1 else 'warp'};")
    else:
        w.open("if (ok)")
    _emit_pointers(w, schedule, slot)
    for contribution in slot.contributions:
        _emit_contribution(w, schedule, slot, contribution)
    if out.kind == BATCHED:
        w.close()
        _emit_flush(w, schedule, slot, "e")
    w.close()
    if out.kind != BATCHED:
        condition, row = owned_end(schedule, out)
        w.open(f"if ({condition})")
        _emit_flush(w, schedule, slot, row)
        w.close()
    for _ in slot.outer_letters:
        w.close()
    if slot.mode == "output":
        w.close()
    w.close()


def _emit_flush(w: Writer, schedule: KernelSchedule, slot: Slot, row: str) -> None:
    out = schedule.outputs[slot.output]
    accs = _accumulators(slot)
    w(f"T* const dst = out{slot.output} + {row} * {out.dim}LL + {slot.offset};")
    if slot.role == "w":
        address = f"lc * {slot.strides[slot.letters.index(slot.lane_letter)]}"
        for letter in slot.outer_letters:
            address += f" + o_{letter} * {slot.strides[slot.letters.index(letter)]}"
        w(f"if (active) {put(out, f'dst + {address}', 'acc')}")
    elif slot.mode == "reduce":
        size = len(accs)
        for a in accs:
            w(f"{a} = cgtp_warp_sum({a});")
        groups = -(-size // WARP)
        for g in range(groups):
            w(f"T v{g} = T(0);")
        for n, a in enumerate(accs):
            w(f"if (lane == {n % WARP}) v{n // WARP} = {a};")
        for g in range(groups):
            w(f"if ({g * WARP} + lane < {size}) {put(out, f'dst + {g * WARP} + lane', f'v{g}')}")
    elif slot.dim == 1:
        w(f"if (active) {put(out, 'dst + lc', 'acc_0')}")
    else:
        emit_chunk_flush(w, accs, "", lambda v: put(out, f"dst + c * {WARP * slot.dim} + q", v))
    w(" ".join(f"{a} = T(0);" for a in accs))


def _factor_bindings(slot: Slot, contribution: Contribution) -> dict[str, str]:
    """C expressions of the letters fixed outside the contribution's own loops."""
    bindings = {}
    if slot.mode == "output":
        lane_letter = slot.lane_letter if slot.role == "w" else contribution.lane_letter
        if lane_letter is not None:
            bindings[lane_letter] = "lc"
        for letter in slot.letters:
            if letter != lane_letter:
                bindings[letter] = f"o_{letter}" if letter in slot.outer_letters else "0"
    else:
        bindings[contribution.lane_letter] = "lr"
    return bindings


def _emit_contribution(w: Writer, schedule: KernelSchedule, slot: Slot, c: Contribution) -> None:
    problem = schedule.call.problem
    ins = c.ins
    names = (problem.irreps_in1[ins.i_in1], problem.irreps_in2[ins.i_in2], problem.irreps_out[ins.i_out])
    w(f"// path {c.ins_index}: {names[0]} (x) {names[1]} -> {names[2]}, mode {ins.mode}, "
      f"{'weighted' if ins.has_weight else 'unweighted'}, {len(c.nonzeros)} CG nonzeros")
    w.open("")
    values = _factor_bindings(slot, c)
    values.update({letter: "0" for letter in c.loop_letters if c.mul(letter) == 1})
    loops = [letter for letter in c.loop_letters if c.mul(letter) > 1]
    staged = [f for f in c.factors if f.staged and not slot.outer_letters]
    if slot.mode == "reduce":
        lane_mul = c.mul(c.lane_letter)
        w("#pragma unroll 1")
        w.open(f"for (int cr = 0; cr < {-(-lane_mul // WARP)}; ++cr)")
        w("const int lr = cr * 32 + lane;")
        w(f"const int nr = {lane_mul} - cr * 32 < 32 ? {lane_mul} - cr * 32 : 32;")
        chunk, rows, guard = "cr", "nr", f"lr < {lane_mul}"
    else:
        chunk, rows, guard = "c", "nrows", "active"
    static_letters = c.out_letters if slot.mode == "reduce" else ""
    # Global loads that need no loop are issued before the staging copy, so that their latency
    # overlaps with it instead of following the warp barrier.
    loaded = set()
    for n, f in enumerate(c.factors):
        if f in staged or any(l not in values or l in static_letters for l in f.letters):
            continue
        loaded.add(n)
        for comp in _used_components(c, f.role):
            w(f"const T f{n}_{comp} = {guard} ? {_element(f, False, values, comp)} : T(0);")
    for f in staged:
        row = f.strides[0] if f.role == "w" else f.dim
        width = stage_width(row)
        w(f"cgtp_stage<{row}, {width}>(stage_{f.role}, p{f.array} + {f.offset} + {chunk} * {WARP * row}LL, "
          f"{rows} * {row}, lane);")
    if staged:
        w("__syncwarp();")
    w.open(f"if ({guard})")
    _emit_loops(w, schedule, slot, c, values, loops, loaded, staged)
    w.close()
    if staged:
        w("__syncwarp();")
    if slot.mode == "reduce":
        w.close()
    w.close()


def _element(f: Factor, staged: bool, values: dict[str, str], comp: int) -> str:
    if staged:
        row = f.strides[0] if f.role == "w" else f.dim
        width = stage_width(row)
        inner = "".join(f" + {values[c]} * {s}" for c, s in zip(f.letters[1:], f.strides[1:]))
        return f"stage_{f.role}[lane * {width}{inner} + {comp}]"
    index = "".join(f" + {values[c]} * {s}" for c, s in zip(f.letters, f.strides))
    return f"p{f.array}[{f.offset}{index} + {comp}]"


def _used_components(c: Contribution, role: str) -> list[int]:
    if role == "w":
        return [0]
    position = {"x": 0, "y": 1, "z": 2}[role]
    return sorted({nz[position] for nz in c.nonzeros})


def _emit_loops(w, schedule, slot, c: Contribution, values, loops, loaded, staged) -> None:
    values = dict(values)
    loaded = set(loaded)
    static_letters = c.out_letters if slot.mode == "reduce" else ""

    def emit_ready_loads(suffix=""):
        for n, f in enumerate(c.factors):
            if n in loaded or any(l not in values for l in f.letters):
                continue
            if not suffix and any(l in static_letters for l in f.letters):
                continue
            if not suffix:
                loaded.add(n)
            for comp in _used_components(c, f.role):
                w(f"const T f{n}_{comp}{suffix} = {_element(f, f in staged, values, comp)};")

    emit_ready_loads()
    for letter in loops:
        w("#pragma unroll 2")
        w.open(f"for (int l_{letter} = 0; l_{letter} < {c.mul(letter)}; ++l_{letter})")
        values[letter] = f"l_{letter}"
        emit_ready_loads()
    if slot.mode == "reduce" and static_letters:
        for m in range(slot.mul):
            values[static_letters[0]] = str(m)
            emit_ready_loads(f"_m{m}")
            _emit_products(w, schedule, slot, c, f"_m{m}", m)
    else:
        _emit_products(w, schedule, slot, c, "", 0)
    for _ in loops:
        w.close()


def _emit_products(w, schedule, slot: Slot, c: Contribution, suffix: str, m: int) -> None:
    """``acc[q] += W * sum over CG nonzeros of c * A * B`` (or, for weights, the triple product)."""
    static = set(c.out_letters) if slot.mode == "reduce" else set()
    factor_of = {f.role: n for n, f in enumerate(c.factors)}

    def name(role, comp):
        n = factor_of[role]
        f = c.factors[n]
        tail = suffix if static & set(f.letters) else ""
        return f"f{n}_{comp}{tail}"

    dtype = schedule.dtype
    weight = f" * {name('w', 0)}" if "w" in factor_of and slot.role != "w" else ""
    if slot.role == "w":
        terms = [f"{literal(v, dtype)} * {name('x', i)} * {name('y', j)} * {name('z', k)}"
                 for i, j, k, v in c.nonzeros]
        w(f"acc += {' + '.join(terms)};")
        return
    position = {"x": 0, "y": 1, "z": 2}[slot.role]
    others = [r for r in "xyz" if r != slot.role]
    by_comp: dict[int, list[str]] = {}
    for nz in c.nonzeros:
        comps = dict(zip("xyz", nz[:3]))
        by_comp.setdefault(nz[position], []).append(
            f"{literal(nz[3], dtype)} * {name(others[0], comps[others[0]])} * {name(others[1], comps[others[1]])}"
        )
    for q, terms in sorted(by_comp.items()):
        acc = f"acc_{m}_{q}" if slot.mode == "reduce" else f"acc_{q}"
        w(f"{acc} += ({' + '.join(terms)}){weight};")
