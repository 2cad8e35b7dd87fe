"""Operands sharded over an explicit mesh axis (``AxisType.Explicit``: the types carry each
array's sharding), the library splitting each call over the axis with ``jax.shard_map``.

The product's rows, or the convolution's edges (edge features, weights, indices), are sharded over
the axis ``edges``; node features and shared weights are replicated. Each device computes its own
rows, or the convolution of its own edges, whose node outputs are summed over the devices.

``python explicit_sharded.py`` (from ``tests/``) runs :func:`report` on every device of JAX's
default backend and prints it as JSON; ``test_shard_map.py`` runs it on two host devices,
``test_gpu.py`` calls :func:`report` on the GPUs.
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

import jax_cgtp
from data_parallel import EDGES, INSTRUCTIONS, IRREPS_X, IRREPS_Y, NODES
from family_members import relative_error


def product_grads(x, y, w, *, backend):
    """The product ``z`` and the gradients of ``sum(sin(z))``: per-row weights or shared."""
    tp = jax_cgtp.TensorProduct(IRREPS_X, IRREPS_Y, IRREPS_X, INSTRUCTIONS, backend=backend)
    z, vjp = jax.vjp(tp, x, y, w)
    return (z,) + vjp(jnp.cos(z))


def conv_second_derivative(x, y, w, src, dst, *, deterministic, backend):
    """The convolution, its gradient by the edge features, and the gradient of that gradient's
    squared norm by the weights and node features (a second derivative, as force training runs);
    the deterministic variant on a graph sorted once."""
    conv = jax_cgtp.TensorProductConv(IRREPS_X, IRREPS_Y, IRREPS_X, INSTRUCTIONS, deterministic=deterministic,
                                      backend=backend)
    if deterministic:
        graph = jax_cgtp.sort_graph(src, dst, NODES)
        apply = lambda x, y, w: conv(x, y, w, graph=graph)  # noqa: E731
    else:
        apply = lambda x, y, w: conv(x, y, w, src, dst, num_nodes=NODES)  # noqa: E731

    def edge_force(x, y, w):
        return jax.grad(lambda y: jnp.sum(jnp.sin(apply(x, y, w))))(y)

    second = jax.grad(lambda x, w: jnp.sum(edge_force(x, y, w) ** 2), argnums=(0, 1))(x, w)
    return (apply(x, y, w), edge_force(x, y, w)) + second


def _runs(dtype, backend):
    """``{name: (function, args, the args' specs)}`` over the mesh axis ``edges``."""
    k = jax.random.split(jax.random.PRNGKey(3), 8)
    tp = jax_cgtp.TensorProduct(IRREPS_X, IRREPS_Y, IRREPS_X, INSTRUCTIONS)
    x = jax.random.normal(k[0], (EDGES, tp.irreps_in1.dim), dtype)
    y = jax.random.normal(k[1], (EDGES, tp.irreps_in2.dim), dtype)
    nodes = jax.random.normal(k[2], (NODES, tp.irreps_in1.dim), dtype)
    w_rows = jax.random.normal(k[3], (EDGES, tp.weight_numel), dtype)
    w_shared = jax.random.normal(k[4], (tp.weight_numel,), dtype)
    # the last edges are a padded batch's: out of the node range, their features NaN and weights Inf
    src = jax.random.randint(k[5], (EDGES,), 0, NODES).at[-3:].set(jnp.array([NODES, 0, -1]))
    dst = jax.random.randint(k[6], (EDGES,), 0, NODES).at[-3:].set(jnp.array([0, -1, NODES + 4]))
    edge_y = y.at[-3:].set(jnp.nan)
    edge_w = w_rows.at[-3:].set(jnp.inf)
    rows, edges, whole = PartitionSpec("edges", None), PartitionSpec("edges"), PartitionSpec()
    product = functools.partial(product_grads, backend=backend)
    runs = {"product_per_row": (product, (x, y, w_rows), (rows, rows, rows)),
            "product_shared": (product, (x, y, w_shared), (rows, rows, whole))}
    for deterministic in (False, True):
        run = functools.partial(conv_second_derivative, deterministic=deterministic, backend=backend)
        runs[f"conv_{'deterministic' if deterministic else 'atomic'}"] = (
            run, (nodes, edge_y, edge_w, src, dst), (whole, rows, rows, edges, edges))
    return runs


def report(devices=None, dtype=jnp.float64, backend="auto") -> dict:
    """For each run, on a mesh of ``devices`` whose axis ``edges`` is explicit: relative errors of
    the sharded results against the same function unsharded (``alone``) and on the reference
    backend (``reference``); the sharding of the first result (``first_spec``: the product's rows
    stay sharded, the convolution's nodes are replicated); whether two sharded runs agree bitwise
    (``repeatable``)."""
    devices = list(devices or jax.devices())
    mesh = Mesh(np.array(devices), ("edges",), axis_types=(AxisType.Explicit,))
    result = {"devices": [str(d) for d in devices]}
    references = _runs(dtype, "reference")
    for name, (run, args, specs) in _runs(dtype, backend).items():
        fun = jax.jit(run)
        alone = fun(*args)
        reference = jax.jit(references[name][0])(*args)
        with jax.set_mesh(mesh):
            placed = [jax.device_put(a, NamedSharding(mesh, spec)) for a, spec in zip(args, specs)]
            sharded = fun(*placed)
            again = fun(*placed)
        result[name] = {
            "alone": max(relative_error(a, b) for a, b in zip(sharded, alone)),
            "reference": max(relative_error(a, b) for a, b in zip(sharded, reference)),
            "first_spec": [entry for entry in jax.typeof(sharded[0]).sharding.spec],
            "repeatable": all(np.array_equal(a, b) for a, b in zip(sharded, again)),
        }
    return result


if __name__ == "__main__":
    jax.config.update("jax_enable_x64", True)
    print(json.dumps(report()))
