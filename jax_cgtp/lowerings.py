"""Every primitive's lowering, wired in one place.

The primitives (:mod:`jax_cgtp.core`) say what they compute and lower to their pure-JAX reference;
the GPU package (:mod:`jax_cgtp.gpu`) lowers the same primitives to generated kernels on
``platform="cuda"``; the sharding rules (:mod:`jax_cgtp.sharding.partitioning`) split a ``cgtp``
call across the devices its operands lie on, whichever lowering runs on each. Importing
:mod:`jax_cgtp` registers:

* ``cgtp``: the reference everywhere, the kernels on an NVIDIA GPU, both under the sharding rule;
* ``cgtp_group``: the stable argsort everywhere, the counting sort on an NVIDIA GPU.
"""

from __future__ import annotations

from jax._src import dispatch  # prim_requires_devices_during_lowering: no public equivalent
from jax.interpreters import mlir

from .core import grouping, primitives
from .gpu import cuda_lowering, grouping_kernels
from .sharding import partitioning

CGTP_REFERENCE = partitioning.lowering_rule(primitives.reference_lowering)
CGTP_KERNELS = partitioning.lowering_rule(cuda_lowering.outputs(primitives.reference_lowering))

mlir.register_lowering(primitives.cgtp_p, CGTP_REFERENCE)
mlir.register_lowering(primitives.cgtp_p, CGTP_KERNELS, platform="cuda")
mlir.register_lowering(grouping.group_p, grouping.reference_lowering)
mlir.register_lowering(grouping.group_p, grouping_kernels.lowering, platform="cuda")
if partitioning.enabled():  # the sharding rule reads the devices while lowering
    dispatch.prim_requires_devices_during_lowering.add(primitives.cgtp_p)
