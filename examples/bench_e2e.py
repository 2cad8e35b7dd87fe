"""End-to-end benchmark: one MD step and one training step of the same NequIP-style model,
jax_cgtp vs e3nn-jax (the potential's ``backend="e3nn"`` switch: same parameters) and, when
cuequivariance-jax is installed, vs the model with its convolutions on cuEquivariance
(``backend="cueq"``).

* MD step: velocity Verlet with energy + forces (``md.make_step``) on the periodic water box
  (3,993 atoms at the default size).
* training step: Adam on energy + force loss (second derivatives, ``train.make_train_step``)
  on a batch of perturbed copper cells labelled by EMT.

``--devices N`` splits the MD step's edges across the first N devices (``md.place``; the training
step stays on one), so that the step's time on N GPUs can be read against one's.

For each pair it prints the compile time, the median step time, XLA's memory plan of the
compiled step (arguments + outputs + temporaries) and, on a GPU, the device's peak bytes in
use. Each measurement runs in its own process so the peaks do not mix (``--inline`` runs
them in this process, e.g. for a quick CPU check). The last columns compare with e3nn-jax.
``--profile N`` also traces the timed steps with ``jax.profiler`` and lists the N XLA ops with
the most device time per step (on a CPU, the time of the ops' thunks), each with its
custom-call target: where a step's time goes, kernel by kernel.

    python examples/bench_e2e.py --smoke --inline       # seconds on CPU
    python examples/bench_e2e.py                        # on the GPU: the table for the README
"""

from __future__ import annotations

import argparse
import collections
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import md
import potential
import train

MIB = 2**20


def md_workload(model, args):
    atoms = md.water_box(args.water_side)
    md.thermalize(atoms, 300.0)
    graph = potential.build_graph([atoms], model.cutoff)
    positions = jnp.asarray(atoms.positions)
    params = potential.init_params(model, jax.random.PRNGKey(0), positions, graph)
    graph = md.place(graph, potential.select_devices(args.devices))
    step = md.make_step(model, params, jnp.asarray(atoms.get_masses(), positions.dtype)[:, None])
    velocities = jnp.asarray(atoms.get_velocities(), positions.dtype)
    dt = jnp.asarray(0.5 * md.ase.units.fs, positions.dtype)
    inputs = (positions, velocities, jnp.zeros_like(positions), graph, dt)
    return step, inputs, len(atoms), int(jnp.sum(graph.src < len(atoms))), lambda out: float(out[3])


def train_workload(model, args):
    structures = train.perturbed_copper(args.batch_size, args.copper_repeat, 0.1, 0.03)
    (batch,) = train.make_batches(structures, args.batch_size, model.cutoff)
    params = potential.init_params(model, jax.random.PRNGKey(0), batch.positions, batch.graph)
    optimizer = optax.adam(1e-3)
    step = train.make_train_step(model, optimizer, force_weight=10.0)
    atoms = batch.positions.shape[0]
    edges = int(jnp.sum(batch.graph.src < atoms))
    return step, (params, optimizer.init(params), batch), atoms, edges, lambda out: float(out[2])


WORKLOADS = {"md": md_workload, "train": train_workload}


def measure(workload: str, backend: str, args) -> dict:
    """Compile and time one (workload, backend) pair in this process."""
    args.backend = backend
    model = potential.model_from_arguments(args)
    step, inputs, atoms, edges, scalar = WORKLOADS[workload](model, args)
    start = time.perf_counter()
    compiled = step.lower(*inputs).compile()
    output = jax.block_until_ready(compiled(*inputs))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(args.iters):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*inputs))
        times.append(time.perf_counter() - start)
    plan = compiled.memory_analysis()
    planned = None if plan is None else (
        plan.argument_size_in_bytes + plan.output_size_in_bytes + plan.temp_size_in_bytes - plan.alias_size_in_bytes
    )
    stats = jax.devices()[0].memory_stats() or {}
    profile = op_profile(compiled, inputs, args.iters, args.profile) if args.profile else None
    return {
        "workload": workload, "backend": backend, "device": jax.devices()[0].device_kind,
        "devices": args.devices if workload == "md" else 1,
        "atoms": atoms, "edges": edges, "compile_s": compile_s,
        "step_ms": 1e3 * float(np.median(times)), "planned_bytes": planned,
        "peak_bytes": stats.get("peak_bytes_in_use"), "value": scalar(output), "profile": profile,
    }


def op_profile(compiled, inputs, iters: int, top: int) -> list[dict]:
    """The ``top`` XLA ops of ``compiled`` by traced time per step: ``{op, target, shape, grid,
    calls, ms}`` (``shape``: the op's result; ``grid``: a jax_cgtp launch's blocks).

    Events are read from the trace's device plane (the host plane without a GPU) by their
    ``hlo_op`` stat; ``target`` is the op's custom-call target, or the op's kind otherwise."""
    from jax.profiler import ProfileData

    folder = tempfile.mkdtemp(prefix="bench_e2e_profile_")
    with jax.profiler.trace(folder):
        for _ in range(iters):
            jax.block_until_ready(compiled(*inputs))
    (path,) = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    planes = list(ProfileData.from_file(path).planes)
    device = [p for p in planes if p.name.startswith("/device:GPU")] or [p for p in planes if p.name == "/host:CPU"]
    calls, nanoseconds = collections.Counter(), collections.Counter()
    for plane in device:
        for line in plane.lines:
            for event in line.events:
                op = dict(event.stats).get("hlo_op")
                if op and not event.name.startswith("end: "):
                    calls[op] += 1
                    nanoseconds[op] += event.duration_ns
    hlo = compiled.as_text()
    rows = []
    for op, total in nanoseconds.most_common(top):
        line = re.search(rf"%?{re.escape(op)} = [^\n]*", hlo)
        text = line.group(0) if line else ""
        target = re.search(r'custom_call_target="([^"]+)"', text)
        kind = re.search(r"= (.*?) ([\w-]+)\(", text)
        grid = re.search(r"grid = (\d+)", text)
        rows.append({"op": op, "target": target.group(1) if target else (kind.group(2) if kind else "?"),
                     "shape": kind.group(1) if kind else "?", "grid": int(grid.group(1)) if grid else None,
                     "calls": calls[op] / iters, "ms": total / iters / 1e6})
    return rows


def measure_isolated(workload: str, backend: str, argv: list[str]) -> dict:
    """:func:`measure` in a fresh process, so the device's peak memory is this pair's alone."""
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    command = [sys.executable, __file__, *argv, "--worker", f"{workload}:{backend}"]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{workload}/{backend} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def table(results: list[dict], reference: str = "e3nn") -> str:
    def mib(value):
        return "n/a" if value is None else f"{value / MIB:.1f}"

    lines = [
        "| workload | atoms | edges | backend | compile s | step ms | XLA plan MiB | peak MiB | speedup vs e3nn | memory vs e3nn |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        base = next((b for b in results if b["workload"] == r["workload"] and b["backend"] == reference), None)
        speedup = f"{base['step_ms'] / r['step_ms']:.2f}x" if base else "n/a"
        key = "peak_bytes" if r["peak_bytes"] is not None else "planned_bytes"
        memory = f"{r[key] / base[key]:.2f}" if base and r[key] and base[key] else "n/a"
        workload = r["workload"] + (f" on {r['devices']} devices" if r["devices"] > 1 else "")
        lines.append(
            f"| {workload} | {r['atoms']} | {r['edges']} | {r['backend']} | {r['compile_s']:.1f} | "
            f"{r['step_ms']:.2f} | {mib(r['planned_bytes'])} | {mib(r['peak_bytes'])} | {speedup} | {memory} |"
        )
    return "\n".join(lines)


def profile_table(result: dict) -> str:
    """The ops of one (workload, backend) pair with the most traced time per step."""
    lines = [f"{result['workload']} on {result['backend']}: ops by traced time per step (step {result['step_ms']:.2f} ms)",
             f"{'ms/step':>9} {'calls':>6}  op (custom-call target or kind; grid) result"]
    for row in result["profile"]:
        grid = f"; grid {row['grid']}" if row["grid"] is not None else ""
        lines.append(f"{row['ms']:9.3f} {row['calls']:6.1f}  {row['op']} ({row['target']}{grid}) {row['shape']}")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    potential.add_model_arguments(parser)
    default_backends = "auto,cueq,e3nn" if importlib.util.find_spec("cuequivariance_jax") else "auto,e3nn"
    parser.add_argument("--backends", default=default_backends,
                        help="comma-separated: auto, reference, cuda, e3nn, cueq (default: %(default)s)")
    parser.add_argument("--workloads", default="md,train")
    parser.add_argument("--water-side", type=int, default=11, help="molecules per box side (11: 3,993 atoms)")
    parser.add_argument("--copper-repeat", type=int, default=3, help="cubic cells per side (3: 108 atoms)")
    parser.add_argument("--batch-size", type=int, default=8, help="copper structures per training batch")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--devices", type=int, default=1,
                        help="split the MD step's edges across the first N devices (the training step runs on one)")
    parser.add_argument("--inline", action="store_true", help="measure in this process (peaks mix)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also list the N ops with the most traced time per step")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.water_side, args.copper_repeat, args.batch_size, args.iters = 2, 1, 2, min(args.iters, 3)
    if args.worker:
        workload, backend = args.worker.split(":")
        print("RESULT " + json.dumps(measure(workload, backend, args)), flush=True)
        return []
    pairs = [(w, b) for w in args.workloads.split(",") for b in args.backends.split(",")]
    for workload, backend in pairs:
        if workload not in WORKLOADS or backend not in potential.jax_cgtp.flax.MODULE_BACKENDS:
            parser.error(f"unknown workload {workload!r} or backend {backend!r}")
    results = []
    for workload, backend in pairs:
        result = measure(workload, backend, args) if args.inline else measure_isolated(workload, backend, argv)
        print(f"{workload:>5} {backend:>9}: {result['step_ms']:.2f} ms/step (value {result['value']:.6g})", flush=True)
        results.append(result)
    print(f"\ndevice: {results[0]['device']}; model: channels {args.channels if not args.smoke else 4}, "
          f"lmax {args.lmax if not args.smoke else 1}, layers {args.layers if not args.smoke else 1}\n")
    print(table(results))
    for result in results:
        if result["profile"]:
            print("\n" + profile_table(result))
    return results


if __name__ == "__main__":
    main()
