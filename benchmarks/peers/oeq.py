"""OpenEquivariance's JAX extension (the seed paper's code): ``openequivariance.jax``.

The ``TPProblem`` is jax_cgtp's instruction list with the same normalisation settings, per-edge
weights (``shared_weights=False``) and the row's dtype; ``build`` checks that its normalised path
weights equal jax_cgtp's. The product is ``TensorProduct(problem).forward(x, y, w)``, the
convolution ``TensorProductConv(problem, deterministic=False).forward(x, y, w, rows=dst,
cols=src)`` (atomic scatter; OpenEquivariance names receivers "rows" and senders "cols").

Layout: e3nn's ``mul_ir``, but its own weight order: weights are converted once with
``reorder_weights_from_e3nn`` and weight gradients back with ``reorder_weights_to_e3nn``,
outside the timed region (a model stores its weights in the library's order).

Installation (see ``benchmarks/gpu_session.sh``): the extension ``openequivariance_extjax`` is
built from its source archive and the ``openequivariance`` source is put on ``PYTHONPATH``;
``OEQ_NOTORCH=1`` keeps it from importing PyTorch, and is set here if unset.
"""

from __future__ import annotations

import math
import os
import pathlib

import numpy as np

from .. import problems
from . import Impl, Missing, Unsupported

NAME = "oeq"


def _import():
    os.environ.setdefault("OEQ_NOTORCH", "1")
    try:
        import openequivariance
        import openequivariance_extjax  # noqa: F401  (openequivariance swallows this import's error)
        import openequivariance.jax as oeq_jax
    except Exception as error:
        raise Missing(f"{type(error).__name__}: {error}") from None
    return openequivariance, oeq_jax


def version() -> str:
    oeq, _ = _import()
    import jax

    if jax.default_backend() != "gpu":
        raise Missing("OpenEquivariance's JAX extension needs a CUDA GPU")
    found = getattr(oeq, "__version__", None)
    if not found:  # run from a source tree: read the archive's PKG-INFO
        info = pathlib.Path(oeq.__file__).resolve().parent.parent / "PKG-INFO"
        if info.exists():
            found = next((line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                          if line.startswith("Version:")), None)
    try:
        from importlib.metadata import version as dist_version

        ext = dist_version("openequivariance_extjax")
    except Exception:
        ext = "?"
    return f"openequivariance {found or '?'}, extjax {ext}"


def tp_problem(problem, dtype):
    """OpenEquivariance's ``TPProblem`` for jax_cgtp's ``problem`` (per-edge weights)."""
    oeq, _ = _import()
    np_dtype = np.dtype(dtype).type
    spec = oeq.TPProblem(
        str(problem.irreps_in1), str(problem.irreps_in2), str(problem.irreps_out),
        problems.instruction_tuples(problem),
        irrep_normalization=problem.irrep_normalization,
        path_normalization=problem.path_normalization,
        shared_weights=False, internal_weights=False,
        irrep_dtype=np_dtype, weight_dtype=np_dtype,
    )
    for ours, theirs in zip(problem.instructions, spec.instructions):
        if not math.isclose(ours.path_weight, theirs.path_weight, rel_tol=1e-12, abs_tol=1e-300):
            raise Unsupported(
                f"OpenEquivariance normalises path {ours} to {theirs.path_weight}, jax_cgtp to {ours.path_weight}"
            )
    if spec.weight_numel != problem.weight_numel:
        raise Unsupported(f"weight count {spec.weight_numel} != {problem.weight_numel}")
    return spec


def build(tp, dtype, conv: bool, options: dict) -> Impl:
    _, oeq_jax = _import()
    spec = tp_problem(tp.problem, dtype)
    op = oeq_jax.TensorProductConv(spec, deterministic=False) if conv else oeq_jax.TensorProduct(spec)

    def to_library(kind, array):
        return op.reorder_weights_from_e3nn(array, has_batch_dim=True) if kind == "w" else array

    def from_library(kind, array):
        return op.reorder_weights_to_e3nn(array, has_batch_dim=True) if kind == "w" else array

    if conv:
        def apply(x, y, w, src, dst):
            return op.forward(x, y, w, dst, src)

        return Impl(apply=apply, to_library=to_library, from_library=from_library,
                    note="atomic scatter, own weight order")
    return Impl(apply=op.forward, to_library=to_library, from_library=from_library,
                note="own weight order")
