"""Derived numbers of a row: floors, fractions of the ceilings, and jax_cgtp's speedups.

- ``memory_floor_ms = min_bytes / copy bandwidth`` and ``compute_floor_ms = FLOP / matmul
  peak`` of the row's dtype (both measured by :mod:`benchmarks.ceilings` in the same run);
- per library, with ``ms`` its per-call time (:func:`benchmarks.timing.per_call_ms`: calls
  queued back to back): ``floor_fraction = memory_floor_ms / ms`` (1.0 means it moves its
  minimum bytes at copy speed), achieved GFLOP/s and ``peak_fraction`` of the measured peak;
- ``speedup[peer] = peer ms / jax_cgtp ms`` wherever both ran (a mismatching result still gets
  its number; the row flags it), and ``sync_speedup[peer]``, the same for one blocking call
  (``median_ms``: host dispatch and the round trip included).
"""

from __future__ import annotations

from .timing import per_call_ms, sync_ms

MAIN = "jax_cgtp"


def derive(row: dict, ceilings: dict) -> dict:
    """``row`` with the derived fields added (in place, and returned)."""
    bandwidth = ceilings["copy"]["bytes_per_s"]
    peak = ceilings["matmul"].get(row["dtype"], {}).get("flop_per_s")
    row["memory_floor_ms"] = row["min_bytes"] / bandwidth * 1e3
    row["compute_floor_ms"] = row["gflop"] * 1e9 / peak * 1e3 if peak else None
    for result in row["results"].values():
        ms = per_call_ms(result)
        if ms is None:
            continue
        result["floor_fraction"] = row["memory_floor_ms"] / ms
        result["gflop_per_s"] = row["gflop"] / (ms * 1e-3)
        result["bytes_per_s"] = row["min_bytes"] / (ms * 1e-3)
        result["peak_fraction"] = result["gflop_per_s"] * 1e9 / peak if peak else None
    for key, time_of in (("speedup", per_call_ms), ("sync_speedup", sync_ms)):
        main = time_of(row["results"].get(MAIN, {}))
        row[key] = {lib: (time_of(result) / main if main and time_of(result) else None)
                    for lib, result in row["results"].items() if lib != MAIN}
    return row
