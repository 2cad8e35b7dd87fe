"""Fit the NequIP-style potential to energies and forces of perturbed copper, labelled by EMT.

The data are generated here: fcc copper cells, randomly strained and rattled, labelled by
ASE's EMT calculator. The loss is

    L = mean_s ((E_s - E_s^EMT) / N_s)^2 + force_weight * mean_i |F_i - F_i^EMT|^2,   F = -dE/dr

so its gradient with respect to the parameters differentiates the forces again (second
derivatives of the energy, all through jax_cgtp). Adam from optax; prints the loss curve and
validation errors, saves a PNG plot and the parameters (flax msgpack). With ``--devices N`` each
step is data parallel (``jax.shard_map``): N batches at once, one per device, their gradients
averaged.

    python examples/train.py --smoke                 # seconds on CPU
    python examples/train.py --epochs 300            # on a GPU
    python examples/train.py --devices 2             # on two GPUs
"""

from __future__ import annotations

import argparse
import time
from typing import NamedTuple

import ase
import ase.build
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
from ase.calculators.emt import EMT
from jax.sharding import Mesh, PartitionSpec

import potential


class Batch(NamedTuple):
    """Structures of equal size as one padded graph, with their labels."""

    positions: jax.Array  # (S * N, 3)
    graph: potential.Graph
    energies: jax.Array  # (S,)
    forces: jax.Array  # (S * N, 3)
    atoms_per_structure: jax.Array  # (S,)


def perturbed_copper(count: int, repeat: int, rattle: float, strain: float, seed: int = 0) -> list[ase.Atoms]:
    """``count`` fcc copper cells, each strained by a random symmetric ``|e_ij| <= strain`` and
    rattled by ``rattle`` Angstrom, with EMT energy and forces attached."""
    rng = np.random.default_rng(seed)
    structures = []
    for k in range(count):
        atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)
        e = rng.uniform(-strain, strain, (3, 3))
        atoms.set_cell(np.asarray(atoms.cell) @ (np.eye(3) + (e + e.T) / 2), scale_atoms=True)
        atoms.rattle(rattle, seed=seed * 100003 + k)
        atoms.calc = EMT()
        atoms.info["energy"] = atoms.get_potential_energy()
        atoms.arrays["forces"] = atoms.get_forces()
        structures.append(atoms)
    return structures


def make_batches(structures, batch_size: int, cutoff: float) -> list[Batch]:
    """Consecutive groups of ``batch_size`` structures, all padded to the same edge count (so
    one compiled step serves every batch); an incomplete last group is left out."""
    groups = [structures[i : i + batch_size] for i in range(0, len(structures) - batch_size + 1, batch_size)]
    if not groups:
        raise ValueError(f"batch_size: {batch_size} is more than the {len(structures)} structures")
    counts = [sum(len(potential.neighbour_list(a, cutoff)[0]) for a in group) for group in groups]
    capacity = potential.edge_capacity(max(counts))
    return [
        Batch(
            positions=jnp.asarray(np.concatenate([a.positions for a in group])),
            graph=potential.build_graph(group, cutoff, capacity),
            energies=jnp.asarray([a.info["energy"] for a in group]),
            forces=jnp.asarray(np.concatenate([a.arrays["forces"] for a in group])),
            atoms_per_structure=jnp.asarray([len(a) for a in group]),
        )
        for group in groups
    ]


def loss_terms(model, params, batch: Batch):
    """``(energy MSE per atom^2, force MSE)`` of one batch."""
    num = batch.energies.shape[0]

    def energy(positions):
        per_structure = potential.structure_energies(model, params, positions, batch.graph, num)
        return jnp.sum(per_structure), per_structure

    gradient, predicted = jax.grad(energy, has_aux=True)(batch.positions)
    energy_error = (predicted - batch.energies) / batch.atoms_per_structure
    return jnp.mean(energy_error**2), jnp.mean((-gradient - batch.forces) ** 2)


def stack(batches: list[Batch]) -> Batch:
    """Batches of equal shapes as one, with a leading axis of one entry per batch."""
    return jax.tree_util.tree_map(lambda *arrays: jnp.stack(arrays), *batches)


def make_train_step(model, optimizer, force_weight: float, devices=None):
    """The jitted ``(params, opt_state, batch) -> (params, opt_state, loss)`` of one optimizer step.

    With several ``devices`` it is data parallel: ``batch`` is :func:`stack` of one batch per
    device, each device differentiates the loss of its own batch, and the loss and gradients are
    averaged over the devices; parameters and optimizer state stay the same on every device.
    """

    def loss(params, batch):
        e, f = loss_terms(model, params, batch)
        return e + force_weight * f

    def update(params, state, value, grads):
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    if devices is None or len(devices) == 1:
        return jax.jit(lambda params, state, batch: update(params, state, *jax.value_and_grad(loss)(params, batch)))

    def local(params, state, stacked):
        value, grads = jax.value_and_grad(loss)(params, jax.tree_util.tree_map(lambda a: a[0], stacked))
        # shard_map sums the gradient of the replicated parameters over the devices
        grads = jax.tree_util.tree_map(lambda g: g / len(devices), grads)
        return update(params, state, jax.lax.pmean(value, "data"), grads)

    mesh = Mesh(np.array(devices), ("data",))
    replicated = PartitionSpec()
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(replicated, replicated, PartitionSpec("data")),
                                 out_specs=replicated))


def fit(model, params, train: list[Batch], valid: list[Batch], epochs: int, learning_rate: float,
        force_weight: float, log_every: int = 1, seed: int = 0, devices=None):
    """Adam on ``L = energy term + force_weight * force term``; returns ``(params, history)``.
    With several ``devices`` each step takes one training batch per device (an epoch's last
    batches that do not fill every device are left out)."""
    parallel = len(devices or ()) or 1
    if parallel > len(train):
        raise ValueError(f"{parallel} devices need at least as many training batches, got {len(train)}")
    steps = len(train) // parallel
    optimizer = optax.adam(optax.cosine_decay_schedule(learning_rate, max(1, epochs * steps), alpha=0.1))
    state = optimizer.init(params)
    train_step = make_train_step(model, optimizer, force_weight, devices)
    evaluate = jax.jit(lambda params, batch: loss_terms(model, params, batch))

    def validation(params):
        terms = np.mean([[float(t) for t in evaluate(params, b)] for b in valid], axis=0)
        return float(np.sqrt(terms[0])) * 1e3, float(np.sqrt(terms[1])) * 1e3  # meV/atom, meV/A

    rng = np.random.default_rng(seed)
    history = {"epoch": [], "train_loss": [], "energy_rmse": [], "force_rmse": []}
    print(f"{'epoch':>6} {'train loss':>12} {'E RMSE meV/atom':>16} {'F RMSE meV/A':>14} {'time s':>8}")
    start = time.perf_counter()
    for epoch in range(epochs + 1):
        if epoch == 0:  # the untrained model, for the curve's first point
            losses = [float(sum(t * w for t, w in zip(evaluate(params, b), (1.0, force_weight)))) for b in train]
        else:
            losses = []
            order = rng.permutation(len(train))
            for k in range(steps):
                chosen = [train[i] for i in order[k * parallel:(k + 1) * parallel]]
                params, state, value = train_step(params, state, chosen[0] if parallel == 1 else stack(chosen))
                losses.append(float(value))
        energy_rmse, force_rmse = validation(params)
        for key, value in zip(history, (epoch, float(np.mean(losses)), energy_rmse, force_rmse)):
            history[key].append(value)
        if epoch % log_every == 0 or epoch == epochs:
            print(f"{epoch:>6} {np.mean(losses):>12.5g} {energy_rmse:>16.2f} {force_rmse:>14.1f} "
                  f"{time.perf_counter() - start:>8.1f}")
    return params, history


def plot(history: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.semilogy(history["epoch"], history["train_loss"])
    left.set(xlabel="epoch", ylabel="training loss", title="loss")
    right.semilogy(history["epoch"], history["energy_rmse"], label="energy (meV/atom)")
    right.semilogy(history["epoch"], history["force_rmse"], label="forces (meV/A)")
    right.set(xlabel="epoch", ylabel="validation RMSE", title="validation")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    potential.add_model_arguments(parser)
    parser.add_argument("--structures", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=2, help="cubic cells per side (2: 32 atoms)")
    parser.add_argument("--rattle", type=float, default=0.1, help="Angstrom")
    parser.add_argument("--strain", type=float, default=0.03)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--force-weight", type=float, default=10.0)
    parser.add_argument("--devices", type=int, default=1, help="data parallel over the first N devices")
    parser.add_argument("--plot", default="train_loss.png")
    parser.add_argument("--save", default="copper_potential.msgpack")
    args = parser.parse_args(argv)
    if args.smoke:
        args.structures, args.repeat, args.batch_size, args.epochs = 6, 1, 2, min(args.epochs, 6)
    model = potential.model_from_arguments(args)
    devices = potential.select_devices(args.devices)

    structures = perturbed_copper(args.structures, args.repeat, args.rattle, args.strain)
    split = args.batch_size * max(1, round(len(structures) / 6 / args.batch_size))
    valid = make_batches(structures[:split], args.batch_size, model.cutoff)
    train = make_batches(structures[split:], args.batch_size, model.cutoff)
    print(f"{len(structures) - split} training and {split} validation structures of "
          f"{len(structures[0])} atoms; EMT energies {min(a.info['energy'] for a in structures):.3f} .. "
          f"{max(a.info['energy'] for a in structures):.3f} eV; backend {model.backend}; "
          f"{len(devices)} device(s)")

    params = potential.init_params(model, jax.random.PRNGKey(0), train[0].positions, train[0].graph)
    mean_energy = np.mean([a.info["energy"] / len(a) for a in structures[split:]])
    shift = params["params"]["shift"].at[potential.species_index([29])[0]].set(mean_energy)
    params = {"params": {**params["params"], "shift": shift}}  # start from the mean energy per atom

    params, history = fit(model, params, train, valid, args.epochs, args.learning_rate, args.force_weight,
                          log_every=max(1, args.epochs // 20), devices=devices)
    plot(history, args.plot)
    with open(args.save, "wb") as f:
        f.write(flax.serialization.to_bytes(params))
    print(f"saved the loss curves to {args.plot} and the parameters to {args.save}")
    return history


if __name__ == "__main__":
    main()
