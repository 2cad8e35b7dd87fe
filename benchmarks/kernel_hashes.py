"""``python -m benchmarks.kernel_hashes``: the SHA-256 of every generated CUDA source a benchmark row
launches, with no GPU: the proof that a change to the planner or the code generator changes no kernel.

For each public config, phase (the product's and the convolution's ``fwd``, ``bwd``, ``dbwd``), dtype
and variant (``jax_cgtp``: atomic; ``jax_cgtp_det``: deterministic on a sorted graph;
``jax_cgtp_graph``: atomic on a sorted graph), the row's phase is traced at the benchmark's size
(:func:`jax_cgtp.gpu.cuda_lowering.planned_kernels`) and each launch's source hashed, in launch order.
``--edge-parts N`` also plans the calls as ``jax.jit`` splits them over N devices (the partitioned
rule's per-device edges, :mod:`jax_cgtp.sharding.partitioning`), as a sharded training step runs them.

    python -m benchmarks.kernel_hashes --out before.json                 # before a refactor
    python -m benchmarks.kernel_hashes --check before.json               # after: every hash the same

``--check`` prints each row whose hashes differ and exits with status 1 if any does. An intended
change needs a same-process A/B on the device (``benchmarks.ab``) for the rows it lists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import jax
import numpy as np

from jax_cgtp.gpu import codegen

from jax_cgtp.sharding import partitioning
from jax_cgtp.gpu.cuda_lowering import planned_kernels

from . import configs
from .profile import phase_and_arguments
from .run import _list

VARIANTS = ("jax_cgtp", "jax_cgtp_det", "jax_cgtp_graph")
PHASES = ("fwd", "bwd", "dbwd", "conv_fwd", "conv_bwd", "conv_dbwd")


def _split(args, parts: int):
    """``args`` (ShapeDtypeStructs) with every per-edge array's leading axis split over ``parts``
    devices, as :func:`jax_cgtp.gpu.cuda_lowering.planned_kernels` reads a sharding."""
    mesh = jax.sharding.AbstractMesh((parts,), ("edges",), axis_types=(jax.sharding.AxisType.Auto,))
    edges = max(a.shape[0] for a in jax.tree.leaves(args) if a.ndim)
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("edges"))
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rows)
                        if a.ndim and a.shape[0] == edges else a, args)


def row_hashes(config: str, phase: str, dtype: str, variant: str, parts: int = 1) -> list[str]:
    """The hash of each kernel the row launches, in launch order."""
    if variant != "jax_cgtp" and not phase.startswith("conv_"):
        return []
    edges = configs.EDGES[dtype]
    fn, args = phase_and_arguments(config, phase, dtype, edges, concrete=False, lib=variant)
    if parts > 1:
        args = _split(args, parts)
    return [hashlib.sha256(codegen.generate(kernel).encode()).hexdigest()[:16] for kernel in planned_kernels(fn, *args)]


def all_hashes(config_names, phase_names, dtypes, variants, parts: int) -> dict[str, list[str]]:
    hashes = {}
    for config in config_names:
        for dtype in dtypes:
            for phase in phase_names:
                for variant in variants:
                    key = f"{config}:{phase}:{dtype}:{variant}" + (f":parts{parts}" if parts > 1 else "")
                    hashes[key] = row_hashes(config, phase, dtype, variant, parts)
                    print(f"{key}: {len(hashes[key])} kernels", file=sys.stderr, flush=True)
    return hashes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", type=_list, default=list(configs.SUITES["public"]))
    parser.add_argument("--phases", type=_list, default=list(PHASES))
    parser.add_argument("--dtype", type=_list, default=list(configs.DTYPES))
    parser.add_argument("--variants", type=_list, default=list(VARIANTS))
    parser.add_argument("--edge-parts", type=int, default=1, help="plan the calls split over this many devices")
    parser.add_argument("--out", default=None, help="write the hashes to this JSON file")
    parser.add_argument("--check", default=None, help="compare with this JSON file; exit 1 where a row differs")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    if args.edge_parts > 1 and not partitioning.enabled():
        parser.error("--edge-parts needs the partitioning rule (unset JAX_CGTP_PARTITIONING=0)")
    hashes = all_hashes(args.configs, args.phases, args.dtype, args.variants, args.edge_parts)
    if args.out:
        with open(args.out, "w") as file:
            json.dump(hashes, file, indent=1, sort_keys=True)
    if args.check:
        with open(args.check) as file:
            expected = json.load(file)
        differing = [key for key in hashes if key in expected and hashes[key] != expected[key]]
        missing = [key for key in hashes if key not in expected]
        for key in differing:
            print(f"differs: {key}: {expected[key]} -> {hashes[key]}")
        for key in missing:
            print(f"not in {args.check}: {key}")
        print(f"{len(hashes) - len(differing) - len(missing)} rows the same, {len(differing)} differ, "
              f"{len(missing)} not compared; {sum(map(len, hashes.values()))} kernels ({len(set(np.concatenate([h for h in hashes.values() if h]).tolist()))} distinct)")
        return int(bool(differing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
