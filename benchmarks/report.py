"""Write a report (JSON, text table, plots), and merge the JSON of several runs into one.

A GPU session is split into calls of a few minutes each (by phase or config); each call writes
its own ``bench-<tag>.json``. Merge them and redraw with::

    python -m benchmarks.report bench-fwd.json bench-conv.json --out benchmarks/results/<device>

Rows keep the index of the run they came from (``row["run"]``), so each row's floors stay those
measured in its own run.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from . import table

SCHEMA = "jax_cgtp-bench/1"


def file_names(tag: str | None) -> dict[str, str]:
    suffix = f"-{tag}" if tag else ""
    return {"json": f"bench{suffix}.json", "text": f"bench{suffix}.txt",
            "speedup": f"speedup{suffix}.png", "roofline": f"roofline{suffix}.png"}


def write(report: dict, out_dir, tag: str | None = None, with_plots: bool = True) -> dict[str, str]:
    """Write the report's files under ``out_dir``; returns their paths."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = file_names(tag)
    paths = {key: str(out / name) for key, name in names.items()}
    (out / names["json"]).write_text(json.dumps(report, indent=1, sort_keys=False) + "\n")
    (out / names["text"]).write_text(table.render(report) + "\n")
    if with_plots and report["rows"]:
        from . import plots  # matplotlib only when plotting

        plots.speedup_chart(report, out / names["speedup"])
        plots.roofline_chart(report, out / names["roofline"])
    else:
        del paths["speedup"], paths["roofline"]
    return paths


def merge(reports: list[dict]) -> dict:
    """One report holding every run and row of ``reports`` (libraries: the best status seen)."""
    merged = {"schema": SCHEMA, "runs": [], "libraries": {}, "rows": []}
    for report in reports:
        if report.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} report: schema {report.get('schema')!r}")
        offset = len(merged["runs"])
        merged["runs"] += report["runs"]
        for lib, info in report["libraries"].items():
            if lib not in merged["libraries"] or info["status"] == "ok":
                merged["libraries"][lib] = info
        merged["rows"] += [dict(row, run=row.get("run", 0) + offset) for row in report["rows"]]
    return merged


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="bench*.json files written by benchmarks.run")
    parser.add_argument("--out", required=True, help="folder for the merged bench.json/.txt and plots")
    parser.add_argument("--tag", default=None, help="suffix of the written file names")
    args = parser.parse_args(argv)
    report = merge([json.loads(pathlib.Path(f).read_text()) for f in args.files])
    paths = write(report, args.out, args.tag)
    print(table.render(report))
    print("\nwrote " + ", ".join(paths.values()))
    return report


if __name__ == "__main__":
    main()
