"""The parameters of a generated kernel, in order: built once per launch from its schedule, read by
the code generator (the kernel's parameter list), by the lowering (a check of what each launch
binds) and, by count, by the FFI launcher (``cuda/ffi_launch.cc``), so that the three cannot drift
apart silently.

Order: the call's inputs (``in0 ...``), one index array per INDEXED role (``idx_x ...``), a
``(perm_r, off_r)`` pair per sorted role (:attr:`Call.sorted_roles`), the extra inputs some
launches read (a chunk walk's rows, a tiled walk's partial rows, a slice's position and rows, the
kept outputs' earlier values), then the outputs (``out0 ...`` and the extra rows some launches
write), then ``long long`` scalars: the edge count, the row count of each INDEXED role and, for a
slice, its size. ``T`` is the kernel's floating type, ``I`` its index type.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .schedule import KernelSchedule

READ, WRITE, SCALAR = "read", "write", "scalar"
NUMPY_TYPES = {"float": np.dtype(np.float32), "double": np.dtype(np.float64),
               "int": np.dtype(np.int32), "long long": np.dtype(np.int64)}  # a kernel's C types


@dataclasses.dataclass(frozen=True)
class Param:
    """One kernel parameter: a buffer the kernel reads or writes (of ``T`` or ``I``), or a scalar."""

    name: str
    access: str  # READ, WRITE or SCALAR
    ctype: str = "T"  # "T" or "I" for a buffer; "long long" for a scalar
    restrict: bool = True  # False for a read buffer that aliases an output (a kept output's earlier rows)

    def declaration(self) -> str:
        if self.access == SCALAR:
            return f"const long long {self.name}"
        qualifier = "const " if self.access == READ else ""
        return f"{qualifier}{self.ctype}* {'__restrict__ ' if self.restrict else ''}{self.name}"


def scalar_names(schedule: KernelSchedule) -> list[str]:
    """Names of the ``long long`` scalars after the buffers, in order."""
    slice_size = ["slice_size"] if schedule.slice_walk or schedule.slice_sum else []
    return ["num_edges"] + [f"rows_{r}" for r in schedule.call.indexed_roles] + slice_size


@functools.lru_cache(maxsize=None)
def kernel_signature(schedule: KernelSchedule) -> tuple[Param, ...]:
    """Every parameter of ``schedule``'s kernel, in order."""
    call = schedule.call
    params = [Param(f"in{n}", READ) for n in range(call.num_inputs)]
    params += [Param(f"idx_{r}", READ, "I") for r in call.indexed_roles]
    for r in call.sorted_roles:
        params += [Param(f"perm_{r}", READ, "I"), Param(f"off_{r}", READ, "I")]
    if schedule.chunk_sum:  # each owned output's chunk rows (the chunk walk's)
        params += [Param(f"chunks{k}", READ) for k in range(len(schedule.outputs))]
    if schedule.tile_sum:  # the tiled walk's partial rows
        params += [Param("tile_rows", READ)]
    if schedule.slice_walk or schedule.slice_sum:  # the slice's first dst-sorted position (one element)
        params += [Param("slice_at", READ, "I")]
    if schedule.slice_sum:  # the slice walk's rows, and each edge's dst-sorted position
        params += [Param("slice_rows", READ), Param("pos_z", READ, "I")]
    # the same buffers as the kept outputs (aliased): what the launch before wrote
    params += [Param(f"walked{k}", READ, restrict=False) for k in schedule.kept]
    params += [Param(f"out{k}", WRITE) for k in range(len(schedule.outputs))]
    if schedule.writes_positions:
        params += [Param("pos_z", WRITE, "I")]
    if schedule.writes_slice_chunk_rows:
        params += [Param("chunk_rows", WRITE)]
    if schedule.partial_tiles:
        params += [Param("tile_rows", WRITE)]
    params += [Param(name, SCALAR, "long long") for name in scalar_names(schedule)]
    return tuple(params)


def check_launch(schedule: KernelSchedule, args, shapes, scalars) -> None:
    """Raise if a launch of ``schedule``'s kernel binds other buffers than its signature names: the
    count of read buffers (``args``), written buffers (``shapes``) and ``scalars``, and each
    buffer's dtype (``T``: the schedule's floating type; ``I``: its index type)."""
    params = kernel_signature(schedule)
    groups = {access: [p for p in params if p.access == access] for access in (READ, WRITE, SCALAR)}
    given = {READ: list(args), WRITE: list(shapes), SCALAR: list(np.atleast_1d(scalars))}
    ctypes = {"T": NUMPY_TYPES[schedule.dtype], "I": NUMPY_TYPES[schedule.index_dtype]}
    for access in (READ, WRITE, SCALAR):
        if len(given[access]) != len(groups[access]):
            raise RuntimeError(
                f"jax_cgtp: a launch binds {len(given[access])} {access} parameters where the kernel takes "
                f"{len(groups[access])} ({', '.join(p.name for p in groups[access])}): the lowering and the "
                "kernel signature disagree")
    for access in (READ, WRITE):
        for param, value in zip(groups[access], given[access]):
            if np.dtype(value.dtype) != ctypes[param.ctype]:
                raise RuntimeError(f"jax_cgtp: kernel parameter {param.name} is {param.ctype} "
                                   f"({ctypes[param.ctype]}) but the launch binds {np.dtype(value.dtype)}")
