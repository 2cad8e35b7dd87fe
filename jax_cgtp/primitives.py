"""The primitive family, closed under differentiation.

One primitive, ``cgtp``, whose parameter ``output`` says which of the four operands
``x, y, w, z`` it produces from the other three: member ``output=o`` is the gradient of the
quadrilinear form ``F(x, y, w, z) = <z, T(x, y, w)>`` with respect to ``o``
(see :mod:`jax_cgtp.reference`). Since ``F`` is linear in each operand:

* JVP: the tangent of member ``o`` is the sum, over inputs with a nonzero tangent, of member
  ``o`` with that input replaced by its tangent (for ``w``, on the weighted instructions only:
  unweighted paths do not depend on ``w``, so ``F`` is affine, not linear, in ``w``);
* transpose: with respect to input ``a``, given the cotangent ``c`` of output ``o``, it is
  member ``a`` with ``o := c``;
* batching: the mapped axis is folded into the edge axis (see :func:`_batch`).

So every derivative of every order is again a ``cgtp`` call, and every ``cgtp`` call runs on
our kernels. Arguments are ``(*inputs, *indices)``: the three input operands in canonical order
``x, y, w, z`` without the output, then the int index arrays of the INDEXED operands in
canonical order (including the output's, if it is INDEXED).

Parameters: ``problem`` (:class:`~jax_cgtp.problem.Problem`), ``output``, ``kinds`` (the row
kind of each of ``x, y, w, z``, see :mod:`jax_cgtp.operands`), ``output_rows`` (row count of
an INDEXED output, else ``None``) and ``backend``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax._src import dispatch  # apply_primitive: eager evaluation through the lowering
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import reference
from .operands import BATCHED, INDEXED, SHARED, indexed_operands, input_operands, kind_of

cgtp_p = Primitive("cgtp")
cgtp_p.def_impl(functools.partial(dispatch.apply_primitive, cgtp_p))


def bind(problem, output, kinds, operands, indices, *, output_rows=None, backend="auto"):
    """Call member ``output`` with ``operands`` and ``indices`` given as dicts by operand name."""
    args = [operands[op] for op in input_operands(output)]
    args += [indices[op] for op in indexed_operands(kinds)]
    return cgtp_p.bind(
        *args,
        problem=problem,
        output=output,
        kinds=tuple(kinds),
        output_rows=output_rows,
        backend=backend,
    )


def _split(args, output, kinds):
    inputs = input_operands(output)
    operands = dict(zip(inputs, args[:3]))
    indices = dict(zip(indexed_operands(kinds), args[3:]))
    return operands, indices


def _num_edges(shapes, output, kinds) -> int:
    operands, indices = _split(shapes, output, kinds)
    for op, shape in operands.items():
        if kind_of(kinds, op) == BATCHED:
            return shape[0]
    for shape in indices.values():
        return shape[0]
    raise ValueError("cgtp: at least one operand must be batched or indexed")


def _abstract_eval(*avals, problem, output, kinds, output_rows, backend):
    del backend
    dim = problem.operand_dim(output)
    kind = kind_of(kinds, output)
    if kind == SHARED:
        shape = (dim,)
    elif kind == INDEXED:
        shape = (output_rows, dim)
    else:
        shape = (_num_edges([a.shape for a in avals], output, kinds), dim)
    return jax.core.ShapedArray(shape, avals[0].dtype)


cgtp_p.def_abstract_eval(_abstract_eval)


def _jvp(primals, tangents, **params):
    out = cgtp_p.bind(*primals, **params)
    terms = []
    for position, operand in enumerate(input_operands(params["output"])):
        if type(tangents[position]) is ad.Zero:
            continue
        args = list(primals)
        args[position] = tangents[position]
        term_params = dict(params)
        if operand == "w":  # unweighted paths are constant in w
            term_params["problem"] = params["problem"].weighted_part()
        terms.append(cgtp_p.bind(*args, **term_params))
    if not terms:
        return out, jnp.zeros_like(out)
    return out, functools.reduce(jnp.add, terms)


ad.primitive_jvps[cgtp_p] = _jvp


def _transpose(cotangent, *args, problem, output, kinds, output_rows, backend):
    linear = [n for n in range(3) if ad.is_undefined_primal(args[n])]
    if len(linear) != 1:
        raise ValueError(f"cgtp is transposed with respect to one operand, got {len(linear)}")
    position = linear[0]
    inputs = input_operands(output)
    target = inputs[position]
    result = [None] * len(args)
    if type(cotangent) is ad.Zero:
        result[position] = ad.Zero(args[position].aval)
        return result
    operands, indices = _split(args, output, kinds)
    del operands[target]
    operands[output] = cotangent
    target_rows = args[position].aval.shape[0] if kind_of(kinds, target) == INDEXED else None
    result[position] = bind(
        problem, target, kinds, operands, indices, output_rows=target_rows, backend=backend
    )
    return result


ad.primitive_transposes[cgtp_p] = _transpose


def _batch(args, dims, *, problem, output, kinds, output_rows, backend):
    """Fold the vmapped axis (size V) into the edge axis (E -> V*E).

    BATCHED operands are reshaped to ``(V*E, dim)`` (broadcast first if unmapped); a mapped
    SHARED operand becomes INDEXED with ``V`` rows and index ``e // E``; a mapped INDEXED
    operand with ``N`` rows becomes ``(V*N, dim)`` with its indices offset by ``v*N``.
    The output is always mapped, at axis 0.
    """
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    args = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    mapped = [d is not None for d in dims]
    shapes = [a.shape[1:] if m else a.shape for a, m in zip(args, mapped)]
    edges = _num_edges(shapes, output, kinds)
    operands, indices = _split(list(zip(args, mapped)), output, kinds)
    index_of_edge = {op: _flat_index(a, m, size, edges) for op, (a, m) in indices.items()}
    edge_to_vmap_row = jnp.arange(size * edges, dtype=jnp.int32) // max(edges, 1)

    new_kinds = dict(zip(("x", "y", "w", "z"), kinds))
    new_operands, new_indices = {}, {}
    for op, (array, is_mapped) in operands.items():
        kind = new_kinds[op]
        if kind == BATCHED:
            if not is_mapped:
                array = jnp.broadcast_to(array, (size,) + array.shape)
            new_operands[op] = array.reshape((size * edges,) + array.shape[2:])
        elif kind == SHARED:
            new_operands[op] = array
            if is_mapped:
                new_kinds[op] = INDEXED
                new_indices[op] = edge_to_vmap_row
        else:
            index = index_of_edge[op]
            if is_mapped:
                rows = array.shape[1]
                index = _offset_index(index, rows, size, edges)
                array = array.reshape((size * rows,) + array.shape[2:])
            new_operands[op] = array
            new_indices[op] = index

    out_kind = new_kinds[output]
    new_rows = None
    if out_kind == SHARED:
        new_kinds[output] = INDEXED
        new_indices[output] = edge_to_vmap_row
        new_rows = size
    elif out_kind == INDEXED:
        new_indices[output] = _offset_index(index_of_edge[output], output_rows, size, edges)
        new_rows = size * output_rows

    kinds_tuple = tuple(new_kinds[op] for op in ("x", "y", "w", "z"))
    result = bind(
        problem, output, kinds_tuple, new_operands, new_indices,
        output_rows=new_rows, backend=backend,
    )
    if out_kind == BATCHED:
        result = result.reshape((size, edges, result.shape[-1]))
    elif out_kind == INDEXED:
        result = result.reshape((size, output_rows, result.shape[-1]))
    return result, 0


def _flat_index(index, is_mapped, size, edges):
    """Index array of the folded edge axis, shape ``(V*E,)``."""
    if not is_mapped:
        index = jnp.broadcast_to(index, (size, edges))
    return index.reshape(size * edges)


def _offset_index(index, rows, size, edges):
    """Shift the folded index of vmap slice ``v`` by ``v*rows``; invalid stays invalid."""
    offset = (jnp.arange(size * edges, dtype=index.dtype) // max(edges, 1)) * rows
    valid = (index >= 0) & (index < rows)
    return jnp.where(valid, index + offset, -1)


batching.primitive_batchers[cgtp_p] = _batch


def _reference_lowering(*args, problem, output, kinds, output_rows, backend):
    del backend
    return reference.member(problem, output, kinds, output_rows, *args)


mlir.register_lowering(cgtp_p, mlir.lower_fun(_reference_lowering, multiple_results=False))
