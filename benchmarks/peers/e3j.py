"""InstaDeep's e3j: ``e3j.core.TensorProduct`` + ``e3j.core.ScalarMixing``, and the fused
``e3j.core.Convolution``.

e3j's channelwise product is ``TensorProduct((x_space, y_space), filter,
layout="TRAILING_CHANNELS", normalization=...)``: node features ``x`` of shape ``(rows, dim_x,
C)`` (``C`` channels on a trailing axis, ``x_space`` the irreps of one channel), edge features
``y`` of shape ``(rows, dim_y)`` broadcast over the channels, and every path ``ir1 x ir2 -> ir0``
with ``ir0`` in ``filter`` (multiplicity-1 irreps) gets its own output block; the output blocks
are sorted by irrep (stably) and regrouped. ``ScalarMixing(target, layout=...)`` then multiplies
each output irrep copy of each channel by a scalar: the per-path weights, shape ``(rows,
num_irreps, C)``. ``Convolution((x_space, y_space), filter, graph_ordering="RECEIVER",
layout=..., normalization=...)`` fuses gather by sender, that product, the mixing and the sum
by receiver; ``convolution(x, y, s, senders, receivers)``.

Which problems: ``uvu`` instructions only, with every ``irreps_in2`` multiplicity 1 (e3j keeps
each ``v`` of ``y`` in its own output copy where ``uvu`` sums over it), one instruction per output
block, and the instruction list exactly e3j's path list for that filter (e3j computes every ``ir1
x ir2 -> ir0`` with ``ir0`` in the filter; it has no per-path selection). The channel count ``C``
is the gcd of the ``irreps_in1`` multiplicities (on e3j's fused kernels the largest power of two
dividing it: its CUDA kernels require one); a block of multiplicity ``mul`` has ``mul / C``
copies per channel. Everything else (``uvw``, ``uvv``, ``uuw``, ``uuu``, ...) raises
:class:`Unsupported` with the reason. (``uuu`` could map onto the product's ``mode="MAP"``, but
e3j's convolution takes edge features without a channel axis; not done here.)

Normalisation: ``normalization="SQRT_DIM_OUT"`` (CG blocks times ``sqrt(2 l_out + 1)``) for
``irrep_normalization="component"``, ``"NONE"`` otherwise. e3j's block of a path is e3nn's
``C(l0, l1, l2)[k, i, j]`` (output index first), which equals ``C(l1, l2, l0)[i, j, k]``, the
block jax_cgtp uses (a cyclic permutation of the 3j symbol; ``build`` takes the sign of the two
blocks' inner product, +1 for every l checked). So path ``p`` is jax_cgtp's with the scalar ``s =
f_p * w``, ``f_p = ±path_weight / sqrt(2 l_out + 1)`` (or ``/ 1``): ``f_p`` is folded into the
weight conversion, and the weight cotangent back is ``f_p * ds`` (the transpose). ``build``
checks e3j's coefficient tensor, block by block, against jax_cgtp's ``path_weight * C`` (float64:
1e-12 relative; float32: 1e-6). For every benchmark config (component irreps, element paths, one
path per output block, ``mul_in2 = 1``) ``f_p = 1`` exactly. Where some ``|f_p| != 1`` the
``train`` phases (whose loss sums the squared weight gradient in the library's layout) are not
comparable; fwd, bwd and dbwd are, and the row note says so.

Layout: ``x`` goes to ``(N, dim_x, C)`` with our channel ``u = c * m + a`` (``m = mul / C``
copies per channel, ``a`` the copy), i.e. each e3nn block reshaped ``(C, m, d)`` and moved to
``(m, d, C)``; ``y`` is unchanged; ``z``/``g`` go to e3j's sorted target ``(rows, dim_z, C)``;
``w`` (``path_shape (mul1, 1)``, C order) to ``(rows, num_irreps, C)``. All conversions are
gathers/scatters outside the timed region; an e3j model keeps its features in this layout.

Routes: e3j's global config (``e3j.config``, also read from ``$E3J_CONFIG``/``e3j.yaml`` and
``$E3J_BACKEND``) picks the implementation: ``FUSED_CUDA`` where ``e3j_ops`` (its CUDA kernels) is
installed and not ``JAX_PLATFORMS=cpu``, otherwise ``UNFUSED`` (plain JAX:
gather ``x[..., j, :]``, ``y[..., k]`` by the CG indices, multiply, ``scatter_add`` onto the
output coordinates). ``e3j_ops`` is not a dependency of ``e3j``; without it e3j runs the plain-JAX
path on any device, and the row note says so. The fused convolution (``FUSED_CUDA``, or
``FUSED_MOSAIC_GPU`` in e3j 0.1.2, with ``graph_ordering="RECEIVER"``) needs edges sorted by
receiver; the per-edge ``y`` and ``w`` are
not graph arguments, so ``prepare_graph`` cannot permute them: it checks whether ``dst`` is
sorted (it is on every graph but ``by_source``) and, where not, the row runs e3j's unfused
convolution (gather ``x[src]``, product, mixing, ``.at[dst].add``). The note names the route.

float32 rows: e3j builds its CG coefficients when the op is constructed, as JAX arrays of the
default float type; the harness enables x64, which would make them float64 and promote a float32
product to float64. The ops are therefore constructed with x64 off for float32 rows (as in a
float32 e3j model); the CUDA kernels cast the coefficients to the operands' dtype anyway.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math

import jax
import jax.numpy as jnp
import numpy as np

from . import Impl, Missing, Unsupported

NAME = "e3j"

_RECEIVER_FUSED = ("FUSED_CUDA", "FUSED_MOSAIC_GPU")


def _import():
    try:
        import e3j
        import e3j.core  # noqa: F401
    except Exception as error:  # ImportError, or an error inside the package's own imports
        raise Missing(f"{type(error).__name__}: {error}") from None
    return e3j


def _ops_version() -> str | None:
    if importlib.util.find_spec("e3j_ops") is None:
        return None
    try:
        from importlib.metadata import version as dist_version

        return dist_version("e3j-ops")
    except Exception:
        return "?"


def version() -> str:
    e3j = _import()
    ops = _ops_version()
    return f"e3j {e3j.__version__}, " + (f"e3j_ops {ops}" if ops else "without e3j_ops (plain-JAX path)")


@dataclasses.dataclass
class _Plan:
    """The e3j problem of a jax_cgtp problem and the index maps between the two layouts."""

    channels: int
    x_space: object
    y_space: object
    target_filter: object
    normalization: str
    x_index: np.ndarray  # (dim_x_e3j, C): e3nn coordinate of each e3j x coordinate
    z_index: np.ndarray  # (dim_z_e3j, C)
    w_index: np.ndarray  # (num_irreps, C): e3nn weight index, -1 for an unweighted path
    w_factor: np.ndarray  # (num_irreps, C): f_p of the path of each scalar
    paths: list  # (instruction, e3j x offset, e3j z offset, its rows of w_index) per path


def _largest_pow2_divisor(n: int) -> int:
    return n & -n


def _plan(problem, pow2_channels: bool) -> _Plan:
    from e3j.spaces import O3Irrep, O3Space

    in1, in2, out = problem.irreps_in1, problem.irreps_in2, problem.irreps_out
    instructions = problem.instructions
    if not instructions:
        raise Unsupported("no instructions")
    modes = sorted({ins.mode for ins in instructions} - {"uvu"})
    if modes:
        raise Unsupported(
            f"mode {', '.join(modes)}: e3j's channelwise product (TensorProduct + ScalarMixing) "
            "expresses only uvu (one weight per x channel and path)"
        )
    if any(mul_ir.mul == 0 for irreps in (in1, in2, out) for mul_ir in irreps):
        raise Unsupported("an irreps block of multiplicity 0")
    if any(mul_ir.mul != 1 for mul_ir in in2):
        raise Unsupported(
            f"irreps_in2 {in2} has a multiplicity > 1: e3j broadcasts y over the channels and keeps "
            "each copy of y in its own output block, where uvu sums over them"
        )
    outputs = [ins.i_out for ins in instructions]
    if len(set(outputs)) != len(outputs):
        raise Unsupported("an output block receives several paths: e3j gives every path its own output block")

    channels = math.gcd(*(mul_ir.mul for mul_ir in in1))
    if pow2_channels:
        channels = _largest_pow2_divisor(channels)

    def e3j_irrep(ir):
        return O3Irrep(ir.l, ir.p)

    x_space = O3Space([(mul_ir.mul // channels, e3j_irrep(mul_ir.ir)) for mul_ir in in1])
    y_space = O3Space([(mul_ir.mul, e3j_irrep(mul_ir.ir)) for mul_ir in in2])
    keep = sorted({e3j_irrep(out[ins.i_out].ir) for ins in instructions})
    target_filter = O3Space([(1, ir) for ir in keep])

    # e3j's paths, in its order (TensorProduct.clebsch_gordan): x blocks, y blocks, ir1 x ir2.
    ours = {(ins.i_in1, ins.i_in2, (out[ins.i_out].ir.l, out[ins.i_out].ir.p)): ins for ins in instructions}
    theirs = []
    for i1, mul_ir1 in enumerate(in1):
        for i2, mul_ir2 in enumerate(in2):
            for _, ir0 in e3j_irrep(mul_ir1.ir) * e3j_irrep(mul_ir2.ir):
                if ir0 in keep:
                    theirs.append((i1, i2, (ir0.l, ir0.p)))
    if set(theirs) != set(ours) or len(theirs) != len(ours):
        extra = sorted(set(theirs) - set(ours))
        lacking = sorted(set(ours) - set(theirs))
        raise Unsupported(
            "the instructions are not e3j's path list for this filter (e3j computes every "
            f"ir1 x ir2 -> ir0 with ir0 in the filter): e3j would add {extra}, lacks {lacking}"
        )

    # Sorted target: stable sort of the path blocks by irrep, as TensorProduct.sort does.
    blocks = [(in1[i1].mul // channels, O3Irrep(*ir0)) for i1, _, ir0 in theirs]
    _, order = O3Space(blocks).sort(return_inverse=True)
    z_offset, copy_offset = {}, {}
    coordinate = copy = 0
    for p in order:
        z_offset[p], copy_offset[p] = coordinate, copy
        coordinate += blocks[p][0] * blocks[p][1].dim
        copy += blocks[p][0]
    dim_z, num_irreps = coordinate, copy

    channel = np.arange(channels)
    x_rows, x_offsets, e3j_offset = [], [], 0
    for mul_ir in in1:
        m, d = mul_ir.mul // channels, mul_ir.ir.dim
        x_offsets.append(e3j_offset)
        offset = in1[: len(x_rows)].dim
        a, i = np.meshgrid(np.arange(m), np.arange(d), indexing="ij")
        u = channel[None, None, :] * m + a[..., None]  # (m, d, C)
        x_rows.append((offset + u * d + i[..., None]).reshape(m * d, channels))
        e3j_offset += m * d
    x_index = np.concatenate(x_rows)

    z_index = np.zeros((dim_z, channels), np.int64)
    w_index = np.full((num_irreps, channels), -1, np.int64)
    w_factor = np.zeros((num_irreps, channels), np.float64)
    scale = problem.irrep_normalization == "component"
    paths = []
    for p, key in enumerate(theirs):
        ins = ours[key]
        m, d0 = in1[ins.i_in1].mul // channels, out[ins.i_out].ir.dim
        o3 = out[: ins.i_out].dim
        a, k = np.meshgrid(np.arange(m), np.arange(d0), indexing="ij")
        u = channel[None, None, :] * m + a[..., None]
        z_index[z_offset[p]: z_offset[p] + m * d0] = (o3 + u * d0 + k[..., None]).reshape(m * d0, channels)
        factor = ins.path_weight / (math.sqrt(d0) if scale else 1.0)
        rows = slice(copy_offset[p], copy_offset[p] + m)
        w_factor[rows] = factor
        if ins.has_weight:  # path_shape (mul1, 1), C order: weight u at weight_offset + u
            w_index[rows] = ins.weight_offset + channel[None, :] * m + np.arange(m)[:, None]
        paths.append((ins, x_offsets[ins.i_in1], z_offset[p], rows))
    return _Plan(channels, x_space, y_space, target_filter, "SQRT_DIM_OUT" if scale else "NONE",
                 x_index, z_index, w_index, w_factor, paths)


def _check_coefficients(plan: _Plan, tp, problem, dtype) -> None:
    """Fix each path's sign, then check e3j's whole coefficient tensor (one channel) against
    jax_cgtp's ``path_weight * C`` blocks divided by ``f_p``, placed where the plan puts them."""
    from jax_cgtp.core.problem import cg_block

    dense = np.asarray(tp.coef.todense(), np.float64)  # (dim_z, dim_x, dim_y) of one channel
    expected = np.zeros_like(dense)
    y_offsets = np.cumsum([0] + [mul_ir.dim for mul_ir in problem.irreps_in2])
    for ins, x_offset, z_offset, rows in plan.paths:
        d1 = problem.irreps_in1[ins.i_in1].ir.dim
        d2 = problem.irreps_in2[ins.i_in2].ir.dim
        d3 = problem.irreps_out[ins.i_out].ir.dim
        y_offset = y_offsets[ins.i_in2]
        ours = cg_block(problem, ins).transpose(2, 0, 1)  # (k, i, j), as e3j stores it
        theirs = dense[z_offset: z_offset + d3, x_offset: x_offset + d1, y_offset: y_offset + d2]
        sign = -1.0 if np.sum(ours * theirs) < 0 else 1.0
        plan.w_factor[rows] *= sign
        factor = plan.w_factor[rows.start, 0]
        for a in range(rows.stop - rows.start):  # copy a: x copy a -> output copy a
            expected[z_offset + a * d3: z_offset + (a + 1) * d3, x_offset + a * d1: x_offset + (a + 1) * d1,
                     y_offset: y_offset + d2] = ours / factor if factor else 0.0
    active = [ins for ins, *_ in plan.paths if ins.path_weight != 0.0]
    if not active:
        return
    tol = 1e-12 if jnp.dtype(dtype) == jnp.float64 else 1e-6
    if np.max(np.abs(dense - expected)) > tol * max(float(np.max(np.abs(expected))), 1e-300):
        raise RuntimeError("e3j's coefficients differ from jax_cgtp's path_weight * C / f_p")


def _x64(dtype):
    """Build e3j's ops with x64 on only for float64 rows (see the module docstring)."""
    return jax.enable_x64(jnp.dtype(dtype) == jnp.float64)


def build(tp, dtype, conv: bool, options: dict) -> Impl:
    e3j = _import()
    from e3j.utils.options import Convolution as ConvolutionImpl

    problem = tp.problem
    config = e3j.config.state()  # the routes e3j picked for this environment
    product_name, conv_name = config.tensor_product.name, config.convolution.name
    # The fused convolutions that take RECEIVER ordering (FUSED_MOSAIC_GPU from e3j 0.1.2 on);
    # FUSED_MOSAIC_TPU takes only SENDER ordering, which also assumes a symmetric graph.
    fused_conv = conv and conv_name in _RECEIVER_FUSED
    pow2 = product_name.startswith("FUSED") or (conv and conv_name.startswith("FUSED"))
    plan = _plan(problem, pow2_channels=pow2)
    layout = "TRAILING_CHANNELS"
    source = (plan.x_space, plan.y_space)

    with _x64(dtype):
        product = e3j.core.TensorProduct(source, plan.target_filter, layout=layout,
                                         normalization=plan.normalization)
        mix = e3j.core.ScalarMixing(product.target, layout=layout)
        if conv:
            convolutions = {
                route: e3j.core.Convolution(
                    source, plan.target_filter, graph_ordering=ordering, layout=layout,
                    normalization=plan.normalization, config=route_config)
                for route, ordering, route_config in (
                    ("fused", "RECEIVER", config),
                    ("unfused", "NONE", dataclasses.replace(config, convolution=ConvolutionImpl.UNFUSED)),
                )
            }
    if (plan.x_index.shape[0], plan.z_index.shape[0], plan.w_index.shape[0]) != (
            product.source[0].dim, product.target.dim, mix.num_irreps):
        raise RuntimeError(f"e3j's spaces differ from the adapter's plan: {product.source} -> {product.target}")
    _check_coefficients(plan, product, problem, dtype)
    if conv and any(op.target != product.target for op in convolutions.values()):
        raise RuntimeError("e3j's convolution and product targets differ")

    x_index, z_index = jnp.asarray(plan.x_index), jnp.asarray(plan.z_index)
    weighted = plan.w_index >= 0
    w_gather = jnp.asarray(np.where(weighted, plan.w_index, 0))
    w_scale = plan.w_factor
    w_fill = np.where(weighted, 0.0, plan.w_factor)  # unweighted paths: the constant f_p
    dims = {"x": problem.irreps_in1.dim, "z": problem.irreps_out.dim}

    def to_library(kind, array):
        if kind == "y":
            return array
        if kind in ("x", "z"):
            return array[..., x_index if kind == "x" else z_index]
        scalars = jnp.where(weighted, array[..., w_gather], 0) * w_scale.astype(array.dtype)
        return scalars + w_fill.astype(array.dtype)

    def from_library(kind, array):
        if kind == "y":
            return array
        if kind in ("x", "z"):
            index = x_index if kind == "x" else z_index
            empty = jnp.zeros((*array.shape[:-2], dims[kind]), array.dtype)
            return empty.at[..., index].set(array)
        # the weight cotangent: the transpose of w -> f_p * w
        empty = jnp.zeros((*array.shape[:-2], problem.weight_numel), array.dtype)
        rows, cols = np.nonzero(weighted)
        values = array[..., rows, cols] * plan.w_factor[rows, cols].astype(array.dtype)
        return empty.at[..., plan.w_index[rows, cols]].set(values)

    product_route = product_name + {
        "FUSED_CUDA": " (e3j_ops)",
        "UNFUSED": " (plain JAX" + ("" if _ops_version() else ", no e3j_ops") + ")",
    }.get(product_name, "")
    layout_note = f"TRAILING_CHANNELS, {plan.channels} channels"
    if not np.all(np.abs(np.abs(plan.w_factor) - 1.0) <= 1e-12):
        # s = f_p * w is exact for fwd, bwd and dbwd; the train phases' loss sums the squared
        # weight gradient in e3j's layout, |dE/ds|^2 = |dE/dw|^2 / f_p^2, which then differs.
        layout_note += ", path factors f_p != 1 folded into w (train phases not comparable)"

    if not conv:
        def apply(x, y, w):
            return mix(w, product(x, y))

        return Impl(apply=apply, to_library=to_library, from_library=from_library,
                    note=f"TensorProduct {product_route} + ScalarMixing, {layout_note}")

    state = {"route": "unfused"}
    impl = Impl(apply=None, to_library=to_library, from_library=from_library)

    def prepare_graph(src, dst, nodes):
        receiver_sorted = bool(np.all(np.diff(np.asarray(dst)) >= 0))
        state["route"] = "fused" if fused_conv and receiver_sorted else "unfused"
        if state["route"] == "fused":
            impl.note = f"fused Convolution {conv_name}, graph_ordering=RECEIVER (dst sorted), {layout_note}"
        else:
            if fused_conv:
                why = "edges not sorted by receiver, and y, w are not graph arguments"
            elif conv_name.startswith("FUSED"):
                why = f"e3j's {conv_name} takes no RECEIVER ordering"
            else:
                why = f"e3j config convolution={conv_name}"
            impl.note = (f"unfused Convolution (gather x[src], TensorProduct {product_route}, ScalarMixing, "
                         f".at[dst].add; {why}), {layout_note}")
        return src, dst

    def apply(x, y, w, src, dst):
        op = convolutions[state["route"]]
        if state["route"] == "fused" and w.ndim == 2:  # one row of weights shared by every edge
            w = jnp.broadcast_to(w, (y.shape[0], *w.shape))
        return op(x, y, w, src, dst)

    impl.apply = apply
    impl.prepare_graph = prepare_graph
    impl.note = "Convolution, route set by prepare_graph"
    return impl
