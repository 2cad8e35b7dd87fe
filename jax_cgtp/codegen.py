"""CUDA source for one :class:`~jax_cgtp.schedule.KernelSchedule`.

The kernel is straight-line code over the sparse CG structure: every path (instruction) of every
slot becomes a block that loads the operand components it needs into registers, then
accumulates ``pw * C[i,j,k]`` products for the CG nonzeros only, fully unrolled (a joint pass's
backward terms contract z̄ first, once per path, and share it). Comments name
the slots, paths and irreps. Device helpers (staging, flushes, warp sums) come from
``cuda/cgtp_device.cuh``.

Kernel parameters, in order: the call's inputs (``in0 ...``), one index array per INDEXED role
(``idx_x ...``), for deterministic calls a ``(perm_r, off_r)`` pair per INDEXED role, the
kernel's outputs (``out0 ...``), then ``long long`` scalars: the edge count and the row count of
each INDEXED role.
"""

from __future__ import annotations

import functools
import pathlib

from .operands import BATCHED, INDEXED, SHARED
from .codegen_stream import emit_stream
from .cuda_text import Writer, cg_sums, emit_edge_header, emit_transposed_sum, lane_row, literal, put, row_of
from .schedule import (CHUNK_WEIGHT_REGISTERS, EDGE_Y_REGISTERS, WARP, Contribution, Factor, JointPath, KernelSchedule,
                       Slot, ahead_slot, slot_chunks, stage_width)

_HEADER = "cgtp_device.cuh"
_BUFFERS = {"ahead": "ring of look-ahead slots (x rows, weights)", "ring": "ring of weight items",
            "row": "output row summed over paths", "t": "t[u, k] of one item"}
KERNEL_NAME = "cgtp_kernel"


@functools.lru_cache(maxsize=None)
def device_header() -> str:
    """The text of ``cgtp_device.cuh`` (source tree first, then the installed copy)."""
    here = pathlib.Path(__file__).resolve().parent
    for folder in (here.parent / "cuda", here / "cuda"):
        path = folder / _HEADER
        if path.is_file():
            return path.read_text()
    raise FileNotFoundError(f"jax_cgtp: {_HEADER} is missing from {here.parent / 'cuda'} and {here / 'cuda'}")


def scalar_names(schedule: KernelSchedule) -> list[str]:
    """Names of the ``long long`` scalars after the buffers, in order."""
    return ["num_edges"] + [f"rows_{r}" for r in schedule.call.indexed_roles]


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
    their times by -2% to +2%.
    """
    joint = schedule.joint
    if joint is None or not joint.by_destination or dict(joint.outputs).keys() != {"z"}:
        return ()
    return tuple(a for role in ("y", "w") if schedule.call.kind(role) == BATCHED for a in joint.reads(role))


def _owned_end(schedule: KernelSchedule, out, cur: str = "cur") -> tuple[str, str]:
    """``(condition, row)`` of the flush that ends a tile's walk: the run's node for an owned
    output (written even when no edge of the tile was valid; in a lockstep walk, when the tile
    holds edges of the run), else the row ``cur`` last accumulated."""
    if out.flush != "own":
        return f"{cur} >= 0", cur
    return ("owned && count > 0" if schedule.lockstep else "owned"), "seg"


def _emit_group_barrier(w: Writer, schedule: KernelSchedule) -> None:
    """The block's warps meet before a group of paths when they walk their runs in step."""
    if schedule.lockstep:
        w("__syncthreads();  // the block's warps run each group's code together")


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
    w(device_header())
    params = [f"const T* __restrict__ in{n}" for n in range(call.num_inputs)]
    params += [f"const I* __restrict__ idx_{r}" for r in call.indexed_roles]
    if call.deterministic:
        for r in call.indexed_roles:
            params += [f"const I* __restrict__ perm_{r}", f"const I* __restrict__ off_{r}"]
    params += [f"T* __restrict__ out{k}" for k in range(len(schedule.outputs))]
    params += [f"const long long {name}" for name in scalar_names(schedule)]
    w(f'extern "C" __global__ void __launch_bounds__({schedule.block}) {KERNEL_NAME}(')
    for n, p in enumerate(params):
        w("    " + p + ("," if n + 1 < len(params) else ") {"))
    w.depth += 1
    _emit_prologue(w, schedule)
    _emit_tiles(w, schedule)
    w.close()
    return w.text()


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


def _emit_tiles(w: Writer, schedule: KernelSchedule) -> None:
    call = schedule.call
    groups = schedule.num_groups
    if groups > 1:
        w(f"// {groups} warps share each tile, each running its group of slots")
        w(f"const int group = (int)(warp % {groups});")
        w(f"const long long walker = warp / {groups};")
        w(f"const long long num_walkers = num_warps / {groups};")
        w("if (walker >= num_walkers) return;  // the grid's last warps, fewer than a group")
    first, step = ("walker", "num_walkers") if groups > 1 else ("warp", "num_warps")
    if schedule.tiling == "segments" and schedule.lockstep:
        r, warps = schedule.segment_role, schedule.warps_per_block
        w(f"// one warp reduces each {r}-node: its edges in sorted order, 32 at a time; runs -1 and rows_{r} hold")
        w(f"// the edges whose {r}-index is out of range (their per-edge outputs get zeros). The block's {warps} warps")
        w("// walk consecutive runs in step, as long as the longest, and meet before each group of paths")
        w(f"const long long step = (long long)gridDim.x * {warps};")
        w.open(f"for (long long base = (long long)blockIdx.x * {warps}; base < rows_{r} + 2; base += step)")
        w("const long long seg = base + (threadIdx.x >> 5) - 1;")
        w("long long seg_begin, seg_end;")
        w(f"cgtp_run(off_{r}, seg, rows_{r}, num_edges, seg_begin, seg_end);")
        _emit_owned_zeros(w, schedule)
        w(f"const long long longest = cgtp_longest_run(off_{r}, base - 1, {warps}, rows_{r}, num_edges, lane);")
        w.open("for (long long walked = 0; walked < longest; walked += 32)")
        w("const long long first = seg_begin + walked;")
        w("const bool fresh = walked == 0;  // the run's first edges store, later ones add")
        w("const int count = (int)(seg_end - first < 32 ? (seg_end > first ? seg_end - first : 0) : 32);")
        w(f"const long long my_edge = lane < count ? (long long)perm_{r}[first + lane] : 0;")
    elif schedule.tiling == "segments":
        r = schedule.segment_role
        w(f"// one warp (per group) reduces each {r}-node: its edges in sorted order, 32 at a time; runs -1 and")
        w(f"// rows_{r} hold the edges whose {r}-index is out of range (their per-edge outputs get zeros)")
        w.open(f"for (long long run = {first}; run < rows_{r} + 2; run += {step})")
        w("const long long seg = run - 1;")
        w(f"const long long seg_begin = seg < 0 ? 0 : (long long)off_{r}[seg];")
        w(f"const long long seg_end = seg < rows_{r} ? (long long)off_{r}[seg + 1] : num_edges;")
        _emit_owned_zeros(w, schedule)
        w.open("for (long long first = seg_begin; first < seg_end; first += 32)")
        w("const bool fresh = first == seg_begin;  // the run's first edges store, later ones add")
        w("const int count = (int)(seg_end - first < 32 ? seg_end - first : 32);")
        w(f"const long long my_edge = lane < count ? (long long)perm_{r}[first + lane] : 0;")
    else:
        tile = schedule.tile
        if schedule.fill:
            w(f"// the edges spread evenly over the warps: rounds of one tile per warp, spans of at most {tile} edges")
            w(f"const long long rounds = (num_edges + num_warps * {tile} - 1) / (num_warps * {tile});")
            w(f"const long long span = rounds > 0 ? (num_edges + num_warps * rounds - 1) / (num_warps * rounds) : {tile};")
        else:
            w(f"const long long span = {tile};")
        w("const long long num_tiles = (num_edges + span - 1) / span;")
        w.open(f"for (long long tile = {first}; tile < num_tiles; tile += {step})")
        w("const long long first = tile * span;")
        w("const int count = (int)(num_edges - first < span ? num_edges - first : span);")
        w("const long long my_edge = first + lane;")
    w("bool my_ok = lane < count;")
    for r in call.indexed_roles:
        w(f"const long long my_ix_{r} = my_ok ? (long long)idx_{r}[my_edge] : -1;")
    for r in call.indexed_roles:
        w(f"my_ok = my_ok && cgtp_valid(my_ix_{r}, rows_{r});")
    if schedule.joint is not None:
        _emit_joint(w, schedule)
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
        if out.kind != BATCHED:
            continue
        for start, end in out.zero_ranges:
            w(f"// out{k} ({out.role}) components [{start}, {end}) have no path: zeros")
            w.open("for (int t = 0; t < count; ++t)" if groups == 1 else "for (int t = 0; group == 0 && t < count; ++t)")
            w("const long long e = __shfl_sync(CGTP_FULL_MASK, my_edge, t);")
            w(f"for (int q = lane; q < {end - start}; q += 32) "
              f"out{k}[e * {out.dim}LL + {start} + q] = T(0);")
            w.close()
    if schedule.tiling == "segments":
        w.close()
    w.close()


def _emit_owned_zeros(w: Writer, schedule: KernelSchedule) -> None:
    """Zeros where a run's node gets no flush: its whole row when the run is empty, and the
    components no path writes (group 0 of a grouped launch)."""
    r = schedule.segment_role
    w(f"const bool owned = seg >= 0 && seg < rows_{r};  // the node whose row this warp writes")
    guard = "owned" if schedule.num_groups == 1 else "owned && group == 0"
    for k, out in enumerate(schedule.outputs):
        if out.flush != "own":
            continue
        w(f"if ({guard} && seg_begin == seg_end) "
          f"for (int q = lane; q < {out.dim}; q += 32) out{k}[seg * {out.dim}LL + q] = T(0);  // no edges")
        for start, end in out.zero_ranges:
            w(f"if ({guard}) for (int q = lane; q < {end - start}; q += 32) "
              f"out{k}[seg * {out.dim}LL + {start} + q] = T(0);  // components [{start}, {end}) have no path")


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
        w("const int lc = c * 32 + lane;")
        w(f"const bool active = lc < {lane_mul};")
        w(f"const int nrows = {lane_mul} - c * 32 < 32 ? {lane_mul} - c * 32 : 32;")
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
        condition, row = _owned_end(schedule, out)
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
        d = slot.dim
        w.open("if (active)")
        for q, a in enumerate(accs):
            w(f"obuf[lane * {d} + {q}] = {a};")
        w.close()
        w("__syncwarp();")
        w("#pragma unroll")
        w.open(f"for (int r = 0; r < {d}; ++r)")
        w("const int q = r * 32 + lane;")
        w(f"if (q < nrows * {d}) {put(out, f'dst + c * {WARP * d} + q', 'obuf[q]')}")
        w.close()
        w("__syncwarp();")
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


def _emit_joint(w: Writer, schedule: KernelSchedule) -> None:
    """A joint pass (:class:`~jax_cgtp.schedule.JointPass`): each edge's paths, block by block."""
    joint = schedule.joint
    outs = dict(joint.outputs)
    if joint.walk:
        (_emit_forward_walk if set(outs) == {"z"} else _emit_backward_walk)(w, schedule)
        return
    w()
    forward = set(outs) == {"z"}
    kind = "forward" if forward else "backward"
    w(f"// ---- joint {kind}: " + ", ".join(f"out{k} ({r})" for r, k in joint.outputs)
      + "; each path's operand chunks are loaded once")
    w("#pragma unroll 1")
    w.open("for (int t = 0; t < count; ++t)")
    emit_edge_header(w, schedule)
    _emit_joint_rows(w, schedule)
    y_values = _emit_edge_y(w, schedule)
    if "y" in outs:
        for n, (_, dim) in enumerate(joint.y_blocks):
            w(f"T {', '.join(f'gy{n}_{q} = T(0)' for q in range(dim))};")
    for x_offset, mul, dim, paths in joint.blocks:
        _open_joint_chunks(w, x_offset, mul, dim, paths)
        if forward:  # measured: the forward gains, the backward loses
            w("const int lane = cgtp_lane();  // read here, so that the chunk's addresses are not held across edges")
        w("const bool live = ok && active;")
        if "x" in outs:
            w(f"T {', '.join(f'gx_{q} = T(0)' for q in range(dim))};")
        batches = _weight_batches(schedule, paths)
        weights = _emit_chunk_weights(w, schedule, batches[0])
        if outs.keys() & {"y", "w", "z"}:  # the x chunks, shared by the block's paths
            for a in joint.reads("x"):
                if _emit_joint_chunk(w, schedule, "x", x_offset, dim, range(dim), joint.suffix("x", a)):
                    w("__syncwarp();")
        for n, batch in enumerate(batches):
            if n:
                weights = _emit_chunk_weights(w, schedule, batch)
            for path in batch:
                _emit_joint_path(w, schedule, path, weights, y_values=y_values)
        if "x" in outs:
            _emit_joint_flush(w, schedule, "x", x_offset, dim)
        w.close()
    if "y" in outs:
        out = schedule.outputs[outs["y"]]
        lo, values = _y_sum_values(joint, range(len(joint.y_blocks)))
        emit_transposed_sum(w, values, f"out{outs['y']}[e * {out.dim}LL + {lo} + ", "]", "=")
    w.close()


def _emit_joint_rows(w: Writer, schedule: KernelSchedule, roles=("x", "y", "w", "z")) -> None:
    """Pointers ``p_{role}{suffix}`` to this edge's row of each input of a joint pass (of ``roles``)."""
    joint = schedule.joint
    problem = schedule.call.problem
    for role, a in joint.arrays:
        if role in roles:
            w(f"const T* const p_{role}{joint.suffix(role, a)} = in{a} + {row_of(schedule, role)} * "
              f"{problem.operand_dim(role)}LL;  // {role} row")


def _open_joint_chunks(w: Writer, x_offset: int, mul: int, dim: int, paths) -> None:
    """Open the loop over the 32-channel chunks of the x block at ``x_offset`` (lanes over ``u``)."""
    w(f"// x block at {x_offset}: {mul} channels of dimension {dim}, paths "
      f"[{', '.join(str(p.ins_index) for p in paths)}]")
    w("#pragma unroll 1")
    w.open(f"for (int c = 0; c < {-(-mul // WARP)}; ++c)")
    w("const int lc = c * 32 + lane;")
    w(f"const bool active = lc < {mul};")
    w(f"const int nrows = {mul} - c * 32 < 32 ? {mul} - c * 32 : 32;")


def _stage_y_base(n: int, dim: int) -> str:
    """Where the staged tile rows of the pass's ``n``-th y input start in ``stage_y``."""
    return f"{n * WARP * dim} + " if n else ""


def _emit_tile_y(w: Writer, schedule: KernelSchedule) -> None:
    """Stage the y rows of the tile's edges in ``stage_y`` (row ``t`` for the tile's edge ``t``, one
    set of rows per y input), once per tile: every chunk of every x block then reads its y
    components from there."""
    dim = schedule.call.problem.operand_dim("y")
    w("// the y rows of the tile's edges, staged once for every chunk of every x block")
    w("__syncwarp();")
    w.open(f"for (int q = lane; q < {WARP * dim}; q += 32)")
    w(f"const int t = q / {dim};")
    w("const long long row = __shfl_sync(CGTP_FULL_MASK, my_edge, t);")
    for n, array in enumerate(schedule.joint.reads("y")):
        w(f"if (t < count) stage_y[{_stage_y_base(n, dim)}q] = in{array}[row * {dim}LL + q % {dim}];")
    w.close()
    w("__syncwarp();")


def _staged_y(schedule: KernelSchedule):
    """Component ``c`` of y input ``array`` for the current edge ``t``, ``value(array, c)``: a staged
    tile row, or None (loaded per path)."""
    if "y" not in dict(schedule.stage_sizes):
        return None
    dim = schedule.call.problem.operand_dim("y")
    arrays = schedule.joint.reads("y")
    return lambda array, c: f"stage_y[{_stage_y_base(arrays.index(array), dim)}t * {dim} + {c}]"


def _ahead_rows(w: Writer, schedule: KernelSchedule, roles) -> dict[str, str]:
    """Declare the rows of ``roles`` for the edge ``ta`` ahead (row 0 when it is not valid)."""
    rows = {}
    for role in roles:
        kind = schedule.call.kind(role)
        if kind == SHARED:
            rows[role] = "0"
            continue
        w(f"const long long row_{role} = ok_a ? (long long)__shfl_sync(CGTP_FULL_MASK, {lane_row(schedule, role)}, ta) : 0;")
        rows[role] = f"row_{role}"
    return rows


def _weighted(schedule: KernelSchedule, paths) -> list[JointPath]:
    """The paths whose weight a joint pass reads (none when it does not read ``w``)."""
    return [p for p in paths if p.w_offset is not None] if schedule.joint.reads("w") else []


def _emit_edge_y(w: Writer, schedule: KernelSchedule):
    """Load the edge's y components that any path reads into registers once per edge (``ye{s}_c``),
    so that no path waits on a y load queued behind the previous path's stores; returns
    ``value(array, c)`` for :func:`_emit_joint_path`. With more than
    :data:`~jax_cgtp.schedule.EDGE_Y_REGISTERS`, each path loads its own: NVRTC merges plain loads
    of one component across x blocks, holding every component in registers for the whole edge.
    In float32 that measured best (None: plain loads); in float64 it took two registers per
    component (l5-c32's forward spilled 2 KB per thread), so the loads go through ``__ldca``,
    which NVRTC does not merge (0.74x the forward's time, H100)."""
    joint = schedule.joint
    used = sorted({p.y_offset + nz[1] for *_, paths in joint.blocks for p in paths for nz in p.nonzeros})
    if len(used) > EDGE_Y_REGISTERS:
        if schedule.itemsize == 4:
            return None
        return lambda a, c: f"(ok ? __ldca(p_y{joint.suffix('y', a)} + {c}) : T(0))"
    for a in joint.reads("y"):
        s = joint.suffix("y", a)
        w(" ".join(f"const T ye{s}_{c} = ok ? p_y{s}[{c}] : T(0);" for c in used))
    return lambda a, c: f"ye{joint.suffix('y', a)}_{c}"


def _declare_weights(w: Writer, schedule: KernelSchedule, paths, value) -> dict[tuple[int, int], str]:
    """Declare ``cw{s}_{n}``, the lane's weight of weighted path ``n`` in w input ``s`` for this
    edge and chunk, as ``value(s, path)``; returns the names by ``(instruction index, w input)``."""
    joint = schedule.joint
    weights = {}
    for a in joint.reads("w"):
        s = joint.suffix("w", a)
        for p in _weighted(schedule, paths):
            w(f"const T cw{s}_{p.ins_index} = {value(s, p)};")
            weights[p.ins_index, a] = f"cw{s}_{p.ins_index}"
    return weights


def _emit_chunk_weights(w: Writer, schedule: KernelSchedule, paths) -> dict[tuple[int, int], str]:
    """Load the lane's weight of every weighted path of the block for this edge and chunk at once,
    before any of them is used, so that their loads are in flight together (each path's flush
    syncs the warp, and a load is not moved across that)."""
    return _declare_weights(w, schedule, paths, lambda s, p: f"live ? p_w{s}[{p.w_offset} + lc] : T(0)")


def _weight_batches(schedule: KernelSchedule, paths) -> list[list[JointPath]]:
    """The block's paths in consecutive batches whose weights (every w input's) fit in
    :data:`~jax_cgtp.schedule.CHUNK_WEIGHT_REGISTERS` registers; a path without weight costs none."""
    per_path = len(schedule.joint.reads("w")) * schedule.itemsize // 4
    batches, used = [[]], 0
    for path in paths:
        cost = per_path if path.w_offset is not None else 0
        if used + cost > CHUNK_WEIGHT_REGISTERS and batches[-1]:
            batches.append([])
            used = 0
        batches[-1].append(path)
        used += cost
    return batches


def _open_edge_ahead(w: Writer, schedule: KernelSchedule, x_offset: int, dim: int, paths,
                     edge: str) -> tuple[dict[int, str], dict[int, str]]:
    """Open a block for the tile's edge ``edge``, loaded ahead: ``ta`` and ``ok_a`` (the edge is in
    the tile and valid); returns the addresses of its x chunk in each x input and of its row in
    each w input (none without a weighted path), by input."""
    joint = schedule.joint
    problem = schedule.call.problem
    weighted = _weighted(schedule, paths)
    xs = joint.reads("x")
    w.open("")
    w(f"const int ta = {edge};")
    w("const bool ok_a = ta < count && __shfl_sync(CGTP_FULL_MASK, (int)my_ok, ta) != 0;")
    rows = _ahead_rows(w, schedule, (["x"] if xs else []) + (["w"] if weighted else []))
    x_chunks = {a: f"in{a} + {rows['x']} * {problem.operand_dim('x')}LL + {x_offset} + c * {WARP * dim}LL" for a in xs}
    w_rows = {a: f"in{a} + {rows['w']} * {problem.operand_dim('w')}LL" for a in joint.reads("w")} if weighted else {}
    return x_chunks, w_rows


def _emit_fetch_ahead(w: Writer, schedule: KernelSchedule, x_offset: int, dim: int, paths, edge: str,
                      x_condition: str = "") -> None:
    """Load the operands of the tile's edge ``edge`` for this chunk into registers (``ax{s}``: the
    chunk's coalesced elements of x input ``s``; ``aw{s}_n``: path n's weight in w input ``s``),
    zero when the edge is past the tile or invalid (or ``x_condition`` is false), so that they are
    in flight while the current edge computes."""
    joint = schedule.joint
    x_chunks, w_rows = _open_edge_ahead(w, schedule, x_offset, dim, paths, edge)
    condition = f"ok_a && ({x_condition})" if x_condition else "ok_a"
    for a, chunk in x_chunks.items():
        w(f"cgtp_fetch<{dim}>(ax{joint.suffix('x', a)}, {chunk}, nrows * {dim}, lane, {condition});")
    _emit_weights_ahead(w, schedule, paths, w_rows,
                        lambda s, p: f"aw{s}_{p.ins_index} = ok_a && active ? pw{s}_a[{p.w_offset} + lc] : T(0);")
    w.close()


def _emit_weights_ahead(w: Writer, schedule: KernelSchedule, paths, w_rows: dict[int, str], statement) -> None:
    """Point ``pw{s}_a`` at the row ahead of each w input (``w_rows``, from :func:`_open_edge_ahead`),
    then emit ``statement(s, path)``, which moves that path's weight, for each weighted path."""
    for a, row in w_rows.items():
        s = schedule.joint.suffix("w", a)
        w(f"const T* const pw{s}_a = {row};")
        for p in _weighted(schedule, paths):
            w(statement(s, p))


def _emit_ahead(w: Writer, schedule: KernelSchedule, x_offset: int, dim: int, paths, x_condition: str = "") -> None:
    """Declare the look-ahead registers of a chunk and load them for the tile's first edge."""
    joint = schedule.joint
    for a in joint.reads("x"):
        w(f"T ax{joint.suffix('x', a)}[{dim}];")
    weighted = _weighted(schedule, paths)
    for a in joint.reads("w") if weighted else ():
        s = joint.suffix("w", a)
        w(f"T {', '.join(f'aw{s}_{p.ins_index}' for p in weighted)};")
    w("// the next edge's x chunk and weights are loaded while the current edge computes")
    _emit_fetch_ahead(w, schedule, x_offset, dim, paths, "0", x_condition)


def _take_ahead(w: Writer, schedule: KernelSchedule, dim: int, paths) -> dict[str, str]:
    """Copy the look-ahead registers (this edge's operands) before they are refilled; returns the
    current weight of each weighted path and w input, by ``(instruction index, input)``."""
    joint = schedule.joint
    for a in joint.reads("x"):
        s = joint.suffix("x", a)
        w(f"T cx{s}[{dim}] = {{{', '.join(f'ax{s}[{r}]' for r in range(dim))}}};")
    return _declare_weights(w, schedule, paths, lambda s, p: f"aw{s}_{p.ins_index}")


def _emit_x_from_ahead(w: Writer, schedule: KernelSchedule, dim: int) -> bool:
    """Registers ``x{s}_q`` of this lane's channel from the taken chunk ``cx{s}`` of each x input
    (transposed through the warp's staging rows when ``dim > 1``, one input after the other);
    True if staged (the caller syncs before the next use)."""
    joint = schedule.joint
    for n, a in enumerate(joint.reads("x")):
        s = joint.suffix("x", a)
        if dim == 1:
            w(f"const T x{s}_0 = cx{s}[0];")
            continue
        if n:
            w("__syncwarp();  // the previous input's elements are read")
        width = stage_width(dim)
        w(f"cgtp_unpack<{dim}, {width}>(stage_x, cx{s}, lane);")
        w("__syncwarp();")
        for q in range(dim):
            w(f"const T x{s}_{q} = live ? stage_x[lane * {width} + {q}] : T(0);")
    return dim > 1


def _ring_layout(schedule: KernelSchedule, dim: int, paths):
    """Where a look-ahead slot holds each x input's 32 staged rows (by the input's suffix) and each
    weighted path's 32 weights (by ``(instruction index, w input's suffix)``), and the slot's size."""
    joint = schedule.joint
    width = stage_width(dim)
    x_parts = {joint.suffix("x", a): n * WARP * width for n, a in enumerate(joint.reads("x"))}
    offset = len(x_parts) * WARP * width
    w_parts = {}
    for a in joint.reads("w"):
        for p in _weighted(schedule, paths):
            w_parts[p.ins_index, joint.suffix("w", a)] = offset
            offset += WARP
    return x_parts, w_parts, ahead_slot(joint, dim, paths)


def _emit_ring_fetch(w: Writer, schedule: KernelSchedule, x_offset: int, dim: int, paths, edge: str) -> None:
    """Copy the operands of the tile's edge ``edge`` for this chunk into its look-ahead slot
    (nothing when the edge is past the tile or invalid), and commit them as one group."""
    joint = schedule.joint
    x_parts, w_parts, size = _ring_layout(schedule, dim, paths)
    x_chunks, w_rows = _open_edge_ahead(w, schedule, x_offset, dim, paths, edge)
    w(f"T* const slot_a = stage_ahead + (ta % {schedule.ahead + 1}) * {size};")
    w.open("if (ok_a)")
    for a, chunk in x_chunks.items():
        w(f"cgtp_stage_async<{dim}, {stage_width(dim)}>(slot_a + {x_parts[joint.suffix('x', a)]}, {chunk}, "
          f"nrows * {dim}, lane);")
    _emit_weights_ahead(w, schedule, paths, w_rows, lambda s, p: f"if (active) cgtp_copy_element(slot_a + "
                        f"{w_parts[p.ins_index, s]} + lane, pw{s}_a + {p.w_offset} + lc);")
    w.close()
    w("cgtp_commit();  // one group per edge, empty past the tile")
    w.close()


def _emit_ring_fill(w: Writer, schedule: KernelSchedule, x_offset: int, dim: int, paths) -> None:
    """Start the look-ahead: the copies of the tile's first ``ahead`` edges."""
    w(f"// the x chunk and weights of the edge {schedule.ahead} ahead are copied into the ring while the current "
      "edge computes")
    w("__syncwarp();  // the ring's last readers are done")
    for d in range(schedule.ahead):
        _emit_ring_fetch(w, schedule, x_offset, dim, paths, str(d))


def _take_ring(w: Writer, schedule: KernelSchedule, dim: int, paths) -> dict[tuple[int, int], str]:
    """Wait for edge ``t``'s slot, point ``slot`` at it and take its weights (returned by
    ``(instruction index, w input)``); its x values are read later (:func:`_emit_x_from_ring`)."""
    _, w_parts, size = _ring_layout(schedule, dim, paths)
    w(f"cgtp_wait<{schedule.ahead - 1}>();  // edge t's copies have landed")
    w("__syncwarp();  // and every lane's are visible")
    w(f"const T* const slot = stage_ahead + (t % {schedule.ahead + 1}) * {size};")
    return _declare_weights(w, schedule, paths, lambda s, p: f"active ? slot[{w_parts[p.ins_index, s]} + lane] : T(0)")


def _emit_x_from_ring(w: Writer, schedule: KernelSchedule, dim: int, paths) -> None:
    """Registers ``x{s}_q`` of this lane's channel from edge ``t``'s slot."""
    x_parts, _, _ = _ring_layout(schedule, dim, paths)
    width = stage_width(dim)
    for s, offset in x_parts.items():
        for q in range(dim):
            w(f"const T x{s}_{q} = active ? slot[{offset} + lane * {width} + {q}] : T(0);")


def _emit_forward_walk(w: Writer, schedule: KernelSchedule) -> None:
    """The joint forward that walks the tile's edges: per x block (or group of its paths) and
    chunk, the tile's edges in order. A convolution accumulates every path's z chunk in registers
    over a run of one destination and adds it atomically when the destination changes (edges
    sorted by ``dst`` make one flush per node and tile); a product writes each path's z chunk per
    edge. The next edge's x chunk and weights are loaded while the current edge computes."""
    joint = schedule.joint
    z_out = schedule.outputs[dict(joint.outputs)["z"]]
    held = z_out.kind == INDEXED  # z chunks kept across the edges of one destination
    tracked = held and z_out.flush != "own"  # an owned run has one node: no row to track
    w()
    w("// ---- joint forward, walking the tile's edges: each x chunk staged once per edge for all of its")
    w("// group's paths" + ("; their z chunks stay in registers while the destination node stays the same"
                          if held else ", which write their z chunks"))
    y_values = _staged_y(schedule)
    if y_values:
        _emit_tile_y(w, schedule)
    for x_offset, mul, dim, paths in joint.blocks:
        _emit_group_barrier(w, schedule)
        _open_joint_chunks(w, x_offset, mul, dim, paths)
        accumulators = _declare_z_chunks(w, paths) if held else [None] * len(paths)
        if tracked:
            w("long long cur = -1;")
        if schedule.ahead:
            _emit_ring_fill(w, schedule, x_offset, dim, paths)
        else:
            _emit_ahead(w, schedule, x_offset, dim, paths)
        w("#pragma unroll 1")
        w.open("for (int t = 0; t < count; ++t)")
        emit_edge_header(w, schedule)
        if schedule.ahead:
            weights = _take_ring(w, schedule, dim, paths)
            _emit_ring_fetch(w, schedule, x_offset, dim, paths, f"t + {schedule.ahead}")
        else:
            weights = _take_ahead(w, schedule, dim, paths)
            _emit_fetch_ahead(w, schedule, x_offset, dim, paths, "t + 1")
        w("if (!ok) continue;")
        if tracked:
            w.open("if (cur >= 0 && ix_z != cur)")
            _emit_z_flush(w, schedule, paths, accumulators, "cur")
            w.close()
            w("cur = ix_z;")
        w("const bool live = active;")
        if not y_values:
            _emit_joint_rows(w, schedule, ("y",))
        if schedule.ahead:
            _emit_x_from_ring(w, schedule, dim, paths)
            staged = False
        else:
            staged = _emit_x_from_ahead(w, schedule, dim)
        for path, names in zip(paths, accumulators):
            _emit_joint_path(w, schedule, path, weights, z_acc=names, y_values=y_values)
        if staged:
            w("__syncwarp();")
        w.close()
        if held:
            condition, row = _owned_end(schedule, z_out)
            w.open(f"if ({condition})")
            _emit_z_flush(w, schedule, paths, accumulators, row)
            w.close()
        w.close()


def _declare_z_chunks(w: Writer, paths) -> list[list[str]]:
    """Declare, zeroed, the registers that hold each path's z chunk across edges (``gz{n}_k`` for
    the n-th path); returns their names, path by path."""
    accumulators = [[f"gz{n}_{k}" for k in range(p.z_dim)] for n, p in enumerate(paths)]
    w(f"T {', '.join(a + ' = T(0)' for names in accumulators for a in names)};")
    return accumulators


def _emit_z_flush(w: Writer, schedule: KernelSchedule, paths, accumulators, row: str) -> None:
    """Add (or, for an owned run, write) every path's z chunk to row ``row``, and zero them."""
    for path, names in zip(paths, accumulators):
        _emit_joint_flush(w, schedule, "z", path.z_offset, path.z_dim, names, row)


def _emit_backward_walk(w: Writer, schedule: KernelSchedule) -> None:
    """The joint backward that walks the tile's edges: per x block (or group of its paths) and
    chunk, the tile's edges in order. The group's z̄ chunks are staged in shared memory when the
    z row changes (a convolution's edges sorted by ``dst``: once per node and tile). The x chunks
    stay in registers, and x̄ accumulates, while the x row stays the same; x̄ is flushed (stored,
    atomically added, or written by the warp that owns a deterministic launch's source run; added
    to by the later groups of its x block) when it changes. w̄ is written per edge, and each
    edge's ȳ summed over the warp into the tile's rows in shared memory, stored at the end. A z
    output (the force loss's second derivative) accumulates in registers while its row stays the
    same, as in the forward. The next edge's weights, and its x chunks when its row differs, are
    loaded while the current edge computes."""
    joint = schedule.joint
    outs = dict(joint.outputs)
    y_dim = schedule.call.problem.operand_dim("y")
    w()
    w("// ---- joint backward, walking the tile's edges: " + ", ".join(f"out{k} ({r})" for r, k in joint.outputs)
      + "; the group's z̄ chunks stay staged while the z row stays the same")
    if "y" in outs:
        w(f"for (int q = lane; q < {WARP * y_dim}; q += 32) ysum[q] = T(0);")
        w("__syncwarp();")
    y_values = _staged_y(schedule)
    if y_values:
        _emit_tile_y(w, schedule)
    xs = [joint.suffix("x", a) for a in joint.reads("x")]  # x̄ alone does not read x
    x_row, z_row = row_of(schedule, "x"), row_of(schedule, "z")
    x_out = schedule.outputs[outs["x"]] if "x" in outs else None
    z_out = schedule.outputs[outs["z"]] if "z" in outs else None
    for n_block, (x_offset, mul, dim, paths) in enumerate(joint.blocks):
        added = any(other[0] == x_offset for other in joint.blocks[:n_block])  # x̄ of an earlier group there
        _emit_group_barrier(w, schedule)
        _open_joint_chunks(w, x_offset, mul, dim, paths)
        w("long long cur = -1, cur_x = -1;")
        for s in xs:
            w(f"T {', '.join(f'xr{s}_{q} = T(0)' for q in range(dim))};")
        accumulators = _declare_z_chunks(w, paths) if z_out else []
        if "x" in outs:
            w(f"T {', '.join(f'gx_{q} = T(0)' for q in range(dim))};")
        # the next edge's x chunk is needed only when its source differs from the one held then
        x_ahead = f"row_x != (ok ? {x_row} : cur_x)"
        _emit_ahead(w, schedule, x_offset, dim, paths, "row_x != cur_x")
        w("#pragma unroll 1")
        w.open("for (int t = 0; t < count; ++t)")
        emit_edge_header(w, schedule)
        weights = _take_ahead(w, schedule, dim, paths)
        _emit_fetch_ahead(w, schedule, x_offset, dim, paths, "t + 1", x_ahead)
        w.open("if (!ok)")
        if "w" in outs:
            out = schedule.outputs[outs["w"]]
            for path in paths:
                if path.w_offset is not None:
                    w(f"if (active) out{outs['w']}[e * {out.dim}LL + {path.w_offset} + lc] = T(0);")
        w("continue;")
        w.close()
        w("const bool live = active;")
        _emit_joint_rows(w, schedule, ("z",) if y_values else ("y", "z"))
        w.open(f"if ({z_row} != cur)")
        if z_out is not None and z_out.flush != "own":  # an owned run has one destination node
            w.open("if (cur >= 0)")
            _emit_z_flush(w, schedule, paths, accumulators, "cur")
            w.close()
        w(f"cur = {z_row};")
        w("__syncwarp();")
        staged_z, offset = [], 0
        for path in paths:
            width = stage_width(path.z_dim)
            w(f"cgtp_stage<{path.z_dim}, {width}>(stage_z + {offset}, p_z + {path.z_offset} + c * "
              f"{WARP * path.z_dim}LL, nrows * {path.z_dim}, lane);")
            staged_z.append([f"(live ? stage_z[{offset} + lane * {width} + {k}] : T(0))" for k in range(path.z_dim)])
            offset += WARP * width
        w("__syncwarp();")
        w.close()
        w.open(f"if ({x_row} != cur_x)")
        if "x" in outs and x_out.flush != "own":  # an owned run has one source node
            w.open("if (cur_x >= 0)")
            _emit_joint_flush(w, schedule, "x", x_offset, dim, row="cur_x", add=added)
            w.close()
        w(f"cur_x = {x_row};")
        if xs:
            w.open("")
            if _emit_x_from_ahead(w, schedule, dim):
                w("__syncwarp();")
            w(" ".join(f"xr{s}_{q} = x{s}_{q};" for s in xs for q in range(dim)))
            w.close()
        w.close()
        for s in xs:
            w(" ".join(f"const T x{s}_{q} = xr{s}_{q};" for q in range(dim)))
        reached = sorted({joint.y_blocks.index((p.y_offset, p.y_dim)) for p in paths}) if "y" in outs else []
        for n in reached:
            w(f"T {', '.join(f'gy{n}_{q} = T(0)' for q in range(joint.y_blocks[n][1]))};")
        for n, (path, z_values) in enumerate(zip(paths, staged_z)):
            _emit_joint_path(w, schedule, path, weights, z_acc=accumulators[n] if accumulators else None,
                             z_values=z_values, y_values=y_values)
        if reached:
            lo, values = _y_sum_values(joint, reached)
            emit_transposed_sum(w, values, f"ysum[t * {y_dim} + {lo} + ", "]", "+=")
        w.close()
        if "x" in outs:
            condition, row = _owned_end(schedule, x_out, "cur_x")
            w.open(f"if ({condition})")
            _emit_joint_flush(w, schedule, "x", x_offset, dim, row=row, add=added)
            w.close()
        if z_out is not None:
            condition, row = _owned_end(schedule, z_out)
            w.open(f"if ({condition})")
            _emit_z_flush(w, schedule, paths, accumulators, row)
            w.close()
        w.close()
    if "y" in outs:
        out = schedule.outputs[outs["y"]]
        w("__syncwarp();")
        if schedule.tiling == "segments":  # the edges of a node's run: rows of the sorted permutation
            w.open("for (int t = 0; t < count; ++t)")
            w("const long long e = __shfl_sync(CGTP_FULL_MASK, my_edge, t);")
            w(f"for (int q = lane; q < {y_dim}; q += 32) out{outs['y']}[e * {out.dim}LL + q] = ysum[t * {y_dim} + q];")
            w.close()
        else:  # a tile's edges are consecutive rows
            w(f"for (int q = lane; q < count * {y_dim}; q += 32) out{outs['y']}[first * {out.dim}LL + q] = ysum[q];")
        w("__syncwarp();")


def _y_sum_values(joint, reached) -> tuple[int, list[str]]:
    """The ȳ accumulators of the y blocks ``reached`` (indices into ``joint.y_blocks``) over the
    contiguous range of components they span: ``(first component, values)``, ``T(0)`` in gaps."""
    by_offset = {}
    for n in reached:
        offset, dim = joint.y_blocks[n]
        by_offset.update({offset + q: f"gy{n}_{q}" for q in range(dim)})
    lo = min(by_offset)
    return lo, [by_offset.get(c, "T(0)") for c in range(lo, max(by_offset) + 1)]


def _emit_joint_path(w: Writer, schedule: KernelSchedule, path: JointPath, weights, z_acc=None, z_values=None,
                     y_values=None) -> None:
    """One path's terms for the current edge and chunk. ``weights[ins, array]`` is the lane's
    weight of a weighted path in w input ``array`` (:func:`_declare_weights`). ``z_acc`` are the
    registers that hold the path's z chunk across edges, which a z output adds to (without, it
    writes the chunk at once); ``z_values`` the staged z̄ elements that backward terms read
    (without, they load the chunk). ``y_values(array, c)`` gives component ``c`` of y input
    ``array`` where it is already at hand (else it is loaded from the edge's row)."""
    joint = schedule.joint
    problem = schedule.call.problem
    outs = dict(joint.outputs)
    ins = problem.instructions[path.ins_index]
    names = (problem.irreps_in1[ins.i_in1], problem.irreps_in2[ins.i_in2], problem.irreps_out[ins.i_out])
    w(f"// path {path.ins_index}: {names[0]} (x) {names[1]} -> {names[2]}, mode uvu, "
      f"{'weighted' if path.w_offset is not None else 'unweighted'}, {len(path.nonzeros)} CG nonzeros")
    w.open("")
    used = [sorted({nz[n] for nz in path.nonzeros}) for n in range(3)]
    for a in joint.reads("y"):  # ȳ alone does not read y
        s = joint.suffix("y", a)
        for j in used[1]:
            value = y_values(a, path.y_offset + j) if y_values else f"ok ? p_y{s}[{path.y_offset + j}] : T(0)"
            w(f"const T y{s}_{j} = {value};")
    for a in joint.reads("w") if path.w_offset is not None else ():
        s = joint.suffix("w", a)
        w(f"const T wt{s} = {weights[path.ins_index, a]};")
    staged = False
    if joint.reads("z"):  # z̄, read by the backward terms
        if z_values is None:
            staged = _emit_joint_chunk(w, schedule, "z", path.z_offset, path.z_dim, used[2])
        else:
            w(" ".join(f"const T z_{k} = {z_values[k]};" for k in used[2]))
    through_z = _ThroughZ(w, path, schedule.dtype)
    if "z" in outs:
        accumulators = z_acc or [f"gz_{k}" for k in range(path.z_dim)]
        if z_acc is None:
            w(f"T {', '.join(f'{a} = T(0)' for a in accumulators)};")
        for k, value in _path_sums(w, schedule, path, "z", through_z).items():
            w(f"{accumulators[k]} += {value};")
        if z_acc is None:
            _emit_joint_flush(w, schedule, "z", path.z_offset, path.z_dim)
    if "x" in outs:
        for i, value in _path_sums(w, schedule, path, "x", through_z).items():
            w(f"gx_{i} += {value};")
    if "y" in outs:
        n = joint.y_blocks.index((path.y_offset, path.y_dim))
        for j, value in _path_sums(w, schedule, path, "y", through_z).items():
            w(f"gy{n}_{j} += {value};")
    if "w" in outs and path.w_offset is not None:
        out = schedule.outputs[outs["w"]]
        gradient = _weight_gradient(schedule, path, through_z)
        w(f"if (active) out{outs['w']}[e * {out.dim}LL + {path.w_offset} + lc] = {gradient};")
    if staged:
        w("__syncwarp();")
    w.close()


def _term_names(joint, term) -> dict[str, str]:
    """The register name of each factor of ``term`` (``x5`` for x input 5 among several)."""
    return {role: f"{role}{joint.suffix(role, a)}" for role, a in term.factors}


def _path_terms(joint, path: JointPath, role: str):
    """The terms of output ``role`` that ``path`` contributes to (a weighted-only term skips an
    unweighted path)."""
    return [t for t in joint.terms if t.role == role and (path.w_offset is not None or not t.weighted_only)]


class _ThroughZ:
    """One path's CG sums through a z̄ operand ``Z``, for the current edge and chunk.

    ``S_ij = sum_k pw C_ijk Z_k`` once per ``(i, j)`` pair of the path's nonzeros; then
    ``sum_j Y_j S_ij`` (by ``i``: x̄'s sum) and ``sum_i X_i S_ij`` (by ``j``: ȳ's). w̄ reuses
    either: ``sum_ijk pw C X_i Y_j Z_k = sum_i X_i (sum_j Y_j S_ij)``. Each is declared (const
    registers of the path's block) when first asked for.

    Summed per term, each nonzero cost about two floating-point instructions for x̄, two for ȳ
    and three for w̄; through ``S`` it costs one, plus one per pair for each of x̄ and ȳ (mace-l2-c128
    has 351 nonzeros in 303 pairs). The fused backward of mace-l2-c128's convolution went from
    2,400 to 1,441 floating-point PTX instructions per edge and chunk. Measured on an H100 (same
    process, time over the per-term sums): conv_bwd 0.67-0.91x and conv_dbwd 0.90-0.99x on four uvu
    configs in float32 and two in float64 (``benchmarks/results/nvidia-h100-80gb-hbm3/through-z/``).
    """

    def __init__(self, w: Writer, path: JointPath, dtype: str):
        self.w, self.dtype = w, dtype
        self.pairs: dict[tuple[int, int], list[tuple[int, float]]] = {}
        for i, j, k, v in path.nonzeros:
            self.pairs.setdefault((i, j), []).append((k, v))
        self.declared: set[str] = set()

    def _declare(self, name: str, values: dict) -> None:
        """``const T {name}_{key} = {value};`` for each entry of ``values``, the first time ``name`` is asked for."""
        if name not in self.declared:
            self.declared.add(name)
            for key, value in values.items():
                self.w(f"const T {name}_{key} = {value};")

    def _contracted(self, z: str) -> str:
        name = f"s_{z}"
        self._declare(name, {f"{i}_{j}": " + ".join(f"{literal(v, self.dtype)} * {z}_{k}" for k, v in ks)
                             for (i, j), ks in self.pairs.items()})
        return name

    def has(self, key: int, operand: str, z: str) -> bool:
        return self._name(key, operand, z) in self.declared

    @staticmethod
    def _name(key: int, operand: str, z: str) -> str:
        return f"{'qp'[key]}_{operand}_{z}"

    def sums(self, key: int, operand: str, z: str) -> dict[int, str]:
        """``{c: sum_d operand_d S_cd}`` (``key`` 0: c is i, d is j; 1: c is j, d is i)."""
        s, name = self._contracted(z), self._name(key, operand, z)
        by_c: dict[int, list[tuple[int, int]]] = {}
        for pair in sorted(self.pairs, key=lambda p: p[key]):
            by_c.setdefault(pair[key], []).append(pair)
        self._declare(name, {c: " + ".join(f"{operand}_{p[1 - key]} * {s}_{p[0]}_{p[1]}" for p in pairs)
                             for c, pairs in by_c.items()})
        return {c: f"{name}_{c}" for c in by_c}


def _path_sums(w: Writer, schedule: KernelSchedule, path: JointPath, role: str,
               through_z: _ThroughZ) -> dict[int, str]:
    """``{component: value}`` that ``path`` adds to output ``role`` (x, y or z) for this edge.

    A term is its weight times the sum of ``pw C a b`` over the CG nonzeros, ``a`` and ``b`` its
    two other operands. Terms that read the same input of ``a`` (the operand with fewer inputs:
    z̄ for x̄ and ȳ) are added before the CG sum: ``sum_t weight_t b_t`` is declared once per
    group (``m{role}{n}_c``), so a group costs one CG sum instead of one per term. x̄ and ȳ sum
    through z̄ (``through_z``); z sums its nonzeros directly.
    """
    joint = schedule.joint
    terms = [_term_names(joint, t) for t in _path_terms(joint, path, role)]
    shared, other = sorted((r for r in "xyz" if r != role), key=lambda r: len({t[r] for t in terms}))

    def weight(names):
        return f" * wt{names['w'][1:]}" if path.w_offset is not None else ""

    groups: dict[str, list[dict[str, str]]] = {}
    for names in terms:
        groups.setdefault(names[shared], []).append(names)
    used = sorted({nz["xyz".index(other)] for nz in path.nonzeros})
    sums: dict[int, list[str]] = {}
    for n, group in enumerate(groups.values()):
        factors, scale = dict(group[0]), weight(group[0])
        if len(group) > 1:
            factors[other], scale = f"m{role}{n}", ""
            for c in used:
                w(f"const T m{role}{n}_{c} = {' + '.join(f'{names[other]}_{c}{weight(names)}' for names in group)};")
        if role == "z":
            formats = tuple("" if r == role else factors[r] + "_{}" for r in "xyz")
            for c, products in cg_sums(path.nonzeros, "xyz".index(role), formats, schedule.dtype).items():
                sums.setdefault(c, []).append(f"({products}){scale}")
        else:
            key = "xy".index(role)
            for c, value in through_z.sums(key, factors["yx"[key]], factors["z"]).items():
                sums.setdefault(c, []).append(f"{value}{scale}")
    return {c: " + ".join(values) for c, values in sorted(sums.items())}


def _weight_gradient(schedule: KernelSchedule, path: JointPath, through_z: _ThroughZ) -> str:
    """The lane's w̄ of ``path`` for this edge: per term, ``pw C * x * y * z`` over the CG nonzeros,
    summed through z̄ with whichever of x̄'s and ȳ's sums the path already has."""
    joint = schedule.joint
    parts = []
    for term in _path_terms(joint, path, "w"):
        x, y, z = (_term_names(joint, term)[r] for r in "xyz")
        if through_z.has(1, x, z) and not through_z.has(0, y, z):
            parts += [f"{y}_{j} * {p}" for j, p in through_z.sums(1, x, z).items()]
        else:
            parts += [f"{x}_{i} * {q}" for i, q in through_z.sums(0, y, z).items()]
    return " + ".join(parts)


def _emit_joint_chunk(w: Writer, schedule: KernelSchedule, role: str, offset: int, dim: int, comps,
                      suffix: str = "") -> bool:
    """Registers ``{role}{suffix}_q`` (q in ``comps``) of this lane's channel in the block at
    ``offset`` of the input read through ``p_{role}{suffix}``, through the warp's staging buffer
    when rows are wider than one; True if staged (the caller syncs before the buffer's next use)."""
    staged = dim > 1 and role in dict(schedule.stage_sizes)
    width = stage_width(dim)
    pointer = f"p_{role}{suffix}"
    if staged:
        w(f"if (ok) cgtp_stage<{dim}, {width}>(stage_{role}, {pointer} + {offset} + c * {WARP * dim}LL, "
          f"nrows * {dim}, lane);")
        w("__syncwarp();")
    for q in comps:
        element = f"stage_{role}[lane * {width} + {q}]" if staged else f"{pointer}[{offset} + lc * {dim} + {q}]"
        w(f"const T {role}{suffix}_{q} = live ? {element} : T(0);")
    return staged


def _emit_joint_flush(w: Writer, schedule: KernelSchedule, role: str, offset: int, dim: int,
                      names=None, row: str | None = None, add: bool = False) -> None:
    """Write (BATCHED) or atomically add (INDEXED) this chunk's values (``names``, by default
    ``g{role}_q``) to the block at ``offset`` of row ``row`` (by default this edge's row, guarded
    by ``ok``); values added to an explicit ``row`` are reset to zero. ``add``: the block already
    holds an earlier group's part, which a write adds to."""
    k = dict(schedule.joint.outputs)[role]
    out = schedule.outputs[k]
    names = names or [f"g{role}_{q}" for q in range(dim)]
    reset = row is not None
    guard = "" if out.kind == BATCHED or reset else "ok && "
    row = row or ("e" if out.kind == BATCHED else f"ix_{role}")
    w.open("")
    w(f"T* const dst_{role} = out{k} + {row} * {out.dim}LL + {offset};")
    if dim == 1:
        w(f"if ({guard}active) {put(out, f'dst_{role} + lc', names[0], add)}")
    else:
        w.open("if (active)")
        for q, a in enumerate(names):
            w(f"obuf[lane * {dim} + {q}] = {a};")
        w.close()
        w("__syncwarp();")
        w("#pragma unroll")
        w.open(f"for (int r = 0; r < {dim}; ++r)")
        w("const int q = r * 32 + lane;")
        w(f"if ({guard}q < nrows * {dim}) {put(out, f'dst_{role} + c * {WARP * dim} + q', 'obuf[q]', add)}")
        w.close()
        w("__syncwarp();")
    if reset:
        w(" ".join(f"{a} = T(0);" for a in names))
    w.close()
