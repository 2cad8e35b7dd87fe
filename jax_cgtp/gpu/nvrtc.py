"""Compile generated CUDA source to a cubin with NVRTC, with an in-process and an on-disk cache.

NVRTC is loaded lazily with ctypes, from JAX's CUDA wheels first (``nvidia/cu13/lib``,
``nvidia/cuda_nvrtc/lib``), then the CUDA toolkit (``$CUDA_HOME``, ``/usr/local/cuda``), then the
system's library path; ``JAX_CGTP_NVRTC`` names the library explicitly. The disk cache lives
in ``$JAX_CGTP_CACHE_DIR`` (default ``$XDG_CACHE_HOME/jax_cgtp`` or ``~/.cache/jax_cgtp``);
entries are keyed by the source's SHA-256, the architecture and the NVRTC version.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import sys
import tempfile
import threading

_NAMES = ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so")
_OPTIONS = ("--std=c++17", "--device-as-default-execution-space")


class NvrtcError(RuntimeError):
    """NVRTC is missing, or it rejected a generated kernel (the message holds its log)."""


def _candidates():
    explicit = os.environ.get("JAX_CGTP_NVRTC")
    if explicit:
        yield explicit
        return
    for entry in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib", "nvidia/cu12/lib"):
            folder = pathlib.Path(entry or ".") / sub
            for name in _NAMES:
                if (folder / name).is_file():
                    yield str(folder / name)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            for name in _NAMES:
                path = pathlib.Path(home) / "lib64" / name
                if path.is_file():
                    yield str(path)
    yield from _NAMES


@functools.lru_cache(maxsize=None)
def _library():
    errors = []
    for candidate in _candidates():
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as error:
            errors.append(f"{candidate}: {error}")
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    raise NvrtcError(
        "jax_cgtp: cannot load NVRTC (install JAX's CUDA wheels, e.g. pip install 'jax[cuda13]', "
        "or set JAX_CGTP_NVRTC to libnvrtc.so); tried " + "; ".join(errors)
    )


def available() -> bool:
    """Whether NVRTC can be loaded on this machine."""
    try:
        _library()
    except NvrtcError:
        return False
    return True


def version() -> tuple[int, int]:
    lib = _library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def _check(lib, status: int, what: str, log: str = "") -> None:
    if status != 0:
        message = lib.nvrtcGetErrorString(status).decode()
        raise NvrtcError(f"jax_cgtp: {what} failed: {message}" + (f"\n{log}" if log else ""))


def _compile_uncached(source: str, arch: str, context: str) -> bytes:
    lib = _library()
    program = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"cgtp.cu", 0, None, None),
           "nvrtcCreateProgram")
    try:
        options = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in _OPTIONS]
        array = (ctypes.c_char_p * len(options))(*options)
        status = lib.nvrtcCompileProgram(program, len(options), array)
        log_size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(log_size))
        log = ctypes.create_string_buffer(log_size.value)
        lib.nvrtcGetProgramLog(program, log)
        if status != 0:
            _check(lib, status, f"compiling the kernel of {context} for {arch}", log.value.decode(errors="replace"))
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def cache_dir() -> pathlib.Path:
    explicit = os.environ.get("JAX_CGTP_CACHE_DIR")
    if explicit:
        return pathlib.Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "jax_cgtp"


_memory: dict[tuple[str, str, tuple[int, int]], bytes] = {}
_lock = threading.Lock()


def compile_cubin(source: str, arch: str, context: str = "a jax_cgtp problem") -> bytes:
    """The cubin of ``source`` for ``arch`` (e.g. ``"sm_90"``); ``context`` names the problem in errors."""
    key = (hashlib.sha256(source.encode()).hexdigest(), arch, version())
    with _lock:
        if key in _memory:
            return _memory[key]
    path = cache_dir() / f"{key[0][:32]}-{arch}-nvrtc{key[2][0]}.{key[2][1]}.cubin"
    cubin = path.read_bytes() if path.is_file() else None
    if cubin is None:
        cubin = _compile_uncached(source, arch, context)
        _write_atomically(path, cubin)
    with _lock:
        _memory[key] = cubin
    return cubin


def _write_atomically(path: pathlib.Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as handle:
            handle.write(data)
        os.replace(handle.name, path)
    except OSError:
        pass  # an unwritable cache only costs a recompilation
