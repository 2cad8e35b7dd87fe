"""jax_cgtp: fast Clebsch-Gordan tensor products for O(3)-equivariant networks in JAX.

>>> import jax.numpy as jnp, jax_cgtp
>>> tp = jax_cgtp.channelwise_tensor_product("8x0e+8x1o", "0e+1o", filter_ir_out="0e+1o")
>>> z = tp(jnp.ones((5, 32)), jnp.ones((5, 4)), jnp.ones(tp.weight_numel))
>>> z.shape
(5, 64)
"""

from . import e3nn, lowerings  # noqa: F401 (lowerings: every primitive's lowering, registered on import)
from .core import settings
from .conv import TensorProductConv, check_graph
from .e3nn_switch import replacing_e3nn
from .core.graph import SortedGraph, sort_graph
from .core.problem import Instruction, Problem, make_problem
from .core.settings import Settings, config
from .tensor_product import (
    TensorProduct,
    channelwise_tensor_product,
    fully_connected_tensor_product,
)

__all__ = [
    "Instruction",
    "Problem",
    "Settings",
    "SortedGraph",
    "TensorProduct",
    "TensorProductConv",
    "channelwise_tensor_product",
    "check_graph",
    "config",
    "e3nn",
    "fully_connected_tensor_product",
    "make_problem",
    "settings",
    "replacing_e3nn",
    "sort_graph",
]
__version__ = "0.1.0"
