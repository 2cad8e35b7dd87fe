"""CUDA source of a weight-stream launch (:class:`~jax_cgtp.gpu.stream.WeightStream`).

Inside a tile (or a node's run) of edges, the warp walks the edges in order and, per edge, the
stream's items in order. Before computing item ``n`` it issues the asynchronous copy of the item
``stages - 1`` positions later (the next edge's first items near the end of an edge), then
waits for item ``n``'s own copy. The arithmetic of an item is in :func:`_emit_item`.
"""

from __future__ import annotations

from .cuda_text import Writer, cg_sums, edge_ok, emit_edge_header, emit_transposed_sum, lane_row, put, tile_value
from ..core.operands import BATCHED
from .schedule import KernelSchedule
from .stream import WARP, StreamItem, stage_width


def emit_stream(w: Writer, schedule: KernelSchedule) -> None:
    """The tile's edges, each edge's weights streamed item by item through the ring."""
    stream = schedule.stream
    problem = schedule.call.problem
    outs = dict(stream.outputs)
    items, stages = stream.items, stream.stages
    row_role = stream.row_role
    row_out = schedule.outputs[outs[row_role]] if row_role else None
    w()
    w(f"// ---- weight stream: {', '.join(f'out{k} ({r})' for r, k in stream.outputs)}; {len(items)} items of "
      f"weights per edge, each copied {stages - 1} items ahead into a ring of {stages} slots")
    w("int ring_use = 0;  // the ring slot of the item computed next")
    if row_role:
        w(f"for (int q = lane; q < {row_out.dim}; q += 32) stage_row[q] = T(0);")
        if row_out.flush == "atomic":
            w(f"long long cur = -1;  // the {row_role} row that stage_row sums edges for")
    w("__syncwarp();")
    _emit_rows_issue(w, schedule, "0")
    for k in range(stages - 1):
        _emit_issue(w, schedule, str(k // len(items)), items[k % len(items)], str(k))
    w("#pragma unroll 1")
    w.open("for (int t = 0; t < count; ++t)")
    emit_edge_header(w, schedule)
    if row_out is not None and row_out.flush == "atomic":
        w.open(f"if (ok && cur >= 0 && ix_{row_role} != cur)")
        _emit_row_flush(w, schedule, "cur")
        w.close()
        w(f"if (ok) cur = ix_{row_role};")
    # the edge's rows came with the group of an item copied before; then the next edge's rows
    # join the group of this edge's first item copy
    w(f"cgtp_wait<{min(len(items) - 1, stages - 2)}>();")
    w("__syncwarp();")
    for role in stream.row_inputs:
        w(f"const T* const row_{role} = stage_{role} + (t & 1) * {problem.operand_dim(role)};  // this edge's {role} row")
    _emit_rows_issue(w, schedule, "t + 1")
    y_dim = problem.operand_dim("y")
    if "y" in outs:
        w(f"T {', '.join(f'gy_{j} = T(0)' for j in range(y_dim))};")
    for n, item in enumerate(items):
        ahead, m = divmod(n + stages - 1, len(items))
        _emit_issue(w, schedule, f"t + {ahead}", items[m], f"ring_use == 0 ? {stages - 1} : ring_use - 1")
        w(f"cgtp_wait<{stages - 1}>();")
        w("__syncwarp();")
        _emit_item(w, schedule, item)
        w("__syncwarp();")
        w(f"ring_use = ring_use == {stages - 1} ? 0 : ring_use + 1;")
    if row_out is not None and row_out.kind == BATCHED:
        _emit_row_flush(w, schedule, "e")
    if "y" in outs:
        k = outs["y"]
        emit_transposed_sum(w, [f"gy_{j}" for j in range(y_dim)], f"out{k}[e * {y_dim}LL + ", "]", "=")
    w.close()
    if row_out is not None and row_out.flush == "atomic":
        w.open("if (cur >= 0)")
        _emit_row_flush(w, schedule, "cur")
        w.close()
    elif row_out is not None and row_out.flush == "own":
        w.open("if (owned)")
        _emit_row_flush(w, schedule, "own_row")
        w.close()


def _emit_rows_issue(w: Writer, schedule: KernelSchedule, edge: str) -> None:
    """Copy the x, y and z̄ rows of the tile's edge ``edge`` (nothing past the tile) into the halves
    ``edge & 1`` of their double buffers, zeros for an edge out of range; the copies join the
    group of the next commit."""
    stream = schedule.stream
    problem = schedule.call.problem
    arrays = dict(stream.arrays)
    w.open("")
    w("const int lane = cgtp_lane();")
    w(f"const int ta = {edge};")
    w.open("if (ta < count)")
    w(f"const bool ok_a = {edge_ok('ta')};")
    names: dict[str, str] = {}  # lane register -> the register holding its value for edge ta
    for role in stream.row_inputs:
        if lane_row(schedule, role) not in names:
            names[lane_row(schedule, role)] = f"row_{role}_a"
            w(f"const long long row_{role}_a = {tile_value(schedule, lane_row(schedule, role), 'ta')};")
    for role in stream.row_inputs:
        dim = problem.operand_dim(role)
        row = names[lane_row(schedule, role)]
        w(f"T* const to_{role} = stage_{role} + (ta & 1) * {dim};")
        w(f"if (ok_a) cgtp_copy_async<{dim}, {dim}, {dim}>(to_{role}, in{arrays[role]} + {row} * {dim}LL, lane);")
        w(f"else for (int q = lane; q < {dim}; q += 32) to_{role}[q] = T(0);")
    w.close()
    w.close()


def _emit_issue(w: Writer, schedule: KernelSchedule, edge: str, item: StreamItem, slot: str) -> None:
    """Copy ``item`` of the tile's edge ``edge`` (nothing past the tile) into ring slot ``slot``,
    zeros for an edge out of range (its weights, NaN or Inf in a padded batch, are never read); one
    commit either way, so that every lane counts the same groups."""
    stream = schedule.stream
    p = item.path
    w_dim = schedule.call.problem.operand_dim("w")
    shape = f"{item.size}, {p.z_mul}, {stage_width(p.z_mul)}"
    w.open("")
    w("const int lane = cgtp_lane();  // read here, so that the copy's addresses are not held across edges")
    w(f"const int ta = {edge};")
    w.open("if (ta < count)")
    w(f"const long long ea = {tile_value(schedule, 'my_edge', 'ta')};")
    w(f"T* const slot_a = stage_ring + ({slot}) * {stream.slot};  // path {p.ins_index}, rows [{item.first}, "
      f"{item.first + item.rows})")
    w(f"if ({edge_ok('ta')}) cgtp_copy_async<{shape}>(slot_a, in{dict(stream.arrays)['w']} + ea * {w_dim}LL + "
      f"{p.w_offset + item.first * p.z_mul}, lane);")
    w(f"else cgtp_zero_rows<{shape}>(slot_a, lane);")
    w.close()
    w("cgtp_commit();")
    w.close()


def _emit_row_flush(w: Writer, schedule: KernelSchedule, row: str) -> None:
    """Write (or add) the shared-memory output row to row ``row`` and zero it."""
    stream = schedule.stream
    k = dict(stream.outputs)[stream.row_role]
    out = schedule.outputs[k]
    w.open(f"for (int q = lane; q < {out.dim}; q += 32)")
    w(put(out, f"out{k} + {row} * {out.dim}LL + q", "stage_row[q]"))
    w("stage_row[q] = T(0);")
    w.close()
    w("__syncwarp();")


def _emit_item(w: Writer, schedule: KernelSchedule, item: StreamItem) -> None:
    """One item: lanes over the item's rows ``u`` compute ``t[u, :]`` (forward, w̄) and
    ``h[u, :]`` (x̄, ȳ); lanes over ``w`` sum ``W[u, w] t[u, k]`` into the z row; lanes over the
    block's elements write w̄."""
    stream = schedule.stream
    problem = schedule.call.problem
    outs, arrays = dict(stream.outputs), dict(stream.arrays)
    dtype = schedule.dtype
    p = item.path
    ins = problem.instructions[p.ins_index]
    names = (problem.irreps_in1[ins.i_in1], problem.irreps_in2[ins.i_in2], problem.irreps_out[ins.i_out])
    w(f"// path {p.ins_index}: {names[0]} (x) {names[1]} -> {names[2]}, mode uvw, rows u in "
      f"[{item.first}, {item.first + item.rows}), {len(p.nonzeros)} CG nonzeros")
    w.open("")
    w("const int lane = cgtp_lane();  // read here, so that the item's addresses are not held across edges")
    stride = stage_width(p.z_mul)
    w(f"const T* const wb = stage_ring + ring_use * {stream.slot};  // W[u, w] at (u - {item.first}) * {stride} + w")
    w(f"const bool live = lane < {item.rows};")
    w(f"const int u = {item.first} + lane;")
    forward = "z" in outs
    needs_t = forward or "w" in outs
    used = [sorted({nz[n] for nz in p.nonzeros}) for n in range(3)]
    if "x" in arrays and (needs_t or "y" in outs):
        for i in used[0]:
            w(f"const T x_{i} = live ? row_x[{p.x_offset} + u * {p.x_dim} + {i}] : T(0);")
    if "y" in arrays:
        for j in used[1]:
            w(f"const T y_{j} = row_y[{p.y_offset + j}];")
    if needs_t:
        t = cg_sums(p.nonzeros, 2, ("x_{}", "y_{}", ""), dtype)
        for k in range(p.z_dim):
            w(f"stage_t[lane * {p.z_dim} + {k}] = {t.get(k, 'T(0)')};")
        w("__syncwarp();")
    if forward:
        for c in range(-(-p.z_mul // WARP)):
            w.open("")
            w(f"const int wl = {c * WARP} + lane;")
            w.open(f"if (wl < {p.z_mul})")
            w(f"T {', '.join(f'a_{k} = T(0)' for k in range(p.z_dim))};")
            w("#pragma unroll 4")
            w.open(f"for (int r = 0; r < {item.rows}; ++r)")
            w(f"const T wv = wb[r * {stride} + wl];")
            for k in range(p.z_dim):
                w(f"a_{k} += wv * stage_t[r * {p.z_dim} + {k}];")
            w.close()
            for k in range(p.z_dim):
                w(f"stage_row[{p.z_offset} + wl * {p.z_dim} + {k}] += a_{k};")
            w.close()
            w.close()
    if "x" in outs or "y" in outs:
        w(f"T {', '.join(f'h_{k} = T(0)' for k in used[2])};")
        w.open("if (live)")
        w("#pragma unroll 4")
        w.open(f"for (int v = 0; v < {p.z_mul}; ++v)")
        w(f"const T wv = wb[lane * {stride} + v];")
        for k in used[2]:
            w(f"h_{k} += wv * row_z[{p.z_offset} + v * {p.z_dim} + {k}];")
        w.close()
        w.close()
        if "x" in outs:
            for i, value in cg_sums(p.nonzeros, 0, ("", "y_{}", "h_{}"), dtype).items():
                w(f"if (live) stage_row[{p.x_offset} + u * {p.x_dim} + {i}] += {value};")
        if "y" in outs:
            for j, value in cg_sums(p.nonzeros, 1, ("x_{}", "", "h_{}"), dtype).items():
                w(f"gy_{p.y_offset + j} += {value};")
    if "w" in outs:
        k = outs["w"]
        out = schedule.outputs[k]
        w.open(f"for (int q = lane; q < {item.size}; q += 32)")
        w(f"const int r = q / {p.z_mul};")
        w(f"const int v = q - r * {p.z_mul};")
        terms = " + ".join(f"stage_t[r * {p.z_dim} + {c}] * row_z[{p.z_offset} + v * {p.z_dim} + {c}]"
                           for c in range(p.z_dim))
        w(f"out{k}[e * {out.dim}LL + {p.w_offset + item.first * p.z_mul} + q] = {terms};")
        w.close()
    w.close()
