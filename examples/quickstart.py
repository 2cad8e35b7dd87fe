"""A NequIP-style message in a few lines: features x spherical harmonics, weights per edge.

Runs on CPU (reference path) and on an NVIDIA GPU (generated kernels) unchanged.
"""

import e3nn_jax as e3nn
import jax
import jax.numpy as jnp
from e3nn_jax.legacy import FunctionalTensorProduct

import jax_cgtp

num_edges = 1000
tp = jax_cgtp.channelwise_tensor_product("16x0e+16x1o+16x2e", "0e+1o+2e", filter_ir_out="0e+1o+2e")
print(tp)

keys = jax.random.split(jax.random.PRNGKey(0), 3)
features = jax.random.normal(keys[0], (num_edges, tp.irreps_in1.dim))
vectors = jax.random.normal(keys[1], (num_edges, 3))
sh = e3nn.spherical_harmonics(tp.irreps_in2, vectors, normalize=True).array
weights = jax.random.normal(keys[2], (num_edges, tp.weight_numel))

messages = jax.jit(tp)(features, sh, weights)
print("messages:", messages.shape, messages.dtype)


def loss(weights, features):
    forces = jax.grad(lambda sh: jnp.sum(tp(features, sh, weights) ** 2))(sh)
    return jnp.sum(forces**2)


grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(weights, features)
print("second-derivative gradients:", [g.shape for g in grads])

expected = FunctionalTensorProduct(
    tp.irreps_in1, tp.irreps_in2, tp.irreps_out,
    [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight) for i in tp.instructions],
)
reference = jax.vmap(
    lambda w, x, y: expected.left_right(w, e3nn.IrrepsArray(tp.irreps_in1, x), e3nn.IrrepsArray(tp.irreps_in2, y)).array
)(weights, features, sh)
print("max |jax_cgtp - e3nn-jax|:", float(jnp.max(jnp.abs(messages - reference))))
