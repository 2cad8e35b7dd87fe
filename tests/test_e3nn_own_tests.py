"""e3nn-jax's own tests of ``FunctionalTensorProduct`` and ``tensor_product``, pointed at the drop-in.

Adapted from e3nn-jax's ``e3nn_jax/_src/legacy/core_tensor_product_test.py`` and
``e3nn_jax/_src/tensor_products_test.py`` (the cases and tolerances are theirs). Where
e3nn-jax compares two of its own einsum strategies (``fused``, ``custom_einsum_jvp``,
jitted or not), the drop-in takes the same flags and is compared with e3nn-jax's plain
result, so each case can fail. Only the import differs from e3nn-jax's tests:
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from e3nn_jax import legacy

import e3nn_jax as e3nn
from jax_cgtp.e3nn import FunctionalFullyConnectedTensorProduct, FunctionalTensorProduct, tensor_product


class Draws:
    """Standard normal arrays (numpy's generator, then jnp), one fresh draw per call."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def array(self, shape, std=1.0):
        return jnp.asarray(std * self.rng.normal(size=shape), jnp.float32)

    def irreps(self, irreps, normalization="component", leading=()):
        irreps = e3nn.Irreps(irreps)
        chunks = [np.zeros(leading + (0,))]
        for mul, ir in irreps:
            chunk = self.rng.normal(size=leading + (mul, ir.dim))
            if normalization == "norm":
                chunk /= np.sqrt(ir.dim)
            chunks.append(chunk.reshape(leading + (-1,)))
        return e3nn.IrrepsArray(irreps, jnp.asarray(np.concatenate(chunks, axis=-1), jnp.float32))


def path_weights(tp, draws, scaled=False):
    return [draws.array(ins.path_shape, ins.weight_std if scaled else 1.0) for ins in tp.instructions if ins.has_weight]


def e3nn_twin(tp_args, **kwargs):
    return legacy.FunctionalTensorProduct(*tp_args, **kwargs)


@pytest.mark.parametrize("connection_mode", ["uvw", "uvu", "uvv"])
@pytest.mark.parametrize("irrep_normalization", ["component", "norm"])
def test_modes(irrep_normalization, connection_mode):
    args = (
        "10x0o + 10x1o + 1x2e",
        "10x0o + 10x1o + 1x2o",
        "10x0e + 10x1e + 2x2o",
        [
            (0, 0, 0, connection_mode, True),
            (1, 1, 1, connection_mode, True),
            (1, 0, 1, connection_mode, True),
            (2, 2, 2, "uvw", True),
            (2, 1, 2, "uvw", True),
        ],
    )
    tp = FunctionalTensorProduct(*args, irrep_normalization=irrep_normalization)
    draws = Draws(1)
    ws = path_weights(tp, draws)
    x1, x2 = draws.irreps(tp.irreps_in1), draws.irreps(tp.irreps_in2)
    expected = e3nn_twin(args, irrep_normalization=irrep_normalization).left_right(ws, x1, x2).array
    for custom_einsum_jvp in (False, True):
        for f in (tp.left_right, jax.jit(tp.left_right, static_argnames="custom_einsum_jvp")):
            a = f(ws, x1, x2, custom_einsum_jvp=custom_einsum_jvp).array
            assert jnp.allclose(a, expected, rtol=1e-4, atol=1e-6), jnp.max(jnp.abs(a - expected))


def _assert_fused_and_unfused_match_e3nn(args, seed, flat_weights=None):
    """Both of e3nn's einsum strategies (``fused``) give e3nn's unfused result; weights are a
    list of path arrays, or ``flat_weights(draws)``."""
    tp = FunctionalTensorProduct(*args)
    draws = Draws(seed)
    if flat_weights is None:
        w = [draws.array(ins.path_shape) for ins in tp.instructions]
    else:
        w = flat_weights(draws)
    x, y = draws.irreps(tp.irreps_in1), draws.irreps(tp.irreps_in2)
    expected = e3nn_twin(args).left_right(w, x, y, fused=False).array
    for fused in (True, False):
        assert jnp.allclose(tp.left_right(w, x, y, fused=fused).array, expected, rtol=1e-4, atol=1e-6)


def test_zero_dim():
    args = ("0x0e + 1e", "0e + 0x1e", "0x0e + 1e", [(0, 0, 0, "uvw", True), (1, 1, 0, "uvw", True)])
    _assert_fused_and_unfused_match_e3nn(args, seed=2)


def test_fused():
    args = (
        "10x0e + 5x1e",
        "0e + 1e + 3x1e",
        "10x0e + 5x1e + 30x1e",
        [(0, 0, 0, "uvu", True), (1, 1, 1, "uvu", True), (1, 0, 1, "uvu", True), (0, 2, 2, "uvuv", True)],
    )
    _assert_fused_and_unfused_match_e3nn(args, seed=3)


def test_fused_no_weight():
    args = ("10x0e", "10x0e", "10x0e", [(0, 0, 0, "uuu", False)])
    _assert_fused_and_unfused_match_e3nn(args, seed=4, flat_weights=lambda draws: jnp.ones(0))


def test_fused_mix_weight():
    args = ("5x0e", "5x0e", "5x0e", [(0, 0, 0, "uuu", False), (0, 0, 0, "uvw", True)])
    _assert_fused_and_unfused_match_e3nn(args, seed=5, flat_weights=lambda draws: draws.array((5**3,)))


def test_fuse():
    tp = FunctionalFullyConnectedTensorProduct("2x0e+1e", "0e+1e", "1e+0e")
    draws = Draws(6)
    ws = path_weights(tp, draws)
    wf = jnp.concatenate([w.flatten() for w in ws])
    x1, x2 = draws.irreps(tp.irreps_in1), draws.irreps(tp.irreps_in2)
    a = tp.left_right(ws, x1, x2, fused=False).array
    b = tp.left_right(wf, x1, x2, fused=True).array
    expected = legacy.FunctionalFullyConnectedTensorProduct("2x0e+1e", "0e+1e", "1e+0e").left_right(ws, x1, x2).array
    assert jnp.allclose(a, b, rtol=1e-4, atol=1e-6), (a, b)
    assert jnp.allclose(a, expected, rtol=1e-4, atol=1e-6), (a, expected)


@pytest.mark.parametrize(
    "path_normalization, gradient_normalization", [("element", "path"), ("path", "element"), (0.5, 0.5)]
)
@pytest.mark.parametrize("irrep_normalization", ["component", "norm"])
def test_normalization(irrep_normalization, path_normalization, gradient_normalization):
    tp = FunctionalFullyConnectedTensorProduct(
        "5x0e+1x0e+10x1e",
        "2x0e+2x1e+10x1e",
        "1000x1e+1000x0e",
        irrep_normalization=irrep_normalization,
        path_normalization=path_normalization,
        gradient_normalization=gradient_normalization,
    )
    draws = Draws(7)
    ws = path_weights(tp, draws, scaled=True)
    # e3nn-jax draws one input pair; the second moment of a single draw can be off by more
    # than the tolerance (paths with 2 elements weigh as much as paths with 100), so the
    # moments here are averaged over 32 input pairs as well as over the 1000 channels.
    x1 = draws.irreps(tp.irreps_in1, normalization=irrep_normalization, leading=(32,))
    x2 = draws.irreps(tp.irreps_in2, normalization=irrep_normalization, leading=(32,))

    v, s = tp.left_right(ws, x1, x2).chunks

    assert jnp.exp(jnp.abs(jnp.log(jnp.mean(s**2)))) < 2.0
    if irrep_normalization == "component":
        assert jnp.exp(jnp.abs(jnp.log(jnp.mean(v**2)))) < 2.0
    if irrep_normalization == "norm":
        assert jnp.exp(jnp.abs(jnp.log(jnp.mean(jnp.sum(v**2, axis=-1))))) < 2.0


def test_tensor_product():
    x1 = e3nn.IrrepsArray("1o", jnp.array([1.0, 0.0, 0.0]))
    x2 = e3nn.IrrepsArray("1o", jnp.array([0.0, 1.0, 0.0]))
    x3 = tensor_product(x1, x2, filter_ir_out=("1e",))
    assert x3.irreps == e3nn.Irreps("1e")
    np.testing.assert_allclose(x3.array, jnp.array([0.0, 0.0, 1 / 2**0.5]), rtol=1e-6, atol=1e-7)


def test_tensor_product_with_zeros():
    x1 = e3nn.from_chunks("1o", [None], (), jnp.float32)
    x2 = e3nn.IrrepsArray("1o", jnp.array([0.0, 1.0, 0.0]))
    x3 = tensor_product(x1, x2)
    assert x3.irreps == "0e + 1e + 2e"
    assert x3.zero_flags == (True, True, True)


def test_tensor_product_irreps():
    irreps = tensor_product("1o", "1o", filter_ir_out=("1e",))
    assert irreps == e3nn.Irreps("1e")
