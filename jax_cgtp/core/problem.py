"""The static description of a tensor-product problem: the single source of truth.

A problem is three irreps and a list of instructions. It defines the trilinear map

    z[e, o_out + w'*d3 + k] += pw * C[i, j, k] * x[e, o1 + u*d1 + i] * y[e, o2 + v*d2 + j] * W[u, v, w']

summed over the instructions (one CG block ``C`` each, scaled by the normalised path weight
``pw``), with the multiplicity indices tied together as the instruction's mode says. Operands
use e3nn's ``mul_ir`` layout, and the weights are the concatenation over weighted instructions
of each instruction's weight block flattened in C order of its ``path_shape``: exactly the
conventions of ``e3nn_jax.legacy.FunctionalTensorProduct`` (with its default
``gradient_normalization="path"``).

Everything here is plain hashable data, usable as a JAX primitive parameter.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import Sequence

import e3nn_jax as e3nn
import numpy as np

MODES = ("uvw", "uvu", "uvv", "uuw", "uuu")
IRREP_NORMALIZATIONS = ("component", "norm", "none")
PATH_NORMALIZATIONS = ("element", "path")

# Multiplicity subscripts of each operand block, per mode: x[u,i] y[v,j] W[...] z[.,k].
# ``path_shape`` of the weight block is the weight subscript's multiplicities.
MODE_SUBSCRIPTS = {
    "uvw": {"x": "u", "y": "v", "w": "uvw", "z": "w"},
    "uvu": {"x": "u", "y": "v", "w": "uv", "z": "u"},
    "uvv": {"x": "u", "y": "v", "w": "uv", "z": "v"},
    "uuw": {"x": "u", "y": "u", "w": "uw", "z": "w"},
    "uuu": {"x": "u", "y": "u", "w": "u", "z": "u"},
}


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One path ``irreps_in1[i_in1] x irreps_in2[i_in2] -> irreps_out[i_out]``.

    ``path_weight`` is the normalised factor that multiplies the CG block (what the
    contraction uses); ``weight_offset`` locates this path's weights in the flat weight
    vector (meaningless when ``has_weight`` is false).
    """

    i_in1: int
    i_in2: int
    i_out: int
    mode: str
    has_weight: bool
    path_weight: float
    mul_in1: int
    mul_in2: int
    mul_out: int
    weight_offset: int

    @property
    def path_shape(self) -> tuple[int, ...]:
        size = {"u": self.mul_in1, "v": self.mul_in2, "w": self.mul_out}
        return tuple(size[c] for c in MODE_SUBSCRIPTS[self.mode]["w"])

    @property
    def weight_numel(self) -> int:
        return math.prod(self.path_shape) if self.has_weight else 0

    @property
    def is_active(self) -> bool:
        """Whether the path contributes: no empty multiplicity and a nonzero path weight."""
        return bool(self.mul_in1 and self.mul_in2 and self.mul_out and self.path_weight != 0.0)

    def letters(self, operand: str) -> str:
        """Multiplicity letters of this path's block of ``operand`` (``"x"``, ``"y"``, ``"w"``, ``"z"``).

        Without weights, a letter that no input carries is dropped: unweighted ``uuw`` sums over
        u into an output block of multiplicity 1.
        """
        letters = MODE_SUBSCRIPTS[self.mode][operand]
        if self.has_weight or operand != "z":
            return letters
        inputs = MODE_SUBSCRIPTS[self.mode]["x"] + MODE_SUBSCRIPTS[self.mode]["y"]
        return "".join(c for c in letters if c in inputs)

    @property
    def num_elements(self) -> int:
        """How many products of multiplicities sum into one output component (e3nn)."""
        return {
            "uvw": self.mul_in1 * self.mul_in2,
            "uvu": self.mul_in2,
            "uvv": self.mul_in1,
            "uuw": self.mul_in1,
            "uuu": 1,
        }[self.mode]


@dataclasses.dataclass(frozen=True)
class Problem:
    """A validated tensor-product problem. Build it with :func:`make_problem`."""

    irreps_in1: e3nn.Irreps
    irreps_in2: e3nn.Irreps
    irreps_out: e3nn.Irreps
    instructions: tuple[Instruction, ...]
    irrep_normalization: str
    path_normalization: str

    @property
    def weight_numel(self) -> int:
        return sum(ins.weight_numel for ins in self.instructions)

    def operand_dim(self, operand: str) -> int:
        """Trailing size of operand ``"x"``, ``"y"``, ``"w"`` or ``"z"``."""
        return {
            "x": self.irreps_in1.dim,
            "y": self.irreps_in2.dim,
            "w": self.weight_numel,
            "z": self.irreps_out.dim,
        }[operand]

    @property
    def active_instructions(self) -> tuple[Instruction, ...]:
        """The instructions that contribute (see :attr:`Instruction.is_active`)."""
        return tuple(ins for ins in self.instructions if ins.is_active)

    def weighted_part(self) -> "Problem":
        """The same problem restricted to its weighted instructions: the part linear in w."""
        return dataclasses.replace(
            self, instructions=tuple(ins for ins in self.instructions if ins.has_weight)
        )

    def block(self, ins: Instruction, operand: str) -> tuple[int, int, int]:
        """``(offset, mul, ir_dim)`` of ``ins``'s block of operand x, y or z."""
        irreps, index = {
            "x": (self.irreps_in1, ins.i_in1),
            "y": (self.irreps_in2, ins.i_in2),
            "z": (self.irreps_out, ins.i_out),
        }[operand]
        mul_ir = irreps[index]
        return irreps[:index].dim, mul_ir.mul, mul_ir.ir.dim

    def __repr__(self) -> str:
        return (
            f"Problem({self.irreps_in1} x {self.irreps_in2} -> {self.irreps_out}, "
            f"{len(self.instructions)} instructions, {self.weight_numel} weights)"
        )


@functools.lru_cache(maxsize=None)
def _clebsch_gordan(l1: int, l2: int, l3: int) -> np.ndarray:
    cg = np.asarray(e3nn.clebsch_gordan(l1, l2, l3), dtype=np.float64)
    cg.setflags(write=False)
    return cg


def cg_block(problem: Problem, ins: Instruction) -> np.ndarray:
    """The path's CG tensor ``pw * C[i, j, k]`` in float64, shape ``(d1, d2, d3)``."""
    l1 = problem.irreps_in1[ins.i_in1].ir.l
    l2 = problem.irreps_in2[ins.i_in2].ir.l
    l3 = problem.irreps_out[ins.i_out].ir.l
    return ins.path_weight * _clebsch_gordan(l1, l2, l3)


def cg_nonzeros(problem: Problem, ins: Instruction, tol: float = 1e-14):
    """The sparse structure of a path: a list of ``(i, j, k, value)`` with ``value != 0``."""
    block = cg_block(problem, ins)
    scale = max(float(np.abs(block).max(initial=0.0)), 1e-300)
    return [
        (int(i), int(j), int(k), float(block[i, j, k]))
        for i, j, k in zip(*np.nonzero(np.abs(block) > tol * scale))
    ]


def parse_irreps(value, name: str) -> e3nn.Irreps:
    """``e3nn.Irreps(value)``, with a ``ValueError`` that names the argument."""
    try:
        irreps = e3nn.Irreps(value)
    except Exception as error:  # e3nn raises ValueError, TypeError or AssertionError
        raise ValueError(
            f"{name}: expected irreps such as '16x0e+8x1o', got {value!r} ({error})"
        ) from None
    return irreps


def _check_instruction_tuple(n: int, raw, irreps) -> tuple:
    where = f"instructions[{n}]"
    if not isinstance(raw, (tuple, list)) or len(raw) not in (5, 6):
        raise ValueError(
            f"{where}: expected a tuple (i_in1, i_in2, i_out, mode, has_weight[, path_weight]), "
            f"got {raw!r}"
        )
    i_in1, i_in2, i_out, mode, has_weight = raw[:5]
    path_weight = raw[5] if len(raw) == 6 else 1.0
    for index, irreps_name, value in zip(
        (0, 1, 2), ("irreps_in1", "irreps_in2", "irreps_out"), (i_in1, i_in2, i_out)
    ):
        size = len(irreps[index])
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{where}: index into {irreps_name} must be an int, got {value!r}")
        if not 0 <= value < size:
            raise ValueError(
                f"{where}: index {value} is out of range for {irreps_name} "
                f"{irreps[index]} which has {size} entries"
            )
    if mode not in MODES:
        raise ValueError(f"{where}: mode must be one of {MODES}, got {mode!r}")
    if not isinstance(has_weight, (bool, np.bool_)):
        raise TypeError(f"{where}: has_weight must be a bool, got {has_weight!r}")
    if isinstance(path_weight, bool) or not isinstance(path_weight, (int, float, np.floating)):
        raise TypeError(f"{where}: path_weight must be a float, got {path_weight!r}")
    if not math.isfinite(path_weight):
        raise ValueError(f"{where}: path_weight must be finite, got {path_weight!r}")
    return int(i_in1), int(i_in2), int(i_out), mode, bool(has_weight), float(path_weight)


def _check_path(n: int, parsed: tuple, irreps) -> None:
    i_in1, i_in2, i_out, mode, has_weight, _ = parsed
    where = f"instructions[{n}]"
    mul_ir1, mul_ir2, mul_ir3 = irreps[0][i_in1], irreps[1][i_in2], irreps[2][i_out]
    if mul_ir3.ir not in mul_ir1.ir * mul_ir2.ir:
        raise ValueError(
            f"{where}: output irrep {mul_ir3.ir} is not in {mul_ir1.ir} x {mul_ir2.ir} "
            f"(allowed: {', '.join(str(ir) for ir in mul_ir1.ir * mul_ir2.ir)})"
        )
    # The mode ties a multiplicity of y or z to an earlier operand's: e.g. uvu needs mul_out == mul_in1.
    named = {"u": ("irreps_in1", i_in1, mul_ir1), "v": ("irreps_in2", i_in2, mul_ir2)}
    own = {"y": ("irreps_in2", i_in2, mul_ir2, "v"), "z": ("irreps_out", i_out, mul_ir3, "w")}
    for operand, (name, index, mul_ir, free_letter) in own.items():
        letter = MODE_SUBSCRIPTS[mode][operand]
        if letter == free_letter:
            continue
        other_name, other_index, other = named[letter]
        if mul_ir.mul != other.mul:
            raise ValueError(
                f"{where}: mode {mode!r} needs {name}[{index}] ({mul_ir}) to have the "
                f"multiplicity of {other_name}[{other_index}] ({other}), got {mul_ir.mul} != {other.mul}"
            )
    if mode == "uvw" and not has_weight:
        raise ValueError(f"{where}: mode 'uvw' needs has_weight=True")
    if mode == "uuw" and not has_weight and mul_ir3.mul != 1:
        raise ValueError(
            f"{where}: mode 'uuw' without weights sums over u and needs an output "
            f"multiplicity of 1, got {mul_ir3}"
        )


def _normalized_path_weights(instructions, irreps, irrep_normalization, path_normalization):
    """e3nn's normalisation (unit input and output variances, gradient_normalization="path")."""
    exponent = {"element": 0.0, "path": 1.0}[path_normalization]
    num_elements = [ins.num_elements for ins in instructions]
    sums = collections.defaultdict(float)
    for ins, n in zip(instructions, num_elements):
        sums[ins.i_out] += n ** (1.0 - exponent)
    weights = []
    for ins, n, raw in zip(instructions, num_elements, (ins.path_weight for ins in instructions)):
        ir1, ir2, ir3 = irreps[0][ins.i_in1].ir, irreps[1][ins.i_in2].ir, irreps[2][ins.i_out].ir
        alpha = {"component": ir3.dim, "norm": ir1.dim * ir2.dim, "none": 1}[irrep_normalization]
        factor = n**exponent * sums[ins.i_out]
        if factor > 0.0:
            alpha /= factor
        weights.append(math.sqrt(alpha * raw))
    return weights


def make_problem(
    irreps_in1,
    irreps_in2,
    irreps_out,
    instructions: Sequence,
    *,
    irrep_normalization: str = "component",
    path_normalization: str = "element",
) -> Problem:
    """Validate an e3nn-style specification and return the hashable :class:`Problem`.

    Every error is a ``ValueError`` or ``TypeError`` naming the offending argument.
    """
    if irrep_normalization not in IRREP_NORMALIZATIONS:
        raise ValueError(
            f"irrep_normalization must be one of {IRREP_NORMALIZATIONS}, got {irrep_normalization!r}"
        )
    if path_normalization not in PATH_NORMALIZATIONS:
        raise ValueError(
            f"path_normalization must be one of {PATH_NORMALIZATIONS}, got {path_normalization!r}"
        )
    irreps = (
        parse_irreps(irreps_in1, "irreps_in1"),
        parse_irreps(irreps_in2, "irreps_in2"),
        parse_irreps(irreps_out, "irreps_out"),
    )
    if isinstance(instructions, (str, bytes)) or not isinstance(instructions, Sequence):
        raise TypeError(f"instructions: expected a list of tuples, got {instructions!r}")
    parsed = [_check_instruction_tuple(n, raw, irreps) for n, raw in enumerate(instructions)]
    for n, item in enumerate(parsed):
        _check_path(n, item, irreps)
        if item[5] < 0.0:
            raise ValueError(f"instructions[{n}]: path_weight must be >= 0, got {item[5]!r}")

    raw = []
    offset = 0
    for i_in1, i_in2, i_out, mode, has_weight, path_weight in parsed:
        ins = Instruction(
            i_in1, i_in2, i_out, mode, has_weight, path_weight,
            irreps[0][i_in1].mul, irreps[1][i_in2].mul, irreps[2][i_out].mul, offset,
        )
        offset += ins.weight_numel
        raw.append(ins)
    normalized = _normalized_path_weights(raw, irreps, irrep_normalization, path_normalization)
    instructions = tuple(
        dataclasses.replace(ins, path_weight=pw) for ins, pw in zip(raw, normalized)
    )
    return Problem(*irreps, instructions, irrep_normalization, path_normalization)
