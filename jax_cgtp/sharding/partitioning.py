"""A ``cgtp`` call split across devices by ``jax.jit`` (XLA's SPMD partitioner, mesh axes of type Auto).

Without a rule, XLA cannot see into a custom call: it gathers every operand onto every device and
runs the whole call on each. :func:`across_devices` gives the call a ``custom_partitioning`` rule
instead, along the edge axis (the rows of a product without indices):

* the edge axis of every per-edge array (BATCHED operands and outputs, index arrays) is split over
  the mesh axes of the first per-edge operand whose edge axis is sharded, when they divide the edge
  count (otherwise the call runs whole on every device);
* node arrays (INDEXED operands) and SHARED weights are replicated;
* each device runs the call on its edges; an output summed over edges (INDEXED: a scatter into
  nodes; SHARED: a shared weight's gradient) is then summed over the devices (``psum``);
* a call that carries an edge ordering orders its own edges at each call: the deterministic variant
  with :func:`~jax_cgtp.core.graph.sort_edges`, the atomic walks with :func:`~jax_cgtp.core.grouping.group_edges`.
  The ordering it was given (a ``graph=`` sorted once, or the atomic call's grouping) is not an
  operand of the partitioned call, so XLA drops its computation where nothing else uses it. A
  deterministic call stays deterministic: the same edges on each device, the same sums.

Inside ``jax.shard_map`` (every axis manual), under ``pmap`` and on one device, the call is lowered
as it is. ``JAX_CGTP_PARTITIONING=0``, set when a function is lowered, turns the rule off (XLA then
runs each call whole on every device, as it does for any custom call it cannot see into); set before
jax_cgtp is imported, it also lets JAX lower over an abstract mesh alone (:func:`enabled`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from ..core.call import Call
from ..core.graph import sort_edges
from ..core.grouping import group_edges
from ..core.operands import BATCHED, INDEXED

VARIABLE = "JAX_CGTP_PARTITIONING"
# The leading axis of each flat argument or output of a call
EDGES, NODES, WHOLE = "edges", "nodes", "whole"


def enabled() -> bool:
    """Whether calls get the rule: unless ``JAX_CGTP_PARTITIONING=0``. The rule reads the devices
    while lowering, so with it JAX refuses to lower over an abstract mesh alone; set the variable
    before importing jax_cgtp to lower that way (each call then runs whole on every device)."""
    return os.environ.get(VARIABLE, "1") != "0"


@contextlib.contextmanager
def switched(on: bool):
    """Within the block, functions lowered get the rule (``on``) or not, whatever
    ``JAX_CGTP_PARTITIONING`` says; it is restored afterwards."""
    previous = os.environ.get(VARIABLE)
    os.environ[VARIABLE] = "1" if on else "0"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[VARIABLE]
        else:
            os.environ[VARIABLE] = previous


def spans_devices(ctx) -> bool:
    """Whether the lowering context is XLA's SPMD partitioning over more than one device of a mesh."""
    from jax._src.sharding_impls import ShardingContext

    context = ctx.module_context.axis_context
    if not isinstance(context, ShardingContext) or context.abstract_mesh is None:
        return False
    devices = context.device_assignment
    return devices is not None and len(devices) > 1


def argument_layouts(call: Call) -> tuple[tuple[str, int], ...]:
    """``(leading axis, rank)`` of each input and index array of ``call`` (its flat arguments but
    the orderings)."""
    layouts = [_layout(call.kind(role)) for role in call.roles]
    return tuple(layouts + [(EDGES, 1)] * len(call.indexed_roles))


def output_layouts(call: Call) -> tuple[tuple[str, int], ...]:
    return tuple(_layout(call.kind(output.role)) for output in call.outputs)


def _layout(kind: str) -> tuple[str, int]:
    return {BATCHED: (EDGES, 2), INDEXED: (NODES, 2)}.get(kind, (WHOLE, 1))


def sharding_rule(call: Call) -> tuple[str, dict]:
    """The call's Shardy rule (einsum-like): one factor ``e`` for every edge axis, and a factor of
    its own, kept whole, for every other dimension; ``e`` is a reduction factor when no output has
    it."""
    kept = []

    def factors(layouts, prefix: str) -> list[str]:
        named = []
        for n, (layout, rank) in enumerate(layouts):
            dims = [f"{prefix}{n}d{k}" for k in range(rank)]
            if layout == EDGES:
                dims[0] = "e"
            kept.extend(d for d in dims if d != "e")
            named.append(" ".join(dims))
        return named

    operands, results = factors(argument_layouts(call), "a"), factors(output_layouts(call), "r")
    options = {"need_replication_factors": tuple(kept)}
    if all(layout != EDGES for layout, _ in output_layouts(call)):
        options["reduction_factors"] = ("e",)
    return f"{', '.join(operands)} -> {', '.join(results)}", options


def lowering_rule(outputs_of):
    """The lowering rule of ``cgtp`` calls whose outputs are ``outputs_of(call, backend, *args)`` (a
    list), split across devices under XLA's SPMD partitioning."""
    from jax.interpreters import mlir

    def rule(ctx, *args, call, backend):
        fun = functools.partial(outputs_of, call, backend)
        if spans_devices(ctx) and enabled():
            fun = across_devices(call, fun, backend)
        return mlir.lower_fun(fun, multiple_results=True)(ctx, *args)

    return rule


def across_devices(call: Call, outputs_of, backend: str):
    """``outputs_of(*args)`` (the list of the call's outputs, from its flat arguments) with the
    partitioning rule of this module. The call's orderings are not arguments of the partitioned
    function: it orders the edges it gets itself, so that XLA drops the orderings it was given."""
    arg_layouts, out_layouts = argument_layouts(call), output_layouts(call)

    def ordered(*args):
        return tuple(outputs_of(*args, *_orderings(call, args, backend)))

    @custom_partitioning
    def run(*args):  # jit keeps the constants (CG coefficients) inside: custom_partitioning takes none
        return jax.jit(ordered)(*args)

    def edge_axes(mesh, arg_shapes):
        """The mesh axes the edges are split over (None: not split)."""
        edges = next((shape.shape[0] for shape, (layout, _) in zip(arg_shapes, arg_layouts) if layout == EDGES), 0)
        return _first_split(arg_layouts, [_leading_axes(shape.sharding, mesh) for shape in arg_shapes], edges,
                            lambda axes: math.prod(mesh.shape[a] for a in axes))

    def shardings(mesh, axes, layouts):
        return tuple(NamedSharding(mesh, PartitionSpec(axes if layout == EDGES else None, *(None,) * (rank - 1)))
                     for layout, rank in layouts)

    def infer(mesh, arg_shapes, result_shape):
        del result_shape
        return shardings(mesh, edge_axes(mesh, arg_shapes), out_layouts)

    def partition(mesh, arg_shapes, result_shape):
        del result_shape
        axes = edge_axes(mesh, arg_shapes)

        def local(*args):
            outputs = ordered(*args)
            if axes is None:
                return outputs
            return tuple(o if layout == EDGES else jax.lax.psum(o, axes)
                         for o, (layout, _) in zip(outputs, out_layouts))

        return mesh, local, shardings(mesh, axes, out_layouts), shardings(mesh, axes, arg_layouts)

    rule, options = sharding_rule(call)
    run.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule,
                      decode_shardings=False, **options)
    start = len(arg_layouts)
    return lambda *args: run(*args[:start])


def leading_parts(sharding) -> int:
    """How many parts ``sharding``, an argument's given to ``jax.jit``, splits its leading axis into
    over mesh axes of type Auto (1: none, or not a ``NamedSharding``)."""
    if not isinstance(sharding, NamedSharding) or not len(sharding.spec) or sharding.spec[0] is None:
        return 1
    axes = sharding.spec[0] if isinstance(sharding.spec[0], tuple) else (sharding.spec[0],)
    types = dict(zip(sharding.mesh.axis_names, sharding.mesh.axis_types))
    if any(types[axis] != AxisType.Auto for axis in axes):
        return 1
    return math.prod(sharding.mesh.shape[axis] for axis in axes)


def local_edges(call: Call, edges: int, parts) -> int:
    """The edges each device's part of ``call`` walks under :func:`across_devices`, given the
    ``parts`` its flat arguments' leading axes are split into (:func:`_first_split`)."""
    split = _first_split(argument_layouts(call), parts, edges, int) if enabled() else None
    return edges // split if split else edges


def _first_split(layouts, splits, edges: int, size):
    """The split (``splits[n]``, into ``size(splits[n])`` parts) of the first per-edge argument whose
    leading axis is split into more than one part, if that divides ``edges``; else None (the call
    runs whole on every device). :func:`across_devices` and :func:`local_edges` agree through it."""
    for (layout, _), split in zip(layouts, splits):
        if layout == EDGES and size(split) > 1:
            return None if edges % size(split) else split
    return None


def _leading_axes(sharding, mesh) -> tuple:
    """The mesh axes that split the leading dimension of an operand of ``sharding`` (an XLA sharding
    of any kind: one that names no mesh axes, e.g. on one device, splits nothing)."""
    from jax._src.sharding_impls import parse_flatten_op_sharding

    try:
        spec = parse_flatten_op_sharding(sharding._to_xla_hlo_sharding(1), mesh)[0]
    except Exception:  # maximal (one device) or otherwise not a tiling of the mesh
        return ()
    axes = spec[0] if len(spec) else None
    return () if axes is None else axes if isinstance(axes, tuple) else (axes,)


def _orderings(call: Call, args, backend: str) -> list:
    """The flat ``(perm, offsets)`` of each ordering ``call`` carries, from the index arrays in
    ``args`` (the call's inputs and index arrays)."""
    indices = dict(zip(call.indexed_roles, args[call.num_inputs :]))
    # The deterministic variant's calls carry every ordering (orderings None) and sum in the stable
    # sort's order; the atomic convolution's forward over destination runs (deterministic, with
    # ``dst``'s ordering named) walks a grouping, as its callers' do.
    stable = call.deterministic and call.orderings is None
    orderings = []
    for role in call.sorted_roles:
        rows = call.row_count(role)
        orderings += sort_edges(indices[role], rows) if stable else group_edges(indices[role], rows, backend=backend)
    return orderings
