"""Choice of the execution backend: ``"auto"``, ``"reference"`` or ``"cuda"``.

The choice is a primitive parameter; the lowering of each platform reads it. ``"auto"`` runs
the generated CUDA kernels when the computation is lowered for an NVIDIA GPU and the
pure-JAX reference otherwise, with one exception measured on the GPU: the derivatives of a
``uvw`` product with shared weights, outside convolutions and deterministic calls, are matrix
products that XLA runs faster, so they lower to the reference there
(:func:`jax_cgtp.gpu.cuda_lowering.runs_on_xla`). ``"reference"`` always runs the reference;
``"cuda"`` demands the kernels for every call and is an error anywhere else.
"""

from __future__ import annotations

import jax

BACKENDS = ("auto", "reference", "cuda")


def check_backend(backend: str) -> str:
    """Validate ``backend`` when a tensor product is built; ``"cuda"`` needs a visible GPU."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "cuda" and not _has_cuda_device():
        raise ValueError(
            "backend='cuda' needs an NVIDIA GPU visible to JAX, but jax.devices() is "
            f"{jax.devices()}; use backend='auto' to fall back to the reference path"
        )
    return backend


def _has_cuda_device() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices("gpu"))
    except RuntimeError:
        return False
