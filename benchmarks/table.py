"""The readable report: peers side by side, jax_cgtp's speedups, and the fractions of the floors.

One time table per dtype (per-call ms per library, calls queued back to back, with the speedups
and floor fractions derived from them; ``!`` marks a result that disagreed with the reference,
see the notes), one table of synchronous times (one blocking call: host dispatch and the round
trip included), one memory table (XLA's accounting of each compiled phase, MiB), and notes
listing each library's version or why it is missing, and every mismatch, unsupported problem
and error.
"""

from __future__ import annotations

import math

from .metrics import MAIN
from .peers import LIBRARIES
from .timing import per_call_ms, sync_ms

PEERS = tuple(lib for lib in LIBRARIES if lib != MAIN)

_STATUS_CELL = {"missing": "missing", "unsupported": "unsupp.", "error": "error"}


def _cell(result: dict | None, time_of=per_call_ms) -> str:
    if not result:
        return "-"
    ms = time_of(result)
    if ms is not None and result["status"] in ("ok", "mismatch"):
        return f"{ms:.3f}" + ("!" if result["status"] == "mismatch" else "")
    return _STATUS_CELL.get(result["status"], result["status"])


def _rate(value: float, unit: str) -> str:
    """``value`` with an SI prefix: ``_rate(3.1e12, "B/s") == "3.10 TB/s"``."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.2f} {unit}"


def _mib(nbytes: int) -> str:
    value = nbytes / 2**20
    return f"{value:.0f}" if value >= 100 else f"{value:.2g}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _render(header: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return [line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in body]


def time_table(rows: list[dict], libraries: list[str]) -> list[str]:
    peers = [lib for lib in libraries if lib != MAIN]
    header = (["config", "phase", "edges"] + [f"{lib} ms" for lib in libraries] + [f"x{p}" for p in peers]
              + ["floor ms", f"{MAIN} %floor", "best peer %floor", f"{MAIN} %peak"])
    body = []
    for row in rows:
        results = row["results"]
        speed = [row.get("speedup", {}).get(p) for p in peers]
        peer_fracs = [results[p].get("floor_fraction") for p in peers if p in results and p in PEERS
                      and results[p].get("status") == "ok" and results[p].get("floor_fraction")]
        main = results.get(MAIN, {})
        body.append([row["config"], row["phase"], str(row["edges"])]
                    + [_cell(results.get(lib)) for lib in libraries]
                    + ["-" if s is None else f"{s:.2f}" for s in speed]
                    + [f"{row['memory_floor_ms']:.3f}", _pct(main.get("floor_fraction")),
                       _pct(max(peer_fracs) if peer_fracs else None), _pct(main.get("peak_fraction"))])
    return _render(header, body)


def sync_table(rows: list[dict], libraries: list[str]) -> list[str]:
    peers = [lib for lib in libraries if lib != MAIN]
    header = ["config", "phase", "dtype"] + [f"{lib} ms" for lib in libraries] + [f"x{p}" for p in peers]
    body = []
    for row in rows:
        speed = [row.get("sync_speedup", {}).get(p) for p in peers]
        body.append([row["config"], row["phase"], row["dtype"]]
                    + [_cell(row["results"].get(lib), sync_ms) for lib in libraries]
                    + ["-" if s is None else f"{s:.2f}" for s in speed])
    return _render(header, body)


def memory_table(rows: list[dict], libraries: list[str]) -> list[str]:
    header = ["config", "phase", "dtype"] + [f"{lib} temp/total MiB" for lib in libraries]
    body = []
    for row in rows:
        cells = []
        for lib in libraries:
            memory = row["results"].get(lib, {}).get("memory")
            cells.append("-" if not memory else f"{_mib(memory['temp'])}/{_mib(memory['total'])}")
        body.append([row["config"], row["phase"], row["dtype"]] + cells)
    return _render(header, body)


def phase_summary(rows: list[dict]) -> list[str]:
    """Per phase and dtype: the minimum and the geometric mean over rows of jax_cgtp's speedup over
    the best peer that ran the row (the fastest), the row that sets the minimum, the range of
    jax_cgtp's floor fractions, and the rows no peer ran."""
    header = ["phase", "dtype", "rows", "min x best peer", "geomean", "min row (best peer)", f"{MAIN} %floor",
              "no peer"]
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["phase"], row["dtype"]), []).append(row)
    body = []
    for (phase, dtype), group in groups.items():
        ratios, alone, fractions = [], 0, []
        for row in group:
            speedups = {p: s for p, s in row.get("speedup", {}).items() if p in PEERS and s}
            fraction = row["results"].get(MAIN, {}).get("floor_fraction")
            if fraction:
                fractions.append(fraction)
            if speedups:
                peer = min(speedups, key=speedups.get)
                ratios.append((speedups[peer], row["config"], peer))
            else:
                alone += 1
        if ratios:
            low = min(ratios)
            geomean = math.exp(sum(math.log(r) for r, _, _ in ratios) / len(ratios))
            cells = [f"{low[0]:.2f}", f"{geomean:.2f}", f"{low[1]} ({low[2]})"]
        else:
            cells = ["-", "-", "-"]
        span = f"{_pct(min(fractions))}-{_pct(max(fractions))}" if fractions else "-"
        body.append([phase, dtype, str(len(group))] + cells + [span, str(alone)])
    return _render(header, body)


def _unmeasured(report: dict) -> list[str]:
    """The runs' skipped groups ("config dtype phase,phase"), less the phases that a row of the
    report has (a merged report takes those rows from other runs)."""
    measured = {(row["config"], row["dtype"], row["phase"]) for row in report["rows"]}
    unmeasured = []
    for meta in report["runs"]:
        for skipped in meta.get("skipped", []):
            config, dtype, phases = skipped.rsplit(" ", 2)
            left = [phase for phase in phases.split(",") if (config, dtype, phase) not in measured]
            if left:
                unmeasured.append(f"{config} {dtype} {','.join(left)}")
    return list(dict.fromkeys(unmeasured))


def notes(report: dict) -> list[str]:
    lines = ["Libraries:"]
    for lib, info in report["libraries"].items():
        lines.append(f"  {lib}: {info.get('version') or info.get('reason')} [{info['status']}]")
    calls = [row["results"].get(MAIN, {}).get("custom_calls") for row in report["rows"]]
    calls = [c for c in calls if c is not None and c >= 0]
    if calls:
        path = ("generated kernels (custom calls in every compiled phase)" if min(calls) > 0 else
                "XLA ops only in some phases (the reference path)" if max(calls) > 0 else
                "XLA ops only (the reference path)")
        lines.append(f"  {MAIN} ran on: {path}")
    lines += [f"  not measured (time budget of the run spent): {skipped}" for skipped in _unmeasured(report)]
    seen = set()
    for row in report["rows"]:
        for lib, result in row["results"].items():
            status = result.get("status")
            if status == "mismatch":
                lines.append(f"  MISMATCH {lib} {row['config']} {row['dtype']} {row['phase']}: rel err "
                             f"{result['rel_err']:.2e} vs {result.get('checked_against')}")
            elif status in ("unsupported", "error") and (lib, status, result.get("error")) not in seen:
                seen.add((lib, status, result.get("error")))
                lines.append(f"  {status} {lib} ({row['config']} {row['dtype']} {row['phase']}...): {result.get('error')}")
    return lines


def render(report: dict) -> str:
    """The whole text report of a run (or of several merged runs)."""
    libraries = list(report["libraries"])
    lines = []
    for meta in report["runs"]:
        lines.append(f"{meta['device']} | jax {meta['jax']} | commit {meta['git_commit']} | {meta['time_utc']}"
                     + (" | SMOKE (tiny sizes, numbers meaningless)" if meta.get("smoke") else ""))
        ceil = meta["ceilings"]
        peaks = ", ".join(f"{d} {_rate(v['flop_per_s'], 'FLOP/s')}" for d, v in ceil["matmul"].items())
        lines.append(f"  measured copy bandwidth {_rate(ceil['copy']['bytes_per_s'], 'B/s')} (read+write); "
                     f"matmul peak {peaks}; {meta['protocol']['runs']} timed runs after "
                     f"{meta['protocol']['warmup']} warm-ups; jax_cgtp backend {meta.get('jax_cgtp_backend')}"
                     + (f"; {meta['graph']} graph" if meta.get("graph", "random") != "random" else "")
                     + (f"; settings {meta['settings']}" if meta.get("settings") else ""))
    for dtype in dict.fromkeys(row["dtype"] for row in report["rows"]):
        rows = [row for row in report["rows"] if row["dtype"] == dtype]
        lines += ["", f"== {dtype}: ms per call, calls queued back to back (speedup = peer ms / {MAIN} ms; "
                  f"%floor = memory floor / ms) =="]
        lines += time_table(rows, libraries)
    lines += ["", f"== per phase: {MAIN}'s speedup over the fastest peer that ran each row, the minimum over rows and "
              "the geometric mean =="]
    lines += phase_summary(report["rows"])
    lines += ["", "== one blocking call: median ms (host dispatch and the round trip included), speedups =="]
    lines += sync_table(report["rows"], libraries)
    lines += ["", "== memory of each compiled phase (XLA memory_analysis: temporaries / all buffers) =="]
    lines += memory_table(report["rows"], libraries)
    lines += [""] + notes(report)
    return "\n".join(lines)
