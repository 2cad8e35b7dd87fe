"""The primitive family, closed under differentiation.

One primitive, ``cgtp``, with a :class:`~jax_cgtp.core.call.Call` parameter that says which outputs it
produces and, for each, which terms it sums (see :mod:`jax_cgtp.core.call`). Every term is linear in
each of its three arguments, so:

* JVP: the tangent of an output is one call whose terms are the original terms with one
  argument at a time replaced by its tangent (a replaced ``w`` keeps the weighted paths only:
  unweighted paths do not depend on ``w``). The tangent of ``T(x, y, w)`` is one call with three
  terms, not three calls.
* transpose: with respect to the undefined inputs, all at once: the cotangent of input ``a`` is
  the sum, over terms that read ``a``, of the member of ``a``'s role evaluated on the term's other
  arguments and the output's cotangent. Transposing the JVP of ``T`` therefore gives the fused
  backward: one call that produces ``x̄, ȳ, w̄`` together.
* batching: the mapped axis is folded into the edge axis (see :func:`_batch`).

So every derivative of every order is again a ``cgtp`` call, and every ``cgtp`` call runs on
our kernels (or, off the GPU, on the pure-JAX reference).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax._src import dispatch  # apply_primitive: eager evaluation through the lowering
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from . import mesh_axes, reference
from .call import Call, Output, Term, accumulation_dtype, num_edges, output_shape, prune_inputs
from .graph import sort_edges
from .operands import BATCHED, INDEXED, OPERANDS, SHARED

cgtp_p = Primitive("cgtp")
cgtp_p.multiple_results = True
cgtp_p.def_impl(functools.partial(dispatch.apply_primitive, cgtp_p))


def bind(call: Call, inputs, indices=None, schedules=None, *, backend="auto"):
    """Run ``call`` on its inputs; ``indices``/``schedules`` are dicts by role. Returns a list."""
    call.validate()
    indices = indices or {}
    args = list(inputs) + [indices[r] for r in call.indexed_roles]
    for role in call.sorted_roles:
        args += list(schedules[role])
    return _bind(args, call, backend)


def _bind(args, call: Call, backend):
    """``cgtp_p.bind`` on ``args`` made to vary over the same manual axes (:mod:`.mesh_axes`)."""
    return cgtp_p.bind(*mesh_axes.match(args), call=call, backend=backend)


def _abstract_eval(*avals, call, backend):
    del backend
    mesh_axes.check_not_explicitly_sharded(avals)
    edges = num_edges(call, [a.shape for a in avals])
    dtype = avals[0].dtype
    # _bind gives every operand the same manual axes: the results vary over the first one's
    return [mesh_axes.shaped_like(avals[0], output_shape(call, o.role, edges), dtype) for o in call.outputs]


cgtp_p.def_abstract_eval(_abstract_eval)


def _bind_nonempty(call: Call, inputs, tail, backend, avals):
    """Bind the outputs that have terms; the others are symbolic zeros of ``avals``."""
    live = [k for k, o in enumerate(call.outputs) if o.terms]
    results = [ad.Zero(aval) for aval in avals]
    if live:
        live_call = dataclasses.replace(call, outputs=tuple(call.outputs[k] for k in live))
        live_call, inputs = prune_inputs(live_call, list(inputs))
        for k, value in zip(live, _bind([*inputs, *tail], live_call, backend)):
            results[k] = value
    return results


def bind_tangents(call: Call, primals, tangents, backend="auto"):
    """The tangents of ``call``'s outputs, as one call (the primal outputs are not computed).

    ``primals`` are the call's flat arguments, ``tangents`` one per input (``None`` where zero).
    An output with no nonzero tangent comes back as a symbolic zero (``ad.Zero``).
    """
    n = call.num_inputs
    nonzero = [i for i in range(n) if tangents[i] is not None]
    position = {i: n + k for k, i in enumerate(nonzero)}
    outputs = []
    for output in call.outputs:
        roles = call.term_roles(output.role)
        terms = []
        for term in output.terms:
            for slot, arg in enumerate(term.args):
                if arg in position:
                    args = list(term.args)
                    args[slot] = position[arg]
                    terms.append(Term(tuple(args), term.weighted_only or roles[slot] == "w"))
        outputs.append(Output(output.role, tuple(terms)))
    tangent_call = dataclasses.replace(
        call, roles=call.roles + tuple(call.roles[i] for i in nonzero), outputs=tuple(outputs)
    )
    inputs = list(primals[:n]) + [tangents[i] for i in nonzero]
    avals = _abstract_eval(*(jax.typeof(a) for a in primals), call=call, backend=backend)
    return _bind_nonempty(tangent_call, inputs, primals[n:], backend, avals)


def _jvp(primals, tangents, *, call, backend):
    out = _bind(primals, call, backend)
    tangents = [None if type(t) is ad.Zero else t for t in tangents[: call.num_inputs]]
    return out, bind_tangents(call, primals, tangents, backend)


ad.primitive_jvps[cgtp_p] = _jvp


def _transpose(cotangents, *args, call, backend):
    n = call.num_inputs
    undefined = [i for i in range(n) if ad.is_undefined_primal(args[i])]
    if any(ad.is_undefined_primal(a) for a in args[n:]):
        raise ValueError("cgtp is not linear in its index arrays")
    inputs, index_of = [], {}
    for i in range(n):
        if i not in undefined:
            index_of[i] = len(inputs)
            inputs.append(args[i])
    cotangent_of, roles = {}, [call.roles[i] for i in range(n) if i not in undefined]
    for k, (output, cotangent) in enumerate(zip(call.outputs, cotangents)):
        if type(cotangent) is not ad.Zero:
            cotangent_of[k] = len(inputs)
            inputs.append(cotangent)
            roles.append(output.role)

    outputs = []
    for a in undefined:
        role = call.roles[a]
        terms = []
        for k, output in enumerate(call.outputs):
            if k not in cotangent_of:
                continue
            for term in output.terms:
                if a not in term.args:
                    continue
                if any(b in undefined for b in term.args if b != a):
                    raise ValueError("cgtp is transposed with respect to one argument per term")
                by_role = {r: index_of[b] for r, b in zip(call.term_roles(output.role), term.args) if b != a}
                by_role[output.role] = cotangent_of[k]
                terms.append(Term(tuple(by_role[r] for r in call.term_roles(role)), term.weighted_only))
        outputs.append(Output(role, tuple(terms)))
    transposed = dataclasses.replace(call, roles=tuple(roles), outputs=tuple(outputs))
    results = _bind_nonempty(transposed, inputs, args[n:], backend, [args[a].aval for a in undefined])
    full = [None] * len(args)
    for a, value in zip(undefined, results):
        full[a] = value
    return full


ad.primitive_transposes[cgtp_p] = _transpose


def _batch(args, dims, *, call, backend):
    """Fold the vmapped axis (size V) into the edge axis (E -> V*E).

    A role is *mapped* if one of its inputs is, or if it is a SHARED or INDEXED output (each
    slice gets its own). BATCHED arrays become ``(V*E, dim)``; a mapped SHARED role becomes
    INDEXED with V rows and index ``e // E`` (BATCHED where each slice has one edge: a vmapped
    per-sample product); a mapped INDEXED role with N rows becomes V*N rows,
    its index shifted by ``v*N``. Unmapped inputs of a mapped role are broadcast. Deterministic
    calls (and walks in sorted order) re-sort the folded indices. Outputs come back mapped at axis 0.
    """
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    mapped = [d is not None for d in dims]
    args = [jnp.moveaxis(a, d, 0) if d is not None else a for a, d in zip(args, dims)]
    n = call.num_inputs
    edges = num_edges(call, [a.shape[1:] if m else a.shape for a, m in zip(args, mapped)])
    output_roles = {o.role for o in call.outputs}
    role_mapped = {
        r: any(mapped[i] for i in range(n) if call.roles[i] == r)
        or (r in output_roles and call.kind(r) != BATCHED)
        for r in OPERANDS
    }
    kinds = dict(zip(OPERANDS, call.kinds))
    rows = dict(zip(OPERANDS, call.rows))
    inputs, indices, _ = call.split(list(zip(args, mapped)))
    folded_index = {r: _fold_index(index, m, size, edges) for r, (index, m) in indices.items()}

    new_inputs = []
    for role, (array, is_mapped) in zip(call.roles, inputs):
        kind = kinds[role]
        if kind == BATCHED:
            array = array if is_mapped else jnp.broadcast_to(array, (size,) + array.shape)
            array = array.reshape((size * edges,) + array.shape[2:])
        elif role_mapped[role]:
            array = array if is_mapped else jnp.broadcast_to(array, (size,) + array.shape)
            if kind == INDEXED:
                array = array.reshape((size * array.shape[1],) + array.shape[2:])
        new_inputs.append(array)

    new_indices = {}
    for role in OPERANDS:
        if not role_mapped[role] or kinds[role] == BATCHED:
            if kinds[role] == INDEXED:
                new_indices[role] = folded_index[role]
            continue
        if kinds[role] == SHARED and edges == 1:  # one row per slice: per edge, no index
            kinds[role] = BATCHED
        elif kinds[role] == SHARED:
            kinds[role], rows[role] = INDEXED, size
            new_indices[role] = jnp.arange(size * edges, dtype=jnp.int32) // max(edges, 1)
        else:
            new_indices[role] = _shift_index(folded_index[role], rows[role], size, edges)
            rows[role] = size * rows[role]
    new_call = dataclasses.replace(
        call, kinds=tuple(kinds[r] for r in OPERANDS), rows=tuple(rows[r] for r in OPERANDS)
    )
    schedules = {r: sort_edges(new_indices[r], rows[r]) for r in new_call.sorted_roles}
    results = bind(new_call, new_inputs, new_indices, schedules, backend=backend)
    shaped = []
    for output, result in zip(call.outputs, results):
        kind = call.kind(output.role)
        if kind == SHARED:
            shaped.append(result)
        else:
            per_slice = edges if kind == BATCHED else call.row_count(output.role)
            shaped.append(result.reshape((size, per_slice) + result.shape[1:]))
    return shaped, [0] * len(shaped)


def _fold_index(index, is_mapped, size, edges):
    """Index array of the folded edge axis, shape ``(V*E,)``."""
    if not is_mapped:
        index = jnp.broadcast_to(index, (size, edges))
    return index.reshape(size * edges)


def _shift_index(index, rows, size, edges):
    """Shift the folded index of vmap slice ``v`` by ``v*rows``; invalid stays invalid."""
    offset = (jnp.arange(size * edges, dtype=index.dtype) // max(edges, 1)) * rows
    valid = (index >= 0) & (index < rows)
    return jnp.where(valid, index + offset, -1)


batching.primitive_batchers[cgtp_p] = _batch


def reference_outputs(call: Call, *args):
    """Every output of ``call`` as the sum of its terms, each on the pure-JAX reference, accumulated
    in :func:`~jax_cgtp.core.call.accumulation_dtype` and rounded once to the inputs' dtype."""
    inputs, indices, _ = call.split(args)
    dtype = inputs[0].dtype
    if accumulation_dtype(dtype) != dtype:
        results = reference_outputs(call, *[a.astype(accumulation_dtype(dtype)) for a in inputs], *args[len(inputs):])
        return [r.astype(dtype) for r in results]
    index_args = [indices[r] for r in call.indexed_roles]
    results = []
    for output in call.outputs:
        total = None
        for term in output.terms:
            value = reference.member(
                call.term_problem(term), output.role, call.kinds, call.row_count(output.role),
                *[inputs[a] for a in term.args], *index_args,
            )
            total = value if total is None else total + value
        results.append(total)
    return results


def reference_lowering(call: Call, backend: str, *args):
    """The outputs of ``call`` on the pure-JAX reference (:func:`reference_outputs`); wired onto
    :data:`cgtp_p` with the sharding rules by :mod:`jax_cgtp.lowerings`."""
    if backend == "cuda":
        raise ValueError("backend='cuda' needs the computation to be lowered for an NVIDIA GPU; "
                         "use backend='auto' to fall back to the reference path elsewhere")
    return reference_outputs(call, *args)
