"""The primitives on a mesh of devices: the mesh axes their operands and results are typed with.

* Manual axes (inside ``jax.shard_map``). With ``check_vma=True`` (shard_map's default) JAX types
  every value with the manual axes it varies over (``{V:data}``). A primitive's operands must vary
  over the same axes, and its results vary over them too. :func:`match` casts the operands that
  vary over fewer axes (a parameter replicated on every device next to per-device features) to
  varying, as ``lax``'s binary operations do; the cast's transpose then sums that operand's
  cotangent over the devices. Outside shard_map nothing varies and nothing changes.
* Explicit axes (``jax.sharding.AxisType.Explicit``, where the types carry each array's sharding):
  the primitives have no sharding rule for them. :class:`~jax_cgtp.TensorProduct` and
  :class:`~jax_cgtp.TensorProductConv` split such calls themselves with ``jax.shard_map`` over the
  axes (:func:`explicit_axes`, :func:`leading_spec`, :func:`split_over_axes`), and :func:`check_not_explicitly_sharded`
  refuses operands that reach a primitive sharded over such an axis.
"""

from __future__ import annotations

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec


def varying_axes(aval) -> frozenset:
    """The manual mesh axes ``aval`` varies over (empty outside shard_map)."""
    manual = getattr(aval, "manual_axis_type", None)
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", ()))


def _cast_to_varying(x, axes: tuple):
    pcast = getattr(jax.lax, "pcast", None)
    return pcast(x, axes, to="varying") if pcast is not None else jax.lax.pvary(x, axes)


def match(args) -> list:
    """``args``, each cast to vary over every manual axis that any of them varies over."""
    axes = [varying_axes(jax.typeof(a)) for a in args]
    union = frozenset().union(*axes)
    return [_cast_to_varying(a, tuple(sorted(union - mine))) if union - mine else a for a, mine in zip(args, axes)]


def shaped_like(aval, shape, dtype) -> jax.core.ShapedArray:
    """An array type of ``shape`` and ``dtype`` that varies over the manual axes ``aval`` varies over
    (replicated over the mesh's other axes)."""
    if not varying_axes(aval):
        return jax.core.ShapedArray(shape, dtype)
    return aval.update(shape=tuple(shape), dtype=dtype, weak_type=False,
                       sharding=NamedSharding(aval.sharding.mesh, PartitionSpec()))


def spec_axes(entries) -> frozenset:
    """The mesh axes that the entries of a ``PartitionSpec`` name."""
    return frozenset(axis for entry in entries if entry is not None
                     for axis in (entry if isinstance(entry, tuple) else (entry,)))


def _explicit_axes_of(aval) -> frozenset:
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty:
        return frozenset()
    explicit = {name for name, kind in zip(mesh.axis_names, mesh.axis_types) if kind == AxisType.Explicit}
    return spec_axes(sharding.spec) & explicit


def explicit_axes(arrays) -> frozenset:
    """The explicit mesh axes that any of ``arrays`` is sharded over (none off such a mesh, and none
    inside ``jax.shard_map``, where the axes are manual)."""
    return frozenset().union(*(_explicit_axes_of(jax.typeof(a)) for a in arrays))


def leading_spec(arrays, ndim: int) -> tuple:
    """The sharding of the first ``ndim`` dimensions of the first of ``arrays`` sharded there over an
    explicit axis (all ``None`` if none is)."""
    for a in arrays:
        aval = jax.typeof(a)
        entries = tuple(aval.sharding.spec)[:ndim] if _explicit_axes_of(aval) else ()
        entries += (None,) * (ndim - len(entries))
        if spec_axes(entries):
            return entries
    return (None,) * ndim


def split_over_axes(fn, operands, specs, out_spec, *, summed: bool = False):
    """``fn(*operands)`` with each operand resharded to its spec of ``specs``, run on each device's
    share by ``jax.shard_map`` over the mesh axes the specs name (the results summed over them with
    ``summed``), or whole where they name none."""
    operands = [jax.sharding.reshard(a, spec) for a, spec in zip(operands, specs)]
    axes = frozenset().union(*(spec_axes(spec) for spec in specs))
    if not axes:
        return fn(*operands)
    local = (lambda *a: jax.lax.psum(fn(*a), tuple(sorted(axes)))) if summed else fn
    return jax.shard_map(local, in_specs=tuple(specs), out_specs=out_spec, axis_names=axes)(*operands)


def check_not_explicitly_sharded(avals) -> None:
    """Raise ``NotImplementedError`` if any of ``avals`` is sharded over an explicit mesh axis."""
    for aval in avals:
        used = _explicit_axes_of(aval)
        if used:
            raise NotImplementedError(
                f"jax_cgtp: an operand of type {aval} is sharded over the explicit mesh axes {sorted(used)}; "
                "jax_cgtp's primitives have no sharding rule for explicit axes. Call them through "
                "TensorProduct or TensorProductConv, which split the call over those axes, or split the "
                "data with jax.shard_map, or shard over axes of type AxisType.Auto, where XLA places each call")
