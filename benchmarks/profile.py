"""``python -m benchmarks.profile CONFIG PHASE DTYPE``: one benchmark phase, run for a profiler.

The row is built exactly as :mod:`benchmarks.run` builds it (same inputs, same phase function;
``--lib`` picks the library, by default jax_cgtp's atomic variant). The compiled phase runs
``--warmup`` times, then ``--runs`` times inside the CUDA profiler's range (``cuProfilerStart`` /
``cuProfilerStop``), so Nsight Compute sees exactly the profiled runs' kernels, whichever library
launched them::

    ncu --clock-control none --profile-from-start off python -m benchmarks.profile mace-l2-c128 fwd float32 --lib cueq

``--launches`` traces jax_cgtp's phase and plans its kernels on the host, with no GPU (set
``JAX_CGTP_ARCH``): it prints the number of launches of one run, and on stderr each launch's
outputs, joint pass, tile, slot groups and shared memory.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import sys

import jax
import jax.numpy as jnp

import jax_cgtp
from jax_cgtp.gpu import schedule
from jax_cgtp.gpu.cuda_lowering import planned_kernels

from . import configs, phases, problems
from .inputs import GRAPHS, make_inputs
from .peers import LIBRARIES, OPTIONAL_LIBRARIES, adapter
from .settings import settings_option


def phase_and_arguments(config: str, phase: str, dtype: str, edges: int, concrete: bool = True,
                        lib: str = "jax_cgtp", graph: str = "random", shared_weights: bool = False):
    """The un-jitted phase function of library ``lib`` on the benchmark row's inputs (a convolution
    on ``graph``, see :mod:`benchmarks.inputs`; one row of weights with ``shared_weights``), in the
    library's layout, and those inputs (their shapes only, without ``concrete``)."""
    tp = problems.build(config)
    conv = phases.is_conv(phase)
    names = phases.input_names(phase)
    impl = adapter(lib).build(tp, jnp.dtype(dtype), conv, {})

    def arrays():
        inputs = make_inputs(tp.problem, dtype, edges, conv, graph=graph, shared_weights=shared_weights)
        arguments = impl.arguments(inputs)
        return tuple(arguments[name] for name in names)

    return phases.phase_function(phase, impl.apply), arrays() if concrete else jax.eval_shape(arrays)


def describe(kernel: schedule.KernelSchedule) -> str:
    outputs = ", ".join(f"{o.role} {o.kind} by {o.flush}" for o in kernel.outputs)
    if kernel.joint is not None:
        joint = "joint pass"
    elif kernel.stream is not None:
        joint = f"weight stream of {len(kernel.stream.items)} items per edge"
    else:
        joint = f"{len(kernel.slots)} slots"
    ahead = f", look-ahead ring of {kernel.ahead + 1} slots" if kernel.ahead else ""
    ahead += ", two partial rows per tile" if kernel.partial_tiles else ""
    cap = (f", each run's first {kernel.run_cap} edges" if kernel.run_cap else
           f", the edges past the first {kernel.beyond_cap} of their run" if kernel.beyond_cap else
           f", chunks of {kernel.chunk_walk} edges after each run's first" if kernel.chunk_walk else "")
    if kernel.chunk_sum:
        return f"[{outputs}] the rows of chunks of {kernel.chunk_sum} edges, added to their run's node in order"
    if kernel.tile_sum:
        return (f"[{outputs}] the partial rows of the runs across an edge of {kernel.tile_sum}-edge tiles, "
                "summed in tile order")
    return (f"[{outputs}] {joint}, tiles of {kernel.tile} edges ({kernel.tiling}), {kernel.num_groups} group(s), "
            f"{kernel.shared_bytes} shared bytes per block{ahead}{cap}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", choices=sorted(configs.CONFIGS))
    parser.add_argument("phase", choices=configs.ALL_PHASES)
    parser.add_argument("dtype", choices=configs.DTYPES)
    parser.add_argument("--edges", type=int, default=None, help="default: the benchmark's size for the dtype")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--graph", default="random", choices=GRAPHS,
                        help="a convolution's graph (benchmarks.inputs; default random, the table's)")
    parser.add_argument("--launches", action="store_true", help="print the launch count of one run and exit")
    parser.add_argument("--lib", default="jax_cgtp", choices=LIBRARIES + OPTIONAL_LIBRARIES,
                        help="the library whose phase runs (default jax_cgtp)")
    parser.add_argument("--set", default="", metavar="name=VALUE;...",
                        help="settings of jax_cgtp's generator or scheduler, as benchmarks.ab's --variant takes them")
    args = parser.parse_args(argv)
    if args.launches and not args.lib.startswith("jax_cgtp"):
        parser.error("--launches plans jax_cgtp's kernels; it needs --lib jax_cgtp or jax_cgtp_det")
    settings = settings_option(parser, "--set", args.set)
    jax.config.update("jax_enable_x64", True)
    fn, arguments = phase_and_arguments(args.config, args.phase, args.dtype, args.edges or configs.EDGES[args.dtype],
                                        concrete=not args.launches, lib=args.lib, graph=args.graph)
    with jax_cgtp.config(**settings):  # the phase is traced under them
        if args.launches:
            kernels = planned_kernels(fn, *arguments)
            for n, kernel in enumerate(kernels):
                print(f"launch {n}: {describe(kernel)}", file=sys.stderr)
            print(len(kernels))
            return
        compiled = jax.jit(fn).lower(*arguments).compile()
    for _ in range(args.warmup):
        jax.block_until_ready(compiled(*arguments))
    with _profiler_range():
        for _ in range(args.runs):
            jax.block_until_ready(compiled(*arguments))


@contextlib.contextmanager
def _profiler_range():
    """The CUDA driver's profiler range (what ``ncu --profile-from-start off`` profiles); nothing
    on a machine without a GPU."""
    if jax.default_backend() != "gpu":
        yield
        return
    driver = ctypes.CDLL("libcuda.so.1")
    driver.cuProfilerStart()
    try:
        yield
    finally:
        driver.cuProfilerStop()


if __name__ == "__main__":
    main()
