"""Random e3nn-style tensor-product problems for property tests, and the e3nn-jax twin."""

from __future__ import annotations

import e3nn_jax as e3nn
import jax
import numpy as np
from e3nn_jax.legacy import FunctionalTensorProduct

from jax_cgtp.core.problem import MODES

MULS = (1, 2, 3, 5)


def _random_irrep(rng, lmax):
    return e3nn.Irrep(int(rng.integers(0, lmax + 1)), int(rng.choice([-1, 1])))


def random_problem(seed: int, mode: str | None = None, lmax: int = 3):
    """A random ``(irreps_in1, irreps_in2, irreps_out, instructions, normalizations)`` spec.

    Multiplicities include 1 and odd numbers, l goes up to ``lmax``, path weights are random,
    and every instruction is valid for its mode.
    """
    rng = np.random.default_rng(seed)
    mode = mode or MODES[seed % len(MODES)]
    n1, n2 = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    in1 = [(int(rng.choice(MULS)), _random_irrep(rng, lmax)) for _ in range(n1)]
    in2 = [(int(rng.choice(MULS)), _random_irrep(rng, lmax)) for _ in range(n2)]
    if mode in ("uuw", "uuu"):  # x and y blocks must share multiplicities
        in2 = [(in1[i % n1][0], ir) for i, (_, ir) in enumerate(in2)]
    out, instructions = [], []
    for i1, (mul1, ir1) in enumerate(in1):
        for i2, (mul2, ir2) in enumerate(in2):
            if mode in ("uuw", "uuu") and mul1 != mul2:
                continue
            for ir in ir1 * ir2:
                if rng.random() < 0.4:
                    continue
                has_weight = mode == "uvw" or bool(rng.random() < 0.8)
                mul_out = {"uvw": int(rng.choice(MULS)), "uvu": mul1, "uvv": mul2,
                           "uuw": int(rng.choice(MULS)) if has_weight else 1, "uuu": mul1}[mode]
                instruction = (i1, i2, len(out), mode, has_weight)
                if rng.random() < 0.5:
                    instruction += (float(rng.uniform(0.5, 2.0)),)
                out.append((mul_out, ir))
                instructions.append(instruction)
    if not instructions:  # always at least one path
        (mul1, ir1), (mul2, ir2) = in1[0], in2[0]
        if mode in ("uuw", "uuu"):
            mul2 = mul1
            in2[0] = (mul1, ir2)
        ir = next(iter(ir1 * ir2))
        out.append(({"uvw": 2, "uvu": mul1, "uvv": mul2, "uuw": 3, "uuu": mul1}[mode], ir))
        instructions.append((0, 0, 0, mode, True))
    if rng.random() < 0.3:  # an output block no path reaches
        out.append((2, _random_irrep(rng, lmax)))
    normalization = {
        "irrep_normalization": str(rng.choice(["component", "norm"])),
        "path_normalization": str(rng.choice(["element", "path"])),
    }
    return (e3nn.Irreps(in1), e3nn.Irreps(in2), e3nn.Irreps(out), instructions, normalization)


def e3nn_tensor_product(spec):
    """``f(x, y, w)`` computing the same product with e3nn-jax, for any batch shape and w shared or not."""
    irreps_in1, irreps_in2, irreps_out, instructions, normalization = spec
    tp = FunctionalTensorProduct(irreps_in1, irreps_in2, irreps_out, instructions, **normalization)

    def single(x, y, w):
        return tp.left_right(w, e3nn.IrrepsArray(irreps_in1, x), e3nn.IrrepsArray(irreps_in2, y)).array

    def apply(x, y, w):
        batch = np.broadcast_shapes(x.shape[:-1], y.shape[:-1], w.shape[:-1] if w.ndim > 1 else ())

        def flat(a):
            return jax.numpy.broadcast_to(a, batch + a.shape[-1:]).reshape((-1, a.shape[-1]))

        if w.ndim == 1:
            z = jax.vmap(single, (0, 0, None))(flat(x), flat(y), w)
        else:
            z = jax.vmap(single)(flat(x), flat(y), flat(w))
        return z.reshape(batch + (irreps_out.dim,))

    return jax.jit(apply)


def random_inputs(key, spec, batch, weight_numel, dtype, shared_weights=True):
    irreps_in1, irreps_in2 = spec[0], spec[1]
    kx, ky, kw = jax.random.split(key, 3)
    x = jax.random.normal(kx, batch + (irreps_in1.dim,), dtype)
    y = jax.random.normal(ky, batch + (irreps_in2.dim,), dtype)
    w_shape = (weight_numel,) if shared_weights else batch + (weight_numel,)
    w = jax.random.normal(kw, w_shape, dtype)
    return x, y, w
