"""Drop-in replacements for e3nn-jax's tensor products, running on jax_cgtp.

Change the import and nothing else::

    from e3nn_jax.legacy import FunctionalTensorProduct      # before
    from jax_cgtp.e3nn import FunctionalTensorProduct        # after

    e3nn.tensor_product(x, y, filter_ir_out="0e+1o")         # before
    jax_cgtp.e3nn.tensor_product(x, y, filter_ir_out="0e+1o")  # after

Arguments, defaults (read from ``e3nn_jax.config`` at construction, as e3nn-jax does), weight
layout, output irreps and ``zero_flags`` are e3nn-jax's; the arithmetic is one
:class:`jax_cgtp.TensorProduct`. e3nn's connection modes ``uvuv``, ``uvu<v`` and ``u<vw`` have
no kernel of their own: the pairs ``(u, v)`` they visit are gathered into extra input blocks,
and then they are exactly ``uuu``/``uuw`` paths (same weight layout). Beyond e3nn-jax's
legacy class, ``left_right`` also takes leading batch axes (e3nn needs ``jax.vmap``) and
per-sample weights ``(..., weight_numel)``.

>>> import jax.numpy as jnp, e3nn_jax as e3nn
>>> x = e3nn.IrrepsArray("1o", jnp.array([1.0, 0.0, 0.0]))
>>> y = e3nn.IrrepsArray("1o", jnp.array([0.0, 1.0, 0.0]))
>>> z = tensor_product(x, y, filter_ir_out="1e")
>>> z.irreps, [round(float(v), 4) for v in z.array]
(1x1e, [0.0, 0.0, 0.7071])
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import Optional, Sequence

import e3nn_jax as e3nn
import jax.numpy as jnp
import numpy as np

from .core.problem import MODES
from .tensor_product import TensorProduct, check_trailing_dim

E3NN_MODES = MODES + ("uvuv", "uvu<v", "u<vw")
_NORMALIZATION_EXPONENT = {"element": 0.0, "path": 1.0}


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One path of a :class:`FunctionalTensorProduct`, with e3nn-jax's field names.

    ``path_weight`` is the normalised factor in front of the CG block; ``weight_std`` the
    standard deviation to initialise this path's weights with (``None`` without weights).
    """

    i_in1: int
    i_in2: int
    i_out: int
    connection_mode: str
    has_weight: bool
    path_weight: float
    weight_std: Optional[float]
    first_input_multiplicity: int
    second_input_multiplicity: int
    output_multiplicity: int

    @property
    def path_shape(self) -> tuple[int, ...]:
        m1, m2, mo = self.first_input_multiplicity, self.second_input_multiplicity, self.output_multiplicity
        pairs = m1 * (m2 - 1) // 2
        return {
            "uvw": (m1, m2, mo), "uvu": (m1, m2), "uvv": (m1, m2), "uuw": (m1, mo), "uuu": (m1,),
            "uvuv": (m1, m2), "uvu<v": (pairs,), "u<vw": (pairs, mo),
        }[self.connection_mode]

    @property
    def num_elements(self) -> int:
        """How many products of input components sum into one output component."""
        m1, m2 = self.first_input_multiplicity, self.second_input_multiplicity
        return {
            "uvw": m1 * m2, "uvu": m2, "uvv": m1, "uuw": m1, "uuu": 1,
            "uvuv": 1, "uvu<v": 1, "u<vw": m1 * (m2 - 1) // 2,
        }[self.connection_mode]


def _exponent(name: str, value) -> float:
    if isinstance(value, str):
        if value not in _NORMALIZATION_EXPONENT:
            raise ValueError(f"{name}: expected 'element', 'path' or a float, got {value!r}")
        return _NORMALIZATION_EXPONENT[value]
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name}: expected 'element', 'path' or a float, got {value!r}")
    return float(value)


def _variances(name: str, values, irreps) -> list[float]:
    if values is None:
        return [1.0] * len(irreps)
    try:
        values = [float(v) for v in values]
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a list of floats, one per entry of {irreps}, got {values!r}") from None
    if len(values) != len(irreps) or any(not (v >= 0.0) for v in values):
        raise ValueError(
            f"{name}: expected {len(irreps)} non-negative variances, one per entry of {irreps}, got {values}"
        )
    return values


def _check_instruction(n: int, raw, irreps) -> tuple:
    where = f"instructions[{n}]"
    if not isinstance(raw, (tuple, list)) or len(raw) not in (5, 6):
        raise ValueError(
            f"{where}: expected (i_in1, i_in2, i_out, connection_mode, has_weight[, path_weight]), got {raw!r}"
        )
    i1, i2, io, mode, has_weight = raw[:5]
    path_weight = float(raw[5]) if len(raw) == 6 else 1.0
    for value, name, ir in zip((i1, i2, io), ("irreps_in1", "irreps_in2", "irreps_out"), irreps):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < len(ir):
            raise ValueError(f"{where}: {value!r} is not an index into {name} {ir} ({len(ir)} entries)")
    if mode not in E3NN_MODES:
        raise ValueError(f"{where}: connection_mode must be one of {E3NN_MODES}, got {mode!r}")
    if not path_weight >= 0.0:
        raise ValueError(f"{where}: path_weight must be >= 0, got {path_weight!r}")
    (m1, r1), (m2, r2), (mo, ro) = irreps[0][i1], irreps[1][i2], irreps[2][io]
    if ro not in r1 * r2:
        raise ValueError(f"{where}: output irrep {ro} is not in {r1} x {r2}")
    needed_out = {"uvuv": m1 * m2, "uvu<v": m1 * (m2 - 1) // 2}.get(mode, mo)
    if mode in ("uvu<v", "u<vw") and m1 != m2:
        raise ValueError(f"{where}: mode {mode!r} needs equal input multiplicities, got {m1} and {m2}")
    if mo != needed_out:
        raise ValueError(f"{where}: mode {mode!r} needs an output multiplicity of {needed_out}, got {mo}")
    if mode == "u<vw" and not has_weight:
        raise ValueError(f"{where}: mode 'u<vw' needs has_weight=True")
    return int(i1), int(i2), int(io), mode, bool(has_weight), path_weight


def normalize_instructions(instructions, irreps, variances, irrep_normalization, path_exponent, gradient_exponent):
    """e3nn's path weights: ``alpha = irrep_factor * out_var * path_weight / (var^p * sum_path var^(1-p))``
    with ``var = in1_var * in2_var * num_elements`` summed over paths into the same output;
    weighted paths get ``path_weight = sqrt(alpha)^g`` and ``weight_std = sqrt(alpha)^(1-g)``."""
    in1_var, in2_var, out_var = variances
    paths = [
        Instruction(i1, i2, io, mode, has_weight, pw, None, irreps[0][i1].mul, irreps[1][i2].mul, irreps[2][io].mul)
        for i1, i2, io, mode, has_weight, pw in instructions
    ]
    var = [in1_var[p.i_in1] * in2_var[p.i_in2] * p.num_elements for p in paths]
    sums = collections.defaultdict(float)
    for p, v in zip(paths, var):
        sums[p.i_out] += v ** (1.0 - path_exponent)
    result = []
    for p, v in zip(paths, var):
        r1, r2, ro = irreps[0][p.i_in1].ir, irreps[1][p.i_in2].ir, irreps[2][p.i_out].ir
        alpha = {"component": ro.dim, "norm": r1.dim * r2.dim, "none": 1}[irrep_normalization]
        factor = v**path_exponent * sums[p.i_out]
        if factor > 0.0:
            alpha /= factor
        alpha *= out_var[p.i_out] * p.path_weight
        if p.has_weight:
            p = dataclasses.replace(
                p, path_weight=math.sqrt(alpha) ** gradient_exponent, weight_std=math.sqrt(alpha) ** (1.0 - gradient_exponent)
            )
        else:
            p = dataclasses.replace(p, path_weight=math.sqrt(alpha))
        result.append(p)
    return result


def _mul_pairs(ins: Instruction) -> list[tuple[int, int]]:
    """The ``(u, v)`` visited by a mode jax_cgtp runs on gathered blocks, in e3nn's order."""
    m1, m2 = ins.first_input_multiplicity, ins.second_input_multiplicity
    if ins.connection_mode == "uvuv":
        return [(u, v) for u in range(m1) for v in range(m2)]
    return [(u, v) for u in range(m1) for v in range(u + 1, m2)]  # uvu<v, u<vw: jnp.triu_indices(m, 1)


def _rows(irreps, index: int, muls: Sequence[int]) -> list[int]:
    """Feature indices of rows ``muls`` of block ``index`` (mul_ir layout), concatenated."""
    offset, (_, ir) = irreps[:index].dim, irreps[index]
    return [offset + u * ir.dim + i for u in muls for i in range(ir.dim)]


def _gather(array, index):
    """``array[..., index]`` for static ``index`` (None: the array itself): static slices of its
    runs of consecutive columns, concatenated (XLA fuses them; a gather it would not)."""
    if index is None:
        return array
    index = np.asarray(index)
    if index.size == array.shape[-1] and (index == np.arange(index.size)).all():
        return array
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    runs = np.split(index, breaks) if index.size else []
    pieces = [array[..., int(run[0]) : int(run[-1]) + 1] for run in runs]
    return jnp.concatenate(pieces, axis=-1) if pieces else array[..., :0]


def _block_columns(irreps, blocks, columns=None) -> np.ndarray:
    """The columns of ``blocks`` (indices into ``irreps``, in order) of an array laid out as
    ``irreps``; through ``columns`` (that array's columns in another), if given."""
    starts = np.cumsum([0] + [mul * ir.dim for mul, ir in irreps])
    own = np.concatenate([np.arange(starts[b], starts[b + 1]) for b in blocks] + [np.zeros(0, int)])
    return own if columns is None else np.asarray(columns)[own]


def _live_outputs(irreps_out: e3nn.Irreps, zero_flags, instructions):
    """The irreps of the output blocks that are not zero chunks, and ``instructions`` (tuples whose
    third entry indexes ``irreps_out``) renumbered into them: a product computes these blocks alone."""
    index = {k: n for n, k in enumerate(k for k, zero in enumerate(zero_flags) if not zero)}
    live = e3nn.Irreps([irreps_out[k] for k in index])
    return live, [(i1, i2, index[k], *rest) for i1, i2, k, *rest in instructions]


def _irreps_array(irreps: e3nn.Irreps, live_array, zero_flags) -> e3nn.IrrepsArray:
    """An :class:`e3nn_jax.IrrepsArray` of ``irreps`` from the array of its blocks that are not zero
    chunks (:func:`_live_outputs`): its chunks are pieces of one split of that array, so the
    cotangents of the chunks that later operations read join in one concatenation (chunks sliced
    one by one would each transpose to a padded copy of the whole array), and zero chunks are
    never computed or stored."""
    live = [mul_ir for mul_ir, zero in zip(irreps, zero_flags) if not zero]
    bounds = np.cumsum([mul_ir.dim for mul_ir in live])[:-1]
    pieces = iter(jnp.split(live_array, bounds, axis=-1) if len(live) > 1 else [live_array])
    leading = live_array.shape[:-1]
    chunks = [None if zero else next(pieces).reshape(leading + (mul, ir.dim))
              for zero, (mul, ir) in zip(zero_flags, irreps)]
    return e3nn.from_chunks(irreps, chunks, leading, live_array.dtype)


def _with_exact_path_weights(tp: TensorProduct, path_weights: Sequence[float]) -> TensorProduct:
    """``tp`` with its normalised path weights replaced by ``path_weights`` (no rounding)."""
    instructions = tuple(
        dataclasses.replace(ins, path_weight=float(pw)) for ins, pw in zip(tp.problem.instructions, path_weights)
    )
    tp.problem = dataclasses.replace(tp.problem, instructions=instructions)
    return tp


class FunctionalTensorProduct:
    r"""``e3nn_jax.legacy.FunctionalTensorProduct``, computed by :class:`jax_cgtp.TensorProduct`.

    ``left_right(w, x, y)[k-block] = sum over instructions into k of path_weight * C[i,j,k]
    x[u,i] y[v,j] W[...]`` with e3nn's modes, normalization (``irrep_normalization``,
    ``path_normalization``, ``gradient_normalization``, variances) and flat weight layout.
    ``backend`` (keyword only, not in e3nn) goes to :class:`jax_cgtp.TensorProduct`.

    >>> import jax.numpy as jnp, e3nn_jax as e3nn
    >>> tp = FunctionalTensorProduct("2x0e+1o", "1o", "2x1o", [(0, 0, 0, "uvu", True)])
    >>> [ins.path_shape for ins in tp.instructions]
    [(2, 1)]
    >>> x, y = e3nn.IrrepsArray("2x0e+1o", jnp.ones(5)), e3nn.IrrepsArray("1o", jnp.ones(3))
    >>> tp.left_right(jnp.ones(2), x, y).irreps
    2x1o
    """

    def __init__(
        self,
        irreps_in1,
        irreps_in2,
        irreps_out,
        instructions,
        in1_var=None,
        in2_var=None,
        out_var=None,
        irrep_normalization: str = None,
        path_normalization=None,
        gradient_normalization=None,
        *,
        backend: str = "auto",
    ):
        irreps = tuple(_irreps(v, name) for v, name in zip(
            (irreps_in1, irreps_in2, irreps_out), ("irreps_in1", "irreps_in2", "irreps_out")))
        self.irreps_in1, self.irreps_in2, self.irreps_out = irreps
        if isinstance(instructions, (str, bytes)) or not isinstance(instructions, Sequence):
            raise TypeError(f"instructions: expected a list of tuples, got {instructions!r}")
        parsed = [_check_instruction(n, raw, irreps) for n, raw in enumerate(instructions)]
        variances = (
            _variances("in1_var", in1_var, irreps[0]),
            _variances("in2_var", in2_var, irreps[1]),
            _variances("out_var", out_var, irreps[2]),
        )
        irrep_normalization = _irrep_normalization(irrep_normalization)
        if path_normalization is None:
            path_normalization = e3nn.config("path_normalization")
        if gradient_normalization is None:
            gradient_normalization = e3nn.config("gradient_normalization")
        self.instructions = normalize_instructions(
            parsed,
            irreps,
            variances,
            irrep_normalization,
            _exponent("path_normalization", path_normalization),
            _exponent("gradient_normalization", gradient_normalization),
        )
        self._build(backend)

    def _build(self, backend: str) -> None:
        """The jax_cgtp problem: e3nn's own modes map 1:1, the others read gathered blocks."""
        in1, in2 = list(self.irreps_in1), list(self.irreps_in2)
        gather1, gather2 = list(range(self.irreps_in1.dim)), list(range(self.irreps_in2.dim))
        instructions = []
        for ins in self.instructions:
            mode, i1, i2 = ins.connection_mode, ins.i_in1, ins.i_in2
            if mode not in MODES:
                pairs = _mul_pairs(ins)
                gather1 += _rows(self.irreps_in1, i1, [u for u, _ in pairs])
                gather2 += _rows(self.irreps_in2, i2, [v for _, v in pairs])
                i1, i2 = len(in1), len(in2)
                in1.append((len(pairs), self.irreps_in1[ins.i_in1].ir))
                in2.append((len(pairs), self.irreps_in2[ins.i_in2].ir))
                mode = "uuw" if mode == "u<vw" else "uuu"
            instructions.append((i1, i2, ins.i_out, mode, ins.has_weight))
        extended = len(in1) > len(self.irreps_in1)
        self._gather1 = np.asarray(gather1, np.int32) if extended else None
        self._gather2 = np.asarray(gather2, np.int32) if extended else None
        self._operands = (in1, in2, instructions, backend)
        self._products = {}

    @property
    def weight_numel(self) -> int:
        return sum(math.prod(ins.path_shape) for ins in self.instructions if ins.has_weight)

    def _live(self, flags1, flags2) -> tuple[bool, ...]:
        """e3nn's: an instruction contributes unless it reads a zero chunk or a block is empty."""
        return tuple(
            not (flags1[ins.i_in1] or flags2[ins.i_in2])
            and bool(self.irreps_in1[ins.i_in1].dim and self.irreps_in2[ins.i_in2].dim and self.irreps_out[ins.i_out].dim)
            for ins in self.instructions
        )

    def _output_zeros(self, live: tuple[bool, ...]) -> tuple[bool, ...]:
        """e3nn's zero flags of the output: the blocks no ``live`` instruction writes."""
        written = {ins.i_out for ins, alive in zip(self.instructions, live) if alive}
        return tuple(k not in written for k in range(len(self.irreps_out)))

    def _product(self, live: tuple[bool, ...]):
        """``(TensorProduct, (blocks1, columns1), (blocks2, columns2), weight_columns)``: the product
        of the ``live`` instructions (as e3nn-jax skips a path that reads a zero chunk, so does the
        arithmetic), over the input blocks they read and the output blocks they write; the blocks of
        each input it reads, or the columns of its array where it reads gathered copies (e3nn's
        ``uvuv``, ``uvu<v``, ``u<vw``), and the columns of the flat weights it takes."""
        if live not in self._products:
            in1, in2, instructions, backend = self._operands
            keep = [n for n, alive in enumerate(live) if alive]
            irreps_out, kept = _live_outputs(self.irreps_out, self._output_zeros(live), [instructions[n] for n in keep])
            used1 = sorted({i1 for i1, *_ in kept})
            used2 = sorted({i2 for _, i2, *_ in kept})
            kept = [(used1.index(i1), used2.index(i2), *rest) for i1, i2, *rest in kept]
            tp = TensorProduct([in1[b] for b in used1], [in2[b] for b in used2], irreps_out, kept, backend=backend)
            tp = _with_exact_path_weights(tp, [self.instructions[n].path_weight for n in keep])
            operands = [(used, None if gather is None else _block_columns(e3nn.Irreps(blocks), used, gather))
                        for used, blocks, gather in ((used1, in1, self._gather1), (used2, in2, self._gather2))]
            sizes = [math.prod(ins.path_shape) if ins.has_weight else 0 for ins in self.instructions]
            weights = _block_columns([(size, e3nn.Irrep("0e")) for size in sizes], keep)
            self._products[live] = (tp, *operands, weights)
        return self._products[live]

    def _flat_weights(self, weights):
        """One weight array ``(..., weight_numel)``, or ``None`` when a list of none is given."""
        weighted = [ins for ins in self.instructions if ins.has_weight]
        if not isinstance(weights, (list, tuple)):
            return weights
        if len(weights) != len(weighted):
            raise ValueError(f"weights: expected a list of {len(weighted)} arrays, one per weighted instruction, got {len(weights)}")
        for n, (w, ins) in enumerate(zip(weights, weighted)):
            if jnp.shape(w) != ins.path_shape:
                raise ValueError(f"weights[{n}]: expected shape {ins.path_shape}, got {jnp.shape(w)}")
        if not weights:
            return None
        return jnp.concatenate([jnp.ravel(w) for w in weights])

    def left_right(self, weights, input1, input2=None, *, custom_einsum_jvp=None, fused=None, sparse=None):
        """``T(weights, input1, input2)`` as an :class:`e3nn_jax.IrrepsArray` of ``irreps_out``.

        ``weights`` is flat ``(weight_numel,)``, per sample ``(..., weight_numel)`` or a list
        of arrays of each weighted instruction's ``path_shape``; ``left_right(x, y)`` when no
        path has weights. Leading axes of the inputs broadcast. ``custom_einsum_jvp``,
        ``fused`` and ``sparse`` choose among e3nn-jax's einsum strategies and are ignored.
        """
        del custom_einsum_jvp, fused, sparse
        if input2 is None:
            weights, input1, input2 = [], weights, input1
        x = _operand("input1", input1, self.irreps_in1)
        y = _operand("input2", input2, self.irreps_in2)
        flags1, flags2 = x.zero_flags, y.zero_flags
        w = self._flat_weights(weights)
        dtype = _common_dtype(x.array, y.array, *([] if w is None else [w]))
        w = jnp.zeros((0,), dtype) if w is None else jnp.asarray(w, dtype)
        check_trailing_dim("w", w, self.weight_numel, "the weights")
        leading = _broadcast("input1, input2, weights", x.shape[:-1], y.shape[:-1], w.shape[:-1])
        if 0 in (self.irreps_in1.dim, self.irreps_in2.dim, self.irreps_out.dim):
            return e3nn.zeros(self.irreps_out, leading, dtype)
        live = self._live(flags1, flags2)
        zero_flags = self._output_zeros(live)
        if not any(live):
            return e3nn.zeros(self.irreps_out, leading, dtype)
        tp, (blocks1, columns1), (blocks2, columns2), weights = self._product(live)
        z = tp(_blocks_of(x, blocks1, columns1, dtype), _blocks_of(y, blocks2, columns2, dtype), _gather(w, weights))
        return _irreps_array(self.irreps_out, z, zero_flags)

    def right(self, weights, input2=None, *, custom_einsum_jvp=None):
        """The matrix ``M (..., irreps_in1.dim, irreps_out.dim)`` with ``left_right(w, x, y) = x @ M``."""
        del custom_einsum_jvp
        if input2 is None:
            weights, input2 = [], weights
        y = _operand("input2", input2, self.irreps_in2).array
        dim1 = self.irreps_in1.dim
        w = self._flat_weights(weights)
        basis = jnp.eye(dim1, dtype=_common_dtype(y, *([] if w is None else [w]))).reshape(
            (dim1,) + (1,) * (jnp.ndim(y) - 1) + (dim1,)
        )
        rows = self.left_right(weights, e3nn.IrrepsArray(self.irreps_in1, basis), input2).array
        return jnp.moveaxis(rows, 0, -2)

    def __repr__(self) -> str:
        paths = sum(math.prod(i.path_shape) for i in self.instructions)
        return (
            f"{type(self).__name__}({self.irreps_in1.simplify()} x {self.irreps_in2.simplify()} -> "
            f"{self.irreps_out.simplify()} | {paths} paths | {self.weight_numel} weights)"
        )


def FunctionalFullyConnectedTensorProduct(
    irreps_in1,
    irreps_in2,
    irreps_out,
    in1_var=None,
    in2_var=None,
    out_var=None,
    irrep_normalization: str = None,
    path_normalization=None,
    gradient_normalization=None,
    *,
    backend: str = "auto",
) -> FunctionalTensorProduct:
    """``e3nn_jax.legacy.FunctionalFullyConnectedTensorProduct``: mode ``uvw`` for every block
    triple with ``ir_out`` in ``ir1 x ir2``.

    >>> FunctionalFullyConnectedTensorProduct("2x0e+1o", "1o", "3x1o").weight_numel  # 2x0e x 1o -> 3x1o
    6
    """
    irreps_in1, irreps_in2, irreps_out = (
        _irreps(v, n) for v, n in ((irreps_in1, "irreps_in1"), (irreps_in2, "irreps_in2"), (irreps_out, "irreps_out"))
    )
    instructions = [
        (i1, i2, io, "uvw", True)
        for i1, (_, r1) in enumerate(irreps_in1)
        for i2, (_, r2) in enumerate(irreps_in2)
        for io, (_, ro) in enumerate(irreps_out)
        if ro in r1 * r2
    ]
    return FunctionalTensorProduct(
        irreps_in1, irreps_in2, irreps_out, instructions, in1_var, in2_var, out_var,
        irrep_normalization, path_normalization, gradient_normalization, backend=backend,
    )


def _irrep_normalization(value) -> str:
    """``value``, or e3nn-jax's configured default when it is ``None``."""
    if value is None:
        value = e3nn.config("irrep_normalization")
    if value not in ("component", "norm", "none"):
        raise ValueError(f"irrep_normalization: expected 'component', 'norm' or 'none', got {value!r}")
    return value


def _irreps(value, name: str) -> e3nn.Irreps:
    try:
        return e3nn.Irreps(value)
    except Exception as error:  # e3nn raises ValueError, TypeError or AssertionError
        raise ValueError(f"{name}: expected irreps such as '16x0e+8x1o', got {value!r} ({error})") from None


def _operand(name: str, value, irreps: e3nn.Irreps) -> e3nn.IrrepsArray:
    """An IrrepsArray (or a plain array laid out as ``irreps``) as an IrrepsArray chunked as ``irreps``."""
    if isinstance(value, e3nn.IrrepsArray):
        if value.irreps.simplify() != irreps.simplify():
            raise ValueError(f"{name}: expected irreps {irreps}, got an IrrepsArray of {value.irreps}")
        return value.rechunk(irreps)
    shape = jnp.shape(value)
    if len(shape) == 0 or shape[-1] != irreps.dim:
        raise ValueError(f"{name}: expected an IrrepsArray of {irreps} or an array (..., {irreps.dim}), got shape {shape}")
    return e3nn.IrrepsArray(irreps, value)


def _blocks_of(value: e3nn.IrrepsArray, blocks, columns, dtype):
    """The blocks ``blocks`` of ``value`` side by side, from its chunks (a chunk computed by the
    caller is read as it is: an indexed IrrepsArray gathers its live chunks alone); from its
    ``columns`` where a product reads gathered copies (None: the array as it is)."""
    if columns is not None:
        return _gather(jnp.asarray(value.array, dtype), columns)
    leading = value.array.shape[:-1]
    pieces = [jnp.asarray(value.chunks[b], dtype).reshape(leading + (-1,)) for b in blocks]
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=-1)


def _common_dtype(*arrays, integer_dtype=jnp.float32):
    """e3nn's dtype rule: promote all operands; integer inputs compute in ``integer_dtype``."""
    dtype = jnp.result_type(*arrays)
    if jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
        return jnp.dtype(integer_dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"inputs: expected real floating-point arrays, got dtype {dtype}")
    return dtype


def _broadcast(names: str, *shapes) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{names}: leading shapes {shapes} do not broadcast") from None


# ------------------------------------------------------------------------------------------
# e3nn_jax.tensor_product


def _filter(filter_ir_out):
    if filter_ir_out is None:
        return None
    if isinstance(filter_ir_out, (str, e3nn.Irrep)):
        filter_ir_out = [mul_ir.ir for mul_ir in e3nn.Irreps(filter_ir_out)]
    try:
        return tuple(e3nn.Irrep(ir) if not isinstance(ir, e3nn.MulIrrep) else ir.ir for ir in filter_ir_out)
    except Exception:
        raise ValueError(f"filter_ir_out: expected irreps such as '0e+1o' or a list of irreps, got {filter_ir_out!r}") from None


def _blocks(irreps: e3nn.Irreps, zero_flags, regroup: bool):
    """An operand's blocks ``(ir, rows, zero)``; ``rows`` are feature offsets of its copies of
    ``ir`` in the array as given. With ``regroup``, e3nn's ``sort().simplify()``: equal irreps
    merged in sorted order, empty blocks dropped; no data moves, only the offsets do."""
    offsets = [irreps[:i].dim for i in range(len(irreps))]
    blocks = [
        (ir, [offset + u * ir.dim for u in range(mul)], zero)
        for offset, (mul, ir), zero in zip(offsets, irreps, zero_flags)
    ]
    if not regroup:
        return blocks
    merged = []
    for i in irreps.sort().inv:
        ir, rows, zero = blocks[i]
        if not rows:
            continue
        if merged and merged[-1][0] == ir:
            merged[-1] = (ir, merged[-1][1] + rows, merged[-1][2] and zero)
        else:
            merged.append((ir, rows, zero))
    return merged


class _Operand:
    """A :func:`tensor_product` operand as the product reads it: those of the array's own blocks
    that a path reads (its irreps simplified: adjacent equal irreps are one block, the columns
    unchanged), then blocks of gathered copies of its rows where a path needs them."""

    def __init__(self, irreps: e3nn.Irreps):
        self.simple = irreps == irreps.simplify()  # its chunks are its own blocks
        self.own = list(irreps.simplify())
        self.starts = np.cumsum([0] + [mul_ir.dim for mul_ir in self.own])
        self.by_rows = {(ir, tuple(int(start) + u * ir.dim for u in range(mul))): n
                        for n, ((mul, ir), start) in enumerate(zip(self.own, self.starts))}
        self.used, self.copied = set(), []

    def block(self, ir, rows):
        """The key of the array's own block of exactly these rows of ``ir``, if there is one."""
        n = self.by_rows.get((ir, tuple(rows)))
        return None if n is None else ("own", n)

    def read(self, key):
        """``key`` (of :meth:`block`), marked as read by a path."""
        self.used.add(key[1])
        return key

    def copies(self, ir, rows):
        """The key of a new block of copies of ``rows`` (feature offsets of ``ir`` rows)."""
        self.copied.append((len(rows), ir, [r + i for r in rows for i in range(ir.dim)]))
        return "copy", len(self.copied) - 1

    def layout(self):
        """``(irreps, position of each key, (blocks, columns))``: the product's operand, and how to
        read it (:func:`_blocks_of`): the chunks ``blocks`` of an operand that needs no copies and is
        chunked as its own blocks; else its array's ``columns`` (None: the array as it is)."""
        own = sorted(self.used)
        irreps = [self.own[n] for n in own] + [(mul, ir) for mul, ir, _ in self.copied]
        position = {("own", n): k for k, n in enumerate(own)}
        position.update({("copy", k): len(own) + k for k in range(len(self.copied))})
        if self.simple and not self.copied:
            return irreps, position, (own, None)
        columns = [c for n in own for c in range(self.starts[n], self.starts[n + 1])]
        columns += [c for _, _, copied in self.copied for c in copied]
        return irreps, position, (None, np.asarray(columns, np.int32))


@functools.lru_cache(maxsize=256)
def _tensor_product_plan(irreps1, flags1, irreps2, flags2, filter_ir_out, irrep_normalization, regroup, backend):
    """``(TensorProduct or None, gather1, gather2, irreps_out, zero_flags)`` for :func:`tensor_product`.

    Every pair of blocks ``(mul1 x ir1, mul2 x ir2)`` gives one output block of ``mul1 * mul2`` rows
    (row ``u * mul2 + v`` from ``x[u]`` and ``y[v]``) for each kept ``ir_out``, by an unweighted path
    ``z[uv] = sqrt(dim factor) C x[u] y[v]``. Where one of the two blocks has one row and both lie in
    their arrays as they are (MACE's messages: node features times each harmonic), that is a ``uvu``
    (or ``uvv``) path on the arrays themselves; otherwise a ``uuu`` path on gathered copies of the
    rows. A pair with a zero chunk gives a zero block and no path. Output blocks are laid out in
    sorted order directly.
    """
    operands = _Operand(irreps1), _Operand(irreps2)
    out, zero, paths = [], [], []
    for ir1, rows1, zero1 in _blocks(irreps1, flags1, regroup):
        for ir2, rows2, zero2 in _blocks(irreps2, flags2, regroup):
            kept = [ir for ir in ir1 * ir2 if filter_ir_out is None or ir in filter_ir_out]
            if not kept:
                continue
            live = not (zero1 or zero2)
            own = operands[0].block(ir1, rows1), operands[1].block(ir2, rows2)
            if live and None not in own and 1 in (len(rows1), len(rows2)):
                i1, i2 = (operand.read(key) for operand, key in zip(operands, own))
                mode = "uvu" if len(rows2) == 1 else "uvv"
            elif live:
                i1 = operands[0].copies(ir1, [r for r in rows1 for _ in rows2])
                i2 = operands[1].copies(ir2, [r for _ in rows1 for r in rows2])
                mode = "uuu"
            for ir in kept:
                if live:
                    paths.append((i1, i2, len(out), mode, False))
                out.append((len(rows1) * len(rows2), ir))
                zero.append(not live)
    irreps_out, permutation, inverse = e3nn.Irreps(out).sort()
    zero = tuple(zero[i] for i in inverse)
    if not paths or not any(mul for mul, _ in irreps_out):
        return None, None, None, irreps_out, zero
    (in1, index1, read1), (in2, index2, read2) = (operand.layout() for operand in operands)
    live_out, paths = _live_outputs(irreps_out, zero, [(index1[k1], index2[k2], permutation[io], mode, w)
                                                       for k1, k2, io, mode, w in paths])
    tp = TensorProduct(in1, in2, live_out, paths, irrep_normalization=irrep_normalization, backend=backend)
    return tp, read1, read2, irreps_out, zero


def tensor_product(
    input1,
    input2,
    *,
    filter_ir_out=None,
    irrep_normalization: str = None,
    regroup_output: bool = True,
    backend: str = "auto",
):
    r"""``e3nn_jax.tensor_product``: every ``ir_out`` in ``ir1 x ir2`` for every pair of blocks.

    Output block ``(mul1 * mul2) x ir_out`` holds ``z[u*mul2 + v, k] = c C[i,j,k] x1[u,i] x2[v,j]``
    with ``c = sqrt(ir_out.dim)`` (``"component"``), ``sqrt(ir1.dim * ir2.dim)`` (``"norm"``) or
    1 (``"none"``). With ``regroup_output`` the inputs are regrouped first; the output is
    sorted, and simplified with ``regroup_output``. Given irreps (not arrays), returns the
    output irreps. ``backend`` (keyword only, not in e3nn) goes to jax_cgtp.

    >>> tensor_product("2x1e + 2e", "2e")
    1x0e+3x1e+3x2e+3x3e+1x4e
    """
    if isinstance(input1, (str, e3nn.Irreps)) or isinstance(input2, (str, e3nn.Irreps)):
        irreps1, irreps2 = _irreps(input1, "input1"), _irreps(input2, "input2")
        plan = _plan(irreps1, (False,) * len(irreps1), irreps2, (False,) * len(irreps2),
                     filter_ir_out, irrep_normalization, regroup_output, backend)
        return plan[3].simplify() if regroup_output else plan[3]
    input1, input2 = e3nn.as_irreps_array(input1), e3nn.as_irreps_array(input2)
    dtype = _common_dtype(input1.array, input2.array, integer_dtype=jnp.ones(()).dtype)
    leading = _broadcast("input1, input2", input1.shape[:-1], input2.shape[:-1])
    tp, gather1, gather2, irreps_out, zero = _plan(
        input1.irreps, input1.zero_flags, input2.irreps, input2.zero_flags,
        filter_ir_out, irrep_normalization, regroup_output, backend,
    )
    if tp is None:
        output = e3nn.zeros(irreps_out, leading, dtype)
    else:
        z = tp(_blocks_of(input1, *gather1, dtype), _blocks_of(input2, *gather2, dtype))
        output = _irreps_array(irreps_out, z, zero)
    return output.simplify() if regroup_output else output


def _plan(irreps1, flags1, irreps2, flags2, filter_ir_out, irrep_normalization, regroup, backend):
    irrep_normalization = _irrep_normalization(irrep_normalization)
    if not isinstance(regroup, bool):
        raise TypeError(f"regroup_output: expected a bool, got {regroup!r}")
    return _tensor_product_plan(
        e3nn.Irreps(irreps1), tuple(flags1), e3nn.Irreps(irreps2), tuple(flags2),
        _filter(filter_ir_out), irrep_normalization, regroup, backend,
    )


__all__ = [
    "FunctionalFullyConnectedTensorProduct",
    "FunctionalTensorProduct",
    "Instruction",
    "normalize_instructions",
    "tensor_product",
]
