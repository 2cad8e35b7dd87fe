"""``python -m benchmarks.kernel_stats``: registers, SASS instructions and local memory of every kernel
a benchmark row launches, read from the cubin NVRTC builds, with no GPU.

For each config, phase, dtype and variant (``jax_cgtp`` and ``jax_cgtp_det`` by default, or
``jax_cgtp_graph``) the row's phase is traced (:func:`jax_cgtp.gpu.cuda_lowering.planned_kernels`), each
kernel generated and compiled for ``--arch`` (default sm_90, the H100's) as the lowering compiles it
(:func:`jax_cgtp.gpu.cuda_lowering.kernel_cubin`), and its cubin read:

* registers and local memory per thread (spills and local arrays): the ``EIATTR_REGCOUNT`` and
  ``EIATTR_FRAME_SIZE`` attributes of the cubin's ``.nv.info`` section for the kernel's symbol
  (what ``cuobjdump --dump-resource-usage`` reports);
* SASS instructions: the ``.text.cgtp_kernel`` section's size over 16 bytes per instruction (sm_70
  and later).

A kernel change that reshapes register allocation can be judged here before device time is spent,
with one caution: the NVRTC of JAX's CUDA wheel on the GPU machine and the CUDA toolkit's NVRTC
here, both 13.0, allocate registers differently for some kernels (nequip-revmd17-benzene's float32
convolution forward: 168 registers there, 158 here), so for exact numbers run it there too::

    python -m benchmarks.kernel_stats --configs mace-l2-c128 --phases conv_fwd --dtype float32

``--set`` plans the kernels under other settings (``--set z_with_backward_max_terms=0``).
"""

from __future__ import annotations

import argparse
import struct
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import jax

import jax_cgtp
from jax_cgtp.gpu import codegen, nvrtc
from jax_cgtp.gpu.cuda_lowering import kernel_cubin, planned_kernels

from . import configs, phases
from .profile import phase_and_arguments
from .run import _list
from .settings import settings_option

INSTRUCTION_BYTES = 16
_REGCOUNT, _FRAME_SIZE = 0x2F, 0x11  # EIATTR_REGCOUNT, EIATTR_FRAME_SIZE: (symbol, value) pairs
_SIZED = 0x04  # EIFMT_SVAL: a 16-bit size, then the payload; every other format is 4 bytes in all
VARIANTS = ("jax_cgtp", "jax_cgtp_det", "jax_cgtp_graph")


@dataclass(frozen=True)
class KernelStats:
    registers: int
    instructions: int
    local_bytes: int


def _sections(cubin: bytes) -> dict[str, tuple[int, int, int]]:
    """``{name: (offset, size, sh_info)}`` of the cubin's ELF64 sections."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not an ELF64 cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + n * shentsize) for n in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(offset: int) -> str:
        end = cubin.index(b"\0", names_at + offset)
        return cubin[names_at + offset:end].decode()

    return {name(h[0]): (h[4], h[5], h[7]) for h in headers}


def _attributes(info: bytes):
    """``(attribute, payload)`` of each entry of an ``.nv.info`` section."""
    at = 0
    while at + 4 <= len(info):
        fmt, attribute, size = info[at], info[at + 1], struct.unpack_from("<H", info, at + 2)[0]
        if fmt == _SIZED:
            yield attribute, info[at + 4:at + 4 + size]
            at += 4 + size
        else:
            at += 4


def cubin_stats(cubin: bytes, kernel: str = codegen.KERNEL_NAME) -> KernelStats:
    """Registers, SASS instructions and local bytes per thread of ``kernel`` in ``cubin``."""
    sections = _sections(cubin)
    text = f".text.{kernel}"
    if text not in sections or ".nv.info" not in sections:
        raise ValueError(f"the cubin has no section {text} or no .nv.info")
    _, size, symbol = sections[text]
    offset, info_size, _ = sections[".nv.info"]
    values = {}
    for attribute, payload in _attributes(cubin[offset:offset + info_size]):
        if attribute in (_REGCOUNT, _FRAME_SIZE) and struct.unpack_from("<I", payload)[0] == symbol:
            values[attribute] = struct.unpack_from("<I", payload, 4)[0]
    if _REGCOUNT not in values:
        raise ValueError(f"the cubin's .nv.info has no register count for {kernel}")
    return KernelStats(values[_REGCOUNT], size // INSTRUCTION_BYTES, values.get(_FRAME_SIZE, 0))


def row_kernels(config: str, phase: str, dtype: str, lib: str):
    """The schedules of the kernels one run of the benchmark row launches, in order."""
    fn, arguments = phase_and_arguments(config, phase, dtype, configs.EDGES[dtype], concrete=False, lib=lib)
    return planned_kernels(fn, *arguments)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", type=_list, default=["public"], help="comma-separated configs or a suite (default public)")
    parser.add_argument("--phases", type=_list, default=list(configs.PHASES))
    parser.add_argument("--dtype", type=_list, default=list(configs.DTYPES))
    parser.add_argument("--libs", type=_list, default=["jax_cgtp", "jax_cgtp_det"])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--set", default="", metavar="name=VALUE;...",
                        help="settings of jax_cgtp's generator or scheduler, as benchmarks.ab's --variant takes them")
    args = parser.parse_args(argv)
    settings = settings_option(parser, "--set", args.set)
    names = [c for name in args.configs for c in configs.SUITES.get(name, (name,))]
    for label, chosen, allowed in (("config", names, configs.CONFIGS), ("phase", args.phases, configs.ALL_PHASES),
                                   ("dtype", args.dtype, configs.DTYPES), ("lib", args.libs, VARIANTS)):
        unknown = [c for c in chosen if c not in allowed]
        if unknown:
            parser.error(f"unknown {label} {', '.join(unknown)}; choose from {', '.join(allowed)}")
    if not nvrtc.available():
        sys.exit("benchmarks.kernel_stats: NVRTC is not available on this machine")
    jax.config.update("jax_enable_x64", True)
    rows = [(c, p, d, lib) for c in names for p in args.phases for d in args.dtype
            for lib in args.libs if lib == "jax_cgtp" or phases.is_conv(p)]
    with jax_cgtp.config(**settings):  # the rows are traced under them
        launches = [(row, n, kernel) for row in rows for n, kernel in enumerate(row_kernels(*row))]

    def stats(kernel):
        return cubin_stats(kernel_cubin(kernel, args.arch))

    with ThreadPoolExecutor() as pool:
        results = list(pool.map(lambda launch: stats(launch[2]), launches))
    print(f"{'config':24s} {'phase':10s} {'dtype':8s} {'lib':14s} {'launch':>6s} {'regs':>5s} {'SASS':>7s} {'local':>6s}")
    for ((config, phase, dtype, lib), n, _), s in zip(launches, results):
        print(f"{config:24s} {phase:10s} {dtype:8s} {lib:14s} {n:6d} {s.registers:5d} {s.instructions:7d} {s.local_bytes:6d}")


if __name__ == "__main__":
    main()
