"""CUDA backend without a GPU: schedules, generated source, NVRTC compilation and the lowering."""

import collections
import dataclasses
import functools
import os
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from jax.interpreters import mlir
from family_members import (backward_call, with_settings, high_l_pair, long_code_pair, random_graph,
                            spherical_harmonics_pair)
from random_problems import random_inputs, random_problem

import jax_cgtp
from jax_cgtp import lowerings
from jax_cgtp.core import primitives
from jax_cgtp.gpu import codegen, codegen_joint, cuda_lowering, nvrtc, schedule, signature
from jax_cgtp.core.call import Call, Output, Term, forward_call
from jax_cgtp.core.operands import BATCHED, INDEXED, SHARED
from jax_cgtp.core.problem import MODES

DEFAULTS = jax_cgtp.Settings()  # the library's settings

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed on this machine")


def build(spec, **options):
    irreps_in1, irreps_in2, irreps_out, instructions, normalization = spec
    return jax_cgtp.TensorProduct(irreps_in1, irreps_in2, irreps_out, instructions, **normalization, **options)


def mace_problem():
    return jax_cgtp.channelwise_tensor_product("128x0e+128x1o+128x2e", "0e+1o+2e+3o", filter_ir_out="0e+1o+2e").problem


def test_forward_lanes_split_output_channels_and_stage_x():
    (kernel,) = schedule.plan(forward_call(mace_problem(), (BATCHED,) * 4), "float", "int")
    assert kernel.tile == 1 and kernel.tiling == "tiles"
    assert all(slot.mode == "output" for slot in kernel.slots)
    staged = {f.role for slot in kernel.slots for c in slot.contributions for f in c.factors if f.staged}
    assert staged == {"x"}  # 128 channels of l >= 1 blocks of x; y is broadcast, w coalesced


def test_second_derivative_adds_the_terms_that_share_z_bar_before_the_cg_sum():
    """The force loss's second derivative of a convolution: x̄'s two terms read the same z̄, so
    ``ẏ w + y ẇ`` is formed once (``mx0``) and summed over the CG nonzeros once; z's three terms
    group by their x input (two CG sums, ``mz1`` for ``x``); w̄ keeps one sum per term."""
    tp = jax_cgtp.channelwise_tensor_product("32x0e+32x1o", "0e+1o", filter_ir_out="0e+1o")
    problem, kinds, rows = tp.problem, (INDEXED, BATCHED, BATCHED, INDEXED), (7, None, None, 7)
    outputs = (Output("x", (Term((5, 2, 3)), Term((1, 6, 3), True))),
               Output("w", (Term((4, 1, 3), True), Term((0, 5, 3), True))),
               Output("z", (Term((4, 1, 2)), Term((0, 5, 2)), Term((0, 1, 6), True))))
    call = Call(problem, kinds, rows, ("x", "y", "w", "z", "x", "y", "w"), outputs)
    (kernel,) = schedule.plan(call, "float", "int")
    assert kernel.joint is not None and len(kernel.joint.terms) == 7
    source = codegen.generate(kernel)
    assert "const T mx0_0 = y5_0 * wt2 + y1_0 * wt6;" in source  # ẏ w + y ẇ (inputs 5, 2 and 1, 6)
    assert "const T mz1_0 = y5_0 * wt2 + y1_0 * wt6;" in source  # the terms of x (input 0)
    assert "mz0_" not in source  # the term of ẋ (input 4) stands alone


def test_gradient_of_narrow_spherical_harmonics_is_a_warp_reduction():
    (kernel,) = schedule.plan(backward_call(mace_problem(), (BATCHED,) * 4), "float", "int")
    modes = {(slot.role, slot.mode) for slot in kernel.slots}
    assert modes == {("x", "output"), ("y", "reduce"), ("w", "output")}


def test_forward_of_spherical_harmonics_paths_is_one_joint_pass():
    (kernel,) = schedule.plan(forward_call(mace_problem(), (BATCHED,) * 4), "float", "int")
    assert dict(kernel.joint.outputs) == {"z": 0} and dict(kernel.stage_sizes).keys() == {"x"}
    assert "joint forward" in codegen.generate(kernel)


def test_fused_backward_of_spherical_harmonics_paths_is_one_joint_pass():
    (kernel,) = schedule.plan(backward_call(mace_problem(), (BATCHED,) * 4), "float", "int")
    assert dict(kernel.joint.outputs) == {"x": 0, "y": 1, "w": 2}
    assert [len(paths) for _, _, _, paths in kernel.joint.blocks] == [3, 5, 5]  # the 13 paths, by x block
    source = codegen.generate(kernel)
    assert "joint backward" in source and "cgtp_stage<5, 5>(stage_x" in source
    if nvrtc.available():
        assert nvrtc.compile_cubin(source, "sm_90", "the joint backward")
    uvw = jax_cgtp.fully_connected_tensor_product("4x0e+4x1o", "0e+1o", "4x0e+4x1o").problem
    (kernel,) = schedule.plan(backward_call(uvw, (BATCHED,) * 4), "float", "int")
    assert kernel.joint is None  # other modes run output by output


def joint_path_bodies(call):
    """``(path, its generated code)`` for each path of ``call``'s one joint kernel (float32)."""
    (kernel,) = schedule.plan(call, "float", "int")
    source = codegen.generate(kernel)
    paths = [p for *_, block in kernel.joint.blocks for p in block]
    return [(p, source.split(f"// path {p.ins_index}:")[1].split("// path ")[0]) for p in paths]


def test_fused_backward_multiplies_cg_coefficients_once_up_to_sign_and_common_magnitude():
    """x̄, ȳ and w̄ of a path share ``S_ij = sum_k pw C_ijk z̄_k``, declared once up to sign, in units
    of the magnitude most single-nonzero pairs share (``S = ±z̄_k``, no product): fewer products than
    nonzeros, and w̄ is summed from the fewer of x̄'s and ȳ's sums (``sum_i x_i q_y_z_i`` or
    ``sum_j y_j p_x_z_j``) times that magnitude."""
    bodies = joint_path_bodies(backward_call(mace_problem(), (BATCHED,) * 4))
    products = 0
    for path, body in bodies:
        factors = [line.split(" = ")[1] for line in body.splitlines() if "const T s_z_" in line]
        assert len({f.lstrip("-") for f in factors}) == len(factors)  # none repeats up to sign
        assert "1.000000000e+00f" not in body
        scaled = "const T wtu = " in body
        count = len(re.findall(r"e[+-]\d\df \* ", body))
        assert count == len(re.findall(r"e[+-]\d\df \* ", "".join(factors))) + 2 * scaled <= len(path.nonzeros)
        products += count
        gradient = next(line for line in body.splitlines() if "out2[" in line and "=" in line)
        widths = [len({nz[n] for nz in path.nonzeros}) for n in (0, 1)]
        shorter = "y_0 * p_x_z_0" if widths[1] < widths[0] else "x_0 * q_y_z_0"  # of x̄'s and ȳ's sums
        assert shorter in gradient and " * z_" not in gradient
        assert (f"f * ({shorter}" in gradient) == scaled
    assert products < 0.5 * sum(len(path.nonzeros) for path, _ in bodies)


def test_forward_sums_cg_nonzeros_in_units_of_their_common_magnitude():
    """z_k = sum_ij pw C_ijk x_i y_j with the magnitude v most of a path's nonzeros share folded into
    the weight (``v * w``, once per path, named wtu where the backward's sums share it): a term of
    magnitude v is ``± x_i * y_j``, one FMA."""
    folded = 0
    for path, body in joint_path_bodies(forward_call(mace_problem(), (BATCHED,) * 4)):
        sums = [line for line in body.splitlines() if re.match(r"\s*gz_\d+ \+= ", line)]
        assert "1.000000000e+00f" not in body and "+ -" not in "".join(sums)
        magnitudes = collections.Counter(f"{abs(c):.9f}" for *_, c in path.nonzeros)
        v, most = magnitudes.most_common(1)[0]
        scaled = re.search(r"const T (wt[uv]) = ", body)
        assert bool(scaled) == (float(v) != 1.0 and most - magnitudes.get(f"{1.0:.9f}", 0) > 1)
        products = len(re.findall(r"e[+-]\d\df \* [xy]_", "".join(sums)))
        assert products == len(path.nonzeros) - (most if scaled or float(v) == 1.0 else magnitudes.get(f"{1.0:.9f}", 0))
        weight = scaled[1] if scaled else "wt"
        assert all(line.endswith(f" * {weight};") for line in sums)
        folded += bool(scaled)
    assert folded >= 5


def diffdock_problem():
    return jax_cgtp.fully_connected_tensor_product("10x1o+10x1e+48x0e+48x0o", "0e+1o+2e",
                                                   "10x1o+10x1e+48x0e+48x0o").problem


def test_fully_connected_products_with_per_edge_weights_stream_their_weights():
    """DiffDock-L=2: each path's weight rows in items of about 4 KiB (48 rows of 48 weights: 3 items
    of 16 rows in float32, 5 of 10 in float64), each row padded to an odd stride in the ring."""
    problem = diffdock_problem()
    (forward,) = schedule.plan(forward_call(problem, (BATCHED,) * 4), "float", "int")
    assert dict(forward.stream.outputs) == {"z": 0} and forward.tile == 8
    rows = {(i.path.ins_index, i.first, i.rows) for i in forward.stream.items if i.path.x_mul == i.path.z_mul == 48}
    assert {(first, count) for _, first, count in rows} == {(0, 16), (16, 16), (32, 16)}
    assert sum(i.size for i in forward.stream.items) == problem.weight_numel  # every weight, once
    assert forward.stream.slot == 16 * 49
    (double,) = schedule.plan(forward_call(problem, (BATCHED,) * 4), "double", "int")
    assert max(i.rows for i in double.stream.items if i.path.z_mul == 48) == 10
    (backward,) = schedule.plan(backward_call(problem, (BATCHED,) * 4), "float", "int")
    assert dict(backward.stream.outputs) == {"x": 0, "y": 1, "w": 2} and backward.stream.row_role == "x"
    source = codegen.generate(backward)
    assert "cgtp_copy_async<768, 48, 49>" in source and "cgtp_wait<2>();" in source
    if nvrtc.available():
        assert nvrtc.compile_cubin(source, "sm_90", "the weight-stream backward")


def test_weight_streams_need_per_edge_weights_that_are_read_and_fit_in_shared_memory():
    problem = diffdock_problem()
    (shared,) = schedule.plan(forward_call(problem, (BATCHED, BATCHED, SHARED, BATCHED)), "float", "int")
    assert shared.stream is None  # shared weights: slot by slot
    alone = Call(problem, (BATCHED,) * 4, (None,) * 4, ("x", "y", "z"), (Output("w", (Term((0, 1, 2)),)),))
    (weights,) = schedule.plan(alone, "float", "int")
    assert weights.stream is None  # w̄ alone does not read the weights
    wide = jax_cgtp.fully_connected_tensor_product("256x0e+256x1o+256x2e", "0e+1o+2e", "256x0e+256x1o+256x2e")
    (kernel,) = schedule.plan(forward_call(wide.problem, (BATCHED,) * 4), "double", "int")
    assert kernel.stream is None  # x and z rows of 2,304 elements, staged twice per warp: too wide


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_convolution_backward_keeps_each_destination_staged(dtype):
    """z̄ is gathered by dst: the joint backward stages a walked group's z̄ chunks once per run of
    one destination and sums ȳ over chunks in shared memory, with one transposed warp sum per edge."""
    kinds = (INDEXED, BATCHED, BATCHED, INDEXED)
    (kernel,) = schedule.plan(backward_call(mace_problem(), kinds, rows=(10, None, None, 10)), dtype, "int")
    assert kernel.joint.by_destination and kernel.edge_sums_size == schedule.WARP * 16
    source = codegen.generate(kernel)
    assert "joint backward, walking the tile's edges" in source and "if (ix_z != cur)" in source
    # 16 ȳ values per walked group of x blocks: mace's three blocks walk as one in float32; in
    # float64 groups hold at most MERGED_BACKWARD_WALK_X_COMPONENTS (4) x rows, so 0e+1o, then 2e
    groups = {"float": 1, "double": 2}[dtype]
    assert source.count("__shfl_xor_sync(CGTP_FULL_MASK, up16") == len(kernel.joint.walked_blocks) * 8 == 8 * groups
    if nvrtc.available():
        assert nvrtc.compile_cubin(source, "sm_90", "the convolution's joint backward")
    (batched,) = schedule.plan(backward_call(mace_problem(), (BATCHED,) * 4), dtype, "int")
    assert not batched.joint.by_destination and batched.edge_sums_size == 0


@pytest.mark.parametrize("deterministic", [False, True])
def test_convolution_forward_streams_its_edge_rows(deterministic):
    """The convolution's forward marks its y and w inputs (rows read once per edge) evict-first
    in L2, so that they leave the gathered x rows there; its backward and the unfused product do
    not. A shared w is read by every edge and is not marked."""
    kinds, rows = (INDEXED, BATCHED, BATCHED, INDEXED), (10, None, None, 10)
    (forward,) = schedule.plan(forward_call(mace_problem(), kinds, rows, deterministic=deterministic), "float", "int")
    source = codegen.generate(forward)
    assert "in1 = cgtp_evict_first(in1);  // y rows" in source and "in2 = cgtp_evict_first(in2);  // w rows" in source
    shared = (INDEXED, BATCHED, SHARED, INDEXED)
    (forward,) = schedule.plan(forward_call(mace_problem(), shared, rows, deterministic=deterministic), "float", "int")
    assert codegen.generate(forward).count("cgtp_evict_first(in") == 1
    backward = schedule.plan(backward_call(mace_problem(), kinds, rows, deterministic=deterministic), "float", "int")
    (product,) = schedule.plan(forward_call(mace_problem(), (BATCHED,) * 4), "float", "int")
    assert not any("cgtp_evict_first(in" in codegen.generate(k) for k in backward + [product])
    if nvrtc.available():
        assert nvrtc.compile_cubin(source, "sm_90", "the convolution's forward")


def test_atomic_convolution_forward_in_float64_groups_the_z_components_of_long_code(planned_with):
    """mace-l2-c128's 2e block has 11 paths (51 z components) in a pass of 351 CG terms: every
    walk by destination keeps the whole block. Above ``SCATTER_Z_MIN_TERMS`` terms (here lowered
    below 351) the float64 atomic walk takes an x block's paths in groups of at most 24 z
    components, each a block of its own; float32 and the deterministic walk keep the whole block."""
    problem = jax_cgtp.channelwise_tensor_product("128x0e+128x1o+128x2e", "0e+1o+2e+3o",
                                                  filter_ir_out="0e+0o+1o+1e+2e+2o+3o+3e").problem
    kinds, rows = (INDEXED, BATCHED, BATCHED, INDEXED), (10, None, None, 10)

    def blocks(dtype, deterministic=False):
        (kernel,) = schedule.plan(forward_call(problem, kinds, rows, deterministic=deterministic), dtype, "int")
        return [(x_offset, [p.ins_index for p in paths]) for x_offset, _, _, paths in kernel.joint.blocks]

    whole = blocks("float")
    assert [x_offset for x_offset, _ in whole] == [0, 128, 512]
    assert schedule.plan(forward_call(problem, kinds, rows), "double", "int")[0].joint.cg_terms == 351
    assert blocks("double") == blocks("double", True) == whole
    planned_with(scatter_z_min_terms=350)
    assert blocks("float") == blocks("double", True) == whole
    grouped = schedule.plan(forward_call(problem, kinds, rows), "double", "int")[0].joint.blocks
    assert all(sum(p.z_dim for p in paths) <= DEFAULTS.by_size("scatter_z_components", 8) for *_, paths in grouped)
    assert len(grouped) > len(whole)
    regrouped = {}
    for x_offset, _, _, paths in grouped:
        regrouped.setdefault(x_offset, []).extend(p.ins_index for p in paths)
    assert list(regrouped.items()) == whole


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_forward_by_destination_holds_at_most_64_z_components(dtype, deterministic):
    """The 2e block of ``high_l_pair`` has 19 paths and 125 z components: both walks take them in
    consecutive groups, in the paths' order (a pass of 669 CG terms, below
    ``SCATTER_Z_MIN_TERMS``: float64 too)."""
    problem = high_l_pair(kernels="auto")[0].problem
    call = forward_call(problem, (INDEXED, BATCHED, BATCHED, INDEXED), (10, None, None, 10), deterministic=deterministic)
    (kernel,) = schedule.plan(call, dtype, "int")
    assert kernel.joint.cg_terms <= DEFAULTS.scatter_z_min_terms
    assert all(sum(p.z_dim for p in paths) <= DEFAULTS.max_z_components for *_, paths in kernel.joint.blocks)
    assert max(sum(p.z_dim for p in paths) for *_, paths in kernel.joint.blocks) > DEFAULTS.by_size(
        "scatter_z_components", 8)
    assert [x_offset for x_offset, *_ in kernel.joint.blocks].count(2) > 1
    order = [p.ins_index for *_, paths in kernel.joint.blocks for p in paths]
    assert order == sorted(order) and len(order) == len(problem.instructions)


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_long_code_walks_the_tile_in_path_groups(dtype, planned_with):
    """``long_code_pair`` has 4,885 CG nonzeros: its forward (one term) and fused backward (three)
    walk tiles of 16 edges, each x block in consecutive groups of at most 1,024 terms (a path
    with more alone), the paths in order. The convolution's fused backward by destination groups
    at most 1,024 terms when it adds x̄ atomically, and when its warps own x̄ (deterministic, walking
    by source: ``DETERMINISTIC_BACKWARD_SLICE_BYTES`` off) in float64; 512 when they own it in float32.
    A MACE forward keeps one edge per tile, and mace-l2-c128's fused backward (1,053 terms) walks
    in whole x blocks."""
    planned_with(deterministic_backward_slice_bytes=0)
    problem = long_code_pair(kernels="auto")[0].problem
    for call in (forward_call(problem, (BATCHED,) * 4), backward_call(problem, (BATCHED,) * 4)):
        (kernel,) = schedule.plan(call, dtype, "int")
        assert kernel.joint.walk and not kernel.joint.by_destination and kernel.tile == DEFAULTS.walk_tile == 16
        terms = len(kernel.joint.terms)
        groups = [paths for *_, paths in kernel.joint.blocks]
        assert all(terms * sum(len(p.nonzeros) for p in g) <= DEFAULTS.walk_group_terms or len(g) == 1 for g in groups)
        assert len(groups) > len({x_offset for x_offset, *_ in kernel.joint.blocks})
        order = [p.ins_index for g in groups for p in g]
        assert order == sorted(order) and len(order) == len(problem.instructions)
        source = codegen.generate(kernel)
        assert "walking the tile's edges" in source
        if nvrtc.available():
            assert nvrtc.compile_cubin(source, "sm_90", "a walk over long code")
    conv_groups = {}
    for deterministic in (False, True):
        call = backward_call(problem, (INDEXED, BATCHED, BATCHED, INDEXED), rows=(10, None, None, 10),
                             deterministic=deterministic)
        (conv,) = schedule.plan(call, dtype, "int")
        assert conv.tile == DEFAULTS.tile_indexed
        limit = 512 if deterministic and dtype == "float" else 1024
        group_terms = [3 * sum(len(p.nonzeros) for p in paths) for *_, paths in conv.joint.blocks]
        assert all(t <= limit for t, (*_, paths) in zip(group_terms, conv.joint.blocks) if len(paths) > 1)
        assert max(group_terms) > limit // 2
        conv_groups[deterministic] = len(conv.joint.blocks)
    assert (conv_groups[True] > conv_groups[False]) == (dtype == "float")
    x_and_w = Call(problem, (INDEXED, BATCHED, BATCHED, INDEXED), (10, None, None, 10), ("x", "y", "w", "z"),
                   (Output("x", (Term((1, 2, 3)),)), Output("w", (Term((0, 1, 3)),))), False)
    (two_terms,) = schedule.plan(x_and_w, dtype, "int")
    limit = 1024 if dtype == "double" else 512
    assert max(2 * sum(len(p.nonzeros) for p in paths) for *_, paths in two_terms.joint.blocks) in range(limit // 2, limit + 1)
    (short,) = schedule.plan(forward_call(mace_problem(), (BATCHED,) * 4), dtype, "int")
    assert not short.joint.walk and short.tile == 1
    mace_l2_c128 = jax_cgtp.channelwise_tensor_product(
        "128x0e+128x1o+128x2e", "0e+1o+2e+3o", filter_ir_out=[f"{l}{p}" for l in range(4) for p in "eo"]).problem
    (several,) = schedule.plan(backward_call(mace_l2_c128, (BATCHED,) * 4), dtype, "int")
    assert several.joint.walk and several.tile == DEFAULTS.walk_tile
    assert len(several.joint.blocks) == len({x_offset for x_offset, *_ in several.joint.blocks})


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_only_the_convolution_forward_looks_ahead_through_a_ring(dtype):
    """The forward by destination stages its x rows in the look-ahead ring (no ``stage_x``) of
    ``AHEAD_DEPTH + 1`` slots (``OWNED_AHEAD_DEPTH + 1`` when deterministic), each the 32 x rows and
    weights of the widest group of blocks walked together, but in float32 not when it walks in
    groups of paths (long code: it keeps the next edge in registers, at GROUPED_FORWARD_BLOCKS
    blocks per SM); the product's walk and the convolution's backward keep the next edge in
    registers."""
    problem = mace_problem()
    conv = (INDEXED, BATCHED, BATCHED, INDEXED)
    for deterministic, depth in ((False, DEFAULTS.ahead_depth), (True, DEFAULTS.owned_ahead_depth)):
        (forward,) = schedule.plan(forward_call(problem, conv, rows=(10, None, None, 10), deterministic=deterministic),
                                   dtype, "int")
        buffers = dict(forward.stage_sizes)
        assert forward.ahead == depth > 0 and "x" not in buffers
        assert buffers["ahead"] == (depth + 1) * max(
            schedule.ahead_slot(forward.joint, members) for members in forward.joint.walked_blocks)
    assert DEFAULTS.owned_ahead_depth != DEFAULTS.ahead_depth
    (backward,) = schedule.plan(backward_call(problem, conv, rows=(10, None, None, 10)), dtype, "int")
    (walk,) = schedule.plan(forward_call(long_code_pair(kernels="auto")[0].problem, (BATCHED,) * 4), dtype, "int")
    assert backward.ahead == walk.ahead == 0 and walk.joint.walk
    ring_copy = re.compile(r"cgtp_(stage_async|copy_vectors)<\d")  # element by element, or 16 bytes per lane
    assert ring_copy.search(codegen.generate(forward)) and not ring_copy.search(codegen.generate(walk))
    long_code = long_code_pair(kernels="auto")[0].problem
    (grouped,) = schedule.plan(forward_call(long_code, conv, rows=(10, None, None, 10)), dtype, "int")
    assert grouped.joint.cg_terms > DEFAULTS.grouped_terms_by_destination
    assert grouped.ahead == (0 if dtype == "float" else DEFAULTS.ahead_depth)
    assert grouped.min_blocks == (DEFAULTS.grouped_forward_blocks if dtype == "float" else 0)
    if dtype == "float":  # ptxas' occupancy target: GROUPED_FORWARD_BLOCKS blocks per SM
        assert f"__launch_bounds__(128, {DEFAULTS.grouped_forward_blocks})" in codegen.generate(grouped)


@pytest.mark.parametrize("deterministic", [False, True])
def test_forward_walk_takes_consecutive_blocks_of_one_mul_together(deterministic, planned_with):
    """A forward walk by destination walks consecutive x blocks of equal ``mul`` as one group while
    their z chunks take at most MERGED_WALK_Z_COMPONENTS components: one ring slot per edge holds
    all of their x chunks and weights, and each block's x registers live in a scope of their own.
    A block of another ``mul`` walks alone, and so does every block at 0."""
    problem = jax_cgtp.channelwise_tensor_product("128x0e+128x1o+128x2e+32x1e", "0e+1o+2e+3o",
                                                  filter_ir_out="0e+1o+2e").problem
    call = forward_call(problem, (INDEXED, BATCHED, BATCHED, INDEXED), rows=(10, None, None, 10),
                        deterministic=deterministic)
    for limit, groups in ((64, ((0, 1, 2), (3,))), (30, ((0, 1), (2,), (3,))), (0, ())):
        (forward,) = schedule.plan(with_settings(call, merged_walk_z_components=limit), "float", "int")
        joint = forward.joint
        assert [sum(p.z_dim for p in paths) for *_, paths in joint.blocks] == [9, 17, 17, 8]
        assert joint.walk_groups == groups
        slots = [schedule.ahead_slot(joint, members) for members in joint.walked_blocks]
        assert dict(forward.stage_sizes)["ahead"] == (forward.ahead + 1) * max(slots)
        source = codegen.generate(forward)
        assert source.count("const T x_0 = active ? slot[") == len(joint.blocks)
        assert source.count("cgtp_wait<") == len(joint.walked_blocks)


def test_walk_groups_are_fewest_then_narrowest():
    """Of the partitions of blocks into the fewest groups under the cap, the one whose widest group
    is narrowest: nequip-lips' six blocks (9, 9, 20, 20, 22 and 22 z components) under 96 are 58 + 44,
    not 80 + 22; a change of ``mul`` always starts a group, and a block wider than the cap walks alone.
    A cap on x components (1, 1, 3, 3, 5 and 5 rows) bounds the groups as well."""
    def joint(*blocks):
        return types.SimpleNamespace(cg_terms=0, blocks=tuple(
            (0, mul, x_dim, (types.SimpleNamespace(z_dim=z),)) for mul, z, x_dim in blocks))

    lips = joint(*((32, z, x) for z, x in zip((9, 9, 20, 20, 22, 22), (1, 1, 3, 3, 5, 5))))
    assert schedule._walk_groups(DEFAULTS, lips, 64, x_limit=4) == ((0, 1), (2,), (3,), (4,), (5,))
    assert schedule._walk_groups(DEFAULTS, lips, 64, x_limit=8) == ((0, 1, 2), (3, 4), (5,))
    assert schedule._walk_groups(DEFAULTS, lips, 96) == ((0, 1, 2, 3), (4, 5))
    assert schedule._walk_groups(DEFAULTS, lips, 64) == ((0, 1, 2, 3), (4, 5))
    assert schedule._walk_groups(DEFAULTS, lips, 40) == ((0, 1, 2), (3,), (4,), (5,))
    assert schedule._walk_groups(DEFAULTS, joint((128, 16, 1), (128, 24, 3), (128, 31, 5)), 96) == ((0, 1, 2),)
    assert schedule._walk_groups(DEFAULTS, joint((128, 9, 1), (32, 9, 1), (32, 70, 3), (32, 5, 5)), 64) == ((0,), (1,), (2,), (3,))


@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_walk_takes_consecutive_blocks_of_one_mul_together(deterministic, planned_with):
    """The fused backward's walk by destination walks consecutive x blocks of equal ``mul`` as one
    group while their z̄ chunks take at most MERGED_BACKWARD_WALK_Z_COMPONENTS components: it stages
    all of the group's z̄ chunks at once, holds each block's x registers and x̄ sums under names of
    its own, and flushes each block's x̄."""
    problem = jax_cgtp.channelwise_tensor_product("128x0e+128x1o+128x2e+32x1e", "0e+1o+2e+3o",
                                                  filter_ir_out="0e+1o+2e").problem
    call = backward_call(problem, (INDEXED, BATCHED, BATCHED, INDEXED), rows=(10, None, None, 10),
                         deterministic=deterministic)
    for limit, groups in ((64, ((0, 1, 2), (3,))), (30, ((0, 1), (2,), (3,))), (0, ())):
        settings = with_settings(call, merged_backward_walk_z_components=((4, limit),))
        kernel = next(k for k in schedule.plan(settings, "float", "int") if k.joint is not None)
        joint = kernel.joint
        assert joint.walk_groups == groups
        z_rows = [sum(schedule.WARP * schedule.stage_width(p.z_dim) for *_, paths in members for p in paths)
                  for members in joint.walked_blocks]
        assert dict(kernel.stage_sizes)["z"] == max(z_rows)
        source = codegen.generate(kernel)
        merged = [len(members) for members in joint.walked_blocks if len(members) > 1]
        assert source.count("T& gx_0 = gx_") == sum(merged)
        assert source.count("long long cur = -1, cur_x = -1;") == len(joint.walked_blocks)


def test_backward_walk_stays_apart_where_merged_z_chunks_cost_warps(planned_with):
    """sevennet-l3-c32's fused backward in float64: merging its 0e and 1o blocks would stage z̄
    chunks that leave 3 warps per block in ``Settings.max_block_shared_bytes`` instead of 4 (1.23x the time on an
    H200), so its blocks are walked apart; with room for 4 warps they merge."""
    problem = jax_cgtp.channelwise_tensor_product("32x0e+32x1o+32x2e+32x3o", "0e+1o+2e+3o",
                                                  filter_ir_out="0e+0o+1o+1e+2e+2o+3o+3e").problem
    call = backward_call(problem, (INDEXED, BATCHED, BATCHED, INDEXED), rows=(10, None, None, 10))

    def walk(**settings):
        planned = with_settings(call, merged_backward_walk_z_components=((8, 64),), **settings)
        return next(k for k in schedule.plan(planned, "double", "int") if k.joint is not None)

    apart = walk()
    assert apart.joint.walk_groups == () and apart.warps_per_block == schedule.WARPS_PER_BLOCK
    merged = walk(max_block_shared_bytes=2 * DEFAULTS.max_block_shared_bytes)
    assert merged.joint.walk_groups == ((0, 1), (2,), (3,)) and merged.warps_per_block == schedule.WARPS_PER_BLOCK


@pytest.mark.parametrize("dtype, batches", [("float", [19]), ("double", [12, 7])])
def test_joint_passes_bound_the_registers_of_high_l_products(dtype, batches):
    """25 y components are loaded by each path (through ``__ldca`` in float64; mace's 16 stay in
    registers for the whole edge), and the 2e block's weights are loaded at once in float32, in
    batches of 12 in float64."""
    problem = high_l_pair(kernels="auto")[0].problem
    (kernel,) = schedule.plan(forward_call(problem, (BATCHED,) * 4), dtype, "int")
    source = codegen.generate(kernel)
    assert "const T ye_" not in source and ("__ldca(p_y + 24)" in source) == (dtype == "double")
    *_, paths = kernel.joint.blocks[1]
    assert [len(batch) for batch in codegen_joint._weight_batches(kernel, paths)] == batches
    (kernel,) = schedule.plan(forward_call(mace_problem(), (BATCHED,) * 4), dtype, "int")
    assert "const T ye_0 = " in codegen.generate(kernel)


def test_launches_fit_the_shared_memory_of_a_block():
    """The atomic convolution backward of ``high_l_pair`` stages the 2e block's 125 z̄ components per
    lane: in float64 four warps would need 157 KiB, so a block gets fewer; a warp that alone needs
    more than a block may have is an error naming the problem."""
    problem = high_l_pair(kernels="auto")[0].problem
    call = backward_call(problem, (INDEXED, BATCHED, BATCHED, INDEXED), rows=(10, None, None, 10))
    (kernel,) = schedule.plan(call, "double", "int")
    limit = DEFAULTS.max_block_shared_bytes
    assert kernel.smem_per_warp * 8 * schedule.WARPS_PER_BLOCK > limit
    assert kernel.warps_per_block == limit // (kernel.smem_per_warp * 8) < 4
    assert kernel.shared_bytes <= limit
    assert f"{kernel.warps_per_block} warps per block" in codegen.generate(kernel)
    (narrow,) = schedule.plan(backward_call(mace_problem(), (INDEXED, BATCHED, BATCHED, INDEXED),
                                            rows=(10, None, None, 10)), "double", "int")
    assert narrow.warps_per_block == schedule.WARPS_PER_BLOCK
    with pytest.raises(ValueError, match=r"needs \d+ bytes of shared memory, more than the 4096 of a block.*2e"):
        schedule.plan(with_settings(call, max_block_shared_bytes=4096), "double", "int")


@pytest.mark.parametrize("deterministic", [False, True])
def test_only_the_atomic_convolution_walks_z_apart_above_the_limit(deterministic, planned_with):
    """The second derivative of the force loss w.r.t. y and w (x̄ not needed) with
    ``Z_WITH_BACKWARD_MAX_TERMS`` at 0: the atomic walk by destination puts z in a launch of its
    own; the deterministic one keeps ȳ and w̄ with its owned z rows, by which long runs are
    chunked."""
    planned_with(z_with_backward_max_terms=0)
    conv, _ = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=deterministic)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(1), conv, 9, 50, jnp.float32)

    def force_loss(y, w):
        gy, gw = jax.grad(lambda *a: jnp.sum(conv(x, *a, src, dst, 9) ** 2), argnums=(0, 1))(y, w)
        return jnp.sum(gy * gy) + jnp.sum(gw * gw)

    launches = [sorted(out.role for out in k.outputs) for k in
                cuda_lowering.planned_kernels(jax.grad(force_loss, argnums=(0, 1)), y, w) if not k.chunk_sum]
    cuda_lowering._plan.cache_clear()
    assert any("y" in roles and "z" in roles for roles in launches) == deterministic, launches


def test_deterministic_convolution_reduces_each_node_in_one_warp(planned_with):
    """With ``DETERMINISTIC_BACKWARD_SLICE_BYTES`` off, the deterministic backward walks each source
    node's sorted run on one warp, which owns its x̄ row."""
    planned_with(deterministic_backward_slice_bytes=0)
    kinds = (INDEXED, BATCHED, BATCHED, INDEXED)
    call = backward_call(mace_problem(), kinds, rows=(10, None, None, 10), deterministic=True)
    (kernel,) = schedule.plan(call, "double", "long long")
    assert kernel.tiling == "segments" and kernel.segment_role == "x"
    assert [o.flush for o in kernel.outputs] == ["own", "store", "store"]
    assert not any(o.zeroed for o in kernel.outputs)  # every row is written once, no zero fill
    assert kernel.joint.by_destination  # the joint walk, over one source node's sorted edges
    source = codegen.generate(kernel)
    assert "if (ix_x != cur_x)" in source and "cgtp_own(" in source and "cgtp_atomic(dst" not in source
    atomic = schedule.plan(forward_call(mace_problem(), kinds, rows=(10, None, None, 10)), "float", "int")
    assert [o.flush for o in atomic[0].outputs] == ["atomic"] and atomic[0].outputs[0].zeroed


def test_deterministic_backward_in_slices_walks_by_destination_without_atomics(planned_with):
    """The deterministic fused backward is the atomic one's walk by destination (its call carries
    ``dst``'s ordering alone) with x̄ stored to the slice's rows (as many as fit in
    ``DETERMINISTIC_BACKWARD_SLICE_BYTES``), and a sum by source (``src``'s ordering): over whole
    runs up to ``RUN_CHUNK`` edges, else each run's first chunk, the later chunks to rows of their
    own, and their sum in chunk order. No atomics, nothing zero-filled. Forwards, atomic calls and
    passes without x̄ keep their plans, and so does every call with the setting off."""
    kinds = (INDEXED, BATCHED, BATCHED, INDEXED)
    rows = (10, None, None, 10)
    call = backward_call(mace_problem(), kinds, rows, deterministic=True)
    x_dim = call.problem.irreps_in1.dim
    call = with_settings(call, deterministic_backward_slice_bytes=4096 * x_dim * 4 + 5)
    walk, total = schedule.plan(call, "float", "int", 100)
    assert walk.slice_walk == total.slice_sum == 4096 and walk.call.walk == "z" and total.call.sorted_roles == ("x",)
    assert [o.flush for o in walk.outputs] == ["slice", "store", "store"] and walk.joint.by_destination
    assert [(o.role, o.flush) for o in total.outputs] == [("x", "own")] and total.segment_role == "x"
    walk, chunked, chunk_total = schedule.plan(call, "double", "int", 1000)
    assert walk.slice_walk == chunked.slice_sum == 2048 and not chunk_total.slice_sum
    assert (chunked.run_cap, chunked.chunk_walk, chunk_total.chunk_sum) == (DEFAULTS.run_chunk,) * 3
    assert chunked.writes_slice_chunk_rows and not total.writes_slice_chunk_rows
    assert walk.writes_positions and not dataclasses.replace(walk, slice_first=False).writes_positions
    assert chunked.kept == () and dataclasses.replace(chunked, slice_first=False).kept == (0,)
    assert chunk_total.kept == (0,)
    kernels = (walk, total, chunked, chunk_total)
    assert not any(o.zeroed for k in kernels for o in k.outputs)
    for kernel in kernels:
        assert "atomic" not in codegen.generate(kernel).split("cgtp_kernel(")[1]
    assert all("slice_at[0]" in codegen.generate(k) for k in (walk, total, chunked))
    atomic = schedule.plan(backward_call(mace_problem(), kinds, rows), "float", "int", 100)
    forward = schedule.plan(forward_call(mace_problem(), kinds, rows, deterministic=True), "float", "int", 100)
    y_alone = Call(mace_problem(), kinds, rows, ("x", "y", "w", "z"), (Output("y", (Term((0, 2, 3)),)),), True)
    for kernels in (atomic, forward, schedule.plan(y_alone, "float", "int", 100)):
        assert not any(k.slice_walk or k.slice_sum for k in kernels)
    off = with_settings(call, deterministic_backward_slice_bytes=0)
    assert not any(k.slice_walk or k.slice_sum for k in schedule.plan(off, "float", "int", 100))


def test_walks_over_sorted_runs_leave_the_edges_out_of_range_to_every_warp(planned_with):
    """A padded graph's padding edges (index out of range, sorted last) are one long run: a walk
    walks only the nodes' runs, a warp per node, and the per-edge outputs of the edges out of range
    get zeros from every warp of the grid, a warp per edge (the backward: walking by source)."""
    planned_with(deterministic_backward_slice_bytes=0)
    kinds = (INDEXED, BATCHED, BATCHED, INDEXED)
    forward_call_ = forward_call(mace_problem(), kinds, (10, None, None, 10), deterministic=True)
    backward = backward_call(mace_problem(), kinds, rows=(10, None, None, 10), deterministic=True)
    for call, per_edge in ((forward_call_, []), (backward, [(1, "y"), (2, "w")])):
        (kernel,) = schedule.plan(call, "float", "int")
        r = kernel.segment_role
        assert kernel.tiling == "segments" and kernel.tiles(10**5, 10) == 10
        source = codegen.generate(kernel)
        assert f"seg < rows_{r}; seg +=" in source and "rows_" + r + " + 2" not in source
        zeros = re.findall(r"out(\d)\[e \* \d+LL \+ q\] = T\(0\);  // (\w)", source)
        assert [(int(k), role) for k, role in zeros] == per_edge
        assert ("for (long long i = warp; i < below + num_edges - above; i += num_warps)" in source) == bool(per_edge)


def test_deterministic_forward_owns_each_node():
    """The forward walks the ``dst`` runs, one warp per block: no zero fill; empty nodes and
    path-less components are written as zeros."""
    kinds = (INDEXED, BATCHED, BATCHED, INDEXED)
    problem = jax_cgtp.TensorProduct("8x0e+8x1o", "0e+1o", "8x0e+8x1o+3x2e",
                                     [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True)]).problem
    call = forward_call(problem, kinds, (10, None, None, 10), deterministic=True)
    (forward,) = schedule.plan(call, "float", "int")
    assert forward.segment_role == "z" and [o.flush for o in forward.outputs] == ["own"]
    assert forward.warps_per_block == 1 and not forward.outputs[0].zeroed
    assert forward.outputs[0].zero_ranges == ((8, 47),)  # 8x1o and 3x2e have no path
    source = codegen.generate(forward)
    assert "// no edges" in source and "have no path" in source and "cgtp_atomic(dst" not in source
    if nvrtc.available():
        assert nvrtc.compile_cubin(source, "sm_90", "the deterministic forward")


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_only_the_deterministic_forward_writes_z_lane_by_lane(dtype):
    """The deterministic forward writes each node's z chunk once, straight from each lane's
    registers (``lc * dim + q``, strided), with no transposition buffer. The atomic forward and
    the product's forward transpose through shared memory, and so do the deterministic
    backward's walks (not the sums of its slices)."""
    kinds, rows = (INDEXED, BATCHED, BATCHED, INDEXED), (10, None, None, 10)
    (owned,) = schedule.plan(forward_call(mace_problem(), kinds, rows, deterministic=True), dtype, "int")
    assert owned.outputs[0].lane_writes and owned.transpose_size == 0
    source = codegen.generate(owned)
    assert "obuf" not in source
    assert "cgtp_own(dst_z + lc * 5 + 4, " in source  # the last component of a 2e chunk
    if nvrtc.available():
        assert nvrtc.compile_cubin(source, "sm_90", "the deterministic forward")
    (atomic,) = schedule.plan(forward_call(mace_problem(), kinds, rows), dtype, "int")
    (product,) = schedule.plan(forward_call(mace_problem(), (BATCHED,) * 4), dtype, "int")
    backward = schedule.plan(backward_call(mace_problem(), kinds, rows, deterministic=True), dtype, "int")
    for kernel in [atomic, product] + [k for k in backward if not k.slice_sum]:
        assert not any(o.lane_writes for o in kernel.outputs)
        assert kernel.transpose_size > 0 and "obuf[q]" in codegen.generate(kernel)


def test_deterministic_walks_of_long_code_run_in_lockstep(planned_with):
    """A walk over sorted runs keeps one free warp per block up to the first LOCKSTEP_WARPS step of
    CG terms; above it, blocks of W warps walk consecutive runs together and meet before each
    group of paths (the backward: walking by source; the forward as planned without its edge count,
    which keeps it from walking tiles instead)."""
    planned_with(deterministic_backward_slice_bytes=0)
    kinds = (INDEXED, BATCHED, BATCHED, INDEXED)
    def up_to(lmax, irreps_in1, irreps_in2):  # the outputs of l <= lmax (sevennet-l3-c32 and l5-c32)
        return jax_cgtp.channelwise_tensor_product(irreps_in1, irreps_in2, filter_ir_out=[
            f"{l}{p}" for l in range(lmax + 1) for p in "eo"]).problem

    l3 = up_to(3, "32x0e+32x1o+32x2e+32x3o", "0e+1o+2e+3o")
    l5 = up_to(5, "32x0e+32x1o+32x2e+32x3o+32x4e+32x5o", "0e+1o+2e+3o+4e+5o")
    rows = (1000, None, None, 1000)
    (short,) = schedule.plan(forward_call(l3, kinds, rows, deterministic=True), "float", "int")
    (middle,) = schedule.plan(backward_call(l3, kinds, rows=rows, deterministic=True), "float", "int")
    (long,) = schedule.plan(forward_call(l5, kinds, rows, deterministic=True), "float", "int")
    assert [k.joint.cg_terms for k in (short, middle, long)] == [611, 1833, 5265]
    (low, four), (high, eight) = DEFAULTS.lockstep_warps
    assert short.joint.cg_terms <= low < middle.joint.cg_terms <= high < long.joint.cg_terms
    assert not short.lockstep and short.warps_per_block == 1
    for kernel, warps in ((middle, four), (long, eight)):
        assert kernel.lockstep and kernel.warps_per_block == warps
        assert kernel.grid(10**5, 1000) == -(-1000 // warps)  # a warp per node's run
        source = codegen.generate(kernel)
        assert source.count("__syncthreads();") == len(kernel.joint.blocks)
        assert f"cgtp_longest_run(off_{kernel.segment_role}, base, {warps}," in source
    assert "__syncthreads" not in codegen.generate(short)


def test_shared_weight_gradient_is_a_per_warp_partial():
    call = backward_call(mace_problem(), (BATCHED, BATCHED, SHARED, BATCHED))
    (kernel,) = schedule.plan(call, "float", "int")
    assert kernel.has_partials and kernel.grid(10**7, 0) == DEFAULTS.max_partial_blocks


def test_shared_weight_gradient_of_few_edges_uses_small_tiles_to_fill_the_warps():
    call = backward_call(mace_problem(), (BATCHED, BATCHED, SHARED, BATCHED))
    (few,) = schedule.plan(call, "float", "int", 864)
    assert few.tile == 1 and few.grid(864, 0) == DEFAULTS.max_partial_blocks  # 864 tiles x groups
    assert few.partial_rows(few.grid(864, 0)) == 4 * DEFAULTS.max_partial_blocks // few.num_groups
    (many,) = schedule.plan(call, "float", "int", 10**6)
    assert many.tile == DEFAULTS.tile_indexed and many.grid(10**6, 0) == DEFAULTS.max_partial_blocks
    assert many.groups == () and many.partial_rows(many.grid(10**6, 0)) == 4 * DEFAULTS.max_partial_blocks
    (batched,) = schedule.plan(backward_call(mace_problem(), (BATCHED,) * 4), "float", "int", 864)
    assert batched.tile == 1


def test_walks_of_many_edges_per_tile_fill_the_gpu_in_one_wave():
    """A convolution's atomic walk asks for a warp per FILL_MIN_SPAN edges (the launcher caps the
    grid at the resident blocks) and spreads the edges over the warps; a per-edge product, a
    deterministic walk by runs and a launch with partial rows keep their grids."""
    conv = forward_call(mace_problem(), (INDEXED, BATCHED, BATCHED, INDEXED))
    (walk,) = schedule.plan(conv, "float", "int", 10**5)
    assert walk.fill and walk.tile == DEFAULTS.tile_indexed
    assert walk.grid(10**5, 0) == -(-10**5 // DEFAULTS.fill_min_span // walk.warps_per_block)
    source = codegen.generate(walk)
    assert "const long long span = rounds > 0 ?" in source and "const long long first = tile * span;" in source
    (product,) = schedule.plan(forward_call(mace_problem(), (BATCHED,) * 4), "float", "int", 10**5)
    runs = schedule.plan(forward_call(mace_problem(), (INDEXED, BATCHED, BATCHED, INDEXED), deterministic=True),
                         "float", "int", 10**5)  # (three launches: the runs' first chunk, later chunks, sums)
    (partials,) = schedule.plan(backward_call(mace_problem(), (BATCHED, BATCHED, SHARED, BATCHED)), "float", "int")
    assert not any(k.fill for k in [product, *runs, partials])
    assert f"const long long span = {product.tile};" in codegen.generate(product)


def test_launches_of_few_tiles_spread_their_slots_over_warp_groups():
    """Every chunk of every slot runs in exactly one group; the shared-weight flush is a
    reduction into the walker's partial row."""
    uvw = jax_cgtp.fully_connected_tensor_product("32x0e+32x1o+32x2e", "3x0e", "96x0e+32x1o+32x2e").problem
    call = backward_call(uvw, (BATCHED, BATCHED, SHARED, BATCHED))
    (kernel,) = schedule.plan(call, "float", "int", 864)
    units = sorted((k, c) for group in kernel.groups for k, begin, end in group for c in range(begin, end))
    chunks = [(k, c) for k, slot in enumerate(kernel.slots) for c in range(schedule.slot_chunks(slot))]
    assert 1 < kernel.num_groups <= DEFAULTS.max_groups and units == chunks
    source = codegen.generate(kernel)
    assert f"const int group = (int)(warp % {kernel.num_groups});" in source
    assert "cgtp_red(dst" in source and "cur = walker;" in source
    if nvrtc.available():
        assert nvrtc.compile_cubin(source, "sm_90", "slot groups")
    (alone,) = schedule.plan(call, "float", "int", 10**6)
    assert alone.groups == () and "walker" not in codegen.generate(alone)


def test_generated_source_names_paths_and_irreps():
    (kernel,) = schedule.plan(forward_call(mace_problem(), (BATCHED,) * 4), "double", "int")
    source = codegen.generate(kernel)
    assert "typedef double T;" in source
    assert "// path 4: 128x1o (x) 1x1o -> 128x0e, mode uvu, weighted, 3 CG nonzeros" in source
    assert "// x block at 128: 128 channels of dimension 3, paths" in source  # a joint pass
    uvw = jax_cgtp.fully_connected_tensor_product("4x0e+4x1o", "0e+1o", "4x0e+4x1o").problem
    (kernel,) = schedule.plan(forward_call(uvw, (BATCHED,) * 4), "double", "int")
    assert "// path 2: 4x1o (x) 1x0e -> 4x1o, mode uvw, rows u in [0, 4), 3 CG nonzeros" in codegen.generate(kernel)
    (kernel,) = schedule.plan(forward_call(uvw, (BATCHED, BATCHED, SHARED, BATCHED)), "double", "int")
    assert "// ---- out0: z block 1 (4x1o)" in codegen.generate(kernel)  # slot by slot


def test_uncovered_output_blocks_are_written_with_zeros():
    tp = jax_cgtp.TensorProduct("2x0e", "0e", "2x0e+3x1o", [(0, 0, 0, "uvu", True)])
    (kernel,) = schedule.plan(forward_call(tp.problem, (BATCHED,) * 4), "float", "int")
    assert kernel.outputs[0].zero_ranges == ((2, 11),)


@needs_nvrtc
def test_nvrtc_error_names_the_problem_and_shows_the_log():
    with pytest.raises(nvrtc.NvrtcError, match=r"compiling the kernel of my problem for sm_90 failed(.|\n)*undefined"):
        nvrtc.compile_cubin("__global__ void k() { undefined_name(); }", "sm_90", "my problem")


def _specs():
    """20 random problems: every mode, multiplicities 1 to 5, l up to 3 (one up to 5)."""
    return [random_problem(seed, mode=MODES[seed % 5], lmax=5 if seed == 7 else 3) for seed in range(20)]


@needs_nvrtc
@pytest.mark.slow
@pytest.mark.slow_compile
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_nvrtc_compiles_every_member_of_random_problems(lower_for_sm90, dtype):
    """The forward and fused backward of 20 random problems of every mode in float32; in float64, of
    10 of them (every mode), with their JVP and a single-operand gradient. The public benchmark
    configs' kernels, both dtypes:
    ``test_benchmarks_smoke.test_nvrtc_compiles_the_product_kernels_of_every_public_config``."""
    specs = _specs() if dtype == jnp.float32 else _specs()[::2]
    tps = [build(spec) for spec in specs]
    for tp in tps:  # every member on the kernels ("auto" runs some on XLA; the constructor's "cuda" wants a GPU)
        tp.backend = "cuda"
    inputs = [random_inputs(jax.random.PRNGKey(n), spec, (4,), tp.weight_numel, dtype, n % 2 == 0)
              for n, (spec, tp) in enumerate(zip(specs, tps))]

    def members(inputs):
        results = []
        for tp, (x, y, w) in zip(tps, inputs):
            z, vjp = jax.vjp(tp, x, y, w)
            results += [z, vjp(z)]
            if dtype == jnp.float64:  # the JVP (three terms) and a single-operand gradient
                results += [jax.jvp(tp, (x, y, w), (x, y, w))[1], jax.grad(lambda x: jnp.sum(tp(x, y, w)))(x)]
        return results

    assert cuda_lowering.precompile(members, inputs) >= (2 if dtype == jnp.float32 else 4) * len(specs)


@needs_nvrtc
@pytest.mark.parametrize("deterministic", [False, True])
def test_nvrtc_compiles_convolution_kernels(lower_for_sm90, deterministic, planned_with):
    """Every launch of the gradients of both modes, and of joint passes with shared weights, on 300
    edges over 5 nodes: runs of 60 edges, so that each deterministic walk is three launches, its
    runs' first chunk, the later chunks and their sums (``DEFAULTS.run_chunk`` = 50 here), and the
    backward's sum by source two, the first and the later chunks in one launch, then their sums."""
    convs = []
    for mode in ("uvu", "uvw"):
        irreps_in1, irreps_in2, irreps_out, instructions, normalization = random_problem(40, mode=mode, lmax=2)
        convs.append((jax_cgtp.TensorProductConv(irreps_in1, irreps_in2, irreps_out, instructions, **normalization,
                                                 deterministic=deterministic), False))
    convs.append((spherical_harmonics_pair(jax_cgtp.TensorProductConv, "auto", deterministic=deterministic)[0], True))
    seen = set()  # a deterministic walk's first launch
    for conv, shared in convs:
        x = jnp.ones((5, conv.irreps_in1.dim))
        y = jnp.ones((300, conv.irreps_in2.dim))
        w = jnp.ones((conv.weight_numel,) if shared else (300, conv.weight_numel))
        src = dst = jnp.arange(300, dtype=jnp.int32) % 5

        def loss(x, y, w):
            return jnp.sum(conv(x, y, w, src, dst, 5) ** 2)

        grads = jax.grad(loss, argnums=(0, 1, 2))
        planned_with(run_chunk=50)
        walks = [k for k in cuda_lowering.planned_kernels(grads, x, y, w) if k.tiling == "segments"]
        parts = [(k.run_cap, k.chunk_walk, k.chunk_sum) for k in walks]
        if deterministic:  # (the atomic gradients walk tiles)
            launches = {(50, 0, 0): [(50, 0, 0), (0, 50, 0), (0, 0, 50)], (50, 50, 0): [(50, 50, 0), (0, 0, 50)]}
            while parts:
                seen.add(parts[0])
                assert parts[:len(launches[parts[0]])] == launches[parts[0]]
                parts = parts[len(launches[parts[0]]):]
        if shared:
            assert any(k.joint is not None and k.has_partials for k in cuda_lowering.planned_kernels(grads, x, y, w))
        assert cuda_lowering.precompile(grads, x, y, w) >= 2
    assert seen == ({(50, 0, 0), (50, 50, 0)} if deterministic else set())


@needs_nvrtc
@pytest.mark.slow
@pytest.mark.slow_compile
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_nvrtc_compiles_the_tiled_deterministic_forward(lower_for_sm90, dtype):
    """l5-c32's deterministic forward (5,265 CG terms, beyond the lockstep threshold) on 1,000 edges:
    the atomic forward's walk over 32-edge tiles, its z stored to rows or to 2 partial rows per tile,
    then their sum; NVRTC compiles both."""
    conv = jax_cgtp.channelwise_tensor_product("32x0e+32x1o+32x2e+32x3o+32x4e+32x5o", "0e+1o+2e+3o+4e+5o",
                                               filter_ir_out=[f"{l}{p}" for l in range(6) for p in "eo"])
    conv = jax_cgtp.TensorProductConv(conv.irreps_in1, conv.irreps_in2, conv.irreps_out,
                                      [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight) for i in conv.instructions],
                                      deterministic=True)
    x = jnp.ones((50, conv.irreps_in1.dim), dtype)
    y = jnp.ones((1000, conv.irreps_in2.dim), dtype)
    w = jnp.ones((1000, conv.weight_numel), dtype)
    index = jnp.arange(1000, dtype=jnp.int32) % 50
    forward = functools.partial(conv, src=index, dst=index, num_nodes=50)
    walk, total = cuda_lowering.planned_kernels(forward, x, y, w)
    assert walk.partial_tiles == total.tile_sum == 32 and walk.outputs[0].flush == "tile" and not walk.lockstep
    assert "cgtp_tile_row(out0, tile_rows, off_z, cur, tile, first, count," in codegen.generate(walk)
    assert cuda_lowering.precompile(forward, x, y, w) == 2


@needs_nvrtc
def test_lowered_backward_is_one_self_contained_custom_call(lower_for_sm90):
    tp = jax_cgtp.channelwise_tensor_product("8x0e+8x1o", "0e+1o", filter_ir_out="0e+1o")
    x, y, w = (jnp.ones(shape, jnp.float32) for shape in ((5, 32), (5, 4), (5, tp.weight_numel)))

    def grads(x, y, w):
        return jax.grad(lambda *a: jnp.sum(tp(*a) ** 2), argnums=(0, 1, 2))(x, y, w)

    exported = export.export(
        jax.jit(grads), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call(cuda_lowering.TARGET)],
    )(x, y, w)
    text = exported.mlir_module()
    calls = [line for line in text.splitlines() if f"custom_call @{cuda_lowering.TARGET}" in line]
    assert len(calls) == 2  # forward and the fused backward
    assert "-> (tensor<5x32xf32>, tensor<5x4xf32>, tensor<5x32xf32>)" in calls[1]
    assert "image = dense<" in calls[1]  # the cubin travels inside the HLO


@needs_nvrtc
def test_launches_lower_to_the_target_xla_may_capture_in_command_buffers(lower_for_sm90, monkeypatch):
    """The launch target is registered as safe to record in XLA's command buffers (CUDA graphs),
    and kernels lower to it; with ``command_buffers`` off, to the same handler registered without
    that trait."""
    from jaxlib.xla_client import CustomCallTargetTraits

    registered = {}
    monkeypatch.setattr(jax.ffi, "register_ffi_target",
                        lambda name, handlers, platform, **options: registered.update({name: options.get("traits")}))
    cuda_lowering._register_target.cache_clear()
    tp = jax_cgtp.channelwise_tensor_product("8x0e+8x1o", "0e+1o", filter_ir_out="0e+1o")
    x, y, w = (jnp.ones(shape, jnp.float32) for shape in ((5, 32), (5, 4), (5, tp.weight_numel)))

    def targets():
        exported = export.export(jax.jit(lambda *a: tp(*a)), platforms=["cuda"], disabled_checks=[
            export.DisabledSafetyCheck.custom_call(t) for t in (cuda_lowering.TARGET, cuda_lowering.UNCAPTURED_TARGET)
        ])(x, y, w)
        return re.findall(r"custom_call @(\w+)", exported.mlir_module())

    try:
        assert targets() == [cuda_lowering.TARGET]
        with jax_cgtp.config(command_buffers=False):
            assert targets() == [cuda_lowering.UNCAPTURED_TARGET]
        assert registered == {cuda_lowering.TARGET: CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE,
                              cuda_lowering.UNCAPTURED_TARGET: None}
    finally:
        cuda_lowering._register_target.cache_clear()


@needs_nvrtc
@pytest.mark.parametrize("index_dtype", [jnp.int32, jnp.int64])
def test_atomic_convolution_groups_its_edges_once_per_call(lower_for_sm90, index_dtype):
    """Without ``graph=``, the lowered atomic convolution groups its edges by ``dst`` once (one
    launch of each grouping kernel, compiled by NVRTC), for the forward and the backward together;
    given a graph, not at all."""
    irreps_in1, irreps_in2, irreps_out, instructions, normalization = random_problem(40, mode="uvu", lmax=2)
    conv = jax_cgtp.TensorProductConv(irreps_in1, irreps_in2, irreps_out, instructions, **normalization)
    x, y, w = jnp.ones((5, conv.irreps_in1.dim)), jnp.ones((9, conv.irreps_in2.dim)), jnp.ones((9, conv.weight_numel))
    src, dst = jnp.arange(9, dtype=index_dtype) % 5, (jnp.arange(9, dtype=index_dtype) * 2) % 5

    def launches(call):
        def value_and_grads(x, y, w):
            return jax.value_and_grad(lambda *a: jnp.sum(call(*a) ** 2), argnums=(0, 1, 2))(x, y, w)

        exported = export.export(jax.jit(value_and_grads), platforms=["cuda"], disabled_checks=[
            export.DisabledSafetyCheck.custom_call(cuda_lowering.TARGET)])(x, y, w)
        return re.findall(r'kernel = "(\w+)"', exported.mlir_module())

    grouped = launches(lambda *a: conv(*a, src, dst, 5))
    grouping = (jax_cgtp.gpu.grouping_kernels.COUNT_KERNEL, jax_cgtp.gpu.grouping_kernels.PLACE_KERNEL)
    assert [grouped.count(name) for name in grouping] == [1, 1] and len(grouped) >= 4
    graph = jax_cgtp.sort_graph(src, dst, 5)
    assert not set(grouping) & set(launches(lambda *a: conv(*a, graph=graph)))


def test_cuda_backend_off_the_gpu_is_a_clear_error_at_lowering():
    tp = jax_cgtp.TensorProduct("2x0e", "0e", "2x0e", [(0, 0, 0, "uvu", True)])
    tp.backend = "cuda"  # bypass the constructor's own check, as a jitted function moved to CPU would
    with pytest.raises(ValueError, match="backend='cuda' needs the computation to be lowered for an NVIDIA GPU"):
        jax.jit(tp)(np.ones((3, 2)), np.ones((3, 1)), np.ones(2))


def test_the_launch_target_loads_its_kernel_before_the_executable_runs():
    """The FFI target has an initialize stage, which loads the kernel before XLA enqueues any work
    (a load behind a running collective can hang several GPUs; cuda/ffi_launch.cc)."""
    from jax_cgtp import _ffi

    assert set(_ffi.registrations()[cuda_lowering.TARGET]) == {"initialize", "execute"}


def test_lowering_without_a_gpu_asks_for_an_architecture(monkeypatch):
    monkeypatch.delenv("JAX_CGTP_ARCH", raising=False)
    cuda_lowering.device_arch.cache_clear()
    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="set JAX_CGTP_ARCH"):
        cuda_lowering.device_arch()
    cuda_lowering.device_arch.cache_clear()


def test_disk_cache_is_reused(tmp_path, monkeypatch):
    if not nvrtc.available():
        pytest.skip("NVRTC is not installed on this machine")
    monkeypatch.setenv("JAX_CGTP_CACHE_DIR", str(tmp_path))
    source = '__global__ void k(float* p) { p[threadIdx.x] = 1.0f; }'
    first = nvrtc.compile_cubin(source, "sm_90")
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].read_bytes() == first
    nvrtc._memory.clear()
    files[0].write_bytes(b"cached")
    assert nvrtc.compile_cubin(source, "sm_90") == b"cached"
    nvrtc._memory.clear()
    assert os.environ["JAX_CGTP_CACHE_DIR"] == str(tmp_path)


def test_auto_runs_derivatives_of_node_level_shared_uvw_products_on_xla():
    tp = jax_cgtp.fully_connected_tensor_product("4x0e+4x1o", "3x0e", "4x0e+4x1o")
    uvw = tp.problem
    uvu = jax_cgtp.channelwise_tensor_product("4x0e+4x1o", "0e+1o").problem
    shared = (BATCHED, BATCHED, SHARED, BATCHED)
    backward = backward_call(uvw, shared)
    assert cuda_lowering.runs_on_xla(backward, "auto")
    assert not cuda_lowering.runs_on_xla(backward, "cuda")  # "cuda" always runs the kernels
    assert not cuda_lowering.runs_on_xla(forward_call(uvw, shared), "auto")  # the kernels are faster
    assert not cuda_lowering.runs_on_xla(backward_call(uvw, (BATCHED,) * 4), "auto")  # per-row weights
    assert not cuda_lowering.runs_on_xla(backward_call(uvu, shared), "auto")  # the kernels are faster
    assert not cuda_lowering.runs_on_xla(backward_call(uvw, shared, deterministic=True), "auto")
    conv = (INDEXED, BATCHED, SHARED, INDEXED)
    assert not cuda_lowering.runs_on_xla(backward_call(uvw, conv, (5, None, None, 5)), "auto")  # no gather

    x, y, w = jnp.ones((6, tp.irreps_in1.dim)), jnp.ones((6, 3)), jnp.ones(tp.weight_numel)
    grads = jax.grad(lambda x, w: jnp.sum(tp(x, y, w) ** 2), argnums=(0, 1))
    roles = [[o.role for o in k.outputs] for k in cuda_lowering.planned_kernels(grads, x, w)]
    assert roles == [["z"]]  # the forward on the kernels, the backward on XLA


def test_free_running_walks_of_long_code_keep_their_registers(planned_with):
    """sevennet-l3-c32's fused backward (1,833 CG terms) walks free as a product and as the
    convolution (atomic, and the deterministic one's walk by destination): one block per SM is
    ptxas' target. Its forward by destination (611 terms), the deterministic backward's sum by
    source, its walk by source (lockstep; slices off) and a short pass keep ptxas' own target."""
    problem = jax_cgtp.channelwise_tensor_product("32x0e+32x1o+32x2e+32x3o", "0e+1o+2e+3o",
                                                  filter_ir_out=[f"{l}{p}" for l in range(4) for p in "eo"]).problem
    conv = (INDEXED, BATCHED, BATCHED, INDEXED), (10, None, None, 10)
    kernels = {
        "bwd": schedule.plan(backward_call(problem, (BATCHED,) * 4), "float", "int"),
        "conv_bwd": schedule.plan(backward_call(problem, *conv), "float", "int"),
        "conv_fwd": schedule.plan(forward_call(problem, *conv), "float", "int"),
        "det_conv_bwd": schedule.plan(backward_call(problem, *conv, deterministic=True), "float", "int"),
        "mace_bwd": schedule.plan(backward_call(mace_problem(), (BATCHED,) * 4), "float", "int"),
    }
    planned_with(deterministic_backward_slice_bytes=0)
    kernels["det_src_conv_bwd"] = schedule.plan(backward_call(problem, *conv, deterministic=True), "float", "int")
    blocks = {name: [k.min_blocks for k in launched] for name, launched in kernels.items()}
    assert blocks == {"bwd": [1], "conv_bwd": [1], "conv_fwd": [0], "det_conv_bwd": [1, 0],
                      "mace_bwd": [0], "det_src_conv_bwd": [0]}
    assert kernels["det_src_conv_bwd"][0].lockstep
    assert "__launch_bounds__(128, 1)" in codegen.generate(kernels["bwd"][0])
    assert "__launch_bounds__(128) " in codegen.generate(kernels["conv_fwd"][0])


@pytest.mark.parametrize("dtype, nodes", [("float", 4096), ("double", 2048)])
def test_atomic_forward_walks_runs_from_the_librarys_node_counts(dtype, nodes, planned_with):
    """The library's rule for mace-l2-c128's atomic conv forward: the walk over destination runs
    from 4,096 nodes in float32 (2,048 in float64) at 16 edges per node, four times as many at 64
    edges per node (the dense graph's), the plain atomic forward below."""
    kinds = (INDEXED, BATCHED, BATCHED, INDEXED)

    def walks(rows: int, edges_per_node: int) -> bool:
        call = forward_call(mace_problem(), kinds, (rows, None, None, rows), deterministic=True, orderings=("z",))
        return schedule.owned_forward_is_faster(call, dtype, "int", rows * edges_per_node)

    assert walks(nodes, 16) and not walks(nodes - 1, 16) and walks(nodes, 8)
    assert walks(4 * nodes, 64) and not walks(4 * nodes - 1, 64) and not walks(nodes, 64)


@pytest.fixture
def kernel_lowering_on_cpu(monkeypatch):
    """``cgtp`` calls on the CPU lowered as on a GPU up to the launches, each launch checked against
    its kernel's signature and answered with zeros instead of running: the kernels launched."""
    launched = []

    def answer(kernel, args, shapes, grid, scalars):
        launched.append(kernel)
        return [jnp.zeros(s.shape, s.dtype) for s in shapes]

    monkeypatch.setattr(cuda_lowering, "run_kernel", answer)
    mlir.register_lowering(primitives.cgtp_p, lowerings.CGTP_KERNELS, platform="cpu")
    jax.clear_caches()
    try:
        yield launched
    finally:
        mlir.register_lowering(primitives.cgtp_p, lowerings.CGTP_REFERENCE, platform="cpu")
        jax.clear_caches()


def second_derivatives_of_random_convolutions(deterministic):
    for mode in ("uvu", "uvw"):
        irreps_in1, irreps_in2, irreps_out, instructions, normalization = random_problem(41, mode=mode, lmax=2)
        conv = jax_cgtp.TensorProductConv(irreps_in1, irreps_in2, irreps_out, instructions, **normalization,
                                          deterministic=deterministic)
        x, y = jnp.ones((5, conv.irreps_in1.dim)), jnp.ones((300, conv.irreps_in2.dim))
        w = jnp.ones((300, conv.weight_numel))
        index = jnp.arange(300, dtype=jnp.int32) % 5

        def loss(x, y, w, conv=conv, index=index):
            return jnp.sum(conv(x, y, w, index, index, 5) ** 2)

        jax.jit(jax.grad(lambda x, y, w: jnp.sum(jax.grad(loss, argnums=(0, 1, 2))(x, y, w)[0] ** 2),
                         argnums=(0, 1, 2)))(x, y, w)


def deterministic_backward_of_harmonics_in_slices(planned_with):
    conv, _ = spherical_harmonics_pair(jax_cgtp.TensorProductConv, "auto", deterministic=True)
    planned_with(deterministic_backward_slice_bytes=100 * conv.irreps_in1.dim * 8)
    x, y = jnp.ones((50, conv.irreps_in1.dim)), jnp.ones((500, conv.irreps_in2.dim))
    w = jnp.ones((500, conv.weight_numel))
    index = jnp.arange(500, dtype=jnp.int32) % 50
    jax.jit(jax.grad(lambda x, y, w: jnp.sum(conv(x, y, w, index, index, 50) ** 2), argnums=(0, 1, 2)))(x, y, w)


def deterministic_forward_of_long_code():
    tp = jax_cgtp.channelwise_tensor_product("32x0e+32x1o+32x2e+32x3o+32x4e+32x5o", "0e+1o+2e+3o+4e+5o",
                                             filter_ir_out=[f"{l}{p}" for l in range(6) for p in "eo"])
    conv = jax_cgtp.TensorProductConv(tp.irreps_in1, tp.irreps_in2, tp.irreps_out,
                                      [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight) for i in tp.instructions],
                                      deterministic=True)
    index = jnp.arange(1000, dtype=jnp.int32) % 50
    jax.jit(functools.partial(conv, src=index, dst=index, num_nodes=50))(
        jnp.ones((50, conv.irreps_in1.dim)), jnp.ones((1000, conv.irreps_in2.dim)), jnp.ones((1000, conv.weight_numel)))


@pytest.mark.parametrize("case, kinds", [
    ("atomic", set()), ("deterministic", {"chunk_walk", "chunk_sum", "kept"}),
    ("slices", {"joint", "slice_walk", "slice_sum"}), ("long_code", {"partial_tiles", "tile_sum"})])
def test_every_launch_binds_what_its_kernel_signature_names(kernel_lowering_on_cpu, case, kinds, planned_with):
    """The lowering's launches (tile and run walks, chunk and tile sums, slices, kept outputs, joint
    passes, weight streams) bind, in count and dtype, the buffers and scalars of their kernels'
    signatures (the launches run nothing here: each is checked, then answered with zeros); each
    generated parameter list is the signature's."""
    planned_with(run_chunk=50)
    if case in ("atomic", "deterministic"):
        second_derivatives_of_random_convolutions(case == "deterministic")
    elif case == "slices":
        deterministic_backward_of_harmonics_in_slices(planned_with)
    else:
        deterministic_forward_of_long_code()
    launched = kernel_lowering_on_cpu
    assert launched and kinds <= {kind for k in launched for kind in kinds if getattr(k, kind)}
    for kernel in launched:
        declared = re.search(r"cgtp_kernel\(\n(.*?)\) \{", codegen.generate(kernel), re.S).group(1)
        assert [line.strip().rstrip(",") for line in declared.splitlines()] == \
            [p.declaration() for p in signature.kernel_signature(kernel)]


def test_a_launch_that_binds_other_buffers_than_its_kernel_takes_is_refused():
    (kernel,) = schedule.plan(forward_call(mace_problem(), (BATCHED,) * 4), "float", "int")
    x, y = jnp.ones((3, 128 * 9), jnp.float32), jnp.ones((3, 16), jnp.float32)
    w = jnp.ones((3, kernel.call.problem.weight_numel), jnp.float32)
    z = jax.ShapeDtypeStruct((3, kernel.outputs[0].dim), jnp.float32)
    signature.check_launch(kernel, [x, y, w], [z], np.array([3]))
    with pytest.raises(RuntimeError, match="binds 2 read parameters where the kernel takes 3"):
        signature.check_launch(kernel, [x, y], [z], np.array([3]))
    with pytest.raises(RuntimeError, match="in1 is T .float32. but the launch binds float64"):
        signature.check_launch(kernel, [x, y.astype(jnp.float64), w], [z], np.array([3]))
    with pytest.raises(RuntimeError, match="binds 2 scalar parameters where the kernel takes 1"):
        signature.check_launch(kernel, [x, y, w], [z], np.array([3, 4]))
