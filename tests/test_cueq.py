"""jax_cgtp.cueq: a problem as a cuEquivariance polynomial equals jax_cgtp (float64, CPU: naive method)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_cgtp
from jax_cgtp import cueq

pytest.importorskip("cuequivariance_jax")


def conv_problem(irreps_x, irreps_y, irreps_out):
    tp = jax_cgtp.channelwise_tensor_product(irreps_x, irreps_y, filter_ir_out=irreps_out)
    instructions = [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight) for i in tp.instructions]
    return tp, jax_cgtp.TensorProductConv(tp.irreps_in1, tp.irreps_in2, tp.irreps_out, instructions)


@pytest.mark.slow
@pytest.mark.parametrize("irreps", [("8x0e+8x1o+4x2e", "0e+1o+2e", "0e+1o+2e"), ("3x0e+2x1e", "1o+2e", "0o+1e+2o")])
def test_convolution_equals_jax_cgtp_with_out_of_range_edges(irreps):
    tp, conv = conv_problem(*irreps)
    rng = np.random.default_rng()
    nodes, edges = 7, 50
    x = rng.standard_normal((nodes, tp.irreps_in1.dim))
    y = rng.standard_normal((edges, tp.irreps_in2.dim))
    w = rng.standard_normal((edges, tp.weight_numel))
    src, dst = rng.integers(-2, nodes + 2, edges), rng.integers(-2, nodes + 2, edges)

    def loss(f):
        return lambda x, y, w: jnp.sum(jnp.sin(f(x, y, w, src, dst, nodes)))

    ours = conv(x, y, w, src, dst, nodes)
    theirs = jax.jit(lambda *a: cueq.convolution(tp.problem, *a, nodes))(x, y, w, src, dst)
    np.testing.assert_allclose(theirs, ours, rtol=1e-12, atol=1e-12)
    grads_ours = jax.grad(loss(conv), argnums=(0, 1, 2))(x, y, w)
    grads_theirs = jax.grad(loss(lambda *a: cueq.convolution(tp.problem, *a)), argnums=(0, 1, 2))(x, y, w)
    for a, b in zip(grads_theirs, grads_ours):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_layout_round_trip_and_what_cannot_be_mapped():
    tp, _ = conv_problem("3x0e+2x1o", "0e+1o", "0e+1o")
    a = jnp.asarray(np.random.default_rng().standard_normal((4, tp.irreps_in1.dim)))
    np.testing.assert_array_equal(cueq.ir_mul_to_mul_ir(tp.irreps_in1, cueq.mul_ir_to_ir_mul(tp.irreps_in1, a)), a)
    assert cueq.uniform_1d_obstacle(cueq.polynomial(tp.problem)) is None
    full = jax_cgtp.fully_connected_tensor_product("2x0e+2x1o", "0e+1o", "3x0e+3x1o")
    assert "one uniform mode" in cueq.uniform_1d_obstacle(cueq.polynomial(full.problem))
    mixed = jax_cgtp.TensorProduct("2x0e", "2x0e", "2x0e", [(0, 0, 0, "uvu", True), (0, 0, 0, "uuu", True)])
    with pytest.raises(ValueError, match="mixes modes"):
        cueq.polynomial(mixed.problem)
