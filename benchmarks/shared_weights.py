"""Products with shared weights: the generated kernels against XLA's lowering, in the same run.

A product whose weights are shared by every row is a batch of small matrix products (a
species-dependent self-connection, a linear mix). This script times the ``fwd``, ``bwd`` and
``dbwd`` phases of :mod:`benchmarks.phases` for a few such products, once with
``backend="cuda"`` (the generated kernels, one warp per row) and once with
``backend="reference"`` (the pure-JAX einsums, which XLA lowers to ``dot_general``s), on the
same inputs, jitted, warmed up, per call with calls queued back to back; and once with
``backend="auto"``, which runs the forward of a ``uvw`` product on the kernels and its
derivatives on XLA (:func:`jax_cgtp.gpu.cuda_lowering.runs_on_xla`). It also checks that the three
agree.

    python -m benchmarks.shared_weights [--rows 864,8000,64000] [--dtype float32,float64]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import jax_cgtp

from .measure import relative_error
from .phases import phase_function
from .timing import PIPELINE_BATCHES, compile_function, time_pipelined

PRODUCTS = {
    # NequIP's species self-connection: hidden features x one-hot species -> gate input.
    "self-connection-c32": ("fully_connected", "32x0e+32x1o+32x2e", "3x0e", "96x0e+32x1o+32x2e"),
    # The same, on the first layer's scalar embedding.
    "self-connection-c32-l0": ("fully_connected", "32x0e", "3x0e", "96x0e+32x1o+32x2e"),
    # MACE-sized: 128 channels and 10 species.
    "self-connection-c128": ("fully_connected", "128x0e+128x1o+128x2e", "10x0e", "128x0e+128x1o+128x2e"),
    # A channelwise product with one weight per path and channel pair, shared by all rows.
    "channelwise-c32": ("channelwise", "32x0e+32x1o+32x2e", "0e+1o+2e", None),
}
PHASES = ("fwd", "bwd", "dbwd")
BACKENDS = ("cuda", "auto", "reference")
CALLS = 50


def make_product(kind, irreps_in1, irreps_in2, irreps_out, backend):
    if kind == "channelwise":
        return jax_cgtp.channelwise_tensor_product(irreps_in1, irreps_in2, backend=backend)
    return jax_cgtp.fully_connected_tensor_product(irreps_in1, irreps_in2, irreps_out, backend=backend)


def inputs(tp, rows: int, dtype, seed: int = 0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    x = jax.random.normal(keys[0], (rows, tp.irreps_in1.dim), dtype)
    y = jax.random.normal(keys[1], (rows, tp.irreps_in2.dim), dtype)
    w = jax.random.normal(keys[2], (tp.weight_numel,), dtype)
    g = jax.random.normal(keys[3], (rows, tp.irreps_out.dim), dtype)
    return x, y, w, g


def measure(name: str, rows: int, dtype, phase: str) -> dict:
    products = {backend: make_product(*PRODUCTS[name], backend) for backend in BACKENDS}
    x, y, w, g = inputs(products["cuda"], rows, dtype)
    args = (x, y, w) if phase == "fwd" else (x, y, w, g)
    results = {}
    for backend, tp in products.items():
        compiled = compile_function(phase_function(phase, tp), args)
        outputs = jax.block_until_ready(compiled(*args))
        time_pipelined(compiled, args, 1, CALLS)
        results[backend] = (time_pipelined(compiled, args, PIPELINE_BATCHES, CALLS), outputs)
    expected = results["reference"][1]
    difference = max(relative_error(a, b)[0] for backend in BACKENDS for a, b in zip(results[backend][1], expected))
    times = {backend: results[backend][0] for backend in BACKENDS}
    return {"product": name, "rows": rows, "dtype": jnp.dtype(dtype).name, "phase": phase,
            "kernels_ms": times["cuda"], "auto_ms": times["auto"], "xla_ms": times["reference"],
            "difference": difference}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", default=",".join(PRODUCTS))
    parser.add_argument("--rows", default="864,8000,64000")
    parser.add_argument("--dtype", default="float32,float64")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    print(f"device: {jax.devices()[0].device_kind}; per call, {PIPELINE_BATCHES} batches of {CALLS} queued calls")
    print("| product | rows | dtype | phase | kernels ms | XLA ms | auto ms | kernels / XLA time | "
          "auto / faster of the two | max rel. difference |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name in args.products.split(","):
        for count in (int(r) for r in args.rows.split(",")):
            for dtype in args.dtype.split(","):
                for phase in PHASES:
                    row = measure(name, count, jnp.dtype(dtype), phase)
                    rows.append(row)
                    best = min(row["kernels_ms"], row["xla_ms"])
                    print(f"| {name} | {count} | {row['dtype']} | {phase} | {row['kernels_ms']:.4f} | "
                          f"{row['xla_ms']:.4f} | {row['auto_ms']:.4f} | {row['kernels_ms'] / row['xla_ms']:.2f} | "
                          f"{row['auto_ms'] / best:.2f} | {row['difference']:.1e} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
