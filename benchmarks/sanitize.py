"""Run every kernel of chosen problems once, at small sizes, on padded graphs: the workload for
``compute-sanitizer`` (memcheck, racecheck, initcheck) on the GPU machine.

For each config (the public suite by default, plus ``--random N`` problems of
:mod:`benchmarks.random_suite`) and each ``--cases`` pair of dtype and index type, it runs, jitted,
the product's ``fwd``, ``bwd`` and ``dbwd`` and the convolution's three phases in both variants
(atomic, deterministic) on a graph whose padding edges point out of range in every way: negative, ``num_nodes``,
``2**31 - 1`` and, with int64 indices, beyond ``2**32``; a padding node in range takes a long run
of edges too. The padding edges' ``y`` rows are NaN and their weight rows Inf, so every result
must be finite: a line per run says ``ok`` or what was not, and the exit status is 1 if any was not.

    compute-sanitizer --tool memcheck --kernel-name kns=cgtp python3 -m benchmarks.sanitize \\
        --configs nequip-lips,mace-medium --random 4

Run it with ``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` (every buffer its own allocation, so that an
access past one is caught) and ``XLA_PYTHON_CLIENT_PREALLOCATE=false``.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_cgtp.gpu.cuda_lowering import precompile

from . import configs, problems, random_suite
from .phases import phase_function

PHASES = ("fwd", "bwd", "dbwd")


def padded_graph(edges: int, nodes: int, index_dtype, seed: int = 0):
    """``(src, dst, real)`` of ``edges`` random edges over ``nodes`` nodes, with padding edges of
    every kind (out of range) and a long run into the last node (in range, as jraph pads)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, nodes, edges)
    dst = rng.integers(0, nodes, edges)
    far = [-1, nodes, 2**31 - 1] + ([2**32 + 3, -(2**40)] if index_dtype == jnp.int64 else [])
    for k, value in enumerate(far):
        src[3 * k], dst[3 * k + 1] = value, value
        src[3 * k + 2] = dst[3 * k + 2] = value
    run = edges // 4  # the last quarter: a padding node in range, a run longer than every walk's cap
    src[-run:] = dst[-run:] = nodes - 1
    real = (src >= 0) & (src < nodes) & (dst >= 0) & (dst < nodes)
    return jnp.asarray(src, index_dtype), jnp.asarray(dst, index_dtype), real


def operands(tp, rows: int, dtype, seed: int, shared: bool):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    dims = (tp.irreps_in1.dim, tp.irreps_in2.dim, tp.irreps_out.dim)
    x, y, g = (jax.random.normal(k, (rows, d), dtype) for k, d in zip(keys, dims))
    w = jax.random.normal(keys[3], (tp.weight_numel,) if shared else (rows, tp.weight_numel), dtype)
    return x, y, w, g


def runs(name: str, dtype, index_dtype, edges: int, backend: str = "cuda"):
    """``(label, function, args)`` of every run of config ``name``."""
    tp = problems.build(name, backend=backend)
    shared = bool(configs.CONFIGS[name].get("shared_weights"))
    x, y, w, g = operands(tp, edges, dtype, 1, shared)
    for phase in PHASES:
        args = (x, y, w) if phase == "fwd" else (x, y, w, g)
        yield f"{phase}", phase_function(phase, tp.__call__), args
    nodes = max(edges // 8, 4)
    src, dst, real = padded_graph(edges, nodes, index_dtype)
    x_nodes, _, _, g_nodes = operands(tp, nodes, dtype, 2, shared)
    y = jnp.where(real[:, None], y, jnp.nan)
    w = w if shared else jnp.where(real[:, None], w, jnp.inf)
    for deterministic in (False, True):
        conv = problems.conv_of(tp, backend=backend)
        conv.deterministic = deterministic
        variant = "deterministic" if deterministic else "atomic"

        def apply(x, y, w, src, dst, conv=conv):
            return conv(x, y, w, src, dst, num_nodes=nodes)

        for phase in PHASES:
            args = (x_nodes, y, w) if phase == "fwd" else (x_nodes, y, w, g_nodes)
            yield f"conv_{phase} {variant}", phase_function(f"conv_{phase}", apply), args + (src, dst)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(configs.SUITES["public"]))
    parser.add_argument("--random", type=int, default=0, help="this many problems of benchmarks.random_suite too")
    parser.add_argument("--seed", type=int, default=0, help="the random problems' seed")
    parser.add_argument("--cases", default="float32:int32,float64:int64",
                        help="DTYPE:INDEX pairs: the operands' floating type and the edge indices' integer type")
    parser.add_argument("--edges", type=int, default=200)
    parser.add_argument("--backend", default="cuda", help="jax_cgtp's backend (reference: a CPU smoke run)")
    parser.add_argument("--precompile", action="store_true",
                        help="only compile every kernel of the runs, in parallel (NVRTC's disk cache keeps them)")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    names = [c for c in args.configs.split(",") if c] + list(random_suite.suite(args.random, args.seed))
    combinations = [tuple(case.split(":")) for case in args.cases.split(",")]
    if args.precompile:
        every = [(fn, fn_args) for name in names for dtype, index in combinations
                 for _, fn, fn_args in runs(name, jnp.dtype(dtype), jnp.dtype(index), args.edges, args.backend)]
        count = precompile(lambda *all_args: [fn(*a) for (fn, _), a in zip(every, all_args)], *[a for _, a in every])
        print(f"{count} kernels compiled", flush=True)
        return 0
    failures = 0
    for name in names:
        for dtype, index in combinations:
            for label, fn, fn_args in runs(name, jnp.dtype(dtype), jnp.dtype(index), args.edges, args.backend):
                start = time.perf_counter()
                try:
                    results = jax.block_until_ready(jax.jit(fn)(*fn_args))
                    finite = all(bool(jnp.isfinite(r).all()) for r in jax.tree.leaves(results))
                    status = "ok" if finite else "NON-FINITE results"
                except Exception as error:  # reported and counted: the next run goes on
                    status = f"FAILED {type(error).__name__}: {str(error)[:300]}"
                failures += status != "ok"
                print(f"{name} {dtype} {index} {label}: {status} ({time.perf_counter() - start:.1f} s)", flush=True)
    print(f"{failures} run(s) not ok", flush=True)
    return int(failures > 0)


if __name__ == "__main__":
    sys.exit(main())
