"""The graph convolution on the reference path: against e3nn-jax gather + product + segment_sum."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from family_members import OWNED_FORWARD_ON_SMALL_GRAPHS, spherical_harmonics_pair
from random_problems import e3nn_tensor_product, random_problem

import jax_cgtp
from jax_cgtp.sharding import partitioning
from jax_cgtp.gpu.cuda_lowering import planned_kernels
from jax_cgtp.core.problem import MODES


def make_conv(seed, mode=None, lmax=3):
    spec = random_problem(seed, mode=mode, lmax=lmax)
    irreps_in1, irreps_in2, irreps_out, instructions, normalization = spec
    return spec, jax_cgtp.TensorProductConv(irreps_in1, irreps_in2, irreps_out, instructions, **normalization)


def random_graph(key, conv, num_nodes, num_edges, shared, index_dtype=jnp.int32):
    keys = jax.random.split(key, 5)
    x = jax.random.normal(keys[0], (num_nodes, conv.irreps_in1.dim))
    y = jax.random.normal(keys[1], (num_edges, conv.irreps_in2.dim))
    w_shape = (conv.weight_numel,) if shared else (num_edges, conv.weight_numel)
    w = jax.random.normal(keys[2], w_shape)
    src = jax.random.randint(keys[3], (num_edges,), 0, num_nodes).astype(index_dtype)
    dst = jax.random.randint(keys[4], (num_edges,), 0, num_nodes).astype(index_dtype)
    return x, y, w, src, dst


def e3nn_conv(spec, x, y, w, src, dst, num_nodes):
    valid = (src >= 0) & (src < x.shape[0]) & (dst >= 0) & (dst < num_nodes)
    messages = e3nn_tensor_product(spec)(x[jnp.clip(src, 0, x.shape[0] - 1)], y, w)
    messages = jnp.where(valid[:, None], messages, 0.0)
    return jax.ops.segment_sum(messages, jnp.where(valid, dst, 0), num_segments=num_nodes)


@pytest.mark.parametrize("seed", range(10))
def test_matches_e3nn_gather_product_segment_sum(seed):
    spec, conv = make_conv(seed)
    index_dtype = jnp.int64 if seed % 2 else jnp.int32
    args = random_graph(jax.random.PRNGKey(seed), conv, 11, 40, seed % 3 == 0, index_dtype)
    expected = e3nn_conv(spec, *args, 11)
    actual = jax.jit(conv, static_argnums=5)(*args, 11)
    np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_gradients_match_e3nn(mode):
    spec, conv = make_conv(300 + MODES.index(mode), mode=mode, lmax=2)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(1), conv, 6, 20, False)
    g = jax.random.normal(jax.random.PRNGKey(2), (6, conv.irreps_out.dim))

    def loss(f, x, y, w):
        return jnp.sum(f(x, y, w, src, dst, 6) * g)

    ours = jax.grad(lambda *a: loss(conv, *a), argnums=(0, 1, 2))(x, y, w)
    theirs = jax.grad(lambda *a: loss(lambda *b: e3nn_conv(spec, *b), *a), argnums=(0, 1, 2))(x, y, w)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("shared", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_check_grads_orders_1_and_2(shared):
    _, conv = make_conv(7, mode="uvu", lmax=2)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(3), conv, 5, 12, shared)
    check_grads(lambda x, y, w: conv(x, y, w, src, dst, 5), (x, y, w), order=2, modes=("fwd", "rev"))


def test_force_training_second_derivative_matches_e3nn():
    spec, conv = make_conv(8, mode="uvu", lmax=2)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(4), conv, 5, 15, False)

    def force_loss(f, w, x):
        forces = jax.grad(lambda y: jnp.sum(jnp.tanh(f(x, y, w, src, dst, 5))))(y)
        return jnp.sum(forces**2)

    ours = jax.grad(lambda w, x: force_loss(conv, w, x), argnums=(0, 1))(w, x)
    theirs = jax.grad(lambda w, x: force_loss(lambda *b: e3nn_conv(spec, *b), w, x), argnums=(0, 1))(w, x)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def _flushes(fun, *args):
    return [[(o.role, o.flush) for o in k.outputs] for k in planned_kernels(fun, *args)]


def test_planned_kernels_are_found_inside_shard_map_with_each_devices_shapes():
    """A data-parallel step (``jax.shard_map`` over two devices, each its own graph of 40 edges):
    ``planned_kernels``, and so ``precompile``, finds the calls inside, planned for the 40 edges
    each device holds, as jit lowers them (an abstract mesh: no devices needed)."""
    from jax.sharding import AbstractMesh, AxisType, PartitionSpec

    conv, _ = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto")
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(5), conv, 6, 80, False)
    stacked = [a.reshape((2, -1) + a.shape[1:]) for a in (y, w, src, dst)]
    mesh = AbstractMesh((2,), ("data",), axis_types=(AxisType.Auto,))

    def local(x, y, w, src, dst):
        return jax.grad(lambda y: jnp.sum(conv(x, y[0], w[0], src[0], dst[0], 6) ** 2))(y)

    step = jax.shard_map(local, mesh=mesh, in_specs=(PartitionSpec(),) + (PartitionSpec("data"),) * 4,
                         out_specs=PartitionSpec("data"))
    inside = planned_kernels(step, x, *stacked)
    alone = planned_kernels(lambda *a: local(x, *(b[:1] for b in a)), *stacked)
    assert inside and inside == alone


def test_planned_kernels_of_calls_that_jit_splits_across_devices_are_each_devices(planned_with):
    """Under ``jax.jit`` over a graph's edges sharded across two devices (a mesh axis of type Auto),
    each call runs on each device's edges (:mod:`jax_cgtp.sharding.partitioning`): ``planned_kernels``, and
    so ``precompile``, plans those 40 edges, not the graph's 80. Here the deterministic backward
    walks in slices of 40 edges: the graph's in two (a later slice's variant of the walk too), each
    device's in one. Over three devices, which do not divide the edges, and with
    ``JAX_CGTP_PARTITIONING=0``, every device runs the whole call."""
    from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

    conv, _ = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto", deterministic=True)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(6), conv, 6, 80, False)
    planned_with(deterministic_backward_slice_bytes=40 * conv.irreps_in1.dim * x.dtype.itemsize)

    def step(x, y, w, src, dst):
        return jax.grad(lambda x: jnp.sum(conv(x, y, w, src, dst, 6) ** 2))(x)

    def placed_on(devices):
        mesh = AbstractMesh((devices,), ("edges",), axis_types=(AxisType.Auto,))
        return [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, PartitionSpec(*spec)))
                for a, spec in zip((x, y, w, src, dst), ((), ("edges",), ("edges",), ("edges",), ("edges",)))]

    placed = placed_on(2)
    halves = [x] + [a[:40] for a in (y, w, src, dst)]
    split, whole, alone = (planned_kernels(step, *args) for args in (placed, (x, y, w, src, dst), halves))
    assert split == alone and split != whole
    assert planned_kernels(step, *placed_on(3)) == whole  # 3 parts do not divide 80 edges: the call runs whole
    assert any(k.slice_walk for k in whole) and len(whole) > len(alone)
    with partitioning.switched(False):
        assert planned_kernels(step, *placed) == whole


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_sorted_graph_gives_the_atomic_variant_its_faster_forward(dtype, planned_with):
    """With ``graph=``, the atomic variant computes the forward of a MACE-like product (joint
    passes, short code) by the walk over destination runs (here on a small graph too), as it does
    the tangent along one operand (the forward of that tangent), and every other derivative by the
    atomic family: values and derivatives of every order are those of the call without a graph."""
    planned_with(**OWNED_FORWARD_ON_SMALL_GRAPHS)
    conv, _ = spherical_harmonics_pair(jax_cgtp.TensorProductConv, kernels="auto")
    x, y, w, src, dst = (a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a
                         for a in random_graph(jax.random.PRNGKey(13), conv, 6, 20, False))
    graph = jax_cgtp.sort_graph(src, dst, 6)
    by_graph = lambda x, y, w: conv(x, y, w, graph=graph)
    by_index = lambda x, y, w: conv(x, y, w, src, dst, 6)
    energy = lambda f: lambda x, y, w: jnp.sum(f(x, y, w) ** 2)
    tolerance = dict(rtol=1e-12, atol=1e-12) if dtype == jnp.float64 else dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(by_graph(x, y, w), by_index(x, y, w), **tolerance)
    for a, b in zip(jax.grad(energy(by_graph), argnums=(0, 1, 2))(x, y, w),
                    jax.grad(energy(by_index), argnums=(0, 1, 2))(x, y, w)):
        np.testing.assert_allclose(a, b, **tolerance)
    if dtype == jnp.float64:
        check_grads(by_graph, (x, y, w), order=2, modes=("fwd", "rev"))
        hessians = [jax.jit(jax.hessian(energy(f)))(x, y, w) for f in (by_graph, by_index)]
        np.testing.assert_allclose(*hessians, **tolerance)
    walk = [[("z", "own")], [("z", "atomic")]]  # each run's first edges, then the rest of the longer ones
    assert _flushes(by_graph, x, y, w) == walk
    assert _flushes(jax.grad(energy(by_graph), argnums=(0, 1, 2)), x, y, w) == [
        *walk, [("x", "atomic"), ("y", "store"), ("w", "store")]]
    # the tangent along x alone is the forward of the tangent: the same walk
    assert _flushes(lambda t: jax.jvp(lambda x: by_graph(x, y, w), (x,), (t,)), x) == [*walk, *walk]
    both = lambda t, s: jax.jvp(lambda x, y: by_graph(x, y, w), (x, y), (t, s))
    assert _flushes(both, x, y) == [*walk, [("z", "atomic")]]  # a tangent of two terms: atomic


def test_sorted_graph_keeps_the_atomic_forward_where_it_is_faster():
    """A product without joint passes (here ``uvw``) keeps the atomic forward with ``graph=``."""
    _, conv = make_conv(14, mode="uvw", lmax=2)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(14), conv, 6, 20, False)
    graph = jax_cgtp.sort_graph(src, dst, 6)
    assert _flushes(lambda x: conv(x, y, w, graph=graph), x) == [[("z", "atomic")]]
    np.testing.assert_allclose(conv(x, y, w, graph=graph), conv(x, y, w, src, dst, 6), rtol=1e-13, atol=1e-13)


def test_vmap_over_graphs_matches_loop():
    _, conv = make_conv(9, mode="uvw", lmax=2)
    graphs = [random_graph(jax.random.PRNGKey(i), conv, 4, 9, False) for i in range(3)]
    stacked = [jnp.stack(parts) for parts in zip(*graphs)]
    batched = jax.vmap(lambda *a: conv(*a, 4))(*stacked)
    for i, graph in enumerate(graphs):
        np.testing.assert_allclose(batched[i], conv(*graph, 4), rtol=1e-13, atol=1e-13)


def test_vmap_of_gradient_with_shared_weights_matches_loop():
    _, conv = make_conv(10, mode="uvu", lmax=2)
    x, y, _, src, dst = random_graph(jax.random.PRNGKey(5), conv, 4, 9, True)
    ws = jax.random.normal(jax.random.PRNGKey(6), (3, conv.weight_numel))

    def loss(w):
        return jnp.sum(conv(x, y, w, src, dst, 4) ** 2)

    np.testing.assert_allclose(jax.vmap(jax.grad(loss))(ws), [jax.grad(loss)(w) for w in ws], rtol=1e-12)


def test_out_of_range_edges_contribute_nothing():
    _, conv = make_conv(11, mode="uvu", lmax=2)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(7), conv, 6, 10, False)
    bad_src = src.at[0].set(-1).at[1].set(6).at[2].set(1 << 30)
    bad_dst = dst.at[3].set(-3).at[4].set(6)
    keep = jnp.arange(10) >= 5
    expected = conv(x, y[keep], w[keep], src[keep], dst[keep], 6)
    np.testing.assert_allclose(conv(x, y, w, bad_src.at[3:5].set(src[3:5]), bad_dst, 6), expected, rtol=1e-13)
    grads = jax.grad(lambda y: jnp.sum(conv(x, y, w, bad_src, bad_dst, 6) ** 2))(y)
    np.testing.assert_array_equal(grads[:5], 0.0)


def test_zero_edges_and_isolated_nodes():
    _, conv = make_conv(12, mode="uvu", lmax=2)
    x, y, w, src, dst = random_graph(jax.random.PRNGKey(8), conv, 5, 0, False)
    out = conv(x, y, w, src, dst, 5)
    assert out.shape == (5, conv.irreps_out.dim) and not out.any()
    gx = jax.grad(lambda x: jnp.sum(conv(x, y, w, src, dst, 5)))(x)
    assert gx.shape == x.shape and not gx.any()
    x, y, w, _, _ = random_graph(jax.random.PRNGKey(9), conv, 5, 4, False)
    out = conv(x, y, w, jnp.array([0, 1, 0, 1]), jnp.array([2, 2, 3, 3]), 5)
    assert not out[jnp.array([0, 1, 4])].any() and out[2:4].any()


def test_check_graph_reports_the_first_bad_edge():
    jax_cgtp.check_graph(np.array([0, 1]), np.array([1, 0]), 2)
    with pytest.raises(ValueError, match=r"dst: 2 edge\(s\) index outside \[0, 3\), first at edge 1 with value 3"):
        jax_cgtp.check_graph(np.array([0, 1, 2]), np.array([0, 3, -1]), 3)
    with pytest.raises(ValueError, match=r"src: 1 edge\(s\) index outside \[0, 2\)"):
        jax_cgtp.check_graph(np.array([0, 2]), np.array([0, 0]), 3, num_src_nodes=2)


@pytest.mark.parametrize(
    "change,error,message",
    [
        ({"src": np.zeros(4, np.float32)}, TypeError, r"src: expected an int32 or int64 array, got dtype float32"),
        ({"dst": np.zeros(3, np.int32)}, ValueError, r"dst: expected shape \(4,\), one index per edge of src, got \(3,\)"),
        ({"src": np.zeros((2, 2), np.int32)}, ValueError, r"src: expected a 1-D array, one index per edge, got shape"),
        ({"num_nodes": -1}, TypeError, r"num_nodes: expected a static non-negative int, got -1"),
        ({"num_src_nodes": 2.0}, TypeError, r"num_src_nodes: expected a static non-negative int, got 2.0"),
    ],
)
def test_bad_sort_graph_arguments(change, error, message):
    args = {"src": np.zeros(4, np.int32), "dst": np.zeros(4, np.int32), "num_nodes": 3, "num_src_nodes": None}
    args.update(change)
    with pytest.raises(error, match=message):
        jax_cgtp.sort_graph(**args)


def test_check_graph_names_a_bad_node_count():
    with pytest.raises(TypeError, match=r"num_src_nodes: expected a static non-negative int, got -2"):
        jax_cgtp.check_graph(np.array([0, 1]), np.array([1, 0]), 2, num_src_nodes=-2)


@pytest.mark.parametrize(
    "change,error,message",
    [
        ({"src": np.zeros(4, np.float32)}, TypeError, r"src: expected an int32 or int64 array, got dtype float32"),
        ({"dst": np.zeros(3, np.int32)}, ValueError, r"dst: expected shape \(4,\), one index per edge"),
        ({"num_nodes": 2.5}, TypeError, r"num_nodes: expected a static non-negative int, got 2.5"),
        ({"w": np.zeros((3, 2))}, ValueError, r"w: expected shape \(2,\) or \(4, 2\), got \(3, 2\)"),
        ({"x": np.zeros((3, 2), np.int32)}, TypeError, r"x_nodes: expected a floating-point array"),
    ],
)
def test_bad_conv_arguments(change, error, message):
    conv = jax_cgtp.TensorProductConv("2x0e", "0e", "2x0e", [(0, 0, 0, "uvu", True)])
    args = {"x": np.ones((3, 2)), "y": np.ones((4, 1)), "w": np.ones(2),
            "src": np.zeros(4, np.int32), "dst": np.zeros(4, np.int32), "num_nodes": 3}
    args.update(change)
    with pytest.raises(error, match=message):
        conv(args["x"], args["y"], args["w"], args["src"], args["dst"], args["num_nodes"])
