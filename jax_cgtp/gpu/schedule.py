"""The schedule of a call's CUDA kernels: pure static analysis, no GPU needed.

The schedule decides, for one :class:`~jax_cgtp.core.call.Call`:

* **kernels**: the outputs are split into launches. One launch computes every output whose rows
  it can write without conflicts: all of them when scatter-sums use atomics; with a
  deterministic call, one launch per INDEXED output role, edges visited in that role's sorted
  order and each node's run reduced by one warp, which writes the node's row once.
* **tiles**: each warp takes a tile of edges at a time (``TILE`` consecutive edges, or one node's
  run of sorted edges) and, inside the tile, the edges one after the other.
* **groups**: a launch with fewer tiles than the GPU holds warps spreads each tile's slots (and a
  slot's 32-channel chunks) over several warps, one group of slots each (:func:`slot_groups`).
* **slots**: each output is produced block by block (an irreps block of x, y or z, or a path's
  weights). A slot's accumulators stay in registers while the warp walks the tile's edges; they
  are flushed when the output row changes (every edge for a BATCHED output, when the index
  changes for an INDEXED one, at the end of the tile for a SHARED one).
* **lanes**: in a slot the 32 lanes of a warp split one multiplicity letter, 32 channels at a time
  (*output-lane* mode, no reduction), or, when the output block is narrow (e.g. ``ȳ`` for
  ``1x2e`` spherical harmonics), a contracted letter, followed by a warp reduction (*reduce* mode).
* **staging**: a per-edge operand block read lane-strided (``x[u, i]`` with lanes over ``u``) is
  first copied, 32 rows at a time, into the warp's shared memory with coalesced loads.
* **joint passes** replace the slots of ``uvu`` products over spherical harmonics: every path of
  an x block per edge and chunk, each operand chunk loaded once (:class:`JointPass`).
* **weight streams** replace the slots of ``uvw`` products over spherical harmonics with
  per-edge weights: each edge's weights pass once through a ring of shared-memory slots, copied
  asynchronously ahead of their use (:mod:`jax_cgtp.gpu.stream`).

The result is plain data that :mod:`jax_cgtp.gpu.codegen` turns into CUDA source.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from ..core.call import Call, Term
from ..core.operands import BATCHED, INDEXED, OPERANDS, SHARED
from ..core.problem import Instruction, Problem, cg_nonzeros
from ..core.settings import Settings
from .stream import WALK_KINDS, WARP, WeightStream, stage_width, stream_buffers, weight_stream

WARPS_PER_BLOCK = 4
CG_INDEX = {"x": 0, "y": 1, "z": 2}


@dataclasses.dataclass(frozen=True)
class Factor:
    """One operand a contribution reads: ``array`` is the call input it comes from.

    Element ``(letters..., comp)`` lives at ``offset + sum(value * stride) + comp`` of the row.
    """

    role: str
    array: int
    letters: str
    muls: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    dim: int
    staged: bool


@dataclasses.dataclass(frozen=True)
class Contribution:
    """One instruction's share of a slot, for one term of the output.

    ``out_letters`` are the instruction's letters of the output block; ``lane_letter`` is the
    letter the 32 lanes split (an output letter in output-lane mode, a contracted one in reduce
    mode, None when the block has a single channel); ``loop_letters`` are the contracted letters
    walked by runtime loops.
    """

    ins_index: int
    ins: Instruction
    factors: tuple[Factor, ...]
    nonzeros: tuple[tuple[int, int, int, float], ...]  # (i, j, k, pw * C[i, j, k])
    out_letters: str
    lane_letter: str | None
    loop_letters: tuple[str, ...]
    letter_muls: tuple[tuple[str, int], ...]

    def mul(self, letter: str) -> int:
        return dict(self.letter_muls)[letter]


@dataclasses.dataclass(frozen=True)
class Slot:
    """One block of one output, ``mul`` channels of ``dim`` components at ``offset`` of the row.

    For a path's weights (role ``w``), the channels are the path's weight letters ``letters``
    (sizes ``muls``, C-order ``strides``); lanes split ``lane_letter``, the other letters of size
    above one (``outer_letters``) are walked by loops, and letters of size one are 0. For x, y, z blocks, channel ``c`` is at
    ``offset + c * dim``.
    """

    output: int  # position among the kernel's outputs
    role: str
    name: str
    offset: int
    mul: int
    dim: int
    mode: str  # "output" (lanes split the output's channels) or "reduce"
    letters: str = ""
    muls: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    lane_letter: str | None = None
    outer_letters: tuple[str, ...] = ()
    contributions: tuple[Contribution, ...] = ()

    @property
    def size(self) -> int:
        return self.mul * self.dim

    @property
    def lane_mul(self) -> int:
        """Channels the lanes split, 32 per chunk (output mode)."""
        return self.muls[self.letters.index(self.lane_letter)] if self.role == "w" else self.mul


@dataclasses.dataclass(frozen=True)
class KernelOutput:
    call_output: int  # index in call.outputs
    role: str
    kind: str
    dim: int
    # "store", "own", "red", "atomic" (see cuda/cgtp_device.cuh), "slice" (a slice row per edge) or
    # "tile" (stored to the node's row or a partial row of the tile, KernelSchedule.partial_tiles)
    flush: str
    zero_ranges: tuple[tuple[int, int], ...]  # BATCHED or owned: row ranges no slot writes

    @property
    def zeroed(self) -> bool:
        """Whether the launch adds into the output, which must then start from zero (rows shared
        between warps). Stored and owned outputs are written whole by the kernel."""
        return self.flush in ("atomic", "red")

    @property
    def lane_writes(self) -> bool:
        """Whether a joint pass writes each lane's chunk components straight to this output,
        strided, instead of through the warp's transposition buffer: the z rows owned by the
        deterministic forward by destination, written once per node (lane-writes: 0.88-1.01x the
        time; where writes are most of the bytes, the transposition is faster)."""
        return self.role == "z" and self.flush == "own"

    @property
    def buffered(self) -> bool:
        """Whether a joint pass's chunks of it pass through the warp's transposition buffer."""
        return not self.lane_writes


@dataclasses.dataclass(frozen=True)
class JointPath:
    """One ``uvu`` path of a joint backward; its ``y`` block has multiplicity one.

    Offsets are into the rows of x, y and z; ``w_offset`` is None for an unweighted path.
    """

    ins_index: int
    x_offset: int
    x_dim: int
    y_offset: int
    y_dim: int
    z_offset: int
    z_dim: int
    w_offset: int | None
    nonzeros: tuple[tuple[int, int, int, float], ...]  # (i, j, k, pw * C[i, j, k])


@dataclasses.dataclass(frozen=True)
class JointTerm:
    """One term of a joint pass's output ``role``: ``factors`` are the ``(role, call input)`` of its
    three operands; a ``weighted_only`` term skips the unweighted paths."""

    role: str
    factors: tuple[tuple[str, int], ...]
    weighted_only: bool = False


@dataclasses.dataclass(frozen=True)
class JointPass:
    """A launch of ``uvu`` paths over one-channel ``y`` blocks, done path by path in one pass.

    Per edge, per x block and 32-channel chunk (lanes over ``u``), every path of the block
    loads its operand chunks once. The forward (output ``z``, one path per z block) writes the
    path's z chunk at once. The fused backward adds to x̄ (lanes), ȳ (per-lane partials, summed
    over the warp) and w̄ (lanes, written at once).

    ``walk``: inside each chunk the pass walks the tile's edges in order, with the tile's y rows
    staged once per tile and each edge's x chunk and weights loaded while the previous edge
    computes. A product walks when its code is long (a group's code then serves every edge of the
    tile): x̄ and z are written per edge, x̄ added to by the later groups of its x block.
    ``by_destination`` (a convolution, ``z`` or ``z̄`` indexed by ``dst``; it always walks) keeps
    every path's z chunk while the destination stays the same: the forward accumulates the chunk
    in registers and adds it when the destination changes; the backward stages the block's
    ``z̄[dst]`` chunks in shared memory once per run, keeps the x chunk and accumulates x̄ while
    the source stays the same, and sums each edge's ȳ over the chunks in shared memory. Edges
    sorted by ``dst`` make one z run per node and tile; a launch over sorted runs walks one
    node's edges (by ``dst`` for z, by ``src`` for x̄), whose row only its warp writes, once.

    An output may be a sum of terms over several inputs of a role (the force loss's second
    derivative: z from ``T(ẋ, y, w) + T(x, ẏ, w) + T(x, y, ẇ)``, next to x̄ and w̄ in a walk by
    destination); each input's chunk is loaded once per edge and shared by the terms that read
    it.

    ``outputs`` map roles to kernel outputs, ``arrays`` are the ``(role, call input)`` pairs the
    terms read; ``blocks`` are ``(x offset, mul, dim, paths)`` (an x block may appear several
    times, with a group of its paths each); ``y_blocks`` the ``(offset, dim)`` of the y blocks ȳ
    covers.
    """

    outputs: tuple[tuple[str, int], ...]
    arrays: tuple[tuple[str, int], ...]
    blocks: tuple[tuple[int, int, int, tuple[JointPath, ...]], ...]
    y_blocks: tuple[tuple[int, int], ...]
    terms: tuple[JointTerm, ...]
    by_destination: bool = False
    walk: bool = False  # inside each chunk, the tile's edges in order (every pass by destination)
    # a forward walk's groups of consecutive blocks (indices into ``blocks``) that walk the tile
    # together, chunk by chunk, one look-ahead slot holding all of their operands (empty: each alone)
    walk_groups: tuple[tuple[int, ...], ...] = ()

    @property
    def walked_blocks(self) -> tuple[tuple[tuple[int, int, int, tuple[JointPath, ...]], ...], ...]:
        """The blocks a forward walk walks together, group by group (:attr:`walk_groups`)."""
        groups = self.walk_groups or tuple((n,) for n in range(len(self.blocks)))
        return tuple(tuple(self.blocks[n] for n in group) for group in groups)

    @property
    def cg_terms(self) -> int:
        """The size of the pass's code: its paths' CG nonzeros, once per term."""
        return len(self.terms) * sum(len(p.nonzeros) for *_, paths in self.blocks for p in paths)

    def reads(self, role: str) -> tuple[int, ...]:
        """The call inputs of ``role`` that the pass reads."""
        return tuple(a for r, a in self.arrays if r == role)

    def suffix(self, role: str, array: int) -> str:
        """What tells the registers of input ``array`` of ``role`` apart: nothing when the pass
        reads one input of that role, else the input's index."""
        return "" if len(self.reads(role)) == 1 else str(array)


@dataclasses.dataclass(frozen=True)
class KernelSchedule:
    """Everything the code generator needs for one launch."""

    call: Call
    dtype: str  # "float" or "double"
    index_dtype: str  # "int" or "long long"
    outputs: tuple[KernelOutput, ...]
    slots: tuple[Slot, ...]
    tiling: str  # "tiles" or "segments"
    tile: int
    segment_role: str | None
    stage_sizes: tuple[tuple[str, int], ...]  # shared-memory elements per warp of each staged role or buffer
    transpose_size: int  # shared-memory elements per warp for output transposition
    # one warp per block for walks over sorted runs (runs differ in length, and a block's warps
    # would wait for its longest run before the block's slot is handed to the next block), unless
    # the block's warps walk in step (``lockstep``)
    warps_per_block: int
    joint: JointPass | None = None  # replaces the slots when set
    stream: WeightStream | None = None  # replaces the slots when set
    edge_sums_size: int = 0  # shared-memory elements per warp summing a by-destination pass's ȳ rows
    # with several groups, warp ``g`` of every ``len(groups)`` runs ``groups[g]``: its
    # ``(slot, first chunk, end chunk)`` units; empty: one warp per tile runs every slot
    groups: tuple[tuple[tuple[int, int, int], ...], ...] = ()
    # one wave: the launcher caps the grid at the GPU's resident blocks, and the
    # kernel spreads the edges evenly over the warps it got, in spans of at most ``tile`` edges
    fill: bool = False
    # a walk over sorted runs whose block's warps walk consecutive runs in step (Settings.lockstep_warps)
    lockstep: bool = False
    # a forward walk's look-ahead: edges loaded ahead into the ``ahead`` ring (0: the next, in registers)
    ahead: int = 0
    # bytes per lane of the ring's copies where a block allows them (:meth:`ring_copy_width`; 0: elements)
    ahead_copy_bytes: int = 0
    # the blocks per SM ptxas aims at, not its own register target (0: its own; 1: Settings.roomy_walk_terms,
    # Settings.grouped_forward_blocks)
    min_blocks: int = 0
    # a walk over sorted runs that walks at most this many edges of each run (0: all); the launches
    # after it add the rest (``beyond_cap``: Settings.owned_run_cap; ``chunk_walk``, ``chunk_sum``: Settings.run_chunk)
    run_cap: int = 0
    # the warps sharing each tile of a product forward (Settings.chunk_warps) or run of a forward walk
    # (Settings.walk_chunk_warps), warp g running chunks g, g + chunk_warps, ... of every x block; 0: a warp each
    chunk_warps: int = 0
    # the part (Settings.path_warps) of a product forward's paths that each path belongs to, in the order
    # of ``joint.blocks``: warp g of the tile's group runs part g / max(chunk_warps, 1); empty: one part
    path_groups: tuple[int, ...] = ()
    # a launch over a walk's sorted edges that adds those at this rank or later in their run (in the
    # walked role's order) to the outputs the capped walk wrote: its outputs start as those (0: none)
    beyond_cap: int = 0
    # a walk past the cap whose offsets end with the longest run (``rows + 2`` entries, as
    # :func:`jax_cgtp.core.grouping.group_edges` gives them): it returns at once where no run is longer
    # than the cap
    reads_longest_run: bool = False
    # a deterministic walk over the chunks of this many edges that follow each run's first (which the
    # capped walk wrote), one warp per chunk: its owned outputs are the chunks' partial rows (row: the
    # chunk's first sorted position // chunk_walk), its per-edge outputs start as the capped walk's
    chunk_walk: int = 0
    # a launch that adds each run's chunk rows, in chunk order, to the owned rows the capped walk wrote
    # (its outputs: the owned ones, starting as those; its extra arguments: the chunk rows)
    chunk_sum: int = 0
    # a deterministic forward walked in the atomic forward's tiles of this many dst-sorted edges: a run
    # inside a tile is stored as its node's row, a run that crosses a tile's edge to a partial row of
    # the tile (two per tile, :func:`tile_rows`: row 2 t holds the run that began before tile t, row
    # 2 t + 1 the run that starts in it and goes on past it; an output after the kernel's); 0: none
    partial_tiles: int = 0
    # a launch that writes the row of each node whose run crosses an edge of tiles of this many
    # sorted positions, as the sum of its partial rows in tile order, and zeros for the nodes without
    # edges and the components no path writes (its outputs start as the tiled walk's; its extra
    # argument: the partial rows)
    tile_sum: int = 0
    # a deterministic backward's walk by destination over a slice of at most this many dst-sorted
    # positions (the first read from the one-element index argument ``slice_at``): x̄ of the slice's
    # edge at position p to row p - slice_begin
    slice_walk: int = 0
    # a launch that adds a slice walk's rows to the x̄ rows of their sources (extra arguments: the rows
    # and each edge's dst-sorted position), each source's edges in src-sorted order; with ``run_cap``
    # and ``chunk_walk``, each run's first chunk, and the later chunks to chunk rows of their own (an
    # output after x̄, :attr:`writes_slice_chunk_rows`)
    slice_sum: int = 0
    # the first slice's launches write their outputs; the later ones start from the earlier's. The
    # first slice's walk also writes each edge's dst-sorted position (:attr:`writes_positions`)
    slice_first: bool = True

    @property
    def itemsize(self) -> int:
        return 8 if self.dtype == "double" else 4

    @property
    def permuted(self) -> bool:
        """Whether the tile's edges are rows of a sorted permutation (not consecutive rows)."""
        return self.tiling == "segments" or self.call.walk is not None or bool(self.slice_walk)

    def ring_copy_width(self, x_offset: int, mul: int, paths) -> int:
        """Elements per lane of each copy into the look-ahead ring for the x block at ``x_offset``
        (``mul`` channels) and its ``paths``: ``ahead_copy_bytes`` worth where the block's 32-channel
        chunks are whole and the x and w rows, the block and every weighted path's weights start at
        multiples of that (the ring's slots do: they are multiples of 32 elements), else one."""
        width = self.ahead_copy_bytes // self.itemsize
        if width <= 1 or mul % WARP:
            return 1
        problem = self.call.problem
        offsets = [problem.operand_dim("x"), x_offset]
        if self.joint.reads("w"):
            weighted = [p.w_offset for p in paths if p.w_offset is not None]
            offsets += [problem.operand_dim("w")] + weighted if weighted else []
        return width if all(o % width == 0 for o in offsets) else 1

    @property
    def smem_per_warp(self) -> int:
        return sum(size for _, size in self.stage_sizes) + self.transpose_size + self.edge_sums_size

    @property
    def shared_bytes(self) -> int:
        return self.smem_per_warp * self.warps_per_block * self.itemsize

    @property
    def block(self) -> int:
        return self.warps_per_block * WARP

    @property
    def num_groups(self) -> int:
        return max(1, len(self.groups), max(self.chunk_warps, 1) * self.path_warps)

    @property
    def path_warps(self) -> int:
        """The parts into which ``path_groups`` splits a forward's paths (1: none)."""
        return max(1, len(set(self.path_groups)))

    @property
    def kept(self) -> tuple[int, ...]:
        """The outputs that start as an earlier launch's (aliased to arguments after the inputs)."""
        if self.slice_sum:
            return () if self.slice_first else (0,)
        if self.chunk_walk:  # per-edge outputs; owned ones go to chunk rows, SHARED ones to partial rows
            return tuple(k for k, out in enumerate(self.outputs) if out.flush == "store")
        if self.beyond_cap or self.chunk_sum or self.tile_sum:
            return tuple(range(len(self.outputs)))
        if self.slice_walk and not self.slice_first:
            return tuple(k for k, out in enumerate(self.outputs) if out.flush == "store")
        return ()

    @property
    def writes_positions(self) -> bool:
        """Whether the launch also writes ``pos_z``, each edge's dst-sorted position (an index array
        after its outputs), which every slice's sums by source read: the first slice's walk."""
        return bool(self.slice_walk) and self.slice_first

    @property
    def writes_slice_chunk_rows(self) -> bool:
        """Whether the launch also writes chunk rows of x̄ (:func:`chunk_rows`, after its outputs),
        which the chunk sum then adds to their nodes' rows: a slice sum of runs in chunks."""
        return bool(self.slice_sum) and bool(self.chunk_walk)

    def writes_chunk_rows(self, out: KernelOutput) -> bool:
        """Whether ``out`` goes to rows of its own, one per chunk (:func:`chunk_rows`): a chunk
        walk's owned output, which the chunk sum then adds to its nodes' rows."""
        return bool(self.chunk_walk) and not self.slice_sum and out.flush == "own"

    @property
    def slice_sum_groups(self) -> int:
        """A slice sum's groups of 32-column blocks of x̄ (Settings.slice_sum_group_blocks), a warp per group."""
        return -(-self.outputs[0].dim // (WARP * self.call.settings.slice_sum_group_blocks))

    @property
    def slice_sum_group_blocks(self) -> int:
        """The 32-column blocks of each of a slice sum's groups (the last may have fewer columns)."""
        return -(-self.outputs[0].dim // (WARP * self.slice_sum_groups))

    @property
    def slice_sum_rows_ahead(self) -> int:
        """The rows whose columns a slice sum's warp loads before adding them (Settings.slice_sum_loads_in_flight)."""
        return max(1, self.call.settings.slice_sum_loads_in_flight // self.slice_sum_group_blocks)

    @property
    def chunk_sum_blocks(self) -> int:
        """A chunk or tile sum's blocks of 32 columns over its outputs: a warp per 32 nodes and block."""
        return sum(-(-out.dim // WARP) for out in self.outputs)

    def tiles(self, num_edges: int, num_segments: int) -> int:
        if self.slice_sum:  # a warp per (source node, and chunk row of runs in chunks) and group of columns
            items = num_segments + (chunk_rows(num_edges, self.chunk_walk) if self.chunk_walk else 0)
            return items * self.slice_sum_groups
        if self.chunk_sum or self.tile_sum:
            return -(-num_segments // WARP) * self.chunk_sum_blocks
        if self.chunk_walk:
            return chunk_rows(num_edges, self.chunk_walk)
        return num_segments if self.tiling == "segments" else -(-num_edges // self.tile)

    def grid(self, num_edges: int, num_segments: int) -> int:
        """Blocks to launch; each group of warps loops over the tiles grid-stride."""
        if self.fill:  # the most warps it could use; the launcher caps it
            warps = -(-num_edges // min(self.tile, self.call.settings.fill_min_span))
        else:
            warps = self.tiles(num_edges, num_segments) * self.num_groups
        blocks = -(-warps // self.warps_per_block)
        return max(0, min(blocks, self.max_blocks))

    @property
    def max_blocks(self) -> int:
        s = self.call.settings
        return s.max_partial_blocks if self.has_partials else s.max_blocks * WARPS_PER_BLOCK // self.warps_per_block

    def partial_rows(self, grid: int) -> int:
        """Rows of a SHARED output's partials: one per tile walker (the warps of one walker's
        groups write disjoint columns)."""
        return max(1, max(grid, 1) * self.warps_per_block // self.num_groups)

    @property
    def has_partials(self) -> bool:
        return any(o.kind == SHARED for o in self.outputs)


def letter_muls(ins: Instruction) -> dict[str, int]:
    return {"u": ins.mul_in1, "v": ins.mul_in2, "w": ins.mul_out}


def _block_layout(problem: Problem, ins: Instruction, role: str):
    """``(offset, letters, muls, strides, dim)`` of the instruction's block of ``role``."""
    letters = ins.letters(role)
    muls = tuple(letter_muls(ins)[c] for c in letters)
    if role == "w":
        strides = tuple(math.prod(muls[n + 1 :]) for n in range(len(muls)))
        return ins.weight_offset, letters, muls, strides, 1
    offset, _, dim = problem.block(ins, role)
    return offset, letters, muls, tuple(dim for _ in letters), dim


def _output_slots(problem: Problem, role: str):
    """``(name, offset, [indices of the instructions writing it])`` for each block of ``role``."""
    if role == "w":
        for n, ins in enumerate(problem.instructions):
            if ins.has_weight:
                yield f"path {n} weights", ins.weight_offset, [n]
        return
    irreps = {"x": problem.irreps_in1, "y": problem.irreps_in2, "z": problem.irreps_out}[role]
    field = {"x": "i_in1", "y": "i_in2", "z": "i_out"}[role]
    for slot, mul_ir in enumerate(irreps):
        users = [n for n, ins in enumerate(problem.instructions) if getattr(ins, field) == slot]
        yield f"{role} block {slot} ({mul_ir})", irreps[:slot].dim, users


def _factor(call: Call, ins: Instruction, role: str, array: int, lane: str | None,
            itemsize: int) -> Factor:
    offset, letters, muls, strides, dim = _block_layout(call.problem, ins, role)
    staged = False
    if call.kind(role) != SHARED and lane is not None and letters[:1] == lane:
        row = strides[0] if role == "w" else dim
        staged = row > 1 and WARP * stage_width(row) * itemsize <= call.settings.max_stage_bytes
    return Factor(role, array, letters, muls, strides, offset, dim, staged)


def _used_letters(ins: Instruction, output_role: str) -> str:
    """Letters read by the factors of a contribution to ``output_role``."""
    roles = [r for r in OPERANDS if r != output_role and (r != "w" or ins.has_weight)]
    return "".join(ins.letters(r) for r in roles)


def _contracted(ins: Instruction, role: str) -> dict[str, int]:
    """Letters a contribution sums over (read by its factors, absent from its output block)."""
    out = ins.letters(role)
    return {c: letter_muls(ins)[c] for c in "uvw" if c in _used_letters(ins, role) and c not in out}


def _contribution(call: Call, role: str, term: Term, n: int, ins: Instruction, lane, itemsize: int):
    roles = call.term_roles(role)
    factors = tuple(
        _factor(call, ins, r, array, lane, itemsize)
        for r, array in zip(roles, term.args)
        if r != "w" or ins.has_weight
    )
    out_letters = ins.letters(role)
    loops = tuple(c for c in _contracted(ins, role) if c != lane)
    return Contribution(
        n, ins, factors, tuple(cg_nonzeros(call.problem, ins)), out_letters, lane, loops,
        tuple(letter_muls(ins).items()),
    )


def _pairs(call: Call, output, users):
    """Every (term, instruction index, instruction) feeding a slot of ``output``."""
    problem = call.problem
    result = []
    for term in output.terms:
        for n in users:
            ins = problem.instructions[n]
            if not ins.is_active or (term.weighted_only and not ins.has_weight):
                continue
            if output.role == "w" and not ins.has_weight:
                continue
            result.append((term, n, ins))
    return result


def _plan_slot(call: Call, k: int, output, name: str, offset: int, users, itemsize: int):
    role = output.role
    pairs = _pairs(call, output, users)
    if not pairs:
        return None
    if role == "w":
        _, letters, muls, strides, _ = _block_layout(call.problem, pairs[0][2], "w")
        lane = max(letters, key=lambda c: (muls[letters.index(c)], letters.index(c)))
        contributions = tuple(_contribution(call, role, t, n, ins, lane, itemsize) for t, n, ins in pairs)
        outer = tuple(c for c in letters if c != lane and muls[letters.index(c)] > 1)
        return Slot(k, role, name, offset, math.prod(muls), 1, "output", letters, muls, strides, lane,
                    outer, contributions)

    _, mul, dim = call.problem.block(pairs[0][2], role)
    contracted = [_contracted(ins, role) for _, _, ins in pairs]
    widest = max((max(c.values(), default=0) for c in contracted), default=0)
    reduce = mul < WARP and all(contracted) and mul < widest and mul * dim <= call.settings.max_reduce_accumulators
    if reduce:
        lanes = [max(c, key=c.get) for c in contracted]
    else:
        lanes = [ins.letters(role)[:1] or None for _, _, ins in pairs]
    contributions = tuple(
        _contribution(call, role, t, n, ins, lane, itemsize) for (t, n, ins), lane in zip(pairs, lanes)
    )
    return Slot(k, role, name, offset, mul, dim, "reduce" if reduce else "output",
                contributions=contributions)


def _zero_ranges(problem: Problem, role: str, slots) -> tuple[tuple[int, int], ...]:
    """Row ranges of a BATCHED output that no slot writes (they get explicit zeros)."""
    dim = problem.operand_dim(role)
    covered = sorted((s.offset, s.offset + s.size) for s in slots)
    ranges, position = [], 0
    for start, end in covered:
        if start > position:
            ranges.append((position, start))
        position = max(position, end)
    if position < dim:
        ranges.append((position, dim))
    return tuple(ranges)


def _joint_terms(call: Call, outputs) -> tuple[JointTerm, ...]:
    """Every term of the launch's ``outputs`` (KernelOutputs), with the call inputs it reads."""
    return tuple(JointTerm(out.role, tuple(zip(call.term_roles(out.role), term.args)), term.weighted_only)
                 for out in outputs for term in call.outputs[out.call_output].terms)


def _joint_pass(call: Call, outputs, itemsize: int) -> JointPass | None:
    """The joint plan of a launch, or None (its slots then run output by output).

    It applies when every path is ``uvu`` with a one-channel y block (spherical harmonics) and
    the launch is the forward (z BATCHED, or INDEXED: a convolution; one path per z block) or a
    backward producing ȳ or at least two of x̄, ȳ, w̄ (any of them when z̄ is gathered by ``dst``:
    the walk then stages it once per run, and sums w̄ of shared weights in the warp's partial
    row). ȳ alone is joint because its slots, one per y block, would each re-read their paths'
    x chunks. A launch over sorted runs walks one node's edges at a time, so its scattered rows
    belong to the warp (written once per run, not added atomically).

    z may be an output next to backward ones, and an output may be a sum of terms over several
    inputs of x, y and w (the force loss's second derivative); z̄ comes from one input.

    A forward by destination walks an x block's paths in groups, each group a block of its own:
    at most ``Settings.max_z_components`` z components, and ``Settings.scatter_z_components`` for the
    atomic walk in float64 of more than ``Settings.scatter_z_min_terms`` CG terms. A product's pass
    of more than ``Settings.walk_terms`` CG terms (``Settings.multi_term_walk_terms`` with several terms)
    walks the tile's edges too, in groups of at most ``Settings.walk_group_terms``; a convolution's
    pass of more than ``Settings.grouped_terms_by_destination`` walks in groups of at most
    ``Settings.walk_group_terms_by_destination`` (``Settings.wide_group_terms_by_destination`` for a backward
    that adds x̄ atomically with at least ``Settings.wide_group_min_terms`` terms, or owns it with at
    least ``Settings.wide_group_min_owned_terms``).
    """
    roles = {o.role: k for k, o in enumerate(outputs)}
    if len(roles) != len(outputs):
        return None
    by_destination = call.kind("z") == INDEXED
    if not by_destination and set(roles) in ({"x"}, {"w"}):
        return None
    if any(o.kind not in WALK_KINDS[o.role] and not (by_destination and o.role == "w" and o.kind == SHARED)
           for o in outputs):
        return None
    terms = _joint_terms(call, outputs)
    arrays = tuple(sorted({factor for t in terms for factor in t.factors}))
    if sum(role == "z" for role, _ in arrays) > 1:
        return None
    problem = call.problem
    active = [(n, ins) for n, ins in enumerate(problem.instructions) if ins.is_active]
    if not active or any(ins.mode != "uvu" or ins.mul_in2 != 1 for _, ins in active):
        return None
    if "z" in roles and len({ins.i_out for _, ins in active}) != len(active):
        return None
    blocks = []
    for i1, mul_ir in enumerate(problem.irreps_in1):
        paths = []
        for n, ins in active:
            if ins.i_in1 != i1:
                continue
            (xo, _, xd), (yo, _, yd), (zo, _, zd) = (problem.block(ins, r) for r in "xyz")
            paths.append(JointPath(n, xo, xd, yo, yd, zo, zd, ins.weight_offset if ins.has_weight else None,
                                   tuple(cg_nonzeros(problem, ins))))
        if paths:
            blocks.append((problem.irreps_in1[:i1].dim, mul_ir.mul, mul_ir.ir.dim, tuple(paths)))

    def code(group):  # CG terms: the group's nonzeros, once per term of the pass
        return len(terms) * sum(len(p.nonzeros) for p in group)

    total = code([p for *_, paths in blocks for p in paths])
    s = call.settings
    limits = []
    if set(roles) == {"z"} and by_destination:
        limit = _z_components(s, outputs[0].flush, total, itemsize, s.max_z_components)
        limits.append(lambda group: sum(p.z_dim for p in group) <= limit)
    if by_destination and total > s.grouped_terms_by_destination:
        x_flush = next((o.flush for o in outputs if o.role == "x"), None)
        field = {"atomic": "wide_group_min_terms", "own": "wide_group_min_owned_terms",
                 "slice": "wide_group_min_terms"}.get(x_flush)
        minimum = s.by_size(field, itemsize) if field else None
        wide = minimum is not None and len(terms) >= minimum
        group_terms = s.wide_group_terms_by_destination if wide else s.walk_group_terms_by_destination
        if x_flush == "slice" and len(terms) >= s.slice_group_min_terms:
            group_terms = s.slice_group_terms_by_destination
        limits.append(lambda group: code(group) <= group_terms)
    walk = by_destination or total > (s.walk_terms if len(terms) == 1 else s.multi_term_walk_terms)
    if walk and not by_destination:
        limits.append(lambda group: code(group) <= s.walk_group_terms)
    blocks = _split_paths(blocks, lambda group: all(fits(group) for fits in limits))
    y_blocks = sorted({(p.y_offset, p.y_dim) for _, _, _, paths in blocks for p in paths})
    return JointPass(tuple(sorted(roles.items())), arrays, tuple(blocks), tuple(y_blocks), terms, by_destination,
                     walk)


def _z_components(s: Settings, flush: str, cg_terms: int, itemsize: int, limit: int) -> int:
    """The most z components a forward walk by destination holds at once, at most ``limit``: fewer
    (Settings.scatter_z_components) in an atomic walk of more than Settings.scatter_z_min_terms CG terms."""
    if flush == "atomic" and cg_terms > s.scatter_z_min_terms:
        return min(limit, s.by_size("scatter_z_components", itemsize, limit))
    return limit


def _split_paths(blocks, fits):
    """Each x block's paths in consecutive groups for which ``fits(paths)`` holds (a path that
    alone does not is a group of its own); every group is a block of its own, so a walk holds only
    one group's z chunks in registers, and runs one group's code at a time."""
    result = []
    for x_offset, mul, dim, paths in blocks:
        groups = [[]]
        for p in paths:
            if groups[-1] and not fits(groups[-1] + [p]):
                groups.append([])
            groups[-1].append(p)
        result += [(x_offset, mul, dim, tuple(group)) for group in groups]
    return result


def ahead_slot(joint: JointPass, members) -> int:
    """Elements of one slot of a forward walk's look-ahead ring for blocks ``members`` walked together
    (:attr:`JointPass.walked_blocks`): 32 staged x rows per block and x input, then 32 weights per
    weighted path and w input."""
    weighted = sum(p.w_offset is not None for *_, paths in members for p in paths) if joint.reads("w") else 0
    x_rows = sum(stage_width(x_dim) for _, _, x_dim, _ in members) * len(joint.reads("x"))
    return WARP * (x_rows + weighted * len(joint.reads("w")))


def _walk_groups(s: Settings, joint: JointPass, limit: int, x_limit: int | None = None) -> tuple[tuple[int, ...], ...]:
    """Consecutive blocks of equal ``mul`` walked as one group while their z chunks take at most
    ``limit`` components together (Settings.merged_walk_z_components), and their x rows at most ``x_limit``
    (None: any number): the fewest groups, and of those the partition whose widest group is
    narrowest (fewest registers). A pass split by the size of its code keeps its groups apart."""
    if joint.cg_terms > s.grouped_terms_by_destination:
        return ()
    widths = [sum(p.z_dim for p in paths) for *_, paths in joint.blocks]
    muls = [mul for _, mul, _, _ in joint.blocks]
    x_dims = [x_dim for _, _, x_dim, _ in joint.blocks]
    x_cap = sum(x_dims) if x_limit is None else x_limit

    def packed(cap):  # the fewest groups of at most ``cap`` components (a wider block alone)
        groups, width, x_width = [], 0, 0
        for n, z in enumerate(widths):
            if groups and muls[groups[-1][-1]] == muls[n] and width + z <= cap and x_width + x_dims[n] <= x_cap:
                groups[-1].append(n)
                width += z
                x_width += x_dims[n]
            else:
                groups.append([n])
                width, x_width = z, x_dims[n]
        return groups

    fewest = len(packed(limit))
    narrowest = next(cap for cap in range(limit + 1) if len(packed(cap)) == fewest)
    return tuple(map(tuple, packed(narrowest)))


def _merged_backward_walk(s: Settings, joint: JointPass, buffers, itemsize: int) -> JointPass:
    """``joint``, a backward walk by destination, with its blocks walked in groups whose z̄ chunks
    take at most Settings.merged_backward_walk_z_components[itemsize] components and whose x rows at most
    Settings.merged_backward_walk_x_components[itemsize] (where set), unless the groups' staged
    z̄ chunks would leave fewer warps per block in ``Settings.max_block_shared_bytes`` (``buffers``: the pass's
    shared-memory elements per warp, as :func:`_joint_buffers` returns them)."""
    limit = s.by_size("merged_backward_walk_z_components", itemsize, 0)
    if not limit:
        return joint
    groups = _walk_groups(s, joint, limit, s.by_size("merged_backward_walk_x_components", itemsize))
    merged = dataclasses.replace(joint, walk_groups=groups)

    def warps_per_block(j):
        stage, transpose, edge_sums = buffers(j)
        return _warps_in_block_shared(s, (sum(stage.values()) + transpose + edge_sums) * itemsize, WARPS_PER_BLOCK)

    return merged if warps_per_block(merged) >= warps_per_block(joint) else joint


def _joint_buffers(joint: JointPass, y_dim: int, stage_y: bool, ahead: int,
                   buffered: frozenset[str]) -> tuple[dict[str, int], int, int]:
    """Shared-memory elements per warp of a joint pass: the staged x (and, backward, z̄) chunks,
    the tile's y rows (``stage_y``: a by-destination pass reading per-edge y), the transposition
    buffer of the outputs whose roles are ``buffered`` (:attr:`KernelOutput.buffered`), the ȳ rows of the tile that a
    by-destination backward sums chunk by chunk, and a forward walk's look-ahead ring of
    ``ahead + 1`` slots (``ahead`` > 0), which stages its x rows in place of ``stage_x``."""
    outputs = dict(joint.outputs)
    backward = set(outputs) != {"z"}
    stage: dict[str, int] = {}
    transpose = 0
    if ahead:
        stage["ahead"] = max((ahead + 1) * ahead_slot(joint, members) for members in joint.walked_blocks)
    for _, _, x_dim, paths in joint.blocks:
        for p in paths:
            for role, dim in (("x", p.x_dim), ("z", p.z_dim)):
                if dim > 1 and (role == "x" and not ahead or backward):
                    stage[role] = max(stage.get(role, 0), WARP * stage_width(dim))
            out_dims = ([x_dim] if "x" in buffered else []) + ([p.z_dim] if "z" in buffered else [])
            transpose = max([transpose] + [WARP * d for d in out_dims if d > 1])
    if backward and joint.walk:  # the z̄ chunks of all of a walked group's paths at once
        for members in joint.walked_blocks:
            paths = [p for *_, group in members for p in group]
            stage["z"] = max(stage.get("z", 0), sum(WARP * stage_width(p.z_dim) for p in paths))
    if stage_y:  # one set of rows per y input
        stage["y"] = WARP * y_dim * len(joint.reads("y"))
    edge_sums = WARP * y_dim if joint.walk and "y" in outputs else 0
    return stage, transpose, edge_sums


def _fit_shared_memory(kernel: KernelSchedule) -> KernelSchedule:
    """The launch with as many of its warps per block as fit in ``Settings.max_block_shared_bytes``
    (z̄ chunks of a wide block staged by a walk by destination: 68 KiB per warp for l5-c32 in
    float64); a ValueError naming the problem when one warp alone needs more."""
    per_warp = kernel.smem_per_warp * kernel.itemsize
    s = kernel.call.settings
    if per_warp > s.max_block_shared_bytes:
        raise ValueError(
            f"jax_cgtp: a warp of this launch needs {per_warp} bytes of shared memory, more than the "
            f"{s.max_block_shared_bytes} of a block, for {kernel.call.problem} in {kernel.dtype}")
    return dataclasses.replace(kernel, warps_per_block=_warps_in_block_shared(s, per_warp, kernel.warps_per_block))


def _warps_in_block_shared(s: Settings, per_warp_bytes: int, warps: int) -> int:
    """Of ``warps`` warps per block, as many as fit in ``Settings.max_block_shared_bytes`` at ``per_warp_bytes`` each."""
    limit = s.max_block_shared_bytes
    return warps if per_warp_bytes * warps <= limit else limit // per_warp_bytes


def _registers_ahead(s: Settings, joint: JointPass, itemsize: int) -> bool:
    """A float32 forward walk in groups of paths (more code than Settings.grouped_terms_by_destination) loads
    the next edge into registers: with the ring, l5-c32's took 1.70x the time (Settings.ahead_depth)."""
    return itemsize == 4 and joint.cg_terms > s.grouped_terms_by_destination


def _lockstep_warps(s: Settings, joint: JointPass | None) -> int:
    """The warps per block of a walk over sorted runs that walks them in step (Settings.lockstep_warps), or 0."""
    if joint is None or not joint.walk:
        return 0
    return max((warps for terms, warps in s.lockstep_warps if joint.cg_terms > terms), default=0)


def _min_blocks(s: Settings, joint: JointPass | None, lockstep: int, registers_ahead: bool) -> int:
    """The blocks per SM ptxas aims at for a launch (0: its own target): one for a free-running walk
    of long code, which keeps the registers its code needs (Settings.roomy_walk_terms);
    Settings.grouped_forward_blocks for a float32 forward walk in groups of paths."""
    if joint is None or not joint.walk or lockstep:
        return 0
    if registers_ahead:
        return s.grouped_forward_blocks
    return 1 if s.roomy_walk_terms < joint.cg_terms <= s.walk_terms else 0


def kernel_groups(call: Call) -> list[tuple[list[int], str | None]]:
    """Split the call's outputs into launches: ``[(output indices, segment role or None)]``.

    A launch with a segment role walks that role's sorted runs, one node per warp, and writes
    the role's rows once each: a deterministic call has one per INDEXED output role. Without a
    destination index, z goes to a launch of its own (:func:`_apart_from_z`).

    The walk by source of a deterministic backward gathers every edge's z̄[dst] row (mace-l2-c128
    in float32: 5.79 GB read against the atomic walk's 2.11 GB, H100). Launches over windows of
    destinations, each adding to x̄, so that a window's z̄ rows stay in L2, were slower at every
    window size (1.05-2.16x the time, more windows slower): each launch walks every run again
    (``benchmarks/results/nvidia-h100-80gb-hbm3/oeq-backward``).
    """
    if not call.deterministic:
        result = [(list(range(len(call.outputs))), None)]
    else:
        groups: dict[str | None, list[int]] = {}
        for k, output in enumerate(call.outputs):
            key = output.role if call.kind(output.role) == INDEXED else None
            groups.setdefault(key, []).append(k)
        free = groups.pop(None, [])
        result = [(ks, role) for role, ks in groups.items()]
        if free:
            if result:
                result[0] = (result[0][0] + free, result[0][1])
            else:
                result.append((free, None))
    return [part for ks, role in result for part in _apart_from_z(call, ks, role)]


def _apart_from_z(call: Call, outputs: list[int], segment_role: str | None):
    """The launches of ``outputs``: z apart from the others unless it is scattered by ``dst``, and
    then apart too in an atomic launch whose pass has more than ``Settings.z_with_backward_max_terms``
    CG terms.

    The forward's accumulators and the backward's do not fit in the registers together (the
    force-loss second derivative of sevennet-l3-c32's product: 255 registers and spills in one
    launch, 96 and 147 in two). A walk by destination keeps them together, since it keys both
    the z accumulators and the staged z̄ on ``dst``. A deterministic walk over ``dst`` runs always
    does: its owned z rows are what its long runs are split into chunks by (ȳ and w̄ alone would
    walk each run whole).
    """
    z = [k for k in outputs if call.outputs[k].role == "z"]
    if not z or len(z) == len(outputs):
        return [(outputs, segment_role)]
    if call.kind("z") == INDEXED and (segment_role is not None
                                      or _pass_terms(call, outputs) <= call.settings.z_with_backward_max_terms):
        return [(outputs, segment_role)]
    return [([k for k in outputs if k not in z], segment_role), (z, segment_role)]


def _pass_terms(call: Call, outputs: list[int]) -> int:
    """The CG terms of one joint pass over ``outputs`` (:attr:`JointPass.cg_terms`)."""
    nonzeros = sum(len(cg_nonzeros(call.problem, ins)) for ins in call.problem.instructions if ins.is_active)
    return nonzeros * sum(len(call.outputs[k].terms) for k in outputs)


def shared_tile_for(s: Settings, edges: int) -> int:
    """Edges per tile of a launch with a SHARED output, for ``edges`` edges (a power of two).

    Such an output keeps one partial row per warp, and at most ``Settings.max_partial_blocks`` blocks
    run. A 32-edge tile would leave most of those warps idle when the edges are few (the
    weight gradient of a node-level product over a small batch), so the tile shrinks until
    the edges fill them.

    >>> shared_tile_for(Settings(), 864), shared_tile_for(Settings(), 5000), shared_tile_for(Settings(), 10**6)
    (1, 8, 32)
    """
    warps = s.max_partial_blocks * WARPS_PER_BLOCK
    tile = 1
    while tile < s.tile_indexed and tile * warps < edges:
        tile *= 2
    return tile


def slot_chunks(slot: Slot) -> int:
    """The 32-channel chunks a slot's lanes walk (one unit for a reduce-mode slot)."""
    return 1 if slot.mode == "reduce" else -(-slot.lane_mul // WARP)


def _chunk_cost(slot: Slot) -> int:
    """Inner-loop iterations of one chunk of ``slot``, times the products per iteration."""
    outer = math.prod(slot.muls[slot.letters.index(c)] for c in slot.outer_letters)
    cost = 0
    for c in slot.contributions:
        loops = math.prod(c.mul(letter) for letter in c.loop_letters)
        lanes = -(-c.mul(c.lane_letter) // WARP) if slot.mode == "reduce" else 1
        cost += outer * loops * lanes * (len(c.nonzeros) + len(c.factors))
    return cost


def slot_groups(s: Settings, slots, tiles: int, max_warps: int,
                itemsize: int) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """Spread ``slots`` over warps when ``tiles`` tiles would leave the GPU mostly idle.

    Units are one chunk of one slot; they go, largest first, to the least loaded of
    ``G = min(Settings.max_groups, units, max_warps, target / tiles rounded up to a power of two)`` groups,
    with ``target = Settings.target_warps * 4 / itemsize`` (float64 kernels hold twice the registers) and
    ``max_warps`` the most the launch's grid holds. Returns ``()`` (every warp runs every slot) when
    one group is enough.
    """
    units = [(k, c) for k, slot in enumerate(slots) for c in range(slot_chunks(slot))]
    wanted = 1
    while wanted * max(tiles, 1) < s.target_warps * 4 // itemsize:
        wanted *= 2
    count = min(s.max_groups, len(units), max_warps, wanted)
    if count <= 1:
        return ()
    costs = [_chunk_cost(slot) for slot in slots]
    loads, members = [0] * count, [[] for _ in range(count)]
    for k, c in sorted(units, key=lambda u: -costs[u[0]]):
        g = loads.index(min(loads))
        loads[g] += costs[k]
        members[g].append((k, c))
    groups = []
    for unit_list in members:
        merged: list[list[int]] = []
        for k, c in sorted(unit_list):
            if merged and merged[-1][0] == k and merged[-1][2] == c:
                merged[-1][2] = c + 1
            else:
                merged.append([k, c, c + 1])
        groups.append(tuple(tuple(m) for m in merged))
    return tuple(groups)


def plan(call: Call, dtype: str, index_dtype: str, edges: int | None = None) -> list[KernelSchedule]:
    """The launches of ``call`` for ``dtype`` ("float"/"double") and index type ("int"/"long long").

    With ``edges`` (the batch size), a launch with a SHARED output uses tiles of
    :func:`shared_tile_for` edges, and a launch of few tiles spreads its slots over warps
    (:func:`slot_groups`); without, tiles are 32 edges and every warp runs every slot. The atomic
    convolution's forward walks ``dst`` runs where that is faster (:func:`_forward_by_runs`): each run's first
    Settings.owned_run_cap edges, and a second launch, the atomic forward's, adds the rest. A deterministic
    forward whose walk would run in lockstep walks tiles instead (:func:`_tiled_forward`). A
    deterministic call's walks over sorted runs walk chunks of Settings.run_chunk edges (:func:`_chunked`)
    where ``edges`` is given and more than Settings.run_chunk.
    """
    call = _forward_by_runs(call, dtype, index_dtype, edges)
    s = call.settings
    sliced = _sliced(call, dtype, index_dtype, edges)
    if sliced:
        return sliced
    launches = _launches(call, dtype, index_dtype, edges)
    if not _owned_by_grouping(call):
        launches = [part for k in launches for part in _tiled_forward(call, k, dtype, index_dtype, edges)]
        if s.run_chunk <= 0 or edges is None or edges <= s.run_chunk:  # (no run is longer than edges)
            return launches
        return [part for k in launches for part in (_chunked(k, s.run_chunk) if _chunkable(k) else [k])]
    if s.owned_run_cap <= 0 or len(launches) != 1 or launches[0].lockstep:
        return launches  # (a lockstep walk is never launched: owned_walk_is_faster picks the atomic forward)
    rest = _launches(dataclasses.replace(call, deterministic=False), dtype, index_dtype, edges)
    if len(rest) != 1:
        return launches
    return [dataclasses.replace(launches[0], run_cap=s.owned_run_cap),
            dataclasses.replace(rest[0], beyond_cap=s.owned_run_cap)]


def _sliced(call: Call, dtype: str, index_dtype: str, edges: int | None) -> list[KernelSchedule]:
    """A deterministic backward into x̄ by ``src`` from z̄ by ``dst`` in slices of dst-sorted
    positions (Settings.deterministic_backward_slice_bytes of x̄ rows): per slice, the atomic call's joint
    walk by destination (its call carries ``dst``'s ordering alone), x̄ of each edge to the slice's
    row for it, then a sum by source (a call carrying ``src``'s ordering) that adds the rows to the
    sources' x̄ rows, in chunks of Settings.run_chunk edges of each run where ``edges`` is more than
    Settings.run_chunk (the sum's warps take each run's first chunk and each later chunk, whose rows a
    chunk sum adds in chunk order, as :func:`_chunked`'s); [] when the setting is off or the call
    is not such a backward."""
    s = call.settings
    roles = [o.role for o in call.outputs]
    if (s.deterministic_backward_slice_bytes <= 0 or not call.deterministic or "z" in roles or "x" not in roles
            or call.kind("x") != INDEXED or call.kind("z") != INDEXED):
        return []
    (walk,) = _launches(dataclasses.replace(call, deterministic=False, orderings=("z",)), dtype, index_dtype, edges,
                        x_flush="slice") or [None]
    if walk is None or walk.joint is None or not walk.joint.by_destination:
        return []
    x_out = next(o for o in walk.outputs if o.role == "x")
    rows = max(1, s.deterministic_backward_slice_bytes // (x_out.dim * walk.itemsize))
    walk = dataclasses.replace(walk, slice_walk=rows)
    total = KernelSchedule(dataclasses.replace(call, orderings=("x",)), dtype, index_dtype,
                           (dataclasses.replace(x_out, flush="own", zero_ranges=()),),
                           (), "segments", WARP, "x", (), 0, WARPS_PER_BLOCK, slice_sum=rows)
    if s.run_chunk <= 0 or edges is None or edges <= s.run_chunk:  # (no run is longer than edges)
        return [walk, total]
    capped, _, chunk_total = _chunked(total, s.run_chunk)
    return [walk, dataclasses.replace(capped, chunk_walk=s.run_chunk), dataclasses.replace(chunk_total, slice_sum=0)]


def tile_rows(edges: int, tile: int) -> int:
    """Partial rows of a tiled deterministic forward (:attr:`KernelSchedule.partial_tiles`): two per tile."""
    return 2 * -(-edges // tile)


def chunk_rows(edges: int, chunk: int) -> int:
    """Rows of a chunk walk's owned outputs: one per window of ``chunk`` sorted positions."""
    return -(-edges // chunk)


def _chunked(kernel: KernelSchedule, chunk: int) -> list[KernelSchedule]:
    """A deterministic walk over sorted runs as three launches (Settings.run_chunk): the walk of each run's
    first ``chunk`` edges, a walk of the later chunks into rows of their own, and their sum in
    chunk order, so that no run holds one warp for longer than ``chunk`` edges.

    A run's k-th chunk (k >= 1) starts at ``off[node] + k * chunk``; two such starts lie at least
    ``chunk`` apart, so the window of sorted positions ``[j * chunk, (j + 1) * chunk)`` holds at most
    one, and row ``j`` is that chunk's. A SHARED output (the deterministic backward's w̄ of shared
    weights) gets partial rows of the chunk walk's own, which the caller adds to the walk's."""
    owned = tuple(out for out in kernel.outputs if out.flush == "own")
    walk = dataclasses.replace(kernel, lockstep=False, warps_per_block=1, chunk_walk=chunk, chunk_warps=0,
                               path_groups=())
    total = _row_sum(kernel, outputs=owned, chunk_sum=chunk)
    return [dataclasses.replace(kernel, run_cap=chunk), walk, total]


def _row_sum(kernel: KernelSchedule, **sum_fields) -> KernelSchedule:
    """``kernel``'s call and outputs as a launch that sums rows a walk left (``sum_fields``: which,
    e.g. ``chunk_sum``): no slots, staging, joint pass, weight stream, ring, lockstep or tile group,
    and WARPS_PER_BLOCK warps per block."""
    return dataclasses.replace(kernel, slots=(), stage_sizes=(), transpose_size=0, joint=None, stream=None,
                               edge_sums_size=0, lockstep=False, ahead=0, ahead_copy_bytes=0, min_blocks=0,
                               chunk_warps=0, path_groups=(), warps_per_block=WARPS_PER_BLOCK, **sum_fields)


def _chunkable(kernel: KernelSchedule) -> bool:
    """Whether ``kernel`` gives each warp one node's whole run (its owned rows)."""
    return kernel.tiling == "segments" and not kernel.tile_sum and any(out.flush == "own" for out in kernel.outputs)


def _tiled_forward(call: Call, kernel: KernelSchedule, dtype: str, index_dtype: str,
                   edges: int | None) -> list[KernelSchedule]:
    """A deterministic forward's walk over dst runs in lockstep as two launches (det-forward-tiled:
    1.05-1.34x the atomic forward's time, against 1.27-1.53x in lockstep): the atomic forward's walk over tiles of dst-sorted edges (its call
    carrying ``dst``'s ordering alone), each of its z flushes stored to the node's row or to a partial
    row of the tile, in tiles of a fixed size (not spread over the grid it gets); then the sum of the
    partial rows. ``[kernel]`` for any other launch, where ``edges`` is not given or the partial rows
    would take more than Settings.tiled_forward_max_bytes, and where the atomic call's plan walks z with other
    outputs (the force loss's second derivative)."""
    joint = kernel.joint
    if (not kernel.lockstep or kernel.segment_role != "z" or joint is None
            or dict(joint.outputs).keys() != {"z"} or edges is None):
        return [kernel]
    z = kernel.outputs[0].call_output
    atomic = _launches(dataclasses.replace(call, deterministic=False, orderings=("z",)), dtype, index_dtype, edges)
    walk = next((k for k in atomic if [o.call_output for o in k.outputs] == [z] and k.joint is not None
                 and k.joint.by_destination), None)
    if walk is None or tile_rows(edges, walk.tile) * kernel.outputs[0].dim * kernel.itemsize > \
            call.settings.tiled_forward_max_bytes:
        return [kernel]
    (z_out,) = walk.outputs
    walk = dataclasses.replace(walk, outputs=(dataclasses.replace(z_out, flush="tile"),), fill=False,
                               partial_tiles=walk.tile)
    return [walk, _row_sum(kernel, tile_sum=walk.tile)]


def _owned_by_grouping(call: Call) -> bool:
    """Whether ``call`` is the atomic convolution's forward by ``dst`` runs: a deterministic call that
    carries ``z``'s ordering alone (a grouping, whose runs may be of any length)."""
    return call.deterministic and call.orderings == ("z",) and len(call.outputs) == 1


def _launches(call: Call, dtype: str, index_dtype: str, edges: int | None,
              x_flush: str = "atomic") -> list[KernelSchedule]:
    """:func:`plan`'s launches, every run walked whole; an INDEXED x̄ that no warp owns flushed by
    ``x_flush`` ("slice": to each edge's row of a slice, :func:`_sliced`), any other output atomically."""
    itemsize = 8 if dtype == "double" else 4
    s = call.settings
    shared_tile = s.tile_indexed if edges is None else shared_tile_for(s, edges)
    schedules = []
    for output_indices, segment_role in kernel_groups(call):
        outputs, slots = [], []
        for k, call_index in enumerate(output_indices):
            output = call.outputs[call_index]
            kind = call.kind(output.role)
            planned = [
                _plan_slot(call, k, output, name, offset, users, itemsize)
                for name, offset, users in _output_slots(call.problem, output.role)
            ]
            planned = [slot for slot in planned if slot is not None]
            slots += planned
            if kind == BATCHED:
                flush = "store"
            elif kind == SHARED:
                flush = "red"
            elif output.role == segment_role:
                flush = "own"
            else:
                flush = x_flush if output.role == "x" else "atomic"
            zero = _zero_ranges(call.problem, output.role, planned) if flush in ("store", "own", "slice") else ()
            outputs.append(KernelOutput(call_index, output.role, kind, call.problem.operand_dim(output.role),
                                        flush, zero))
        joint = _joint_pass(call, outputs, itemsize)
        stream = weight_stream(call, outputs, itemsize) if joint is None else None
        if segment_role or (joint is not None and joint.by_destination):  # runs of one node to walk
            tile = s.tile_indexed
        elif joint is not None and joint.walk:
            tile = s.walk_tile
        elif stream is not None:
            tile = s.stream_tile
        elif any(o.kind == SHARED for o in outputs):
            tile = shared_tile
        else:
            tile = s.tile_indexed if any(o.kind != BATCHED for o in outputs) else 1
        stage = {}
        for slot in slots:
            for c in slot.contributions:
                for f in c.factors:
                    if f.staged:
                        row = f.strides[0] if f.role == "w" else f.dim
                        stage[f.role] = max(stage.get(f.role, 0), WARP * stage_width(row))
        transpose = max((WARP * slot.dim for slot in slots if slot.mode == "output" and slot.role != "w" and slot.dim > 1),
                        default=0)
        edge_sums = 0
        own_runs = segment_role and not any(o.kind == SHARED for o in outputs)  # a warp per run, no partials
        lockstep = _lockstep_warps(s, joint) if own_runs else 0
        forward_walk = joint is not None and joint.by_destination and dict(joint.outputs).keys() == {"z"}
        depth = s.owned_ahead_depth if own_runs else s.ahead_depth
        registers_ahead = forward_walk and _registers_ahead(s, joint, itemsize)
        ahead = depth if forward_walk and not lockstep and not registers_ahead else 0
        if ahead and s.merged_walk_z_components:
            limit = _z_components(s, outputs[0].flush, joint.cg_terms, itemsize, s.merged_walk_z_components)
            joint = dataclasses.replace(joint, walk_groups=_walk_groups(s, joint, limit))
        if joint is not None:
            stage_y = joint.walk and bool(joint.reads("y")) and call.kind("y") == BATCHED
            buffered = frozenset(o.role for o in outputs if o.buffered and o.role in dict(joint.outputs))
            buffers = functools.partial(_joint_buffers, y_dim=call.problem.operand_dim("y"), stage_y=stage_y,
                                        ahead=ahead, buffered=buffered)
            if joint.by_destination and not forward_walk and not lockstep:
                joint = _merged_backward_walk(s, joint, buffers, itemsize)
            stage, transpose, edge_sums = buffers(joint)
        if stream is not None:
            stage, transpose = stream_buffers(stream, call.problem), 0
        kernel = KernelSchedule(
            call, dtype, index_dtype, tuple(outputs), tuple(slots),
            "segments" if segment_role else "tiles",
            tile,
            segment_role,
            tuple(stage.items()) if stream is not None else tuple((r, stage[r]) for r in OPERANDS + ("ahead",)
                                                                  if r in stage),
            transpose,
            lockstep or (1 if own_runs else WARPS_PER_BLOCK),
            joint,
            stream,
            edge_sums,
            lockstep=bool(lockstep),
            ahead=ahead,
            ahead_copy_bytes=s.ahead_copy_bytes if ahead else 0,
            min_blocks=_min_blocks(s, joint, lockstep, registers_ahead),
        )
        kernel = _fit_shared_memory(kernel)
        if edges is not None and joint is None and stream is None:
            segments = call.row_count(segment_role) if segment_role else 0
            groups = slot_groups(s, kernel.slots, kernel.tiles(edges, segments),
                                 kernel.max_blocks * kernel.warps_per_block, itemsize)
            kernel = dataclasses.replace(kernel, groups=groups)
        if joint is not None and not joint.walk and dict(joint.outputs).keys() == {"z"} \
                and all(o.kind == BATCHED for o in outputs):
            kernel = _tile_group(kernel, s.chunk_warps, s.path_warps)
        elif forward_walk and own_runs and not lockstep:
            kernel = _tile_group(kernel, s.walk_chunk_warps, 0)
        if joint is not None and joint.by_destination and kernel.tiling == "tiles":
            kernel = dataclasses.replace(kernel, fill=True)
        schedules.append(kernel)
    return schedules


def _tile_group(kernel: KernelSchedule, chunk_warps: int, path_warps: int) -> KernelSchedule:
    """A forward's tile (or run) shared among the warps of a group: its x blocks' chunks (at most
    ``chunk_warps``, and their largest number of chunks) and parts of its paths (at most ``path_warps``,
    and one per path), a power of two of at most Settings.max_tile_group warps in all, in blocks that hold
    whole groups."""
    joint = kernel.joint
    chunks = _power_of_two_below(min(chunk_warps, max(-(-mul // WARP) for _, mul, _, _ in joint.blocks)))
    paths = [p for *_, block in joint.blocks for p in block]
    parts = _power_of_two_below(min(path_warps, len(paths), kernel.call.settings.max_tile_group // chunks))
    group = chunks * parts
    if group < 2:
        return kernel
    load = [0] * parts
    owner = [0] * len(paths)
    for n in sorted(range(len(paths)), key=lambda n: -paths[n].z_dim):  # most bytes first, to the lightest part
        owner[n] = min(range(parts), key=lambda g: load[g])
        load[owner[n]] += paths[n].z_dim + 1
    warps = max(kernel.warps_per_block, group)
    warps = warps if warps % group == 0 else group
    if _warps_in_block_shared(kernel.call.settings, kernel.smem_per_warp * kernel.itemsize, warps) < warps:
        return kernel
    return dataclasses.replace(kernel, chunk_warps=chunks if chunks > 1 else 0,
                               path_groups=tuple(owner) if parts > 1 else (), warps_per_block=warps)


def _power_of_two_below(n: int) -> int:
    """The largest power of two not above ``n`` (1 for ``n`` below 2)."""
    return 1 << max(0, n.bit_length() - 1)


def _forward_by_runs(call: Call, dtype: str, index_dtype: str, edges: int | None) -> Call:
    """``call``, or its deterministic twin where ``call`` is the atomic convolution's forward (one
    term into z scattered by ``dst``, its tiles walking ``dst``'s grouping) and the twin's walk over
    ``dst`` runs, each node's row written once, is expected to be faster
    (:func:`owned_forward_is_faster`). Both take the same arguments; every derivative stays atomic."""
    if edges is None or call.deterministic or call.walk != "z" or call.kind("z") != INDEXED or len(call.outputs) != 1:
        return call
    (output,) = call.outputs
    if output.role != "z" or len(output.terms) != 1 or output.terms[0].weighted_only:
        return call
    owned = dataclasses.replace(call, deterministic=True)
    return owned if owned_forward_is_faster(owned, dtype, index_dtype, edges) else call


def owned_forward_is_faster(call: Call, dtype: str, index_dtype: str, edges: int) -> bool:
    """Whether a deterministic convolution forward ``call`` (z owned by ``dst`` runs) on ``edges``
    edges is expected to beat the atomic forward: Settings.owned_forward_min_nodes destination nodes (``call``'s
    z rows) or more, times the mean run's length over Settings.owned_forward_run_edges where that is above 1,
    and :func:`owned_walk_is_faster`."""
    s = call.settings
    nodes = call.row_count("z")
    longer_runs = max(1.0, edges / (s.owned_forward_run_edges * max(nodes, 1)))
    minimum = s.by_size("owned_forward_min_nodes", dtype)
    return nodes >= minimum * longer_runs and owned_walk_is_faster(call, dtype, index_dtype)


@functools.lru_cache(maxsize=None)
def owned_walk_is_faster(call: Call, dtype: str, index_dtype: str) -> bool:
    """Whether the walk of a deterministic convolution forward ``call`` (z owned by ``dst`` runs) is
    expected to beat the atomic forward's: one launch with a joint pass whose warps run free (not in
    lockstep).

    Measured (H100, every public config in one run, ``lane-writes/``): such walks took 0.82-0.99x
    the atomic forward's time (mace-l2-c128 0.82x in both dtypes); the lockstep walks of long code
    (nequip-revmd17-benzene, l5-c32) 1.12-1.43x, and DiffDock's weight streams 1.10-1.13x.
    """
    kernels = _launches(call, dtype, index_dtype, None)
    return len(kernels) == 1 and kernels[0].joint is not None and not kernels[0].lockstep
