"""cuequivariance-jax: ``cuex.segmented_polynomial(..., method="uniform_1d")``.

The segmented polynomial is :func:`jax_cgtp.cueq.polynomial` of jax_cgtp's problem: one segment
per irrep block in cuEquivariance's ``ir_mul`` layout, e3nn's weight order, and jax_cgtp's
normalised CG blocks as coefficients. For the channelwise (``uvu``) configs this is the
polynomial of ``cue.descriptors.channelwise_tensor_product`` with e3nn's output blocks;
``uniform_1d`` runs it with its one uniform mode ``u``. It cannot run a ``uvw`` problem (three
modes): such rows say "unsupported".

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

from . import Impl, Missing, Unsupported

NAME = "cueq"


def version() -> str:
    try:
        import cuequivariance
        import cuequivariance_jax
    except Exception as error:  # ImportError, or an error inside the package's own imports
        raise Missing(f"{type(error).__name__}: {error}") from None
    return f"cuequivariance {cuequivariance.__version__}, cuequivariance-jax {cuequivariance_jax.__version__}"


def _method(options) -> tuple[str, str]:
    method = options.get("cueq_method", "uniform_1d")
    if method == "uniform_1d" and jax.default_backend() != "gpu":
        return "naive", "method=naive (uniform_1d needs a GPU)"
    return method, f"method={method}"


def build(tp, dtype, conv: bool, options: dict) -> Impl:
    import cuequivariance_jax as cuex

    from jax_cgtp import cueq

    problem = tp.problem
    try:
        poly = cueq.polynomial(problem)
    except ValueError as error:
        raise Unsupported(str(error)) from None
    method, note = _method(options)
    irreps = {"x": problem.irreps_in1, "y": problem.irreps_in2, "z": problem.irreps_out}
    d3 = problem.irreps_out.dim

    def to_library(kind, array):
        return array if kind == "w" else cueq.mul_ir_to_ir_mul(irreps[kind], array)

    def from_library(kind, array):
        return array if kind == "w" else cueq.ir_mul_to_mul_ir(irreps[kind], array)

    def product(x, y, w):
        out = jax.ShapeDtypeStruct((x.shape[0], d3), x.dtype)
        return cuex.segmented_polynomial(poly, [x, y, w], [out], method=method)[0]

    def convolution(x, y, w, src, dst):
        out = jax.ShapeDtypeStruct((x.shape[0], d3), x.dtype)
        return cuex.segmented_polynomial(poly, [x, y, w], [out], [src, None, None, dst], method=method)[0]

    obstacle = cueq.uniform_1d_obstacle(poly) if method == "uniform_1d" else None
    if obstacle:
        raise Unsupported(obstacle)
    return Impl(apply=convolution if conv else product, to_library=to_library,
                from_library=from_library, note=note + ", ir_mul layout")
