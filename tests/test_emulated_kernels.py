"""The generated CUDA kernels, run on the CPU by host emulation, against the reference.

The GPU tests (``tests/test_gpu.py``) need a device; these run in CI. They execute the very
kernel source, schedules, grids and partial-row sums that the GPU runs (see
``kernel_emulator.py``), with NaN-poisoned outputs, so indexing, staging, warp reductions,
flushes and the launch plan are checked on every change. They say nothing about speed.
"""

import functools
import re

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from family_members import (OWNED_FORWARD_ON_SMALL_GRAPHS, assert_close, conv_members, conv_second_derivatives, equal_mul_blocks_pair,
                            fully_connected_pair, grouping_index, high_l_pair, in_float64,
                            interleaved_whole_chunks_pair, members, narrow_blocks_pair, pair, random_graph,
                            second_derivatives,
                            spherical_harmonics_pair, squared_norm_and_gradients, uneven_chunks_pair, whole_chunks_pair,
                            wide_block_pair, with_sorted_graph)
from padding_cases import assert_half_precision_rounds_once, assert_padding_contributes_nothing
from random_problems import random_inputs, random_problem

import jax_cgtp
from jax_cgtp.gpu import codegen, cuda_lowering, schedule
from jax_cgtp.core.problem import MODES

import kernel_emulator

DEFAULTS = jax_cgtp.Settings()  # the library's settings

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not kernel_emulator.available(), reason="needs g++ (C++20) for host emulation")]


@pytest.fixture(scope="module", autouse=True)
def emulated():
    with kernel_emulator.emulated_kernels():
        yield


def _launches():
    return len(kernel_emulator.launched())


def _forward_and_its_launch(conv, x, y, w, src, dst):
    """``conv``'s jitted forward on 9 nodes, and the kernel it launched (an atomic forward by
    destination runs launches a second, which adds the edges of runs past the walk's cap)."""
    before = _launches()
    out = jax.jit(conv, static_argnums=5)(x, y, w, src, dst, 9)
    launch, *rest = kernel_emulator.launched()[before:]
    assert [bool(k.beyond_cap) for k in rest] == ([True] if launch.run_cap else [])
    return out, launch


@pytest.mark.parametrize("seed", range(6))
def test_every_member_matches_reference(seed):
    """Every mode in float64 (seeds 0 and 3 with shared weights), and one float32 problem."""
    spec = random_problem(800 + seed, mode=MODES[seed % 5], lmax=2)
    kernels, reference = pair(spec, kernels="auto")
    dtype = jnp.float32 if seed == 5 else jnp.float64
    x, y, w = random_inputs(jax.random.PRNGKey(seed), spec, (7,), kernels.weight_numel, dtype, seed % 3 == 0)
    g = jax.random.normal(jax.random.PRNGKey(seed + 1), (7, kernels.irreps_out.dim), dtype)
    before = _launches()
    actual = jax.jit(functools.partial(members, kernels))(x, y, w, g)
    assert _launches() > before  # the kernels ran, not the reference
    expected = jax.jit(functools.partial(members, reference))(*(a.astype(jnp.float64) for a in (x, y, w, g)))
    assert_close(actual, expected, dtype)


@pytest.mark.parametrize("deterministic", [False, True])
def test_blocks_of_whole_chunks_match_reference(deterministic):
    """Blocks of 64 channels, as in the public configs (the other tests' blocks end in a partial
    32-channel chunk): the convolution's joint passes and the slots of a ``uvv`` product."""
    kernels, reference = whole_chunks_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(5), kernels, 9, 60, jnp.float64, bad_fraction=0.1)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, kernels, 9))(*args)
    assert any(k.joint for k in kernel_emulator.launched()[before:])
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(*args), jnp.float64)
    spec = (e3nn.Irreps("2x0e+2x1o"), e3nn.Irreps("64x0e+64x1o"), e3nn.Irreps("64x0e+64x1o"),
            [(0, 0, 0, "uvv", True), (0, 1, 1, "uvv", True), (1, 1, 0, "uvv", True), (1, 0, 1, "uvv", True)], {})
    kernels, reference = pair(spec, kernels="auto")
    x, y, w = random_inputs(jax.random.PRNGKey(6), spec, (5,), kernels.weight_numel, jnp.float64, False)
    g = jax.random.normal(jax.random.PRNGKey(7), (5, kernels.irreps_out.dim), jnp.float64)
    before = _launches()
    actual = jax.jit(functools.partial(members, kernels))(x, y, w, g)
    assert any(k.slots for k in kernel_emulator.launched()[before:])
    assert_close(actual, jax.jit(functools.partial(members, reference))(x, y, w, g), jnp.float64)


@pytest.mark.parametrize("batch", [0, 1, 40, 150])
def test_batch_sizes_and_shared_weight_tiles(batch, planned_with):
    """With 4 partial blocks (16 warps) instead of 256, 40 and 150 rows of shared weights take
    tiles of 4 and 16 edges, and fill the capped grid, at a fraction of the emulation's cost."""
    planned_with(max_partial_blocks=4)
    assert [schedule.shared_tile_for(jax_cgtp.core.settings.active(), n) for n in (1, 40, 150)] == [1, 4, 16]
    spec = random_problem(820, mode="uvw", lmax=1)
    kernels, reference = pair(spec, kernels="auto")
    args = random_inputs(jax.random.PRNGKey(batch), spec, (batch,), kernels.weight_numel, jnp.float64, True)
    actual = jax.jit(functools.partial(squared_norm_and_gradients, kernels))(*args)
    assert_close(actual, jax.jit(functools.partial(squared_norm_and_gradients, reference))(*args), jnp.float64)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("seed", range(2))
def test_convolution_matches_reference(deterministic, seed):
    spec = random_problem(830 + seed, mode=("uvu", "uvw")[seed], lmax=2)
    kernels, reference = pair(spec, jax_cgtp.TensorProductConv, kernels="auto", deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(seed), kernels, 9, 60, jnp.float64, bad_fraction=0.1, shared=seed == 1)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, kernels, 9))(*args)
    assert _launches() > before
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(*args), jnp.float64)


@pytest.mark.parametrize("deterministic, shared, dtype", [(False, False, jnp.float64), (True, False, jnp.float64),
                                                          (False, True, jnp.float32), (True, True, jnp.float32)])
def test_padding_edges_with_nan_and_inf_values_contribute_nothing(deterministic, shared, dtype):
    before = _launches()
    assert_padding_contributes_nothing("auto", deterministic, shared, dtype)
    assert _launches() > before


def test_half_precisions_accumulate_in_float32_and_round_once():
    before = _launches()
    assert_half_precision_rounds_once("auto", jnp.bfloat16, edges=300)
    assert _launches() > before


@pytest.mark.parametrize("make_pair, parts, group", [(narrow_blocks_pair, 2, 2), (narrow_blocks_pair, 4, 4),
                                                     (uneven_chunks_pair, 2, 8), (uneven_chunks_pair, 4, 16)])
def test_forward_tiles_shared_by_path_warps_match_reference(make_pair, parts, group, planned_with):
    """The paths of the product's forward in parts (``DEFAULTS.path_warps``), each run by its warps
    of the tile's group: x blocks of one chunk each (the paths alone), or of up to five chunks, four
    warps per part splitting them (groups of 8 and 16 warps, in blocks that hold them); 37 edges."""
    planned_with(path_warps=parts, max_tile_group=16)
    kernels, reference = make_pair(kernels="auto")
    keys = jax.random.split(jax.random.PRNGKey(45), 3)
    x, y, w = (jax.random.normal(k, (37, d), jnp.float64) for k, d in zip(
        keys, (kernels.irreps_in1.dim, kernels.irreps_in2.dim, kernels.weight_numel)))
    before = _launches()
    actual = jax.jit(kernels)(x, y, w)
    [launch] = kernel_emulator.launched()[before:]
    assert launch.num_groups == group and launch.path_warps == parts and launch.warps_per_block % group == 0
    assert_close(actual, jax.jit(reference)(x, y, w), jnp.float64)


@pytest.mark.parametrize("deterministic", [False, True])
def test_forward_walks_share_runs_among_chunk_warps(deterministic, planned_with):
    """The convolution's forward walking destination runs with a group of warps per run
    (``Settings.walk_chunk_warps``): four warps each running every fourth chunk of x blocks of five,
    two and one chunks. Every convolution member matches the reference (runs of up to 4 edges: the
    deterministic walk's chunks of ``run_chunk=4`` take a warp each)."""
    planned_with(walk_chunk_warps=4, run_chunk=4, **OWNED_FORWARD_ON_SMALL_GRAPHS)
    make_pair, group, chunk_loop = uneven_chunks_pair, 4, "for (int c = group; c < 5; c += 4)"
    kernels, reference = make_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(47), kernels, 9, 60, jnp.float64, bad_fraction=0.1)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, kernels, 9))(*args)
    walks = [k for k in kernel_emulator.launched()[before:] if k.num_groups > 1 and k.joint is not None]
    assert walks and all(k.num_groups == group and k.tiling == "segments" and k.warps_per_block == group
                         and k.path_warps == 1 for k in walks)
    assert all(chunk_loop in codegen.generate(k) for k in walks)  # which chunks a warp runs
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(*args), jnp.float64)


@pytest.mark.parametrize("shared", [False, True])
def test_forward_tiles_shared_by_chunk_warps_match_reference(shared, planned_with):
    """Four warps per tile of the product's forward (``DEFAULTS.chunk_warps``), each running every
    fourth 32-channel chunk: x blocks of five chunks (warp 0 runs two, the last partial), two (two
    warps idle) and one, on 37 edges, per-edge or shared weights; a grid of two blocks, so that each
    group walks many tiles."""
    planned_with(chunk_warps=4, max_blocks=2)
    kernels, reference = uneven_chunks_pair(kernels="auto")
    shape = (37, kernels.weight_numel) if not shared else (kernels.weight_numel,)
    keys = jax.random.split(jax.random.PRNGKey(43), 3)
    x, y, w = (jax.random.normal(k, s, jnp.float64) for k, s in zip(
        keys, ((37, kernels.irreps_in1.dim), (37, kernels.irreps_in2.dim), shape)))
    before = _launches()
    actual = jax.jit(kernels)(x, y, w)
    [launch] = kernel_emulator.launched()[before:]
    assert launch.chunk_warps == 4 and launch.num_groups == 4 and launch.grid(37, 0) == 2
    assert_close(actual, jax.jit(reference)(x, y, w), jnp.float64)


@pytest.mark.parametrize("deterministic", [False, True])
def test_joint_passes_of_the_convolution_sum_shared_weights_in_partial_rows(deterministic, planned_with):
    """With weights shared by every edge, the convolution's joint backward passes (the fused backward,
    the second derivative's) sum w̄ over each warp's edges in registers and add it to the warp's
    partial row; every member matches the reference. One block of partials: each warp walks several
    tiles or runs, whose sums its row adds up."""
    planned_with(max_partial_blocks=1)
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto",
                                                  deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(59), kernels, 12, 300, jnp.float64, bad_fraction=0.1, shared=True)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, kernels, 12))(*args)
    summing = [k for k in kernel_emulator.launched()[before:] if k.joint is not None and k.has_partials]
    assert len(summing) >= 2 and all(dict(k.joint.outputs).keys() >= {"w"} for k in summing)
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 12))(*args), jnp.float64)


@pytest.mark.parametrize("index_dtype", [jnp.int32, jnp.int64])
@pytest.mark.parametrize("edges, rows, order", [(0, 11, "random"), (1, 11, "random"), (1000, 11, "random"),
                                                (2500, 20_000, "random"), (2500, 20_000, "sorted"),
                                                (2500, 11, "sorted"), (2500, 11, "one_swap")])
def test_grouping_kernels_group_edges_by_index(edges, rows, order, index_dtype):
    """The counting sort places every edge once, each node's edges in its run, with the edges
    below the range first and those above it last: the runs of the stable sort, in any order (the
    identity where the edges came sorted), and the longest run after the offsets. Three blocks of
    edges count; over 20,000 nodes, three blocks sum the tiles of counts (``cgtp_group_scan``),
    else the counting launch's last block."""
    index = grouping_index(edges, rows, order, index_dtype)
    before = len(kernel_emulator.groupings())
    # the groupings are read once the call's kernels have run
    perm, offsets = jax.block_until_ready(jax.jit(lambda i: jax_cgtp.core.grouping.group_edges(i, rows))(index))
    one_tile = jax_cgtp.gpu.grouping_kernels.scan_tiles(rows) == 1
    counting = jax_cgtp.gpu.grouping_kernels.COUNT_KERNEL if one_tile else jax_cgtp.gpu.grouping_kernels.RANK_KERNEL
    assert kernel_emulator.groupings()[before:] == ([(counting, edges)] if edges else [])  # none for no edges
    stable_perm, stable_offsets = jax_cgtp.core.graph.sort_edges(index, rows)
    assert perm.dtype == offsets.dtype == index_dtype
    np.testing.assert_array_equal(offsets[:-1], stable_offsets)
    assert offsets[-1] == np.max(np.diff(stable_offsets), initial=0)  # the longest run
    np.testing.assert_array_equal(np.sort(perm), np.arange(edges))
    bounds = [0, *np.asarray(offsets[:-1]).tolist(), edges]
    for begin, end in zip(bounds[:-1], bounds[1:]):
        np.testing.assert_array_equal(np.sort(perm[begin:end]), np.sort(stable_perm[begin:end]))
    if order == "sorted":
        np.testing.assert_array_equal(perm, np.arange(edges))
    if order == "one_swap":
        assert not np.array_equal(perm, np.arange(edges))


@pytest.mark.parametrize("given", ["graph", "grouped", "sorted_by_dst"])
def test_atomic_convolution_owns_only_the_forward(given, planned_with):
    """The atomic variant of a joint-pass product computes its forward by the walk over
    destination runs (z written once per node; here on a small graph too) and every derivative by
    atomic kernels, whose tiles visit the edges grouped by ``dst``: by ``graph=``'s ordering, or by
    the grouping kernel of each call (on edges in no order, or already sorted)."""
    planned_with(**OWNED_FORWARD_ON_SMALL_GRAPHS)
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto")
    args = random_graph(jax.random.PRNGKey(51), kernels, 9, 60, jnp.float64, bad_fraction=0.1,
                        sorted_by_dst=given == "sorted_by_dst")
    before, grouped = _launches(), len(kernel_emulator.groupings())
    conv = with_sorted_graph(kernels) if given == "graph" else kernels
    actual = jax.jit(functools.partial(conv_members, conv, 9))(*args)
    assert len(kernel_emulator.groupings()) - grouped == (0 if given == "graph" else 1)
    launched = kernel_emulator.launched()[before:]
    flushes = [[(o.role, o.flush) for o in k.outputs] for k in launched]
    owned = [f for f in flushes if ("z", "own") in f]
    assert owned and all(f == [("z", "own")] for f in owned)
    assert all(flush != "own" for f in flushes if f not in owned for _, flush in f)
    assert any(("x", "atomic") in f for f in flushes)
    assert all(k.call.walk == "z" for k in launched if k.tiling == "tiles")
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(*args), jnp.float64)


@pytest.mark.parametrize("dtype, run_edges, walks", [(jnp.float32, 7, True), (jnp.float64, 7, False),
                                                     (jnp.float32, 6, False)])
def test_atomic_forward_walks_destination_runs_on_many_nodes(dtype, run_edges, walks, planned_with):
    """The atomic convolution's forward walks destination runs on graphs of at least
    ``Settings.owned_forward_min_nodes`` nodes (here 9 in float32, 10 in float64), proportionally more where the
    mean run (60 edges on 9 nodes: 6.7) is longer than ``OWNED_FORWARD_RUN_EDGES`` (here 7: 9 nodes
    do; 6: 10 are needed), else it adds each edge's z atomically, its tiles over the edges grouped by
    destination all the same; every member matches the reference either way."""
    planned_with(owned_forward_min_nodes=(("float", 9), ("double", 10)), owned_forward_run_edges=run_edges)
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto")
    args = random_graph(jax.random.PRNGKey(58), kernels, 9, 60, dtype, bad_fraction=0.1)
    before, grouped = _launches(), len(kernel_emulator.groupings())
    actual = jax.jit(functools.partial(conv_members, kernels, 9))(*args)
    flushes = {out.flush for k in kernel_emulator.launched()[before:] for out in k.outputs if out.role == "z"}
    assert ("own" in flushes) == walks
    assert len(kernel_emulator.groupings()) - grouped == 1
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(*args), dtype)


@pytest.mark.parametrize("given, cap", [("graph", 8), ("grouped", 8), ("grouped", 64)])
def test_atomic_forward_walks_each_runs_first_edges_and_adds_the_rest_on_every_warp(given, cap, planned_with):
    """A run longer than the walk's cap (a padding node's, a hub's): the node's warp walks its
    first ``OWNED_RUN_CAP`` edges and writes the row, and a second launch, the atomic forward's
    tiles over the grouped edges, adds the edges past the cap (at once done where the grouping
    found no run longer than the cap: under a cap of 64); every member matches the reference."""
    planned_with(owned_run_cap=cap, **OWNED_FORWARD_ON_SMALL_GRAPHS)
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto")
    # node 4 takes a third of the edges: a run of 40, five times the cap of 8
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(57), kernels, 9, 120, jnp.float64, bad_fraction=0.1,
                                     edit=lambda src, dst: (src, dst.at[::3].set(4)))
    conv = with_sorted_graph(kernels) if given == "graph" else kernels
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, conv, 9))(x, y, w, src, dst)
    capped = [(k.run_cap, k.beyond_cap, k.tiling, k.reads_longest_run)
              for k in kernel_emulator.launched()[before:] if k.run_cap or k.beyond_cap]
    # only a grouping's offsets carry the longest run
    assert capped == [(cap, 0, "segments", False), (0, cap, "tiles", given == "grouped")]
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(x, y, w, src, dst), jnp.float64)


@pytest.mark.parametrize("lockstep, given, shared", [(False, "grouped", True), (True, "graph", False)])
def test_deterministic_walks_split_long_runs_into_chunks_added_in_order(lockstep, given, shared, planned_with):
    """Runs longer than ``RUN_CHUNK`` by destination and by source (a padding node's, a hub's): each
    walk over sorted runs walks the runs' first chunk, a second launch walks every later chunk on a
    warp of its own into a row of its own (rows poisoned), and a third adds those rows to the node's
    in chunk order; every member matches the reference. ``lockstep``: the first walks in step (the
    forward too: no bytes for the tiled forward's partial rows).
    ``shared``: the backward by source also sums w̄ of shared weights, the chunks into partial rows
    of their own. (The backward walks by source: ``DETERMINISTIC_BACKWARD_SLICE_BYTES`` off.)"""
    planned_with(run_chunk=4, deterministic_backward_slice_bytes=0, tiled_forward_max_bytes=0,
                 **({"lockstep_warps": ((0, 2),)} if lockstep else {}))
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=True)
    # node 4 receives 40 edges: ten chunks (eight added at once); node 2 sends 30 edges (some of them
    # to node 4): eight chunks, the last of 2
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(58), kernels, 9, 120, jnp.float64, bad_fraction=0.1,
                                     shared=shared, edit=lambda src, dst: (src.at[1::4].set(2), dst.at[::3].set(4)))
    conv = with_sorted_graph(kernels) if given == "graph" else kernels
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, conv, 9))(x, y, w, src, dst)
    launched = kernel_emulator.launched()[before:]
    parts = {(k.segment_role, k.run_cap, k.chunk_walk, k.chunk_sum, k.lockstep) for k in launched if k.tiling == "segments"}
    assert parts == {(r, 4, 0, 0, lockstep) for r in "xz"} | {(r, 0, 4, 0, False) for r in "xz"} | {
        (r, 0, 0, 4, False) for r in "xz"}
    assert any(k.chunk_walk and k.has_partials for k in launched) == shared
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(x, y, w, src, dst), jnp.float64)


@pytest.mark.parametrize("make_pair", [high_l_pair, fully_connected_pair])
def test_atomic_convolution_with_a_sorted_graph_walks_tiles_in_destination_order(make_pair):
    """With ``graph=`` on edges in no order, the atomic kernels of every member (forward, fused
    backward, second derivative) visit the edges in ``dst``-sorted order: path groups of a wide
    block, and weight streams of a fully connected product."""
    kernels, reference = make_pair(jax_cgtp.TensorProductConv, kernels="auto")
    args = random_graph(jax.random.PRNGKey(52), kernels, 9, 60, jnp.float64, bad_fraction=0.1)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, with_sorted_graph(kernels), 9))(*args)
    launched = [k for k in kernel_emulator.launched()[before:] if k.tiling == "tiles"]
    assert launched and all(k.call.walk == "z" and k.permuted for k in launched)
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(*args), jnp.float64)


@pytest.mark.parametrize("joint", [False, True])
def test_deterministic_runs_longer_than_a_tile(joint):
    """Nearly every edge goes to node 0: its run spans several 32-edge tiles, the first stores
    and the later ones add; the other nodes get zeros."""
    if joint:
        kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=True)
    else:
        kernels, reference = pair(random_problem(834, mode="uvu", lmax=1), jax_cgtp.TensorProductConv,
                                  kernels="auto", deterministic=True)
    args = random_graph(jax.random.PRNGKey(44), kernels, 4, 100, jnp.float64, bad_fraction=0.1)
    actual = jax.jit(functools.partial(conv_members, kernels, 4))(*args)
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 4))(*args), jnp.float64)


def test_joint_forward_and_backward_match_reference():
    kernels, reference = spherical_harmonics_pair(kernels="auto")
    keys = jax.random.split(jax.random.PRNGKey(40), 4)
    x = jax.random.normal(keys[0], (5, kernels.irreps_in1.dim))
    y = jax.random.normal(keys[1], (5, kernels.irreps_in2.dim))
    w = jax.random.normal(keys[2], (5, kernels.weight_numel))
    g = jax.random.normal(keys[3], (5, kernels.irreps_out.dim))
    before = _launches()
    actual = jax.jit(functools.partial(members, kernels))(x, y, w, g)
    joint = [dict(k.joint.outputs) for k in kernel_emulator.launched()[before:] if k.joint is not None]
    assert {"z": 0} in joint and {"x": 0, "y": 1, "w": 2} in joint
    assert {"y": 0} in joint  # ȳ alone (the force loss's gradient w.r.t. y)
    assert_close(actual, jax.jit(functools.partial(members, reference))(x, y, w, g), jnp.float64)


def test_second_derivatives_of_the_product_are_joint_passes():
    """The force loss's second derivative when x, y and w all depend on the positions (an
    Allegro-style edge product): x̄, ȳ and w̄ from both versions of x, y and w in one joint pass,
    z (three terms) in another; the JVP (z, three terms) is one too. Two paths have no weights."""
    kernels, reference = spherical_harmonics_pair(kernels="auto", unweighted=(1, 6))
    keys = jax.random.split(jax.random.PRNGKey(50), 4)
    x, y, w, g = (jax.random.normal(k, (5, d), jnp.float64) for k, d in zip(
        keys, (kernels.irreps_in1.dim, kernels.irreps_in2.dim, kernels.weight_numel, kernels.irreps_out.dim)))
    before = _launches()
    actual = jax.jit(functools.partial(second_derivatives, kernels))(x, y, w)
    jvp = jax.jit(lambda *a: jax.jvp(kernels, a, (0.5 * x, 2.0 * y, -w))[1])(x, y, w)
    terms = ["".join(sorted(t.role for t in k.joint.terms)) for k in kernel_emulator.launched()[before:]
             if k.joint is not None]
    assert "wwxxyy" in terms and "zzz" in terms and "wwxxyyzzz" not in terms
    assert_close(actual, jax.jit(functools.partial(second_derivatives, reference))(x, y, w), jnp.float64)
    assert_close(jvp, jax.jvp(reference, (x, y, w), (0.5 * x, 2.0 * y, -w))[1], jnp.float64)


def test_single_operand_gradients_of_the_convolution_are_joint_passes():
    """x̄, ȳ or w̄ alone: one-output walks by destination."""
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto")
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(42), kernels, 9, 50, jnp.float64, bad_fraction=0.1,
                                     sorted_by_dst=True)
    g = jax.random.normal(jax.random.PRNGKey(43), (9, kernels.irreps_out.dim), jnp.float64)

    def gradients(conv, x, y, w):
        return [jax.grad(lambda *a: jnp.sum(conv(*a, src, dst, 9) * g), argnums=n)(x, y, w) for n in range(3)]

    before = _launches()
    actual = jax.jit(functools.partial(gradients, kernels))(x, y, w)
    joint = [dict(k.joint.outputs) for k in kernel_emulator.launched()[before:] if k.joint is not None]
    assert {"x": 0} in joint and {"y": 0} in joint and {"w": 0} in joint
    assert_close(actual, jax.jit(functools.partial(gradients, reference))(x, y, w), jnp.float64)


@pytest.mark.parametrize("sorted_by_dst, deterministic", [(False, False), (True, False), (False, True)])
def test_joint_passes_of_the_convolution_match_reference(sorted_by_dst, deterministic):
    """The passes by destination: z accumulated per run of one destination (long runs when
    sorted by dst), z̄ staged per run, x̄ added into source nodes; atomically, or by the warp
    that owns the node's sorted run in the deterministic variant."""
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto",
                                                  deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(41), kernels, 9, 50, jnp.float64, bad_fraction=0.1,
                        sorted_by_dst=sorted_by_dst)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, kernels, 9))(*args)
    joint = [dict(k.joint.outputs) for k in kernel_emulator.launched()[before:] if k.joint is not None]
    assert {"z": 0} in joint and {"x": 0, "y": 1, "w": 2} in joint
    assert {"y": 0} in joint  # the force loss's ȳ of the gradient: z̄ gathered, one output
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(*args), jnp.float64)


@pytest.mark.parametrize("warps, one_block, num_nodes, num_edges", [(2, False, 9, 60), (4, False, 4, 100),
                                                                    (4, True, 9, 60)])
def test_deterministic_walks_in_lockstep_match_reference(warps, one_block, num_nodes, num_edges, planned_with):
    """Every walk over sorted runs in lockstep (``DEFAULTS.lockstep_warps``): the block's warps
    walk consecutive runs as long as the longest (a 90-edge run beside empty ones with 4 nodes),
    out-of-range indices and isolated nodes included; ``one_block``: a grid of one block walks
    every run in turn. (The backward walks by source: ``DETERMINISTIC_BACKWARD_SLICE_BYTES`` off; the
    forward walks its runs too: no bytes for the tiled forward's partial rows.)"""
    planned_with(lockstep_warps=((0, warps),), deterministic_backward_slice_bytes=0, tiled_forward_max_bytes=0,
                 **({"max_blocks": 1} if one_block else {}))
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=True)
    args = random_graph(jax.random.PRNGKey(num_nodes), kernels, num_nodes, num_edges, jnp.float64, bad_fraction=0.1)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, kernels, num_nodes))(*args)
    walks = [k for k in kernel_emulator.launched()[before:] if k.tiling == "segments"]
    assert walks and all(k.lockstep and k.warps_per_block == warps for k in walks)
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, num_nodes))(*args), jnp.float64)


def _no_path_to_3o_pair():
    """32x0e+32x1o over 0e+1o+2e into 32x0e+32x1o+32x2e+32x3o: no path writes the 3o block."""
    instructions = [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True), (0, 2, 2, "uvu", True), (1, 1, 4, "uvu", True)]
    return pair(("32x0e+32x1o", "0e+1o+2e", "32x0e+32x1o+32x2e+32x3o+32x0e", instructions, {}),
                jax_cgtp.TensorProductConv, "auto", deterministic=True)


def _hub_and_node_of_padding_sources(src, dst):
    """Node 4 receives a third of the edges; node 5's edges all come from out-of-range sources."""
    dst = dst.at[::3].set(4)
    return jnp.where(dst == 5, -1, src), dst


@pytest.mark.parametrize("make_pair", [
    functools.partial(spherical_harmonics_pair, jax_cgtp.TensorProductConv, kernels="auto", deterministic=True),
    _no_path_to_3o_pair])
def test_deterministic_forward_in_tiles_sums_the_partial_rows_in_order(make_pair, planned_with):
    """The deterministic forward whose walk would run in lockstep (here every walk,
    ``LOCKSTEP_WARPS``) walks the atomic forward's 32-edge tiles of dst-sorted edges: runs inside a
    tile are stored as rows, runs across a tile's edge go to the tile's partial rows (poisoned), and
    a second launch sums those in tile order. Node 4 receives a third of the edges (a run over several
    tiles), node 5's edges all come from out-of-range sources (a row of zeros), the last nodes receive
    none; a block of z that no path writes is zeros. Every member matches the reference, and the
    forward is the same bits twice."""
    planned_with(lockstep_warps=((0, 4),))
    kernels, reference = make_pair()
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(7), kernels, 12, 150, jnp.float64, bad_fraction=0.1,
                                     edit=_hub_and_node_of_padding_sources)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, kernels, 12))(x, y, w, src, dst)
    launched = kernel_emulator.launched()[before:]
    walk = next(k for k in launched if k.partial_tiles)
    assert walk.call.walk == "z" and walk.outputs[0].flush == "tile" and walk.ahead and not walk.fill
    assert any(k.tile_sum == walk.partial_tiles for k in launched)
    assert not any(k.lockstep for k in launched if [o.role for o in k.call.outputs] == ["z"])
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 12))(x, y, w, src, dst), jnp.float64)
    forward = jax.jit(kernels, static_argnums=5)
    first, again = forward(x, y, w, src, dst, 12), forward(x, y, w, src, dst, 12)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(again))
    np.testing.assert_array_equal(np.asarray(first[5]), 0.0)


def test_deterministic_forward_keeps_the_lockstep_walk_where_partial_rows_would_pass_the_cap(planned_with):
    """Above ``TILED_FORWARD_MAX_BYTES`` of partial rows (a graph of many edges; here 150 edges) the
    deterministic forward walks its runs in lockstep, with no partial rows, and matches the reference."""
    planned_with(lockstep_warps=((0, 4),), tiled_forward_max_bytes=1000)
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=True)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(8), kernels, 12, 150, jnp.float64, bad_fraction=0.1)
    before = _launches()
    actual = jax.jit(kernels, static_argnums=5)(x, y, w, src, dst, 12)
    launched = kernel_emulator.launched()[before:]
    assert not any(k.partial_tiles or k.tile_sum for k in launched)
    assert any(k.lockstep for k in launched)
    assert_close(actual, jax.jit(reference, static_argnums=5)(x, y, w, src, dst, 12), jnp.float64)


@pytest.mark.parametrize("resident_blocks", [1, 3, 10**6])
def test_filling_launches_spread_the_edges_over_the_warps_they_get(resident_blocks, monkeypatch):
    """600 edges over the warps of 1 or 3 resident blocks (rounds of 30 and 25 edges per warp), or
    over every warp the launch asks for (spans of 8 edges): each edge is walked once."""
    monkeypatch.setattr(kernel_emulator, "RESIDENT_BLOCKS", resident_blocks)
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto")
    args = random_graph(jax.random.PRNGKey(43), kernels, 40, 600, jnp.float64, bad_fraction=0.05,
                        sorted_by_dst=True)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, kernels, 40))(*args)
    assert any(k.fill for k in kernel_emulator.launched()[before:])
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 40))(*args), jnp.float64)


def test_members_of_a_high_l_product_match_reference():
    """l = 4 spherical harmonics and 19 paths on one x block: y loaded per path, and in float64
    the block's weights loaded in batches."""
    kernels, reference = high_l_pair(kernels="auto")
    keys = jax.random.split(jax.random.PRNGKey(52), 4)
    x, y, w, g = (jax.random.normal(k, (5, d), jnp.float64) for k, d in zip(
        keys, (kernels.irreps_in1.dim, kernels.irreps_in2.dim, kernels.weight_numel, kernels.irreps_out.dim)))
    assert_close(jax.jit(functools.partial(members, kernels))(x, y, w, g),
                 jax.jit(functools.partial(members, reference))(x, y, w, g), jnp.float64)


@pytest.fixture
def long_code():
    """Joint passes of more than 100 CG terms walk the tile's edges in groups of at most 150: all
    of the high-l pair's then walk (at the library's thresholds only its passes of several terms
    do, in whole x blocks)."""
    with jax_cgtp.config(walk_terms=100, multi_term_walk_terms=100, grouped_terms_by_destination=100,
                         walk_group_terms=150, walk_group_terms_by_destination=150, wide_group_terms_by_destination=150):
        yield


def _splits_an_x_block(joint) -> bool:
    """Whether the joint pass takes an x block's paths in several groups (blocks of one x offset)."""
    return len(joint.blocks) > len({x_offset for x_offset, *_ in joint.blocks})


def _walked_in_groups(before):
    """The joint passes launched since ``before`` all walk, and one of them splits an x block."""
    joint = [k.joint for k in kernel_emulator.launched()[before:] if k.joint is not None]
    assert joint and all(j.walk for j in joint)
    assert any(_splits_an_x_block(j) for j in joint)
    return joint


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_product_with_long_code_walks_the_tile_in_path_groups(dtype, long_code):
    """Every member of the product, its passes walking 37 edges (a full tile and 5) group by
    group: z written per edge and group, x̄ stored by a block's first group and added to by the
    later ones, ȳ summed over the groups in the tile's rows."""
    kernels, reference = high_l_pair(kernels="auto")
    keys = jax.random.split(jax.random.PRNGKey(54), 4)
    x, y, w, g = (jax.random.normal(k, (37, d), dtype) for k, d in zip(
        keys, (kernels.irreps_in1.dim, kernels.irreps_in2.dim, kernels.weight_numel, kernels.irreps_out.dim)))
    before = _launches()
    actual = jax.jit(functools.partial(members, kernels))(x, y, w, g)
    outputs = [dict(j.outputs) for j in _walked_in_groups(before)]
    assert {"z": 0} in outputs and {"x": 0, "y": 1, "w": 2} in outputs
    as64 = [a.astype(jnp.float64) for a in (x, y, w, g)]
    assert_close(actual, jax.jit(functools.partial(members, reference))(*as64), dtype)


@pytest.mark.parametrize("deterministic", [False, True])
def test_convolution_with_long_code_walks_path_groups(deterministic, long_code):
    """The convolution's passes in groups: x̄ of a source added atomically by every group, or, in
    the deterministic walk by source, written by the run's first group and added to by the
    later ones."""
    kernels, reference = high_l_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(55), kernels, 9, 50, jnp.float64, bad_fraction=0.1)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, kernels, 9))(*args)
    _walked_in_groups(before)
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(*args), jnp.float64)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("deterministic", [False, True])
def test_high_l_convolution_forward_walks_path_groups(dtype, deterministic):
    """A 2e block with 125 z components: either forward by destination walks it in groups of at
    most 64 (24 for the atomic walk in float64), each node's z written by every group."""
    kernels, reference = high_l_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=deterministic)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(51), kernels, 9, 50, dtype, bad_fraction=0.1,
                                     sorted_by_dst=True)
    actual, launch = _forward_and_its_launch(kernels, x, y, w, src, dst)
    assert _splits_an_x_block(launch.joint)
    as64 = [a.astype(jnp.float64) for a in (x, y, w)]
    assert_close(actual, jax.jit(reference, static_argnums=5)(*as64, src, dst, 9), dtype)


def test_high_l_convolution_backward_in_blocks_of_fewer_warps_matches_reference():
    """The atomic backward of a 2e block of 125 z components, in float64: z̄ staged per lane needs
    more shared memory than four warps of a block may have together, so its blocks are smaller."""
    kernels, reference = high_l_pair(jax_cgtp.TensorProductConv, kernels="auto")
    args = random_graph(jax.random.PRNGKey(53), kernels, 9, 50, jnp.float64, bad_fraction=0.1)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, kernels, 9))(*args)
    assert any(k.warps_per_block < schedule.WARPS_PER_BLOCK for k in kernel_emulator.launched()[before:])
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(*args), jnp.float64)


@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("deterministic", [False, True])
def test_convolution_forward_looks_ahead_through_a_ring(depth, deterministic, planned_with):
    """The forward by destination copies each edge's x chunk and weights ``depth`` edges ahead into
    a ring of ``depth + 1`` slots (``DEFAULTS.ahead_depth``, ``OWNED_AHEAD_DEPTH`` when
    deterministic), and its JVP (x, y and w tangents: two x and two w inputs) shares the slots
    between its inputs."""
    planned_with(ahead_depth=depth, owned_ahead_depth=depth)
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto",
                                                  deterministic=deterministic)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(depth), kernels, 9, 70, jnp.float64, bad_fraction=0.1)
    tangents = tuple(jax.random.normal(jax.random.PRNGKey(7 + n), a.shape, a.dtype) for n, a in enumerate((x, y, w)))

    def forward_and_jvp(conv, *primals):
        return jax.jvp(lambda *a: conv(*a, src, dst, 9), primals, tangents)

    before = _launches()
    actual = jax.jit(functools.partial(forward_and_jvp, kernels))(x, y, w)
    walks = [k for k in kernel_emulator.launched()[before:] if k.joint is not None and k.joint.by_destination]
    assert walks and all(k.ahead == depth for k in walks)
    assert any(len(k.joint.reads("w")) == 2 for k in walks)
    assert_close(actual, jax.jit(functools.partial(forward_and_jvp, reference))(x, y, w), jnp.float64)


VECTOR_COPY = re.compile(r"cgtp_copy_vectors?<\d")  # a generated 16-byte copy (not the header's definition)


def _forward_and_jvp_walks(make_pair, deterministic, dtype, seed):
    """A convolution's forward and JVP (two x and two w inputs) on 9 nodes and 70 edges, on
    ``make_pair``'s kernels and on its reference: ``(walks, actual, expected)``, ``walks`` the
    schedules of the kernels' forward walks with a look-ahead ring."""
    kernels, reference = make_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=deterministic)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(seed), kernels, 9, 70, dtype, bad_fraction=0.1)
    tangents = tuple(jax.random.normal(jax.random.PRNGKey(seed + 1 + n), a.shape, a.dtype)
                     for n, a in enumerate((x, y, w)))

    def forward_and_jvp(conv, *arrays):
        primals, dots = arrays[:3], arrays[3:]
        return jax.jvp(lambda *a: conv(*a, src, dst, 9), primals, dots)

    before = _launches()
    actual = jax.jit(functools.partial(forward_and_jvp, kernels))(x, y, w, *tangents)
    walks = [k for k in kernel_emulator.launched()[before:] if k.ahead]
    expected = jax.jit(functools.partial(forward_and_jvp, reference))(*in_float64((x, y, w, *tangents)))
    return walks, actual, expected


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("problem", ["whole chunks", "interleaved paths"])
def test_convolution_forward_ring_copies_sixteen_bytes_per_lane(problem, deterministic, dtype):
    """Where a block's chunks are whole and its offsets are multiples of 16 bytes, each lane copies
    16 bytes into the look-ahead ring at a time (``DEFAULTS.ahead_copy_bytes``): the x chunk, and
    the weights of 16 bytes' worth of paths per instruction (four in float32, two in float64),
    their offsets evenly spaced or not.
    The forward and its JVP (two x and two w inputs) match the reference."""
    make_pair = whole_chunks_pair if problem == "whole chunks" else interleaved_whole_chunks_pair
    walks, actual, expected = _forward_and_jvp_walks(make_pair, deterministic, dtype, 61)
    width = 16 // jnp.dtype(dtype).itemsize
    assert walks and all(k.ring_copy_width(x_offset, mul, paths) == width
                         for k in walks for x_offset, mul, _, paths in k.joint.blocks)
    source = codegen.generate(walks[0])
    assert VECTOR_COPY.search(source) and "cgtp_copy_element(slot_a" not in source
    assert ("n_a == 0 ?" in source) == (problem == "interleaved paths" and width == 4)  # (two are evenly spaced)
    assert_close(actual, expected, dtype)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("deterministic", [False, True])
def test_convolution_forward_walks_blocks_of_one_mul_together(deterministic, dtype):
    """The 0e and 1o blocks of 33 channels walk as one group (a partial chunk: copied into the ring
    element by element), the 5-channel 2e block alone; the forward and its JVP (two x and two w
    inputs) match the reference."""
    walks, actual, expected = _forward_and_jvp_walks(equal_mul_blocks_pair, deterministic, dtype, 65)
    assert walks and all(k.joint.walk_groups == ((0, 1), (2,)) for k in walks)
    assert not VECTOR_COPY.search(codegen.generate(walks[0]))
    assert_close(actual, expected, dtype)


@pytest.mark.parametrize("make_pair", [whole_chunks_pair, equal_mul_blocks_pair])
@pytest.mark.parametrize("deterministic, shared, dtype", [(False, False, jnp.float64), (True, True, jnp.float64),
                                                          (True, False, jnp.float32)])
def test_convolution_backward_walks_blocks_of_one_mul_together(make_pair, deterministic, shared, dtype):
    """The backward walks by destination (the fused backward, the second derivative's passes) take
    consecutive x blocks of equal ``mul`` as one group (MERGED_BACKWARD_WALK_Z_COMPONENTS, by dtype):
    every member matches the reference, with weights per edge or shared, x̄ added atomically or
    through the deterministic rows."""
    kernels, reference = make_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(67), kernels, 9, 70, dtype, bad_fraction=0.1, shared=shared)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, kernels, 9))(*args)
    backward = [k for k in kernel_emulator.launched()[before:]
                if k.joint is not None and k.joint.by_destination and set(dict(k.joint.outputs)) != {"z"}]
    assert backward and all(any(len(group) > 1 for group in k.joint.walk_groups) for k in backward)
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(*args), dtype)


def test_convolution_forward_ring_copies_elements_where_a_block_is_not_whole(planned_with):
    """A block of 33 channels (a partial chunk), or any block with ``AHEAD_COPY_BYTES = 0``, is
    copied into the ring element by element."""
    kernels, _ = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto")
    whole, _ = whole_chunks_pair(jax_cgtp.TensorProductConv, kernels="auto")
    for conv in (kernels, whole):
        x, y, w, src, dst = random_graph(jax.random.PRNGKey(63), conv, 9, 40, jnp.float64)
        jax.jit(conv, static_argnums=5)(x, y, w, src, dst, 9)
    walk, whole_walk = (k for k in kernel_emulator.launched()[-4:] if k.ahead and not k.beyond_cap)
    assert all(walk.ring_copy_width(o, mul, paths) == 1 for o, mul, _, paths in walk.joint.blocks)
    assert not VECTOR_COPY.search(codegen.generate(walk))
    planned_with(ahead_copy_bytes=0)
    assert whole_walk.ring_copy_width(0, 64, whole_walk.joint.blocks[0][3]) == 2
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(64), whole, 9, 41, jnp.float64)  # (traced anew)
    before = _launches()
    jax.jit(whole, static_argnums=5)(x, y, w, src, dst, 9)
    assert all(k.ahead_copy_bytes == 0 and not VECTOR_COPY.search(codegen.generate(k))
               for k in kernel_emulator.launched()[before:] if k.ahead)


@pytest.mark.parametrize("sorted_by_dst", [False, True])
def test_convolution_forward_with_path_groups_matches_reference(sorted_by_dst, planned_with):
    """In float64 the atomic forward by destination walks a wide block's paths group by group: of
    at most 64 z components, and of at most 24 in passes of long code (``SCATTER_Z_MIN_TERMS``,
    lowered here to cover them). It is the forward taken where the walk over destination runs
    would run in lockstep (long code; here every walk, ``LOCKSTEP_WARPS``)."""
    planned_with(scatter_z_min_terms=0, lockstep_warps=((0, 4),))
    kernels, reference = wide_block_pair(jax_cgtp.TensorProductConv, kernels="auto")
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(44), kernels, 9, 50, jnp.float64, bad_fraction=0.1,
                                     sorted_by_dst=sorted_by_dst)
    actual, launch = _forward_and_its_launch(kernels, x, y, w, src, dst)
    assert launch.call.walk == "z" and launch.outputs[0].flush == "atomic"
    assert _splits_an_x_block(launch.joint)
    assert max(sum(p.z_dim for p in paths) for *_, paths in launch.joint.blocks) <= DEFAULTS.by_size(
        "scatter_z_components", 8)
    assert_close(actual, jax.jit(reference, static_argnums=5)(x, y, w, src, dst, 9), jnp.float64)


@pytest.mark.parametrize("sorted_by_dst, deterministic, z_apart",
                         [(False, False, False), (True, False, False), (False, True, False), (False, False, True)])
def test_second_derivatives_of_the_convolution_are_joint_passes(sorted_by_dst, deterministic, z_apart, planned_with):
    """The force loss's second derivative when x, y and w all depend on the positions: x̄, ȳ, w̄
    and z, sums of terms over two inputs of each of x, y and w, in one walk by destination
    (atomic, up to ``Z_WITH_BACKWARD_MAX_TERMS`` CG terms), or z in a forward by destination of
    its own (atomic above that: ``z_apart`` sets it to 0; deterministic: a walk by destination in
    slices, whose x̄ rows the next launches sum by source, and a forward by destination). Two paths have no weights, so that the terms of the weights'
    tangent skip them."""
    if z_apart:
        planned_with(z_with_backward_max_terms=0)
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto", unweighted=(1, 6),
                                                  deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(49), kernels, 9, 50, jnp.float64, bad_fraction=0.1,
                        sorted_by_dst=sorted_by_dst)
    before = _launches()
    actual = jax.jit(functools.partial(conv_second_derivatives, kernels, 9))(*args)
    walks = [k for k in kernel_emulator.launched()[before:] if not (k.slice_sum or k.chunk_sum)]
    assert all(k.joint is not None for k in walks)
    terms = ["".join(sorted(t.role for t in k.joint.terms)) for k in walks]
    apart = deterministic or z_apart
    assert ("wwxxyyzzz" in terms) != apart
    assert ("wwxxyy" in terms and "zzz" in terms) == apart
    assert_close(actual, jax.jit(functools.partial(conv_second_derivatives, reference, 9))(*args), jnp.float64)


@pytest.mark.parametrize("deterministic", [False, True])
def test_second_derivatives_of_the_convolution_with_long_code_walk_path_groups(deterministic, long_code):
    """The force loss's second derivative when x, y and w all depend on the positions, its passes
    of several terms (x̄, ȳ and w̄ of both versions of the inputs, and z with them in the atomic
    walk) taking each x block in groups of paths: x̄ added atomically, or owned by the warp of the
    source's run, group after group."""
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto", unweighted=(1, 6),
                                                  deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(56), kernels, 9, 50, jnp.float64, bad_fraction=0.1)
    before = _launches()
    actual = jax.jit(functools.partial(conv_second_derivatives, kernels, 9))(*args)
    grouped = [j for j in _walked_in_groups(before) if _splits_an_x_block(j)]
    assert max(len(j.terms) for j in grouped) >= 6
    assert_close(actual, jax.jit(functools.partial(conv_second_derivatives, reference, 9))(*args), jnp.float64)


@pytest.mark.parametrize("family, shared, edges, run_chunk, dtype", [
    (conv_members, False, 300, 128, jnp.float32), (conv_members, True, 50, 6, jnp.float64),
    (conv_second_derivatives, False, 50, 6, jnp.float64)])
def test_deterministic_backward_in_slices_walks_by_destination(family, shared, edges, run_chunk, dtype, planned_with):
    """With ``DETERMINISTIC_BACKWARD_SLICE_BYTES``, the deterministic backward walks by destination
    in four slices of dst-sorted positions: x̄ of each edge to the slice's rows, which the next
    launches add to the sources in src-sorted order (runs of more than 32 edges with 300 edges; runs
    longer than ``RUN_CHUNK`` in chunks, whose rows are added in chunk order), slice after slice; ȳ
    and w̄ per edge, a shared weight's gradient in partial rows; edges out of range and nodes
    without edges included; bitwise the same at a second call; every launch planned beforehand
    (:func:`~jax_cgtp.gpu.cuda_lowering.planned_kernels`, which precompile compiles). float32 runs with 64-bit types off,
    as most training does (the slices' start is an index, not a 64-bit scalar). The force loss's
    second derivatives too (x̄, ȳ and w̄ as sums of terms over both versions of the inputs; two
    paths without weights)."""
    kernels, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto", unweighted=(1, 6),
                                                  deterministic=True)
    itemsize = jnp.dtype(dtype).itemsize
    planned_with(deterministic_backward_slice_bytes=-(-edges // 4) * kernels.irreps_in1.dim * itemsize,
                 run_chunk=run_chunk)
    with jax.enable_x64(dtype == jnp.float64):
        args = random_graph(jax.random.PRNGKey(58), kernels, 9, edges, dtype, bad_fraction=0.1, shared=shared)
        runs = jnp.bincount(jnp.where(args[3] >= 0, args[3], 9), length=10)[:9]
        assert int(runs.max()) > min(run_chunk, 32)
        members = jax.jit(functools.partial(family, kernels, 9))
        before = _launches()
        actual = members(*args)
        launched = kernel_emulator.launched()[before:]
        again = members(*args)
        planned = cuda_lowering.planned_kernels(functools.partial(family, kernels, 9), *args)
    assert set(launched) <= set(planned)  # what precompile compiles: the later slices' variants too
    expected = jax.jit(functools.partial(family, reference, 9))(*in_float64(args))
    walks = [k for k in launched if k.slice_walk]
    chunked = run_chunk < edges
    assert walks and len([k for k in launched if k.slice_sum]) == len(walks)
    assert all(k.writes_slice_chunk_rows == chunked for k in launched if k.slice_sum)
    sums_of_chunks = [k for k in launched if k.chunk_sum and k.call.orderings == ("x",)]  # (not a forward's)
    assert len(sums_of_chunks) == (len(walks) if chunked else 0)
    assert len(walks) == 4 * sum(k.slice_first for k in walks)  # each sliced call: 4 slices, the first fresh
    assert_close(actual, expected, dtype)
    assert all(bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(again)))


def _streamed(before):
    return [dict(k.stream.outputs) for k in kernel_emulator.launched()[before:] if k.stream is not None]


def test_weight_streams_match_reference():
    """A fully connected product with per-edge weights: forward, fused backward, x̄ and ȳ alone
    stream the weights (19 edges: tiles of 8, 8 and 3)."""
    kernels, reference = fully_connected_pair(kernels="auto")
    keys = jax.random.split(jax.random.PRNGKey(47), 4)
    x, y, w, g = (jax.random.normal(k, (19, d), jnp.float64) for k, d in zip(
        keys, (kernels.irreps_in1.dim, kernels.irreps_in2.dim, kernels.weight_numel, kernels.irreps_out.dim)))
    before = _launches()
    actual = jax.jit(functools.partial(members, kernels))(x, y, w, g)
    streamed = _streamed(before)
    assert {"z": 0} in streamed and {"x": 0, "y": 1, "w": 2} in streamed
    assert {"x": 0} in streamed and {"y": 0} in streamed
    assert_close(actual, jax.jit(functools.partial(members, reference))(x, y, w, g), jnp.float64)


@pytest.mark.parametrize("sorted_by_dst, deterministic", [(False, False), (True, False), (False, True)])
def test_weight_streams_of_the_convolution_match_reference(sorted_by_dst, deterministic):
    """z summed per run of one destination (added atomically, or owned by the warp of the node's
    sorted run); x̄ added into source nodes; edges out of range give zero ȳ and w̄ rows."""
    kernels, reference = fully_connected_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(48), kernels, 9, 40, jnp.float64, bad_fraction=0.1,
                        sorted_by_dst=sorted_by_dst)
    before = _launches()
    actual = jax.jit(functools.partial(conv_members, kernels, 9))(*args)
    streamed = _streamed(before)
    assert {"z": 0} in streamed and {"x": 0, "y": 1, "w": 2} in streamed
    assert_close(actual, jax.jit(functools.partial(conv_members, reference, 9))(*args), jnp.float64)


def _shuffle_kernel(guard: str) -> str:
    """A warp reverses its lanes' values through a shuffle, the shuffle under ``guard``."""
    return (f'typedef float T;\nextern "C" __global__ void {kernel_emulator.codegen.KERNEL_NAME}(\n    T* out) {{\n'
            f"  T v = threadIdx.x;\n  if ({guard}) v = __shfl_sync(0xffffffffu, v, 31 - (threadIdx.x & 31));\n"
            "  out[blockIdx.x * blockDim.x + threadIdx.x] = v;\n}\n")


def test_emulator_runs_warp_synchronous_code():
    out = np.full(2 * 64, np.nan, np.float32)
    kernel_emulator.launch(_shuffle_kernel("true"), [out.ctypes.data], np.zeros(0), grid=2, block=64)
    np.testing.assert_array_equal(out, np.tile(np.concatenate([31 - np.arange(32), 63 - np.arange(32)]), 2))


def test_emulator_reports_a_barrier_in_divergent_control_flow():
    out = np.zeros(64, np.float32)
    with pytest.raises(RuntimeError, match="barriers that cannot open"):
        kernel_emulator.launch(_shuffle_kernel("threadIdx.x < 16"), [out.ctypes.data], np.zeros(0), grid=1, block=64)
