"""``python -m benchmarks.kernel_stats``: registers, SASS instructions and local memory of every kernel
a benchmark row launches, read from the cubin NVRTC builds, with no GPU.

For each config, phase, dtype and variant (``jax_cgtp`` and ``jax_cgtp_det`` by default, or
``jax_cgtp_graph``) the row's phase is traced (:func:`jax_cgtp.cuda_lowering.planned_kernels`), each
kernel generated and compiled for ``--arch`` (default sm_90, the H100's) as the lowering compiles it
(:func:`jax_cgtp.cuda_lowering.kernel_cubin`), and its cubin read (:mod:`jax_cgtp.cubin`): registers
and local memory per thread (spills and local arrays), and SASS instructions.

A kernel change that reshapes register allocation can be judged here before device time is spent,
with one caution: the NVRTC of JAX's CUDA wheel on the GPU machine and the CUDA toolkit's NVRTC
here, both 13.0, allocate registers differently for some kernels (nequip-revmd17-benzene's float32
convolution forward: 168 registers there, 158 here), so for exact numbers run it there too::

    python -m benchmarks.kernel_stats --configs mace-l2-c128 --phases conv_fwd --dtype float32

``--set`` plans the kernels under other settings (``--set jax_cgtp.schedule.Z_WITH_BACKWARD_MAX_TERMS=0``).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor

import jax

from jax_cgtp import codegen, nvrtc
from jax_cgtp.cubin import cubin_stats
from jax_cgtp.cuda_lowering import kernel_cubin, planned_kernels

from . import configs, phases
from .profile import phase_and_arguments
from .run import _list
from .settings import apply_option

VARIANTS = ("jax_cgtp", "jax_cgtp_det", "jax_cgtp_graph")


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
    parser.add_argument("--set", default="", metavar="module.ATTR=VALUE;...",
                        help="settings of jax_cgtp's generator or scheduler, as benchmarks.ab's --variant takes them")
    args = parser.parse_args(argv)
    apply_option(parser, "--set", args.set)
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
    launches = [(row, n, kernel) for row in rows for n, kernel in enumerate(row_kernels(*row))]

    def stats(kernel):
        return cubin_stats(kernel_cubin(kernel, args.arch), codegen.KERNEL_NAME)

    with ThreadPoolExecutor() as pool:
        results = list(pool.map(lambda launch: stats(launch[2]), launches))
    print(f"{'config':24s} {'phase':10s} {'dtype':8s} {'lib':14s} {'launch':>6s} {'regs':>5s} {'SASS':>7s} {'local':>6s}")
    for ((config, phase, dtype, lib), n, _), s in zip(launches, results):
        print(f"{config:24s} {phase:10s} {dtype:8s} {lib:14s} {n:6d} {s.registers:5d} {s.instructions:7d} {s.local_bytes:6d}")


if __name__ == "__main__":
    main()
