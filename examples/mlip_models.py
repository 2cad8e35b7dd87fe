"""InstaDeep's mlip models on jax_cgtp: the same model, the same parameters, energies and forces
equal to the original, a faster step.

mlip's ``models_v1`` (NequIP, MACE) build their message passing on e3nn-jax. Run on jax_cgtp, the
only change is where the model is traced::

    with jax_cgtp.replacing_e3nn():
        force_field = ForceField.init(predictor, seed=0)     # or an mlip model loaded from disk
        step = jax.jit(force_field.predict)
        step(graph)                                          # traced here: jax_cgtp's products

For each model and system this script times, with e3nn-jax (``models_v1`` as shipped), with
jax_cgtp (the same model and parameters under :func:`jax_cgtp.replacing_e3nn`) and, with
``--routes e3nn,jax_cgtp,e3j``, mlip's e3j models (``mlip.models``: the same architecture and sizes
on InstaDeep's e3j, its CUDA kernels where ``e3j_ops`` is installed; its own parameters, so its
results are not compared):

* the MD step: energy and forces (mlip's predictor);
* the training step: the gradient w.r.t. the parameters of an energy and force loss (second
  derivatives of the model);

each jitted and warmed up, the median of ``--runs`` calls, with XLA's temporary memory of the
compiled step, and checks that jax_cgtp's energies, forces and gradients equal e3nn-jax's
(float64: 1e-10, float32: 1e-5, relative). Systems: a periodic water box and bulk copper (5 Å
cutoff; ~4,000 atoms each at the default sizes).

    python examples/mlip_models.py --smoke        # seconds on a CPU: small models and systems
    python examples/mlip_models.py                # NequIP (4 layers, 64 channels, l_max 2) and
                                                  # MACE (2 layers, 128 channels, l_max 2, correlation 3)
"""

from __future__ import annotations

import argparse
import contextlib
import time

import ase
import jax
import jax.numpy as jnp
import numpy as np

import jax_cgtp
import md

MIB = 2**20
TOLERANCE = {"float32": 1e-5, "float64": 1e-10}


def models(args, route: str):
    """``{name: (network class, config)}``: mlip's ``models_v1`` (e3nn-jax) for the ``e3nn`` and
    ``jax_cgtp`` routes, mlip's ``models`` (e3j) for the ``e3j`` route, with the same sizes."""
    channels = args.channels
    nequip_irreps = f"{channels}x0e+{channels}x0o+{channels // 2}x1o+{channels // 2}x1e+{channels // 4}x2e+{channels // 4}x2o"
    if route == "e3j":
        from mlip.models import Mace, Nequip

        nequip = Nequip.Config(num_layers=args.nequip_layers, target_irreps=nequip_irreps, l_max=2)
    else:
        from mlip.models_v1 import Mace, Nequip

        nequip = Nequip.Config(num_layers=args.nequip_layers, node_irreps=nequip_irreps, l_max=2)
    return {
        "nequip": (Nequip, nequip),
        "mace": (Mace, Mace.Config(num_layers=2, num_channels=args.mace_channels, l_max=2, correlation=3)),
    }


def systems(args) -> dict[str, ase.Atoms]:
    return {"water": md.water_box(args.water_side), "copper": md.copper(args.copper_repeat)}


def graph_of(atoms: ase.Atoms, cutoff: float):
    from mlip.data import ChemicalSystem
    from mlip.graph import Graph

    return Graph.from_chemical_system(ChemicalSystem.from_ase_atoms(atoms), graph_cutoff_angstrom=cutoff)


def force_field(network, config, atoms: ase.Atoms, graph, cutoff: float, dtype, route: str):
    """``(predictor, params)`` of an mlip network for ``atoms``' species, its parameters cast to
    ``dtype``: mlip's conservative predictor (energy, forces as its gradient)."""
    from mlip.data import DatasetInfo
    from mlip.models import ForceField
    from mlip.models.predictors import ConservativePredictor
    from mlip.models_v1 import ForceFieldPredictorV1
    from mlip.typing.properties import Properties

    species = sorted(set(int(z) for z in atoms.numbers))
    info = DatasetInfo(atomic_energies_map={z: 0.0 for z in species}, graph_cutoff_angstrom=cutoff,
                       avg_num_neighbors=float(len(graph.senders)) / len(atoms), avg_r_min_angstrom=1.0)
    predictor_class = ConservativePredictor if route == "e3j" else ForceFieldPredictorV1
    predictor = predictor_class(mlip_network=network(config=config, dataset_info=info), required_properties=Properties())
    params = ForceField.init(predictor, seed=0).params
    return predictor, jax.tree.map(lambda p: p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p, params)


def workloads(predictor):
    """The MD step (energy, forces) and the training step (gradients of an energy and force loss)."""

    def md_step(params, graph):
        prediction = predictor.apply(params, graph).to_prediction()
        return prediction.energy, prediction.forces

    def loss(params, graph):
        energy, forces = md_step(params, graph)
        return jnp.mean(energy**2) + jnp.mean(forces**2)

    def train_step(params, graph):
        return jax.grad(loss)(params, graph)

    return {"md": md_step, "train": train_step}


def compile_and_time(fn, args, runs: int) -> dict:
    """``fn`` jitted, compiled, warmed up twice; the median of ``runs`` blocking calls."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    result = jax.block_until_ready(compiled(*args))
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    memory = compiled.memory_analysis()
    return {"ms": 1e3 * float(np.median(times)), "compile_s": compile_s,
            "temp_mib": memory.temp_size_in_bytes / MIB if memory else None, "result": result}


def relative_error(a, b) -> float:
    a, b = (np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(t)]) for t in (a, b))
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


ROUTES = {"e3nn": contextlib.nullcontext, "jax_cgtp": jax_cgtp.replacing_e3nn, "e3j": contextlib.nullcontext}


def run(args) -> list[dict]:
    dtype = jnp.dtype(args.dtype)
    rows = []
    for system, atoms in systems(args).items():
        graph = graph_of(atoms, args.cutoff)
        graph = graph.replace_nodes(positions=jnp.asarray(graph.nodes.positions, dtype))
        for model_name in args.models:
            measured = {}
            for route in args.routes:
                network, config = models(args, route)[model_name]
                predictor, params = force_field(network, config, atoms, graph, args.cutoff, dtype, route)
                for workload, fn in workloads(predictor).items():
                    with ROUTES[route]():  # traced (and so bound to its products) inside the block
                        measured[workload, route] = compile_and_time(fn, (params, graph), args.runs)
            for (workload, route), result in measured.items():
                base = measured.get((workload, "e3nn"))
                row = {"system": system, "atoms": len(atoms), "edges": int(len(graph.senders)), "model": model_name,
                       "workload": workload, "route": route, "dtype": args.dtype,
                       **{k: v for k, v in result.items() if k != "result"}}
                if base is not None:
                    row["speedup"] = base["ms"] / result["ms"]
                if base is not None and route != "e3j":  # e3j's model has its own parameters
                    row["error"] = relative_error(result["result"], base["result"])
                rows.append(row)
                print(format_row(row), flush=True)
    return rows


def format_row(row: dict) -> str:
    text = (f"{row['system']:7s} {row['atoms']:5d} atoms {row['edges']:7d} edges  {row['model']:6s} {row['workload']:5s} "
            f"{row['route']:9s} {row['ms']:9.2f} ms  temp {row['temp_mib']:8.1f} MiB")
    if "speedup" in row:
        text += f"  x{row['speedup']:.2f} e3nn-jax"
    if "error" in row:
        text += f"  rel. error {row['error']:.1e}"
    return text


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="nequip,mace", type=lambda s: s.split(","))
    parser.add_argument("--routes", default="e3nn,jax_cgtp", type=lambda s: s.split(","),
                        help=f"comma-separated, of {', '.join(ROUTES)}")
    parser.add_argument("--dtype", default="float32", choices=sorted(TOLERANCE))
    parser.add_argument("--water-side", type=int, default=11, help="molecules per side (11: 3,993 atoms)")
    parser.add_argument("--copper-repeat", type=int, default=10, help="fcc cells per side (10: 4,000 atoms)")
    parser.add_argument("--cutoff", type=float, default=5.0)
    parser.add_argument("--channels", type=int, default=64, help="NequIP's scalar channels")
    parser.add_argument("--nequip-layers", type=int, default=4)
    parser.add_argument("--mace-channels", type=int, default=128)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="small models and systems, 2 runs (CI)")
    args = parser.parse_args(argv)
    unknown = [r for r in args.routes if r not in ROUTES] + [m for m in args.models if m not in ("nequip", "mace")]
    if unknown:
        parser.error(f"unknown model or route {unknown}; models nequip, mace; routes {', '.join(ROUTES)}")
    if args.smoke:
        args.water_side, args.copper_repeat, args.channels, args.nequip_layers = 2, 2, 8, 2
        args.mace_channels, args.runs, args.cutoff = 8, 2, 4.0
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    rows = run(args)
    bad = [row for row in rows if row.get("error", 0.0) > TOLERANCE[args.dtype]]
    if bad:
        raise SystemExit(f"{len(bad)} rows differ from e3nn-jax beyond {TOLERANCE[args.dtype]}: "
                         + "; ".join(format_row(row) for row in bad))
    return rows


if __name__ == "__main__":
    main()
