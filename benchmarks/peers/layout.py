"""Conversion between e3nn's ``mul_ir`` layout and the ``ir_mul`` layout of cuEquivariance.

In ``mul_ir`` a block ``mul x ir`` stores ``a[u * d + i]``; in ``ir_mul`` it stores
``a[i * mul + u]``. Both are permutations of the last axis, so gradients convert the same way.

>>> import jax.numpy as jnp, e3nn_jax as e3nn
>>> a = jnp.arange(8.0)[None]                        # 2x0e + 2x1o: [a0, b0, (x y z)_0, (x y z)_1]
>>> mul_ir_to_ir_mul(e3nn.Irreps("2x0e+2x1o"), a).tolist()
[[0.0, 1.0, 2.0, 5.0, 3.0, 6.0, 4.0, 7.0]]
>>> ir_mul_to_mul_ir(e3nn.Irreps("2x0e+2x1o"), mul_ir_to_ir_mul(e3nn.Irreps("2x0e+2x1o"), a)).tolist()
[[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]]
"""

from __future__ import annotations

import jax.numpy as jnp


def _convert(irreps, array, to_ir_mul: bool):
    blocks, offset = [], 0
    lead = array.shape[:-1]
    for mul_ir in irreps:
        mul, dim = mul_ir.mul, mul_ir.ir.dim
        block = array[..., offset : offset + mul * dim]
        offset += mul * dim
        shape = (mul, dim) if to_ir_mul else (dim, mul)
        blocks.append(jnp.swapaxes(block.reshape(lead + shape), -1, -2).reshape(lead + (mul * dim,)))
    return jnp.concatenate(blocks, axis=-1) if blocks else array


def mul_ir_to_ir_mul(irreps, array):
    """``array[..., irreps.dim]`` from ``mul_ir`` to ``ir_mul`` layout."""
    return _convert(irreps, array, to_ir_mul=True)


def ir_mul_to_mul_ir(irreps, array):
    """``array[..., irreps.dim]`` from ``ir_mul`` back to ``mul_ir`` layout."""
    return _convert(irreps, array, to_ir_mul=False)
