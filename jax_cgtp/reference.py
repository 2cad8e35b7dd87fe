"""Pure-JAX implementation of every family member: the CPU path and the ground truth.

Member ``output=o`` computes the gradient of the scalar quadrilinear form

    F(x, y, w, z) = sum_e sum_paths pw * C[i,j,k] * x[e,u,i] * y[e,v,j] * W[e,(uvw)] * z[e,w',k]

with respect to operand ``o``, given the other three (``output="z"`` is the tensor product
itself). Per path this is one einsum over the dense CG block; rows are gathered, broadcast,
summed or scattered according to each operand's kind (see :mod:`jax_cgtp.operands`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .operands import BATCHED, INDEXED, SHARED, indexed_operands, input_operands, kind_of
from .problem import Instruction, Problem, cg_block

_CG_SUBSCRIPT = {"x": "i", "y": "j", "z": "k"}


def _subscript(ins: Instruction, operand: str, per_edge: bool) -> str:
    edge = "e" if per_edge else ""
    return edge + ins.letters(operand) + _CG_SUBSCRIPT.get(operand, "")


def _valid(index: jax.Array, rows: int) -> jax.Array:
    return (index >= 0) & (index < rows)


def gather_rows(array: jax.Array, index: jax.Array) -> jax.Array:
    """``array[index]`` where ``index`` lies in ``[0, len(array))``; the other rows are unspecified
    (row 0's, or zeros when ``array`` has no rows) and must be selected away (:func:`select_rows`)."""
    if array.shape[0] == 0:
        return jnp.zeros(index.shape + array.shape[1:], array.dtype)
    return jnp.take(array, jnp.where(_valid(index, array.shape[0]), index, 0), axis=0)


def select_rows(valid: jax.Array, rows: jax.Array) -> jax.Array:
    """``rows[e]`` where ``valid[e]``, else exact zeros: a select, so that the values of an invalid
    row (NaN and Inf included) never reach a result, as they would through ``0 * row``."""
    return jnp.where(valid.reshape(valid.shape + (1,) * (rows.ndim - 1)), rows, jnp.zeros((), rows.dtype))


def scatter_rows(values: jax.Array, index: jax.Array, rows: int) -> jax.Array:
    """``out[n] = sum of values[e] over index[e] == n``; out-of-range indices are dropped."""
    index = jnp.where(_valid(index, rows), index, rows)
    return jax.ops.segment_sum(values, index, num_segments=rows)


def _operand_block(problem: Problem, ins: Instruction, operand: str, array: jax.Array):
    """The instruction's block of a per-edge or shared operand, with multiplicity split out."""
    if operand == "w":
        block = array[..., ins.weight_offset : ins.weight_offset + ins.weight_numel]
        return block.reshape(array.shape[:-1] + ins.path_shape)
    offset, mul, dim = problem.block(ins, operand)
    block = array[..., offset : offset + mul * dim]
    muls = (mul,) * len(ins.letters(operand))
    return block.reshape(array.shape[:-1] + muls + (dim,))


def _contract(problem, ins, output, rows, output_per_edge, dtype):
    """One path's contribution to the output block (per edge or summed over edges).

    Without weights a multiplicity letter of the output can be absent from the inputs (the
    y-gradient of unweighted ``uvu`` is the same for every v): it is broadcast.
    """
    operands = [jnp.asarray(cg_block(problem, ins), dtype)]
    subscripts = ["ijk"]
    for op, (array, per_edge) in rows.items():
        if op == "w" and not ins.has_weight:
            continue
        operands.append(_operand_block(problem, ins, op, array))
        subscripts.append(_subscript(ins, op, per_edge))
    target = _subscript(ins, output, output_per_edge)
    present = "".join(c for c in target if any(c in sub for sub in subscripts))
    result = jnp.einsum(
        ",".join(subscripts) + "->" + present, *operands, precision=jax.lax.Precision.HIGHEST
    )
    if present == target:
        return result
    sizes = {"u": ins.mul_in1, "v": ins.mul_in2, "w": ins.mul_out}
    expanded = jnp.expand_dims(result, [n for n, c in enumerate(target) if c not in present])
    return jnp.broadcast_to(expanded, [result.shape[present.index(c)] if c in present else sizes[c] for c in target])


def _assemble(problem, output, contributions, leading, dtype):
    """Concatenate per-block contributions into the output operand's flat layout."""
    if output == "w":
        pieces = []
        for n, ins in enumerate(problem.instructions):
            if not ins.has_weight:
                continue
            block = contributions.get(n)
            if block is None:
                block = jnp.zeros(leading + ins.path_shape, dtype)
            pieces.append(block.reshape(leading + (ins.weight_numel,)))
    else:
        irreps = {"x": problem.irreps_in1, "y": problem.irreps_in2, "z": problem.irreps_out}[output]
        index_of = {"x": "i_in1", "y": "i_in2", "z": "i_out"}[output]
        sums = {}
        for n, block in contributions.items():
            slot = getattr(problem.instructions[n], index_of)
            sums[slot] = block if slot not in sums else sums[slot] + block
        pieces = [
            sums[slot].reshape(leading + (mul_ir.dim,))
            if slot in sums
            else jnp.zeros(leading + (mul_ir.dim,), dtype)
            for slot, mul_ir in enumerate(irreps)
        ]
    if not pieces:
        return jnp.zeros(leading + (0,), dtype)
    return jnp.concatenate(pieces, axis=-1)


def member(problem: Problem, output: str, kinds: tuple, output_rows, *args):
    """Evaluate family member ``output`` on ``args = (*inputs, *indices)`` (see primitives)."""
    inputs = input_operands(output)
    arrays = dict(zip(inputs, args[: len(inputs)]))
    indices = dict(zip(indexed_operands(kinds), args[len(inputs) :]))
    dtype = args[0].dtype
    num_edges = _num_edges(kinds, arrays, indices)
    valid = _valid_edges(indices, arrays, output_rows)

    rows = {}
    for op, array in arrays.items():
        kind = kind_of(kinds, op)
        if kind == INDEXED:
            array = gather_rows(array, indices[op])
        if kind != SHARED and valid is not None:  # every indexed call: ``valid`` covers the gather
            array = select_rows(valid, array)
        rows[op] = (array, kind != SHARED)

    out_kind = kind_of(kinds, output)
    per_edge = out_kind != SHARED
    contributions = {
        n: _contract(problem, ins, output, rows, per_edge, dtype)
        for n, ins in enumerate(problem.instructions)
        if ins.is_active and (output != "w" or ins.has_weight)
    }
    leading = (num_edges,) if per_edge else ()
    result = _assemble(problem, output, contributions, leading, dtype)
    if out_kind == INDEXED:
        result = scatter_rows(result, indices[output], output_rows)
    return result


def _valid_edges(indices, arrays, output_rows):
    """Mask of the edges every index of the call keeps in range (None without indices). An edge
    outside it is padding: it reads no row, and its per-edge rows are selected away."""
    valid = None
    for op, index in indices.items():
        rows = arrays[op].shape[0] if op in arrays else output_rows
        in_range = _valid(index, rows)
        valid = in_range if valid is None else valid & in_range
    return valid


def _num_edges(kinds, arrays, indices) -> int:
    for op, array in arrays.items():
        if kind_of(kinds, op) == BATCHED:
            return array.shape[0]
    for index in indices.values():
        return index.shape[0]
    raise ValueError("a family member needs at least one batched or indexed operand")
