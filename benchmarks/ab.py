"""``python -m benchmarks.ab``: jax_cgtp's kernels under several settings, timed in turn in one process.

A variant sets fields of :class:`jax_cgtp.Settings` for the calls it traces, e.g.::

    python -m benchmarks.ab --configs mace-l2-c128 --phases conv_fwd,conv_bwd --dtype float32 \\
        --variant base: --variant wide:walk_group_terms=2048 --rounds 6

For each row (config, phase, dtype: every one of ``--configs``, ``--phases`` and ``--dtype``, or those
``--rows config:phase:dtype,...`` names) the inputs are drawn once. Each variant's phase is compiled
under its settings (JAX's caches cleared first, so that it is traced anew; jax_cgtp's plans and
kernels are cached per settings), then the variants are timed in turn, ``--rounds`` times: each
round times every variant once (per-call ms of calls queued back to back, as ``benchmarks.run``
reports), so slow drifts of the device affect them alike. The table gives each variant's median
over rounds and its ratio to the first variant; ``--json`` keeps every round, with the run's device,
versions and commit (``benchmarks.environment.describe``).
"""

from __future__ import annotations

import argparse
import json
import statistics

import jax

import jax_cgtp

from . import configs, environment, timing
from .inputs import GRAPHS
from .profile import phase_and_arguments
from .run import _list, named_rows, take_rows
from .settings import parse_settings


def parse_variant(text: str) -> tuple[str, dict[str, object]]:
    """``NAME:name=VALUE;...`` -> ``(NAME, {name: value})``; VALUE is a Python literal.

    >>> parse_variant("wide:walk_group_terms=2048")
    ('wide', {'walk_group_terms': 2048})
    """
    name, colon, settings = text.partition(":")
    if not name or not colon:
        raise ValueError(f"--variant {text!r}: expected NAME:name=VALUE;... (NAME: for no change)")
    return name, parse_settings(settings)


def _compile_with(settings, fn, args):
    """``fn`` traced and compiled for ``args`` under ``settings``."""
    with jax_cgtp.config(**settings):
        jax.clear_caches()
        return timing.compile_function(fn, args)


def measure_row(config: str, phase: str, dtype: str, variants, rounds: int, calls: int, lib: str,
                edges: int | None = None, graph: str = "random", shared_weights: bool = False) -> dict:
    """Per-round per-call ms of each variant on one row (``edges`` edges, default the benchmark's
    size for the dtype; a convolution on ``graph``; one row of weights with ``shared_weights``),
    and how many distinct programs the variants compiled to."""
    edges = edges or configs.EDGES[dtype]
    fn, args = phase_and_arguments(config, phase, dtype, edges, lib=lib, graph=graph, shared_weights=shared_weights)
    compiled = {name: _compile_with(settings, fn, args) for name, settings in variants}
    texts = {name: c.as_text() for name, c in compiled.items()}
    for c in compiled.values():  # warm up
        jax.block_until_ready(c(*args))
    samples = {name: [] for name in compiled}
    for _ in range(rounds):
        for name, c in compiled.items():
            samples[name].append(timing.time_pipelined(c, args, timing.PIPELINE_BATCHES, calls))
    return {"config": config, "phase": phase, "dtype": dtype, "lib": lib, "edges": edges, "graph": graph,
            "shared_weights": shared_weights, "distinct_programs": len(set(texts.values())), "ms": samples}


def format_table(rows, names) -> str:
    header = ["config", "phase", "dtype", "programs"] + [f"{n} ms" for n in names] + [f"{n}/{names[0]}" for n in names[1:]]
    lines = []
    for row in rows:
        medians = [statistics.median(row["ms"][n]) for n in names]
        lines.append([row["config"], row["phase"], row["dtype"], str(row["distinct_programs"])]
                     + [f"{m:.3f}" for m in medians] + [f"{m / medians[0]:.3f}" for m in medians[1:]])
    widths = [max(len(r[k]) for r in [header] + lines) for k in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in [header] + lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", type=_list, default=None)
    parser.add_argument("--phases", type=_list, default=None)
    parser.add_argument("--dtype", type=_list, default=None, help="default float32")
    parser.add_argument("--rows", type=_list, default=None, metavar="CONFIG:PHASE:DTYPE,...",
                        help="these rows alone, in this order (instead of --configs, --phases and --dtype)")
    parser.add_argument("--variant", action="append", required=True, help="NAME:name=VALUE;... (repeat; jax_cgtp.Settings fields)")
    parser.add_argument("--lib", default="jax_cgtp", choices=["jax_cgtp", "jax_cgtp_det", "jax_cgtp_graph"],
                        help="jax_cgtp_det: the deterministic convolution; jax_cgtp_graph: the atomic one given a sorted graph")
    parser.add_argument("--edges", type=int, default=None, help="default: the benchmark's size for the dtype")
    parser.add_argument("--graph", default="random", choices=GRAPHS, help="the convolution's graph (benchmarks.inputs)")
    parser.add_argument("--shared-weights", action="store_true", help="one row of weights for every edge")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=timing.PIPELINE_CALLS, help="calls per queued batch")
    parser.add_argument("--json", default=None, help="write every round's times here (again after each row)")
    args = parser.parse_args(argv)
    if args.rows is not None:
        take_rows(parser, args, ("configs", "phases", "dtype"))
    elif args.configs is None or args.phases is None:
        parser.error("give --configs and --phases, or --rows")
    args.dtype = args.dtype or ["float32"]
    jax.config.update("jax_enable_x64", True)
    try:
        variants = [parse_variant(v) for v in args.variant]
    except (ValueError, SyntaxError) as error:
        parser.error(f"--variant: {error}")
    names = [name for name, _ in variants]
    if len(set(names)) != len(names):
        parser.error(f"--variant names must differ, got {names}")
    rows, run = [], environment.describe()  # the device, versions, commit and start time of the run
    for config, phase, dtype in named_rows(args):
        rows.append(measure_row(config, phase, dtype, variants, args.rounds, args.calls, args.lib, args.edges,
                                args.graph, args.shared_weights))
        print(format_table(rows[-1:], names).splitlines()[-1], flush=True)
        if args.json:  # after every row, so that a run stopped by a time limit keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"variants": args.variant, "run": run, "rows": rows}, f, indent=1)
    print(format_table(rows, names))
    return rows


if __name__ == "__main__":
    main()
