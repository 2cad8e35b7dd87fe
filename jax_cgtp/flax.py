"""Flax (linen) modules on jax_cgtp: a fully connected tensor product and the NequIP/MACE
interaction convolution.

Parameters are plain nested dicts of arrays (jit, grad, optax and orbax take them as they
are). ``backend`` is passed through to jax_cgtp (``"auto"``, ``"reference"``, ``"cuda"``);
``backend="e3nn"`` runs the same module, with the same parameters, on e3nn-jax's own ops
(``e3nn_jax.legacy.FunctionalTensorProduct`` and a gather/segment-sum), for comparisons;
``backend="cueq"`` runs :class:`TensorProductConv` on cuequivariance-jax
(:func:`jax_cgtp.cueq.convolution`).

>>> import jax, jax.numpy as jnp, e3nn_jax as e3nn
>>> tp = FullyConnectedTensorProduct("4x0e+2x1o")
>>> x, y = e3nn.normal("3x0e+1o", jax.random.PRNGKey(0), (5,)), e3nn.normal("0e+1o", jax.random.PRNGKey(1), (5,))
>>> params = tp.init(jax.random.PRNGKey(2), x, y)
>>> tp.apply(params, x, y).irreps, tp.apply(params, x, y).shape
(4x0e+2x1o, (5, 10))
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import e3nn_jax as e3nn
import flax.linen as nn
import jax
import jax.numpy as jnp
from e3nn_jax import legacy

from . import cueq
from . import e3nn as dropin
from .backend import BACKENDS
from .conv import TensorProductConv as _Conv
from .core.graph import SortedGraph, graph_endpoints, valid_edges
from .tensor_product import channelwise_tensor_product

MODULE_BACKENDS = BACKENDS + ("e3nn", "cueq")


def _check_backend(backend: str) -> str:
    if backend not in MODULE_BACKENDS:
        raise ValueError(f"backend must be one of {MODULE_BACKENDS}, got {backend!r}")
    return backend


def _irreps_array(name: str, value, irreps) -> e3nn.IrrepsArray:
    """``value`` as an IrrepsArray of ``irreps`` (a plain array needs ``irreps``)."""
    if isinstance(value, e3nn.IrrepsArray):
        if irreps is not None:
            if value.irreps.simplify() != e3nn.Irreps(irreps).simplify():
                raise ValueError(f"{name}: expected irreps {irreps}, got an IrrepsArray of {value.irreps}")
            value = value.rechunk(irreps)
        return value
    if irreps is None:
        raise TypeError(f"{name}: expected an e3nn_jax.IrrepsArray (or set the module's irreps for plain arrays), got {type(value).__name__}")
    irreps = e3nn.Irreps(irreps)
    if jnp.ndim(value) == 0 or jnp.shape(value)[-1] != irreps.dim:
        raise ValueError(f"{name}: expected shape (..., {irreps.dim}) for irreps {irreps}, got {jnp.shape(value)}")
    return e3nn.IrrepsArray(irreps, value)


def _vmapped(f, batch_dims: int):
    for _ in range(batch_dims):
        f = jax.vmap(f)
    return f


class FullyConnectedTensorProduct(nn.Module):
    r"""``z = sum over (ir1, ir2, ir_out) of pw * C (x1 (x) x2) W``, mode ``uvw``, internal weights.

    Like ``e3nn_jax.haiku.FullyConnectedTensorProduct``: zero chunks of the inputs are dropped
    and equal neighbouring irreps merged; one parameter per path, named
    ``"w[i1,i2,i_out] mul_ir1,mul_ir2,mul_ir_out"`` of shape ``(mul1, mul2, mul_out)``,
    initialised ``normal(weight_std)`` (``weight_std = 1`` with e3nn's default ``"path"``
    gradient normalization); the output is rechunked to ``irreps_out``. Inputs are
    IrrepsArrays ``(..., dim)`` whose leading axes broadcast, or plain arrays when
    ``irreps_in1``/``irreps_in2`` are set.

    >>> import jax, jax.numpy as jnp
    >>> tp = FullyConnectedTensorProduct("2x1o", irreps_in1="2x0e", irreps_in2="1o")
    >>> params = tp.init(jax.random.PRNGKey(0), jnp.ones((3, 2)), jnp.ones((3, 3)))
    >>> jax.tree_util.tree_map(jnp.shape, params)
    {'params': {'w[0,0,0] 2x0e,1x1o,2x1o': (2, 1, 2)}}
    """

    irreps_out: Any
    irreps_in1: Any = None
    irreps_in2: Any = None
    backend: str = "auto"
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x1, x2) -> e3nn.IrrepsArray:
        backend = _check_backend(self.backend)
        if backend == "cueq":
            raise ValueError(
                "backend='cueq' is for TensorProductConv only: cuEquivariance's uniform_1d kernels run "
                "one-mode (uvu) products and a fully connected product is uvw; use 'e3nn' or a jax_cgtp backend"
            )
        irreps_out = e3nn.Irreps(self.irreps_out)
        x1 = _irreps_array("x1", x1, self.irreps_in1).remove_zero_chunks().simplify()
        x2 = _irreps_array("x2", x2, self.irreps_in2).remove_zero_chunks().simplify()
        if backend == "e3nn":
            tp = legacy.FunctionalFullyConnectedTensorProduct(x1.irreps, x2.irreps, irreps_out.simplify())
        else:
            tp = dropin.FunctionalFullyConnectedTensorProduct(x1.irreps, x2.irreps, irreps_out.simplify(), backend=backend)
        weights = [
            self.param(
                f"w[{ins.i_in1},{ins.i_in2},{ins.i_out}] "
                f"{tp.irreps_in1[ins.i_in1]},{tp.irreps_in2[ins.i_in2]},{tp.irreps_out[ins.i_out]}",
                nn.initializers.normal(stddev=ins.weight_std),
                ins.path_shape,
                self.param_dtype,
            )
            for ins in tp.instructions
        ]
        if backend == "e3nn":
            leading = jnp.broadcast_shapes(x1.shape[:-1], x2.shape[:-1])
            x1, x2 = x1.broadcast_to(leading + (-1,)), x2.broadcast_to(leading + (-1,))
            output = _vmapped(lambda a, b: tp.left_right(weights, a, b), len(leading))(x1, x2)
        else:
            output = tp.left_right(weights, x1, x2)
        return output.rechunk(irreps_out)


class TensorProductConv(nn.Module):
    r"""The NequIP/MACE interaction: ``out[n] = 1/avg_num_neighbors * sum_{e: dst[e] = n}
    T(x[src[e]], sh[e], R(embedding[e]))``.

    ``T`` is :func:`jax_cgtp.channelwise_tensor_product` of the node irreps and the edge
    irreps (mode ``uvu``, output blocks ``mul_x x ir_out`` sorted by irrep, kept when
    ``ir_out`` is in ``filter_ir_out``), computed by the fused :class:`jax_cgtp.TensorProductConv`.
    ``R`` is the radial network: ``radial(num_weights)`` must return a module (or callable)
    mapping ``(E, num_basis) -> (E, num_weights)``; by default an
    ``e3nn_jax.flax.MultiLayerPerceptron`` with ``radial_hidden`` silu layers. Edges with
    ``src`` or ``dst`` outside ``[0, num_nodes)`` contribute nothing (padding).

    Call with node features ``x`` (IrrepsArray ``(N, ...)``), edge attributes ``sh``
    (IrrepsArray ``(E, ...)``, e.g. spherical harmonics), the radial embedding ``(E, B)``,
    int ``src``/``dst`` ``(E,)`` and optionally the static ``num_nodes`` (default ``N``); or,
    instead of ``src, dst, num_nodes``, ``graph=jax_cgtp.sort_graph(src, dst, num_nodes)``,
    built once per graph, so that a module does not order the edges every step (a deterministic one
    sorts them, an atomic one groups them by ``dst``: :meth:`jax_cgtp.TensorProductConv.__call__`).

    >>> import jax, jax.numpy as jnp, e3nn_jax as e3nn
    >>> conv = TensorProductConv(filter_ir_out="0e+1o", radial_hidden=(8,))
    >>> x = e3nn.normal("4x0e+2x1o", jax.random.PRNGKey(0), (3,))
    >>> sh = e3nn.spherical_harmonics("0e+1o", jax.random.normal(jax.random.PRNGKey(1), (4, 3)), True)
    >>> src, dst, emb = jnp.array([0, 1, 2, 0]), jnp.array([1, 2, 0, 3]), jnp.ones((4, 5))
    >>> params = conv.init(jax.random.PRNGKey(2), x, sh, emb, src, dst)
    >>> conv.apply(params, x, sh, emb, src, dst).irreps
    4x0e+2x0e+4x1o+2x1o
    """

    filter_ir_out: Any = None
    radial: Optional[Callable[[int], Callable]] = None
    radial_hidden: Sequence[int] = (64,)
    avg_num_neighbors: float = 1.0
    backend: str = "auto"
    deterministic: bool = False

    @nn.compact
    def __call__(self, x, sh, embedding, src=None, dst=None, num_nodes: Optional[int] = None, *,
                 graph: Optional[SortedGraph] = None) -> e3nn.IrrepsArray:
        backend = _check_backend(self.backend)
        if backend == "cueq" and self.deterministic:
            raise ValueError("deterministic=True: cuEquivariance's convolution scatters with atomics; use a jax_cgtp backend")
        src, dst, num_nodes = graph_endpoints(graph, src, dst, num_nodes)
        if src is None or dst is None:
            raise ValueError("src, dst: both are needed (or graph=)")
        x = _irreps_array("x", x, None)
        sh = _irreps_array("sh", sh, None)
        if x.ndim != 2 or sh.ndim != 2 or jnp.ndim(embedding) != 2 or jnp.shape(embedding)[0] != sh.shape[0]:
            raise ValueError(
                f"x, sh, embedding: expected shapes (N, dim), (E, dim), (E, num_basis), "
                f"got {x.shape}, {sh.shape}, {jnp.shape(embedding)}"
            )
        num_nodes = x.shape[0] if num_nodes is None else num_nodes
        tp = channelwise_tensor_product(
            x.irreps, sh.irreps, filter_ir_out=self.filter_ir_out,
            backend="reference" if backend in ("e3nn", "cueq") else backend,
        )
        radial = self.radial or (
            lambda n: e3nn.flax.MultiLayerPerceptron((*self.radial_hidden, n), act=jax.nn.silu, output_activation=False)
        )
        weights = radial(tp.weight_numel)(embedding)
        if jnp.shape(weights) != (sh.shape[0], tp.weight_numel):
            raise ValueError(
                f"radial: the network must map (E, num_basis) to (E, {tp.weight_numel}), got shape {jnp.shape(weights)}"
            )
        dtype = jnp.result_type(x.array, sh.array, weights)
        operands = (x.array.astype(dtype), sh.array.astype(dtype), weights.astype(dtype))
        if backend == "e3nn":
            out = _e3nn_conv(tp, *operands, src, dst, num_nodes)
        elif backend == "cueq":
            out = cueq.convolution(tp.problem, *operands, src, dst, num_nodes)
        else:
            conv = _Conv(
                tp.irreps_in1, tp.irreps_in2, tp.irreps_out,
                [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight) for i in tp.instructions],
                backend=backend, deterministic=self.deterministic,
            )
            out = conv(*operands, graph=graph) if graph is not None else conv(*operands, src, dst, num_nodes)
        return e3nn.IrrepsArray(tp.irreps_out, out / self.avg_num_neighbors)


def _e3nn_conv(tp, x, sh, weights, src, dst, num_nodes):
    """The same convolution the way an e3nn-jax model writes it: gather, vmapped legacy product, segment sum."""
    functional = legacy.FunctionalTensorProduct(
        tp.irreps_in1, tp.irreps_in2, tp.irreps_out,
        [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight) for i in tp.instructions],
    )
    x_edges = x.at[src].get(mode="fill", fill_value=0)
    messages = jax.vmap(
        lambda w, a, b: functional.left_right(w, e3nn.IrrepsArray(tp.irreps_in1, a), e3nn.IrrepsArray(tp.irreps_in2, b)).array
    )(weights, x_edges, sh)
    valid = valid_edges(src, dst, x.shape[0], num_nodes)
    return jax.ops.segment_sum(messages, jnp.where(valid, dst, num_nodes), num_segments=num_nodes)


__all__ = ["FullyConnectedTensorProduct", "TensorProductConv", "MODULE_BACKENDS"]
