"""The device's two ceilings, measured at the start of a run rather than taken from a datasheet.

- Copy bandwidth: a jitted ``jnp.copy`` of a large float32 array (2 GiB on a GPU, far beyond the
  L2 cache), counting the bytes read plus the bytes written, per call (pipelined, see
  :mod:`benchmarks.timing`).
- Peak FLOP/s per dtype: a jitted square matrix product (``precision=HIGHEST``, so float32 does
  not fall back to TF32), ``2 n^3`` FLOP per product, per call (pipelined).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .timing import compile_function, per_call_ms, time_compiled


def copy_bandwidth(nbytes: int, warmup: int, runs: int) -> dict:
    """Measured device-to-device copy bandwidth in bytes/s (read + write)."""
    n = nbytes // 4
    a = jnp.arange(n, dtype=jnp.float32)  # nonzero values; one cheap compilation
    compiled = compile_function(jnp.copy, (a,))
    t = time_compiled(compiled, (a,), warmup, runs)
    return {"bytes_per_s": 2 * n * 4 / (per_call_ms(t) * 1e-3), "array_bytes": n * 4, **t}


def matmul_peak(n: int, dtype, warmup: int, runs: int) -> dict:
    """Measured FLOP/s of an ``n x n`` by ``n x n`` product in ``dtype``."""
    a, b = _random_pair(jax.random.PRNGKey(1), n, jnp.dtype(dtype))

    def product(a, b):
        return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)

    compiled = compile_function(product, (a, b))
    t = time_compiled(compiled, (a, b), warmup, runs)
    return {"flop_per_s": 2 * n**3 / (per_call_ms(t) * 1e-3), "n": n, **t}


@functools.partial(jax.jit, static_argnums=(1, 2))
def _random_pair(key, n, dtype):
    keys = jax.random.split(key)
    return jax.random.normal(keys[0], (n, n), dtype), jax.random.normal(keys[1], (n, n), dtype)


def measure(dtypes, smoke: bool, warmup: int, runs: int) -> dict:
    """Both ceilings, at sizes that fill a GPU (a CPU's caches and cores at a tenth of the time of
    the GPU's sizes there: 256 MiB and 1,024; tiny ones for the smoke run)."""
    on_cpu = jax.default_backend() == "cpu"
    nbytes = (8 << 20) if smoke else (256 << 20) if on_cpu else (2 << 30)
    n = 256 if smoke else 1024 if on_cpu else 8192
    return {
        "copy": copy_bandwidth(nbytes, warmup, runs),
        "matmul": {str(jnp.dtype(d)): matmul_peak(n, d, warmup, runs) for d in dtypes},
    }
