"""The two numbers of every row: minimum bytes moved and FLOP, counted from the problem.

Bytes (the memory floor): each operand the phase *needs* is read once and each result written
once, in the benchmark's dtype; index arrays (``src``, ``dst``) are int32. With ``d1, d2, dw,
d3`` the sizes of ``x, y, w, z`` per row, ``E`` edges (rows) and ``N`` nodes:

=========  =====================================================  ======================
phase      reads                                                  writes
=========  =====================================================  ======================
fwd        x, y, w (E rows)                                       z (E)
bwd        x, y, w, g (E)                                         x̄, ȳ, w̄ (E)
dbwd       x, w, g (E)                                            w̄, x̄ (E)
train      x, y, w (E)                                            x̄, ȳ, w̄ (E)
conv_fwd   x (N), y, w (E), src, dst                              z (N)
conv_bwd   x (N), y, w (E), g (N), src, dst                       x̄ (N), ȳ, w̄ (E)
conv_dbwd  x (N), w (E), g (N), src, dst                          w̄ (E), x̄ (N)
conv_train x (N), y, w (E), src, dst                              x̄ (N), ȳ, w̄ (E)
=========  =====================================================  ======================

``dbwd`` is the gradient w.r.t. ``(w, x)`` of ``|d/dy sum(z * g)|^2``; ``d/dy`` of the
trilinear product does not depend on ``y``, so ``y`` is not counted.

The double backward also has a second floor, that of the calls JAX makes for any library
(:func:`two_call_bytes`): a call computes ``ȳ`` from ``x, w, g``; XLA forms ``ȳ̄ = 2 ȳ`` (one
read and one write of ``ȳ``'s size); the transposed call computes ``w̄, x̄`` from ``x, w, g, ȳ̄``.
``ȳ̄`` depends on all of ``ȳ`` in a real force loss, so no library can fuse the two calls, and
``x, w, g`` (and the convolution's indices) are read twice. ``python -m benchmarks.cost
REPORT.json`` gives each library's fraction of it, row by row.

FLOP: one product ``T`` costs, per row, the sum over active instructions of
``3 * nnz * pairs`` (each CG nonzero multiplies ``c * x_i * y_j`` and accumulates, for each pair
of multiplicity indices of ``x`` and ``y``: ``u*v`` for uvw/uvu/uvv, ``u`` for uuw/uuu) plus
``2 * d3 * |W|`` for the weight contraction of a weighted path (``d3 * pairs`` additions for an
unweighted one). ``nnz`` comes from :func:`jax_cgtp.core.problem.cg_nonzeros`. Each of ``x̄, ȳ, w̄``
is one such contraction, so ``bwd`` costs 3 products; ``dbwd`` computes ``ȳ`` and then its two
cotangents: 3 products. ``train`` runs the forward (1), the backward (3), the backward's
derivative (9 terms: x̄, ȳ and w̄ two each, z three) and the backward of z's cotangent (3): 16
products. The convolutions cost the same per edge (gather and scatter are data
movement).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from jax_cgtp.core.problem import cg_nonzeros

from .configs import CONFIGS
from .problems import build
from .report import load
from .timing import per_call_ms

INDEX_BYTES = 4

PRODUCTS_PER_PHASE = {"fwd": 1, "bwd": 3, "dbwd": 3, "train": 16}

# (operand, "E" or "N" rows) read and written by each phase; "i" is one index array.
_TRAFFIC = {
    "fwd": (("x", "E"), ("y", "E"), ("w", "E"), ("z", "E")),
    "bwd": (("x", "E"), ("y", "E"), ("w", "E"), ("z", "E"), ("x", "E"), ("y", "E"), ("w", "E")),
    "dbwd": (("x", "E"), ("w", "E"), ("z", "E"), ("w", "E"), ("x", "E")),
    "train": (("x", "E"), ("y", "E"), ("w", "E"), ("x", "E"), ("y", "E"), ("w", "E")),
    "conv_fwd": (("x", "N"), ("y", "E"), ("w", "E"), ("i", "E"), ("i", "E"), ("z", "N")),
    "conv_bwd": (
        ("x", "N"), ("y", "E"), ("w", "E"), ("z", "N"), ("i", "E"), ("i", "E"),
        ("x", "N"), ("y", "E"), ("w", "E"),
    ),
    "conv_dbwd": (("x", "N"), ("w", "E"), ("z", "N"), ("i", "E"), ("i", "E"), ("w", "E"), ("x", "N")),
    "conv_train": (("x", "N"), ("y", "E"), ("w", "E"), ("i", "E"), ("i", "E"), ("x", "N"), ("y", "E"), ("w", "E")),
}


# The double backward's two calls and XLA's elementwise step between them (see the docstring).
_TWO_CALL_TRAFFIC = {
    "dbwd": (("x", "E"), ("w", "E"), ("z", "E"), ("y", "E"))
    + (("y", "E"), ("y", "E"))
    + (("x", "E"), ("w", "E"), ("z", "E"), ("y", "E"), ("w", "E"), ("x", "E")),
    "conv_dbwd": (("x", "N"), ("w", "E"), ("z", "N"), ("i", "E"), ("i", "E"), ("y", "E"))
    + (("y", "E"), ("y", "E"))
    + (("x", "N"), ("w", "E"), ("z", "N"), ("i", "E"), ("i", "E"), ("y", "E"), ("w", "E"), ("x", "N")),
}


def base_phase(phase: str) -> str:
    """``"fwd"``, ``"bwd"`` or ``"dbwd"`` for a phase with or without the ``conv_`` prefix."""
    return phase.removeprefix("conv_")


def min_bytes(problem, phase: str, edges: int, nodes: int, itemsize: int, shared_weights: bool = False) -> int:
    """Fewest bytes the phase must move: every needed operand read once, every result written once
    (one row of weights, read or written once, where every edge shares it).

    >>> from benchmarks.problems import build
    >>> p = build("tiny-uvw", backend="reference").problem   # d1=9, d2=4, dw=25, d3=11
    >>> min_bytes(p, "fwd", edges=10, nodes=2, itemsize=4) == 10 * (9 + 4 + 25 + 11) * 4
    True
    """
    return _bytes(_TRAFFIC[phase], problem, edges, nodes, itemsize, shared_weights)


def two_call_bytes(problem, phase: str, edges: int, nodes: int, itemsize: int) -> int:
    """Bytes of the double backward (``dbwd`` or ``conv_dbwd``) as two calls that each read their
    inputs once, and XLA's ``ȳ̄ = 2 ȳ`` between them (see the module docstring).

    >>> from benchmarks.problems import build
    >>> p = build("tiny-uvw", backend="reference").problem   # d1=9, d2=4, dw=25, d3=11
    >>> two_call_bytes(p, "dbwd", edges=10, nodes=2, itemsize=4) == 10 * 4 * (3 * 9 + 3 * 25 + 2 * 11 + 4 * 4)
    True
    """
    if phase not in _TWO_CALL_TRAFFIC:
        raise ValueError(f"{phase!r} is one call; two_call_bytes counts {sorted(_TWO_CALL_TRAFFIC)}")
    return _bytes(_TWO_CALL_TRAFFIC[phase], problem, edges, nodes, itemsize)


def _bytes(traffic, problem, edges: int, nodes: int, itemsize: int, shared_weights: bool = False) -> int:
    size = {"x": problem.irreps_in1.dim, "y": problem.irreps_in2.dim, "w": problem.weight_numel,
            "z": problem.irreps_out.dim}
    rows = {"E": edges, "N": nodes}
    total = 0
    for operand, row_kind in traffic:
        if operand == "i":
            total += rows[row_kind] * INDEX_BYTES
        else:
            total += (1 if operand == "w" and shared_weights else rows[row_kind]) * size[operand] * itemsize
    return total


def _pairs(ins) -> int:
    return ins.mul_in1 * ins.mul_in2 if ins.mode in ("uvw", "uvu", "uvv") else ins.mul_in1


def product_flop_per_row(problem) -> int:
    """FLOP of one product ``z = T(x, y, w)`` for one row (see the module docstring)."""
    total = 0
    for ins in problem.active_instructions:
        d3 = problem.irreps_out[ins.i_out].ir.dim
        pairs = _pairs(ins)
        total += 3 * len(cg_nonzeros(problem, ins)) * pairs
        total += 2 * d3 * math.prod(ins.path_shape) if ins.has_weight else d3 * pairs
    return total


def flop(problem, phase: str, edges: int) -> int:
    """FLOP of the phase over ``edges`` rows (products per phase times the per-row count)."""
    return PRODUCTS_PER_PHASE[base_phase(phase)] * product_flop_per_row(problem) * edges


def has_two_calls(phase: str) -> bool:
    """Whether JAX runs ``phase`` as two calls (the double backward), for any library."""
    return phase in _TWO_CALL_TRAFFIC


def two_call_scale(row: dict) -> float:
    """A double-backward row's :func:`two_call_bytes` over its ``min_bytes``."""
    if row["config"] not in CONFIGS:
        raise ValueError(f"the report's config {row['config']!r} is not one of benchmarks.configs.CONFIGS")
    problem = build(row["config"], backend="reference").problem
    itemsize = np.dtype(row["dtype"]).itemsize
    return two_call_bytes(problem, row["phase"], row["edges"], row["nodes"], itemsize) / row["min_bytes"]


def two_call_fractions(report: dict) -> list[dict]:
    """For each double-backward row of a benchmark report: its two-call floor (the memory floor
    scaled by :func:`two_call_scale`, at the row's own measured bandwidth), each library's fraction
    of it (floor ms / per-call ms), and the fraction that 1.5x cuEq's time (issue 4's and 5's
    target) would need."""
    fractions = []
    for row in report["rows"]:
        if not has_two_calls(row["phase"]):
            continue
        scale = two_call_scale(row)
        floor_ms = row["memory_floor_ms"] * scale
        times = {lib: per_call_ms(result) for lib, result in row["results"].items()}
        fractions.append({
            "config": row["config"], "phase": row["phase"], "dtype": row["dtype"], "two_call_floor_ms": floor_ms,
            "scale": scale, "fraction": {lib: floor_ms / ms for lib, ms in times.items() if ms},
            "needed_for_1.5x_cueq": 1.5 * floor_ms / times["cueq"] if times.get("cueq") else None,
        })
    return fractions


def main(argv=None) -> None:
    """``python -m benchmarks.cost REPORT.json``: the double backward's rows against their two-call floor."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("report", help="a bench JSON (benchmarks.run, benchmarks.report)")
    args = parser.parse_args(argv)
    try:
        saved = load(args.report)
    except ValueError as error:
        parser.error(str(error))
    try:
        fractions = two_call_fractions(saved)
    except ValueError as error:
        parser.error(f"{args.report}: {error}")
    print(f"{'config':24} {'phase':10} {'dtype':8} {'2-call/floor':>12} {'2-call floor ms':>15}  "
          f"% of the two-call floor per library; what 1.5x cuEq would need")
    for r in fractions:
        libs = ", ".join(f"{lib} {100 * v:.0f}%" for lib, v in r["fraction"].items())
        need = r["needed_for_1.5x_cueq"]
        print(f"{r['config']:24} {r['phase']:10} {r['dtype']:8} {r['scale']:12.2f} {r['two_call_floor_ms']:15.3f}  "
              f"{libs}" + (f"; 1.5x cuEq: {100 * need:.0f}%" if need else ""))


if __name__ == "__main__":
    main()
