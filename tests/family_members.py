"""What the kernel tests share: every kind of family call, the comparison with the reference, and
random graphs. Used by the GPU tests and by the host-emulated kernel tests."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import jax_cgtp
from jax_cgtp.core.call import Call, Output, Term

TOLERANCE = {jnp.float64: 1e-12, jnp.float32: 1e-5}
# settings under which the atomic convolution's forward walks destination runs on graphs of any size
# (the library walks them from thousands of nodes), as ``planned_with`` takes them
OWNED_FORWARD_ON_SMALL_GRAPHS = dict(owned_forward_min_nodes=(("float", 0), ("double", 0)))


def relative_error(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "the kernel left unwritten (NaN) or non-finite elements"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def in_float64(args):
    """``args`` with their floating arrays cast to float64 (a reference's inputs), indices as they are."""
    return [a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a for a in args]


def assert_close(actual, expected, dtype):
    for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert a.shape == b.shape
        assert relative_error(a, b) < TOLERANCE[dtype]


def with_settings(call, **settings):
    """``call`` as planned under ``settings`` (fields of :class:`jax_cgtp.Settings`) on top of its own."""
    return dataclasses.replace(call, settings=dataclasses.replace(call.settings, **settings))


def pair(spec, cls=jax_cgtp.TensorProduct, kernels="cuda", **options):
    """The same problem on the kernels' backend (``kernels``) and on the reference."""
    irreps_in1, irreps_in2, irreps_out, instructions, normalization = spec
    return tuple(cls(irreps_in1, irreps_in2, irreps_out, instructions, **normalization, backend=backend, **options)
                 for backend in (kernels, "reference"))


def _same_problem_pair(tp, cls, kernels, options, unweighted=()):
    instructions = [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight and n not in unweighted)
                    for n, i in enumerate(tp.instructions)]
    return tuple(cls(tp.irreps_in1, tp.irreps_in2, tp.irreps_out, instructions, backend=backend, **options)
                 for backend in (kernels, "reference"))


def spherical_harmonics_pair(cls=jax_cgtp.TensorProduct, kernels="cuda", unweighted=(), **options):
    """A MACE-like product (33 channels: two chunks) whose forward and fused backward are joint
    passes, on the kernels' backend and on the reference; the paths ``unweighted`` (instruction
    indices) have no weights."""
    tp = jax_cgtp.channelwise_tensor_product("5x0e+3x1o+33x2e", "0e+1o+2e", filter_ir_out="0e+1o+2e")
    return _same_problem_pair(tp, cls, kernels, options, unweighted)


def whole_chunks_pair(cls=jax_cgtp.TensorProduct, kernels="cuda", **options):
    """A MACE-like product of 64-channel blocks, as in the public configs: every 32-channel chunk
    is whole. On the kernels' backend and on the reference."""
    tp = jax_cgtp.channelwise_tensor_product("64x0e+64x1o", "0e+1o+2e", filter_ir_out="0e+1o+2e")
    return _same_problem_pair(tp, cls, kernels, options)


def uneven_chunks_pair(cls=jax_cgtp.TensorProduct, kernels="cuda", **options):
    """150x0e+40x1o+5x2e over 0e+1o+2e: x blocks of five 32-channel chunks (the last partial), two
    and one, for the warps that split a tile's chunks (``DEFAULTS.chunk_warps``). On the kernels'
    backend and on the reference."""
    instructions = [(0, 1, 0, "uvu", True), (1, 0, 1, "uvu", True), (2, 0, 2, "uvu", True), (2, 2, 3, "uvu", True)]
    return pair(("150x0e+40x1o+5x2e", "0e+1o+2e", "150x1o+40x1o+5x2e+5x0e", instructions, {}), cls, kernels,
                **options)


def narrow_blocks_pair(cls=jax_cgtp.TensorProduct, kernels="cuda", **options):
    """32x0e+20x1o+7x2e over 0e+1o+2e: x blocks of one 32-channel chunk each (whole, partial), whose
    paths the warps of a tile can share (``DEFAULTS.path_warps``). On the kernels' backend and on the
    reference."""
    tp = jax_cgtp.channelwise_tensor_product("32x0e+20x1o+7x2e", "0e+1o+2e", filter_ir_out="0e+1o+2e")
    return _same_problem_pair(tp, cls, kernels, options)


def interleaved_whole_chunks_pair(cls=jax_cgtp.TensorProduct, kernels="cuda", **options):
    """32x0e+32x1o over 0e+1o+2e whose x block 0 has its paths at instructions 0, 1 and 3, so that
    their weights lie at 0, 32 and 96 (unevenly spaced); every chunk is whole. On the kernels'
    backend and on the reference."""
    instructions = [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True), (1, 0, 3, "uvu", True), (0, 2, 2, "uvu", True)]
    return pair(("32x0e+32x1o", "0e+1o+2e", "32x0e+32x1o+32x2e+32x1o", instructions, {}), cls, kernels, **options)


def equal_mul_blocks_pair(cls=jax_cgtp.TensorProduct, kernels="cuda", **options):
    """33x0e+33x1o+5x2e over 0e+1o+2e: two consecutive x blocks of 33 channels (a partial second
    chunk) and one of 5. On the kernels' backend and on the reference."""
    tp = jax_cgtp.channelwise_tensor_product("33x0e+33x1o+5x2e", "0e+1o+2e", filter_ir_out="0e+1o+2e")
    return _same_problem_pair(tp, cls, kernels, options)


def wide_block_pair(cls=jax_cgtp.TensorProduct, kernels="cuda", **options):
    """A product whose x blocks have many paths: 1o and 2e over ``0e+1o+2e+3o``, every output
    (48 and 65 z components per block, more than a float64 walk by destination holds at once).
    33 channels: two chunks. On the kernels' backend and on the reference."""
    tp = jax_cgtp.channelwise_tensor_product("2x0e+33x1o+3x2e", "0e+1o+2e+3o")
    return _same_problem_pair(tp, cls, kernels, options)


def high_l_pair(cls=jax_cgtp.TensorProduct, kernels="cuda", **options):
    """Spherical harmonics up to l = 4 (25 y components) and an x block with 19 weighted paths
    (2e over ``0e+1o+2e+3o+4e``, every output: 125 z components), beyond what a joint pass holds
    in registers at once (its y components, its weights in float64, a forward by destination's z
    chunks). 33 channels: two chunks. On the kernels' backend and on the reference."""
    tp = jax_cgtp.channelwise_tensor_product("2x0e+33x2e", "0e+1o+2e+3o+4e")
    return _same_problem_pair(tp, cls, kernels, options)


def long_code_pair(cls=jax_cgtp.TensorProduct, kernels="cuda", **options):
    """Spherical harmonics up to l = 5 and x blocks of l = 2 to 5, outputs up to l = 5: 4,885 CG
    nonzeros, more code than a joint pass runs edge by edge, so every joint pass walks the tile's
    edges in groups of paths. 33 channels of 3o: two chunks. On the kernels' backend and on the
    reference."""
    tp = jax_cgtp.channelwise_tensor_product("2x2e+33x3o+2x4e+2x5o", "0e+1o+2e+3o+4e+5o",
                                             filter_ir_out=[f"{l}{p}" for l in range(6) for p in "eo"])
    return _same_problem_pair(tp, cls, kernels, options)


def fully_connected_pair(cls=jax_cgtp.TensorProduct, kernels="cuda", **options):
    """A DiffDock-like product (``uvw`` over spherical harmonics) whose forward and backwards with
    per-edge weights are weight streams: 40 x channels make several weight items per path, 35
    z channels two lane chunks over ``w``. On the kernels' backend and on the reference."""
    tp = jax_cgtp.fully_connected_tensor_product("40x0e+3x1o+2x2e", "0e+1o+2e", "35x0e+3x1o+2x1e+2x2e")
    return _same_problem_pair(tp, cls, kernels, options)


def members(tp, x, y, w, g):
    """Every kind of family call: the product, its JVP (three terms), the fused backward, the
    three single-operand gradients, and the force-training second derivative."""
    z, vjp = jax.vjp(tp, x, y, w)
    jvp = jax.jvp(tp, (x, y, w), (0.5 * x, 2.0 * y, -w))[1]
    grad_x = jax.grad(lambda a: jnp.sum(tp(a, y, w) * g))(x)
    grad_y = jax.grad(lambda a: jnp.sum(tp(x, a, w) * g))(y)
    grad_w = jax.grad(lambda a: jnp.sum(tp(x, y, a) * g))(w)

    def force_loss(w, x):
        forces = jax.grad(lambda y: jnp.sum(tp(x, y, w) * g))(y)
        return jnp.sum(forces ** 2)

    return z, jvp, vjp(g), (grad_x, grad_y, grad_w), jax.grad(force_loss, argnums=(0, 1))(w, x)


def squared_norm_and_gradients(tp, x, y, w):
    """``sum(T(x, y, w)^2)`` and its gradients w.r.t. ``x, y, w``: a forward and a fused backward."""
    return jax.value_and_grad(lambda *a: jnp.sum(tp(*a) ** 2), argnums=(0, 1, 2))(x, y, w)


def random_graph(key, conv, num_nodes, num_edges, dtype, bad_fraction=0.0, shared=False, sorted_by_dst=False,
                 edit=None):
    """Inputs of ``conv``; the last 3 nodes receive no edge, ``bad_fraction`` of the edges are out
    of range; ``sorted_by_dst`` orders the edges by destination (long runs of one node); ``edit``
    maps ``(src, dst)`` to the graph's final indices (hubs, padding nodes). The edges left out of
    range at the end are padding: their ``y`` rows (and per-edge ``w`` rows) are NaN and Inf."""
    keys = jax.random.split(key, 6)
    x = jax.random.normal(keys[0], (num_nodes, conv.irreps_in1.dim), dtype)
    y = jax.random.normal(keys[1], (num_edges, conv.irreps_in2.dim), dtype)
    w = jax.random.normal(keys[2], (conv.weight_numel,) if shared else (num_edges, conv.weight_numel), dtype)
    src = jax.random.randint(keys[3], (num_edges,), 0, num_nodes)
    dst = jax.random.randint(keys[4], (num_edges,), 0, max(num_nodes - 3, 1))  # the last nodes stay isolated
    bad = jax.random.uniform(keys[5], (num_edges,)) < bad_fraction
    src = jnp.where(bad & (jnp.arange(num_edges) % 2 == 0), -1, src)
    dst = jnp.where(bad & (jnp.arange(num_edges) % 2 == 1), num_nodes + 5, dst)
    if sorted_by_dst:
        order = jnp.argsort(dst)
        y, src, dst = y[order], src[order], dst[order]
        w = w if shared else w[order]
    if edit is not None:
        src, dst = edit(src, dst)
    padding = (src < 0) | (src >= num_nodes) | (dst < 0) | (dst >= num_nodes)
    y, w = padding_values(padding, y, w)
    return x, y, w, src, dst


def padding_values(bad, y, w):
    """``y`` and per-edge ``w`` with the rows of the ``bad`` (padding) edges NaN and Inf, as a padded
    batch's zero-length edge vectors make them: their values must never reach a result."""
    y = jnp.where(bad[:, None], jnp.nan, y)
    if w.ndim == 2:
        w = jnp.where(bad[:, None], jnp.inf, w)
    return y, w


def grouping_index(edges: int, rows: int, order: str, dtype):
    """Indices of ``edges`` edges over ``rows`` nodes, some out of range: in no order (``random``),
    ``sorted``, or sorted but for two edges far apart swapped (``one_swap``)."""
    index = jax.random.randint(jax.random.PRNGKey(edges + rows), (edges,), -3, rows + 4)
    if order != "random":
        index = jnp.sort(index)
    if order == "one_swap":
        index = index.at[jnp.array([5, edges - 5])].set(index[jnp.array([edges - 5, 5])])
    return index.astype(dtype)


def conv_members(conv, num_nodes, x, y, w, src, dst):
    """The convolution, its fused backward, and the force-training second derivative.

    The energy is quadratic in the convolution and the cotangent is fixed: a saturating function
    such as ``tanh`` would amplify the float32 rounding of the forward (``1 - tanh(z)^2``
    cancels for large ``z``) beyond the tolerance the kernels are tested to."""
    out, vjp = jax.vjp(lambda *a: conv(*a, src, dst, num_nodes), x, y, w)
    g = jax.random.normal(jax.random.PRNGKey(0), out.shape, jnp.float32).astype(out.dtype)

    def force_loss(w, x):
        forces = jax.grad(lambda y: 0.5 * jnp.sum(conv(x, y, w, src, dst, num_nodes) ** 2))(y)
        return jnp.sum(forces ** 2)

    return out, vjp(g), jax.grad(force_loss, argnums=(0, 1))(w, x)


def second_derivatives(product, x, y, w):
    """The gradients w.r.t. ``x, y, w`` of the squared gradients of the quadratic energy
    ``|product(x, y, w)|^2 / 2``: the force loss of a model whose ``x``, ``y`` and ``w`` all depend
    on the positions. Its second-derivative call produces x̄, ȳ, w̄ and z, each a sum of terms
    over both versions (value and tangent) of x, y and w."""
    def energy(x, y, w):
        return 0.5 * jnp.sum(product(x, y, w) ** 2)

    def loss(x, y, w):
        return sum(jnp.sum(g ** 2) for g in jax.grad(energy, argnums=(0, 1, 2))(x, y, w))

    return jax.grad(loss, argnums=(0, 1, 2))(x, y, w)


def with_sorted_graph(conv):
    """``conv`` called with ``graph=sort_graph(src, dst, num_nodes)`` in place of the index arrays."""
    return lambda x, y, w, src, dst, num_nodes: conv(x, y, w, graph=jax_cgtp.sort_graph(src, dst, num_nodes))


def conv_second_derivatives(conv, num_nodes, x, y, w, src, dst):
    """:func:`second_derivatives` of the convolution on the graph ``src, dst``."""
    return second_derivatives(lambda *a: conv(*a, src, dst, num_nodes), x, y, w)


def backward_call(problem, kinds, rows=(None,) * 4, deterministic=False, weighted_only=False):
    """The fused backward's call: x̄, ȳ and w̄ from inputs ``x, y, w, z̄``."""
    outputs = (Output("x", (Term((1, 2, 3)),)), Output("y", (Term((0, 2, 3)),)),
               Output("w", (Term((0, 1, 3), weighted_only),)))
    return Call(problem, kinds, rows, ("x", "y", "w", "z"), outputs, deterministic)
