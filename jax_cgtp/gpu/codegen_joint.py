"""CUDA source of a joint pass (:class:`~jax_cgtp.gpu.schedule.JointPass`): the ``uvu`` paths over
one-channel y blocks of an edge, block by block and chunk by chunk, with every output of the launch
computed from the same loads.

A product's pass runs edge by edge, or walks the tile's edges inside each group of paths (long CG
code). A convolution's pass walks the edges by destination: the forward holds the z chunks of a
block across the edges of one node, the backward stages the node's z̄ chunks and contracts each
path's CG coefficients with them once, ``S_ij = sum_k pw C_ijk z̄_k``, before x̄, ȳ and w̄ sum
from it. :mod:`jax_cgtp.gpu.codegen` writes the kernel around it.
"""

from __future__ import annotations

from ..core.operands import BATCHED, INDEXED, SHARED
from .cuda_text import (Writer, edge_ok, emit_chunk_flush, emit_chunk_lanes, emit_edge_header, emit_transposed_sum,
                        lane_row, literal, owned_end, put, rounded, row_of, signed_sum, signed_term, tile_value)
from .schedule import WARP, JointPath, KernelSchedule, ahead_slot, stage_width



def _emit_group_barrier(w: Writer, schedule: KernelSchedule) -> None:
    """The block's warps meet before a group of paths when they walk their runs in step."""
    if schedule.lockstep:
        w("__syncthreads();  // the block's warps run each group's code together")


def emit_joint(w: Writer, schedule: KernelSchedule) -> None:
    """A joint pass (:class:`~jax_cgtp.gpu.schedule.JointPass`): each edge's paths, block by block."""
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
    for part, [(x_offset, mul, dim, paths)] in (p for block in joint.blocks for p in _parts(schedule, [block])):
        _open_part(w, schedule, part)
        _open_joint_chunks(w, schedule, [(x_offset, mul, dim, paths)])
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
        if part is not None:
            w.close()
    if "y" in outs:
        out = schedule.outputs[outs["y"]]
        lo, values = _y_sum_values(joint, range(len(joint.y_blocks)))
        emit_transposed_sum(w, values, f"out{outs['y']}[e * {out.dim}LL + {lo} + ", "]", "=")
    w.close()


def _parts(schedule: KernelSchedule, members) -> list:
    """The x blocks ``members`` (``(x offset, mul, dim, paths)``) as ``[(part, members)]``: one entry,
    part None, when the paths are not in parts (``path_groups``); else one per part that has some of
    their paths, with those paths (and without the blocks that have none)."""
    if not schedule.path_groups:
        return [(None, members)]
    order = [p.ins_index for *_, paths in schedule.joint.blocks for p in paths]
    owner = dict(zip(order, schedule.path_groups))
    parts = []
    for part in sorted({owner[p.ins_index] for p in _members_paths(members)}):
        mine = [(x_offset, mul, dim, tuple(p for p in paths if owner[p.ins_index] == part))
                for x_offset, mul, dim, paths in members]
        parts.append((part, [block for block in mine if block[3]]))
    return parts


def _open_part(w: Writer, schedule: KernelSchedule, part: int | None) -> None:
    """Open the section of the tile group's warps that run part ``part`` of the paths (None: all run all)."""
    if part is not None:
        chunks = schedule.chunk_warps
        w(f"// part {part} of the paths")
        w.open(f"if ({f'group / {chunks}' if chunks else 'group'} == {part})")


def _emit_joint_rows(w: Writer, schedule: KernelSchedule, roles=("x", "y", "w", "z")) -> None:
    """Pointers ``p_{role}{suffix}`` to this edge's row of each input of a joint pass (of ``roles``)."""
    joint = schedule.joint
    problem = schedule.call.problem
    for role, a in joint.arrays:
        if role in roles:
            w(f"const T* const p_{role}{joint.suffix(role, a)} = in{a} + {row_of(schedule, role)} * "
              f"{problem.operand_dim(role)}LL;  // {role} row")


def _open_joint_chunks(w: Writer, schedule: KernelSchedule, members) -> None:
    """Open the loop over the 32-channel chunks of the x blocks ``members`` (``(x offset, mul, dim,
    paths)``, all of one ``mul``; lanes over ``u``): every chunk, or with the tile group's
    ``chunk_warps`` the warp's (chunks g, g + chunk_warps, ..., g its place among the chunk warps:
    group = part * chunk_warps + g)."""
    for x_offset, mul, dim, paths in members:
        w(f"// x block at {x_offset}: {mul} channels of dimension {dim}, paths "
          f"[{', '.join(str(p.ins_index) for p in paths)}]")
    mul = members[0][1]
    w("#pragma unroll 1")
    chunk_warps = schedule.chunk_warps
    if not chunk_warps:
        first, step = "0", "++c"
    else:
        first, step = f"group % {chunk_warps}" if schedule.path_warps > 1 else "group", f"c += {chunk_warps}"
    w.open(f"for (int c = {first}; c < {-(-mul // WARP)}; {step})")
    emit_chunk_lanes(w, mul)


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
    w(f"const long long row = {tile_value(schedule, 'my_edge', 't')};")
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
        w(f"const long long row_{role} = ok_a ? {tile_value(schedule, lane_row(schedule, role), 'ta')} : 0;")
        rows[role] = f"row_{role}"
    return rows


def _weighted(schedule: KernelSchedule, paths) -> list[JointPath]:
    """The paths whose weight a joint pass reads (none when it does not read ``w``)."""
    return [p for p in paths if p.w_offset is not None] if schedule.joint.reads("w") else []


def _emit_edge_y(w: Writer, schedule: KernelSchedule):
    """Load the edge's y components that any path reads into registers once per edge (``ye{s}_c``),
    so that no path waits on a y load queued behind the previous path's stores; returns
    ``value(array, c)`` for :func:`_emit_joint_path`. With more than
    ``Settings.edge_y_registers``, each path loads its own: NVRTC merges plain loads
    of one component across x blocks, holding every component in registers for the whole edge.
    In float32 that measured best (None: plain loads); in float64 it took two registers per
    component (l5-c32's forward spilled 2 KB per thread), so the loads go through ``__ldca``,
    which NVRTC does not merge (0.74x the forward's time, H100)."""
    joint = schedule.joint
    used = sorted({p.y_offset + nz[1] for *_, paths in joint.blocks for p in paths for nz in p.nonzeros})
    if len(used) > schedule.call.settings.edge_y_registers:
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
    ``Settings.chunk_weight_registers`` registers; a path without weight costs none."""
    per_path = len(schedule.joint.reads("w")) * schedule.itemsize // 4
    batches, used = [[]], 0
    for path in paths:
        cost = per_path if path.w_offset is not None else 0
        if used + cost > schedule.call.settings.chunk_weight_registers and batches[-1]:
            batches.append([])
            used = 0
        batches[-1].append(path)
        used += cost
    return batches


def _open_edge_ahead(w: Writer, schedule: KernelSchedule, members,
                     edge: str) -> tuple[dict[tuple[int, int], str], dict[int, str]]:
    """Open a block for the tile's edge ``edge``, loaded ahead: ``ta`` and ``ok_a`` (the edge is in
    the tile and valid); returns the addresses of its chunk of each x block of ``members`` in each x
    input, by ``(block's position in members, input)``, and of its row in each w input (none without
    a weighted path), by input."""
    joint = schedule.joint
    problem = schedule.call.problem
    weighted = [p for *_, paths in members for p in _weighted(schedule, paths)]
    xs = joint.reads("x")
    w.open("")
    w(f"const int ta = {edge};")
    w(f"const bool ok_a = ta < count && {edge_ok('ta')};")
    rows = _ahead_rows(w, schedule, (["x"] if xs else []) + (["w"] if weighted else []))
    x_chunks = {(m, a): f"in{a} + {rows['x']} * {problem.operand_dim('x')}LL + {x_offset} + c * {WARP * dim}LL"
                for m, (x_offset, _, dim, _) in enumerate(members) for a in xs}
    w_rows = {a: f"in{a} + {rows['w']} * {problem.operand_dim('w')}LL" for a in joint.reads("w")} if weighted else {}
    return x_chunks, w_rows


def _member_tag(members, m: int) -> str:
    """What tells the registers of x block ``members[m]`` apart from the other members': nothing
    when the walk takes one block, else ``_m``."""
    return f"_{m}" if len(members) > 1 else ""


def _emit_fetch_ahead(w: Writer, schedule: KernelSchedule, members, edge: str, x_condition: str = "") -> None:
    """Load the operands of the tile's edge ``edge`` for this chunk of the x blocks ``members`` into
    registers (``ax{s}{tag}``: the chunk's coalesced elements of x input ``s`` in the block tagged
    ``tag``, :func:`_member_tag`; ``aw{s}_n``: path n's weight in w input ``s``), zero when the edge
    is past the tile or invalid (or ``x_condition`` is false), so that they are in flight while the
    current edge computes."""
    joint = schedule.joint
    x_chunks, w_rows = _open_edge_ahead(w, schedule, members, edge)
    condition = f"ok_a && ({x_condition})" if x_condition else "ok_a"
    for (m, a), chunk in x_chunks.items():
        dim = members[m][2]
        w(f"cgtp_fetch<{dim}>(ax{joint.suffix('x', a)}{_member_tag(members, m)}, {chunk}, nrows * {dim}, lane, "
          f"{condition});")
    _emit_weights_ahead(w, schedule, _members_paths(members), w_rows,
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


def _emit_ahead(w: Writer, schedule: KernelSchedule, members, x_condition: str = "") -> None:
    """Declare the look-ahead registers of a chunk of the x blocks ``members`` and load them for the
    tile's first edge."""
    joint = schedule.joint
    for m, (_, _, dim, _) in enumerate(members):
        for a in joint.reads("x"):
            w(f"T ax{joint.suffix('x', a)}{_member_tag(members, m)}[{dim}];")
    weighted = _weighted(schedule, _members_paths(members))
    for a in joint.reads("w") if weighted else ():
        s = joint.suffix("w", a)
        w(f"T {', '.join(f'aw{s}_{p.ins_index}' for p in weighted)};")
    w("// the next edge's x chunk and weights are loaded while the current edge computes")
    _emit_fetch_ahead(w, schedule, members, "0", x_condition)


def _take_ahead(w: Writer, schedule: KernelSchedule, members) -> dict[str, str]:
    """Copy the look-ahead registers (this edge's operands) before they are refilled; returns the
    current weight of each weighted path and w input, by ``(instruction index, input)``."""
    joint = schedule.joint
    for m, (_, _, dim, _) in enumerate(members):
        for a in joint.reads("x"):
            s = joint.suffix("x", a) + _member_tag(members, m)
            w(f"T cx{s}[{dim}] = {{{', '.join(f'ax{s}[{r}]' for r in range(dim))}}};")
    return _declare_weights(w, schedule, _members_paths(members), lambda s, p: f"aw{s}_{p.ins_index}")


def _emit_x_from_ahead(w: Writer, schedule: KernelSchedule, dim: int, tag: str = "") -> bool:
    """Registers ``x{s}_q`` of this lane's channel from the taken chunk ``cx{s}{tag}`` of each x
    input (transposed through the warp's staging rows when ``dim > 1``, one input after the other);
    True if staged (the caller syncs before the next use)."""
    joint = schedule.joint
    for n, a in enumerate(joint.reads("x")):
        s = joint.suffix("x", a)
        if dim == 1:
            w(f"const T x{s}_0 = cx{s}{tag}[0];")
            continue
        if n:
            w("__syncwarp();  // the previous input's elements are read")
        width = stage_width(dim)
        w(f"cgtp_unpack<{dim}, {width}>(stage_x, cx{s}{tag}, lane);")
        w("__syncwarp();")
        for q in range(dim):
            w(f"const T x{s}_{q} = live ? stage_x[lane * {width} + {q}] : T(0);")
    return dim > 1


def _members_paths(members) -> list[JointPath]:
    """The paths of the x blocks ``members``, block after block."""
    return [p for *_, paths in members for p in paths]


def _ring_layout(schedule: KernelSchedule, members):
    """Where a look-ahead slot for the x blocks ``members`` holds each block's 32 staged rows of each
    x input (by ``(block's position in members, input's suffix)``) and each weighted path's 32
    weights (by ``(instruction index, w input's suffix)``), and the slot's size."""
    joint = schedule.joint
    x_parts, offset = {}, 0
    for m, (_, _, dim, _) in enumerate(members):
        for a in joint.reads("x"):
            x_parts[m, joint.suffix("x", a)] = offset
            offset += WARP * stage_width(dim)
    w_parts = {}
    for a in joint.reads("w"):
        for p in _weighted(schedule, _members_paths(members)):
            w_parts[p.ins_index, joint.suffix("w", a)] = offset
            offset += WARP
    return x_parts, w_parts, ahead_slot(joint, members)


def _emit_ring_fetch(w: Writer, schedule: KernelSchedule, members, edge: str) -> None:
    """Copy the operands of the tile's edge ``edge`` for this chunk of the x blocks ``members`` into
    its look-ahead slot (nothing when the edge is past the tile or invalid), and commit them as one
    group: element by element, or ``KernelSchedule.ring_copy_width`` elements per lane and copy
    where every block allows it."""
    joint = schedule.joint
    x_parts, w_parts, size = _ring_layout(schedule, members)
    width = min(schedule.ring_copy_width(x_offset, mul, paths) for x_offset, mul, _, paths in members)
    paths = _members_paths(members)
    x_chunks, w_rows = _open_edge_ahead(w, schedule, members, edge)
    w(f"T* const slot_a = stage_ahead + (ta % {schedule.ahead + 1}) * {size};")
    w.open("if (ok_a)")
    for (m, a), chunk in x_chunks.items():
        dim = members[m][2]
        slot = f"slot_a + {x_parts[m, joint.suffix('x', a)]}"
        if width > 1:
            w(f"cgtp_copy_vectors<{WARP * dim}, {width}>({slot}, {chunk}, lane);")
        else:
            w(f"cgtp_stage_async<{dim}, {stage_width(dim)}>({slot}, {chunk}, nrows * {dim}, lane);")
    if width > 1:
        _emit_weight_vectors_ahead(w, schedule, paths, w_rows, w_parts, width)
    else:
        _emit_weights_ahead(w, schedule, paths, w_rows, lambda s, p: f"if (active) cgtp_copy_element(slot_a + "
                            f"{w_parts[p.ins_index, s]} + lane, pw{s}_a + {p.w_offset} + lc);")
    w.close()
    w("cgtp_commit();  // one group per edge, empty past the tile")
    w.close()


def _emit_weight_vectors_ahead(w: Writer, schedule: KernelSchedule, paths, w_rows: dict[int, str], w_parts,
                               width: int) -> None:
    """Copy this chunk's 32 weights of each weighted path into the slot, ``width`` elements per lane:
    ``WARP // width`` lanes per path, so each copy instruction serves ``width`` paths (lane group
    ``n`` takes the group's n-th path)."""
    lanes = WARP // width
    weighted = _weighted(schedule, paths)
    if w_rows:
        w("const int lane_a = cgtp_lane();  // read here, so that the copies' addresses are not held across edges")
        w(f"const int n_a = lane_a / {lanes}, piece_a = lane_a % {lanes} * {width};  // path of the group, elements")
    for a, row in w_rows.items():
        s = schedule.joint.suffix("w", a)
        w(f"const T* const pw{s}_a = {row};")
        for first in range(0, len(weighted), width):
            group = weighted[first:first + width]
            slot = w_parts[group[0].ins_index, s]
            assert all(w_parts[p.ins_index, s] == slot + n * WARP for n, p in enumerate(group))  # (_ring_layout)
            guard = f"if (n_a < {len(group)}) " if len(group) < width else ""
            w(f"{guard}cgtp_copy_vector<{width}>(slot_a + {slot} + n_a * {WARP} + piece_a, "
              f"pw{s}_a + {_lane_group_offset([p.w_offset for p in group])} + c * {WARP}LL + piece_a);")


def _lane_group_offset(offsets: list[int]) -> str:
    """The n-th of ``offsets`` for lane group ``n_a``: a product where they are evenly spaced, else
    a chain of selections."""
    steps = {b - a for a, b in zip(offsets, offsets[1:])}
    if len(steps) <= 1:
        step = steps.pop() if steps else 0
        return f"({offsets[0]} + n_a * {step})" if step else str(offsets[0])
    chain = str(offsets[-1])
    for n in range(len(offsets) - 2, -1, -1):
        chain = f"n_a == {n} ? {offsets[n]} : {chain}"
    return f"({chain})"


def _emit_ring_fill(w: Writer, schedule: KernelSchedule, members) -> None:
    """Start the look-ahead of the x blocks ``members``: the copies of the tile's first ``ahead`` edges."""
    w(f"// the x chunk and weights of the edge {schedule.ahead} ahead are copied into the ring while the current "
      "edge computes")
    w("__syncwarp();  // the ring's last readers are done")
    for d in range(schedule.ahead):
        _emit_ring_fetch(w, schedule, members, str(d))


def _take_ring(w: Writer, schedule: KernelSchedule, members) -> dict[tuple[int, int], str]:
    """Wait for edge ``t``'s slot, point ``slot`` at it and take its weights (returned by
    ``(instruction index, w input)``); its x values are read later (:func:`_emit_x_from_ring`)."""
    _, w_parts, size = _ring_layout(schedule, members)
    paths = _members_paths(members)
    w(f"cgtp_wait<{schedule.ahead - 1}>();  // edge t's copies have landed")
    w("__syncwarp();  // and every lane's are visible")
    w(f"const T* const slot = stage_ahead + (t % {schedule.ahead + 1}) * {size};")
    return _declare_weights(w, schedule, paths, lambda s, p: f"active ? slot[{w_parts[p.ins_index, s]} + lane] : T(0)")


def _emit_x_from_ring(w: Writer, schedule: KernelSchedule, members, m: int) -> None:
    """Registers ``x{s}_q`` of this lane's channel in x block ``members[m]`` from edge ``t``'s slot."""
    x_parts, _, _ = _ring_layout(schedule, members)
    dim = members[m][2]
    width = stage_width(dim)
    for (n, s), offset in x_parts.items():
        if n != m:
            continue
        for q in range(dim):
            w(f"const T x{s}_{q} = active ? slot[{offset} + lane * {width} + {q}] : T(0);")


def _emit_forward_walk(w: Writer, schedule: KernelSchedule) -> None:
    """The joint forward that walks the tile's edges: per x block (or group of its paths) and
    chunk, the tile's edges in order. A convolution accumulates every path's z chunk in registers
    over a run of one destination and adds it atomically when the destination changes (edges
    sorted by ``dst`` make one flush per node and tile), or, tiled deterministic, stores it to the
    node's row or a partial row of the tile (``cgtp_tile_row``); a product writes each path's z chunk per
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
    for part, members in (p for blocks in joint.walked_blocks for p in _parts(schedule, blocks)):
        dim = members[0][2]
        paths = _members_paths(members)
        _emit_group_barrier(w, schedule)
        _open_part(w, schedule, part)
        _open_joint_chunks(w, schedule, members)
        accumulators = _declare_z_chunks(w, paths) if held else [None] * len(paths)
        if tracked:
            w("long long cur = -1;")
        if schedule.ahead:
            _emit_ring_fill(w, schedule, members)
        else:
            _emit_ahead(w, schedule, members)
        w("#pragma unroll 1")
        w.open("for (int t = 0; t < count; ++t)")
        emit_edge_header(w, schedule)
        if schedule.ahead:
            weights = _take_ring(w, schedule, members)
            _emit_ring_fetch(w, schedule, members, f"t + {schedule.ahead}")
        else:
            weights = _take_ahead(w, schedule, members)
            _emit_fetch_ahead(w, schedule, members, "t + 1")
        if z_out.flush == "tile":  # every node with an edge in the tile gets its flush, even of zeros
            w("if (!cgtp_valid(ix_z, rows_z)) continue;")
        else:
            w("if (!ok) continue;")
        if tracked:
            w.open("if (cur >= 0 && ix_z != cur)")
            _emit_z_flush(w, schedule, paths, accumulators, "cur")
            w.close()
            w("cur = ix_z;")
        if z_out.flush == "tile":
            w("if (!ok) continue;")
        w("const bool live = active;")
        if not y_values:
            _emit_joint_rows(w, schedule, ("y",))
        if schedule.ahead:
            names = iter(accumulators)
            for m, (*_, group) in enumerate(members):
                if len(members) > 1:
                    w.open("")  # the block's x registers, in a scope of their own
                _emit_x_from_ring(w, schedule, members, m)
                for path in group:
                    _emit_joint_path(w, schedule, path, weights, z_acc=next(names), y_values=y_values)
                if len(members) > 1:
                    w.close()
            staged = False
        else:
            staged = _emit_x_from_ahead(w, schedule, dim)
            for path, names in zip(paths, accumulators):
                _emit_joint_path(w, schedule, path, weights, z_acc=names, y_values=y_values)
        if staged:
            w("__syncwarp();")
        w.close()
        if held:
            condition, row = owned_end(schedule, z_out)
            w.open(f"if ({condition})")
            _emit_z_flush(w, schedule, paths, accumulators, row)
            w.close()
        w.close()
        if part is not None:
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
    to by the later groups of its x block) when it changes. w̄ is written per edge (of shared
    weights: summed in registers over the warp's edges and added to its partial row per chunk),
    and each edge's ȳ summed over the warp into the tile's rows in shared memory, stored at the end. A z
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
    for n_group, members in enumerate(joint.walked_blocks):
        paths = _members_paths(members)
        tags = [_member_tag(members, m) for m in range(len(members))]
        first = sum(len(group) for group in joint.walked_blocks[:n_group])  # the group's first block
        # x̄ of an earlier block at the block's offset (a group of its paths): its flushes add
        added = [any(other[0] == x_offset for other in joint.blocks[:first + m])
                 for m, (x_offset, *_) in enumerate(members)]
        _emit_group_barrier(w, schedule)
        _open_joint_chunks(w, schedule, members)
        w("long long cur = -1, cur_x = -1;")
        for tag, (_, _, dim, _) in zip(tags, members):
            for s in xs:
                w(f"T {', '.join(f'xr{s}{tag}_{q} = T(0)' for q in range(dim))};")
        accumulators = _declare_z_chunks(w, paths) if z_out else []
        if "x" in outs:
            for tag, (_, _, dim, _) in zip(tags, members):
                w(f"T {', '.join(f'gx{tag}_{q} = T(0)' for q in range(dim))};")
        summed = _summed_weight_paths(schedule, paths)
        if summed:  # w̄ of shared weights: the lane's sums over the warp's edges
            w(f"T {', '.join(f'gw{p.ins_index} = T(0)' for p in summed)};")
        # the next edge's x chunk is needed only when its source differs from the one held then
        x_ahead = f"row_x != (ok ? {x_row} : cur_x)"
        _emit_ahead(w, schedule, members, "row_x != cur_x")
        w("#pragma unroll 1")
        w.open("for (int t = 0; t < count; ++t)")
        emit_edge_header(w, schedule)
        weights = _take_ahead(w, schedule, members)
        _emit_fetch_ahead(w, schedule, members, "t + 1", x_ahead)
        w.open("if (!ok)")
        if "w" in outs and not summed:
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
        if "x" in outs and x_out.flush not in ("own", "slice"):  # an owned run has one source node
            w.open("if (cur_x >= 0)")
            _emit_x_bar_flushes(w, schedule, members, added, "cur_x")
            w.close()
        w(f"cur_x = {x_row};")
        for tag, (_, _, dim, _) in zip(tags, members) if xs else ():
            w.open("")
            if _emit_x_from_ahead(w, schedule, dim, tag):
                w("__syncwarp();")
            w(" ".join(f"xr{s}{tag}_{q} = x{s}_{q};" for s in xs for q in range(dim)))
            w.close()
        w.close()
        reached = sorted({joint.y_blocks.index((p.y_offset, p.y_dim)) for p in paths}) if "y" in outs else []
        for n in reached:
            w(f"T {', '.join(f'gy{n}_{q} = T(0)' for q in range(joint.y_blocks[n][1]))};")
        z_sources = iter(zip(accumulators or [None] * len(paths), staged_z))
        for tag, (_, _, dim, group) in zip(tags, members):
            if tag:
                w.open("")  # the block's x registers and x̄ sums, by the names the paths use
                if "x" in outs:
                    w(" ".join(f"T& gx_{q} = gx{tag}_{q};" for q in range(dim)))
            for s in xs:
                w(" ".join(f"const T x{s}_{q} = xr{s}{tag}_{q};" for q in range(dim)))
            for path in group:
                z_acc, z_values = next(z_sources)
                _emit_joint_path(w, schedule, path, weights, z_acc=z_acc, z_values=z_values, y_values=y_values)
            if tag:
                w.close()
        if reached:
            lo, values = _y_sum_values(joint, reached)
            emit_transposed_sum(w, values, f"ysum[t * {y_dim} + {lo} + ", "]", "+=")
        if "x" in outs and x_out.flush == "slice":  # the edge's own row of the slice
            _emit_x_bar_flushes(w, schedule, members, added, "(first + t)")
        w.close()
        if "x" in outs and x_out.flush != "slice":
            condition, row = owned_end(schedule, x_out, "cur_x")
            w.open(f"if ({condition})")
            _emit_x_bar_flushes(w, schedule, members, added, row)
            w.close()
        if z_out is not None:
            condition, row = owned_end(schedule, z_out)
            w.open(f"if ({condition})")
            _emit_z_flush(w, schedule, paths, accumulators, row)
            w.close()
        if summed:  # added to the warp's partial row, which no other warp writes
            k = outs["w"]
            for p in summed:
                w(f"if (active) out{k}[warp * {schedule.outputs[k].dim}LL + {p.w_offset} + lc] += gw{p.ins_index};")
        w.close()
    if "y" in outs:
        out = schedule.outputs[outs["y"]]
        w("__syncwarp();")
        if schedule.permuted:  # the tile's edges are rows of a sorted permutation
            w.open("for (int t = 0; t < count; ++t)")
            w(f"const long long e = {tile_value(schedule, 'my_edge', 't')};")
            w(f"for (int q = lane; q < {y_dim}; q += 32) out{outs['y']}[e * {out.dim}LL + q] = ysum[t * {y_dim} + q];")
            w.close()
        else:  # a tile's edges are consecutive rows
            w(f"for (int q = lane; q < count * {y_dim}; q += 32) out{outs['y']}[first * {out.dim}LL + q] = ysum[q];")
        w("__syncwarp();")


def _emit_x_bar_flushes(w: Writer, schedule: KernelSchedule, members, added, row: str) -> None:
    """Flush each x block's x̄ chunk of ``members`` (``gx{tag}_q``) to row ``row``; ``added[m]``: block
    m holds an earlier group's part, which the flush adds to."""
    for m, (x_offset, _, dim, _) in enumerate(members):
        names = [f"gx{_member_tag(members, m)}_{q}" for q in range(dim)]
        _emit_joint_flush(w, schedule, "x", x_offset, dim, names, row=row, add=added[m])


def _summed_weight_paths(schedule: KernelSchedule, paths) -> list[JointPath]:
    """The weighted ``paths`` whose w̄ the walk sums over its edges: all of them when w̄ is SHARED
    (one row for every edge), none when it is written per edge."""
    outs = dict(schedule.joint.outputs)
    if "w" not in outs or schedule.outputs[outs["w"]].kind != SHARED:
        return []
    return [p for p in paths if p.w_offset is not None]


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
    cg = _PathCG(w, path, schedule.dtype)
    if "z" in outs:
        accumulators = z_acc or [f"gz_{k}" for k in range(path.z_dim)]
        if z_acc is None:
            w(f"T {', '.join(f'{a} = T(0)' for a in accumulators)};")
        for k, value in _path_sums(w, schedule, path, "z", cg).items():
            w(f"{accumulators[k]} += {value};")
        if z_acc is None:
            _emit_joint_flush(w, schedule, "z", path.z_offset, path.z_dim)
    if "x" in outs:
        for i, value in _path_sums(w, schedule, path, "x", cg).items():
            w(f"gx_{i} += {value};")
    if "y" in outs:
        n = joint.y_blocks.index((path.y_offset, path.y_dim))
        for j, value in _path_sums(w, schedule, path, "y", cg).items():
            w(f"gy{n}_{j} += {value};")
    if "w" in outs and path.w_offset is not None:
        out = schedule.outputs[outs["w"]]
        gradient = _weight_gradient(schedule, path, cg)
        if out.kind == SHARED:  # summed over the warp's edges (_summed_weight_paths)
            w(f"if (active) gw{path.ins_index} += {gradient};")
        else:
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


class _PathCG:
    """One path's CG sums for the current edge and chunk: z's, and x̄'s, ȳ's and w̄'s through a z̄
    operand ``Z``.

    z's run over the nonzeros (:meth:`z_sums`), in units of the magnitude ``v`` most of them share
    (:func:`_forward_magnitude`): a term of that magnitude is ``± X_i Y_j``, one FMA, and the
    path's weight becomes ``v * w``.

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

    A path's S repeat up to sign (``S_02 = -S_11``), and single-nonzero S mostly share one magnitude
    ``u`` (:func:`_common_magnitude`): ``S_ij = sign * S_canonical``, declared once, and the sums run
    in units of ``u``, where ``S = ±Z_k`` takes no multiplication. The weight of x̄'s and ȳ's sums
    becomes ``u * w`` (:meth:`weight`, once per path and edge) and w̄'s sum is scaled by ``u``
    (:meth:`scaled`).
    """

    def __init__(self, w: Writer, path: JointPath, dtype: str):
        self.w, self.dtype = w, dtype
        self.pairs: dict[tuple[int, int], list[tuple[int, float]]] = {}
        for i, j, k, v in path.nonzeros:
            self.pairs.setdefault((i, j), []).append((k, v))
        weighted = path.w_offset is not None
        self.nonzeros = path.nonzeros
        self.unit = _common_magnitude(self.pairs) if weighted else 1.0
        self.z_unit = _forward_magnitude(path.nonzeros) if weighted else 1.0
        # pair -> (sign, the pair whose S it reuses, or the k of S = ±Z_k)
        self.factor: dict[tuple[int, int], tuple[str, tuple[int, int] | int]] = {}
        # the pairs whose S is declared -> its (k, coefficient in units of self.unit)
        self.declared_sums: dict[tuple[int, int], list[tuple[int, float]]] = {}
        first: dict[tuple, tuple[int, int]] = {}
        for pair, ks in self.pairs.items():
            negative = ks[0][1] < 0
            sign = "-" if negative else "+"
            scaled = [(k, (-v if negative else v) / self.unit) for k, v in ks]
            form = tuple((k, rounded(c)) for k, c in scaled)
            if len(form) == 1 and form[0][1] == 1.0:
                self.factor[pair] = (sign, form[0][0])
                continue
            source = first.setdefault(form, pair)
            self.factor[pair] = (sign, source)
            if source == pair:
                self.declared_sums[pair] = scaled
        self.declared: set[str] = set()

    def _declare(self, name: str, values: dict) -> None:
        """``const T {name}_{key} = {value};`` for each entry of ``values``, the first time ``name`` is asked for."""
        if name not in self.declared:
            self.declared.add(name)
            for key, value in values.items():
                self.w(f"const T {name}_{key} = {value};")

    def _contracted(self, z: str) -> str:
        name = f"s_{z}"
        self._declare(name, {f"{i}_{j}": signed_sum(signed_term(c, f"{z}_{k}", self.dtype) for k, c in scaled)
                             for (i, j), scaled in self.declared_sums.items()})
        return name

    def has(self, key: int, operand: str, z: str) -> bool:
        return self._name(key, operand, z) in self.declared

    def width(self, key: int) -> int:
        """How many sums :meth:`sums` returns for ``key``: the distinct i (0) or j (1) of the pairs."""
        return len({pair[key] for pair in self.pairs})

    @staticmethod
    def _name(key: int, operand: str, z: str) -> str:
        return f"{'qp'[key]}_{operand}_{z}"

    def sums(self, key: int, operand: str, z: str) -> dict[int, str]:
        """``{c: sum_d operand_d S_cd}`` in units of ``self.unit`` (``key`` 0: c is i, d is j; 1: c
        is j, d is i)."""
        s, name = self._contracted(z), self._name(key, operand, z)
        by_c: dict[int, list[tuple[int, int]]] = {}
        for pair in sorted(self.pairs, key=lambda p: p[key]):
            by_c.setdefault(pair[key], []).append(pair)

        def term(pair):
            sign, source = self.factor[pair]
            factor = f"{z}_{source}" if isinstance(source, int) else f"{s}_{source[0]}_{source[1]}"
            return sign, f"{operand}_{pair[1 - key]} * {factor}"

        self._declare(name, {c: signed_sum(map(term, pairs)) for c, pairs in by_c.items()})
        return {c: f"{name}_{c}" for c in by_c}

    def z_sums(self, x: str, y: str) -> dict[int, str]:
        """``{k: sum_ij pw C_ijk x_i y_j}`` in units of ``self.z_unit``."""
        terms: dict[int, list[tuple[str, str]]] = {}
        for i, j, k, v in self.nonzeros:
            terms.setdefault(k, []).append(signed_term(v / self.z_unit, f"{x}_{i} * {y}_{j}", self.dtype))
        return {k: signed_sum(t) for k, t in sorted(terms.items())}

    def weight(self, wt: str, role: str) -> str:
        """The weight register ``wt`` times the unit of output ``role``'s sums (declared once):
        ``self.z_unit`` for z, ``self.unit`` for x̄ and ȳ."""
        unit = self.z_unit if role == "z" else self.unit
        if unit == 1.0:
            return wt
        name = f"{wt}u" if unit == self.unit else f"{wt}v"
        if name not in self.declared:
            self.declared.add(name)
            self.w(f"const T {name} = {literal(unit, self.dtype)} * {wt};")
        return name

    def scaled(self, value: str) -> str:
        """``value``, a sum in units of ``self.unit``, in plain units."""
        return value if self.unit == 1.0 else f"{literal(self.unit, self.dtype)} * ({value})"


def _common_magnitude(pairs) -> float:
    """The magnitude ``u`` of the most single-nonzero pairs, when dividing their sums by it saves
    more multiplications than the two it adds (``u * w`` and ``u * w̄``); else 1. Declaring each
    S_ij once up to sign, in this unit, took 0.5-2% fewer SASS instructions and the conv_bwd 0.97-1.00x
    the time (cg-folding); the forward's sums in the unit of :func:`_forward_magnitude`, the conv_fwd
    0.97-1.00x (fwd-folding)."""
    return _shared_magnitude([ks[0][1] for ks in pairs.values() if len(ks) == 1], added=2)


def _forward_magnitude(nonzeros) -> float:
    """The magnitude ``v`` of the most nonzeros, when dividing the path's z sums by it saves more
    multiplications than the one it adds (``v * w``); else 1."""
    return _shared_magnitude([nz[3] for nz in nonzeros], added=1)


def _shared_magnitude(coefficients, added: int) -> float:
    """The magnitude most of ``coefficients`` have, if more of them have it than have magnitude 1
    plus ``added`` (the multiplications that scaling by it adds); else 1."""
    counts: dict[float, int] = {}
    exact: dict[float, float] = {}  # a coefficient of each rounded magnitude
    for c in coefficients:
        magnitude = rounded(abs(c))
        counts[magnitude] = counts.get(magnitude, 0) + 1
        exact.setdefault(magnitude, abs(c))
    if not counts:
        return 1.0
    unit = max(counts, key=lambda u: (counts[u], u == 1.0))
    return exact[unit] if counts[unit] - counts.get(1.0, 0) > added else 1.0


def _path_sums(w: Writer, schedule: KernelSchedule, path: JointPath, role: str,
               cg: _PathCG) -> dict[int, str]:
    """``{component: value}`` that ``path`` adds to output ``role`` (x, y or z) for this edge.

    A term is its weight times the sum of ``pw C a b`` over the CG nonzeros, ``a`` and ``b`` its
    two other operands. Terms that read the same input of ``a`` (the operand with fewer inputs:
    z̄ for x̄ and ȳ) are added before the CG sum: ``sum_t weight_t b_t`` is declared once per
    group (``m{role}{n}_c``), so a group costs one CG sum instead of one per term. x̄ and ȳ sum
    through z̄, and z over the nonzeros in units of their common magnitude (``cg``).
    """
    joint = schedule.joint
    terms = [_term_names(joint, t) for t in _path_terms(joint, path, role)]
    shared, other = sorted((r for r in "xyz" if r != role), key=lambda r: len({t[r] for t in terms}))

    def weight(names):
        if path.w_offset is None:
            return ""
        wt = f"wt{names['w'][1:]}"
        return f" * {cg.weight(wt, role)}"

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
            for c, products in cg.z_sums(factors["x"], factors["y"]).items():
                sums.setdefault(c, []).append(f"({products}){scale}")
        else:
            key = "xy".index(role)
            for c, value in cg.sums(key, factors["yx"[key]], factors["z"]).items():
                sums.setdefault(c, []).append(f"{value}{scale}")
    return {c: " + ".join(values) for c, values in sorted(sums.items())}


def _weight_gradient(schedule: KernelSchedule, path: JointPath, cg: _PathCG) -> str:
    """The lane's w̄ of ``path`` for this edge: per term, ``pw C * x * y * z`` over the CG nonzeros,
    summed through z̄ as ``sum_i x_i q_i`` (x̄'s sums) or ``sum_j y_j p_j`` (ȳ's): of those the path
    already has, the one of fewer sums (a ``1o x 0e -> 1o`` path: ``y_0 p_0``, not ``sum_i x_i q_i``)."""
    joint = schedule.joint
    parts = []
    for term in _path_terms(joint, path, "w"):
        x, y, z = (_term_names(joint, term)[r] for r in "xyz")
        have = [key for key, operand in ((0, y), (1, x)) if cg.has(key, operand, z)]
        if min(have or (0, 1), key=cg.width) == 1:
            parts += [f"{y}_{j} * {p}" for j, p in cg.sums(1, x, z).items()]
        else:
            parts += [f"{x}_{i} * {q}" for i, q in cg.sums(0, y, z).items()]
    return cg.scaled(" + ".join(parts))


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
    if out.flush == "tile":
        w(f"T* const dst_{role} = cgtp_tile_row(out{k}, tile_rows, off_{role}, {row}, tile, first, count, "
          f"{out.dim}) + {offset};")
    else:
        w(f"T* const dst_{role} = out{k} + {row} * {out.dim}LL + {offset};")
    if dim == 1:
        w(f"if ({guard}active) {put(out, f'dst_{role} + lc', names[0], add)}")
    elif out.lane_writes:
        w("// lane by lane, strided: a row written once per node")
        w.open(f"if ({guard}active)")
        for q, a in enumerate(names):
            w(put(out, f"dst_{role} + lc * {dim} + {q}", a, add))
        w.close()
    else:
        emit_chunk_flush(w, names, guard, lambda v: put(out, f"dst_{role} + c * {WARP * dim} + q", v, add))
    if reset:
        w(" ".join(f"{a} = T(0);" for a in names))
    w.close()
