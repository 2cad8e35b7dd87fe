"""The forward product equals e3nn_jax.legacy.FunctionalTensorProduct on random problems."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from random_problems import e3nn_tensor_product, random_inputs, random_problem

import jax_cgtp
from jax_cgtp.core.problem import MODES


def relative_error(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def build(spec):
    irreps_in1, irreps_in2, irreps_out, instructions, normalization = spec
    return jax_cgtp.TensorProduct(irreps_in1, irreps_in2, irreps_out, instructions, **normalization)


CASES = [  # (seed, batch shape, shared weights): 50 problems, every mode, l up to 5
    (seed, [(), (3, 5), (4,)][seed % 3], seed % 2 == 0) for seed in range(50)
]


@pytest.mark.parametrize("seed,batch,shared", CASES)
def test_matches_e3nn_float64(seed, batch, shared):
    spec = random_problem(seed, lmax=5 if seed % 6 == 0 else 3)
    tp = build(spec)
    x, y, w = random_inputs(jax.random.PRNGKey(seed), spec, batch, tp.weight_numel, jnp.float64, shared)
    expected = e3nn_tensor_product(spec)(x, y, w)
    actual = jax.jit(tp.__call__)(x, y, w)
    assert actual.shape == expected.shape and actual.dtype == jnp.float64
    assert relative_error(actual, expected) < 1e-12


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shared", [True, False])
def test_matches_e3nn_float32(mode, shared):
    spec = random_problem(100 + MODES.index(mode), mode=mode, lmax=4)
    tp = build(spec)
    x, y, w = random_inputs(jax.random.PRNGKey(7), spec, (3, 5), tp.weight_numel, jnp.float32, shared)
    expected = e3nn_tensor_product(spec)(*(a.astype(jnp.float64) for a in (x, y, w)))
    actual = tp(x, y, w)
    assert actual.dtype == jnp.float32
    assert relative_error(actual, expected) < 1e-5


def test_every_mode_is_covered_by_the_random_problems():
    modes = {instruction[3] for seed in range(50) for instruction in random_problem(seed)[3]}
    assert modes == set(MODES)


def test_l5_and_unit_multiplicities_are_covered():
    specs = [random_problem(seed, lmax=5 if seed % 6 == 0 else 3) for seed in range(50)]
    assert any(mul_ir.ir.l == 5 for spec in specs for mul_ir in spec[0] + spec[1])
    assert any(mul_ir.mul == 1 for spec in specs for mul_ir in spec[0])
    assert any(mul_ir.mul in (3, 5) for spec in specs for mul_ir in spec[0])


def test_x_and_y_broadcast_against_each_other():
    spec = random_problem(3)
    tp = build(spec)
    x, _, w = random_inputs(jax.random.PRNGKey(0), spec, (4, 1), tp.weight_numel, jnp.float64)
    _, y, _ = random_inputs(jax.random.PRNGKey(1), spec, (6,), tp.weight_numel, jnp.float64)
    expected = e3nn_tensor_product(spec)(x, y, w)
    assert tp(x, y, w).shape == (4, 6, tp.irreps_out.dim)
    assert relative_error(tp(x, y, w), expected) < 1e-12


def test_channelwise_constructor_matches_e3nn():
    tp = jax_cgtp.channelwise_tensor_product("5x0e+3x1o+2x2e", "0e+1o+2e", filter_ir_out="0e+1o+2e")
    assert all(ins.mode == "uvu" for ins in tp.instructions)
    assert tp.irreps_out == tp.irreps_out.sort().irreps
    spec = (tp.irreps_in1, tp.irreps_in2, tp.irreps_out,
            [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight) for i in tp.instructions], {})
    x, y, w = random_inputs(jax.random.PRNGKey(2), spec, (9,), tp.weight_numel, jnp.float64)
    assert relative_error(tp(x, y, w), e3nn_tensor_product(spec)(x, y, w)) < 1e-12


def test_fully_connected_constructor_matches_e3nn():
    tp = jax_cgtp.fully_connected_tensor_product("3x0e+2x1o", "0e+1o", "4x0e+3x1o+2x1e")
    assert all(ins.mode == "uvw" for ins in tp.instructions)
    spec = (tp.irreps_in1, tp.irreps_in2, tp.irreps_out,
            [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight) for i in tp.instructions], {})
    x, y, w = random_inputs(jax.random.PRNGKey(3), spec, (9,), tp.weight_numel, jnp.float64, False)
    assert relative_error(tp(x, y, w), e3nn_tensor_product(spec)(x, y, w)) < 1e-12


def test_problem_without_weights_takes_no_w():
    tp = jax_cgtp.TensorProduct("2x1o", "2x1o", "2x0e", [(0, 0, 0, "uuu", False)])
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 6))
    expected = jnp.sum(x.reshape(3, 2, 3) ** 2, -1) / np.sqrt(3.0)
    assert relative_error(tp(x, x), expected) < 1e-12
