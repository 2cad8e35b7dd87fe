"""Compile once, time many: the protocol of METHOD-NOTES, and the memory of the executable.

:func:`time_compiled` runs the compiled executable ``warmup`` times, then ``runs`` times, each run
timed on the host clock from the call until ``jax.block_until_ready`` returns; it reports the
median and the spread (``median_ms``: a synchronous call, host dispatch and the round trip
included). It then times :data:`PIPELINE_BATCHES` batches of :data:`PIPELINE_CALLS` calls queued
back to back and blocked on once, as a training loop dispatches them: the median per-call time
of a batch (``pipelined_ms``) is the device's time per call whenever the host dispatches faster
than the device runs, which holds for every benchmark row (a CUPTI trace of mace-l2-c128 and
nequip-l2-c32 convolutions on an H100 agreed within 2-10%, where the synchronous time was up to
2.2x larger). :func:`per_call_ms` is the time the derived numbers use.

Memory: JAX cannot reset a device's ``peak_bytes_in_use``, and one subprocess per (library,
phase) would recompile everything. :func:`memory_of` therefore reports what XLA's own
accounting of the compiled executable says (``memory_analysis()``): arguments, outputs and
temporaries (aliased bytes counted once). It covers every buffer XLA allocates for the call,
including scratch that a custom call asks XLA for; it does not see memory that a custom call
allocates by itself outside XLA's allocator. The run also records the device's process-wide
``peak_bytes_in_use`` once at the end, as a cross-check.
"""

from __future__ import annotations

import collections
import statistics
import time

import jax

PIPELINE_BATCHES = 5
PIPELINE_CALLS = 10


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
    calls = min(PIPELINE_CALLS, runs)
    return {"median_ms": statistics.median(samples), "min_ms": samples[0], "max_ms": samples[-1],
            "q1_ms": quartiles[0], "q3_ms": quartiles[2], "runs": runs, "warmup": warmup,
            "pipelined_ms": time_pipelined(compiled, args, PIPELINE_BATCHES, calls),
            "pipelined_calls": [PIPELINE_BATCHES, calls]}


def time_pipelined(compiled, args, batches: int, calls: int) -> float:
    """Median over ``batches`` of the per-call time of ``calls`` calls queued back to back.

    The results of the last few calls stay referenced, so that no buffer is released while the
    call that writes it may still be running; the earlier ones are released as the batch goes on.
    """
    per_call = []
    for _ in range(batches):
        recent = collections.deque(maxlen=4)
        start = time.perf_counter()
        for _ in range(calls):
            recent.append(compiled(*args))
        jax.block_until_ready(recent[-1])
        per_call.append((time.perf_counter() - start) * 1e3 / calls)
        del recent
    return statistics.median(per_call)


def per_call_ms(result: dict) -> float | None:
    """The per-call time the derived numbers use: pipelined where measured, else synchronous."""
    return result.get("pipelined_ms") or sync_ms(result)


def sync_ms(result: dict) -> float | None:
    """The median time of one blocking call (host dispatch and the round trip included)."""
    return result.get("median_ms")
