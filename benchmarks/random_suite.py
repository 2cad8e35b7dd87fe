"""Random *realistic* tensor-product problems: the kind MLIP authors write, not the public configs.

``random_config(seed)`` draws one problem, as a :data:`benchmarks.configs.CONFIGS`-style entry of
kind ``explicit`` (irreps and e3nn instruction tuples), from these families:

``channelwise``
    MACE/NequIP message: node irreps of mixed multiplicities (8-256, not only powers of two), l up
    to 3-4, one or both parities per l, times edge harmonics ``0e+1o+2e+...`` up to l 4-5; mode
    ``uvu``, one output block per path kept by a filter on the output's l (and, at times, parity).
``fully_connected``
    ``uvw`` over every block triple, small odd multiplicities (``13x0e+7x1o+5x2e`` times
    ``3x0e+2x1e``), weights per edge.
``self_connection``
    ``uvw`` of node features times a one-hot species ``Nx0e``, back to the node irreps, with one
    row of weights shared by every edge (NequIP's and MACE's species self-connection).
``elementwise``
    ``uuu`` (and ``uvv``) products of equal-multiplicity blocks, as in tensor-product based
    gating and Allegro-like channel products.

:func:`suite` names ``count`` of them ``random-SEED-K`` and registers them with the configs, so
``benchmarks.run --suite random:COUNT:SEED`` measures them like any config.
"""

from __future__ import annotations

import e3nn_jax as e3nn
import numpy as np

from . import configs

FAMILIES = ("channelwise", "channelwise", "channelwise", "fully_connected", "self_connection", "elementwise")
MULTIPLICITIES = (8, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256)
SMALL_MULTIPLICITIES = (1, 2, 3, 5, 7, 9, 13, 17)


def _node_irreps(rng, lmax: int, muls=MULTIPLICITIES) -> e3nn.Irreps:
    """Blocks of ``l <= lmax``: the natural parity ``(-1)^l``, and at times the other one too; the
    multiplicity shrinks with ``l`` as models do."""
    blocks = []
    base = int(rng.choice(muls))
    for l in range(lmax + 1):
        mul = max(1, int(base // (1 + (l > 1) * int(rng.integers(0, 3)))))
        parities = [(-1) ** l] + ([-(-1) ** l] if rng.random() < 0.4 else [])
        blocks += [(mul, (l, p)) for p in parities]
    return e3nn.Irreps(blocks)


def _harmonics(lmax: int) -> e3nn.Irreps:
    return e3nn.Irreps([(1, (l, (-1) ** l)) for l in range(lmax + 1)])


def _channelwise(rng):
    lmax = int(rng.integers(1, 5))
    irreps_in1 = _node_irreps(rng, lmax)
    irreps_in2 = _harmonics(int(rng.integers(max(1, lmax - 1), 6)))
    lmax_out = lmax + int(rng.integers(0, 2))
    natural_only = rng.random() < 0.3
    blocks, instructions = [], []
    for i1, (mul1, ir1) in enumerate(irreps_in1):
        for i2, (_, ir2) in enumerate(irreps_in2):
            for ir in ir1 * ir2:
                if ir.l <= lmax_out and (not natural_only or ir.p == (-1) ** ir.l):
                    instructions.append((i1, i2, len(blocks), "uvu", True))
                    blocks.append((mul1, ir))
    irreps_out, permutation, _ = e3nn.Irreps(blocks).sort()
    instructions = [(i1, i2, permutation[k], mode, weighted) for i1, i2, k, mode, weighted in instructions]
    return irreps_in1, irreps_in2, irreps_out, instructions, False


def _fully_connected_paths(irreps_in1, irreps_in2, irreps_out):
    return [(i1, i2, k, "uvw", True)
            for i1, (_, ir1) in enumerate(irreps_in1) for i2, (_, ir2) in enumerate(irreps_in2)
            for k, (_, ir_out) in enumerate(irreps_out) if ir_out in ir1 * ir2]


def _fully_connected(rng):
    irreps_in1 = _node_irreps(rng, int(rng.integers(1, 3)), SMALL_MULTIPLICITIES)
    irreps_in2 = e3nn.Irreps([(int(rng.choice(SMALL_MULTIPLICITIES[:4])), ir)
                              for ir in ("0e", "1o", "1e", "2e")[: int(rng.integers(2, 5))]])
    irreps_out = _node_irreps(rng, int(rng.integers(1, 3)), SMALL_MULTIPLICITIES)
    instructions = _fully_connected_paths(irreps_in1, irreps_in2, irreps_out)
    return irreps_in1, irreps_in2, irreps_out, instructions, False


def _self_connection(rng):
    irreps = _node_irreps(rng, int(rng.integers(1, 4)))
    species = e3nn.Irreps(f"{int(rng.integers(2, 11))}x0e")
    return irreps, species, irreps, _fully_connected_paths(irreps, species, irreps), True


def _elementwise(rng):
    mul = int(rng.choice(MULTIPLICITIES[:10]))
    lmax = int(rng.integers(1, 4))
    irreps_in1 = e3nn.Irreps([(mul, (l, (-1) ** l)) for l in range(lmax + 1)])
    if rng.random() < 0.5:  # uuu: channel by channel
        irreps_in2 = irreps_in1
        mode = "uuu"
    else:  # uvv: one scalar/vector channel of x against every channel of y
        irreps_in2 = irreps_in1
        irreps_in1 = e3nn.Irreps([(1, (l, (-1) ** l)) for l in range(2)])
        mode = "uvv"
    blocks, instructions = [], []
    for i1, (mul1, ir1) in enumerate(irreps_in1):
        for i2, (mul2, ir2) in enumerate(irreps_in2):
            for ir in ir1 * ir2:
                if ir.l <= lmax:
                    instructions.append((i1, i2, len(blocks), mode, True))
                    blocks.append((mul1 if mode == "uuu" else mul2, ir))
    return irreps_in1, irreps_in2, e3nn.Irreps(blocks), instructions, False


_DRAW = {"channelwise": _channelwise, "fully_connected": _fully_connected,
         "self_connection": _self_connection, "elementwise": _elementwise}


def random_config(seed: int) -> dict:
    """One random problem as a config entry (kind ``explicit``; ``shared_weights`` for a species
    self-connection), the same for the same seed.

    >>> config = random_config(3)
    >>> config["kind"], sorted(config) == sorted(random_config(3))
    ('explicit', True)
    """
    rng = np.random.default_rng(seed)
    family = str(rng.choice(FAMILIES))
    irreps_in1, irreps_in2, irreps_out, instructions, shared = _DRAW[family](rng)
    return dict(kind="explicit", family=family, irreps_in1=str(irreps_in1), irreps_in2=str(irreps_in2),
                irreps_out=str(irreps_out), instructions=[tuple(i) for i in instructions],
                shared_weights=shared, source=f"benchmarks.random_suite seed {seed}")


def suite(count: int, seed: int = 0) -> tuple[str, ...]:
    """Register ``count`` random problems of ``seed`` with the configs; their names.

    >>> suite(2, 5)
    ('random-5-0', 'random-5-1')
    """
    names = []
    for k in range(count):
        name = f"random-{seed}-{k}"
        configs.CONFIGS.setdefault(name, random_config(seed * 1_000_003 + k))
        names.append(name)
    return tuple(names)


def known(name: str) -> bool:
    """Whether ``name`` is a config: a registered one, or ``random-SEED-K`` (registered here)."""
    if name in configs.CONFIGS:
        return True
    parts = name.split("-")
    if len(parts) != 3 or parts[0] != "random" or not all(p.isdigit() for p in parts[1:]):
        return False
    seed, k = int(parts[1]), int(parts[2])
    configs.CONFIGS[name] = random_config(seed * 1_000_003 + k)
    return True


def parse_suite(text: str) -> tuple[str, ...] | None:
    """``random[:COUNT[:SEED]]`` (default 24 problems of seed 0) registered by :func:`suite`; None
    for another suite's name."""
    head, *rest = text.split(":")
    if head != "random" or len(rest) > 2:
        return None
    count, seed = (int(v) for v in (rest + ["24", "0"][len(rest):]))
    return suite(count, seed)
