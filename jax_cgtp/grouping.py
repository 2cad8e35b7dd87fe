"""Edges grouped by an index on the GPU, on every call: the ordering an atomic convolution walks
when it is given no sorted graph.

``group_edges(index, rows)`` returns ``(perm, offsets)`` laid out as
:func:`jax_cgtp.graph.sort_edges`'s (CSR ``offsets`` over ``rows`` nodes; edges below the range
first, edges above it last), except that within a node's run the edges come in no fixed order:
the atomic kernels sum them in no fixed order anyway. On a GPU it is a counting sort: ``offsets``
from the count of each bucket (a scatter-add) and a cumulative sum, ``perm`` from one launch of
``cgtp_group`` (``cuda/group_edges.cu``), in which each edge takes the next free place of its bucket
with an atomic add. Elsewhere, under ``vmap``, and for ``backend="reference"`` (whose lowering does
not read the ordering, so XLA drops it) it is ``sort_edges``'s stable argsort, one valid grouping.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax._src import dispatch  # apply_primitive: eager evaluation through the lowering
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import codegen, cuda_lowering, nvrtc
from .graph import edge_offsets, sort_edges

KERNEL = "cgtp_group"
BLOCK = 256
_SOURCE = "group_edges.cu"

group_p = Primitive("cgtp_group")
group_p.multiple_results = True
group_p.def_impl(functools.partial(dispatch.apply_primitive, group_p))


def group_edges(index, rows: int, *, backend: str = "auto") -> tuple[jax.Array, jax.Array]:
    """``(perm, offsets)`` of ``index`` (int32 or int64, shape ``(E,)``) over ``rows`` nodes: the
    edges grouped by node, in no fixed order within a node (see the module's docstring)."""
    return tuple(group_p.bind(jnp.asarray(index), rows=int(rows), backend=backend))


def _abstract_eval(index, *, rows, backend):
    del backend
    return [jax.core.ShapedArray(index.shape, index.dtype), jax.core.ShapedArray((rows + 1,), index.dtype)]


group_p.def_abstract_eval(_abstract_eval)


def _jvp(primals, tangents, *, rows, backend):
    del tangents
    outputs = group_p.bind(*primals, rows=rows, backend=backend)
    return outputs, [ad.Zero.from_primal_value(o) for o in outputs]


ad.primitive_jvps[group_p] = _jvp


def _batch(args, dims, *, rows, backend):
    del backend
    (index,), (axis,) = args, dims
    return jax.vmap(functools.partial(sort_edges, rows=rows), in_axes=axis)(index), (0, 0)


batching.primitive_batchers[group_p] = _batch


@functools.lru_cache(maxsize=None)
def kernel_source(index_ctype: str) -> str:
    """``cgtp_group``'s source for indices of C type ``index_ctype``."""
    return f"typedef {index_ctype} I;\n{codegen.cuda_source(_SOURCE)}"


@functools.lru_cache(maxsize=None)
def _image(index_ctype: str, arch: str):
    return cuda_lowering.image_of(nvrtc.compile_cubin(kernel_source(index_ctype), arch, "the edge grouping"))


def grid(edges: int) -> int:
    """Blocks of ``cgtp_group``'s launch: one thread per edge."""
    return -(-edges // BLOCK)


def place_edges(index, offsets, rows: int):
    """``perm``: each edge at the next free place of its bucket (``cgtp_group``)."""
    _, ctype = cuda_lowering.common_index_dtype([index])
    image, image_id = _image(ctype, cuda_lowering.device_arch())
    edges = index.shape[0]
    shapes = [jax.ShapeDtypeStruct((edges,), index.dtype), jax.ShapeDtypeStruct((rows + 2,), index.dtype)]
    perm, _ = cuda_lowering.ffi_launch(image, image_id, KERNEL, [index, offsets], shapes, grid=grid(edges),
                                       block=BLOCK, scalars=[edges, rows], zero_outputs=[0, 1])
    return perm


def _on_gpu(index, *, rows):
    offsets = edge_offsets(index, rows)
    return [place_edges(index, offsets, rows), offsets]


def _sorted(index, *, rows):
    return list(sort_edges(index, rows))


def lowering(ctx, index, *, rows, backend, on_gpu=False):
    """The counting sort where the kernels run (``on_gpu``, not ``backend="reference"``), else the
    stable argsort."""
    fun = _on_gpu if on_gpu and backend != "reference" else _sorted
    return mlir.lower_fun(functools.partial(fun, rows=rows), multiple_results=True)(ctx, index)


mlir.register_lowering(group_p, lowering)
mlir.register_lowering(group_p, functools.partial(lowering, on_gpu=True), platform="cuda")
