"""``python -m benchmarks.edge_sharding``: a convolution on one GPU, and its edges split across all of them.

For each config, phase and dtype, one graph (the table's: ``E`` edges, ``E // 16`` nodes, int32) and
the same phase function as the table (:mod:`benchmarks.phases`), jitted three ways:

* ``one``: every array on the first device;
* ``split``: the edge arrays (``y``, ``w``, ``src``, ``dst``) sharded over all devices (mesh axis
  ``edges``, AxisType.Auto), node arrays replicated: each device runs the kernels on its edges and
  the node outputs are summed over the devices (:mod:`jax_cgtp.sharding.partitioning`);
* ``whole``: the same placement lowered with ``JAX_CGTP_PARTITIONING=0``: XLA gathers the edges
  onto every device and runs each call whole there (what any custom call without a rule gets).

Per-call milliseconds with calls queued back to back (:mod:`benchmarks.timing`), the ratios
``one / split`` and ``whole / split``, the all-gathers in each executable and its arrays that hold
every edge's rows (leading dimension ``E``), and the largest relative difference of ``split``'s
results from ``one``'s. The sums over devices cost ``split`` what one device does not pay: the
megabytes its all-reduces carry (from its HLO), and the milliseconds of one all-reduce of that many
bytes alone, timed the same way, bound what splitting can gain.

Example: ``python -m benchmarks.edge_sharding --configs mace-l2-c128 --dtype float32``.
"""

from __future__ import annotations

import argparse
import json
import re

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jax_cgtp.sharding.partitioning import switched

from . import configs, phases, problems
from .inputs import make_inputs
from .timing import compile_function, per_call_ms, time_compiled

EDGE_ARRAYS = ("y", "w", "src", "dst")
ALL_REDUCE = re.compile(r"= \(?((?:[a-z]+[0-9]*\[[0-9,]*\][^ ]*(?:, )?)+)\)? all-reduce(?:-start)?\(")
BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "s32": 4, "s64": 8}


def all_reduced_bytes(executable: str) -> int:
    """Bytes the all-reduces of a compiled executable's HLO text carry (each result's size)."""
    total = 0
    for results in ALL_REDUCE.findall(executable):
        for kind, dims in re.findall(r"([a-z]+[0-9]*)\[([0-9,]*)\]", results):
            total += BYTES[kind] * int(np.prod([int(d) for d in dims.split(",") if d]))
    return total


def all_reduce_ms(mesh: Mesh, nbytes: int, runs: int, warmup: int) -> float:
    """Milliseconds of one all-reduce (a sum over the mesh) of ``nbytes`` of float32 on every device."""
    if nbytes == 0:
        return 0.0
    rows = jax.device_put(np.ones((len(mesh.devices), -(-nbytes // 4)), np.float32),
                          NamedSharding(mesh, PartitionSpec("edges")))
    total = jax.jit(lambda a: a.sum(axis=0), out_shardings=NamedSharding(mesh, PartitionSpec()))
    compiled = compile_function(total, [rows])
    return per_call_ms(time_compiled(compiled, [rows], warmup, runs))


def _compiled(fun, args, partitioning: bool):
    """``fun`` compiled for ``args`` with the rule on or off; through a fresh function, since JAX
    would reuse a lowering of ``fun`` made the other way for arguments placed alike."""
    with switched(partitioning):
        return compile_function(lambda *a: fun(*a), args)


def measure(config: str, phase: str, dtype: str, edges: int, runs: int, warmup: int) -> dict:
    """The row of one config, phase and dtype (see the module's docstring)."""
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("edges",), axis_types=(AxisType.Auto,))
    split = {True: NamedSharding(mesh, PartitionSpec("edges")), False: NamedSharding(mesh, PartitionSpec())}
    conv = problems.conv_of(problems.build(config))
    inputs = make_inputs(conv.problem, dtype, edges, conv=True)
    fun = phases.phase_function(phase, lambda x, y, w, src, dst: conv(x, y, w, src, dst, num_nodes=inputs.nodes))
    names = phases.input_names(phase)
    on_one = [jax.device_put(getattr(inputs, n), devices[0]) for n in names]
    on_all = [jax.device_put(getattr(inputs, n), split[n in EDGE_ARRAYS]) for n in names]
    row = {"config": config, "phase": phase, "dtype": dtype, "edges": edges, "nodes": inputs.nodes,
           "devices": [str(d) for d in devices]}
    results = {}
    for way, args, partitioning in (("one", on_one, True), ("split", on_all, True), ("whole", on_all, False)):
        compiled = _compiled(fun, args, partitioning)
        results[way] = compiled(*args)
        row[f"{way}_ms"] = per_call_ms(time_compiled(compiled, args, warmup, runs))
        executable = compiled.as_text()
        row[f"{way}_all_gathers"] = len(re.findall(r"all-gather(-start)?\(", executable))
        row[f"{way}_all_edge_arrays"] = len(re.findall(rf"\[{edges},", executable))
        if way == "split":
            all_reduced = all_reduced_bytes(executable)
    row["split_all_reduce_mb"] = all_reduced / 1e6
    row["all_reduce_ms"] = all_reduce_ms(mesh, all_reduced, runs, warmup)
    leaves = jax.tree_util.tree_leaves
    row["split_vs_one"] = max(float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))
                              for a, b in zip(jax.device_get(leaves(results["split"])),
                                              jax.device_get(leaves(results["one"]))))
    row["one_over_split"] = row["one_ms"] / row["split_ms"]
    row["whole_over_split"] = row["whole_ms"] / row["split_ms"]
    return row


def table(rows: list[dict]) -> str:
    lines = [f"{len(rows[0]['devices'])} devices: {', '.join(rows[0]['devices'])}" if rows else "",
             "| config | phase | dtype | edges | one ms | split ms | whole ms | one / split | whole / split "
             "| all-gathers (split, whole) | arrays of all edges (split, whole) | all-reduced MB (split) "
             "| all-reduce alone ms | max rel. diff |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['phase']} | {r['dtype']} | {r['edges']} | {r['one_ms']:.3f} | "
                     f"{r['split_ms']:.3f} | {r['whole_ms']:.3f} | {r['one_over_split']:.2f}x | "
                     f"{r['whole_over_split']:.2f}x | {r['split_all_gathers']}, {r['whole_all_gathers']} | "
                     f"{r['split_all_edge_arrays']}, {r['whole_all_edge_arrays']} | "
                     f"{r['split_all_reduce_mb']:.1f} | {r['all_reduce_ms']:.3f} | {r['split_vs_one']:.1e} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="mace-l2-c128,nequip-lips")
    parser.add_argument("--phases", default="conv_fwd,conv_bwd,conv_dbwd")
    parser.add_argument("--dtype", default="float32,float64")
    parser.add_argument("--edges", type=int, default=0, help="edges (default: the table's for the dtype)")
    parser.add_argument("--runs", type=int, default=configs.RUNS)
    parser.add_argument("--warmup", type=int, default=configs.WARMUP)
    parser.add_argument("--out", default="", help="write the rows to OUT.json and the table to OUT.txt")
    args = parser.parse_args(argv)
    if len(jax.devices()) < 2:
        raise SystemExit(f"edge_sharding needs two devices or more; JAX sees {jax.devices()}")
    if "float64" in args.dtype.split(","):
        jax.config.update("jax_enable_x64", True)
    rows = []
    for dtype in args.dtype.split(","):
        for config in args.configs.split(","):
            for phase in args.phases.split(","):
                rows.append(measure(config, phase, dtype, args.edges or configs.EDGES[dtype], args.runs, args.warmup))
                print(json.dumps(rows[-1]), flush=True)
                if args.out:  # after every row, so that a run stopped early keeps its rows
                    with open(f"{args.out}.json", "w") as f:
                        json.dump(rows, f, indent=1)
                    with open(f"{args.out}.txt", "w") as f:
                        f.write(table(rows) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
