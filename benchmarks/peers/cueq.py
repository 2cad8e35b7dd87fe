"""cuequivariance-jax: ``cuex.segmented_polynomial(..., method="uniform_1d")``.

The segmented polynomial is built from jax_cgtp's problem, path by path: one segment per irrep
block of ``x``, ``y`` and ``z`` (shape ``(ir.dim, mul)``, i.e. cuEquivariance's ``ir_mul``
layout), one weight segment per weighted instruction (its ``path_shape``, i.e. e3nn's weight
order), and one path per instruction whose coefficient is jax_cgtp's normalised CG block
``path_weight * C`` (:func:`jax_cgtp.problem.cg_block`). For the channelwise (``uvu``) configs
this is the polynomial of ``cue.descriptors.channelwise_tensor_product`` with e3nn's output
blocks; ``uniform_1d`` runs it with its one uniform mode ``u``. It cannot run a ``uvw`` problem
(three modes): such rows say "unsupported".

The convolution passes ``indices=[src, None, None, dst]`` (gather ``x`` by ``src``, scatter-sum
``z`` by ``dst``), as cuEquivariance's MACE/NequIP layers do.

Layout: ``uniform_1d`` needs ``ir_mul`` (one contiguous segment of ``mul`` channels per irrep
component). Users of cuEquivariance keep features in ``ir_mul`` throughout the model (its MACE
integration converts once at the input and output), so the conversion of ``x``, ``y``, ``g``
and back of the results happens outside the timed region.

Off a GPU (the CPU smoke run) the adapter uses ``method="naive"`` and says so in the row note.
"""

from __future__ import annotations

import jax

from jax_cgtp.problem import cg_block

from . import Impl, Missing, Unsupported
from .layout import ir_mul_to_mul_ir, mul_ir_to_ir_mul

NAME = "cueq"

# Subscripts per mode: weights, x, y, z, then the CG indices; without the weight operand for
# unweighted paths.
_WEIGHTED = {"uvw": "uvw,iu,jv,kw", "uvu": "uv,iu,jv,ku", "uvv": "uv,iu,jv,kv", "uuw": "uw,iu,ju,kw",
             "uuu": "u,iu,ju,ku"}
_UNWEIGHTED = {"uvu": "iu,jv,ku", "uvv": "iu,jv,kv", "uuw": "iu,ju,k", "uuu": "iu,ju,ku"}


def version() -> str:
    try:
        import cuequivariance
        import cuequivariance_jax
    except Exception as error:  # ImportError, or an error inside the package's own imports
        raise Missing(f"{type(error).__name__}: {error}") from None
    return f"cuequivariance {cuequivariance.__version__}, cuequivariance-jax {cuequivariance_jax.__version__}"


def _stp(problem, instructions, subscripts: str, weighted: bool):
    import cuequivariance as cue

    stp = cue.SegmentedTensorProduct.from_subscripts(subscripts + "+ijk")
    first = 1 if weighted else 0
    for operand, irreps in enumerate((problem.irreps_in1, problem.irreps_in2, problem.irreps_out), first):
        for mul_ir in irreps:
            stp.add_segment(operand, (mul_ir.ir.dim, mul_ir.mul))
    for ins in instructions:
        segments = (ins.i_in1, ins.i_in2, ins.i_out)
        if weighted:
            segments = (stp.add_segment(0, ins.path_shape),) + segments
        stp.add_path(*segments, c=cg_block(problem, ins))
    return stp


def polynomial(problem):
    """The ``cue.SegmentedPolynomial`` with inputs ``(x, y, w)`` and output ``z`` of ``problem``."""
    import cuequivariance as cue

    modes = {ins.mode for ins in problem.instructions}
    if len(modes) != 1:
        raise Unsupported(f"one polynomial per mode is needed, the problem mixes modes {sorted(modes)}")
    (mode,) = modes
    weighted = [ins for ins in problem.active_instructions if ins.has_weight]
    unweighted = [ins for ins in problem.active_instructions if not ins.has_weight]
    # Inactive weighted paths still own a weight segment so the weight layout stays e3nn's.
    zero_paths = [ins for ins in problem.instructions if ins.has_weight and not ins.is_active]
    if zero_paths or not weighted:
        raise Unsupported("problems with inactive weighted paths or without weights are not mapped")
    operations = [(cue.Operation((2, 0, 1, 3)), _stp(problem, weighted, _WEIGHTED[mode], True))]
    if unweighted:
        operations.append((cue.Operation((0, 1, 3)), _stp(problem, unweighted, _UNWEIGHTED[mode], False)))
    w_op, x_op, y_op, z_op = operations[0][1].operands
    return cue.SegmentedPolynomial([x_op, y_op, w_op], [z_op], operations)


def _method(options) -> tuple[str, str]:
    method = options.get("cueq_method", "uniform_1d")
    if method == "uniform_1d" and jax.default_backend() != "gpu":
        return "naive", "method=naive (uniform_1d needs a GPU)"
    return method, f"method={method}"


def build(tp, dtype, conv: bool, options: dict) -> Impl:
    import cuequivariance_jax as cuex

    problem = tp.problem
    poly = polynomial(problem)
    method, note = _method(options)
    irreps = {"x": problem.irreps_in1, "y": problem.irreps_in2, "z": problem.irreps_out}
    d3 = problem.irreps_out.dim

    def to_library(kind, array):
        return array if kind == "w" else mul_ir_to_ir_mul(irreps[kind], array)

    def from_library(kind, array):
        return array if kind == "w" else ir_mul_to_mul_ir(irreps[kind], array)

    def product(x, y, w):
        out = jax.ShapeDtypeStruct((x.shape[0], d3), x.dtype)
        return cuex.segmented_polynomial(poly, [x, y, w], [out], method=method)[0]

    def convolution(x, y, w, src, dst):
        out = jax.ShapeDtypeStruct((x.shape[0], d3), x.dtype)
        return cuex.segmented_polynomial(poly, [x, y, w], [out], [src, None, None, dst], method=method)[0]

    if method == "uniform_1d":
        _check_uniform_1d(poly)
    return Impl(apply=convolution if conv else product, to_library=to_library,
                from_library=from_library, note=note + ", ir_mul layout")


def _check_uniform_1d(poly) -> None:
    """``Unsupported`` unless every tensor product has exactly one mode after cuEquivariance's own
    canonicalisation (what ``uniform_1d`` requires)."""
    canonical = poly.flatten_coefficient_modes().squeeze_modes().canonicalize_subscripts()
    for _, stp in canonical.operations:
        modes = stp.subscripts.modes()
        if len(modes) > 1:
            raise Unsupported(f"uniform_1d needs one uniform mode, this problem has {len(modes)} ({stp.subscripts})")
