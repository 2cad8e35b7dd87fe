"""jax_cgtp itself: the row's ``TensorProduct`` and the fused ``TensorProductConv`` of its problem.

Operands are already in e3nn's layout and weight order, so nothing is converted. The backend is
the one ``tp`` was built with (``"auto"``: generated CUDA kernels on a GPU, the reference path
elsewhere; the smoke run builds with ``"reference"``).
"""

from __future__ import annotations

import jax_cgtp

from .. import problems
from . import Impl

NAME = "jax_cgtp"


def version() -> str:
    return jax_cgtp.__version__


def build(tp, dtype, conv: bool, options: dict) -> Impl:
    if not conv:
        return Impl(apply=tp.__call__, note=f"backend={tp.backend}")
    op = problems.conv_of(tp, backend=tp.backend)

    def apply(x, y, w, src, dst):
        return op(x, y, w, src, dst, num_nodes=x.shape[0])

    return Impl(apply=apply, note=f"backend={tp.backend}, atomic scatter")
