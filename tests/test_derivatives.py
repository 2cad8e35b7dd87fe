"""Derivatives of every order, vmap, and the closure of the primitive family."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from random_problems import e3nn_tensor_product, random_inputs, random_problem

import jax_cgtp
from jax_cgtp.core.primitives import cgtp_p
from jax_cgtp.core.problem import MODES


def build(spec):
    irreps_in1, irreps_in2, irreps_out, instructions, normalization = spec
    return jax_cgtp.TensorProduct(irreps_in1, irreps_in2, irreps_out, instructions, **normalization)


def small_problem(mode):
    spec = random_problem(200 + MODES.index(mode), mode=mode, lmax=2)
    return spec, build(spec)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("operand", [0, 1, 2])
@pytest.mark.parametrize("shared", [True, False])
def test_check_grads_orders_1_and_2_each_operand(mode, operand, shared):
    spec, tp = small_problem(mode)
    args = list(random_inputs(jax.random.PRNGKey(operand), spec, (3,), tp.weight_numel, jnp.float64, shared))

    def of_one(a):
        full = list(args)
        full[operand] = a
        return tp(*full)

    check_grads(of_one, (args[operand],), order=2, modes=("fwd", "rev"), atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("mode", ["uvw", "uvu", "uuw"])
def test_hessian_matches_e3nn(mode):
    spec, tp = small_problem(mode)
    x, y, w = random_inputs(jax.random.PRNGKey(5), spec, (2,), tp.weight_numel, jnp.float64)
    g = jax.random.normal(jax.random.PRNGKey(6), (2, tp.irreps_out.dim), jnp.float64)
    theirs = e3nn_tensor_product(spec)

    def loss(f, x, y, w):
        return jnp.sum(jnp.sin(f(x, y, w)) * g)

    for argnums in (0, 1, 2, (0, 2)):
        ours = jax.jit(jax.hessian(functools.partial(loss, tp), argnums))(x, y, w)
        expected = jax.jit(jax.hessian(functools.partial(loss, theirs), argnums))(x, y, w)
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(expected)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shared", [True, False])
def test_vmap_matches_python_loop(shared):
    spec, tp = small_problem("uvu")
    x, y, w = random_inputs(jax.random.PRNGKey(8), spec, (4, 3), tp.weight_numel, jnp.float64, shared)
    w_axis = None if shared else 0
    batched = jax.vmap(tp, in_axes=(0, 0, w_axis))(x, y, w)
    looped = jnp.stack([tp(x[i], y[i], w if shared else w[i]) for i in range(4)])
    np.testing.assert_allclose(batched, looped, rtol=1e-13, atol=1e-13)


def test_vmap_over_shared_weights_and_its_gradient():
    spec, tp = small_problem("uvw")
    x, y, _ = random_inputs(jax.random.PRNGKey(9), spec, (5,), tp.weight_numel, jnp.float64)
    ws = jax.random.normal(jax.random.PRNGKey(10), (3, tp.weight_numel), jnp.float64)

    def loss(w):
        return jnp.sum(tp(x, y, w) ** 2)

    np.testing.assert_allclose(jax.vmap(loss)(ws), [loss(w) for w in ws], rtol=1e-13)
    np.testing.assert_allclose(jax.vmap(jax.grad(loss))(ws), [jax.grad(loss)(w) for w in ws], rtol=1e-12)


def test_nested_vmap_of_grad_matches_loop():
    spec, tp = small_problem("uvv")
    x, y, w = random_inputs(jax.random.PRNGKey(11), spec, (2, 3, 4), tp.weight_numel, jnp.float64, False)

    def loss(x, y, w):
        return jnp.sum(tp(x, y, w) ** 2)

    grad = jax.grad(loss, argnums=(0, 1, 2))
    nested = jax.vmap(jax.vmap(grad))(x, y, w)
    for i in range(2):
        for j in range(3):
            for got, want in zip(nested, grad(x[i, j], y[i, j], w[i, j])):
                np.testing.assert_allclose(got[i, j], want, rtol=1e-12, atol=1e-13)


def test_jvp_linearize_vjp_agree():
    spec, tp = small_problem("uuu")
    primals = random_inputs(jax.random.PRNGKey(12), spec, (4,), tp.weight_numel, jnp.float64)
    tangents = random_inputs(jax.random.PRNGKey(13), spec, (4,), tp.weight_numel, jnp.float64)
    _, jvp_out = jax.jvp(tp, primals, tangents)
    _, linear = jax.linearize(tp, *primals)
    np.testing.assert_allclose(linear(*tangents), jvp_out, rtol=1e-13, atol=1e-13)
    cotangent = jax.random.normal(jax.random.PRNGKey(14), jvp_out.shape, jnp.float64)
    _, vjp = jax.vjp(tp, *primals)
    lhs = jnp.vdot(cotangent, jvp_out)
    rhs = sum(jnp.vdot(a, b) for a, b in zip(vjp(cotangent), tangents))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-12)


CONTRACTIONS = {"dot_general", "mul", "conv_general_dilated"}  # what the reference contracts with


def _primitive_names(jaxpr):
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        for param in eqn.params.values():
            if hasattr(param, "jaxpr"):
                names += _primitive_names(getattr(param, "jaxpr"))
    return names


def test_second_derivative_is_expressed_with_family_calls_only():
    spec, tp = small_problem("uvw")
    x, y, w = random_inputs(jax.random.PRNGKey(15), spec, (6,), tp.weight_numel, jnp.float64)

    def energy(y):  # a linear readout keeps the outer function free of contractions
        return jnp.sum(tp(x, y, w))

    def force_loss(w, x):
        forces = jax.grad(lambda y: jnp.sum(tp(x, y, w)))(y)
        return jnp.sum(forces)

    jaxpr = jax.make_jaxpr(jax.grad(force_loss, argnums=(0, 1)))(w, x).jaxpr
    names = _primitive_names(jaxpr)
    assert names.count("cgtp") >= 2
    assert not CONTRACTIONS & set(names), names
    hessian_names = _primitive_names(jax.make_jaxpr(jax.hessian(energy))(y).jaxpr)
    assert "cgtp" in hessian_names and not {"dot_general", "einsum"} & set(hessian_names)


def _family_calls(jaxpr):
    return [e for e in jaxpr.eqns if e.primitive is cgtp_p]


def test_gradient_of_shared_weights_is_one_reducing_family_call():
    spec, tp = small_problem("uvu")
    x, y, w = random_inputs(jax.random.PRNGKey(16), spec, (7,), tp.weight_numel, jnp.float64)
    jaxpr = jax.make_jaxpr(jax.grad(lambda w: jnp.sum(tp(x, y, w))))(w).jaxpr
    members = [e for e in _family_calls(jaxpr) if [o.role for o in e.params["call"].outputs] == ["w"]]
    assert len(members) == 1 and members[0].outvars[0].aval.shape == (tp.weight_numel,)


def test_backward_of_all_operands_is_one_fused_call():
    spec, tp = small_problem("uvw")
    x, y, w = random_inputs(jax.random.PRNGKey(17), spec, (5,), tp.weight_numel, jnp.float64, False)
    jaxpr = jax.make_jaxpr(jax.grad(lambda *a: jnp.sum(tp(*a) ** 2), argnums=(0, 1, 2)))(x, y, w).jaxpr
    calls = _family_calls(jaxpr)
    assert len(calls) == 2  # the forward and one fused backward
    backward = calls[1].params["call"]
    assert [o.role for o in backward.outputs] == ["x", "y", "w"]
    assert all(len(o.terms) == 1 for o in backward.outputs)
