"""A NequIP-style interatomic potential in Flax, with its convolutions on jax_cgtp.

    E = sum_i scale * e_i + shift[Z_i],   F = -dE/dr

Each atom starts from a linear embedding of its one-hot species. Each interaction layer is
NequIP's: self-interaction (``e3nn.flax.Linear``), the convolution
``m_i = 1/avg * sum_{j in N(i)} T(h_j, Y(r_ij), R(|r_ij|))`` (``jax_cgtp.flax.TensorProductConv``:
spherical harmonics ``Y`` of the edge vector, Bessel basis x polynomial envelope through an
MLP ``R`` for the per-edge weights), a linear mix, a species-dependent self-connection
(``jax_cgtp.flax.FullyConnectedTensorProduct``) and e3nn's gated nonlinearity. The atomic
energy ``e_i`` is an MLP of the final scalars.

``backend="e3nn"`` runs the identical model (same parameters) with e3nn-jax's tensor products;
``backend="cueq"`` runs it with cuequivariance-jax where cuEquivariance fits: the convolutions
(``uvu``, its ``uniform_1d`` kernels on a GPU), while the ``uvw`` self-connection, which those
kernels cannot run, stays on e3nn-jax.
Graphs are padded to a fixed number of edges (padding edges index atom ``N``, outside the
node range, and contribute nothing), so a jitted step does not retrace when neighbours change.

    python examples/potential.py --smoke          # a few seconds on CPU
    python examples/potential.py --backend e3nn   # the same model on e3nn-jax
    python examples/potential.py --backend cueq   # its convolutions on cuequivariance-jax
"""

from __future__ import annotations

import argparse
import time
from typing import NamedTuple, Sequence

import ase
import ase.build
import e3nn_jax as e3nn
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import jax_cgtp.flax

SPECIES = (1, 8, 29)  # H, O, Cu: the elements of the examples, by atomic number


class Graph(NamedTuple):
    """A padded neighbour graph: edge ``e`` sends from atom ``src[e]`` to atom ``dst[e]``
    along ``r[src] - r[dst] + shifts[e]`` (``shifts``: cartesian periodic-image offsets).
    Padding edges have ``src = dst = N``. ``batch[i]`` is atom i's structure."""

    species: jax.Array  # (N,) int32 index into SPECIES
    src: jax.Array  # (E,) int32
    dst: jax.Array  # (E,) int32
    shifts: jax.Array  # (E, 3)
    batch: jax.Array  # (N,) int32


def neighbour_list(atoms: ase.Atoms, cutoff: float):
    """``(i, j, D_shift)``: pairs within ``cutoff`` (matscipy if installed, else ASE), with
    ``r_j - r_i + D_shift`` the pair vector."""
    try:
        from matscipy.neighbours import neighbour_list as build
    except ImportError:  # pragma: no cover - matscipy is a dev dependency
        from ase.neighborlist import neighbor_list as build
    i, j, shift = build("ijS", atoms, cutoff)
    return i, j, shift @ np.asarray(atoms.cell)


def edge_capacity(num_edges: int, slack: float = 1.15) -> int:
    """A padded edge count with room for ``slack`` more edges, rounded up to 256."""
    return int(-(-int(num_edges * slack) // 256) * 256) or 256


def species_index(numbers) -> np.ndarray:
    numbers = np.asarray(numbers)
    unknown = sorted(set(numbers.tolist()) - set(SPECIES))
    if unknown:
        raise ValueError(f"atoms: elements {unknown} are not in the model's SPECIES {SPECIES}")
    return np.searchsorted(SPECIES, numbers).astype(np.int32)


def build_graph(structures: Sequence[ase.Atoms], cutoff: float, capacity: int | None = None) -> Graph:
    """One disjoint graph of all ``structures`` (atoms concatenated), padded to ``capacity`` edges.

    Raises ``ValueError`` if the edges do not fit; ``capacity=None`` picks :func:`edge_capacity`.
    """
    src, dst, shifts, offset = [], [], [], 0
    for atoms in structures:
        i, j, shift = neighbour_list(atoms, cutoff)
        src.append(j + offset)  # the neighbour j sends to the centre i
        dst.append(i + offset)
        shifts.append(shift)  # r_src - r_dst + shift = r_j - r_i + D_shift
        offset += len(atoms)
    src, dst, shifts = np.concatenate(src), np.concatenate(dst), np.concatenate(shifts)
    capacity = edge_capacity(len(src)) if capacity is None else capacity
    if len(src) > capacity:
        raise ValueError(f"capacity: {len(src)} edges do not fit in {capacity}")
    pad = capacity - len(src)
    return Graph(
        species=jnp.asarray(np.concatenate([species_index(a.numbers) for a in structures])),
        src=jnp.asarray(np.concatenate([src, np.full(pad, offset)]), jnp.int32),
        dst=jnp.asarray(np.concatenate([dst, np.full(pad, offset)]), jnp.int32),
        shifts=jnp.asarray(np.concatenate([shifts, np.zeros((pad, 3))])),
        batch=jnp.asarray(np.concatenate([np.full(len(a), k) for k, a in enumerate(structures)]), jnp.int32),
    )


def select_devices(count: int) -> list:
    """The first ``count`` of JAX's devices; a ``ValueError`` if there are fewer."""
    devices = jax.devices()
    if not 1 <= count <= len(devices):
        raise ValueError(f"--devices: {count} requested, {len(devices)} available ({devices})")
    return devices[:count]


def edge_vectors(positions, graph: Graph):
    """``(vectors (E, 3), valid (E,))``; padding edges get the unit vector x (never zero, so
    norms and spherical harmonics stay differentiable) and ``valid = False``."""
    n = positions.shape[0]
    valid = (graph.src >= 0) & (graph.src < n) & (graph.dst >= 0) & (graph.dst < n)
    vectors = (
        positions.at[graph.src].get(mode="fill", fill_value=0.0)
        - positions.at[graph.dst].get(mode="fill", fill_value=0.0)
        + graph.shifts.astype(positions.dtype)
    )
    return jnp.where(valid[:, None], vectors, jnp.array([1.0, 0.0, 0.0], positions.dtype)), valid


def hidden_irreps(channels: int, lmax: int) -> e3nn.Irreps:
    """``channels x l`` of parity ``(-1)^l`` for ``l <= lmax``: NequIP's even-parity features."""
    return e3nn.Irreps([(channels, (l, (-1) ** l)) for l in range(lmax + 1)])


class Interaction(nn.Module):
    """One NequIP layer: linear, convolution, linear + species self-connection, gate."""

    channels: int
    lmax: int
    avg_num_neighbors: float
    radial_hidden: Sequence[int]
    backend: str

    @nn.compact
    def __call__(self, h, attrs, sh, embedding, graph: Graph):
        target = hidden_irreps(self.channels, self.lmax)
        gates = sum(mul for mul, ir in target if ir.l > 0)
        gate_in = e3nn.Irreps(f"{self.channels + gates}x0e") + target.filter(drop="0e")
        x = e3nn.flax.Linear(h.irreps)(h)
        messages = jax_cgtp.flax.TensorProductConv(
            filter_ir_out=target,
            avg_num_neighbors=self.avg_num_neighbors,
            radial_hidden=self.radial_hidden,
            backend=self.backend,
        )(x, sh, embedding, graph.src, graph.dst, h.shape[0])
        mixed = e3nn.flax.Linear(gate_in, force_irreps_out=True)(messages).rechunk(gate_in)
        self_backend = "e3nn" if self.backend == "cueq" else self.backend
        self_connection = jax_cgtp.flax.FullyConnectedTensorProduct(gate_in, backend=self_backend)(h, attrs)
        return e3nn.gate(mixed + self_connection.rechunk(gate_in))


class NequIP(nn.Module):
    """Atomic energies ``(N,)`` of the atoms of ``graph`` at ``positions (N, 3)``."""

    channels: int = 32
    lmax: int = 2
    num_layers: int = 3
    cutoff: float = 5.0
    num_basis: int = 8
    radial_hidden: Sequence[int] = (64,)
    avg_num_neighbors: float = 20.0
    backend: str = "auto"

    @nn.compact
    def __call__(self, positions, graph: Graph):
        vectors, valid = edge_vectors(positions, graph)
        lengths = jnp.linalg.norm(vectors, axis=-1)
        inside = valid & (lengths < self.cutoff)
        envelope = e3nn.poly_envelope(5, 2)(lengths / self.cutoff)
        embedding = e3nn.bessel(lengths, self.num_basis, self.cutoff) * jnp.where(inside, envelope, 0.0)[:, None]
        sh = e3nn.spherical_harmonics(
            e3nn.Irreps.spherical_harmonics(self.lmax), vectors, normalize=True, normalization="component"
        )
        attrs = e3nn.IrrepsArray(f"{len(SPECIES)}x0e", jax.nn.one_hot(graph.species, len(SPECIES), dtype=positions.dtype))
        h = e3nn.flax.Linear(f"{self.channels}x0e")(attrs)
        for _ in range(self.num_layers):
            h = Interaction(self.channels, self.lmax, self.avg_num_neighbors, self.radial_hidden, self.backend)(
                h, attrs, sh, embedding, graph
            )
        scalars = h.filter(keep="0e").array
        energy = e3nn.flax.MultiLayerPerceptron((16, 1), act=jax.nn.silu, output_activation=False)(scalars)[:, 0]
        scale = self.param("scale", nn.initializers.ones, ())
        shift = self.param("shift", nn.initializers.zeros, (len(SPECIES),))
        return scale * energy + shift[graph.species]


def init_params(model: NequIP, key, positions, graph: Graph):
    """The model's parameters (a plain nested dict), initialised under ``jit`` (much faster than eagerly)."""
    return jax.jit(model.init)(key, positions, graph)


def total_energy(model: NequIP, params, positions, graph: Graph):
    """The potential energy of the whole graph (all structures together)."""
    return jnp.sum(model.apply(params, positions, graph))


def energy_and_forces(model: NequIP, params, positions, graph: Graph):
    """``(E, F = -dE/dr (N, 3))``."""
    energy, gradient = jax.value_and_grad(lambda r: total_energy(model, params, r, graph))(positions)
    return energy, -gradient


def structure_energies(model: NequIP, params, positions, graph: Graph, num_structures: int):
    """Per-structure energies ``(num_structures,)`` of a batched graph."""
    return jax.ops.segment_sum(model.apply(params, positions, graph), graph.batch, num_segments=num_structures)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="auto", choices=jax_cgtp.flax.MODULE_BACKENDS,
                        help="jax_cgtp backend, 'e3nn' for the same model on e3nn-jax, 'cueq' for its convolutions on cuequivariance-jax")
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--lmax", type=int, default=2)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--cutoff", type=float, default=5.0)
    parser.add_argument("--smoke", action="store_true", help="tiny model and structures (CPU, seconds)")


def model_from_arguments(args) -> NequIP:
    if args.smoke:
        return NequIP(channels=4, lmax=1, num_layers=1, cutoff=3.0, num_basis=4, radial_hidden=(8,), backend=args.backend)
    return NequIP(channels=args.channels, lmax=args.lmax, num_layers=args.layers, cutoff=args.cutoff, backend=args.backend)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser)
    parser.add_argument("--repeat", type=int, default=4, help="bulk copper: repeats of the cubic cell")
    args = parser.parse_args(argv)
    model = model_from_arguments(args)
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(1 if args.smoke else args.repeat)
    atoms.rattle(0.05, seed=0)
    graph = build_graph([atoms], model.cutoff)
    positions = jnp.asarray(atoms.positions)
    params = init_params(model, jax.random.PRNGKey(0), positions, graph)
    count = sum(p.size for p in jax.tree_util.tree_leaves(params))
    print(f"{model.backend}: {len(atoms)} atoms, {int(jnp.sum(graph.src < len(atoms)))} edges "
          f"(padded to {graph.src.shape[0]}), {count} parameters")

    step = jax.jit(lambda p, r, g: energy_and_forces(model, p, r, g))
    start = time.perf_counter()
    energy, forces = jax.block_until_ready(step(params, positions, graph))
    compiled = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(3):
        energy, forces = jax.block_until_ready(step(params, positions, graph))
    per_call = (time.perf_counter() - start) / 3
    print(f"energy {float(energy):.6f} eV, max |F| {float(jnp.max(jnp.abs(forces))):.4f} eV/A, "
          f"compile {compiled:.2f} s, energy+forces {per_call * 1e3:.2f} ms")

    rotation = np.asarray(e3nn.rand_matrix(jax.random.PRNGKey(1), ()))
    rotated = atoms.copy()
    rotated.set_cell(atoms.cell @ rotation.T, scale_atoms=True)
    energy_r, forces_r = step(params, jnp.asarray(rotated.positions), build_graph([rotated], model.cutoff, graph.src.shape[0]))
    errors = {"energy": abs(float(energy_r - energy)), "forces": float(jnp.max(jnp.abs(forces_r - forces @ rotation.T)))}
    print(f"rotation: |dE| = {errors['energy']:.2e} eV, max |F(Rr) - R F(r)| = {errors['forces']:.2e} eV/A")
    return {"energy": float(energy), "forces": np.asarray(forces), "rotation_errors": errors}


if __name__ == "__main__":
    main()
