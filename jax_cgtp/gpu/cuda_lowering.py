"""Lowering of ``cgtp`` calls on NVIDIA GPUs: generated kernels launched through an XLA FFI call.

Each launch of the call's schedule becomes one ``jax.ffi.ffi_call`` to the ``jax_cgtp_launch``
handler (``cuda/ffi_launch.cc``), on XLA's stream. With ``backend="auto"``, the calls that
:func:`runs_on_xla` picks are lowered through the pure-JAX reference instead (XLA's matrix
products); ``backend="cuda"`` runs every call on the kernels. The cubin travels in the HLO as an
attribute, so compiled executables are self-contained (JAX's persistent compilation cache and
``jax.export`` keep working). SHARED outputs come back as one partial row per tile walker and
are summed here, which keeps them deterministic. With ``JAX_CGTP_POISON_OUTPUTS=1`` set when a
function is lowered, outputs the kernels overwrite start as NaN instead of uninitialised memory
(a testing aid: an element a kernel forgets to write shows up).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os

import jax
import jax.numpy as jnp
import numpy as np

from . import codegen, nvrtc, schedule, signature

from ..sharding import partitioning
from ..core.call import Call, accumulation_dtype, num_edges, output_shape
from ..core.operands import INDEXED, SHARED

TARGET = "jax_cgtp_launch"
# The same handler, registered without the command-buffer trait (Settings.command_buffers off).
UNCAPTURED_TARGET = "jax_cgtp_launch_uncaptured"
# XLA records runs of at least --xla_gpu_graph_min_graph_size (5) of its GPU operations as CUDA
# graphs (command buffers) and launches each run as one graph, custom calls among them where their
# target is registered as safe to capture. The launch handler is: for a given call it enqueues the
# same memsets and kernel launches on XLA's stream, into the buffers XLA passes, and queries
# nothing (kernels are loaded in its initialize stage). With ``Settings.command_buffers`` off (its
# default with $JAX_CGTP_COMMAND_BUFFERS=0), a call's kernels launch on their own.
KEEP = 2  # a zero_outputs flag: the output starts as the argument it aliases (neither zeroed nor poisoned)
_KERNEL_DTYPES = {signature.NUMPY_TYPES[c]: c for c in ("float", "double")}


@functools.lru_cache(maxsize=None)
def _register_target() -> None:
    try:
        from .. import _ffi
    except ImportError as error:
        raise RuntimeError(
            f"jax_cgtp: the C++ extension jax_cgtp._ffi is not built ({error}); reinstall with "
            "`pip install -e .` or use backend='reference'"
        ) from None
    from jaxlib.xla_client import CustomCallTargetTraits

    handlers = _ffi.registrations()[TARGET]
    jax.ffi.register_ffi_target(TARGET, handlers, platform="CUDA",
                                traits=CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE)
    jax.ffi.register_ffi_target(UNCAPTURED_TARGET, handlers, platform="CUDA")


@functools.lru_cache(maxsize=None)
def device_arch() -> str:
    """NVRTC's target, e.g. ``"sm_90"``: ``$JAX_CGTP_ARCH`` if set (to lower for a GPU that is
    not attached, e.g. with ``jax.export``), else the first GPU's compute capability."""
    explicit = os.environ.get("JAX_CGTP_ARCH")
    if explicit:
        return explicit
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError:
        raise RuntimeError(
            "jax_cgtp: lowering for CUDA needs a visible GPU to pick the kernel architecture; "
            "set JAX_CGTP_ARCH (e.g. sm_90) to lower for one that is not attached"
        ) from None
    capability = getattr(device, "compute_capability", None)
    if capability:
        major, minor = str(capability).split(".")[:2]
        return f"sm_{major}{minor}"
    from .. import _ffi

    return f"sm_{_ffi.compute_capability(0)}"


def runs_on_xla(call: Call, backend: str) -> bool:
    """Whether ``backend="auto"`` lowers ``call`` through the pure-JAX reference (XLA's matrix
    products) instead of the kernels: any derivative of a ``uvw`` product with shared weights, in a
    call with no indexed operand that is not deterministic.

    Shared ``uvw`` weights make every derivative a matrix product summed or broadcast over all
    rows (``w̄[u,v,w] = sum over rows of x[u,i] y[v,j] z̄[w,k] C[i,j,k]``, and ``x̄`` and ``ȳ``
    contract the whole weight matrix per row). The kernels give each row to one warp; on an H100,
    XLA's ``dot_general``s ran those phases 1.1 to 50 times faster, while the kernels ran the
    forward of the NequIP self-connection faster (``benchmarks/shared_weights.py``). A gather of an
    indexed operand would materialise one row per edge, and a deterministic call promises the
    kernels' fixed order of summation, so convolutions and deterministic calls keep their kernels.
    """
    if backend != "auto" or call.deterministic or INDEXED in call.kinds or call.kind("w") != SHARED:
        return False
    if not any(ins.mode == "uvw" and ins.has_weight and ins.is_active for ins in call.problem.instructions):
        return False
    (first, *others) = call.outputs
    forward = not others and first.role == "z" and len(first.terms) == 1 and not first.terms[0].weighted_only
    return not forward


@functools.lru_cache(maxsize=None)
def _plan(call: Call, dtype: str, index_dtype: str, edges: int):
    """The launches of ``call`` for ``edges`` edges."""
    return schedule.plan(call, dtype, index_dtype, edges)


def kernel_cubin(kernel: schedule.KernelSchedule, arch: str) -> bytes:
    """The cubin launched for ``kernel`` on ``arch``: NVRTC's, of the kernel's generated source."""
    return nvrtc.compile_cubin(codegen.generate(kernel), arch, repr(kernel.call.problem))


@functools.lru_cache(maxsize=None)
def _kernel_image(kernel: schedule.KernelSchedule, arch: str) -> tuple[np.ndarray, int]:
    return image_of(kernel_cubin(kernel, arch))


def clear_kernel_caches() -> None:
    """Forget planned launches and compiled kernel images, so that the next lowering generates them
    anew (after a change to the scheduler's or the code generator's settings)."""
    _plan.cache_clear()
    _kernel_image.cache_clear()


def kernel_dtype(dtype) -> str:
    """The kernels' floating type for arrays of ``dtype`` (half precisions run in float32)."""
    return _KERNEL_DTYPES.get(np.dtype(dtype), "float")


def common_index_dtype(indices):
    """``(jnp dtype, C type)`` the kernels index with: 64-bit if any of ``indices`` is."""
    if any(jnp.dtype(i.dtype) == jnp.int64 for i in indices):
        return jnp.int64, "long long"
    return jnp.int32, "int"


def launch(call: Call, *args):
    """Every output of ``call``, computed by its generated kernels (the lowering's body)."""
    n = call.num_inputs
    dtype = jnp.dtype(args[0].dtype)
    if accumulation_dtype(dtype) != dtype:
        results = launch(call, *[a.astype(accumulation_dtype(dtype)) for a in args[:n]], *args[n:])
        return [r.astype(dtype) for r in results]
    index_dtype, index_ctype = common_index_dtype(args[n:])
    args = list(args[:n]) + [jnp.asarray(a, index_dtype) for a in args[n:]]
    edges = num_edges(call, [a.shape for a in args])
    scalars = np.array([edges] + [call.row_count(r) for r in call.indexed_roles], np.int64)
    kernels = _knowing_longest_runs(call, _plan(call, _KERNEL_DTYPES[dtype], index_ctype, edges), args)
    if kernels and kernels[0].slice_walk:
        return _launch_slices(call, *kernels, args=args, edges=edges, dtype=dtype, scalars=scalars)
    results = [None] * len(call.outputs)
    chunks = {}  # call output -> a chunk walk's rows
    tile_rows = None  # a tiled forward's partial rows
    for kernel in kernels:
        segments = call.row_count(kernel.segment_role) if kernel.segment_role else 0
        grid = kernel.grid(edges, segments)
        partial_rows = kernel.partial_rows(grid)
        shapes = [jax.ShapeDtypeStruct(_launch_shape(call, kernel, out, edges, partial_rows), dtype)
                  for out in kernel.outputs]
        if kernel.partial_tiles:
            shapes.append(jax.ShapeDtypeStruct((schedule.tile_rows(edges, kernel.partial_tiles), kernel.outputs[0].dim),
                                               dtype))
        extra = [chunks[out.call_output] for out in kernel.outputs] if kernel.chunk_sum else []
        extra += [tile_rows] if kernel.tile_sum else []
        into = [results[kernel.outputs[k].call_output] for k in kernel.kept]
        outputs = checked_launch(kernel, _arguments_of(call, kernel, args) + extra + into, shapes, grid, scalars)
        if kernel.partial_tiles:
            *outputs, tile_rows = outputs
        for out, value in zip(kernel.outputs, outputs):
            if kernel.writes_chunk_rows(out):
                chunks[out.call_output] = value
            elif out.kind == SHARED:  # a chunk walk's partial rows add to the walk's sum
                before, part = results[out.call_output], value.sum(axis=0)
                results[out.call_output] = part if before is None else before + part
            else:
                results[out.call_output] = value
    return results


def _arguments_of(call: Call, kernel: schedule.KernelSchedule, args) -> list:
    """``call``'s arguments ``args`` as ``kernel`` takes them: the orderings its own call carries
    (a tiled deterministic forward's walk carries ``dst``'s alone)."""
    if kernel.call.sorted_roles == call.sorted_roles:
        return args
    inputs, indices, orders = call.split(args)
    return (inputs + [indices[r] for r in kernel.call.indexed_roles]
            + [a for r in kernel.call.sorted_roles for a in orders[r]])


def _knowing_longest_runs(call: Call, kernels, args) -> list:
    """``kernels``, a walk past the cap marked to read the longest run where its ordering's offsets
    end with it (``rows + 2`` entries: :func:`jax_cgtp.core.grouping.group_edges`'s): it returns at once
    where no run is longer than the cap (longest-run: 1-2 us less per call)."""
    orders = call.split(args)[2]

    def knows(kernel) -> bool:
        role = kernel.call.walk
        return bool(kernel.beyond_cap) and orders[role][1].shape[0] == call.row_count(role) + 2

    return [dataclasses.replace(k, reads_longest_run=True) if knows(k) else k for k in kernels]


def _launch_slices(call: Call, walk: schedule.KernelSchedule, *sums: schedule.KernelSchedule, args, edges: int,
                   dtype, scalars: np.ndarray) -> list:
    """Every output of a deterministic backward planned in slices (:func:`schedule._sliced`): per
    slice of ``walk.slice_walk`` dst-sorted positions, the walk by destination (x̄ of each edge to
    the slice's rows, the per-edge outputs to their rows, a shared weight's gradient to partial
    rows) and the ``sums`` of the slice's rows into x̄ (one launch sums each run's first chunk and
    writes the later chunks' rows, the next adds those in chunk order; or one sum of whole runs).
    The first slice's launches write their outputs, and its walk each edge's dst-sorted position,
    which every sum reads; a ``fori_loop`` runs the others, each starting from the outputs before
    it, so the program's size does not grow with the edges. ``scalars``: the call's
    (:func:`launch`'s), to which the launches in slices add the slice size."""
    inputs, indices, orders = call.split(args)
    (perm_z, off_z), (perm_x, off_x) = orders["z"], orders["x"]
    index_args = [indices[r] for r in call.indexed_roles]
    size = walk.slice_walk
    sliced_scalars = np.append(scalars, size)
    (x_out,) = sums[0].outputs
    x_shape = jax.ShapeDtypeStruct((call.row_count("x"), x_out.dim), dtype)

    def one_slice(slice_index, carried, first: bool):
        results, pos_z = carried
        at = jnp.reshape(jnp.asarray(slice_index, perm_z.dtype) * size, (1,))  # (below num_edges: an index)
        kernel = _in_slice(walk, first)
        grid = kernel.grid(min(size, edges), 0)
        shapes = [jax.ShapeDtypeStruct((min(size, edges), x_out.dim), dtype) if out.flush == "slice" else
                  jax.ShapeDtypeStruct(_launch_shape(call, kernel, out, edges, kernel.partial_rows(grid)), dtype)
                  for out in kernel.outputs]
        shapes += [jax.ShapeDtypeStruct(perm_z.shape, perm_z.dtype)] if kernel.writes_positions else []
        into = [results[kernel.outputs[k].call_output] for k in kernel.kept]
        results, rows = list(results), None
        values = checked_launch(kernel, inputs + index_args + [perm_z, off_z, at] + into, shapes, grid, sliced_scalars)
        if kernel.writes_positions:
            *values, pos_z = values
        for out, value in zip(kernel.outputs, values):
            if out.flush == "slice":
                rows = value
            elif out.kind == SHARED:
                part = value.sum(axis=0)
                results[out.call_output] = part if first else results[out.call_output] + part
            else:
                results[out.call_output] = value
        x_bar, chunk_rows = results[x_out.call_output], None
        for adding in (_in_slice(k, first) for k in sums):
            grid = adding.grid(edges, call.row_count("x"))
            if adding.chunk_sum:  # the chunk rows, in chunk order, onto x̄
                (x_bar,) = checked_launch(adding, inputs + index_args + [perm_x, off_x, chunk_rows, x_bar],
                                      [x_shape], grid, scalars)
                continue
            before = [x_bar] if adding.kept else []
            shapes = [x_shape]
            if adding.writes_slice_chunk_rows:  # (the later chunks of each run)
                shapes.append(jax.ShapeDtypeStruct((schedule.chunk_rows(edges, adding.chunk_walk), x_out.dim), dtype))
            x_bar, *chunks = checked_launch(adding, inputs + index_args + [perm_x, off_x, at, rows, pos_z] + before,
                                        shapes, grid, sliced_scalars)
            chunk_rows = chunks[0] if chunks else None
        results[x_out.call_output] = x_bar
        return results, pos_z

    carried = one_slice(0, ([None] * len(call.outputs), None), True)
    num_slices = -(-edges // size)
    if num_slices > 1:
        carried = jax.lax.fori_loop(1, num_slices, lambda i, c: one_slice(i, c, False), carried)
    return carried[0]


def _in_slice(kernel: schedule.KernelSchedule, first: bool) -> schedule.KernelSchedule:
    """``kernel`` as the first slice launches it (writing its outputs) or as a later one does
    (starting from the earlier slices'); a launch outside the slices as it is."""
    return dataclasses.replace(kernel, slice_first=first) if kernel.slice_walk or kernel.slice_sum else kernel


def _with_later_slices(kernels: list[schedule.KernelSchedule], edges: int) -> list[schedule.KernelSchedule]:
    """``kernels`` (a call's plan for ``edges`` edges), and where the plan runs in more than one
    slice, the variants of its launches that the later slices run."""
    if not kernels or not kernels[0].slice_walk or edges <= kernels[0].slice_walk:
        return kernels
    return kernels + [_in_slice(k, False) for k in kernels if k.slice_walk or k.slice_sum]


def _launch_shape(call: Call, kernel: schedule.KernelSchedule, out, edges: int, partial_rows: int):
    """The shape of ``kernel``'s output ``out``: one row per tile walker for a SHARED output, one per
    chunk for a chunk walk's owned output, else the call's."""
    if out.kind == SHARED:
        return partial_rows, out.dim
    if kernel.writes_chunk_rows(out):
        return schedule.chunk_rows(edges, kernel.chunk_walk), out.dim
    return output_shape(call, out.role, edges)


def checked_launch(kernel: schedule.KernelSchedule, args, shapes, grid: int, scalars: np.ndarray):
    """:func:`run_kernel`, after checking that ``args``, ``shapes`` and ``scalars`` are what the
    kernel's signature (:mod:`.signature`) names, in count and dtype."""
    signature.check_launch(kernel, args, shapes, scalars)
    return run_kernel(kernel, args, shapes, grid, scalars)


def run_kernel(kernel: schedule.KernelSchedule, args, shapes, grid: int, scalars: np.ndarray):
    """One launch of ``kernel`` on ``grid`` blocks through the XLA FFI target: its outputs.

    Outputs added to across warps (atomic or reduced, :attr:`KernelOutput.zeroed`) start from zero.
    The outputs :attr:`~jax_cgtp.gpu.schedule.KernelSchedule.kept` start as what an earlier launch wrote:
    the last arguments, one per kept output, in order, each the same buffer as its output.
    With ``kernel.fill``, the launcher caps ``grid`` at the blocks the GPU holds at once.
    """
    image, image_id = _kernel_image(kernel, device_arch())
    kept = kernel.kept
    zero = [KEEP if k in kept else int(out.zeroed) for k, out in enumerate(kernel.outputs)]
    return ffi_launch(image, image_id, codegen.KERNEL_NAME, args, shapes, grid=grid, block=kernel.block,
                      shared_bytes=kernel.shared_bytes, scalars=scalars, zero_outputs=zero, fill=kernel.fill,
                      input_output_aliases={len(args) - len(kept) + j: k for j, k in enumerate(kept)},
                      capture=kernel.call.settings.command_buffers)


def image_of(cubin: bytes) -> tuple[np.ndarray, int]:
    """A cubin as the launch's ``image`` attribute, and the id the launcher caches it by."""
    return np.frombuffer(cubin, np.uint8), int.from_bytes(hashlib.sha256(cubin).digest()[:8], "little", signed=True)


def ffi_launch(image, image_id: int, name: str, args, shapes, *, grid: int, block: int, shared_bytes: int = 0,
               scalars=(), zero_outputs=(), fill: bool = False, input_output_aliases=None, capture: bool = True):
    """Launch kernel ``name`` of cubin ``image`` on ``grid`` blocks of ``block`` threads through the
    ``jax_cgtp_launch`` FFI target, its parameters the ``args``, then the outputs of ``shapes``,
    then the ``long long`` ``scalars``. Each output's ``zero_outputs`` flag: 1, it starts from zero;
    :data:`KEEP`, it starts as the argument it aliases (``input_output_aliases``); 0, as it is (NaN
    under ``JAX_CGTP_POISON_OUTPUTS=1``). ``capture``: XLA may record the launch in a CUDA graph."""
    _register_target()
    target = TARGET if capture else UNCAPTURED_TARGET
    return jax.ffi.ffi_call(target, shapes, input_output_aliases=input_output_aliases)(
        *args,
        image=image,
        image_id=np.int64(image_id),
        kernel=name,
        grid=np.int64(grid),
        block=np.int64(block),
        shared_bytes=np.int64(shared_bytes),
        scalars=np.asarray(scalars, np.int64),
        zero_outputs=np.array(zero_outputs, np.int64),
        poison=np.int64(os.environ.get("JAX_CGTP_POISON_OUTPUTS") == "1"),
        fill=np.int64(fill),
    )


def outputs(reference_outputs):
    """``outputs(call, backend, *args)`` on an NVIDIA GPU: the generated kernels' (:func:`launch`), or
    ``reference_outputs``' for ``backend="reference"`` calls and the calls :func:`runs_on_xla` picks."""

    def outputs_on_gpu(call: Call, backend: str, *args):
        if backend == "reference" or runs_on_xla(call, backend):
            return reference_outputs(call, backend, *args)
        return launch(call, *args)

    return outputs_on_gpu


def _calls_in(jaxpr, parts: dict):
    """``(call, dtype, index type, edges)`` of each ``cgtp`` call in ``jaxpr`` and the jaxprs inside
    it. ``parts``: how many parts jit's partitioner splits the leading axis of a variable into (by
    ``id``; a sharded argument's, and its name inside calls it is passed to; 1 where absent), so that
    a call split across devices is planned for each device's edges."""
    for eqn in jaxpr.eqns:
        backend = eqn.params.get("backend")
        if eqn.primitive.name == "cgtp" and backend != "reference" and not runs_on_xla(eqn.params["call"], backend):
            dtype = jnp.dtype(eqn.invars[0].aval.dtype)
            call = eqn.params["call"]
            indices = [v.aval for v in eqn.invars[call.num_inputs :]]
            edges = num_edges(call, [v.aval.shape for v in eqn.invars])
            edges = partitioning.local_edges(call, edges, [parts.get(id(v), 1) for v in eqn.invars])
            yield call, dtype, common_index_dtype(indices)[1], edges
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)  # a closed jaxpr's, or a jaxpr (shard_map's, local shapes)
                if hasattr(inner, "eqns"):
                    passed = eqn.primitive.name != "shard_map" and len(inner.invars) == len(eqn.invars)
                    yield from _calls_in(inner, {id(i): parts.get(id(o), 1) for i, o in zip(inner.invars, eqn.invars)}
                                         if passed else {})


def planned_kernels(fun, *args) -> list[schedule.KernelSchedule]:
    """The schedules of the kernels that ``jax.jit(fun)(*args)`` launches, in trace order (a call
    in slices: its plan, then the later slices' variants).

    Tracing alone finds the calls (derivatives included); calls whose results are unused are
    dropped first, as ``jax.jit`` drops them (the forward of a function that returns only
    gradients). ``args`` may be arrays or ``jax.ShapeDtypeStruct``; no GPU is needed. Arguments
    sharded over mesh axes of type Auto (their ``sharding``) split the calls they reach across the
    devices (:mod:`jax_cgtp.sharding.partitioning`): those are planned for each device's edges.
    """
    from jax.interpreters import partial_eval as pe

    jaxpr = jax.make_jaxpr(fun)(*args).jaxpr
    parts = {id(v): partitioning.leading_parts(getattr(a, "sharding", None))
             for v, a in zip(jaxpr.invars, jax.tree.leaves(args))}
    jaxpr, _ = pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))
    kernels = []
    for call, dtype, index_ctype, edges in _calls_in(jaxpr, parts):
        kernels += _with_later_slices(_plan(call, kernel_dtype(dtype), index_ctype, edges), edges)
    return kernels


def precompile(fun, *args, max_workers: int | None = None) -> int:
    """Compile, in parallel, the kernels every ``cgtp`` call of ``fun(*args)`` needs.

    NVRTC runs in a thread pool, so a model's first step does not compile its kernels one after
    the other (:func:`planned_kernels` finds them). Returns the number of kernels. Needs NVRTC
    and a GPU (or ``$JAX_CGTP_ARCH``).
    """
    from concurrent.futures import ThreadPoolExecutor

    kernels = set(planned_kernels(fun, *args))
    arch = device_arch()
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        list(pool.map(lambda kernel: _kernel_image(kernel, arch), kernels))
    return len(kernels)
