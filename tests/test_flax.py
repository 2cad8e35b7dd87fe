"""jax_cgtp.flax: init like e3nn-jax, apply equals e3nn-jax, jit/grad, checkpoint round trip."""

import e3nn_jax as e3nn
import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from e3nn_jax import legacy

import jax_cgtp
import jax_cgtp.flax as cgflax


def normal(irreps, seed, leading):
    irreps = e3nn.Irreps(irreps)
    return e3nn.IrrepsArray(irreps, jnp.asarray(np.random.default_rng(seed).normal(size=leading + (irreps.dim,))))


def close(a, b, tol=1e-12):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b)) <= tol * max(float(np.linalg.norm(b)), 1e-300)


def test_fully_connected_parameters_are_named_and_shaped_like_e3nn_haiku():
    tp = cgflax.FullyConnectedTensorProduct("3x0e + 2x1o")
    params = jax.eval_shape(tp.init, jax.random.PRNGKey(0), normal("2x0e + 1o", 0, (4,)), normal("0e + 1o", 1, (4,)))
    shapes = jax.tree_util.tree_map(jnp.shape, params)["params"]
    assert shapes == {
        "w[0,0,0] 2x0e,1x0e,3x0e": (2, 1, 3),
        "w[0,1,1] 2x0e,1x1o,2x1o": (2, 1, 2),
        "w[1,0,1] 1x1o,1x0e,2x1o": (1, 1, 2),
        "w[1,1,0] 1x1o,1x1o,3x0e": (1, 1, 3),
    }


def test_fully_connected_initialisation_is_unit_normal_like_e3nn():
    tp = cgflax.FullyConnectedTensorProduct("32x0e")
    params = jax.jit(tp.init)(jax.random.PRNGKey(0), normal("32x0e", 0, ()), normal("16x0e", 1, ()))
    (w,) = jax.tree_util.tree_leaves(params)
    assert w.dtype == jnp.float32 and w.shape == (32, 16, 32)
    assert abs(float(jnp.std(w)) - 1.0) < 0.05 and abs(float(jnp.mean(w))) < 0.05


def test_fully_connected_equals_e3nn_legacy_with_the_same_weights():
    x, y = normal("2x0e + 3x1o + 1e", 2, (5,)), normal("0e + 1o + 2e", 3, (5,))
    tp = cgflax.FullyConnectedTensorProduct("4x0e + 2x1o + 3x2e + 0o", param_dtype=jnp.float64)
    params = jax.jit(tp.init)(jax.random.PRNGKey(1), x, y)
    out = jax.jit(tp.apply)(params, x, y)
    twin = legacy.FunctionalFullyConnectedTensorProduct(x.irreps, y.irreps, "4x0e + 2x1o + 3x2e + 0o")
    ws = list(params["params"].values())
    expected = jax.jit(jax.vmap(lambda a, b: twin.left_right(ws, a, b)))(x, y)
    assert out.irreps == e3nn.Irreps("4x0e + 2x1o + 3x2e + 0o")
    assert close(out.array, expected.array)
    on_e3nn = cgflax.FullyConnectedTensorProduct("4x0e + 2x1o + 3x2e + 0o", backend="e3nn", param_dtype=jnp.float64)
    assert close(jax.jit(on_e3nn.apply)(params, x, y).array, out.array)


def test_fully_connected_takes_plain_arrays_when_irreps_are_given():
    tp = cgflax.FullyConnectedTensorProduct("2x1o", irreps_in1="2x0e", irreps_in2="1o")
    x, y = jnp.ones((3, 2)), jnp.ones((3, 3))
    params = tp.init(jax.random.PRNGKey(0), x, y)
    expected = tp.apply(params, e3nn.IrrepsArray("2x0e", x), e3nn.IrrepsArray("1o", y))
    assert close(tp.apply(params, x, y).array, expected.array)
    with pytest.raises(TypeError, match="x1: expected an e3nn_jax.IrrepsArray"):
        cgflax.FullyConnectedTensorProduct("2x1o").init(jax.random.PRNGKey(0), x, y)
    with pytest.raises(ValueError, match=r"x2: expected shape \(\.\.\., 3\)"):
        tp.init(jax.random.PRNGKey(0), x, jnp.ones((3, 4)))


def graph():
    """5 nodes, 9 edges of which 2 are padding (index 5, outside the node range)."""
    src = jnp.array([0, 1, 2, 3, 4, 0, 2, 5, 5])
    dst = jnp.array([1, 2, 3, 4, 0, 3, 1, 5, 0])
    vectors = jnp.asarray(np.random.default_rng(4).normal(size=(9, 3)))
    return src, dst, e3nn.spherical_harmonics("0e + 1o + 2e", vectors, normalize=True), jnp.asarray(
        np.random.default_rng(5).uniform(size=(9, 6)))


def test_conv_equals_gather_product_scatter_with_e3nn_and_drops_padding():
    src, dst, sh, embedding = graph()
    x = normal("4x0e + 2x1o", 6, (5,))
    conv = cgflax.TensorProductConv(filter_ir_out="0e + 1o + 2e", radial_hidden=(8,), avg_num_neighbors=2.0)
    params = jax.jit(conv.init)(jax.random.PRNGKey(0), x, sh, embedding, src, dst)
    out = jax.jit(conv.apply)(params, x, sh, embedding, src, dst)

    (mlp_params,) = params["params"].values()  # the default radial network is the only submodule
    weight_numel = mlp_params["Dense_1"]["kernel"].shape[-1]
    mlp = e3nn.flax.MultiLayerPerceptron((8, weight_numel), act=jax.nn.silu, output_activation=False)
    weights = mlp.apply({"params": mlp_params}, embedding)
    tp = jax_cgtp.channelwise_tensor_product(x.irreps, sh.irreps, filter_ir_out="0e + 1o + 2e")
    twin = legacy.FunctionalTensorProduct(tp.irreps_in1, tp.irreps_in2, tp.irreps_out,
                                          [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight) for i in tp.instructions])
    real = slice(0, 7)  # the two padding edges are left out
    messages = jax.jit(jax.vmap(twin.left_right))(weights[real], x[src[real]], sh[real]).array
    expected = np.zeros((5, tp.irreps_out.dim))
    np.add.at(expected, np.asarray(dst[real]), np.asarray(messages) / 2.0)
    assert out.irreps == tp.irreps_out and out.shape == (5, tp.irreps_out.dim)
    assert close(out.array, expected, 1e-6)  # the radial MLP's parameters are float32
    on_e3nn = cgflax.TensorProductConv(filter_ir_out="0e + 1o + 2e", radial_hidden=(8,), avg_num_neighbors=2.0, backend="e3nn")
    assert close(jax.jit(on_e3nn.apply)(params, x, sh, embedding, src, dst).array, out.array, 1e-12)


def test_cueq_backend_runs_the_convolution_only():
    pytest.importorskip("cuequivariance_jax")
    src, dst, sh, embedding = graph()
    x = normal("4x0e + 2x1o", 9, (5,))
    conv = cgflax.TensorProductConv(filter_ir_out="0e + 1o + 2e", radial_hidden=(8,))
    params = jax.jit(conv.init)(jax.random.PRNGKey(0), x, sh, embedding, src, dst)
    on_cueq = cgflax.TensorProductConv(filter_ir_out="0e + 1o + 2e", radial_hidden=(8,), backend="cueq")
    expected = conv.apply(params, x, sh, embedding, src, dst).array
    assert close(jax.jit(on_cueq.apply)(params, x, sh, embedding, src, dst).array, expected, 1e-12)
    with pytest.raises(ValueError, match="deterministic=True: cuEquivariance"):
        cgflax.TensorProductConv(filter_ir_out="0e", backend="cueq", deterministic=True).init(
            jax.random.PRNGKey(0), x, sh, embedding, src, dst)
    with pytest.raises(ValueError, match="backend='cueq' is for TensorProductConv only"):
        cgflax.FullyConnectedTensorProduct("0e", backend="cueq").init(jax.random.PRNGKey(0), x, x)


def test_deterministic_conv_takes_a_graph_sorted_once():
    src, dst, sh, embedding = graph()
    x = normal("4x0e + 2x1o", 8, (5,))
    conv = cgflax.TensorProductConv(filter_ir_out="0e + 1o", radial_hidden=(8,), deterministic=True)
    params = conv.init(jax.random.PRNGKey(1), x, sh, embedding, src, dst)
    sorted_graph = jax_cgtp.sort_graph(src, dst, 5)
    expected = conv.apply(params, x, sh, embedding, src, dst).array
    assert close(jax.jit(conv.apply)(params, x, sh, embedding, graph=sorted_graph).array, expected)
    with pytest.raises(ValueError, match="either them or graph="):
        conv.apply(params, x, sh, embedding, src, dst, graph=sorted_graph)
    with pytest.raises(TypeError, match="graph: expected a jax_cgtp.SortedGraph"):
        conv.apply(params, x, sh, embedding, graph=(src, dst))
    with pytest.raises(ValueError, match="src, dst: both are needed"):
        conv.apply(params, x, sh, embedding, src)


def test_conv_uses_a_user_radial_network_and_checks_its_output():
    src, dst, sh, embedding = graph()
    x = normal("3x0e + 1o", 7, (5,))
    conv = cgflax.TensorProductConv(filter_ir_out="0e + 1o", radial=lambda n: nn.Dense(n, name="radial"))
    params = jax.jit(conv.init)(jax.random.PRNGKey(0), x, sh, embedding, src, dst)
    assert set(params["params"]) == {"radial"}
    assert jax.jit(conv.apply, static_argnames="num_nodes")(params, x, sh, embedding, src, dst, num_nodes=7).shape[0] == 7
    broken = cgflax.TensorProductConv(filter_ir_out="0e + 1o", radial=lambda n: nn.Dense(n + 1))
    with pytest.raises(ValueError, match=r"radial: the network must map \(E, num_basis\) to \(E, "):
        broken.init(jax.random.PRNGKey(0), x, sh, embedding, src, dst)


def test_backend_is_validated():
    with pytest.raises(ValueError, match="backend must be one of"):
        cgflax.FullyConnectedTensorProduct("0e", backend="torch").init(
            jax.random.PRNGKey(0), normal("0e", 0, ()), normal("0e", 1, ()))


class Block(nn.Module):
    """Convolution, then a fully connected product with the node features: a scalar out."""

    backend: str = "auto"

    @nn.compact
    def __call__(self, x, sh, embedding, src, dst):
        h = cgflax.TensorProductConv(filter_ir_out="0e + 1o", radial_hidden=(8,), backend=self.backend)(
            x, sh, embedding, src, dst)
        return jnp.sum(cgflax.FullyConnectedTensorProduct("4x0e", backend=self.backend)(h, x).array ** 2)


def test_modules_jit_and_grad_and_agree_with_e3nn_backend():
    src, dst, sh, embedding = graph()
    x = normal("2x0e + 2x1o", 8, (5,))
    params = jax.jit(Block().init)(jax.random.PRNGKey(0), x, sh, embedding, src, dst)

    def grads(backend):
        return jax.jit(jax.grad(lambda p, x: Block(backend).apply(p, x, sh, embedding, src, dst), argnums=(0, 1)))(
            params, x)

    ours, theirs = grads("auto"), grads("e3nn")
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        assert a.shape == b.shape and bool(jnp.all(jnp.isfinite(a)))
        assert close(a, b, 1e-5)
    assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree_util.tree_leaves(ours[0]))


def test_parameters_survive_an_orbax_checkpoint(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    src, dst, sh, embedding = graph()
    x = normal("2x0e + 2x1o", 9, (5,))
    params = jax.jit(Block().init)(jax.random.PRNGKey(3), x, sh, embedding, src, dst)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "block", params)
    checkpointer.wait_until_finished()
    restored = checkpointer.restore(tmp_path / "block", params)
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(params)
    for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(params)):
        assert a.dtype == b.dtype and bool(jnp.all(a == b))
    apply = jax.jit(Block().apply)
    assert float(apply(restored, x, sh, embedding, src, dst)) == float(apply(params, x, sh, embedding, src, dst))


def test_parameters_survive_flax_serialization():
    src, dst, sh, embedding = graph()
    x = normal("2x0e + 2x1o", 10, (5,))
    init = jax.jit(Block().init)
    params, template = init(jax.random.PRNGKey(4), x, sh, embedding, src, dst), init(jax.random.PRNGKey(5), x, sh, embedding, src, dst)
    restored = flax.serialization.from_bytes(template, flax.serialization.to_bytes(params))
    for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(params)):
        assert bool(jnp.all(a == b))
