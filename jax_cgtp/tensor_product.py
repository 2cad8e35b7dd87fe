"""The user-facing tensor product: e3nn-style construction, arrays in, arrays out."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from .core import mesh_axes, primitives
from .backend import check_backend
from .core.call import forward_call
from .core.operands import BATCHED, SHARED
from .core.problem import Problem, make_problem, parse_irreps


def as_array(name: str, value):
    """``value`` as an array: arrays (JAX's, NumPy's, tracers) as they are, anything else (nested
    lists, scalars) through ``np.asarray``; ``TypeError`` naming ``name`` where that fails."""
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return value
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name}: expected an array or nested lists of numbers, got {type(value).__name__} ({error})") from None
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name}: expected an array or nested lists of numbers, got {type(value).__name__} "
                        f"that is not a regular array of numbers (dtype {array.dtype})")
    return array


def no_weights_or_array(problem: Problem, w, like):
    """``w`` as an array (:func:`as_array`); ``None`` only where ``problem`` has no weights, as an empty
    array of ``like``'s dtype."""
    if w is not None:
        return as_array("w", w)
    if problem.weight_numel:
        raise ValueError(f"w: this tensor product needs {problem.weight_numel} weights, got None")
    return jnp.zeros((0,), jnp.result_type(like))


def check_float_operands(**arrays) -> jnp.dtype:
    """The common floating dtype of the named arrays; ``TypeError`` naming the culprit otherwise."""
    dtypes = {}
    for name, array in arrays.items():
        dtype = jnp.result_type(as_array(name, array))
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"{name}: expected a floating-point array, got dtype {dtype}")
        dtypes[name] = dtype
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{name}: {dtype}" for name, dtype in dtypes.items())
        raise TypeError(f"operands must share one floating dtype, got {listed}")
    return next(iter(dtypes.values()))


def check_static_shapes(**arrays) -> None:
    """``NotImplementedError`` naming the first array whose shape has a symbolic dimension (shape
    polymorphism in ``jax.export``): kernels are planned and launched for concrete sizes."""
    for name, array in arrays.items():
        shape = jnp.shape(array)
        if not all(isinstance(d, (int, np.integer)) for d in shape):
            raise NotImplementedError(
                f"{name}: shape {shape} has a symbolic dimension; jax_cgtp plans its kernels for concrete "
                "sizes, so export with concrete shapes (pad the edges and nodes to fixed counts)")


def check_trailing_dim(name: str, array, dim: int, what: str) -> None:
    """``ValueError`` unless ``array`` has at least one axis and its last axis is ``dim`` long."""
    shape = jnp.shape(array)
    if len(shape) == 0 or shape[-1] != dim:
        raise ValueError(f"{name}: expected shape (..., {dim}) for {what}, got shape {shape}")


class TensorProduct:
    r"""A Clebsch-Gordan tensor product ``z = T(x, y, w)``, e3nn-style.

    ``z[..., k-block of out] = sum over instructions of pw * C[i,j,k] x[u,i] y[v,j] W[uvw]``
    with e3nn's ``mul_ir`` layout for ``x`` (``irreps_in1``), ``y`` (``irreps_in2``) and ``z``
    (``irreps_out``), and ``w`` the concatenation over weighted instructions of their weight
    blocks flattened in C order of ``path_shape``; results equal
    ``e3nn_jax.legacy.FunctionalTensorProduct(...).left_right(w, x, y)``.

    Args:
        irreps_in1, irreps_in2, irreps_out: irreps of ``x``, ``y`` and ``z``.
        instructions: e3nn tuples ``(i_in1, i_in2, i_out, mode, has_weight[, path_weight])``
            with ``mode`` in ``uvw``, ``uvu``, ``uvv``, ``uuw``, ``uuu``.
        irrep_normalization: ``"component"``, ``"norm"`` or ``"none"``.
        path_normalization: ``"element"`` or ``"path"``.
        backend: ``"auto"``, ``"reference"`` or ``"cuda"`` (see :mod:`jax_cgtp.backend`).

    >>> import jax.numpy as jnp
    >>> tp = TensorProduct("4x0e+4x1o", "0e+1o", "4x1o", [(0, 1, 0, "uvu", True), (1, 0, 0, "uvu", True)])
    >>> tp.weight_numel
    8
    >>> tp(jnp.ones((10, 16)), jnp.ones((10, 4)), jnp.ones(8)).shape
    (10, 12)
    """

    def __init__(
        self,
        irreps_in1,
        irreps_in2,
        irreps_out,
        instructions,
        *,
        irrep_normalization: str = "component",
        path_normalization: str = "element",
        backend: str = "auto",
    ):
        self.problem: Problem = make_problem(
            irreps_in1,
            irreps_in2,
            irreps_out,
            instructions,
            irrep_normalization=irrep_normalization,
            path_normalization=path_normalization,
        )
        self.backend = check_backend(backend)

    irreps_in1 = property(lambda self: self.problem.irreps_in1)
    irreps_in2 = property(lambda self: self.problem.irreps_in2)
    irreps_out = property(lambda self: self.problem.irreps_out)
    instructions = property(lambda self: self.problem.instructions)
    weight_numel = property(lambda self: self.problem.weight_numel)

    def __repr__(self) -> str:
        return f"TensorProduct({self.problem}, backend={self.backend!r})"

    def __call__(self, x, y, w=None):
        """``T(x, y, w)`` for ``x (..., dim1)``, ``y (..., dim2)`` and ``w`` either shared
        ``(weight_numel,)`` or per sample ``(..., weight_numel)``; leading shapes broadcast."""
        problem = self.problem
        x, y, w = as_array("x", x), as_array("y", y), no_weights_or_array(problem, w, x)
        dtype = check_float_operands(x=x, y=y, w=w)
        check_static_shapes(x=x, y=y, w=w)
        check_trailing_dim("x", x, problem.irreps_in1.dim, f"irreps_in1 {problem.irreps_in1}")
        check_trailing_dim("y", y, problem.irreps_in2.dim, f"irreps_in2 {problem.irreps_in2}")
        check_trailing_dim("w", w, problem.weight_numel, "the weights")
        x, y, w = (jnp.asarray(a, dtype) for a in (x, y, w))

        shared = w.ndim == 1
        leading = [x.shape[:-1], y.shape[:-1]] + ([] if shared else [w.shape[:-1]])
        try:
            batch = np.broadcast_shapes(*leading)
        except ValueError:
            shapes = ", ".join(str(a.shape) for a in (x, y, w))
            raise ValueError(f"x, y, w: leading shapes do not broadcast: {shapes}") from None
        if mesh_axes.explicit_axes([x, y, w]):
            return self._on_explicit_rows(x, y, w, batch)
        rows = int(np.prod(batch, dtype=np.int64))

        def flat(array):
            return jnp.broadcast_to(array, batch + array.shape[-1:]).reshape(rows, array.shape[-1])

        call = forward_call(problem, (BATCHED, BATCHED, SHARED if shared else BATCHED, BATCHED))
        (z,) = primitives.bind(call, [flat(x), flat(y), w if shared else flat(w)], backend=self.backend)
        return z.reshape(batch + (problem.irreps_out.dim,))

    def _on_explicit_rows(self, x, y, w, batch):
        """``T(x, y, w)`` where an operand is sharded over explicit mesh axes: the batch sharded as
        the first operand sharded there is, shared weights replicated, and each device the product
        of its own rows (``jax.shard_map`` over those axes)."""
        shared = w.ndim == 1
        operands = [jnp.broadcast_to(a, batch + a.shape[-1:]) for a in ((x, y) if shared else (x, y, w))]
        rows = PartitionSpec(*mesh_axes.leading_spec(operands, len(batch)), None)
        specs = [rows] * len(operands) + ([PartitionSpec()] if shared else [])
        return mesh_axes.split_over_axes(self.__call__, operands + ([w] if shared else []), specs, rows)


def _parse_filter(filter_ir_out):
    if filter_ir_out is None:
        return None
    if isinstance(filter_ir_out, str):
        return [mul_ir.ir for mul_ir in parse_irreps(filter_ir_out, "filter_ir_out")]
    try:
        return [parse_irreps(ir, "filter_ir_out")[0].ir for ir in filter_ir_out]
    except (TypeError, IndexError):
        raise ValueError(
            f"filter_ir_out: expected irreps such as '0e+1o' or a list of irreps, got {filter_ir_out!r}"
        ) from None


def channelwise_tensor_product(irreps_in1, irreps_in2, filter_ir_out=None, **options) -> TensorProduct:
    """The MACE/NequIP convolution product: mode ``uvu``, one output block per path.

    For each pair of blocks ``mul1 x ir1`` (x) and ``mul2 x ir2`` (y) and each ``ir`` in
    ``ir1 x ir2`` kept by ``filter_ir_out``, an output block ``mul1 x ir`` with weights of
    shape ``(mul1, mul2)``; output blocks are then sorted by irrep (stable), as MACE does.
    ``options`` go to :class:`TensorProduct`.

    >>> channelwise_tensor_product("8x0e+8x1o", "0e+1o", filter_ir_out="0e+1o").irreps_out
    8x0e+8x0e+8x1o+8x1o
    """
    irreps_in1 = parse_irreps(irreps_in1, "irreps_in1")
    irreps_in2 = parse_irreps(irreps_in2, "irreps_in2")
    keep = _parse_filter(filter_ir_out)
    blocks, paths = [], []
    for i1, (mul1, ir1) in enumerate(irreps_in1):
        for i2, (_, ir2) in enumerate(irreps_in2):
            for ir in ir1 * ir2:
                if keep is None or ir in keep:
                    paths.append((i1, i2, len(blocks)))
                    blocks.append((mul1, ir))
    irreps_out, permutation, _ = parse_irreps(blocks, "irreps_out").sort()
    instructions = [(i1, i2, permutation[i_out], "uvu", True) for i1, i2, i_out in paths]
    return TensorProduct(irreps_in1, irreps_in2, irreps_out, instructions, **options)


def fully_connected_tensor_product(irreps_in1, irreps_in2, irreps_out, **options) -> TensorProduct:
    """Mode ``uvw`` for every block triple with ``ir_out`` in ``ir1 x ir2``: weights ``(mul1, mul2, mul_out)``.

    >>> fully_connected_tensor_product("2x0e+2x1o", "0e+1o", "3x1o").weight_numel
    12
    """
    irreps_in1 = parse_irreps(irreps_in1, "irreps_in1")
    irreps_in2 = parse_irreps(irreps_in2, "irreps_in2")
    irreps_out = parse_irreps(irreps_out, "irreps_out")
    instructions = [
        (i1, i2, i_out, "uvw", True)
        for i1, (_, ir1) in enumerate(irreps_in1)
        for i2, (_, ir2) in enumerate(irreps_in2)
        for i_out, (_, ir_out) in enumerate(irreps_out)
        if ir_out in ir1 * ir2
    ]
    return TensorProduct(irreps_in1, irreps_in2, irreps_out, instructions, **options)
