"""cuEquivariance interop: a jax_cgtp problem as a ``cue.SegmentedPolynomial``.

:func:`polynomial` builds, path by path, the polynomial with inputs ``(x, y, w)`` and output
``z``: one segment per irrep block of ``x``, ``y`` and ``z`` with shape ``(ir.dim, mul)``
(cuEquivariance's ``ir_mul`` layout), one weight segment per weighted instruction (its
``path_shape``, so the flat weights are in e3nn's order), and one path per instruction whose
coefficient is jax_cgtp's normalised CG block ``path_weight * C``. It is the same function as the
jax_cgtp problem: for the channelwise (``uvu``) problems of MACE and NequIP it is the polynomial
of ``cue.descriptors.channelwise_tensor_product`` with e3nn's output blocks.

:func:`convolution` runs it as a fused graph convolution through
``cuequivariance_jax.segmented_polynomial`` (``method="uniform_1d"`` on a GPU when the problem
has one uniform mode, ``"naive"`` otherwise), taking and returning e3nn's ``mul_ir`` layout.
Needs ``pip install cuequivariance-jax`` (and, for ``uniform_1d``, its CUDA ops package).

>>> from jax_cgtp import channelwise_tensor_product
>>> tp = channelwise_tensor_product("8x0e+8x1o", "0e+1o", filter_ir_out="0e+1o")
>>> poly = polynomial(tp.problem)
>>> [op.size for op in poly.inputs], poly.outputs[0].size
([32, 4, 32], 64)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .core.graph import valid_edges
from .core.problem import Problem, cg_block

# Subscripts per mode: weights, x, y, z, then the CG indices; without the weight operand for
# unweighted paths.
_WEIGHTED = {"uvw": "uvw,iu,jv,kw", "uvu": "uv,iu,jv,ku", "uvv": "uv,iu,jv,kv", "uuw": "uw,iu,ju,kw",
             "uuu": "u,iu,ju,ku"}
_UNWEIGHTED = {"uvu": "iu,jv,ku", "uvv": "iu,jv,kv", "uuw": "iu,ju,k", "uuu": "iu,ju,ku"}


def _segmented_product(problem: Problem, instructions, subscripts: str, weighted: bool):
    import cuequivariance as cue

    stp = cue.SegmentedTensorProduct.from_subscripts(subscripts + "+ijk")
    first = 1 if weighted else 0
    for operand, irreps in enumerate((problem.irreps_in1, problem.irreps_in2, problem.irreps_out), first):
        for mul_ir in irreps:
            stp.add_segment(operand, (mul_ir.ir.dim, mul_ir.mul))
    for ins in instructions:
        segments = (ins.i_in1, ins.i_in2, ins.i_out)
        if weighted:
            segments = (stp.add_segment(0, ins.path_shape),) + segments
        stp.add_path(*segments, c=cg_block(problem, ins))
    return stp


def polynomial(problem: Problem):
    """The ``cue.SegmentedPolynomial`` with inputs ``(x, y, w)`` and output ``z`` of ``problem``.

    Raises ``ValueError`` for problems it does not map: mixed modes, no weighted path, or
    weighted paths that are inactive (their weight segment would have no path).
    """
    import cuequivariance as cue

    modes = {ins.mode for ins in problem.instructions}
    if len(modes) != 1:
        raise ValueError(f"cuEquivariance: one polynomial per mode is needed, the problem mixes modes {sorted(modes)}")
    (mode,) = modes
    weighted = [ins for ins in problem.active_instructions if ins.has_weight]
    unweighted = [ins for ins in problem.active_instructions if not ins.has_weight]
    if not weighted or any(ins.has_weight and not ins.is_active for ins in problem.instructions):
        raise ValueError("cuEquivariance: problems with inactive weighted paths or without weights are not mapped")
    operations = [(cue.Operation((2, 0, 1, 3)), _segmented_product(problem, weighted, _WEIGHTED[mode], True))]
    if unweighted:
        operations.append((cue.Operation((0, 1, 3)), _segmented_product(problem, unweighted, _UNWEIGHTED[mode], False)))
    w_op, x_op, y_op, z_op = operations[0][1].operands
    return cue.SegmentedPolynomial([x_op, y_op, w_op], [z_op], operations)


def uniform_1d_obstacle(poly) -> str | None:
    """Why ``method="uniform_1d"`` cannot run ``poly`` (it needs one uniform mode after
    cuEquivariance's canonicalisation), or None when it can."""
    canonical = poly.flatten_coefficient_modes().squeeze_modes().canonicalize_subscripts()
    for _, stp in canonical.operations:
        modes = stp.subscripts.modes()
        if len(modes) > 1:
            return f"uniform_1d needs one uniform mode, this problem has {len(modes)} ({stp.subscripts})"
    return None


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
    """``array[..., irreps.dim]`` from e3nn's ``mul_ir`` layout (``a[u * d + i]`` per block) to
    ``ir_mul`` (``a[i * mul + u]``). A permutation of the last axis, so gradients convert alike.

    >>> import jax.numpy as jnp, e3nn_jax as e3nn
    >>> mul_ir_to_ir_mul(e3nn.Irreps("2x0e+2x1o"), jnp.arange(8.0)).tolist()
    [0.0, 1.0, 2.0, 5.0, 3.0, 6.0, 4.0, 7.0]
    """
    return _convert(irreps, array, to_ir_mul=True)


def ir_mul_to_mul_ir(irreps, array):
    """The inverse of :func:`mul_ir_to_ir_mul`.

    >>> import jax.numpy as jnp, e3nn_jax as e3nn
    >>> ir_mul_to_mul_ir(e3nn.Irreps("2x0e+2x1o"), jnp.array([0.0, 1.0, 2.0, 5.0, 3.0, 6.0, 4.0, 7.0])).tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    """
    return _convert(irreps, array, to_ir_mul=False)


def default_method(poly) -> str:
    """``"uniform_1d"`` on a GPU when ``poly`` has one uniform mode, else ``"naive"``."""
    return "uniform_1d" if jax.default_backend() == "gpu" and uniform_1d_obstacle(poly) is None else "naive"


def convolution(problem: Problem, x, y, w, src, dst, num_nodes: int, *, method: str | None = None):
    """``out[n] = sum_{e: dst[e] == n} T(x[src[e]], y[e], w[e])`` on cuequivariance-jax.

    ``x`` is ``(N_src, dim1)``, ``y`` ``(E, dim2)`` and ``w`` ``(E, weight_numel)``, in e3nn's
    layout and weight order; the result is ``(num_nodes, dim_out)``. As in
    :class:`jax_cgtp.TensorProductConv`, edges with ``src`` or ``dst`` outside the node range
    contribute nothing: their ``y`` is zeroed and their indices point at node 0, because
    cuEquivariance does not check its indices.
    """
    import cuequivariance_jax as cuex

    poly = polynomial(problem)
    method = method or default_method(poly)
    valid = valid_edges(src, dst, x.shape[0], num_nodes)
    y = jnp.where(valid[:, None], y, 0)
    src, dst = jnp.where(valid, src, 0), jnp.where(valid, dst, 0)
    x = mul_ir_to_ir_mul(problem.irreps_in1, x)
    y = mul_ir_to_ir_mul(problem.irreps_in2, y)
    out = jax.ShapeDtypeStruct((num_nodes, problem.irreps_out.dim), x.dtype)
    [z] = cuex.segmented_polynomial(poly, [x, y, w], [out], [src, None, None, dst], method=method)
    return ir_mul_to_mul_ir(problem.irreps_out, z)
