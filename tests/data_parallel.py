"""A data-parallel training step under ``jax.shard_map`` and ``jax.pmap``, against the same step on each
device's data alone.

Each device holds its own graph: node features ``x``, positions and edges (indices local to the
device). The parameters ``theta`` are replicated: they map each edge's radial features to the
convolution's weights. The loss is an energy plus the sum of its squared forces (``-dE/dpos``),
so its gradient with respect to ``theta`` runs second derivatives of the convolution. Under
shard_map the loss and ``theta``'s gradient are sums over the devices; ``x``'s gradient stays on
its device.

``python data_parallel.py`` (from ``tests/``) runs :func:`errors` on every device of JAX's default
backend and prints them as JSON; ``test_shard_map.py`` runs it on two host devices
(:func:`on_two_host_devices`).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

import jax_cgtp
from family_members import relative_error

NODES, EDGES = 7, 24
IRREPS_X, IRREPS_Y = "8x0e+8x1o", "0e+1o"
INSTRUCTIONS = [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True), (0, 1, 1, "uvu", True), (1, 0, 1, "uvu", True)]
RADIAL = 4  # radial features per edge


@functools.lru_cache(maxsize=None)
def modules(deterministic: bool, backend: str):
    """The convolution and a node-wise product after it (shared weights)."""
    conv = jax_cgtp.TensorProductConv(IRREPS_X, IRREPS_Y, IRREPS_X, INSTRUCTIONS, deterministic=deterministic,
                                      backend=backend)
    node_tp = jax_cgtp.channelwise_tensor_product(IRREPS_X, IRREPS_Y, filter_ir_out="0e+1o", backend=backend)
    return conv, node_tp


def inputs(devices: int, dtype, seed: int = 0):
    """``(theta, x, pos, src, dst)``: ``theta`` shared, the others with one leading row per device."""
    conv, _ = modules(False, "reference")
    k = jax.random.split(jax.random.PRNGKey(seed), 5)
    theta = jax.random.normal(k[0], (RADIAL, conv.weight_numel), dtype)
    x = jax.random.normal(k[1], (devices, NODES, conv.irreps_in1.dim), dtype)
    pos = 2.0 * jax.random.normal(k[2], (devices, NODES, 3), dtype)
    src = jax.random.randint(k[3], (devices, EDGES), 0, NODES)
    dst = jax.random.randint(k[4], (devices, EDGES), 0, NODES)
    # the last edges are a padded batch's: out of the node range (see energy)
    src = src.at[:, -3:].set(jnp.array([NODES, 0, -1]))
    dst = dst.at[:, -3:].set(jnp.array([0, -1, NODES + 4]))
    return theta, x, pos, src, dst


def directions(vectors):
    """``0e + 1o`` features of ``vectors (rows, 3)``: one, and the unit vector."""
    r = jnp.sqrt(jnp.sum(vectors**2, axis=-1))
    return jnp.concatenate([jnp.ones_like(r)[:, None], vectors / r[:, None]], axis=-1), r


def energy(pos, x, theta, src, dst, *, deterministic, backend, sorted_graph):
    """A convolution over the edges (weights from the edge lengths), then a node-wise product with
    each node's direction from a fixed point."""
    conv, node_tp = modules(deterministic, backend)
    nodes = x.shape[0]
    real = (src >= 0) & (src < nodes) & (dst >= 0) & (dst < nodes)
    # a real edge's vector is never zero (self-loops are offset); a padding edge's features are NaN
    # and its weights Inf, as a padded batch's zero-length vectors make them (the model's own
    # derivatives stay finite: the values are selected in after the vector's norm)
    offset = jnp.array([0.1, 0.0, 0.0], pos.dtype)
    y, r = directions(jnp.where(real[:, None], pos[src] - pos[dst] + offset, offset))
    w = jnp.stack([jnp.cos(r), jnp.sin(r), r, r**2], axis=-1) @ theta
    y, w = jnp.where(real[:, None], y, jnp.nan), jnp.where(real[:, None], w, jnp.inf)
    if sorted_graph:
        nodes = conv(x, y, w, graph=jax_cgtp.sort_graph(src, dst, x.shape[0]))
    else:
        nodes = conv(x, y, w, src, dst, num_nodes=x.shape[0])
    attributes, _ = directions(pos - jnp.array([0.3, -0.2, 0.1], pos.dtype))
    h = node_tp(nodes, attributes, jnp.ones(node_tp.weight_numel, pos.dtype))
    return jnp.sum(h**2) + jnp.sum(nodes[:, :8] ** 2)


def loss(theta, x, pos, src, dst, **options):
    e, forces = jax.value_and_grad(energy)(pos, x, theta, src, dst, **options)
    return e + jnp.sum(forces**2)


def step(theta, x, pos, src, dst, **options):
    """``(loss, d loss / d theta, d loss / d x)`` of one device's data."""
    value, (d_theta, d_x) = jax.value_and_grad(functools.partial(loss, **options), argnums=(0, 1))(
        theta, x, pos, src, dst)
    return value, d_theta, d_x


def sharded_step(mesh: Mesh, **options):
    """The step over every device of ``mesh`` (axis ``data``): loss and ``theta``'s gradient
    summed over the devices (JAX sums the gradient of the replicated ``theta``)."""
    def local(theta, x, pos, src, dst):
        value, d_theta, d_x = step(theta, x[0], pos[0], src[0], dst[0], **options)
        return jax.lax.psum(value, "data"), d_theta, d_x[None]

    data = PartitionSpec("data")
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(PartitionSpec(), data, data, data, data),
                                 out_specs=(PartitionSpec(), PartitionSpec(), data)))


def pmapped_step(devices, **options):
    """The step under ``jax.pmap`` (each device's loss and gradients, summed here)."""
    mapped = jax.pmap(functools.partial(step, **options), in_axes=(None, 0, 0, 0, 0), devices=devices)

    def summed(*args):
        value, d_theta, d_x = mapped(*args)
        return jnp.sum(value), jnp.sum(d_theta, axis=0), d_x

    return summed


def errors(devices=None, dtype=jnp.float64, *, deterministic=False, sorted_graph=False, backend="auto") -> dict:
    """Relative errors of the step under shard_map (``*``) and under pmap (``pmap_*``) against each
    device's step run alone (on the first device, same backend: ``alone``) and against the
    reference backend (``reference``)."""
    devices = list(devices or jax.devices())
    mesh = Mesh(np.array(devices), ("data",))
    theta, x, pos, src, dst = inputs(len(devices), dtype)
    options = dict(deterministic=deterministic, sorted_graph=sorted_graph)
    runs = {"": sharded_step(mesh, backend=backend, **options)(theta, x, pos, src, dst),
            "pmap_": pmapped_step(devices, backend=backend, **options)(theta, x, pos, src, dst)}
    result = {"devices": [str(d) for d in devices]}
    for name, run_backend in (("alone", backend), ("reference", "reference")):
        one = jax.jit(functools.partial(step, backend=run_backend, **options))
        alone = [one(theta, x[d], pos[d], src[d], dst[d]) for d in range(len(devices))]
        expected = (sum(a[0] for a in alone), sum(a[1] for a in alone), jnp.stack([a[2] for a in alone]))
        for prefix, run in runs.items():
            for label, got, want in zip(("loss", "theta", "x"), run, expected):
                result[f"{prefix}{name}_{label}"] = relative_error(got, want)
    return result


def on_two_host_devices(argv: list[str], cwd):
    """The JSON that ``python argv...`` prints last, run in ``cwd`` by a fresh process on two CPU
    devices (JAX fixes the number of host devices when it starts); fails with its stderr."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2")
    run = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    jax.config.update("jax_enable_x64", True)
    print(json.dumps([errors(deterministic=d, sorted_graph=d) for d in (False, True)]))
