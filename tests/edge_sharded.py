"""One graph's edges split across devices by ``jax.jit`` (mesh axis of type Auto, no shard_map).

The node features, positions and parameters are replicated; the edge indices (and, for the
tensor product, its rows) are sharded over the mesh axis ``edges``. Each ``cgtp`` call then runs
on each device's edges and sums its node outputs over the devices
(:mod:`jax_cgtp.sharding.partitioning`); nothing per edge is gathered onto every device.

``python edge_sharded.py`` (from ``tests/``) runs :func:`report` on every device of JAX's default
backend and prints it as JSON; ``test_shard_map.py`` runs it on two host devices, ``test_gpu.py``
calls :func:`report` on the GPUs.
"""

from __future__ import annotations

import functools
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

import jax_cgtp
from jax_cgtp.gpu import cuda_lowering
from jax_cgtp.sharding.partitioning import switched
from data_parallel import EDGES, INSTRUCTIONS, IRREPS_X, IRREPS_Y, inputs, step
from family_members import relative_error


def product_step(x, y, w, *, backend):
    """Loss and gradients of a product over rows: per-row weights ``w (rows, n)`` or shared ``(n,)``."""
    tp = jax_cgtp.TensorProduct(IRREPS_X, IRREPS_Y, IRREPS_X, INSTRUCTIONS, backend=backend)
    return jax.value_and_grad(lambda *a: jnp.sum(jnp.sin(tp(*a))), argnums=(0, 1, 2))(x, y, w)


def _runs(devices, dtype, backend):
    """``{name: (function, replicated args, sharded args)}``: the convolution's training step
    (atomic, and deterministic on a sorted graph) and the product's gradients (weights per row
    and shared)."""
    mesh = Mesh(np.array(devices), ("edges",), axis_types=(AxisType.Auto,))
    edges, whole = NamedSharding(mesh, PartitionSpec("edges")), NamedSharding(mesh, PartitionSpec())
    theta, x, pos, src, dst = (a[0] if n else a for n, a in enumerate(inputs(1, dtype)))
    conv_args = (theta, x, pos, src, dst)
    conv_placed = tuple(jax.device_put(a, edges if n >= 3 else whole) for n, a in enumerate(conv_args))
    k = jax.random.split(jax.random.PRNGKey(1), 4)
    rows = src.shape[0]
    tp = jax_cgtp.TensorProduct(IRREPS_X, IRREPS_Y, IRREPS_X, INSTRUCTIONS)
    px = jax.random.normal(k[0], (rows, tp.irreps_in1.dim), dtype)
    py = jax.random.normal(k[1], (rows, tp.irreps_in2.dim), dtype)
    runs = {}
    for deterministic in (False, True):
        run = functools.partial(step, deterministic=deterministic, sorted_graph=deterministic, backend=backend)
        runs[f"conv_{'deterministic' if deterministic else 'atomic'}"] = (run, conv_args, conv_placed)
    for name, shape in (("product_per_row", (rows, tp.weight_numel)), ("product_shared", (tp.weight_numel,))):
        w = jax.random.normal(k[2], shape, dtype)
        args = (px, py, w)
        placed = tuple(jax.device_put(a, edges if a.shape[0] == rows else whole) for a in args)
        runs[name] = (functools.partial(product_step, backend=backend), args, placed)
    return runs


def report(devices=None, dtype=jnp.float64, backend="auto") -> dict:
    """For each run: relative errors of the sharded results against the same function on one
    device (``alone``) and on the reference backend (``reference``); in the compiled executable,
    the all-gathers and the arrays of every edge's rows (``all_edge_arrays``: shapes whose leading
    dimension is the edge count); whether the calls were lowered for XLA to split
    (``partitioned``; ``partitioned_when_off``: the same with ``JAX_CGTP_PARTITIONING=0``), and
    whether two sharded runs agree bitwise (``repeatable``). On the kernels (``backend="cuda"``), also
    the kernels that compiling the sharded function builds after ``precompile`` of it
    (``beyond_precompile``: none, if it planned each device's edges)."""
    devices = list(devices or jax.devices())
    result = {"devices": [str(d) for d in devices]}
    references = _runs(devices, dtype, "reference")
    for name, (run, args, placed) in _runs(devices, dtype, backend).items():
        fun = jax.jit(run)
        sharded = fun(*placed)
        alone = fun(*jax.device_put(args, devices[0]))
        reference = jax.jit(references[name][0])(*args)
        leaves = jax.tree_util.tree_leaves
        lowered = fun.lower(*placed)
        executable = lowered.compile().as_text()
        result[name] = {
            "alone": max(relative_error(a, b) for a, b in zip(leaves(sharded), leaves(alone))),
            "reference": max(relative_error(a, b) for a, b in zip(leaves(sharded), leaves(reference))),
            "all_gathers": len(re.findall(r"all-gather(-start)?\(", executable)),
            "all_edge_arrays": len(re.findall(rf"\[{EDGES},", executable)),
            "partitioned": "CustomSPMDPartitioning" in lowered.as_text(),
            "repeatable": all(np.array_equal(a, b) for a, b in zip(leaves(sharded), leaves(fun(*placed)))),
            "partitioned_when_off": _lowered_when_off(run, placed),
        }
        if backend == "cuda":
            result[name]["beyond_precompile"] = _compiled_beyond_precompile(run, placed)
    return result


def _compiled_beyond_precompile(run, placed) -> int:
    """How many kernels compiling ``run`` over ``placed`` (a fresh function, XLA's partitioner
    splitting its calls) builds after :func:`~jax_cgtp.gpu.cuda_lowering.precompile` of it, with the
    kernel caches emptied first."""
    cuda_lowering.clear_kernel_caches()
    cuda_lowering.precompile(run, *placed)
    before = cuda_lowering._kernel_image.cache_info().currsize
    jax.jit(lambda *a: run(*a)).lower(*placed).compile()
    return cuda_lowering._kernel_image.cache_info().currsize - before


def _lowered_when_off(run, placed) -> bool:
    """Whether ``run`` lowered with ``JAX_CGTP_PARTITIONING=0`` still has calls for XLA to split
    (a fresh function, so that no lowering is reused)."""
    with switched(False):
        return "CustomSPMDPartitioning" in jax.jit(lambda *a: run(*a)).lower(*placed).as_text()


if __name__ == "__main__":
    jax.config.update("jax_enable_x64", True)
    print(json.dumps(report()))
