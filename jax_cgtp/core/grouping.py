"""Edges grouped by an index, on every call: the ordering an atomic convolution walks when it is
given no sorted graph (the primitive ``cgtp_group``).

``group_edges(index, rows)`` returns ``(perm, offsets)`` laid out as
:func:`jax_cgtp.core.graph.sort_edges`'s (CSR ``offsets`` over ``rows`` nodes; edges below the range
first, edges above it last), except that within a node's run the edges come in no fixed order (the
atomic kernels sum them in no fixed order anyway), and that ``offsets`` has one more entry,
``offsets[rows + 1]``, the longest run: a walk that adds the edges past each run's first few
(``Settings.owned_run_cap``) returns at once where no run is that long. Its lowering here
(:func:`reference_lowering`; also under ``vmap`` and for ``backend="reference"``, whose lowering
does not read the ordering, so XLA drops it) is ``sort_edges``'s stable argsort, one valid
grouping; on a GPU it is the counting sort of :mod:`jax_cgtp.gpu.grouping_kernels`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax._src import dispatch  # apply_primitive: eager evaluation through the lowering
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import mesh_axes
from .graph import sort_edges

group_p = Primitive("cgtp_group")
group_p.multiple_results = True
group_p.def_impl(functools.partial(dispatch.apply_primitive, group_p))


def group_edges(index, rows: int, *, backend: str = "auto") -> tuple[jax.Array, jax.Array]:
    """``(perm, offsets)`` of ``index`` (int32 or int64, shape ``(E,)``) over ``rows`` nodes: the
    edges grouped by node, in no fixed order within a node, and ``offsets`` of ``rows + 2``
    entries, the CSR offsets and the longest run (see the module's docstring).

    >>> perm, offsets = group_edges(jnp.array([2, 0, 2, 1]), 3)
    >>> offsets.tolist()
    [0, 1, 2, 4, 2]
    """
    return tuple(group_p.bind(jnp.asarray(index), rows=int(rows), backend=backend))


def _abstract_eval(index, *, rows, backend):
    del backend
    mesh_axes.check_not_explicitly_sharded([index])
    return [mesh_axes.shaped_like(index, index.shape, index.dtype),
            mesh_axes.shaped_like(index, (rows + 2,), index.dtype)]


group_p.def_abstract_eval(_abstract_eval)


def _jvp(primals, tangents, *, rows, backend):
    del tangents
    outputs = group_p.bind(*primals, rows=rows, backend=backend)
    return outputs, [ad.Zero.from_primal_value(o) for o in outputs]


ad.primitive_jvps[group_p] = _jvp


def _batch(args, dims, *, rows, backend):
    del backend
    (index,), (axis,) = args, dims
    return jax.vmap(functools.partial(sorted_grouping, rows=rows), in_axes=axis)(index), (0, 0)


batching.primitive_batchers[group_p] = _batch


def sorted_grouping(index, *, rows):
    """``(perm, offsets)`` by ``sort_edges``'s stable argsort, the longest run appended."""
    perm, offsets = sort_edges(index, rows)
    longest = jnp.max(jnp.diff(offsets), initial=0)
    return [perm, jnp.append(offsets, longest.astype(offsets.dtype))]


def reference_lowering(ctx, index, *, rows, backend):
    """The stable argsort, on every platform."""
    del backend
    return mlir.lower_fun(functools.partial(sorted_grouping, rows=rows), multiple_results=True)(ctx, index)
