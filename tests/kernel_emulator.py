"""Run the generated CUDA kernels on the CPU, so their arithmetic is tested without a GPU.

Each kernel's source is compiled as host C++ with ``cuda_host_emulation.h`` (a fiber for each CUDA
thread, barriers for warp synchronisation) and called through ``jax.pure_callback`` in place of
the FFI launch. :func:`emulated_kernels` makes the CPU lowerings of the ``cgtp`` and ``cgtp_group``
primitives the CUDA ones (``launch``: the same schedules, grids, partial rows and zeroing), so every
jitted function, derivatives included, runs the kernels a GPU would run. Outputs a kernel overwrites
start as NaN, as with ``JAX_CGTP_POISON_OUTPUTS=1`` on the GPU.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import hashlib
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading

import jax
import numpy as np
from jax.interpreters import mlir

from jax_cgtp import lowerings


from jax_cgtp.core import grouping, primitives


from jax_cgtp.gpu import codegen, cuda_lowering, grouping_kernels


from jax_cgtp.sharding import partitioning

HEADER = pathlib.Path(__file__).with_name("cuda_host_emulation.h")
COMPILER = shutil.which("g++")
_BUILD = pathlib.Path(tempfile.mkdtemp(prefix="jax_cgtp_emulated_"))
atexit.register(shutil.rmtree, _BUILD, ignore_errors=True)
# -O0: the kernels' long unrolled code compiles about 4x faster than at -O1, and the small emulated
# launches run about as fast. No _FORTIFY_SOURCE: its checked _longjmp refuses to switch fiber stacks.
_FLAGS = ["-std=c++20", "-O0", "-U_FORTIFY_SOURCE", "-w", "-fPIC", "-pthread"]
_PARAMETER = re.compile(r"^\s*(const )?(T\*|I\*|long long\*|long long) (?:__restrict__ )?(\w+)[,)]", re.M)


# The blocks a filling launch (``KernelSchedule.fill``) gets, as the launcher caps its grid at the
# blocks a GPU holds at once: few, so that the warps of a test's graph take several rounds.
RESIDENT_BLOCKS = 2

_launched: list = []  # the schedules of the emulated launches, in order
_groupings: list = []  # (counting kernel, edges) of each emulated grouping, in order
# One launch at a time: XLA may run independent callbacks concurrently, and the emulated
# launches share process-wide state (gridDim and blockDim are unique symbols across the loaded
# kernel libraries; a library's shared-memory buffer serves all of its launches).
_one_launch = threading.Lock()


def available() -> bool:
    return COMPILER is not None


def launched() -> list:
    """The :class:`~jax_cgtp.gpu.schedule.KernelSchedule` of every emulated launch so far, in order."""
    return list(_launched)


def groupings() -> list[tuple[str, int]]:
    """The counting kernel and the edge count of every emulated grouping so far, in order."""
    return list(_groupings)


def _call_arguments(source: str, name: str) -> str:
    """Kernel ``name``'s parameters bound to ``buffers[k]`` (pointers) and ``scalars[j]``, in order."""
    head = source[source.index(f"{name}(") : source.index(") {", source.index(f"{name}("))]
    arguments, buffer, scalar = [], 0, 0
    for const, kind, _ in _PARAMETER.findall(head + ")"):
        if kind == "long long":
            arguments.append(f"scalars[{scalar}]")
            scalar += 1
        else:
            arguments.append(f"({const or ''}{kind})buffers[{buffer}]")
            buffer += 1
    return ", ".join(arguments)


def _compile(command: list[str]) -> None:
    done = subprocess.run([COMPILER, *_FLAGS, *command], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"host compilation for the kernel emulation failed:\n{done.stderr[-4000:]}")


@functools.lru_cache(maxsize=None)
def _header() -> pathlib.Path:
    """The emulation header with its precompiled form beside it (it dominates compile time)."""
    header = _BUILD / HEADER.name
    shutil.copyfile(HEADER, header)
    _compile(["-x", "c++-header", str(header), "-o", f"{header}.gch"])
    return header


@functools.lru_cache(maxsize=None)
def _library(source: str, name: str) -> ctypes.CDLL:
    """Kernel ``name`` compiled for the host, with ``cgtp_emu_run(buffers, scalars, grid, block)`` (0,
    or 1 where the launch could not run)."""
    wrapper = (
        f"{source}\n"
        'extern "C" int cgtp_emu_run(void** buffers, const long long* scalars, long long grid, int block) {\n'
        f"  return cgtp_emu_launch(grid, block, [&] {{ {name}({_call_arguments(source, name)}); }});\n"
        "}\n"
    )
    stem = hashlib.sha256(wrapper.encode()).hexdigest()[:20]
    cpp, library = _BUILD / f"{stem}.cpp", _BUILD / f"{stem}.so"
    if not library.exists():
        cpp.write_text(wrapper)
        _compile(["-shared", "-include", str(_header()), str(cpp), "-o", str(library)])
    lib = ctypes.CDLL(str(library))
    lib.cgtp_emu_run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong),
                                 ctypes.c_longlong, ctypes.c_int]
    lib.cgtp_emu_run.restype = ctypes.c_int
    return lib


def launch(source: str, pointers: list[int], scalars: np.ndarray, grid: int, block: int,
           name: str = codegen.KERNEL_NAME) -> None:
    """Run kernel ``name`` of ``source`` on ``grid`` blocks of ``block`` threads, its pointer parameters
    bound to ``pointers`` and its ``long long`` ones to ``scalars``, in order. Raises where the
    launch cannot finish: its threads wait at barriers that cannot open."""
    buffers = (ctypes.c_void_p * len(pointers))(*pointers)
    values = np.ascontiguousarray(scalars, np.int64)
    if grid > 0 and _library(source, name).cgtp_emu_run(
            buffers, values.ctypes.data_as(ctypes.POINTER(ctypes.c_longlong)), grid, block):
        raise RuntimeError(f"emulated launch of {grid} x {block} threads: its threads wait at barriers that "
                           "cannot open, or their stacks could not be mapped")


def run_kernel(kernel, args, shapes, grid: int, scalars: np.ndarray):
    """:func:`jax_cgtp.gpu.cuda_lowering.run_kernel`, on the host."""
    source = codegen.generate(kernel)
    zero = [out.zeroed for out in kernel.outputs] + [False] * (len(shapes) - len(kernel.outputs))
    kept = kernel.kept  # outputs that start as the last arguments, in order
    if kernel.fill:
        grid = min(grid, RESIDENT_BLOCKS)

    def host(*arrays):
        inputs = [np.ascontiguousarray(a) for a in arrays]
        outputs = [np.zeros(s.shape, s.dtype) if z else _poisoned(s) for s, z in zip(shapes, zero)]
        for j, k in enumerate(kept):
            outputs[k] = np.array(inputs[len(inputs) - len(kept) + j])
        with _one_launch:
            _launched.append(kernel)
            launch(source, [a.ctypes.data for a in inputs + outputs], scalars, grid, kernel.block)
        return outputs

    return jax.pure_callback(host, shapes, *args)


def _poisoned(shape):
    """An output a kernel overwrites, as the GPU's poisoned outputs start: all bits set (NaN, or -1)."""
    return np.full(shape.shape, np.nan if np.issubdtype(shape.dtype, np.floating) else -1, shape.dtype)


def run_grouping_kernel(name: str, args, shapes, *, grid: int, edges: int, rows: int, zero_outputs=()):
    """:func:`jax_cgtp.gpu.grouping_kernels.run_kernel`, on the host; outputs not zeroed start as -1."""
    source = grouping_kernels.kernel_source(cuda_lowering.common_index_dtype([args[0]])[1])
    zero = [bool(z) for z in zero_outputs] + [False] * (len(shapes) - len(zero_outputs))

    def host(*arrays):
        inputs = [np.ascontiguousarray(a) for a in arrays]
        outputs = [np.zeros(s.shape, s.dtype) if z else _poisoned(s) for s, z in zip(shapes, zero)]
        with _one_launch:
            if name in (grouping_kernels.COUNT_KERNEL, grouping_kernels.RANK_KERNEL):
                _groupings.append((name, edges))
            launch(source, [a.ctypes.data for a in inputs + outputs], np.array([edges, rows]), grid,
                   grouping_kernels.BLOCK, name)
        return outputs

    return jax.pure_callback(host, shapes, *args)


def _outputs(call, backend, *args):
    if backend == "reference":
        return primitives.reference_outputs(call, *args)
    return cuda_lowering.launch(call, *args)


_lowering = partitioning.lowering_rule(_outputs)


@contextlib.contextmanager
def emulated_kernels():
    """Within the block, ``backend="auto"`` on the CPU runs the generated kernels, emulated."""
    originals = cuda_lowering.run_kernel, grouping_kernels.run_kernel
    cuda_lowering.run_kernel, grouping_kernels.run_kernel = run_kernel, run_grouping_kernel
    mlir.register_lowering(primitives.cgtp_p, _lowering, platform="cpu")
    mlir.register_lowering(grouping.group_p, grouping_kernels.lowering, platform="cpu")
    jax.clear_caches()
    try:
        yield
    finally:
        cuda_lowering.run_kernel, grouping_kernels.run_kernel = originals
        mlir.register_lowering(primitives.cgtp_p, lowerings.CGTP_REFERENCE, platform="cpu")
        mlir.register_lowering(grouping.group_p, grouping.reference_lowering, platform="cpu")
        jax.clear_caches()
