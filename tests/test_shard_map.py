"""The primitives inside ``jax.shard_map`` and ``jax.pmap``: a data-parallel training step on two host
devices.

JAX fixes the number of host devices when it starts, so the step runs in a fresh process
(``data_parallel.py`` with ``--xla_force_host_platform_device_count=2``). On a machine with two GPUs
``test_gpu.py`` runs the same step on the kernels.
"""

import pathlib

from data_parallel import on_two_host_devices


def test_data_parallel_step_on_two_host_devices_matches_each_device_alone():
    results = on_two_host_devices(["data_parallel.py"], pathlib.Path(__file__).resolve().parent)
    assert len(results) == 2  # atomic on src/dst, deterministic on a sorted graph
    for result in results:
        assert result.pop("devices") == ["cpu:0", "cpu:1"]
        assert all(error < 1e-12 for error in result.values()), result
