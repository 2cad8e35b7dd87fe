"""Padding edges and half precisions, checked the same way on every backend: the reference (CPU),
the kernels under host emulation and the kernels on a GPU.

A padded batch (jraph's ``pad_with_graphs`` and the like) has edges whose ``src`` or ``dst`` lies
outside the node range; their edge vectors have length 0, so their harmonics and radial weights
are NaN or Inf. Such an edge must contribute exactly nothing to any result or derivative, and its
own rows of ȳ and w̄ must be exact zeros.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from family_members import TOLERANCE, relative_error
from random_problems import random_problem

import jax_cgtp

NODES, EDGES = 6, 14
# edge -> (src, dst) replacing the random endpoints: each way an index leaves the node range
PADDING = {0: (-1, None), 3: (NODES, None), 5: (None, -1), 8: (None, NODES), 9: (1 << 30, None), 12: (-1, NODES + 7)}


def make(cls=jax_cgtp.TensorProductConv, seed=11, **options):
    """A MACE-like ``uvu`` problem (l up to 2) as ``cls``."""
    irreps_in1, irreps_in2, irreps_out, instructions, normalization = random_problem(seed, mode="uvu", lmax=2)
    return cls(irreps_in1, irreps_in2, irreps_out, instructions, **normalization, **options)


def padded_graph(conv, shared, dtype=jnp.float64, key=0):
    """``(x, y, w, src, dst, real)``: a graph whose edges of :data:`PADDING` point out of range, with
    NaN ``y`` rows and Inf (one -Inf) per-edge ``w`` rows; ``real`` masks the other edges."""
    keys = jax.random.split(jax.random.PRNGKey(key), 5)
    x = jax.random.normal(keys[0], (NODES, conv.irreps_in1.dim), dtype)
    y = jax.random.normal(keys[1], (EDGES, conv.irreps_in2.dim), dtype)
    w = jax.random.normal(keys[2], (conv.weight_numel,) if shared else (EDGES, conv.weight_numel), dtype)
    src = np.array(jax.random.randint(keys[3], (EDGES,), 0, NODES))
    dst = np.array(jax.random.randint(keys[4], (EDGES,), 0, NODES))
    for edge, (s, d) in PADDING.items():
        src[edge] = src[edge] if s is None else s
        dst[edge] = dst[edge] if d is None else d
    real = np.ones(EDGES, bool)
    real[list(PADDING)] = False
    y = jnp.where(real[:, None], y, jnp.nan)
    if not shared:
        w = jnp.where(real[:, None], w, jnp.inf).at[5].set(-jnp.inf)
    return x, y, w, jnp.asarray(src), jnp.asarray(dst), real


def real_part(shared, real, x, y, w, src, dst):
    """The same graph without its padding edges."""
    return x, y[real], w if shared else w[real], src[real], dst[real]


def _force_loss(conv, x, y, w, src, dst):
    """The squared gradient w.r.t. ``y`` of an energy quadratic in the convolution: its gradients are
    second derivatives of the convolution."""
    forces = jax.grad(lambda y: 0.5 * jnp.sum(conv(x, y, w, src, dst, NODES) ** 2))(y)
    return jnp.sum(forces ** 2)


def assert_matches_real_edges(padded, real_only, real, per_edge, dtype):
    """``padded`` matches ``real_only`` (float64, the reference on the real edges alone); a per-edge
    result is exactly zero on the padding edges."""
    padded = np.asarray(padded)
    if per_edge:
        np.testing.assert_array_equal(padded[~real], 0.0)
        padded = padded[real]
    assert padded.shape == real_only.shape
    assert relative_error(padded, real_only) < TOLERANCE[dtype]


def assert_padding_contributes_nothing(backend, deterministic, shared, dtype):
    """Forward, gradients, the force loss's second derivatives and a JVP whose tangents are NaN on
    the padding edges, on ``backend`` in ``dtype``: those of the reference on the real edges alone
    (float64), with exact zeros in ȳ and w̄ on the padding edges."""
    conv = make(deterministic=deterministic, backend=backend)
    reference = make(deterministic=deterministic, backend="reference")
    *args, real = padded_graph(conv, shared, dtype)
    x, y, w, src, dst = args
    kept = [a.astype(jnp.float64) if a.dtype == dtype else a for a in real_part(shared, real, *args)]
    per_edge = (False, True, not shared)

    def forward(conv):
        return jax.jit(lambda x, y, w, src, dst: conv(x, y, w, src, dst, NODES))

    assert_matches_real_edges(forward(conv)(*args), forward(reference)(*kept), real, False, dtype)
    for derivative in (lambda c: jax.grad(lambda *a: jnp.sum(forward(c)(*a) ** 2), argnums=(0, 1, 2)),
                       lambda c: jax.grad(functools.partial(_force_loss, c), argnums=(0, 1, 2))):
        for padded, real_only, edge in zip(jax.jit(derivative(conv))(*args), jax.jit(derivative(reference))(*kept),
                                           per_edge):
            assert_matches_real_edges(padded, real_only, real, edge, dtype)

    tangents = [x, jnp.where(real[:, None], 1.5 * y, jnp.nan), w]
    real_tangents = list(kept[:1]) + [1.5 * kept[1], kept[2]]

    def jvp(conv):
        return jax.jit(lambda a, t: jax.jvp(lambda *p: forward(conv)(*p, *a[3:]), list(a[:3]), t)[1])

    assert_matches_real_edges(jvp(conv)(args, tangents), jvp(reference)(kept, real_tangents), real, False, dtype)


def _one_rounding_bound(exact, dtype):
    """1.5 times the error of rounding ``exact`` (float64) once to ``dtype``, elementwise."""
    rounded = np.asarray(jnp.asarray(exact).astype(dtype).astype(jnp.float64))
    return 1.5 * np.abs(rounded - exact)


def assert_half_precision_rounds_once(backend, dtype, edges=4096):
    """A sum of ``edges`` edges into one node, a product and a shared weights' gradient in ``dtype``
    (float16 or bfloat16) on ``backend``: within 1.5 roundings of the float64 result of the same
    (rounded) inputs, in the inputs' dtype."""
    conv = make(backend=backend)
    keys = jax.random.split(jax.random.PRNGKey(4), 3)
    x = jax.random.normal(keys[0], (3, conv.irreps_in1.dim)).astype(dtype)
    y = jax.random.normal(keys[1], (edges, conv.irreps_in2.dim)).astype(dtype)
    w = jax.random.normal(keys[2], (conv.weight_numel,)).astype(dtype)
    src, dst = jnp.arange(edges) % 3, jnp.zeros(edges, jnp.int32)
    wide = [a.astype(jnp.float64) for a in (x, y, w)]
    reference = make(backend="reference")
    tp, reference_tp = (make(jax_cgtp.TensorProduct, backend=b) for b in (backend, "reference"))
    rows = 24
    cases = [
        (jax.jit(lambda x, y, w: conv(x, y, w, src, dst, 1))(x, y, w), reference(*wide, src, dst, 1)),
        (jax.jit(tp)(jnp.tile(x, (8, 1)), y[:rows], w), reference_tp(jnp.tile(wide[0], (8, 1)), wide[1][:rows], wide[2])),
        (jax.jit(jax.grad(lambda w: jnp.sum(conv(x, y, w, src, dst, 1).astype(jnp.float32))))(w),
         jax.grad(lambda w: jnp.sum(reference(wide[0], wide[1], w, src, dst, 1)))(wide[2])),
    ]
    for actual, exact in cases:
        assert actual.dtype == dtype
        exact = np.asarray(exact)
        assert (np.abs(np.asarray(actual.astype(jnp.float64)) - exact) <= _one_rounding_bound(exact, dtype)).all()
