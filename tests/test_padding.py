"""Padding edges and degenerate inputs on the reference path: what a padded batch of a real MLIP
pipeline produces (edges out of the node range whose harmonics and radial weights are NaN or Inf,
batches of no nodes or no edges, host indices past int32, half precisions, Python lists)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from padding_cases import (NODES, assert_half_precision_rounds_once, assert_matches_real_edges,
                           assert_padding_contributes_nothing, make, padded_graph, real_part)

import jax_cgtp


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_padding_edges_with_nan_and_inf_values_contribute_nothing(deterministic, shared):
    assert_padding_contributes_nothing("reference", deterministic, shared, jnp.float64)


def test_padding_edges_contribute_nothing_under_vmap():
    conv = make()
    graphs = [padded_graph(conv, False, key=key) for key in range(3)]
    stacked = [jnp.stack(a) for a in zip(*(g[:5] for g in graphs))]

    def loss(x, y, w, src, dst):
        return jnp.sum(conv(x, y, w, src, dst, NODES) ** 2)

    batched = jax.vmap(jax.grad(loss, argnums=(0, 1, 2)))(*stacked)
    for k, (*args, real) in enumerate(graphs):
        expected = jax.grad(loss, argnums=(0, 1, 2))(*real_part(False, real, *args))
        for padded, real_only, per_edge in zip(batched, expected, (False, True, True)):
            assert_matches_real_edges(padded[k], real_only, real, per_edge, jnp.float64)


@pytest.mark.parametrize("deterministic", [False, True])
def test_batch_of_padding_only(deterministic):
    """No node rows (a batch that is all padding), or edges into no output node: zeros of the right
    shapes, for the forward and the gradients."""
    conv = make(deterministic=deterministic)
    y = jnp.ones((4, conv.irreps_in2.dim))
    w = jnp.ones((4, conv.weight_numel))
    src, dst = jnp.array([0, 1, 2, 3]), jnp.array([0, 0, 1, 1])
    for rows, num_nodes in ((0, 3), (4, 0), (0, 0)):
        x = jnp.ones((rows, conv.irreps_in1.dim))

        def loss(x, y, w):
            return jnp.sum(conv(x, y, w, src, dst, num_nodes) ** 2)

        out = conv(x, y, w, src, dst, num_nodes)
        assert out.shape == (num_nodes, conv.irreps_out.dim) and not out.any()
        for grad, like in zip(jax.grad(loss, argnums=(0, 1, 2))(x, y, w), (x, y, w)):
            assert grad.shape == like.shape and not grad.any()


def test_vmap_over_an_empty_axis():
    conv = make()
    tp = make(jax_cgtp.TensorProduct)
    d1, d2, dw = conv.irreps_in1.dim, conv.irreps_in2.dim, conv.weight_numel
    z = jax.vmap(tp)(jnp.ones((0, 5, d1)), jnp.ones((0, 5, d2)), jnp.ones((0, dw)))
    assert z.shape == (0, 5, conv.irreps_out.dim)
    graph = jnp.array([0, 1]), jnp.array([1, 2])
    nodes = jax.vmap(lambda x: conv(x, jnp.ones((2, d2)), jnp.ones(dw), *graph, 3))(jnp.ones((0, 3, d1)))
    assert nodes.shape == (0, 3, conv.irreps_out.dim)
    gx = jax.vmap(jax.grad(lambda x: jnp.sum(conv(x, jnp.ones((2, d2)), jnp.ones(dw), *graph, 3))))(
        jnp.ones((0, 3, d1)))
    assert gx.shape == (0, 3, d1)


def test_hessian_of_a_zero_size_input():
    conv = make()
    tp = make(jax_cgtp.TensorProduct)
    d1, d2, dw = conv.irreps_in1.dim, conv.irreps_in2.dim, conv.weight_numel
    h = jax.hessian(lambda x: jnp.sum(tp(x, jnp.ones((0, d2)), jnp.ones(dw)) ** 2))(jnp.ones((0, d1)))
    assert h.shape == (0, d1, 0, d1)
    empty = jnp.zeros(0, jnp.int32)
    h = jax.hessian(lambda y: jnp.sum(conv(jnp.ones((3, d1)), y, jnp.ones(dw), empty, empty, 3) ** 2))(
        jnp.ones((0, d2)))
    assert h.shape == (0, d2, 0, d2)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("given", ["arguments", "graph"])
def test_host_int64_indices_past_int32_are_padding_with_x64_off(deterministic, given):
    """With x64 off, JAX converts host int64 indices to int32 by wrapping (``2**32 + 1`` would read
    node 1): such an index is padding instead, as :func:`jax_cgtp.check_graph` reports it."""
    conv = make(deterministic=deterministic)
    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    with jax.enable_x64(False):
        x = jax.random.normal(keys[0], (3, conv.irreps_in1.dim))
        y = jax.random.normal(keys[1], (4, conv.irreps_in2.dim))
        w = jax.random.normal(keys[2], (4, conv.weight_numel))
        src = np.array([0, 2**32 + 1, 2, 2**31], np.int64)
        dst = np.array([1, 1, 2**33, 0], np.int64)
        padding = np.array([0, -1, 2, -1]), np.array([1, 1, -1, 0])
        if given == "graph":
            out = conv(x, y, w, graph=jax_cgtp.sort_graph(src, dst, 3))
        else:
            out = conv(x, y, w, src, dst, 3)
        np.testing.assert_allclose(out, conv(x, y, w, *padding, 3), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"src: 2 edge\(s\) index outside \[0, 3\), first at edge 1 with value 4294967297"):
        jax_cgtp.check_graph(src, dst, 3)


def test_check_graph_needs_one_index_per_edge_in_both():
    with pytest.raises(ValueError, match=r"src, dst: expected 1-D arrays of one index per edge, got shapes \(2,\) and \(1,\)"):
        jax_cgtp.check_graph(np.array([0, 1]), np.array([0]), 3)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precisions_accumulate_in_float32_and_round_once(dtype):
    assert_half_precision_rounds_once("reference", dtype)


def test_python_lists_are_taken_as_arrays():
    conv = jax_cgtp.TensorProductConv("2x0e", "0e", "2x0e", [(0, 0, 0, "uvu", True)])
    tp = jax_cgtp.TensorProduct("2x0e", "0e", "2x0e", [(0, 0, 0, "uvu", True)])
    np.testing.assert_allclose(tp([[1.0, 2.0]], [[3.0]], [1.0, 1.0]), tp(jnp.array([[1.0, 2.0]]), jnp.array([[3.0]]),
                                                                           jnp.ones(2)))
    out = conv([[1.0, 2.0], [3.0, 4.0]], [[1.0], [1.0]], [1.0, 1.0], [0, 1], [1, 5], num_nodes=2)
    np.testing.assert_allclose(out, [[0.0, 0.0], [1.0, 2.0]])
    out = conv([[1.0, 2.0]], np.zeros((0, 1)), [1.0, 1.0], [], [], num_nodes=1)
    assert out.shape == (1, 2) and not out.any()


@pytest.mark.parametrize("name, value", [("x", [[1.0, 2.0], [3.0]]), ("y", {"a": 1}), ("w", "ones")])
def test_inputs_that_are_not_arrays_name_the_argument(name, value):
    tp = jax_cgtp.TensorProduct("2x0e", "0e", "2x0e", [(0, 0, 0, "uvu", True)])
    args = {"x": [[1.0, 2.0]], "y": [[3.0]], "w": [1.0, 1.0]}
    args[name] = value
    with pytest.raises(TypeError, match=rf"{name}: expected"):
        tp(**args)


def test_weights_may_be_left_out_only_where_there_are_none():
    unweighted = jax_cgtp.TensorProductConv("2x0e", "0e", "2x0e", [(0, 0, 0, "uvu", False)])
    out = unweighted([[1.0, 2.0], [3.0, 4.0]], [[2.0], [1.0]], src=[0, 1], dst=[1, 1], num_nodes=2)
    np.testing.assert_allclose(out, [[0.0, 0.0], [5.0, 8.0]])
    weighted = jax_cgtp.TensorProductConv("2x0e", "0e", "2x0e", [(0, 0, 0, "uvu", True)])
    with pytest.raises(ValueError, match=r"w: this tensor product needs 2 weights, got None"):
        weighted([[1.0, 2.0]], [[1.0]], None, [0], [0], 1)
