"""Velocity-Verlet molecular dynamics with the NequIP-style potential of ``potential.py``.

Structures come from ASE (a periodic water box of ~4,000 atoms and bulk fcc copper),
neighbour lists from matscipy (or ASE), forces from ``jax.grad`` of the energy. Each step

    v += dt/2 F/m;   r += dt v;   F = -dE/dr(r);   v += dt/2 F/m

runs as one jitted function on a padded graph built with a skin: the list is rebuilt (on the
host) only when an atom has moved more than half the skin, and the padded edge count stays
fixed, so the step never retraces. Prints the energy drift, steps per second, and the time per
step without the rebuilds.

    python examples/md.py --smoke                         # seconds on CPU
    python examples/md.py --system water --steps 1000     # 3,993 atoms, on a GPU
    python examples/md.py --system water --backend e3nn   # the same on e3nn-jax
    python examples/md.py --system water --devices 2      # each step's edges split across two GPUs

With ``--devices N`` the graph's edges are sharded over N devices (atoms replicated) and the same
jitted step runs on all of them: each convolution runs on each device's edges and sums the atoms'
rows over the devices (``jax_cgtp.sharding.partitioning``).
"""

from __future__ import annotations

import argparse
import time

import ase
import ase.build
import ase.units
import jax
import jax.numpy as jnp
import numpy as np
from ase.md import velocitydistribution
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
from tqdm import tqdm

import potential

WATER_MOLAR_MASS = 18.015  # g/mol


def water_box(molecules_per_side: int, density: float = 1.0, seed: int = 0) -> ase.Atoms:
    """``n^3`` randomly oriented water molecules on a cubic grid at ``density`` g/cm^3, periodic."""
    spacing = (WATER_MOLAR_MASS / ase.units.mol / density * 1e24) ** (1 / 3)  # Angstrom per molecule
    rng = np.random.default_rng(seed)
    box = ase.Atoms(cell=[molecules_per_side * spacing] * 3, pbc=True)
    for index in np.ndindex(molecules_per_side, molecules_per_side, molecules_per_side):
        molecule = ase.build.molecule("H2O")
        molecule.euler_rotate(*rng.uniform(0, 360, 3), center="COM")
        molecule.translate((np.array(index) + 0.5) * spacing - molecule.get_center_of_mass())
        box += molecule
    return box


def copper(repeat: int) -> ase.Atoms:
    return ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)


class NeighbourList:
    """A padded graph with a skin, rebuilt when an atom moves more than ``skin / 2``."""

    def __init__(self, atoms: ase.Atoms, cutoff: float, skin: float):
        self.atoms, self.radius, self.skin = atoms.copy(), cutoff + skin, skin
        self.capacity = None
        self.rebuilds = 0
        self.build_seconds = 0.0  # on the host, in every build so far

    def build(self, positions: np.ndarray):
        """``(wrapped positions, graph)``; wrapping moves atoms by lattice vectors only."""
        start = time.perf_counter()
        self.atoms.positions = positions
        self.atoms.wrap()
        self.reference = self.atoms.positions.copy()
        try:
            graph = potential.build_graph([self.atoms], self.radius, self.capacity)
        except ValueError:  # more edges than the padding holds: grow it (one retrace)
            graph = potential.build_graph([self.atoms], self.radius)
        self.capacity = graph.src.shape[0]
        self.rebuilds += 1
        self.build_seconds += time.perf_counter() - start
        return self.reference.copy(), graph

    def stale(self, positions: np.ndarray) -> bool:
        return float(np.max(np.linalg.norm(positions - self.reference, axis=-1))) > self.skin / 2


def place(graph: potential.Graph, devices: list) -> potential.Graph:
    """``graph`` with its edges (``src``, ``dst``, ``shifts``) split across ``devices`` (mesh axis
    ``edges``) and its atoms' arrays replicated; on one device, as it is."""
    if len(devices) == 1:
        return graph
    edges = graph.src.shape[0]
    if edges % len(devices):
        raise ValueError(f"--devices: {len(devices)} devices do not divide the {edges} padded edges")
    mesh = Mesh(np.array(devices), ("edges",), axis_types=(AxisType.Auto,))
    split, whole = NamedSharding(mesh, PartitionSpec("edges")), NamedSharding(mesh, PartitionSpec())
    return jax.device_put(graph, potential.Graph(species=whole, src=split, dst=split, shifts=split, batch=whole))


def thermalize(atoms: ase.Atoms, temperature: float) -> None:
    """Maxwell-Boltzmann velocities at ``temperature`` K, zero total momentum."""
    rng = np.random.default_rng(0)
    if hasattr(velocitydistribution, "thermalize_momenta"):  # ase >= 3.29
        velocitydistribution.thermalize_momenta(atoms, temperature, rng=rng)
    else:
        velocitydistribution.MaxwellBoltzmannDistribution(atoms, temperature_K=temperature, rng=rng)
    velocitydistribution.Stationary(atoms)


def make_step(model, params, masses):
    """One jitted velocity-Verlet step ``(r, v, F, graph, dt) -> (r, v, F, E_total)``; ``dt = 0``
    evaluates the initial forces with the same compiled function."""

    @jax.jit
    def step(r, v, f, graph, dt):
        v = v + 0.5 * dt * f / masses
        r = r + dt * v
        e, f = potential.energy_and_forces(model, params, r, graph)
        v = v + 0.5 * dt * f / masses
        return r, v, f, e + 0.5 * jnp.sum(masses * v**2)

    return step


def run(name: str, atoms: ase.Atoms, model, params, args, devices: list) -> dict:
    thermalize(atoms, args.temperature)
    neighbours = NeighbourList(atoms, model.cutoff, args.skin)
    positions, graph = neighbours.build(atoms.positions)
    graph = place(graph, devices)
    positions, velocities = jnp.asarray(positions), jnp.asarray(atoms.get_velocities())
    dtype = positions.dtype
    masses = jnp.asarray(atoms.get_masses(), dtype)[:, None]
    step = make_step(model, params, masses)
    dt = jnp.asarray(args.dt * ase.units.fs, dtype)
    positions, velocities, forces, total = step(positions, velocities, jnp.zeros_like(positions), graph, jnp.zeros((), dtype))
    totals = [total]
    start = None
    with tqdm(range(args.steps), desc=f"{name} ({len(atoms)} atoms)", disable=args.quiet) as bar:
        for n in bar:
            if n == 1:
                jax.block_until_ready(positions)
                start = time.perf_counter()  # steps/s excludes the first step (compilation)
                built_before = neighbours.build_seconds
            positions, velocities, forces, total = step(positions, velocities, forces, graph, dt)
            totals.append(total)
            if (n + 1) % args.check_every == 0:
                host = np.asarray(positions)
                if neighbours.stale(host):
                    positions, graph = neighbours.build(host)
                    positions, graph = jnp.asarray(positions), place(graph, devices)
                bar.set_postfix(E=f"{float(total):.4f} eV")
    jax.block_until_ready(positions)
    elapsed = time.perf_counter() - start if start is not None else float("nan")
    building = neighbours.build_seconds - built_before if start is not None else float("nan")
    totals = np.asarray([float(t) for t in totals])
    result = {
        "system": name,
        "atoms": len(atoms),
        "edges": int(np.sum(np.asarray(graph.src) < len(atoms))),
        "steps_per_s": (args.steps - 1) / elapsed if args.steps > 1 else float("nan"),
        # the time per step without the neighbour-list rebuilds in the timed steps (host code, matscipy or ASE)
        "step_ms": 1e3 * (elapsed - building) / (args.steps - 1) if args.steps > 1 else float("nan"),
        "build_s": building,
        "drift_mev_per_atom": 1e3 * (totals[-1] - totals[0]) / len(atoms),
        "max_dev_mev_per_atom": 1e3 * float(np.max(np.abs(totals - totals[0]))) / len(atoms),
        "rebuilds": neighbours.rebuilds,
        "devices": len(devices),
    }
    print(
        f"{name}: {result['atoms']} atoms, {result['edges']} edges on {len(devices)} device(s), "
        f"{args.steps} steps of {args.dt} fs, "
        f"{result['steps_per_s']:.1f} steps/s, energy drift {result['drift_mev_per_atom']:+.3g} meV/atom "
        f"(max deviation {result['max_dev_mev_per_atom']:.3g}), {result['rebuilds']} neighbour-list builds; "
        f"{result['step_ms']:.2f} ms per step without the rebuilds ({result['build_s']:.2f} s)"
    )
    return result


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    potential.add_model_arguments(parser)
    parser.add_argument("--system", choices=("water", "copper", "all"), default="all")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dt", type=float, default=0.5, help="time step in fs")
    parser.add_argument("--temperature", type=float, default=300.0, help="initial temperature in K")
    parser.add_argument("--skin", type=float, default=0.5, help="neighbour-list skin in Angstrom")
    parser.add_argument("--check-every", type=int, default=10, help="steps between neighbour-list checks")
    parser.add_argument("--water-side", type=int, default=11, help="molecules per box side (11: 3,993 atoms)")
    parser.add_argument("--copper-repeat", type=int, default=8, help="cubic cells per side (8: 2,048 atoms)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--devices", type=int, default=1, help="split each step's edges across the first N devices")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.water_side, args.copper_repeat, args.check_every = min(args.steps, 20), 2, 1, 5
    model = potential.model_from_arguments(args)
    devices = potential.select_devices(args.devices)
    builders = {"water": lambda: water_box(args.water_side), "copper": lambda: copper(args.copper_repeat)}
    systems = {name: builders[name]() for name in (("water", "copper") if args.system == "all" else (args.system,))}
    # The parameters do not depend on the structure: initialise once, on the smallest one.
    smallest = min(systems.values(), key=len)
    probe = potential.build_graph([smallest], model.cutoff)
    params = potential.init_params(model, jax.random.PRNGKey(0), jnp.asarray(smallest.positions), probe)
    return [run(name, atoms, model, params, args, devices) for name, atoms in systems.items()]


if __name__ == "__main__":
    main()
