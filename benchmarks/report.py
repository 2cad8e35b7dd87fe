"""Write a report (JSON, text table, plots), and merge the JSON of several runs into one.

A GPU session is split into calls of a few minutes each (by phase or config); each call writes
its own ``bench-<tag>.json``. Merge them and redraw with::

    python -m benchmarks.report bench-fwd.json bench-conv.json --out benchmarks/results/<device>

Rows keep the index of the run they came from (``row["run"]``), so each row's floors stay those
measured in its own run.

A table assembled from many sessions names each row's source in a sources file, one row per line
(see :func:`select`); rebuild it with::

    python -m benchmarks.report --sources benchmarks/results/<device>/bench-sources.txt --out benchmarks/results/<device>
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib

from . import table

SCHEMA = "jax_cgtp-bench/1"


def load(path) -> dict:
    """The bench report (JSON) at ``path``; ``ValueError`` naming the file if it is not one."""
    saved = json.loads(pathlib.Path(path).read_text())
    if not isinstance(saved, dict) or saved.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a {SCHEMA} report (benchmarks.run or benchmarks.report writes one)")
    return saved


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


def _add_libraries(into: dict, libraries: dict) -> None:
    """Record each library's status of one report in ``into``, keeping the best status seen ("ok")."""
    for lib, info in libraries.items():
        if lib not in into or info["status"] == "ok":
            into[lib] = info


def merge(reports: list[dict]) -> dict:
    """One report holding every run and row of ``reports`` (libraries: the best status seen)."""
    merged = {"schema": SCHEMA, "runs": [], "libraries": {}, "rows": []}
    for report in reports:
        if report.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} report: schema {report.get('schema')!r}")
        offset = len(merged["runs"])
        merged["runs"] += report["runs"]
        _add_libraries(merged["libraries"], report["libraries"])
        merged["rows"] += [dict(row, run=row.get("run", 0) + offset) for row in report["rows"]]
    return merged


def select(sources) -> dict:
    """The report of the rows that the sources file ``sources`` names, in its order.

    Each line other than blank ones and ``#`` comments is ``config phase dtype commit file``, and
    optionally ``without-det``: the one row of ``config``, ``phase`` and ``dtype`` in ``file`` (a
    bench JSON, relative to the sources file's folder), whose run must have recorded ``commit``;
    ``without-det`` drops its jax_cgtp_det column. Each row keeps its own run (floors, peers).
    """
    sources = pathlib.Path(sources)
    report = {"schema": SCHEMA, "runs": [], "libraries": {}, "rows": []}
    runs: dict[tuple[str, int], int] = {}
    for number, line in enumerate(sources.read_text().splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        where = f"{sources}:{number}"
        if len(fields) not in (5, 6) or fields[5:] not in ([], ["without-det"]):
            raise ValueError(f"{where}: expected 'config phase dtype commit file [without-det]', got {line!r}")
        config, phase, dtype, commit, name = fields[:5]
        try:
            saved = load(sources.parent / name)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        found = [r for r in saved["rows"] if (r["config"], r["phase"], r["dtype"]) == (config, phase, dtype)]
        if len(found) != 1:
            raise ValueError(f"{where}: {name} has {len(found)} rows of {config} {phase} {dtype}, expected one")
        row = copy.deepcopy(found[0])
        run = saved["runs"][row.get("run", 0)]
        if run["git_commit"] != commit:
            raise ValueError(f"{where}: the row of {name} was measured at {run['git_commit']}, not {commit}")
        if fields[5:]:
            for field in ("results", "speedup", "sync_speedup"):
                row.get(field, {}).pop("jax_cgtp_det", None)
        key = (name, row.get("run", 0))
        if key not in runs:
            runs[key] = len(report["runs"])
            report["runs"].append(run)
        _add_libraries(report["libraries"], saved["libraries"])
        report["rows"].append(dict(row, run=runs[key]))
    return report


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help="bench*.json files written by benchmarks.run")
    parser.add_argument("--sources", default=None, help="a sources file naming each row's file (see select)")
    parser.add_argument("--out", required=True, help="folder for the merged bench.json/.txt and plots")
    parser.add_argument("--tag", default=None, help="suffix of the written file names")
    args = parser.parse_args(argv)
    if bool(args.files) == bool(args.sources):
        parser.error("give either bench JSON files or --sources")
    if args.sources:
        report = select(args.sources)
    else:
        report = merge([json.loads(pathlib.Path(f).read_text()) for f in args.files])
    paths = write(report, args.out, args.tag)
    print(table.render(report))
    print("\nwrote " + ", ".join(paths.values()))
    return report


if __name__ == "__main__":
    main()
