"""The schedule of a call's CUDA kernels: pure static analysis, no GPU needed.

The schedule decides, for one :class:`~jax_cgtp.call.Call`:

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
  asynchronously ahead of their use (:mod:`jax_cgtp.stream`).

The result is plain data that :mod:`jax_cgtp.codegen` turns into CUDA source.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from .call import Call, Term
from .operands import BATCHED, INDEXED, OPERANDS, SHARED
from .problem import Instruction, Problem, cg_nonzeros
from .stream import TILE_STREAM, WALK_KINDS, WARP, WeightStream, stage_width, stream_buffers, weight_stream

WARPS_PER_BLOCK = 4
TILE_INDEXED = 32  # edges per tile when rows are accumulated across edges
# A walk's grid is capped at MAX_BLOCKS blocks of WARPS_PER_BLOCK warps (its warps loop grid-stride
# past that). The product's walks take one edge per warp: 25,000 blocks at 100,000 edges, where a
# cap of 8192 gave each warp three edges in turn (float64's 50,000 edges: one or two). H200, same
# process (benchmarks/results/nvidia-h200/max-blocks/): the cap of 65536 took 0.956-0.995x
# the time on seven float32 rows of the product whose grid it changes (forward, backward, double
# backward; geometric mean 0.981) and 0.984-1.011x on five float64 rows (0.999); three rows whose
# program stayed the same gave 0.986-0.999x, the measurement's spread.
MAX_BLOCKS = 65536
MAX_PARTIAL_BLOCKS = 256  # a SHARED output keeps one partial row per warp (per walker with groups)
MAX_STAGE_BYTES = 8192  # per staged operand and warp
# Dynamic shared memory of one block: the opt-in limit of sm_86 and sm_89 (sm_80 allows 163 KiB,
# sm_90 227 KiB). A launch whose warps need more together gets fewer warps per block.
MAX_BLOCK_SHARED_BYTES = 99 * 1024
MAX_REDUCE_ACCUMULATORS = 64
TARGET_WARPS = 8192  # float32 warps an H100 runs at once (half in float64): fewer tiles spread their slots
MAX_GROUPS = 32
# The convolution's atomic forward by destination holds every path's z chunk of an x block in
# registers across edges. In float64 that took 240 registers (8 warps per SM) on mace-l2-c128;
# groups of paths with at most 24 z components together took 0.81-0.98x the time on four configs
# (H100). In float32 grouping was slower on three of the four (up to 1.51x), and so was the
# deterministic forward (owned runs) on most: they keep whole blocks. Since the look-ahead ring
# took the next edge out of the registers, whole blocks are faster again on passes of a few
# hundred CG terms: the float64 atomic forward took 0.92x the time on mace-l2-c128 (351 terms),
# 0.955x on mace-large (215), 1.00x on sevennet-l3-c32 (611), against 1.01x on
# nequip-revmd17-benzene (1,222) and 1.64x on l5-c32 (5,265) (H100, same process;
# benchmarks/results/nvidia-h100-80gb-hbm3/scatter-groups/). So only passes of more than
# SCATTER_Z_MIN_TERMS CG terms walk in groups.
SCATTER_Z_COMPONENTS = {8: 24}  # by item size
SCATTER_Z_MIN_TERMS = 1000
# Either forward by destination, in either dtype, holds at most this many z components of an x
# block at once: l <= 5 blocks have up to 174, which spilled (18.8 KB per thread in float64).
# The other public configs' blocks have at most 51, so their walks keep whole blocks.
MAX_Z_COMPONENTS = 64
# A forward walk by destination with the look-ahead ring walks consecutive x blocks of equal ``mul``
# together (one pass over the edges for each chunk, one ring slot per edge holding all of their x
# chunks and weights) while their z chunks take at most MERGED_WALK_Z_COMPONENTS components. Each
# walk of a chunk pays for the ring's fill and, per edge, for the wait, the index shuffles and the
# y loads: splitting mace-l2-c128's 2e block in two (MAX_Z_COMPONENTS 40) took its conv_fwd 1.09x
# and 1.12x the time. Merged up to 64 against each block alone (H200, same process, 3 rounds;
# benchmarks/results/nvidia-h200/merged-walks/): the deterministic conv_fwd 0.81-0.97x on six uvu
# configs in float32 and 0.84-1.00x in float64 (mace-l2-c128 0.965x and 0.917x, nequip-lips 0.86x
# and 0.85x, mace-medium 0.81x and 0.88x), the atomic one 0.79-0.96x and 0.82-1.00x;
# nequip-revmd17-benzene's atomic walk merges two of its eight blocks (0.98x and 0.995x) and its
# deterministic one, in lockstep, none (1.01x). Up to 40 gained less (0.79-1.01x): it merges fewer.
# Up to 72 merges mace-large's three blocks (71 components): 0.90x and 0.91x the time of 64 (atomic,
# float32 and float64), at 159 and 252 registers; nequip-revmd17-benzene's float32 walk then merges
# its 0o, 0e and 1o blocks (71) at the same 168 registers: 1.011x. Up to 96 would also merge its 3o
# and 3e blocks (90), at 254 registers: 1.056x.
MERGED_WALK_Z_COMPONENTS = 72
# The backward walks by destination (not in lockstep) take consecutive x blocks of equal ``mul``
# together the same way while the group's z̄ chunks take at most MERGED_BACKWARD_WALK_Z_COMPONENTS
# components and its x rows at most MERGED_BACKWARD_WALK_X_COMPONENTS (by item size; none where
# absent): one pass over the edges stages all of their z̄ chunks and sums each edge's ȳ once, and
# each block keeps its x registers and x̄ sums. Against each block alone (H200, same process, 3
# rounds; benchmarks/results/nvidia-h200/merged-backward-walks/), up to 64 components:
# float32 conv_bwd 0.86-0.95x and conv_dbwd 0.91-0.97x on six uvu configs (deterministic 0.88-0.98x
# and 0.91-0.94x), except mace-l2-c128's atomic conv_bwd, 1.03x at the same 127 registers. In
# float64 the x registers decide: nequip-lips' groups of four and two blocks took 255 registers
# instead of 157 (conv_bwd 1.05x, conv_dbwd 1.07x), nequip-l2-c32's three blocks 255 instead of 155
# (1.00x, 1.04x), while groups of 4 x components (0e and 1o) gained: 0.85-0.99x on the same six
# (mace-l2-c128 0.93x and 0.935x, nequip-lips 0.96x, nequip-l2-c32 0.95x and 0.93x). Groups whose
# staged z̄ chunks would leave fewer warps per block in MAX_BLOCK_SHARED_BYTES stay apart
# (:func:`_merged_backward_walk`): sevennet-l3-c32's float64 conv_bwd with 3 warps took 1.23x.
MERGED_BACKWARD_WALK_Z_COMPONENTS = {4: 64, 8: 64}
MERGED_BACKWARD_WALK_X_COMPONENTS = {8: 4}
# A joint pass transposes each output chunk through shared memory, so that the warp writes whole
# rows of e3nn's mul_ir layout. The deterministic forward by destination writes each node's z row
# once, after the node's edges, and lane by lane (strided) it took 0.88-1.01x the time on the
# uvu public configs (mace-l2-c128 0.93-0.95x, sevennet-l3-c32 0.88-0.91x; H100, same process),
# without the buffer's round trip and the two warp barriers of each path. Where writes are most of
# the bytes the transposition wins: strided, the product's forward (a z row per edge) took
# 1.1-2.7x the time and the atomic forward by destination 1.2-1.6x; the deterministic backward's
# x̄ rows by src changed by -4% to +2% and keep it
# (benchmarks/results/nvidia-h100-80gb-hbm3/lane-writes/).
LANE_WRITES = ("own",)  # z flushes written lane by lane
# The flushes whose output chunks are transposed in registers by warp shuffles
# (``cgtp_transpose_rows``: d shuffles and d log2 d selects per chunk of d components) instead of
# through the warp's shared buffer (d stores, a barrier, d loads): the product forward's profile
# spends 9.6 of its 29 cycles per issued instruction on shared-memory stalls (MIO throttle, short
# scoreboard) that cuEq's does not have (benchmarks/results/nvidia-h200/fwd-profile/). Measured
# (H200, same process, 50 rows): 0.93-1.20x the time, at most 0.976x on a product forward, with
# 33-48% more registers, and slower on long code (benchmarks/results/nvidia-h200/shuffle-transpose/).
SHUFFLE_TRANSPOSE: tuple[str, ...] = ()
# The product's forward pass hands each tile of edges to a group of warps, warp g running the
# chunks g, g + CHUNK_WARPS, ... of every x block, instead of a warp per tile running all of them:
# the group then writes a path's z block (up to 4 chunks) together. Copy kernels with mace-l2-c128's
# bytes and write order took 1.96 ms with four warps per edge against 2.11 ms with one (the
# product forward's own time), and 1.88 ms writing each row in address order
# (benchmarks/results/nvidia-h200/write-order/). The forward with four warps against one (H200, same
# process): 0.913-0.921x the time on the float32 rows of mace-l2-c128, mace-large, mace-medium and
# nequip-revmd17-benzene, 0.943-0.973x on mace-l2-c128's, mace-medium's and mace-large's float64
# (benzene's: 0.996x); two warps gained less (0.915-0.989x). Blocks of 32 channels (one chunk) keep a warp per tile.
# 0: a warp per tile.
CHUNK_WARPS = 4
# A product forward's tile is shared further among PATH_WARPS parts of its paths (balanced by the
# bytes they move: a z block and a weight per channel): warp g runs the chunks of CHUNK_WARPS
# (g mod the chunk warps) of the paths of part g / the chunk warps, so that more warps write the
# edge's row together (one chunk per block: the paths alone). The group's warps share a block,
# which grows to hold them (at most MAX_TILE_GROUP). In the copy kernels of write-order/, a
# 768-thread block per edge wrote its rows in 0.95x the time of four warps per edge. 0: no parts.
# Measured (H100, same process, 1203289): four parts of blocks of one chunk (groups of 4 warps)
# took 0.960-0.964x the float32 forward's time on nequip-lips, nequip-l2-c32 and sevennet-l3-c32
# (0.972-0.976x in float64); groups of 8 and 16 warps took mace-medium's 1.07x and 1.21-1.27x,
# mace-large's 0.98-0.99x and 1.03-1.04x (benchmarks/results/nvidia-h100-80gb-hbm3/tile-groups/).
# Hence groups of at most MAX_TILE_GROUP = 4 warps: the parts fill the chunk warps' group to four.
PATH_WARPS = 4
MAX_TILE_GROUP = 4
# A convolution forward that walks destination runs a warp per run (z rows owned) shares each run
# among WALK_CHUNK_WARPS warps of a block instead, each running every WALK_CHUNK_WARPS-th chunk, as
# CHUNK_WARPS does for the product: the group reads an edge's weight row and gathered x row
# together. The runs of a group are one run, so its warps end together. 0: a warp per run.
# Measured (H100, same process, 1203289): 0.902-0.903x the atomic conv_fwd's time on mace-l2-c128,
# 0.91-0.95x on mace-medium's, 0.93x on mace-large's float32 (its float64 forward does not walk);
# the 32-channel configs' kernels are unchanged (benchmarks/results/nvidia-h100-80gb-hbm3/tile-groups/);
# the deterministic conv_fwd 0.89-0.93x (cd2c36b). The backward walks' tiles shared among a block of four
# chunk warps, ȳ summed over their partial rows, took 1.01-1.15x the conv_bwd's time and 0.98-1.10x the
# conv_dbwd's on the same configs (tile-groups/backward-chunk-warps.patch), so those walks keep a warp per tile.
WALK_CHUNK_WARPS = 4
# ... and among WALK_PATH_WARPS parts of its paths, as PATH_WARPS does for the product (for blocks of
# 32 channels, the paths alone): each warp holds the z chunks of its part's paths. 0: no parts.
# Measured (H100, same process, 1203289), four parts with four chunk warps: 1.33-3.2x the atomic
# conv_fwd's time on the 32-channel walks (nequip-lips 1.86x, sevennet-l3-c32 3.2x in float32;
# twice the SASS); the 128-channel walks' groups of 16 did not fit a block's shared memory.
WALK_PATH_WARPS = 0
# The product's joint passes hold the edge's y components in registers when it has at most this
# many (spherical harmonics up to l = 3): 0.93-0.96x the float32 backward's time on three configs
# (H100). With l <= 5 (36 components) they pushed its backward from 168 to 255 registers, spilled.
EDGE_Y_REGISTERS = 16
# A joint pass with more CG code than this (its paths' nonzeros times its terms) does not fit in the
# SM's instruction cache: l5-c32's product (5,265 for the forward, 15,795 for the fused backward)
# spent 16 of 25 and 9 of 16 cycles per issued instruction waiting for instructions (H100). Such
# a pass walks the tile's edges inside each group of paths of at most WALK_GROUP_TERMS, so that
# the group's code serves every edge of the tile in turn. The other public configs' passes of one
# term have at most 1,222 (nequip-revmd17-benzene's). On l5-c32 (H100, float32, 50,000 edges),
# groups of 512, 1,024, 2,048 and 4,096 terms took the product's backward 7.7, 6.7, 8.7 and 9.4 ms
# (9.5 before) and its forward 2.6, 2.5, 2.5 and 2.5 (3.7 before). The convolution's walks, which
# hold a group's z chunks or z̄ staging across edges, did best with 512: 1.31, 5.26 and 5.89 ms
# for conv_fwd, conv_bwd and conv_dbwd, against 1.63, 5.60 and 6.39 with 1,024 (1.63, 7.95 and
# 7.68 before). Tiles of 16 edges, against 32, took the product's fused backward 0.73-0.77x the time
# (its 255 registers leave 8 warps per SM, and 32-edge tiles end in a partial wave), its double
# backward 0.91-1.02x, every float64 pass 0.84-0.92x, and the float32 forward 1.06x.
# A pass of several terms (the fused backward, x̄ and w̄ of the double backward) gains from the walk
# well below that: walking above MULTI_TERM_WALK_TERMS took the fused backward of
# nequip-revmd17-benzene (3,666 terms) 0.61-0.65x its time, mace-l2-c128's (1,053) 0.89-0.92x,
# sevennet-l3-c32's (1,833) 0.87x in float64 (1.02x in float32), and the double backward 0.77-0.98x
# (H100, same call). Passes of one term lost 2-8% when they walked from 600 or 1,000 terms, and a
# fused backward of 822 terms (nequip-lips) 7% in float32.
# A convolution's pass always walks; it splits its x blocks into groups of at most
# WALK_GROUP_TERMS_BY_DESTINATION above GROUPED_TERMS_BY_DESTINATION (groups made
# nequip-revmd17-benzene's conv_bwd, 3,666 terms, 1.21x slower in float32).
# Since the backward's terms sum through z̄ (codegen_joint._PathCG), the atomic backward (x̄ added
# atomically by src) of l5-c32 walks best in groups of WIDE_GROUP_TERMS_BY_DESTINATION: its fused
# backward took 14.2, 4.3, 4.0, 6.6 and 13.4 ms in float32 with groups of 512, 768, 1,024, 1,536
# and 2,048 terms, and 15.5, 4.7 and 4.4 ms in float64 with 512, 768 and 1,024. The double
# backward's x̄ + w̄ pass (two terms) took 0.64x its time with 1,024 in float64 but 1.07x in float32,
# and its ȳ pass (one term) 1.23-1.39x. The deterministic fused backward (x̄ owned by src) took
# 1.32x with 1,024 in float32 (H100, same process; benchmarks/results/.../wide-groups), but 0.82x
# in float64 (24.1 -> 19.7 ms, and 29.4 with 2,048; 1.35x in float32), while the deterministic
# double backward's x̄ + w̄ pass took 1.30x (9.8 -> 12.8 ms, float64; .../det-wide-groups). So a
# pass that owns x̄ walks wide groups in float64 from three terms (WIDE_GROUP_MIN_OWNED_TERMS).
WALK_TERMS = 4096
MULTI_TERM_WALK_TERMS = 1000
WALK_GROUP_TERMS = 1024
GROUPED_TERMS_BY_DESTINATION = 4096
WALK_GROUP_TERMS_BY_DESTINATION = 512
WIDE_GROUP_TERMS_BY_DESTINATION = 1024
WIDE_GROUP_MIN_TERMS = {4: 3, 8: 2}  # by item size: 3 terms in float32, 2 in float64
WIDE_GROUP_MIN_OWNED_TERMS = {8: 3}  # by item size: 3 terms in float64, never in float32
# A deterministic backward's walk by destination in slices (DETERMINISTIC_BACKWARD_SLICE_BYTES)
# stores x̄ to each edge's row of the slice, and adds to it in every later group of the x block:
# rows in DRAM, where the atomic walk adds to L2-resident x̄ rows. l5-c32's conv_bwd (three terms)
# took 0.909x (float64) and 0.859x (float32) the time with groups of 1,536 terms against 1,024,
# and 1.29x and 2.22x with 2,048 (H100, same process; benchmarks/results/.../det-slices/).
SLICE_GROUP_TERMS_BY_DESTINATION = 1536
SLICE_GROUP_MIN_TERMS = 3
WALK_TILE = 16  # edges per tile of a product's walk
# A convolution's launch of z next to x̄, ȳ and w̄ (the force loss's second derivative when x, y
# and w all depend on the positions: 9 terms) keeps them in one walk by destination only up to
# this many CG terms; above it z gets a walk of its own. Apart, the float32 conv_train took 0.62x
# the time on nequip-revmd17-benzene (10,998 terms: 27.6 -> 17.0 ms; together, 238 registers and
# warps stalled on instruction fetch), 0.86x on sevennet-l3-c32 (5,499), 0.98x on mace-l2-c128
# (3,159), but 1.10x on nequip-l2-c32 (1,233) (H200, same process; results/nvidia-h200/z-apart).
Z_WITH_BACKWARD_MAX_TERMS = 2048
# They load the weights of a chunk's weighted paths at once, in batches of at most this many
# registers (12 paths in float64), so that l <= 5 blocks (24 paths) do not spill.
CHUNK_WEIGHT_REGISTERS = 24
# The convolution's walks by destination run one wave: the grid is capped at the blocks the GPU
# holds at once (the launcher asks the driver), and the warps share the edges evenly, in rounds of
# one tile each of at most ``tile`` edges (spans of at least FILL_MIN_SPAN). With a fixed 32-edge
# tile per warp, their launches of 100,000 edges ran 0.59-1.97 waves on an H100: a second wave of
# a few blocks, or SMs left with free warp slots. One wave of whole tiles was slower than even
# spans, and the product's walks and weight streams lost 0-10% in one wave (H100).
FILL_GRID = True
FILL_MIN_SPAN = 8
# The atomic convolution's forward, where it walks ``dst`` runs (:func:`owned_forward_is_faster`),
# walks at most OWNED_RUN_CAP edges of each run in the node's warp; a second launch over the grouped
# edges, on every warp, adds the rest of the longer runs atomically. Without the cap one warp walks a
# node's every edge: a padding node that takes a padded batch's spare edges (jraph's
# ``pad_with_graphs``) or a hub of thousands would take as long as the rest of the graph together.
# H100, seven uvu configs, cap 256: 28-31x faster on the benchmark's padded graph (an eighth of the
# edges on one node); 0.95-1.0x on random graphs (tiny-uvu 0.87-0.94x: 6-9 us of a 0.06-0.1 ms
# call). The capped walk of the padding node is then the critical path: on the padded graph cap 128
# took 0.67-0.69x cap 256's time and cap 64 0.53-0.55x (mace-l2-c128, tiny-uvu). 128 leaves whole
# the runs of dense neighbour lists: on the benchmark's dense graph (32-96 edges per node; H200) cap
# 64 took 1.06x cap 128's time on mace-l2-c128 and 1.01x on nequip-l2-c32, cap 256 1.00x.
OWNED_RUN_CAP = 128
# The walk past the cap, given offsets that end with the longest run (the grouping's), returns at
# once where no run is longer than the cap, instead of reading every edge's position, index and run
# start to find none (H200: 4.0 us of nequip-l2-c32's float64 call under Nsight Compute; 1-2 us less
# per call on four of five rows in a same-process A/B, benchmarks/results/nvidia-h200/longest-run/).
EXIT_WITHOUT_LONG_RUNS = True
# The atomic convolution's forward walks ``dst`` runs (one warp per node) where the graph has at
# least OWNED_FORWARD_MIN_NODES destination nodes (by kernel dtype) at OWNED_FORWARD_RUN_EDGES edges
# per node on average, and proportionally more at more edges per node. Elsewhere the plain atomic
# forward, which spreads the edges evenly over every warp the GPU holds, is faster: on few nodes too
# few warps walk, and long runs keep each of them walking. H200, same-process A/B (benchmarks/
# results/nvidia-h200/node-threshold/), the atomic forward's time over the walk's on four to six uvu
# configs: 16 edges per node, float32 0.80-0.93x at 1,562 nodes, 0.91-1.01x at 3,125, 0.97-1.07x at
# 4,687 and 1.03-1.13x at 6,250; float64 0.91-1.00x at 1,562 and 0.98-1.11x at 3,125. 64 edges per
# node (the dense graph, runs of 32 to 96), float32: 0.48-0.62x at 781 nodes, 0.71-0.74x at 1,562,
# 0.73-0.88x at 3,125, 0.88-1.00x at 6,250, 0.96-1.12x at 12,500 and 0.96-1.20x at 25,000 (three of
# four above 1.05); float64 0.66-0.79x at 1,562 and 0.77-0.83x at 3,125.
OWNED_FORWARD_MIN_NODES = {"float": 4096, "double": 2048}
OWNED_FORWARD_RUN_EDGES = 16
# A deterministic walk over sorted runs walks each run's first RUN_CHUNK edges; a second launch walks
# the later chunks of RUN_CHUNK edges, one warp each, into rows of their own, and a third adds those
# to the node's row in chunk order: the sums keep one order whatever the warps' timing. H100, padded
# graph: mace-l2-c128's conv_fwd 2.05 ms and conv_bwd 4.58 ms (whole runs, in an earlier run: 67.5
# and 111 ms; chunks of 64: 0.65x and 0.75x the time of 128, of 256: 1.66x and 1.50x); random graph
# (no run longer than a chunk): 0.97-1.0x whole runs' speed, tiny-uvu 0.70x and 0.93x (+26, +6 us).
# Dense graph (32-96 edges per node; H200): chunks of 64 took 1.04x and 1.06x the time of 128.
RUN_CHUNK = 128
# A deterministic backward by source gathers each edge's z̄[dst] row, which is 5.7-21x wider than
# x (benchmarks/results/nvidia-h100-80gb-hbm3/conv-train/). It walks by destination instead, as
# the atomic backward does, staging z̄ once per node, in slices of dst-sorted positions whose x̄
# rows (one per edge) take at most this many bytes (0: walk by source): each edge's x̄ goes to the
# slice's row for it, and the next launches add those rows to the sources, run by run in
# src-sorted order (bitwise the same at every call). The rows are a bounded workspace: an
# (edges x dim of x) array only for a graph below the cap (1.13-1.27x the atomic backward's
# buffers on the public suite), slices of it above. H100, float32, 100k edges, slices of 64k edges against the walk by source
# (benchmarks/results/nvidia-h100-80gb-hbm3/det-slices/): conv_bwd 0.52-0.72x, conv_dbwd
# 0.69-0.88x, conv_train 0.86-0.91x; each slice re-reads the sources' runs, so fewer slices are
# faster (16k, 32k, 128k rows: 1.10-1.35x, 1.04-1.15x, 0.93-0.96x the time of 64k). The first
# slice's walk writes each edge's dst-sorted position (was a scatter, two XLA launches) and the sum
# takes each run's first chunk and the later chunks in one launch (was two): conv_bwd 0.967-1.000x
# (five public configs, both dtypes, det-sum-ahead/). What is left above the atomic backward is
# mostly the rows' own traffic, written once and read once.
DETERMINISTIC_BACKWARD_SLICE_BYTES = 512 << 20
# A slice sum's warp adds the columns of at most this many 32-column blocks of each row: one warp
# finds a run's edges for all of them, and a row's loads are in flight at once.
SLICE_SUM_GROUP_BLOCKS = 12
# A slice sum's warp loads the group's columns of as many rows as keep at most this many values in
# flight per lane, then adds them in order (the rows are read once, from DRAM). H100, conv_bwd,
# same process, against one row at a time: 2 rows 0.975-0.981x in float64 (nequip-l2-c32,
# mace-medium, nequip-lips), 0.99-1.005x in float32 (nequip-lips, mace-large); 4 rows 0.959-0.976x
# in float64 but 1.029x on mace-large float32 (12 blocks per group: 48 values in flight).
SLICE_SUM_LOADS_IN_FLIGHT = 32
# A deterministic walk over sorted runs gives each warp one node's run, and the runs differ in
# length, so free-running warps drift apart in the kernel's code. Where the code does not fit in
# the SM's instruction cache, each warp then fetches its own instructions: l5-c32's forward and
# nequip-revmd17-benzene's backward (410 and 244 KB of code, NVRTC for sm_90) spent 29.5 of 32.2
# and 16.1 of 19.0 cycles per issued instruction waiting for an instruction fetch, against 4.9
# cycles in all for the atomic walks, whose warps run equal spans in step (H100). Above T CG
# terms (JointPass.cg_terms) of a ``(T, W)`` step of LOCKSTEP_WARPS, blocks of W warps walk
# consecutive runs together and meet at a barrier before each group of paths, so that one fetch of
# a group's code serves them all; below the first step, one free warp per block. Measured (H100,
# same process, time in lockstep over one free warp per block): l5-c32 (5,265-15,795 terms)
# 0.19-0.32x with 8 warps and 0.34-0.43x with 4 in float32; nequip-revmd17-benzene's backward
# (3,666) 0.45x with 8, 0.54x with 4, its forward (1,222) 0.66x with 4, 0.83x with 8;
# sevennet-l3-c32's backward (1,833) 0.74-0.82x; nequip-lips' (822) 0.85x (float64) and 0.96x with
# 4. Below 800 terms the barrier's wait for the block's longest run costs more than it saves:
# 1.04-1.07x on the forwards of sevennet-l3-c32 (611) and mace-l2-c128 (351) and the backwards of
# nequip-l2-c32 (411) and mace-medium (174), 0.98-1.00x on mace-large's backward (645).
LOCKSTEP_WARPS = ((800, 4), (2048, 8))
# A deterministic forward whose walk over dst runs would run in lockstep walks the atomic forward's
# tiles of TILE_INDEXED dst-sorted edges instead (:func:`_tiled_forward`): free warps with the
# look-ahead ring and the merged blocks, no atomics. A run inside a tile is stored as its node's row,
# a run that crosses a tile's edge goes to a partial row of the tile, and a second launch writes
# each crossing node's row as the sum of its partial rows in tile order. The lockstep walk waits at
# each barrier for the longest run of its block, and has neither the ring nor the merged blocks. H200,
# random graph, every peer in one process (benchmarks/results/nvidia-h200/det-forward-tiled/): the
# deterministic forward of nequip-revmd17-benzene took 1.05x the atomic one's time in float32 and
# 1.16x in float64 (lockstep: 1.53x and 1.27x), l5-c32's 1.34x and, in another run of the same
# kernels, 1.22x in float32 (1.49x), 1.10x in float64. The partial rows
# take two z rows per tile (benzene: 476 MiB of temporaries in float32, was 60 MiB). They grow with
# the edges: a graph whose partial rows would take more than TILED_FORWARD_MAX_BYTES keeps the
# lockstep walk, which needs none.
TILED_DETERMINISTIC_FORWARD = True
TILED_FORWARD_MAX_BYTES = 1 << 30
# ptxas holds many kernels at 128 registers (16 warps per SM at 128 threads per block) where their code
# would take more. Free-running warps of a walk over long code then sit at different places in it
# and miss the instruction cache: nequip-revmd17-benzene's float32 atomic conv_bwd (3,666 terms) at
# 128 registers waited 3.39 cycles per issued instruction for a fetch, against 0.65 at 167 (H200).
# A free-running walk (not lockstep) of more than ROOMY_WALK_TERMS CG terms, and at most WALK_TERMS
# (the range measured), is compiled with one block per SM as ptxas' occupancy target
# (``__launch_bounds__(block, 1)``), so it keeps the registers its code needs. Measured against
# ptxas' own target (H200, same call, float32): 0.75-0.87x the time of nequip-revmd17-benzene's conv_fwd
# (1,222 terms), conv_bwd and bwd (3,666) and sevennet-l3-c32's bwd (1,833); equal on its conv_bwd;
# 1.01-1.07x on mace-l2-c128's bwd and conv_bwd (1,053), and 1.24x on the deterministic
# lockstep conv_bwd of nequip-revmd17-benzene (benchmarks/results/nvidia-h200/full-chunks/).
ROOMY_WALK_TERMS = 1100
# A float32 forward walk in groups of paths (_registers_ahead: l5-c32's, 168 registers) is compiled
# with GROUPED_FORWARD_BLOCKS blocks of 128 threads per SM as ptxas' occupancy target (at most 170
# registers): its sums in units of a path's common magnitude (codegen_joint.FOLD_CG_FORWARD) took
# 225 registers at ptxas' own target, 8 warps per SM instead of 12, and 1.16x the time (H100).
GROUPED_FORWARD_BLOCKS = 3
# The convolution's forward walk loads each edge's x chunk and weights AHEAD_DEPTH edges ahead,
# copied asynchronously (cp.async) into a ring of AHEAD_DEPTH + 1 shared-memory slots per warp (0:
# the next edge into registers, as the other walks do). The registers that held the next edge's
# operands are free (mace-l2-c128 in float32: 160 to 128 registers). Measured on an H100 (same
# process, interleaved; time with depth 2 over the next edge in registers): the deterministic
# forward 0.76-0.92x on every uvu public config in both dtypes but nequip-revmd17-benzene's float32
# one (1.03x, a lockstep walk); the atomic forward 0.78-1.02x, and 1.04-1.10x on nequip-l2-c32
# (80 to 96 registers). Depth 2 was the fastest of 1, 2 and 3 on 8 of the 14 atomic rows.
# Walks in lockstep (long code) keep the registers: their blocks' warps share the shared memory
# (l5-c32's float64 ring would leave room for 7 of 8), and nequip-revmd17-benzene's float32 one
# took 1.03x its time. So does a float32 atomic walk in groups of paths (long code): l5-c32's
# conv_fwd took 3.78 ms with depth 2, 2.85 with 3 and 2.23 with the registers (same process,
# H100), at the same 168 registers; in float64 its ring is faster (2.48 ms against 2.62).
# (Nsight Compute: 3.3 of its 6.1 cycles per issued instruction waiting on instruction fetch.)
# Depth 3 against 2 in the deterministic forward: 0.94-1.02x on six uvu configs in both dtypes
# (0.97x and 0.99x on mace-l2-c128); in the atomic one 0.96-1.04x, and 1.13x on l5-c32 in float64.
# The backward walks keep the registers: the ring (x chunks when the source changes, weights, and in
# the deterministic walk over runs by source the z̄ chunks when the destination changes) took the
# atomic conv_bwd 1.03-1.34x the time on seven uvu configs and the deterministic one 1.04-1.69x at
# depth 2 (depth 1: 1.03-1.34x and 1.01-1.39x), H100. Their registers hold accumulators more than
# the next edge (mace-l2-c128's float32 atomic backward: 128 either way), and the slots cost warps.
# The deterministic forward (each warp walks the run of a node it owns) looks OWNED_AHEAD_DEPTH
# edges ahead. Measured again at 268d3e4 (H100, same process, 5 rounds; time with depth 3 over
# depth 2): 0.955-1.015x on six uvu configs in float32 and 0.964-0.996x in float64, geometric
# means 0.988x and 0.985x, mace-l2-c128 0.955x and 0.977x; the atomic forward 1.009-1.015x in
# float32 and 0.969-1.003x in float64 (benchmarks/results/nvidia-h100-80gb-hbm3/owned-depth/).
AHEAD_DEPTH = 2
OWNED_AHEAD_DEPTH = 3
# The ring's copies move AHEAD_COPY_BYTES per lane and instruction (cp.async.cg of 16 bytes: four
# float32 or two float64 elements) where a block's chunks are whole and every row, block and
# weight offset is a multiple of that width, as in the public configs; elsewhere, and at 0, one
# element per lane (cp.async of 4 or 8 bytes). XLA aligns every buffer it hands a custom call to at
# least 16 bytes. H100, conv_fwd, same process, 5 rounds, time with 16 bytes over elements: float32
# 0.90-0.96x on six uvu configs, atomic and deterministic (geometric means 0.949x and 0.943x);
# float64 0.91-0.96x on nequip-l2-c32, nequip-lips, mace-large and l5-c32, 1.00x on mace-l2-c128,
# 1.01-1.02x on mace-medium and sevennet-l3-c32 (benchmarks/results/nvidia-h100-80gb-hbm3/ring-vectors/).
AHEAD_COPY_BYTES = 16
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
        deterministic forward by destination (see :data:`LANE_WRITES`)."""
        return self.role == "z" and self.flush in LANE_WRITES

    @property
    def shuffled(self) -> bool:
        """Whether its chunks are transposed by warp shuffles, not through the warp's buffer
        (see :data:`SHUFFLE_TRANSPOSE`)."""
        return self.flush in SHUFFLE_TRANSPOSE

    @property
    def buffered(self) -> bool:
        """Whether a joint pass's chunks of it pass through the warp's transposition buffer."""
        return not self.lane_writes and not self.shuffled


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
    # one wave (FILL_GRID): the launcher caps the grid at the GPU's resident blocks, and the
    # kernel spreads the edges evenly over the warps it got, in spans of at most ``tile`` edges
    fill: bool = False
    # a walk over sorted runs whose block's warps walk consecutive runs in step (LOCKSTEP_WARPS)
    lockstep: bool = False
    # a forward walk's look-ahead: edges loaded ahead into the ``ahead`` ring (0: the next, in registers)
    ahead: int = 0
    # bytes per lane of the ring's copies where a block allows them (:meth:`ring_copy_width`; 0: elements)
    ahead_copy_bytes: int = 0
    # the blocks per SM ptxas aims at, not its own register target (0: its own; 1: ROOMY_WALK_TERMS,
    # GROUPED_FORWARD_BLOCKS)
    min_blocks: int = 0
    # a walk over sorted runs that walks at most this many edges of each run (0: all); the launches
    # after it add the rest (``beyond_cap``: OWNED_RUN_CAP; ``chunk_walk``, ``chunk_sum``: RUN_CHUNK)
    run_cap: int = 0
    # the warps sharing each tile of a product forward (CHUNK_WARPS) or run of a forward walk
    # (WALK_CHUNK_WARPS), warp g running chunks g, g + chunk_warps, ... of every x block; 0: a warp each
    chunk_warps: int = 0
    # the part (PATH_WARPS, WALK_PATH_WARPS) of a forward's paths that each path belongs to, in the order
    # of ``joint.blocks``: warp g of the tile's group runs part g / max(chunk_warps, 1); empty: one part
    path_groups: tuple[int, ...] = ()
    # a launch over a walk's sorted edges that adds those at this rank or later in their run (in the
    # walked role's order) to the outputs the capped walk wrote: its outputs start as those (0: none)
    beyond_cap: int = 0
    # a walk past the cap whose offsets end with the longest run (``rows + 2`` entries, as
    # :func:`jax_cgtp.grouping.group_edges` gives them): it returns at once where no run is longer
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
        """A slice sum's groups of 32-column blocks of x̄ (SLICE_SUM_GROUP_BLOCKS), a warp per group."""
        return -(-self.outputs[0].dim // (WARP * SLICE_SUM_GROUP_BLOCKS))

    @property
    def slice_sum_group_blocks(self) -> int:
        """The 32-column blocks of each of a slice sum's groups (the last may have fewer columns)."""
        return -(-self.outputs[0].dim // (WARP * self.slice_sum_groups))

    @property
    def slice_sum_rows_ahead(self) -> int:
        """The rows whose columns a slice sum's warp loads before adding them (SLICE_SUM_LOADS_IN_FLIGHT)."""
        return max(1, SLICE_SUM_LOADS_IN_FLIGHT // self.slice_sum_group_blocks)

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
            warps = -(-num_edges // min(self.tile, FILL_MIN_SPAN))
        else:
            warps = self.tiles(num_edges, num_segments) * self.num_groups
        blocks = -(-warps // self.warps_per_block)
        return max(0, min(blocks, self.max_blocks))

    @property
    def max_blocks(self) -> int:
        return MAX_PARTIAL_BLOCKS if self.has_partials else MAX_BLOCKS * WARPS_PER_BLOCK // self.warps_per_block

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
        staged = row > 1 and WARP * stage_width(row) * itemsize <= MAX_STAGE_BYTES
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
    reduce = mul < WARP and all(contracted) and mul < widest and mul * dim <= MAX_REDUCE_ACCUMULATORS
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
    at most :data:`MAX_Z_COMPONENTS` z components, and :data:`SCATTER_Z_COMPONENTS` for the
    atomic walk in float64 of more than :data:`SCATTER_Z_MIN_TERMS` CG terms. A product's pass
    of more than :data:`WALK_TERMS` CG terms (:data:`MULTI_TERM_WALK_TERMS` with several terms)
    walks the tile's edges too, in groups of at most :data:`WALK_GROUP_TERMS`; a convolution's
    pass of more than :data:`GROUPED_TERMS_BY_DESTINATION` walks in groups of at most
    :data:`WALK_GROUP_TERMS_BY_DESTINATION` (:data:`WIDE_GROUP_TERMS_BY_DESTINATION` for a backward
    that adds x̄ atomically with at least :data:`WIDE_GROUP_MIN_TERMS` terms, or owns it with at
    least :data:`WIDE_GROUP_MIN_OWNED_TERMS`).
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
    limits = []
    if set(roles) == {"z"} and by_destination:
        limit = _z_components(outputs[0].flush, total, itemsize, MAX_Z_COMPONENTS)
        limits.append(lambda group: sum(p.z_dim for p in group) <= limit)
    if by_destination and total > GROUPED_TERMS_BY_DESTINATION:
        x_flush = next((o.flush for o in outputs if o.role == "x"), None)
        minimum = {"atomic": WIDE_GROUP_MIN_TERMS, "own": WIDE_GROUP_MIN_OWNED_TERMS,
                   "slice": WIDE_GROUP_MIN_TERMS}.get(x_flush, {}).get(itemsize)
        wide = minimum is not None and len(terms) >= minimum
        group_terms = WIDE_GROUP_TERMS_BY_DESTINATION if wide else WALK_GROUP_TERMS_BY_DESTINATION
        if x_flush == "slice" and len(terms) >= SLICE_GROUP_MIN_TERMS:
            group_terms = SLICE_GROUP_TERMS_BY_DESTINATION
        limits.append(lambda group: code(group) <= group_terms)
    walk = by_destination or total > (WALK_TERMS if len(terms) == 1 else MULTI_TERM_WALK_TERMS)
    if walk and not by_destination:
        limits.append(lambda group: code(group) <= WALK_GROUP_TERMS)
    blocks = _split_paths(blocks, lambda group: all(fits(group) for fits in limits))
    y_blocks = sorted({(p.y_offset, p.y_dim) for _, _, _, paths in blocks for p in paths})
    return JointPass(tuple(sorted(roles.items())), arrays, tuple(blocks), tuple(y_blocks), terms, by_destination,
                     walk)


def _z_components(flush: str, cg_terms: int, itemsize: int, limit: int) -> int:
    """The most z components a forward walk by destination holds at once, at most ``limit``: fewer
    (SCATTER_Z_COMPONENTS) in an atomic walk of more than SCATTER_Z_MIN_TERMS CG terms."""
    if flush == "atomic" and cg_terms > SCATTER_Z_MIN_TERMS:
        return min(limit, SCATTER_Z_COMPONENTS.get(itemsize, limit))
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


def _walk_groups(joint: JointPass, limit: int, x_limit: int | None = None) -> tuple[tuple[int, ...], ...]:
    """Consecutive blocks of equal ``mul`` walked as one group while their z chunks take at most
    ``limit`` components together (MERGED_WALK_Z_COMPONENTS), and their x rows at most ``x_limit``
    (None: any number): the fewest groups, and of those the partition whose widest group is
    narrowest (fewest registers). A pass split by the size of its code keeps its groups apart."""
    if joint.cg_terms > GROUPED_TERMS_BY_DESTINATION:
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


def _merged_backward_walk(joint: JointPass, buffers, itemsize: int) -> JointPass:
    """``joint``, a backward walk by destination, with its blocks walked in groups whose z̄ chunks
    take at most MERGED_BACKWARD_WALK_Z_COMPONENTS[itemsize] components and whose x rows at most
    MERGED_BACKWARD_WALK_X_COMPONENTS[itemsize] (where set), unless the groups' staged
    z̄ chunks would leave fewer warps per block in MAX_BLOCK_SHARED_BYTES (``buffers``: the pass's
    shared-memory elements per warp, as :func:`_joint_buffers` returns them)."""
    limit = MERGED_BACKWARD_WALK_Z_COMPONENTS.get(itemsize, 0)
    if not limit:
        return joint
    groups = _walk_groups(joint, limit, MERGED_BACKWARD_WALK_X_COMPONENTS.get(itemsize))
    merged = dataclasses.replace(joint, walk_groups=groups)

    def warps_per_block(j):
        stage, transpose, edge_sums = buffers(j)
        return _warps_in_block_shared((sum(stage.values()) + transpose + edge_sums) * itemsize, WARPS_PER_BLOCK)

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
    """The launch with as many of its warps per block as fit in :data:`MAX_BLOCK_SHARED_BYTES`
    (z̄ chunks of a wide block staged by a walk by destination: 68 KiB per warp for l5-c32 in
    float64); a ValueError naming the problem when one warp alone needs more."""
    per_warp = kernel.smem_per_warp * kernel.itemsize
    if per_warp > MAX_BLOCK_SHARED_BYTES:
        raise ValueError(
            f"jax_cgtp: a warp of this launch needs {per_warp} bytes of shared memory, more than the "
            f"{MAX_BLOCK_SHARED_BYTES} of a block, for {kernel.call.problem} in {kernel.dtype}")
    return dataclasses.replace(kernel, warps_per_block=_warps_in_block_shared(per_warp, kernel.warps_per_block))


def _warps_in_block_shared(per_warp_bytes: int, warps: int) -> int:
    """Of ``warps`` warps per block, as many as fit in MAX_BLOCK_SHARED_BYTES at ``per_warp_bytes`` each."""
    return warps if per_warp_bytes * warps <= MAX_BLOCK_SHARED_BYTES else MAX_BLOCK_SHARED_BYTES // per_warp_bytes


def _registers_ahead(joint: JointPass, itemsize: int) -> bool:
    """A float32 forward walk in groups of paths (more code than GROUPED_TERMS_BY_DESTINATION) loads
    the next edge into registers: with the ring, l5-c32's took 1.70x the time (AHEAD_DEPTH)."""
    return itemsize == 4 and joint.cg_terms > GROUPED_TERMS_BY_DESTINATION


def _lockstep_warps(joint: JointPass | None) -> int:
    """The warps per block of a walk over sorted runs that walks them in step (LOCKSTEP_WARPS), or 0."""
    if joint is None or not joint.walk:
        return 0
    return max((warps for terms, warps in LOCKSTEP_WARPS if joint.cg_terms > terms), default=0)


def _min_blocks(joint: JointPass | None, lockstep: int, registers_ahead: bool) -> int:
    """The blocks per SM ptxas aims at for a launch (0: its own target): one for a free-running walk
    of long code, which keeps the registers its code needs (ROOMY_WALK_TERMS);
    GROUPED_FORWARD_BLOCKS for a float32 forward walk in groups of paths."""
    if joint is None or not joint.walk or lockstep:
        return 0
    if registers_ahead:
        return GROUPED_FORWARD_BLOCKS
    return 1 if ROOMY_WALK_TERMS < joint.cg_terms <= WALK_TERMS else 0


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
    then apart too in an atomic launch whose pass has more than :data:`Z_WITH_BACKWARD_MAX_TERMS`
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
                                      or _pass_terms(call, outputs) <= Z_WITH_BACKWARD_MAX_TERMS):
        return [(outputs, segment_role)]
    return [([k for k in outputs if k not in z], segment_role), (z, segment_role)]


def _pass_terms(call: Call, outputs: list[int]) -> int:
    """The CG terms of one joint pass over ``outputs`` (:attr:`JointPass.cg_terms`)."""
    nonzeros = sum(len(cg_nonzeros(call.problem, ins)) for ins in call.problem.instructions if ins.is_active)
    return nonzeros * sum(len(call.outputs[k].terms) for k in outputs)


def shared_tile_for(edges: int) -> int:
    """Edges per tile of a launch with a SHARED output, for ``edges`` edges (a power of two).

    Such an output keeps one partial row per warp, and at most ``MAX_PARTIAL_BLOCKS`` blocks
    run. A 32-edge tile would leave most of those warps idle when the edges are few (the
    weight gradient of a node-level product over a small batch), so the tile shrinks until
    the edges fill them.

    >>> shared_tile_for(864), shared_tile_for(5000), shared_tile_for(10**6)
    (1, 8, 32)
    """
    warps = MAX_PARTIAL_BLOCKS * WARPS_PER_BLOCK
    tile = 1
    while tile < TILE_INDEXED and tile * warps < edges:
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


def slot_groups(slots, tiles: int, max_warps: int, itemsize: int) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """Spread ``slots`` over warps when ``tiles`` tiles would leave the GPU mostly idle.

    Units are one chunk of one slot; they go, largest first, to the least loaded of
    ``G = min(MAX_GROUPS, units, max_warps, target / tiles rounded up to a power of two)`` groups,
    with ``target = TARGET_WARPS * 4 / itemsize`` (float64 kernels hold twice the registers) and
    ``max_warps`` the most the launch's grid holds. Returns ``()`` (every warp runs every slot) when
    one group is enough.
    """
    units = [(k, c) for k, slot in enumerate(slots) for c in range(slot_chunks(slot))]
    wanted = 1
    while wanted * max(tiles, 1) < TARGET_WARPS * 4 // itemsize:
        wanted *= 2
    count = min(MAX_GROUPS, len(units), max_warps, wanted)
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
    convolution's forward by ``dst`` runs (:func:`owned_forward_is_faster`) walks each run's first
    OWNED_RUN_CAP edges, and a second launch, the atomic forward's, adds the rest. A deterministic
    forward whose walk would run in lockstep walks tiles instead (:func:`_tiled_forward`). A
    deterministic call's walks over sorted runs walk chunks of RUN_CHUNK edges (:func:`_chunked`)
    where ``edges`` is given and more than RUN_CHUNK.
    """
    sliced = _sliced(call, dtype, index_dtype, edges)
    if sliced:
        return sliced
    launches = _launches(call, dtype, index_dtype, edges)
    if not _owned_by_grouping(call):
        launches = [part for k in launches for part in _tiled_forward(call, k, dtype, index_dtype, edges)]
        if RUN_CHUNK <= 0 or edges is None or edges <= RUN_CHUNK:  # (no run is longer than edges)
            return launches
        return [part for k in launches for part in (_chunked(k, RUN_CHUNK) if _chunkable(k) else [k])]
    if OWNED_RUN_CAP <= 0 or len(launches) != 1 or launches[0].lockstep:
        return launches  # (a lockstep walk is never launched: owned_walk_is_faster picks the atomic forward)
    rest = _launches(dataclasses.replace(call, deterministic=False), dtype, index_dtype, edges)
    if len(rest) != 1:
        return launches
    return [dataclasses.replace(launches[0], run_cap=OWNED_RUN_CAP),
            dataclasses.replace(rest[0], beyond_cap=OWNED_RUN_CAP)]


def _sliced(call: Call, dtype: str, index_dtype: str, edges: int | None) -> list[KernelSchedule]:
    """A deterministic backward into x̄ by ``src`` from z̄ by ``dst`` in slices of dst-sorted
    positions (DETERMINISTIC_BACKWARD_SLICE_BYTES of x̄ rows): per slice, the atomic call's joint
    walk by destination (its call carries ``dst``'s ordering alone), x̄ of each edge to the slice's
    row for it, then a sum by source (a call carrying ``src``'s ordering) that adds the rows to the
    sources' x̄ rows, in chunks of RUN_CHUNK edges of each run where ``edges`` is more than
    RUN_CHUNK (the sum's warps take each run's first chunk and each later chunk, whose rows a
    chunk sum adds in chunk order, as :func:`_chunked`'s); [] when the setting is off or the call
    is not such a backward."""
    roles = [o.role for o in call.outputs]
    if (DETERMINISTIC_BACKWARD_SLICE_BYTES <= 0 or not call.deterministic or "z" in roles or "x" not in roles
            or call.kind("x") != INDEXED or call.kind("z") != INDEXED):
        return []
    (walk,) = _launches(dataclasses.replace(call, deterministic=False, orderings=("z",)), dtype, index_dtype, edges,
                        x_flush="slice") or [None]
    if walk is None or walk.joint is None or not walk.joint.by_destination:
        return []
    x_out = next(o for o in walk.outputs if o.role == "x")
    rows = max(1, DETERMINISTIC_BACKWARD_SLICE_BYTES // (x_out.dim * walk.itemsize))
    walk = dataclasses.replace(walk, slice_walk=rows)
    total = KernelSchedule(dataclasses.replace(call, orderings=("x",)), dtype, index_dtype,
                           (dataclasses.replace(x_out, flush="own", zero_ranges=()),),
                           (), "segments", WARP, "x", (), 0, WARPS_PER_BLOCK, slice_sum=rows)
    if RUN_CHUNK <= 0 or edges is None or edges <= RUN_CHUNK:  # (no run is longer than edges)
        return [walk, total]
    capped, _, chunk_total = _chunked(total, RUN_CHUNK)
    return [walk, dataclasses.replace(capped, chunk_walk=RUN_CHUNK), dataclasses.replace(chunk_total, slice_sum=0)]


def tile_rows(edges: int, tile: int) -> int:
    """Partial rows of a tiled deterministic forward (:attr:`KernelSchedule.partial_tiles`): two per tile."""
    return 2 * -(-edges // tile)


def chunk_rows(edges: int, chunk: int) -> int:
    """Rows of a chunk walk's owned outputs: one per window of ``chunk`` sorted positions."""
    return -(-edges // chunk)


def _chunked(kernel: KernelSchedule, chunk: int) -> list[KernelSchedule]:
    """A deterministic walk over sorted runs as three launches (RUN_CHUNK): the walk of each run's
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
    """A deterministic forward's walk over dst runs in lockstep as two launches
    (TILED_DETERMINISTIC_FORWARD): the atomic forward's walk over tiles of dst-sorted edges (its call
    carrying ``dst``'s ordering alone), each of its z flushes stored to the node's row or to a partial
    row of the tile, in tiles of a fixed size (not spread over the grid it gets); then the sum of the
    partial rows. ``[kernel]`` for any other launch, where ``edges`` is not given or the partial rows
    would take more than TILED_FORWARD_MAX_BYTES, and where the atomic call's plan walks z with other
    outputs (the force loss's second derivative)."""
    joint = kernel.joint
    if (not TILED_DETERMINISTIC_FORWARD or not kernel.lockstep or kernel.segment_role != "z" or joint is None
            or dict(joint.outputs).keys() != {"z"} or edges is None):
        return [kernel]
    z = kernel.outputs[0].call_output
    atomic = _launches(dataclasses.replace(call, deterministic=False, orderings=("z",)), dtype, index_dtype, edges)
    walk = next((k for k in atomic if [o.call_output for o in k.outputs] == [z] and k.joint is not None
                 and k.joint.by_destination), None)
    if walk is None or tile_rows(edges, walk.tile) * kernel.outputs[0].dim * kernel.itemsize > TILED_FORWARD_MAX_BYTES:
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
    shared_tile = TILE_INDEXED if edges is None else shared_tile_for(edges)
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
            planned = [s for s in planned if s is not None]
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
            tile = TILE_INDEXED
        elif joint is not None and joint.walk:
            tile = WALK_TILE
        elif stream is not None:
            tile = TILE_STREAM
        elif any(o.kind == SHARED for o in outputs):
            tile = shared_tile
        else:
            tile = TILE_INDEXED if any(o.kind != BATCHED for o in outputs) else 1
        stage = {}
        for slot in slots:
            for c in slot.contributions:
                for f in c.factors:
                    if f.staged:
                        row = f.strides[0] if f.role == "w" else f.dim
                        stage[f.role] = max(stage.get(f.role, 0), WARP * stage_width(row))
        transpose = max(
            (WARP * s.dim for s in slots
             if s.mode == "output" and s.role != "w" and s.dim > 1 and not outputs[s.output].shuffled),
            default=0,
        )
        edge_sums = 0
        own_runs = segment_role and not any(o.kind == SHARED for o in outputs)  # a warp per run, no partials
        lockstep = _lockstep_warps(joint) if own_runs else 0
        forward_walk = joint is not None and joint.by_destination and dict(joint.outputs).keys() == {"z"}
        depth = OWNED_AHEAD_DEPTH if own_runs else AHEAD_DEPTH
        registers_ahead = forward_walk and _registers_ahead(joint, itemsize)
        ahead = depth if forward_walk and not lockstep and not registers_ahead else 0
        if ahead and MERGED_WALK_Z_COMPONENTS:
            limit = _z_components(outputs[0].flush, joint.cg_terms, itemsize, MERGED_WALK_Z_COMPONENTS)
            joint = dataclasses.replace(joint, walk_groups=_walk_groups(joint, limit))
        if joint is not None:
            stage_y = joint.walk and bool(joint.reads("y")) and call.kind("y") == BATCHED
            buffered = frozenset(o.role for o in outputs if o.buffered and o.role in dict(joint.outputs))
            buffers = functools.partial(_joint_buffers, y_dim=call.problem.operand_dim("y"), stage_y=stage_y,
                                        ahead=ahead, buffered=buffered)
            if joint.by_destination and not forward_walk and not lockstep:
                joint = _merged_backward_walk(joint, buffers, itemsize)
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
            ahead_copy_bytes=AHEAD_COPY_BYTES if ahead else 0,
            min_blocks=_min_blocks(joint, lockstep, registers_ahead),
        )
        kernel = _fit_shared_memory(kernel)
        if edges is not None and joint is None and stream is None:
            segments = call.row_count(segment_role) if segment_role else 0
            groups = slot_groups(kernel.slots, kernel.tiles(edges, segments), kernel.max_blocks * kernel.warps_per_block,
                                 itemsize)
            kernel = dataclasses.replace(kernel, groups=groups)
        if joint is not None and not joint.walk and dict(joint.outputs).keys() == {"z"} \
                and all(o.kind == BATCHED for o in outputs):
            kernel = _tile_group(kernel, CHUNK_WARPS, PATH_WARPS)
        elif forward_walk and own_runs and not lockstep:
            kernel = _tile_group(kernel, WALK_CHUNK_WARPS, WALK_PATH_WARPS)
        if FILL_GRID and joint is not None and joint.by_destination and kernel.tiling == "tiles":
            kernel = dataclasses.replace(kernel, fill=True)
        schedules.append(kernel)
    return schedules


def _tile_group(kernel: KernelSchedule, chunk_warps: int, path_warps: int) -> KernelSchedule:
    """A forward's tile (or run) shared among the warps of a group: its x blocks' chunks (at most
    ``chunk_warps``, and their largest number of chunks) and parts of its paths (at most ``path_warps``,
    and one per path), a power of two of at most MAX_TILE_GROUP warps in all, in blocks that hold
    whole groups."""
    joint = kernel.joint
    chunks = _power_of_two_below(min(chunk_warps, max(-(-mul // WARP) for _, mul, _, _ in joint.blocks)))
    paths = [p for *_, block in joint.blocks for p in block]
    parts = _power_of_two_below(min(path_warps, len(paths), MAX_TILE_GROUP // chunks))
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
    if _warps_in_block_shared(kernel.smem_per_warp * kernel.itemsize, warps) < warps:
        return kernel
    return dataclasses.replace(kernel, chunk_warps=chunks if chunks > 1 else 0,
                               path_groups=tuple(owner) if parts > 1 else (), warps_per_block=warps)


def _power_of_two_below(n: int) -> int:
    """The largest power of two not above ``n`` (1 for ``n`` below 2)."""
    return 1 << max(0, n.bit_length() - 1)


def owned_forward_is_faster(call: Call, dtype: str, index_dtype: str, edges: int) -> bool:
    """Whether a deterministic convolution forward ``call`` (z owned by ``dst`` runs) on ``edges``
    edges is expected to beat the atomic forward: OWNED_FORWARD_MIN_NODES destination nodes (``call``'s
    z rows) or more, times the mean run's length over OWNED_FORWARD_RUN_EDGES where that is above 1,
    and :func:`owned_walk_is_faster`."""
    nodes = call.row_count("z")
    longer_runs = max(1.0, edges / (OWNED_FORWARD_RUN_EDGES * max(nodes, 1)))
    return nodes >= OWNED_FORWARD_MIN_NODES[dtype] * longer_runs and owned_walk_is_faster(call, dtype, index_dtype)


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
