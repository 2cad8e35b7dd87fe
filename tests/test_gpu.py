"""The generated CUDA kernels against the pure-JAX reference, on an NVIDIA GPU (``pytest -m gpu``).

Outputs the kernels overwrite are poisoned with NaN before every launch
(``JAX_CGTP_POISON_OUTPUTS=1``), so an element a kernel forgets to write fails the comparison.
"""

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from family_members import (OWNED_FORWARD_ON_SMALL_GRAPHS, assert_close, conv_members, conv_second_derivatives,
                            equal_mul_blocks_pair, fully_connected_pair, grouping_index, high_l_pair, in_float64,
                            interleaved_whole_chunks_pair, long_code_pair, members, narrow_blocks_pair, pair,
                            random_graph, relative_error, second_derivatives, spherical_harmonics_pair,
                            squared_norm_and_gradients, uneven_chunks_pair, whole_chunks_pair, wide_block_pair,
                            with_sorted_graph)
from padding_cases import assert_half_precision_rounds_once, assert_padding_contributes_nothing
from random_problems import random_inputs, random_problem

import data_parallel
import edge_sharded
import explicit_sharded

import jax_cgtp
from jax_cgtp.gpu.cuda_lowering import planned_kernels, precompile
from jax_cgtp.core.problem import MODES

os.environ["JAX_CGTP_POISON_OUTPUTS"] = "1"
DEFAULTS = jax_cgtp.Settings()  # the library's settings

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not any(d.platform == "gpu" for d in jax.devices()), reason="needs an NVIDIA GPU"),
]
needs_two_gpus = pytest.mark.skipif(sum(d.platform == "gpu" for d in jax.devices()) < 2, reason="needs two NVIDIA GPUs")


def problem_cases(dtype, seeds):
    cases = []
    for seed in seeds:
        spec = random_problem(seed, mode=MODES[seed % 5], lmax=5 if seed % 10 == 3 else 3)
        cuda, reference = pair(spec)
        x, y, w = random_inputs(jax.random.PRNGKey(seed), spec, (37,), cuda.weight_numel, dtype, seed % 3 == 0)
        g = jax.random.normal(jax.random.PRNGKey(seed + 1000), (37, cuda.irreps_out.dim), dtype)
        cases.append((cuda, reference, (x, y, w, g)))
    return cases


@functools.lru_cache(maxsize=None)
def compiled_cases(dtype, seeds):
    cases = problem_cases(dtype, seeds)
    precompile(lambda args: [members(cuda, *a) for (cuda, _, _), a in zip(cases, args)], [c[2] for c in cases])
    return cases


SEEDS_64 = tuple(range(30))
SEEDS_32 = tuple(range(0, 30, 3))


@pytest.mark.slow_compile  # the first test of a worker compiles all 30 problems' kernels
@pytest.mark.parametrize("index", range(len(SEEDS_64)))
def test_every_member_matches_reference_float64(index):
    cuda, reference, args = compiled_cases(jnp.float64, SEEDS_64)[index]
    assert_close(jax.jit(functools.partial(members, cuda))(*args),
                 jax.jit(functools.partial(members, reference))(*args), jnp.float64)


@pytest.mark.parametrize("index", range(len(SEEDS_32)))
def test_every_member_matches_reference_float32(index):
    cuda, reference, args = compiled_cases(jnp.float32, SEEDS_32)[index]
    expected = jax.jit(functools.partial(members, reference))(*(a.astype(jnp.float64) for a in args))
    assert_close(jax.jit(functools.partial(members, cuda))(*args), expected, jnp.float32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("operand", [0, 1, 2])
def test_check_grads_orders_1_and_2(mode, operand):
    spec = random_problem(500 + MODES.index(mode), mode=mode, lmax=2)
    cuda, _ = pair(spec)
    args = list(random_inputs(jax.random.PRNGKey(3), spec, (5,), cuda.weight_numel, jnp.float64, False))

    def of_one(a):  # linear in a: finite differences are exact up to rounding
        return cuda(*(args[:operand] + [a] + args[operand + 1:]))

    check_grads(of_one, (args[operand],), order=2, modes=("fwd", "rev"), atol=1e-7, rtol=1e-7)


def test_hessian_matches_reference():
    spec = random_problem(601, mode="uvu", lmax=2)
    cuda, reference = pair(spec)
    x, y, w = random_inputs(jax.random.PRNGKey(4), spec, (3,), cuda.weight_numel, jnp.float64)

    def energy(tp, y):
        return jnp.sum(jnp.sin(tp(x, y, w)))

    assert_close(jax.hessian(functools.partial(energy, cuda))(y), jax.hessian(functools.partial(energy, reference))(y),
                 jnp.float64)


def test_vmap_matches_loop():
    spec = random_problem(602, mode="uvw", lmax=2)
    cuda, _ = pair(spec)
    x, y, w = random_inputs(jax.random.PRNGKey(5), spec, (4, 6), cuda.weight_numel, jnp.float64, False)
    looped = jnp.stack([cuda(x[i], y[i], w[i]) for i in range(4)])
    assert_close(jax.vmap(cuda)(x, y, w), looped, jnp.float64)
    grad = jax.grad(lambda w: jnp.sum(cuda(x[0], y[0], w) ** 2))
    ws = jax.random.normal(jax.random.PRNGKey(6), (3, cuda.weight_numel), jnp.float64)
    assert_close(jax.vmap(grad)(ws), jnp.stack([grad(v) for v in ws]), jnp.float64)


@pytest.mark.parametrize("batch", [0, 1, 7, 1_000_003])
def test_batch_sizes(batch):
    spec = random_problem(603, mode="uvu", lmax=2)
    cuda, reference = pair(spec)
    args = random_inputs(jax.random.PRNGKey(7), spec, (batch,), cuda.weight_numel, jnp.float32, False)
    actual = jax.jit(functools.partial(squared_norm_and_gradients, cuda))(*args)
    expected = jax.jit(functools.partial(squared_norm_and_gradients, reference))(
        *(a.astype(jnp.float64) for a in args))
    if batch == 0:
        assert all(a.size == 0 for a in jax.tree.leaves(actual[1]))
        assert float(actual[0]) == 0.0
    else:
        assert_close(actual, expected, jnp.float32)


@pytest.mark.parametrize("batch", [700, 1500, 3000, 5000, 12_000, 40_000])
def test_shared_weight_gradient_for_every_tile_size(batch):
    """Shared weights: the weight gradient's tile shrinks with the batch (1 to 32 edges)."""
    spec = random_problem(611, mode="uvw", lmax=2)
    cuda, reference = pair(spec)
    args = random_inputs(jax.random.PRNGKey(8), spec, (batch,), cuda.weight_numel, jnp.float64, True)
    actual = jax.jit(functools.partial(squared_norm_and_gradients, cuda))(*args)
    assert_close(actual, jax.jit(functools.partial(squared_norm_and_gradients, reference))(*args), jnp.float64)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_auto_with_shared_uvw_weights_matches_reference(dtype):
    """``backend="auto"`` runs the forward of a ``uvw`` product with shared weights on the kernels
    and its derivatives on XLA (``cuda_lowering.runs_on_xla``): derivatives of order 1 and 2 agree."""
    spec = random_problem(612, mode="uvw", lmax=2)
    auto, reference = pair(spec, kernels="auto")
    args = random_inputs(jax.random.PRNGKey(9), spec, (3000,), auto.weight_numel, dtype, True)
    actual = jax.jit(functools.partial(squared_norm_and_gradients, auto))(*args)
    expected = jax.jit(functools.partial(squared_norm_and_gradients, reference))(*(a.astype(jnp.float64) for a in args))
    assert_close(actual, expected, dtype)
    x, y, w = (a.astype(jnp.float64) for a in args)
    check_grads(lambda w, x: auto(x, y[:50], w), (w, x[:50]), order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("pairing", [spherical_harmonics_pair, high_l_pair,
                                     pytest.param(long_code_pair, marks=pytest.mark.slow_compile), fully_connected_pair])
def test_joint_passes_and_weight_streams_match_reference(pairing, dtype):
    """Spherical-harmonics paths: forward, fused backward and ȳ alone run as joint passes (``uvu``;
    with l = 4 harmonics each path of the forward loads its y components and float64 loads a wide
    block's weights in batches, while the passes of several terms walk tiles of edges; with l = 5
    harmonics every pass walks tiles of edges path group by path group) or stream the per-edge
    weights through shared memory (``uvw``: x̄ alone too); 1001 edges."""
    cuda, reference = pairing()
    keys = jax.random.split(jax.random.PRNGKey(42), 4)
    x, y, w, g = (jax.random.normal(k, (1001, d), dtype) for k, d in zip(
        keys, (cuda.irreps_in1.dim, cuda.irreps_in2.dim, cuda.weight_numel, cuda.irreps_out.dim)))
    expected = jax.jit(functools.partial(members, reference))(*(a.astype(jnp.float64) for a in (x, y, w, g)))
    assert_close(jax.jit(functools.partial(members, cuda))(x, y, w, g), expected, dtype)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_forward_tiles_shared_by_chunk_warps_match_reference(dtype, shared):
    """The product's forward with four warps per tile, each running every fourth 32-channel chunk
    (``DEFAULTS.chunk_warps``): x blocks of five chunks, two and one; 1001 edges, per-edge or
    shared weights; every family member."""
    cuda, reference = uneven_chunks_pair()
    keys = jax.random.split(jax.random.PRNGKey(44), 4)
    x, y, g = (jax.random.normal(k, (1001, d), dtype) for k, d in zip(
        keys, (cuda.irreps_in1.dim, cuda.irreps_in2.dim, cuda.irreps_out.dim)))
    w = jax.random.normal(keys[3], (cuda.weight_numel,) if shared else (1001, cuda.weight_numel), dtype)
    [forward] = planned_kernels(cuda, x, y, w)
    assert forward.chunk_warps == 4
    expected = jax.jit(functools.partial(members, reference))(*(a.astype(jnp.float64) for a in (x, y, w, g)))
    assert_close(jax.jit(functools.partial(members, cuda))(x, y, w, g), expected, dtype)


@pytest.mark.parametrize("make_pair, parts, group", [(narrow_blocks_pair, 4, 4), (uneven_chunks_pair, 2, 8)])
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_forward_tiles_shared_by_path_warps_match_reference(dtype, make_pair, parts, group, planned_with):
    """The product's forward with its paths in parts (``DEFAULTS.path_warps``), each run by its warps
    of the tile's group: four parts of x blocks of one chunk each, or two parts of four warps that
    split blocks of up to five chunks; 1001 edges; every family member."""
    planned_with(path_warps=parts, max_tile_group=16)
    cuda, reference = make_pair()
    keys = jax.random.split(jax.random.PRNGKey(46), 4)
    x, y, w, g = (jax.random.normal(k, (1001, d), dtype) for k, d in zip(
        keys, (cuda.irreps_in1.dim, cuda.irreps_in2.dim, cuda.weight_numel, cuda.irreps_out.dim)))
    [forward] = planned_kernels(cuda, x, y, w)
    assert forward.num_groups == group and forward.path_warps == parts
    expected = jax.jit(functools.partial(members, reference))(*(a.astype(jnp.float64) for a in (x, y, w, g)))
    assert_close(jax.jit(functools.partial(members, cuda))(x, y, w, g), expected, dtype)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_second_derivatives_of_the_product_match_reference(dtype):
    """The force loss's second derivative when x, y and w all depend on the positions: joint
    passes producing x̄, ȳ and w̄, and z, from both versions of x, y and w; two paths without
    weights; 1001 edges."""
    cuda, reference = spherical_harmonics_pair(unweighted=(1, 6))
    keys = jax.random.split(jax.random.PRNGKey(50), 3)
    x, y, w = (jax.random.normal(k, (1001, d), dtype) for k, d in zip(
        keys, (cuda.irreps_in1.dim, cuda.irreps_in2.dim, cuda.weight_numel)))
    expected = jax.jit(functools.partial(second_derivatives, reference))(*(a.astype(jnp.float64) for a in (x, y, w)))
    assert_close(jax.jit(functools.partial(second_derivatives, cuda))(x, y, w), expected, dtype)


# ---- graph convolution


def _assert_conv_members_match(cuda, reference, num_nodes, args, dtype):
    """Every convolution family member on the kernels against the reference in float64 (the same
    graph, its floating arrays cast), to the tolerance of ``dtype``."""
    expected = jax.jit(functools.partial(conv_members, reference, num_nodes))(*in_float64(args))
    assert_close(jax.jit(functools.partial(conv_members, cuda, num_nodes))(*args), expected, dtype)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("seed", range(4))
def test_convolution_matches_reference(deterministic, dtype, seed):
    spec = random_problem(700 + seed, mode=("uvu", "uvw", "uvv", "uuu")[seed], lmax=3)
    cuda, reference = pair(spec, jax_cgtp.TensorProductConv, deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(seed), cuda, 50, 800, dtype, bad_fraction=0.05, shared=seed == 1)
    _assert_conv_members_match(cuda, reference, 50, args, dtype)


@pytest.mark.parametrize("index_dtype", [jnp.int32, jnp.int64])
@pytest.mark.parametrize("edges, rows, order", [(0, 5, "random"), (1, 0, "random"), (5000, 300, "random"),
                                                (1_000_003, 40_000, "random"), (1_000_003, 40_000, "sorted"),
                                                (1_000_003, 40_000, "one_swap"), (300_000, 2_000_000, "random")])
def test_grouping_kernel_groups_edges_by_index(edges, rows, order, index_dtype):
    """The counting sort of an atomic convolution without ``graph=``: the stable sort's offsets and
    the longest run, and each run holding the stable sort's edges (in any order; the identity where
    the edges came sorted), out-of-range edges included, over more nodes than edges too."""
    index = grouping_index(edges, rows, order, index_dtype)
    perm, offsets = jax.jit(lambda i: jax_cgtp.core.grouping.group_edges(i, rows))(index)
    stable_perm, stable_offsets = jax.jit(lambda i: jax_cgtp.core.graph.sort_edges(i, rows))(index)
    np.testing.assert_array_equal(offsets[:-1], stable_offsets)
    assert offsets[-1] == np.max(np.diff(stable_offsets), initial=0)  # the longest run
    if order == "sorted":
        np.testing.assert_array_equal(perm, np.arange(edges))
    bounds = np.concatenate([[0], np.asarray(offsets[:-1]), [edges]])
    run = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))  # the run of each sorted position

    def sorted_within_runs(p):
        p = np.asarray(p)
        return p[np.lexsort((p, run))]

    np.testing.assert_array_equal(sorted_within_runs(perm), sorted_within_runs(stable_perm))


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("sorted_by_dst", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_joint_passes_of_the_convolution_match_reference(dtype, sorted_by_dst, deterministic):
    """The joint passes by destination (runs of one destination, long when sorted), atomic or
    walking each node's sorted run in the deterministic variant."""
    cuda, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(43), cuda, 300, 5000, dtype, bad_fraction=0.05, sorted_by_dst=sorted_by_dst)
    _assert_conv_members_match(cuda, reference, 300, args, dtype)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("deterministic", [False, True])
def test_joint_passes_of_the_convolution_sum_shared_weights(dtype, deterministic):
    """Weights shared by every edge: the joint backward passes sum w̄ over each warp's edges in
    registers and add it to the warp's partial row; every member matches the reference."""
    cuda, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(44), cuda, 300, 5000, dtype, bad_fraction=0.05, shared=True)
    _assert_conv_members_match(cuda, reference, 300, args, dtype)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("sorted_by_dst", [False, True])
@pytest.mark.parametrize("make_pair", [spherical_harmonics_pair, high_l_pair, fully_connected_pair])
def test_atomic_convolution_with_a_sorted_graph_matches_reference(dtype, sorted_by_dst, make_pair):
    """With ``graph=``, the atomic variant's forward walks the destination runs (where that is
    faster) and its atomic kernels visit the edges in ``dst``-sorted order."""
    cuda, reference = make_pair(jax_cgtp.TensorProductConv)
    args = random_graph(jax.random.PRNGKey(47), cuda, 300, 5000, dtype, bad_fraction=0.05, sorted_by_dst=sorted_by_dst)
    _assert_conv_members_match(with_sorted_graph(cuda), reference, 300, args, dtype)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("sorted_by_dst", [False, True])
def test_atomic_forward_on_few_nodes_matches_reference(dtype, sorted_by_dst, planned_with):
    """On fewer nodes than ``Settings.owned_forward_min_nodes`` (the library's), the atomic variant's forward
    adds each edge's z atomically instead of walking destination runs; every member matches."""
    cuda, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv)
    args = random_graph(jax.random.PRNGKey(48), cuda, 300, 5000, dtype, bad_fraction=0.05, sorted_by_dst=sorted_by_dst)
    _assert_conv_members_match(cuda, reference, 300, args, dtype)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("deterministic", [False, True])
def test_high_l_convolution_matches_reference(dtype, deterministic):
    """A 2e block of 125 z components over l = 4 harmonics: both forwards by destination walk it
    in path groups."""
    cuda, reference = high_l_pair(jax_cgtp.TensorProductConv, deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(46), cuda, 300, 5000, dtype, bad_fraction=0.05, sorted_by_dst=False)
    _assert_conv_members_match(cuda, reference, 300, args, dtype)


@pytest.mark.slow_compile
@pytest.mark.parametrize("dtype, deterministic", [(jnp.float64, False), (jnp.float64, True), (jnp.float32, False)])
def test_convolution_with_long_code_matches_reference(dtype, deterministic):
    """l <= 5 harmonics (4,885 CG nonzeros): the walks by destination (and by source) take each
    x block in groups of paths, x̄ added to by every group."""
    cuda, reference = long_code_pair(jax_cgtp.TensorProductConv, deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(57), cuda, 300, 3000, dtype, bad_fraction=0.05)
    _assert_conv_members_match(cuda, reference, 300, args, dtype)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("sorted_by_dst", [False, True])
@pytest.mark.parametrize("scatter_z_min_terms", [None, 0])
def test_convolution_with_wide_blocks_matches_reference(dtype, sorted_by_dst, scatter_z_min_terms, planned_with):
    """Blocks with more z components than a walk by destination holds at once: its forward walks
    them path group by path group, of at most 64 z components, and in the float64 atomic walk of
    at most 24 when the pass has more than ``DEFAULTS.scatter_z_min_terms`` CG terms (0: this
    one's 524 too)."""
    if scatter_z_min_terms is not None:
        planned_with(scatter_z_min_terms=scatter_z_min_terms)
    cuda, reference = wide_block_pair(jax_cgtp.TensorProductConv)
    args = random_graph(jax.random.PRNGKey(45), cuda, 300, 5000, dtype, bad_fraction=0.05, sorted_by_dst=sorted_by_dst)
    _assert_conv_members_match(cuda, reference, 300, args, dtype)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("sorted_by_dst", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_weight_streams_of_the_convolution_match_reference(dtype, sorted_by_dst, deterministic):
    """z summed per run of one destination (atomically, or owned by the warp of the node's sorted
    run), x̄ added into source nodes, out-of-range edges giving zero ȳ and w̄ rows."""
    cuda, reference = fully_connected_pair(jax_cgtp.TensorProductConv, deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(48), cuda, 300, 5000, dtype, bad_fraction=0.05, sorted_by_dst=sorted_by_dst)
    _assert_conv_members_match(cuda, reference, 300, args, dtype)


@pytest.mark.parametrize("deterministic", [False, True])
def test_single_operand_gradients_of_the_convolution_match_reference(deterministic):
    """x̄, ȳ or w̄ alone: one-output joint walks."""
    cuda, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, deterministic=deterministic)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(44), cuda, 300, 5000, jnp.float64, bad_fraction=0.05,
                                     sorted_by_dst=True)
    g = jax.random.normal(jax.random.PRNGKey(45), (300, cuda.irreps_out.dim), jnp.float64)

    def gradients(conv, x, y, w):
        return [jax.grad(lambda *a: jnp.sum(conv(*a, src, dst, 300) * g), argnums=n)(x, y, w) for n in range(3)]

    expected = jax.jit(functools.partial(gradients, reference))(x, y, w)
    assert_close(jax.jit(functools.partial(gradients, cuda))(x, y, w), expected, jnp.float64)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("sorted_by_dst", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_second_derivatives_of_the_convolution_match_reference(dtype, sorted_by_dst, deterministic):
    """The force loss's second derivative when x, y and w all depend on the positions: outputs that
    are sums of terms over two inputs of each role, in joint walks; two paths without weights."""
    _assert_conv_second_derivatives_match(dtype, sorted_by_dst, deterministic)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_second_derivatives_of_the_convolution_with_z_apart_match_reference(dtype, planned_with):
    """The atomic launches of the force loss's second derivative with z in a forward walk of its
    own, as for passes of more than ``Z_WITH_BACKWARD_MAX_TERMS`` CG terms (0 here)."""
    planned_with(z_with_backward_max_terms=0)
    _assert_conv_second_derivatives_match(dtype, sorted_by_dst=False, deterministic=False)


def _assert_conv_second_derivatives_match(dtype, sorted_by_dst, deterministic):
    cuda, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, unweighted=(1, 6),
                                               deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(49), cuda, 300, 5000, dtype, bad_fraction=0.05, sorted_by_dst=sorted_by_dst)
    expected = jax.jit(functools.partial(conv_second_derivatives, reference, 300))(*in_float64(args))
    assert_close(jax.jit(functools.partial(conv_second_derivatives, cuda, 300))(*args), expected, dtype)


@pytest.mark.parametrize("deterministic", [False, True])
def test_convolution_check_grads_orders_1_and_2(deterministic):
    spec = random_problem(710, mode="uvu", lmax=2)
    cuda, _ = pair(spec, jax_cgtp.TensorProductConv, deterministic=deterministic)
    args = list(random_graph(jax.random.PRNGKey(8), cuda, 6, 20, jnp.float64)[:3])
    src, dst = random_graph(jax.random.PRNGKey(8), cuda, 6, 20, jnp.float64)[3:]
    for operand in range(3):
        def of_one(a):
            return cuda(*(args[:operand] + [a] + args[operand + 1:]), src, dst, 6)

        check_grads(of_one, (args[operand],), order=2, modes=("fwd", "rev"), atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("joint", [False, True])
def test_deterministic_runs_longer_than_a_tile(joint):
    """The deterministic forward's warp walks a node's run of ~4,000 edges (many 32-edge tiles:
    the first stores, the others add), and writes zeros to the nodes without edges."""
    if joint:
        cuda, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, deterministic=True)
    else:
        cuda, reference = pair(random_problem(734, mode="uvu", lmax=2), jax_cgtp.TensorProductConv, deterministic=True)
    args = random_graph(jax.random.PRNGKey(46), cuda, 5, 5000, jnp.float64, bad_fraction=0.05)
    _assert_conv_members_match(cuda, reference, 5, args, jnp.float64)


@pytest.mark.parametrize("tiled_forward", [True, False])
@pytest.mark.parametrize("long_runs", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_deterministic_walks_in_lockstep_match_reference(dtype, long_runs, tiled_forward, planned_with):
    """Every walk over sorted runs in blocks of 4 warps that walk consecutive runs in step (at the
    library's thresholds only passes of long CG code do); ``long_runs``: node 3 sends and node 7
    receives 1,000 edges, which the walks in step cap at ``RUN_CHUNK`` and the chunk walks finish.
    ``tiled_forward``: the forward walks 32-edge tiles instead and sums the partial rows of the runs
    that cross a tile's edge (the library's plan; without, no bytes for those partial rows)."""
    planned_with(lockstep_warps=((0, 4),), **({} if tiled_forward else {"tiled_forward_max_bytes": 0}))
    cuda, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, deterministic=True)
    hubs = (lambda src, dst: (src.at[:1000].set(3), dst.at[2000:3000].set(7))) if long_runs else None
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(47), cuda, 300, 5000, dtype, bad_fraction=0.05, edit=hubs)
    _assert_conv_members_match(cuda, reference, 300, (x, y, w, src, dst), dtype)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_convolution_forward_look_ahead_depths_match_reference(dtype, depth, planned_with):
    """The forward by destination with its x chunks and weights copied 1, 2 or 3 edges ahead
    (``DEFAULTS.ahead_depth`` and ``OWNED_AHEAD_DEPTH``, both set; the library's are 2 and 3),
    atomic and deterministic."""
    planned_with(ahead_depth=depth, owned_ahead_depth=depth)
    for deterministic in (False, True):
        cuda, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, deterministic=deterministic)
        args = random_graph(jax.random.PRNGKey(depth), cuda, 300, 5000, dtype, bad_fraction=0.05)
        _assert_conv_members_match(cuda, reference, 300, args, dtype)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("sorted_by_dst", [False, True])
@pytest.mark.parametrize("make_pair", [whole_chunks_pair, interleaved_whole_chunks_pair])
def test_convolution_forward_ring_of_sixteen_byte_copies_matches_reference(dtype, sorted_by_dst, make_pair):
    """Blocks of whole 32-channel chunks, as in the public configs: the forward by destination
    copies 16 bytes per lane into its look-ahead ring (``DEFAULTS.ahead_copy_bytes``; the weights
    of several paths per copy, evenly spaced or not), atomic and deterministic; every member."""
    for deterministic in (False, True):
        cuda, reference = make_pair(jax_cgtp.TensorProductConv, deterministic=deterministic)
        args = random_graph(jax.random.PRNGKey(65), cuda, 300, 5000, dtype, bad_fraction=0.05,
                            sorted_by_dst=sorted_by_dst)
        walks = [k for k in planned_kernels(functools.partial(cuda, num_nodes=300), *args) if k.ahead]
        assert walks and all(k.ring_copy_width(o, mul, paths) > 1 for k in walks for o, mul, _, paths in k.joint.blocks)
        _assert_conv_members_match(cuda, reference, 300, args, dtype)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("sorted_by_dst", [False, True])
@pytest.mark.parametrize("make_pair", [whole_chunks_pair, equal_mul_blocks_pair])
def test_convolution_forward_walks_blocks_of_one_mul_together(dtype, sorted_by_dst, make_pair):
    """The forward by destination walks consecutive x blocks of equal ``mul`` as one group
    (``DEFAULTS.merged_walk_z_components``), their x chunks and weights in one ring slot per edge:
    16-byte copies for 64-channel blocks, element copies for 33; atomic and deterministic; every
    member."""
    for deterministic in (False, True):
        cuda, reference = make_pair(jax_cgtp.TensorProductConv, deterministic=deterministic)
        args = random_graph(jax.random.PRNGKey(66), cuda, 300, 5000, dtype, bad_fraction=0.05,
                            sorted_by_dst=sorted_by_dst)
        walks = [k for k in planned_kernels(functools.partial(cuda, num_nodes=300), *args) if k.ahead]
        assert walks and all(any(len(group) > 1 for group in k.joint.walk_groups) for k in walks)
        _assert_conv_members_match(cuda, reference, 300, args, dtype)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_convolution_forward_walks_share_runs_among_chunk_warps(dtype, deterministic, planned_with):
    """The forward walking destination runs with a group of warps per run (``Settings.walk_chunk_warps``):
    four warps each running every fourth chunk of x blocks of five, two and one chunks; 300 nodes, 5000
    edges; every member."""
    planned_with(walk_chunk_warps=4, **OWNED_FORWARD_ON_SMALL_GRAPHS)
    group = 4
    cuda, reference = uneven_chunks_pair(jax_cgtp.TensorProductConv, deterministic=deterministic)
    args = random_graph(jax.random.PRNGKey(67), cuda, 300, 5000, dtype, bad_fraction=0.05)
    walks = [k for k in planned_kernels(functools.partial(cuda, num_nodes=300), *args)
             if k.num_groups > 1 and k.joint is not None]
    assert walks and all(k.num_groups == group and k.tiling == "segments" for k in walks)
    _assert_conv_members_match(cuda, reference, 300, args, dtype)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("shared", [False, True])
def test_deterministic_backward_in_slices_matches_reference(dtype, shared, planned_with):
    """``DETERMINISTIC_BACKWARD_SLICE_BYTES``: the deterministic backward walks by destination in
    slices of 1,000 dst-sorted positions (5,000 edges: five, four of them in a loop), x̄ of each
    edge to the slice's rows, added to the sources slice after slice; every member, and (per-edge
    weights) the force loss's second derivatives. float32 runs with 64-bit types off, as most
    training does."""
    cuda, reference = spherical_harmonics_pair(jax_cgtp.TensorProductConv, unweighted=(1, 6), deterministic=True)
    planned_with(deterministic_backward_slice_bytes=1000 * cuda.irreps_in1.dim * jnp.dtype(dtype).itemsize)
    families = [(conv_members, 58)] + ([] if shared else [(conv_second_derivatives, 49)])
    for family, seed in families:
        with jax.enable_x64(dtype == jnp.float64):
            args = random_graph(jax.random.PRNGKey(seed), cuda, 300, 5000, dtype, bad_fraction=0.05, shared=shared)
            actual = jax.jit(functools.partial(family, cuda, 300))(*args)
        assert_close(actual, jax.jit(functools.partial(family, reference, 300))(*in_float64(args)), dtype)


@pytest.mark.parametrize("plan", ["slots", "joint", "lockstep", "lockstep_forward", "stream", "chunks",
                                  "shared_chunks", "slices", "by_source"])
def test_deterministic_convolution_is_bitwise_reproducible(plan, planned_with):
    """Slot by slot (a random problem), by joint passes (spherical harmonics; walked in lockstep
    too, the forward in tiles whose partial rows are summed in order, or with
    ``lockstep_forward`` in lockstep too), by weight streams (a fully connected product), and by chunks: runs of 10,000 edges by
    source and by destination, walked (the forward) or summed (the backward's slice rows) in chunks
    of ``RUN_CHUNK`` whose rows are added in order (``shared_chunks``: with shared weights, whose w̄
    the chunk walks add partial rows to); the backward by destination in slices of 7,000 positions
    (``slices``, with the long runs), or walking by source (``by_source``, with the long runs)."""
    if plan in ("lockstep", "lockstep_forward"):
        planned_with(lockstep_warps=((0, 4),), **({} if plan == "lockstep" else {"tiled_forward_max_bytes": 0}))
    if plan == "by_source":
        planned_with(deterministic_backward_slice_bytes=0)
    if plan in ("joint", "lockstep", "lockstep_forward", "chunks", "shared_chunks", "slices", "by_source"):
        cuda, _ = spherical_harmonics_pair(jax_cgtp.TensorProductConv, deterministic=True)
    elif plan == "stream":
        cuda, _ = fully_connected_pair(jax_cgtp.TensorProductConv, deterministic=True)
    else:
        cuda, _ = pair(random_problem(720, mode="uvu", lmax=2), jax_cgtp.TensorProductConv, deterministic=True)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(9), cuda, 1000, 40_000, jnp.float32,
                                     shared=plan == "shared_chunks")
    if plan == "slices":
        planned_with(deterministic_backward_slice_bytes=7000 * cuda.irreps_in1.dim * 4)
    if plan in ("chunks", "shared_chunks", "slices", "by_source"):
        src, dst = src.at[30_000:].set(998), dst.at[30_000:].set(999)
    graph = jax_cgtp.sort_graph(src, dst, 1000)

    @jax.jit
    def step(x, y, w):
        out, vjp = jax.vjp(lambda *a: cuda(*a, graph=graph), x, y, w)
        return out, vjp(jnp.sin(out))

    first = jax.device_get(step(x, y, w))
    for _ in range(9):
        again = jax.device_get(step(x, y, w))
        for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(again)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("deterministic, shared", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_padded_graph_matches_reference(deterministic, shared, dtype):
    """A batch padded as ``jraph.pad_with_graphs`` pads it: the last 3,000 of 20,000 edges join a
    padding node to itself (in range), a run of 3,000 edges, and 500 edges point out of range. The
    atomic forward walks each run's first ``OWNED_RUN_CAP`` edges and adds the rest in a second
    launch; the deterministic walks add chunks of ``RUN_CHUNK`` edges in order (with ``shared``
    weights, their w̄ from partial rows). Every member matches the reference with the outputs
    poisoned."""
    spec = random_problem(741, mode="uvu", lmax=2)
    cuda, reference = pair(spec, jax_cgtp.TensorProductConv, deterministic=deterministic)
    x, y, w, src, dst = random_graph(
        jax.random.PRNGKey(41), cuda, 1200, 20_000, dtype, sorted_by_dst=True, shared=shared,
        edit=lambda *ends: tuple(a.at[16_500:19_500].set(1199).at[19_500:].set(1205) for a in ends))
    _assert_conv_members_match(cuda, reference, 1200, (x, y, w, src, dst), dtype)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_padding_edges_with_nan_and_inf_values_contribute_nothing(deterministic, shared, dtype):
    """Padding edges of every kind, their features NaN and weights Inf: forward, gradients, second
    derivatives and JVPs equal the reference's on the real edges alone; ȳ and w̄ are exact zeros there."""
    assert_padding_contributes_nothing("cuda", deterministic, shared, dtype)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precisions_accumulate_in_float32_and_round_once(dtype):
    assert_half_precision_rounds_once("cuda", dtype)


@pytest.mark.parametrize("deterministic", [False, True])
def test_zero_edges_and_isolated_nodes(deterministic):
    cuda, _ = pair(random_problem(730, mode="uvu", lmax=2), jax_cgtp.TensorProductConv, deterministic=deterministic)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(10), cuda, 7, 0, jnp.float32)
    out, grads = jax.jit(lambda x, y, w: jax.value_and_grad(
        lambda x: jnp.sum(cuda(x, y, w, src, dst, 7)))(x))(x, y, w)
    assert float(out) == 0.0 and grads.shape == x.shape and not np.asarray(grads).any()
    x, y, w, _, _ = random_graph(jax.random.PRNGKey(11), cuda, 7, 4, jnp.float32)
    nodes = jax.jit(lambda *a: cuda(*a, jnp.array([0, 1, 0, 1]), jnp.array([2, 2, 3, 3]), 7))(x, y, w)
    assert not np.asarray(nodes)[[0, 1, 4, 5, 6]].any() and np.asarray(nodes)[2:4].any()


@pytest.mark.parametrize("deterministic", [False, True])
def test_thirty_million_edges(deterministic):
    """64-bit offsets: per-edge weights hold 3.8e9 > 2^31 elements."""
    conv = jax_cgtp.TensorProductConv(*_big_problem(), deterministic=deterministic, backend="cuda")
    reference = jax_cgtp.TensorProductConv(*_big_problem(), backend="reference")
    num_nodes, num_edges = 1_000_000, 30_000_000
    keys = jax.random.split(jax.random.PRNGKey(12), 5)
    x = jax.random.normal(keys[0], (num_nodes, conv.irreps_in1.dim), jnp.float32)
    y = jax.random.normal(keys[1], (num_edges, conv.irreps_in2.dim), jnp.float32)
    w = jax.random.normal(keys[2], (num_edges, conv.weight_numel), jnp.float32)
    assert w.size > 2**31
    src = jax.random.randint(keys[3], (num_edges,), 0, num_nodes)
    dst = jax.random.randint(keys[4], (num_edges,), 0, num_nodes)
    # The indices are arguments, not closed-over constants: XLA would constant-fold the sort of
    # 30M constant indices on the host, which takes many minutes.
    out = jax.jit(lambda *a: conv(*a, num_nodes))(x, y, w, src, dst)
    chunk = 2_000_000
    reference_chunk = jax.jit(lambda *a: reference(*(b.astype(jnp.float64) for b in a[:3]), *a[3:], num_nodes))
    expected = sum(
        reference_chunk(x, y[i:i + chunk], w[i:i + chunk], src[i:i + chunk], dst[i:i + chunk])
        for i in range(0, num_edges, chunk)
    )
    assert relative_error(out, expected) < 1e-5


def _big_problem():
    tp = jax_cgtp.channelwise_tensor_product("32x0e+32x1o", "0e+1o", filter_ir_out="0e+1o")
    instructions = [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight) for i in tp.instructions]
    return tp.irreps_in1, tp.irreps_in2, tp.irreps_out, instructions


@needs_two_gpus
def test_every_gpu_loads_and_runs_its_kernels_with_first_calls_at_once():
    """One executable per GPU (inputs placed there), first called from one thread per GPU at once:
    each CUDA context loads its own kernels."""
    cuda, reference, args = problem_cases(jnp.float64, (7,))[0]
    expected = jax.jit(functools.partial(members, reference))(*args)
    gpus = jax.devices("gpu")

    def on(device):
        results = jax.jit(functools.partial(members, cuda))(*jax.device_put(args, device))
        return results, {d for leaf in jax.tree_util.tree_leaves(results) for d in leaf.devices()}

    with ThreadPoolExecutor(len(gpus)) as pool:
        for device, (results, placed) in zip(gpus, pool.map(on, gpus)):
            assert placed == {device}
            assert_close(jax.device_get(results), jax.device_get(expected), jnp.float64)


@needs_two_gpus
@pytest.mark.parametrize("deterministic", [False, True])
def test_data_parallel_step_on_every_gpu(deterministic):
    """Loss, theta's gradient (second derivatives, summed over the GPUs) and x's gradient of a
    data-parallel step, under shard_map and under pmap, against each GPU's data run alone and
    against the reference."""
    result = data_parallel.errors(jax.devices("gpu"), jnp.float64, deterministic=deterministic,
                                  sorted_graph=deterministic, backend="cuda")
    assert len(result.pop("devices")) >= 2
    assert all(error < 1e-12 for error in result.values()), result


@needs_two_gpus
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_edges_sharded_by_jit_run_on_each_gpu(dtype):
    """jit over one graph's edges sharded across the GPUs: each GPU runs the kernels on its edges
    (no all-gather in the executable), node outputs summed over the GPUs; the convolution's
    training step (atomic, deterministic) and the product's gradients match one GPU and the
    reference, and all but the atomic convolution repeat bitwise. ``precompile`` of the sharded
    function compiles every kernel its compilation needs."""
    result = edge_sharded.report(jax.devices("gpu"), dtype, backend="cuda")
    assert len(result.pop("devices")) >= 2
    tolerance = 1e-12 if dtype == jnp.float64 else 1e-5
    for name, run in result.items():
        assert run["partitioned"] and not run["partitioned_when_off"] and run["beyond_precompile"] == 0, (name, run)
        assert run["all_gathers"] == run["all_edge_arrays"] == 0, (name, run)
        assert run["repeatable"] or name == "conv_atomic", (name, run)
        assert run["alone"] < tolerance and run["reference"] < tolerance, (name, run)


@needs_two_gpus
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_operands_sharded_over_an_explicit_axis_run_on_each_gpu(dtype):
    """Rows or edges sharded over an explicit mesh axis across the GPUs: each GPU runs the kernels
    on its own rows or edges (``jax.shard_map`` inside the library); the products, and the
    convolution's second derivative (atomic, and deterministic on a sorted graph), match one GPU
    and the reference, and all but the atomic convolution repeat bitwise."""
    result = explicit_sharded.report(jax.devices("gpu"), dtype, backend="cuda")
    assert len(result.pop("devices")) >= 2
    tolerance = 1e-12 if dtype == jnp.float64 else 1e-5
    for name, run in result.items():
        assert run["first_spec"] == (["edges", None] if name.startswith("product") else [None, None]), (name, run)
        assert run["repeatable"] or name == "conv_atomic", (name, run)
        assert run["alone"] < tolerance and run["reference"] < tolerance, (name, run)


@needs_two_gpus
def test_jit_over_arrays_sharded_across_gpus():
    """Without shard_map, XLA's partitioner places each kernel call (here on rows sharded over the
    GPUs); the results must not depend on where it puts them."""
    cuda, reference, args = problem_cases(jnp.float64, (8,))[0]
    mesh = jax.sharding.Mesh(np.array(jax.devices("gpu")), ("rows",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("rows"))
    x, y, w, g = args
    padded = [jnp.concatenate([a] * len(mesh.devices)) if a.ndim == 2 else a for a in (x, y, w, g)]
    sharded = [jax.device_put(a, rows) if a.ndim == 2 else a for a in padded]
    assert_close(jax.device_get(jax.jit(functools.partial(members, cuda))(*sharded)),
                 jax.device_get(jax.jit(functools.partial(members, reference))(*padded)), jnp.float64)
