"""Compile once, time many: the protocol of METHOD-NOTES, and the memory of the executable.

:func:`time_compiled` runs the compiled executable ``warmup`` times, then ``runs`` times, each run
timed on the host clock from the call until ``jax.block_until_ready`` returns (so launch and
dispatch overhead is included, as a user sees it); it reports the median and the spread.

Memory: JAX cannot reset a device's ``peak_bytes_in_use``, and one subprocess per (library,
phase) would recompile everything. :func:`memory_of` therefore reports what XLA's own
accounting of the compiled executable says (``memory_analysis()``): arguments, outputs and
temporaries (aliased bytes counted once). It covers every buffer XLA allocates for the call,
including scratch that a custom call asks XLA for; it does not see memory that a custom call
allocates by itself outside XLA's allocator. The run also records the device's process-wide
``peak_bytes_in_use`` once at the end, as a cross-check.
"""

from __future__ import annotations

import statistics
import time

import jax


def compile_function(fn, args):
    """``jax.jit(fn)`` lowered and compiled for ``args``."""
    return jax.jit(fn).lower(*args).compile()


def memory_of(compiled) -> dict | None:
    """Bytes of the compiled executable's arguments, outputs, temporaries and their sum."""
    try:
        stats = compiled.memory_analysis()
    except Exception:
        return None
    if stats is None:
        return None
    argument = int(stats.argument_size_in_bytes)
    output = int(stats.output_size_in_bytes)
    temp = int(stats.temp_size_in_bytes)
    alias = int(getattr(stats, "alias_size_in_bytes", 0))
    return {"argument": argument, "output": output, "temp": temp, "alias": alias,
            "total": argument + output + temp - alias}


def custom_calls(compiled) -> int:
    """How many custom calls the optimised HLO contains (0 means plain XLA ops)."""
    try:
        return compiled.as_text().count("custom-call(")
    except Exception:
        return -1


def time_compiled(compiled, args, warmup: int, runs: int) -> dict:
    """Median and spread, in milliseconds, of ``runs`` blocking calls after ``warmup`` calls."""
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        out = compiled(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) * 1e3)
        del out
    samples.sort()
    quartiles = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return {"median_ms": statistics.median(samples), "min_ms": samples[0], "max_ms": samples[-1],
            "q1_ms": quartiles[0], "q3_ms": quartiles[2], "runs": runs, "warmup": warmup}
