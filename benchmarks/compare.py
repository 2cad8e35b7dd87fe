"""``python -m benchmarks.compare BASE.json NEW.json [MORE.json ...]``: one tree's rows against another's.

For an A/B of two commits measured in separate runs (``gpu_session.sh --base``), each row that
both reports measured with the same library: the per-call ms of each report and the ratio of
every later report to the first (below 1: faster). Runs in separate processes drift (a few
percent on rows under 0.5 ms on an H200): name the base twice, before and after, to see how much.
"""

from __future__ import annotations

import argparse

from .report import load
from .timing import per_call_ms


def row_times(report: dict) -> dict[tuple[str, str, str, str], float]:
    """``{(config, phase, dtype, library): per-call ms}`` of every measured result of ``report``."""
    times = {}
    for row in report["rows"]:
        for lib, result in row["results"].items():
            ms = per_call_ms(result) if result.get("status") == "ok" else None
            if ms:
                times[row["config"], row["phase"], row["dtype"], lib] = ms
    return times


def render(reports: list[dict], names: list[str]) -> str:
    """The table: rows of the first report that every other report measured too, in its order."""
    times = [row_times(r) for r in reports]
    keys = [k for k in times[0] if all(k in t for t in times[1:])]
    head = f"{'config':24s} {'phase':10s} {'dtype':8s} {'library':13s}"
    head += "".join(f" {n[:10]:>10s}" for n in names) + "".join(f" {n[:8] + '/b':>10s}" for n in names[1:])
    lines = [head, "-" * len(head)]
    for key in keys:
        line = f"{key[0]:24s} {key[1]:10s} {key[2]:8s} {key[3]:13s}"
        line += "".join(f" {t[key]:10.3f}" for t in times)
        line += "".join(f" {t[key] / times[0][key]:10.3f}" for t in times[1:])
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", metavar="REPORT.json", help="the base first")
    parser.add_argument("--names", default="", help="comma-separated column names (default: each run's commit)")
    args = parser.parse_args(argv)
    if len(args.reports) < 2:
        parser.error("give a base report and at least one report to compare with it")
    try:
        reports = [load(path) for path in args.reports]
    except ValueError as error:
        parser.error(str(error))
    names = args.names.split(",") if args.names else [r["runs"][0].get("git_commit", "?") for r in reports]
    if len(names) != len(reports):
        parser.error(f"--names gives {len(names)} names for {len(reports)} reports")
    text = render(reports, names)
    print(text)
    return text


if __name__ == "__main__":
    main()
