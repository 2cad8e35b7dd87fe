"""The benchmark configs, as data: which tensor products are timed, and at what size.

Each config names a *kind* (how its instruction list is formed, see
:mod:`benchmarks.problems`) and its irreps. All weights are per edge, as MLIPs use them.

Kinds:

``channelwise_seed``
    OpenEquivariance's ``ChannelwiseTPP`` (``benchmark/problems.py``, taken from MACE): mode
    ``uvu``, one output block ``mul1 x ir`` per path for every ``ir`` in ``ir1 x ir2`` that
    occurs in ``irreps_out``; output blocks sorted by irrep (stable) and the instruction list
    then sorted by output block; blocks, instructions and weight layout are exactly the seed
    paper's (OpenEquivariance's irrep order puts odd before even parity at every ``l``).
``fully_connected``
    OpenEquivariance's ``FullyConnectedTPP`` (e3nn's ``FullyConnectedTensorProduct``): mode
    ``uvw`` for every block triple with ``ir_out`` in ``ir1 x ir2``.
``channelwise_lmax``
    ``jax_cgtp.channelwise_tensor_product`` keeping every path whose output has ``l <= lmax``
    (both parities), with ``lmax`` the largest ``l`` of the two inputs. This reading of "every
    path with l <= lmax kept" is the one that reproduces the anchor in METHOD-NOTES:
    cuequivariance-jax's mace-l2-c128 forward (2.72 ms at ~2.6 TB/s on an H100) moves ~7.1 GB,
    which is this config's minimum (7.12 GB); keeping only ``0e+1o+2e`` would be 3.3 GB.
"""

from __future__ import annotations

SEED_SOURCE = "OpenEquivariance benchmark/problems.py"

CONFIGS: dict[str, dict] = {
    # The seed paper's problems (OpenEquivariance mace_problems(), nequip_problems(), diffdock_problems()).
    "mace-large": dict(
        kind="channelwise_seed",
        irreps_in1="128x0e+128x1o+128x2e",
        irreps_in2="0e+1o+2e+3o",
        irreps_out="128x0e+128x1o+128x2e+128x3o",
        source=SEED_SOURCE + " mace_problems()",
    ),
    "mace-medium": dict(
        kind="channelwise_seed",
        irreps_in1="128x0e+128x1o",
        irreps_in2="0e+1o+2e+3o",
        irreps_out="128x0e+128x1o+128x2e",
        source=SEED_SOURCE + " mace_problems()",
    ),
    "nequip-lips": dict(
        kind="channelwise_seed",
        irreps_in1="32x0o+32x0e+32x1o+32x1e+32x2o+32x2e",
        irreps_in2="0e+1o+2e",
        irreps_out="32x0o+32x0e+32x1o+32x1e+32x2o+32x2e",
        source=SEED_SOURCE + " nequip_problems()",
    ),
    "nequip-revmd17-benzene": dict(
        kind="channelwise_seed",
        irreps_in1="64x0o+64x0e+64x1o+64x1e+64x2o+64x2e+64x3o+64x3e",
        irreps_in2="0e+1o+2e+3o",
        irreps_out="64x0o+64x0e+64x1o+64x1e+64x2o+64x2e+64x3o+64x3e",
        source=SEED_SOURCE + " nequip_problems()",
    ),
    "DiffDock-L=2": dict(
        kind="fully_connected",
        irreps_in1="10x1o+10x1e+48x0e+48x0o",
        irreps_in2="0e+1o+2e",
        irreps_out="10x1o+10x1e+48x0e+48x0o",
        source=SEED_SOURCE + " diffdock_problems() (shared_weights=False)",
    ),
    # Typical MLIP convolution products (METHOD-NOTES): every path with l <= lmax kept.
    "nequip-l2-c32": dict(
        kind="channelwise_lmax",
        irreps_in1="32x0e+32x1o+32x2e",
        irreps_in2="0e+1o+2e",
        source="METHOD-NOTES",
    ),
    "mace-l2-c128": dict(
        kind="channelwise_lmax",
        irreps_in1="128x0e+128x1o+128x2e",
        irreps_in2="0e+1o+2e+3o",
        source="METHOD-NOTES",
    ),
    "sevennet-l3-c32": dict(
        kind="channelwise_lmax",
        irreps_in1="32x0e+32x1o+32x2e+32x3o",
        irreps_in2="0e+1o+2e+3o",
        source="METHOD-NOTES",
    ),
    "l5-c32": dict(
        kind="channelwise_lmax",
        irreps_in1="32x0e+32x1o+32x2e+32x3o+32x4e+32x5o",
        irreps_in2="0e+1o+2e+3o+4e+5o",
        source="METHOD-NOTES",
    ),
    # Tiny problems for the CPU smoke run: one channelwise (uvu) and one fully connected (uvw).
    "tiny-uvu": dict(
        kind="channelwise_lmax",
        irreps_in1="4x0e+4x1o",
        irreps_in2="0e+1o",
        source="smoke",
    ),
    "tiny-uvw": dict(
        kind="fully_connected",
        irreps_in1="3x0e+2x1o",
        irreps_in2="0e+1o",
        irreps_out="2x0e+3x1o",
        source="smoke",
    ),
}

SUITES: dict[str, tuple[str, ...]] = {
    "public": (
        "mace-large",
        "mace-medium",
        "nequip-lips",
        "nequip-revmd17-benzene",
        "DiffDock-L=2",
        "nequip-l2-c32",
        "mace-l2-c128",
        "sevennet-l3-c32",
        "l5-c32",
    ),
    "seed": ("mace-large", "mace-medium", "nequip-lips", "nequip-revmd17-benzene", "DiffDock-L=2"),
    "smoke": ("tiny-uvu", "tiny-uvw"),
}

PHASES = ("fwd", "bwd", "dbwd", "conv_fwd", "conv_bwd", "conv_dbwd")
# Selectable with --phases, not run by default: force training when x, y and w all depend on
# the positions (benchmarks.phases).
OPTIONAL_PHASES = ("train", "conv_train")
ALL_PHASES = PHASES + OPTIONAL_PHASES
DTYPES = ("float32", "float64")

# Rows (edges) per dtype: the public suite's sizes and the CPU smoke sizes.
EDGES = {"float32": 100_000, "float64": 50_000}
SMOKE_EDGES = {"float32": 64, "float64": 48}
EDGES_PER_NODE = 16

# The timing protocol (METHOD-NOTES): two warm-up runs, the median of at least 20.
WARMUP = 2
RUNS = 20
SMOKE_RUNS = 3
