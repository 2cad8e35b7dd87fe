"""The primitives on two host devices: a data-parallel training step inside ``jax.shard_map`` and
``jax.pmap``, one graph's edges split across the devices by ``jax.jit``, and operands sharded over
an explicit mesh axis.

JAX fixes the number of host devices when it starts, so each runs in a fresh process
(``data_parallel.py``, ``edge_sharded.py``, ``explicit_sharded.py`` with
``--xla_force_host_platform_device_count=2``). On a
machine with two GPUs ``test_gpu.py`` runs the same on the kernels. Also: lowering over an abstract
mesh (no devices) with and without the partitioning rule.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from data_parallel import on_two_host_devices


@pytest.mark.slow  # a subprocess with two host devices
def test_data_parallel_step_on_two_host_devices_matches_each_device_alone():
    results = on_two_host_devices(["data_parallel.py"], pathlib.Path(__file__).resolve().parent)
    assert len(results) == 2  # atomic on src/dst, deterministic on a sorted graph
    for result in results:
        assert result.pop("devices") == ["cpu:0", "cpu:1"]
        assert all(error < 1e-12 for error in result.values()), result


@pytest.mark.slow  # a subprocess with two host devices
def test_edges_sharded_by_jit_run_on_each_device_and_match_one_device():
    """Under jit over edges sharded across the devices, every call is lowered for XLA to split
    (each device its edges, node outputs summed over the devices): no all-gather, the results of
    one device and of the reference, bitwise repeatable."""
    result = on_two_host_devices(["edge_sharded.py"], pathlib.Path(__file__).resolve().parent)
    assert result.pop("devices") == ["cpu:0", "cpu:1"]
    assert set(result) == {"conv_atomic", "conv_deterministic", "product_per_row", "product_shared"}
    for name, run in result.items():
        assert run["partitioned"] and not run["partitioned_when_off"] and run["repeatable"], (name, run)
        assert run["all_gathers"] == run["all_edge_arrays"] == 0, (name, run)
        assert run["alone"] < 1e-12 and run["reference"] < 1e-12, (name, run)


@pytest.mark.slow  # a subprocess with two host devices
def test_operands_sharded_over_an_explicit_axis_split_each_call_over_the_devices():
    """Rows or edges sharded over an explicit mesh axis: the product keeps its rows sharded, the
    convolution (and its second derivative, atomic and on a sorted graph) sums each device's edges
    into replicated nodes; the results of one device and of the reference, bitwise repeatable."""
    result = on_two_host_devices(["explicit_sharded.py"], pathlib.Path(__file__).resolve().parent)
    assert result.pop("devices") == ["cpu:0", "cpu:1"]
    assert set(result) == {"conv_atomic", "conv_deterministic", "product_per_row", "product_shared"}
    for name, run in result.items():
        assert run["first_spec"] == (["edges", None] if name.startswith("product") else [None, None]), (name, run)
        assert run["repeatable"] and run["alone"] < 1e-12 and run["reference"] < 1e-12, (name, run)


ABSTRACT_MESH_EXPORT = """
import json
import jax, jax.numpy as jnp
from jax import export
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec
import jax_cgtp
tp = jax_cgtp.TensorProduct("4x0e", "0e", "4x0e", [(0, 0, 0, "uvu", True)])
rows = NamedSharding(AbstractMesh((2,), ("e",), axis_types=(AxisType.Auto,)), PartitionSpec("e"))
args = [jax.ShapeDtypeStruct((8, n), jnp.float32, sharding=rows) for n in (4, 1, 4)]
try:
    print(json.dumps({"devices": export.export(jax.jit(tp), platforms=["cpu"])(*args).nr_devices}))
except ValueError as error:
    print(json.dumps({"error": str(error)}))
"""


@pytest.mark.parametrize("partitioning", ["1", "0"])
def test_lowering_over_an_abstract_mesh_needs_the_rule_off_at_import(partitioning):
    """The partitioning rule reads the devices while lowering, so JAX refuses to export over an
    abstract mesh alone; with JAX_CGTP_PARTITIONING=0 set before the import it exports."""
    run = subprocess.run([sys.executable, "-c", ABSTRACT_MESH_EXPORT], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, JAX_PLATFORMS="cpu", JAX_CGTP_PARTITIONING=partitioning))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    if partitioning == "1":
        assert "AbstractMesh cannot be used" in result["error"], result
    else:
        assert result == {"devices": 2}
