"""The examples: the potential's symmetries and derivatives, and each script end to end with --smoke."""

import functools
import importlib.util
import pathlib
import sys

import e3nn_jax as e3nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import bench_e2e  # noqa: E402
import md  # noqa: E402
import potential  # noqa: E402
import train  # noqa: E402
from data_parallel import on_two_host_devices  # noqa: E402

SMOKE = dict(channels=4, lmax=1, num_layers=2, cutoff=3.0, num_basis=4, radial_hidden=(8,))

pytestmark = pytest.mark.slow  # runs examples and benchmarks end to end: the full suite only


@functools.lru_cache(maxsize=None)
def setup(backend="auto"):
    """A small model on a periodic water box of 24 atoms (float64), and its jitted E, F.
    Both backends share one set of parameters (initialised once)."""
    model = potential.NequIP(**SMOKE, backend=backend)
    atoms = md.water_box(2)
    atoms.rattle(0.05, seed=1)
    graph = potential.build_graph([atoms], model.cutoff, 1024)
    positions = jnp.asarray(atoms.positions, jnp.float64)
    if backend == "auto":
        params = potential.init_params(model, jax.random.PRNGKey(0), positions, graph)
        params = jax.tree_util.tree_map(lambda p: p.astype(jnp.float64), params)
    else:
        params = setup("auto")[3]
    evaluate = jax.jit(lambda p, r, g: potential.energy_and_forces(model, p, r, g))
    return model, atoms, graph, params, evaluate


def test_energy_is_rotation_invariant_and_forces_rotate_with_the_structure():
    model, atoms, graph, params, evaluate = setup()
    energy, forces = evaluate(params, jnp.asarray(atoms.positions), graph)
    rotation = np.asarray(e3nn.rand_matrix(jax.random.PRNGKey(7), ()), np.float64)
    rotated = atoms.copy()
    rotated.set_cell(np.asarray(atoms.cell) @ rotation.T, scale_atoms=True)
    energy_r, forces_r = evaluate(params, jnp.asarray(rotated.positions), potential.build_graph([rotated], model.cutoff, 1024))
    assert abs(float(energy)) > 1e-3 and float(jnp.max(jnp.abs(forces))) > 1e-4  # not trivially zero
    assert abs(float(energy_r - energy)) < 1e-8 * max(1.0, abs(float(energy)))
    np.testing.assert_allclose(forces_r, forces @ rotation.T, atol=1e-8)


def test_energy_is_translation_and_permutation_invariant():
    model, atoms, graph, params, evaluate = setup()
    energy, forces = evaluate(params, jnp.asarray(atoms.positions), graph)
    moved = atoms.copy()
    moved.translate([0.3, -1.2, 2.5])
    order = np.random.default_rng(0).permutation(len(atoms))
    moved = moved[order]
    energy_m, forces_m = evaluate(params, jnp.asarray(moved.positions), potential.build_graph([moved], model.cutoff, 1024))
    assert abs(float(energy_m - energy)) < 1e-8 * max(1.0, abs(float(energy)))
    np.testing.assert_allclose(forces_m, forces[order], atol=1e-8)


def test_forces_are_minus_the_gradient_of_the_energy():
    model, atoms, graph, params, evaluate = setup()
    positions = jnp.asarray(atoms.positions)
    _, forces = evaluate(params, positions, graph)
    step = 1e-5
    for atom, axis in [(0, 0), (5, 2), (17, 1)]:
        shift = jnp.zeros_like(positions).at[atom, axis].set(step)
        difference = (evaluate(params, positions + shift, graph)[0] - evaluate(params, positions - shift, graph)[0]) / (2 * step)
        assert abs(float(-difference - forces[atom, axis])) < 1e-6


@pytest.mark.parametrize("backend", ["e3nn", "cueq"])
def test_other_backends_give_the_same_energy_and_forces(backend):
    if backend == "cueq":
        pytest.importorskip("cuequivariance_jax")
    _, atoms, graph, params, evaluate = setup()
    *_, evaluate_other = setup(backend)
    energy, forces = evaluate(params, jnp.asarray(atoms.positions), graph)
    energy_other, forces_other = evaluate_other(params, jnp.asarray(atoms.positions), graph)
    assert abs(float(energy - energy_other)) < 1e-8 * max(1.0, abs(float(energy)))
    np.testing.assert_allclose(forces, forces_other, atol=1e-8)


def test_padding_edges_change_nothing():
    model, atoms, graph, params, evaluate = setup()
    energy, forces = evaluate(params, jnp.asarray(atoms.positions), graph)
    padding = graph.src >= len(atoms)
    assert int(jnp.sum(padding)) > 100
    # Padding edges that point at real atoms on one end and carry arbitrary shifts still count for nothing.
    rng = np.random.default_rng(3)
    other = graph._replace(
        src=jnp.where(padding, jnp.asarray(rng.integers(0, len(atoms), padding.shape), graph.src.dtype), graph.src),
        shifts=jnp.where(padding[:, None], jnp.asarray(rng.normal(size=graph.shifts.shape)), graph.shifts),
    )
    energy_o, forces_o = evaluate(params, jnp.asarray(atoms.positions), other)
    assert abs(float(energy_o - energy)) < 1e-12 * max(1.0, abs(float(energy)))
    np.testing.assert_allclose(forces_o, forces, atol=1e-12)


def test_graph_construction_reports_overflow_and_unknown_elements():
    atoms = md.copper(1)
    with pytest.raises(ValueError, match="capacity"):
        potential.build_graph([atoms], 3.0, capacity=8)
    atoms.numbers[0] = 26
    with pytest.raises(ValueError, match=r"elements \[26\]"):
        potential.build_graph([atoms], 3.0)


def test_potential_example_runs():
    result = potential.main(["--smoke"])
    assert np.isfinite(result["energy"]) and result["forces"].shape == (4, 3)
    assert result["rotation_errors"]["energy"] < 1e-8 and result["rotation_errors"]["forces"] < 1e-8


def test_md_example_runs_on_water_and_copper():
    results = md.main(["--smoke", "--quiet"])
    assert [r["system"] for r in results] == ["water", "copper"]
    for r in results:
        assert r["steps_per_s"] > 0 and r["edges"] > 0
        # the builds are part of a step (a relative 1e-12 for the rounding of two ways to divide)
        assert r["build_s"] >= 0 and 0 < r["step_ms"] <= 1e3 / r["steps_per_s"] * (1 + 1e-12)
        assert abs(r["drift_mev_per_atom"]) < 0.1 and r["max_dev_mev_per_atom"] < 0.1


def test_train_example_fits_and_saves(tmp_path):
    history = train.main(["--smoke", "--plot", str(tmp_path / "loss.png"), "--save", str(tmp_path / "params.msgpack")])
    assert history["train_loss"][-1] < history["train_loss"][0]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    restored = flax.serialization.msgpack_restore((tmp_path / "params.msgpack").read_bytes())
    assert "shift" in restored["params"]


TWO_DEVICE_SETUP = """
import functools, json, sys
import jax, jax.numpy as jnp, numpy as np, optax
jax.config.update("jax_enable_x64", True)
import md, potential, train
model = potential.NequIP(channels=4, lmax=1, num_layers=2, cutoff=3.0, num_basis=4, radial_hidden=(8,))
def float64_params(positions, graph):
    params = potential.init_params(model, jax.random.PRNGKey(0), positions, graph)
    return jax.tree_util.tree_map(lambda p: p.astype(jnp.float64), params)
"""

# train.py: a data-parallel step against one device stepping with the batches' mean gradient
TRAIN_ON_TWO_DEVICES = """
batches = train.make_batches(train.perturbed_copper(4, 1, 0.1, 0.03), 2, model.cutoff)
params = float64_params(batches[0].positions, batches[0].graph)
optimizer = optax.adam(1e-2)
state = optimizer.init(params)
stepped, _, value = train.make_train_step(model, optimizer, 10.0, jax.devices()[:2])(params, state, train.stack(batches))
def loss(params, batch):
    e, f = train.loss_terms(model, params, batch)
    return e + 10.0 * f
values, grads = zip(*map(functools.partial(jax.jit(jax.value_and_grad(loss)), params), batches))
mean = jax.tree_util.tree_map(lambda *g: sum(g) / len(g), *grads)
expected = optax.apply_updates(params, optimizer.update(mean, state, params)[0])
errors = [float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in
          zip(jax.tree_util.tree_leaves(stepped), jax.tree_util.tree_leaves(expected))]
print(json.dumps({"loss": abs(float(value) - float(np.mean(values))) / float(np.mean(values)), "params": max(errors)}))
"""

# md.py: a step with the graph's edges split across both devices against the same step on one
MD_ON_TWO_DEVICES = """
atoms = md.water_box(2)
md.thermalize(atoms, 300.0)
positions, graph = md.NeighbourList(atoms, model.cutoff, 0.5).build(atoms.positions)
r, v = jnp.asarray(positions), jnp.asarray(atoms.get_velocities())
masses = jnp.asarray(atoms.get_masses())[:, None]
step = md.make_step(model, float64_params(r, graph), masses)
state0 = step(r, v, jnp.zeros_like(r), graph, jnp.zeros(()))
one = step(*state0[:3], graph, jnp.asarray(0.5 * 0.1))
split_graph = md.place(graph, jax.devices()[:2])
split = step(*step(r, v, jnp.zeros_like(r), split_graph, jnp.zeros(()))[:3], split_graph, jnp.asarray(0.5 * 0.1))
print(json.dumps({"md": max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in zip(split, one)),
                  "md_edge_shards": len(split_graph.src.sharding.device_set)}))
"""


def on_two_host_devices_in_examples(script: str) -> dict:
    """:data:`TWO_DEVICE_SETUP`, then ``script``, in a fresh process with two host devices (JAX
    fixes their number when it starts)."""
    return on_two_host_devices(["-c", TWO_DEVICE_SETUP + script], EXAMPLES)


def test_train_example_data_parallel_step_averages_the_devices_gradients():
    """``make_train_step`` over two host devices against one device stepping with the two batches'
    mean gradient."""
    errors = on_two_host_devices_in_examples(TRAIN_ON_TWO_DEVICES)
    assert errors["loss"] < 1e-12 and errors["params"] < 1e-10, errors


def test_md_example_steps_with_the_edges_split_across_devices_as_on_one():
    """``md.place`` shards the graph's edges over two host devices; the jitted velocity-Verlet
    step then gives one device's positions, velocities, forces and energy."""
    errors = on_two_host_devices_in_examples(MD_ON_TWO_DEVICES)
    assert errors["md_edge_shards"] == 2 and errors["md"] < 1e-12, errors


def test_train_example_asks_for_no_more_devices_than_there_are():
    with pytest.raises(ValueError, match="--devices: 2 requested, 1 available"):
        train.main(["--smoke", "--devices", "2"])


def test_bench_e2e_compares_the_backends():
    results = bench_e2e.main(["--smoke", "--inline", "--iters", "1", "--workloads", "md", "--profile", "3"])
    by_pair = {(r["workload"], r["backend"]): r for r in results}
    cueq = importlib.util.find_spec("cuequivariance_jax") is not None
    assert set(by_pair) == {("md", "auto"), ("md", "e3nn")} | ({("md", "cueq")} if cueq else set())
    theirs = by_pair[("md", "e3nn")]  # train's step is train.py's, tested above
    for ours in by_pair.values():
        assert ours["step_ms"] > 0 and ours["planned_bytes"] > 0
        assert abs(ours["value"] - theirs["value"]) <= 1e-6 * max(1.0, abs(theirs["value"]))
        assert len(ours["profile"]) == 3 and all(row["ms"] > 0 and row["target"] != "?" for row in ours["profile"])


def test_bench_e2e_asks_for_no_more_devices_than_there_are():
    with pytest.raises(ValueError, match="--devices: 2 requested, 1 available"):
        bench_e2e.main(["--smoke", "--inline", "--iters", "1", "--workloads", "md", "--backends", "auto", "--devices", "2"])


def test_mlip_models_run_on_jax_cgtp_with_e3nn_jax_results():
    """InstaDeep's mlip NequIP and MACE (``models_v1``), traced under ``jax_cgtp.replacing_e3nn``:
    energies, forces and training gradients equal e3nn-jax's (float64, 1e-10), both systems."""
    pytest.importorskip("mlip")
    import mlip_models

    rows = mlip_models.main(["--smoke", "--dtype", "float64", "--runs", "1"])
    assert {(row["system"], row["model"], row["workload"]) for row in rows if row["route"] == "jax_cgtp"} == {
        (s, m, w) for s in ("water", "copper") for m in ("nequip", "mace") for w in ("md", "train")}
    assert all(row["error"] < 1e-10 for row in rows)


def test_hessian_of_an_mlip_model_on_jax_cgtp_equals_e3nn_jax():
    """The README's e3j comparison: the Hessian of mlip NequIP's energy w.r.t. the positions (forward
    over reverse mode) under ``jax_cgtp.replacing_e3nn`` equals e3nn-jax's (float64, 1e-10)."""
    pytest.importorskip("mlip")
    import mlip_models

    jax.config.update("jax_enable_x64", True)
    args = mlip_models.parse_args(["--smoke", "--dtype", "float64"])
    atoms = mlip_models.systems(args)["water"]
    graph = mlip_models.graph_of(atoms, args.cutoff)
    graph = graph.replace_nodes(positions=jnp.asarray(graph.nodes.positions, jnp.float64))
    network, config = mlip_models.models(args, "e3nn")["nequip"]
    predictor, params = mlip_models.force_field(network, config, atoms, graph, args.cutoff, jnp.float64, "e3nn")

    def energy(positions):
        return jnp.sum(predictor.apply(params, graph.replace_nodes(positions=positions)).to_prediction().energy)

    hessians = {}
    for route in ("e3nn", "jax_cgtp"):
        with mlip_models.ROUTES[route]():
            hessians[route] = np.asarray(jax.jit(jax.hessian(energy))(graph.nodes.positions))
    assert np.all(np.isfinite(hessians["jax_cgtp"])) and np.abs(hessians["e3nn"]).max() > 0
    np.testing.assert_allclose(hessians["jax_cgtp"], hessians["e3nn"], rtol=1e-10, atol=1e-10 * np.abs(hessians["e3nn"]).max())
