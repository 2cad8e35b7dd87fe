"""Build each config's jax_cgtp problem with jax_cgtp's public API.

The :class:`jax_cgtp.TensorProduct` built here is the single source of truth of a benchmark
row: every peer adapter derives its own problem from ``tp.irreps_in1/in2/out`` and
``tp.instructions`` (see :mod:`benchmarks.peers`), and :mod:`benchmarks.cost` counts bytes and
FLOP from ``tp.problem``.
"""

from __future__ import annotations

import e3nn_jax as e3nn

import jax_cgtp

from .configs import CONFIGS


def instruction_tuples(problem) -> list[tuple]:
    """The e3nn instruction tuples ``(i_in1, i_in2, i_out, mode, has_weight)`` of ``problem``.

    The raw path weights are left at e3nn's default of 1.0: every config builds its problem that
    way, and :func:`conv_of` and the peer adapters check that the normalised path weights they
    obtain equal ``problem``'s.
    """
    return [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight) for i in problem.instructions]


def _lmax_filter(irreps_in1, irreps_in2) -> list[str]:
    lmax = max(mul_ir.ir.l for mul_ir in e3nn.Irreps(irreps_in1) + e3nn.Irreps(irreps_in2))
    return [f"{l}{p}" for l in range(lmax + 1) for p in "eo"]


def build(name: str, backend: str = "auto") -> jax_cgtp.TensorProduct:
    """The tensor product of config ``name`` (see :mod:`benchmarks.configs` for the kinds).

    >>> tp = build("tiny-uvu", backend="reference")
    >>> tp.irreps_out, len(tp.instructions), tp.weight_numel
    (4x0e+4x0e+4x1o+4x1o+4x1e, 5, 20)
    """
    config = CONFIGS[name]
    kind = config["kind"]
    if kind == "channelwise_seed":
        raw = jax_cgtp.channelwise_tensor_product(
            config["irreps_in1"], config["irreps_in2"], filter_ir_out=config["irreps_out"], backend=backend
        )
        # OpenEquivariance sorts the output blocks by (l, parity) with odd before even (e3nn-jax
        # puts 2e before 2o); both sorts are stable, so re-sorting gives exactly its order.
        blocks = list(raw.irreps_out)
        order = sorted(range(len(blocks)), key=lambda i: (blocks[i].ir.l, blocks[i].ir.p))
        position = {old: new for new, old in enumerate(order)}
        # ChannelwiseTPP then sorts its instruction list by output block: that fixes the weight layout.
        instructions = sorted(
            ((i1, i2, position[i_out], mode, weighted)
             for i1, i2, i_out, mode, weighted in instruction_tuples(raw.problem)),
            key=lambda ins: ins[2],
        )
        return jax_cgtp.TensorProduct(
            raw.irreps_in1, raw.irreps_in2, e3nn.Irreps([blocks[i] for i in order]), instructions,
            backend=backend,
        )
    if kind == "fully_connected":
        return jax_cgtp.fully_connected_tensor_product(
            config["irreps_in1"], config["irreps_in2"], config["irreps_out"], backend=backend
        )
    if kind == "channelwise_lmax":
        keep = _lmax_filter(config["irreps_in1"], config["irreps_in2"])
        return jax_cgtp.channelwise_tensor_product(
            config["irreps_in1"], config["irreps_in2"], filter_ir_out=keep, backend=backend
        )
    if kind == "explicit":
        return jax_cgtp.TensorProduct(config["irreps_in1"], config["irreps_in2"], config["irreps_out"],
                                      config["instructions"], backend=backend)
    raise ValueError(f"config {name!r}: unknown kind {kind!r}")


def conv_of(tp: jax_cgtp.TensorProduct, backend: str = "auto") -> jax_cgtp.TensorProductConv:
    """The fused graph convolution of the same problem as ``tp`` (atomic scatter)."""
    problem = tp.problem
    conv = jax_cgtp.TensorProductConv(
        problem.irreps_in1,
        problem.irreps_in2,
        problem.irreps_out,
        instruction_tuples(problem),
        irrep_normalization=problem.irrep_normalization,
        path_normalization=problem.path_normalization,
        backend=backend,
    )
    if conv.problem != problem:
        raise ValueError(f"the convolution's problem differs from the product's: {conv.problem} vs {problem}")
    return conv
