"""The tunables of the CUDA lowering, as one frozen, hashable value.

A :class:`Settings` travels in every call's static parameter (:class:`jax_cgtp.core.call.Call`), so the
planner reads it from the call, the planned launches and compiled kernels are cached per value, and
two calls in one program may differ. The calls a function traces take the settings active where it
is traced: the defaults, or those of an enclosing :func:`config` block (a function ``jax.jit``
traced before keeps its own). Derivatives keep the settings of the call they differentiate.

>>> import jax_cgtp
>>> with jax_cgtp.config(walk_tile=8):
...     jax_cgtp.core.settings.active().walk_tile
8
>>> jax_cgtp.core.settings.active().walk_tile
16

Every default is the measured winner of a same-process A/B on an H100 or H200; the comment beside
it names the experiment (``benchmarks/results/README.md`` indexes them, with their numbers). The
fields keyed by item size or kernel dtype are tuples of pairs, so that the value stays hashable.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os


def _pairs_default(*pairs):
    return dataclasses.field(default=tuple(pairs))


@dataclasses.dataclass(frozen=True)
class Settings:
    # --- tiles and grids
    tile_indexed: int = 32  # edges per tile where rows are accumulated across edges
    walk_tile: int = 16  # edges per tile of a product's walk of long code (wide-groups: bwd 0.73-0.77x of 32)
    max_blocks: int = 65536  # a walk's grid cap (max-blocks: 0.956-0.995x the time of 8192)
    max_partial_blocks: int = 256  # a SHARED output's partial rows: one per warp of these blocks
    max_stage_bytes: int = 8192  # a staged operand's shared memory per warp
    max_reduce_accumulators: int = 64  # registers of the slot kernels' per-lane sums
    target_warps: int = 8192  # float32 warps an H100 runs at once (half in float64): fewer tiles spread slots
    max_groups: int = 32  # slot groups of a launch
    fill_min_span: int = 8  # edges of the shortest span when a walk's warps share the edges evenly
    max_block_shared_bytes: int = 99 * 1024  # a block's dynamic shared memory: sm_86/sm_89's opt-in limit (sm_90: 227 KiB)
    # --- warps sharing a tile
    chunk_warps: int = 4  # warps sharing a product forward's edge, each a fourth of the chunks (chunk-warps: 0.913-0.921x)
    path_warps: int = 4  # parts of a product forward's paths, for blocks of one chunk (tile-groups: 0.960-0.964x)
    max_tile_group: int = 4  # warps of a product forward's group at most (tile-groups: 8 and 16 slower)
    walk_chunk_warps: int = 4  # warps sharing a conv forward's run (tile-groups: 0.902-0.95x)
    # --- registers
    edge_y_registers: int = 16  # y components a joint pass holds in registers (l <= 3: 0.93-0.96x; l <= 5 spilled)
    chunk_weight_registers: int = 24  # a chunk's weights loaded at once, at most (l <= 5 blocks do not spill)
    # --- forward walks by destination
    scatter_z_components: tuple = _pairs_default((8, 24))  # by item size: z components of a path group (scatter-groups)
    scatter_z_min_terms: int = 1000  # CG terms above which a forward by destination walks in groups (scatter-groups)
    max_z_components: int = 64  # z components of an x block held at once (l <= 5 blocks spilled at 174)
    merged_walk_z_components: int = 72  # blocks of one mul walked together up to these z components (merged-walks: 0.79-0.97x)
    # --- backward walks by destination
    merged_backward_walk_z_components: tuple = _pairs_default((4, 64), (8, 64))  # by item size (merged-backward-walks)
    merged_backward_walk_x_components: tuple = _pairs_default((8, 4))  # by item size; none where absent
    # --- long CG code: walks in groups of paths
    walk_terms: int = 4096  # a product's joint pass walks its tile above these CG terms (code-walk)
    multi_term_walk_terms: int = 1000  # ... and a pass of several terms above these (multi-term: 0.61-0.92x)
    walk_group_terms: int = 1024  # CG terms of a product walk's group of paths (code-walk: 512-4096 tried)
    grouped_terms_by_destination: int = 4096  # a convolution pass splits its x blocks above these terms
    walk_group_terms_by_destination: int = 512  # ... into groups of these (code-walk: 512 fastest)
    wide_group_terms_by_destination: int = 1024  # wide groups of the atomic backward (wide-groups)
    wide_group_min_terms: tuple = _pairs_default((4, 3), (8, 2))  # by item size: passes of at least these terms go wide
    wide_group_min_owned_terms: tuple = _pairs_default((8, 3))  # ... where x̄ is owned (det-wide-groups)
    slice_group_terms_by_destination: int = 1536  # groups of a deterministic backward in slices (det-slices: 0.86-0.91x)
    slice_group_min_terms: int = 3  # ... for passes of at least these terms
    z_with_backward_max_terms: int = 2048  # z walks with x̄, ȳ, w̄ up to these CG terms (z-apart: 0.62x apart above)
    roomy_walk_terms: int = 1100  # free walks of more terms get one block per SM as ptxas' target (full-chunks: 0.75-0.87x)
    grouped_forward_blocks: int = 3  # blocks per SM targeted by a float32 forward walk in groups (225 -> 170 registers)
    lockstep_warps: tuple = ((800, 4), (2048, 8))  # (CG terms, warps): deterministic walks in lockstep above (lockstep-runs)
    # --- runs of one node
    owned_run_cap: int = 128  # edges of a run the atomic forward's node warp walks (long-runs, dense-graph)
    owned_forward_min_nodes: tuple = _pairs_default(("float", 4096), ("double", 2048))  # by kernel dtype (node-threshold)
    owned_forward_run_edges: int = 16  # ... at this many edges per node, proportionally more at more
    run_chunk: int = 128  # edges of a deterministic walk's chunk of a long run (long-runs, dense-graph)
    # --- the deterministic variant's workspaces
    deterministic_backward_slice_bytes: int = 512 << 20  # x̄ rows of a backward slice (0: walk by source; det-slices)
    slice_sum_group_blocks: int = 12  # 32-column blocks a slice sum's warp adds
    slice_sum_loads_in_flight: int = 32  # values in flight per lane of a slice sum (det-sum-ahead)
    tiled_forward_max_bytes: int = 1 << 30  # partial rows of the tiled deterministic forward (det-forward-tiled)
    # --- look-ahead rings
    ahead_depth: int = 2  # edges the conv forward's walk loads ahead (ahead-ring: 0.76-0.92x; 0: registers)
    owned_ahead_depth: int = 3  # ... in the deterministic forward (owned-depth: 0.955-1.015x of 2)
    ahead_copy_bytes: int = 16  # bytes per lane of a ring copy (ring-vectors: 0.90-0.96x of elements; 0: elements)
    # --- weight streams
    stream_stages: int = 3  # ring slots of a weight stream: items in flight while one computes = stages - 1
    stream_item_bytes: int = 4096  # target size of one item's weights
    stream_tile: int = 8  # consecutive edges a stream warp takes at a time
    stream_max_warp_bytes: int = 48 * 1024  # a stream warp's shared memory (4 warps fit sm_90's 227 KiB)
    # --- launching
    command_buffers: bool = dataclasses.field(  # kernels recordable in XLA's CUDA graphs (command-buffers: 0.94-0.95x)
        default_factory=lambda: os.environ.get("JAX_CGTP_COMMAND_BUFFERS", "1") != "0")

    def by_size(self, name: str, key, default=None):
        """The value for ``key`` (an item size or a kernel dtype) of the paired field ``name``."""
        return dict(getattr(self, name)).get(key, default)


_ACTIVE: contextvars.ContextVar[Settings] = contextvars.ContextVar("jax_cgtp_settings")


def active() -> Settings:
    """The settings calls traced here take: those of the innermost :func:`config` block, else the defaults."""
    value = _ACTIVE.get(None)
    if value is None:
        value = Settings()
        _ACTIVE.set(value)
    return value


@contextlib.contextmanager
def config(**overrides):
    """Within the block, calls traced take the active settings with ``overrides`` (field names of
    :class:`Settings`); ``TypeError`` naming an unknown field."""
    fields = {f.name for f in dataclasses.fields(Settings)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"jax_cgtp.config: unknown settings {unknown}; see jax_cgtp.core.settings.Settings")
    token = _ACTIVE.set(dataclasses.replace(active(), **overrides))
    try:
        yield
    finally:
        _ACTIVE.reset(token)
