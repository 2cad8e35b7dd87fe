"""``python -m benchmarks.run``: time jax_cgtp and its peers on the benchmark configs.

Example (the whole public suite on a GPU)::

    python -m benchmarks.run --suite public --phases fwd,bwd,dbwd,conv_fwd,conv_bwd,conv_dbwd \\
        --dtype float32,float64 --libs jax_cgtp,e3nn,cueq,oeq

One process measures the device's ceilings (:mod:`benchmarks.ceilings`), then for every config,
dtype and phase (or for the rows that ``--rows config:phase:dtype,...`` names) times every library
on the same inputs after checking its results against jax_cgtp's (:mod:`benchmarks.measure`), and
writes ``bench[-TAG].json``, ``bench[-TAG].txt``,
``speedup[-TAG].png`` and ``roofline[-TAG].png`` to ``--out`` (default
``benchmarks/results/<device>/``; the JSON and text are rewritten after every group of rows, so
a run cut short keeps what it measured). ``--smoke`` runs tiny sizes on the reference backend with
few repetitions (output in a temp folder), so CI can check that the harness works; its numbers
mean nothing.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

import jax

import jax_cgtp

from . import ceilings, configs, cost, environment, measure, metrics, phases, problems, random_suite, report, table
from .inputs import GRAPHS
from .peers import LIBRARIES, OPTIONAL_LIBRARIES, Missing, adapter
from .settings import settings_option


def _list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default=None,
                        help=f"config suite: {', '.join(sorted(configs.SUITES))}, or random[:COUNT[:SEED]] "
                             "(benchmarks.random_suite; default 24 problems of seed 0); default public, or smoke "
                             "with --smoke")
    parser.add_argument("--configs", type=_list, default=None, help="comma-separated config names (overrides --suite)")
    parser.add_argument("--phases", type=_list, default=None,
                        help=f"default {','.join(configs.PHASES)}; also {','.join(configs.OPTIONAL_PHASES)}")
    parser.add_argument("--dtype", type=_list, default=None, help=f"default {','.join(configs.DTYPES)}")
    parser.add_argument("--rows", type=_list, default=None, metavar="CONFIG:PHASE:DTYPE,...",
                        help="these rows alone, in this order (instead of --suite, --configs, --phases and --dtype)")
    parser.add_argument("--libs", type=_list, default=list(LIBRARIES),
                        help=f"default {','.join(LIBRARIES)}; also {','.join(OPTIONAL_LIBRARIES)}")
    parser.add_argument("--edges-float32", type=int, default=None, help=f"default {configs.EDGES['float32']}")
    parser.add_argument("--edges-float64", type=int, default=None, help=f"default {configs.EDGES['float64']}")
    parser.add_argument("--runs", type=int, default=None, help=f"timed runs (default {configs.RUNS})")
    parser.add_argument("--warmup", type=int, default=configs.WARMUP)
    parser.add_argument("--backend", default=None, help="jax_cgtp backend (default auto; reference with --smoke)")
    parser.add_argument("--cueq-method", default="uniform_1d")
    parser.add_argument("--graph", default="random", choices=GRAPHS,
                        help="the convolution's graph (benchmarks.inputs): random sources, random receivers "
                             "(by_source), spatial neighbours, a padded batch, or dense neighbour lists")
    parser.add_argument("--out", default=None, help="output folder (default benchmarks/results/<device>; a temp folder with --smoke)")
    parser.add_argument("--tag", default=None, help="suffix of the output file names, for split runs")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds after which no new group of rows starts (the rest are listed as skipped)")
    parser.add_argument("--claims", default=None, metavar="DIR",
                        help="share the groups of rows with other processes given the same folder: each group is "
                             "measured by the process that claims it first (one process per GPU splits one run)")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, reference backend, 3 runs")
    parser.add_argument("--set", default="", metavar="name=VALUE;...",
                        help="settings of jax_cgtp's generator or scheduler for the whole run, as benchmarks.ab's "
                             "--variant takes them (recorded in the report)")
    args = parser.parse_args(argv)
    args.settings = settings_option(parser, "--set", args.set)
    if args.rows is not None:
        take_rows(parser, args, ("suite", "configs", "phases", "dtype"))
    args.phases = args.phases or list(configs.PHASES)
    args.dtype = args.dtype or list(configs.DTYPES)
    for name, values, allowed in (("--phases", args.phases, configs.ALL_PHASES), ("--dtype", args.dtype, configs.DTYPES),
                                  ("--libs", args.libs, LIBRARIES + OPTIONAL_LIBRARIES)):
        unknown = [v for v in values if v not in allowed]
        if unknown:
            parser.error(f"{name}: unknown {unknown}; choose from {list(allowed)}")
    if args.configs is None:
        suite = args.suite or ("smoke" if args.smoke else "public")
        args.configs = list(configs.SUITES.get(suite) or random_suite.parse_suite(suite) or [])
        if not args.configs:
            parser.error(f"--suite: unknown {suite!r}; choose from {sorted(configs.SUITES)} or random[:COUNT[:SEED]]")
    unknown = [c for c in args.configs if not random_suite.known(c)]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; choose from {list(configs.CONFIGS)}")
    if "jax_cgtp" not in args.libs:
        args.libs.insert(0, "jax_cgtp")  # the reference of the checks and of the speedups
    return args


def take_rows(parser: argparse.ArgumentParser, args: argparse.Namespace, instead_of) -> None:
    """``args.rows`` (``--rows config:phase:dtype,...``) as ``(config, phase, dtype)`` triples, and
    ``args.configs``, ``args.phases`` and ``args.dtype`` the ones they name; a parser error where a
    row is malformed or names an unknown value, or where an option of ``instead_of`` is given too."""
    given = [name for name in instead_of if getattr(args, name) is not None]
    if given:
        parser.error(f"--rows names every row: drop --{', --'.join(given)}")
    rows = [tuple(row.split(":")) for row in args.rows]
    malformed = [":".join(row) for row in rows if len(row) != 3]
    if malformed or not rows:
        parser.error(f"--rows: expected config:phase:dtype, comma-separated; got {malformed or 'none'}")
    for row in rows:
        for label, value, allowed in zip(("config", "phase", "dtype"), row,
                                         (configs.CONFIGS, configs.ALL_PHASES, configs.DTYPES)):
            if value not in allowed and not (label == "config" and random_suite.known(value)):
                parser.error(f"--rows: unknown {label} {value!r} in {':'.join(row)}; choose from {list(allowed)}")
    args.rows = rows
    args.configs, args.phases, args.dtype = ([*dict.fromkeys(row[n] for row in rows)] for n in range(3))


def named_rows(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """``(config, phase, dtype)`` of each row to measure: those of ``--rows`` (:func:`take_rows`),
    else every config, dtype and phase, in that order."""
    return args.rows or [(c, p, d) for c in args.configs for d in args.dtype for p in args.phases]


def measured_groups(args: argparse.Namespace) -> list[tuple[str, str, list[str]]]:
    """``(config, dtype, phases)`` of each group of :func:`named_rows`, in order: one config and
    dtype, the product's phases and the convolution's apart (they take different inputs)."""
    groups: dict[tuple[str, str, bool], list[str]] = {}
    for config, phase, dtype in named_rows(args):
        groups.setdefault((config, dtype, phases.is_conv(phase)), []).append(phase)
    return [(config, dtype, group) for (config, dtype, _), group in groups.items()]


def longest_first(groups, products: dict, edges: dict) -> list[tuple[str, str, list[str]]]:
    """``groups`` (:func:`measured_groups`) ordered by their floating-point work, most first: each
    phase's products on the dtype's ``edges`` (:func:`benchmarks.cost.flop`; ``products`` by config),
    so that processes sharing the groups (``--claims``) do not end with one of them on a long group."""
    def work(group) -> int:
        config, dtype, group_phases = group
        return sum(cost.flop(products[config].problem, phase, edges[dtype]) for phase in group_phases)

    return sorted(groups, key=work, reverse=True)


def claim_path(folder, config: str, dtype: str, group: list[str]) -> pathlib.Path:
    """The file in ``folder`` whose creation claims the group of rows ``config``, ``dtype``, ``group``."""
    return pathlib.Path(folder) / f"{config}.{dtype}.{'+'.join(group)}".replace("/", "_")


def claim(folder, config: str, dtype: str, group: list[str]) -> bool:
    """Whether this process takes the group of rows ``config``, ``dtype``, ``group``: true for the
    first process to create its file in ``folder``, false for every other one."""
    pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(claim_path(folder, config, dtype, group), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def library_status(libraries) -> dict:
    """``{lib: {"status": "ok", "version": ...}}`` or ``{"status": "missing", "reason": ...}``."""
    status = {}
    for lib in libraries:
        try:
            status[lib] = {"status": "ok", "version": adapter(lib).version()}
        except Missing as error:
            status[lib] = {"status": "missing", "reason": str(error)}
        except Exception as error:  # a broken install is reported, not raised
            status[lib] = {"status": "missing", "reason": f"{type(error).__name__}: {error}"}
    return status


def default_out(device: str, smoke: bool) -> pathlib.Path:
    """``benchmarks/results/<device>/``; a smoke run's meaningless numbers go to a temp folder."""
    if smoke:
        return pathlib.Path(tempfile.gettempdir()) / "jax_cgtp-bench-smoke"
    return pathlib.Path(__file__).resolve().parent / "results" / environment.sanitize(device)


def _keeper(result: dict, meta: dict, out, tag: str):
    """A callback that puts one group's rows, as measured so far, into ``result`` and writes it."""
    first = len(result["rows"])

    def keep(rows):
        result["rows"][first:] = [dict(metrics.derive(row, meta["ceilings"]), run=0) for row in rows]
        meta["peak_bytes_in_use"] = environment.peak_memory()
        report.write(result, out, tag, with_plots=False)  # keep what is measured

    return keep


def main(argv=None) -> dict:
    """Run the benchmark, every call traced under ``--set``'s settings; returns the report (also
    written to disk)."""
    args = parse_args(argv)
    with jax_cgtp.config(**args.settings):
        return _run(args, argv)


def _run(args, argv) -> dict:
    jax.config.update("jax_enable_x64", True)

    edges = dict(configs.SMOKE_EDGES if args.smoke else configs.EDGES)
    edges["float32"] = args.edges_float32 or edges["float32"]
    edges["float64"] = args.edges_float64 or edges["float64"]
    protocol = {"warmup": args.warmup, "runs": args.runs or (configs.SMOKE_RUNS if args.smoke else configs.RUNS)}
    backend = args.backend or ("reference" if args.smoke else "auto")
    options = {"cueq_method": args.cueq_method, "graph": args.graph}

    meta = environment.describe()
    meta.update(argv=sys.argv if argv is None else ["benchmarks.run"] + list(argv), smoke=args.smoke,
                protocol=protocol, edges=edges, edges_per_node=configs.EDGES_PER_NODE, graph=args.graph,
                jax_cgtp_backend=backend, settings=args.set,
                tolerance=measure.TOLERANCE)
    print(f"device: {meta['device']} ({meta['platform']}), jax {meta['jax']}, commit {meta['git_commit']}", flush=True)
    meta["ceilings"] = ceilings.measure(args.dtype, args.smoke, protocol["warmup"], protocol["runs"])
    print(f"copy bandwidth {meta['ceilings']['copy']['bytes_per_s'] / 1e9:.1f} GB/s; matmul peak "
          + ", ".join(f"{d} {v['flop_per_s'] / 1e9:.1f} GFLOP/s" for d, v in meta["ceilings"]["matmul"].items()),
          flush=True)
    availability = library_status(args.libs)
    for lib, info in availability.items():
        print(f"  {lib}: {info.get('version') or 'MISSING: ' + info['reason']}", flush=True)

    result = {"schema": report.SCHEMA, "runs": [meta], "libraries": availability, "rows": []}
    out = args.out or default_out(meta["device"], args.smoke)
    meta["skipped"] = []
    start = time.monotonic()
    groups = measured_groups(args)
    products = {config: problems.build(config, backend=backend) for config, _, _ in groups}
    if args.claims is not None:
        groups = longest_first(groups, products, edges)
    for config, dtype, group in groups:
        if args.claims is not None and claim_path(args.claims, config, dtype, group).exists():
            continue  # another process measures it
        if args.time_budget is not None and time.monotonic() - start > args.time_budget:
            meta["skipped"].append(f"{config} {dtype} {','.join(group)}")
            print(f"time budget spent: skipping {meta['skipped'][-1]}", flush=True)
            continue
        if args.claims is not None and not claim(args.claims, config, dtype, group):
            continue
        keep = _keeper(result, meta, out, args.tag)
        keep(measure.measure_group(products[config], config, dtype, group, args.libs, availability,
                                   options, protocol, edges[dtype], keep=keep))

    paths = report.write(result, out, args.tag, with_plots=not args.no_plots)
    print()
    print(table.render(result))
    print("\nwrote " + ", ".join(paths.values()), flush=True)
    return result


if __name__ == "__main__":
    main()
