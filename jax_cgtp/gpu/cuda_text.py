"""Pieces of CUDA text shared by the code generators (:mod:`jax_cgtp.gpu.codegen` and
:mod:`jax_cgtp.gpu.codegen_stream`): an indenting line writer, literals, flush statements, a tile
edge's header, and the transposed warp sum."""

from __future__ import annotations

from ..core.operands import BATCHED, INDEXED, SHARED
from .schedule import WARP, KernelSchedule


class Writer:
    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str = "") -> None:
        self.lines.append("  " * self.depth + line if line else "")

    def open(self, line: str) -> None:
        self(f"{line} {{" if line else "{")
        self.depth += 1

    def close(self, tail: str = "") -> None:
        self.depth -= 1
        self("}" + tail)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def literal(value: float, dtype: str) -> str:
    return f"{value:.17e}" if dtype == "double" else f"{value:.9e}f"


def put(out, address: str, value: str, add: bool = False) -> str:
    """The statement that flushes ``value`` to ``address`` of output ``out`` (a KernelOutput);
    with ``add``, a write (stored or owned) adds to what an earlier flush of the warp wrote there."""
    if add and out.flush in ("store", "own", "slice"):
        return f"cgtp_own({address}, {value}, false);"
    if out.flush in ("slice", "tile"):  # the edge's own row of the slice; a row of the node or tile
        return f"cgtp_store({address}, {value});"
    fresh = ", fresh" if out.flush == "own" else ""
    return f"cgtp_{out.flush}({address}, {value}{fresh});"


def emit_chunk_flush(w: Writer, values: list[str], guard: str, flush) -> None:
    """Flush a chunk of 32 rows of ``len(values)`` components of an output,
    lane L holding row L's in ``values``, as that many warp-wide runs of 32 consecutive elements
    (the chunk's elements are row-major, e3nn's mul_ir layout): ``flush(value)`` is the statement
    that writes ``value`` to element ``q`` of the chunk, for ``q`` below ``nrows`` rows and
    ``guard`` (a condition followed by ``&&``, or ""). The rows are transposed through the warp's
    buffer ``obuf`` (in registers by warp shuffles instead, the product forward took 0.93-1.20x the
    time with 33-48% more registers: shuffle-transpose)."""
    d = len(values)
    w.open("")
    w.open("if (active)")
    for q, a in enumerate(values):
        w(f"obuf[lane * {d} + {q}] = {a};")
    w.close()
    w("__syncwarp();")
    w("#pragma unroll")
    w.open(f"for (int r = 0; r < {d}; ++r)")
    w("const int q = r * 32 + lane;")
    w(f"if ({guard}q < nrows * {d}) {flush('obuf[q]')}")
    w.close()
    w("__syncwarp();")
    w.close()


def row_of(schedule: KernelSchedule, role: str) -> str:
    kind = schedule.call.kind(role)
    return {BATCHED: "e", INDEXED: f"ix_{role}", SHARED: "0"}[kind]


def lane_row(schedule: KernelSchedule, role: str) -> str:
    """The per-lane register holding the row of ``role`` (BATCHED or INDEXED) for the lane's edge
    of the tile; :func:`tile_value` gives its value for the tile's edge ``t``."""
    return "my_edge" if schedule.call.kind(role) == BATCHED else f"my_ix_{role}"


def tile_value(schedule: KernelSchedule, register: str, t: str) -> str:
    """The ``long long`` value of lane register ``register`` (``my_edge``, ``my_ix_{role}``) for
    the tile's edge ``t``: ``first + t`` for the edge of a tile of consecutive edges, else a
    shuffle from lane ``t`` (one 32-bit shuffle for an ``int`` index or sorted position)."""
    if register == "my_edge" and not schedule.permuted:
        return f"(first + {t})"
    return f"(long long)__shfl_sync(CGTP_FULL_MASK, {register}, {t})"


def cg_sums(nonzeros, key: int, factors, dtype: str) -> dict[int, str]:
    """``{c: sum of pw C * a * b}`` over the CG nonzeros ``(i, j, k, pw C)`` whose ``key`` index
    (0 i, 1 j, 2 k) is ``c``; the two other indices name the factors ``a`` and ``b`` through
    ``factors`` (a format per index, e.g. ``"x_{}"``; the ``key`` one unused)."""
    sums: dict[int, list[tuple[str, str]]] = {}
    for nz in nonzeros:
        product = " * ".join(f.format(nz[n]) for n, f in enumerate(factors) if n != key)
        sums.setdefault(nz[key], []).append(signed_term(nz[3], product, dtype))
    return {c: signed_sum(terms) for c, terms in sorted(sums.items())}


def signed_term(c: float, factors: str, dtype: str) -> tuple[str, str]:
    """``c * factors`` as a ``(sign, product)`` term of :func:`signed_sum`, with no literal where
    ``|c|`` is 1."""
    product = factors if rounded(abs(c)) == 1.0 else f"{literal(abs(c), dtype)} * {factors}"
    return "-" if c < 0 else "+", product


def rounded(value: float) -> float:
    """``value`` to 12 significant digits: CG coefficients that are equal in exact arithmetic differ
    in their last bits, and so would ``v / u`` from 1."""
    return float(f"{value:.12g}")


def signed_sum(terms) -> str:
    """The sum of ``(sign, product)`` terms, ``sign`` "+" or "-": ``a * b - c * d`` (a negated
    product rounds to the negated rounding, so the sum is the one of the negated factors)."""
    text = ""
    for sign, product in terms:
        text += (f"-{product}" if sign == "-" else product) if not text else f" {sign} {product}"
    return text


def emit_chunk_lanes(w: Writer, mul: int, chunk: str = "c") -> None:
    """``lc`` (the lane's channel), ``active`` (it exists) and ``nrows`` (the channels of the chunk)
    for 32-channel chunk ``chunk`` of ``mul`` channels; constants when ``mul`` is a multiple of 32."""
    w(f"const int lc = {chunk} * 32 + lane;")
    if mul % WARP == 0:
        w("const bool active = true;  // whole chunks of 32 channels")
        w("const int nrows = 32;")
    else:
        w(f"const bool active = lc < {mul};")
        w(f"const int nrows = {mul} - {chunk} * 32 < 32 ? {mul} - {chunk} * 32 : 32;")


def edge_ok(t: str) -> str:
    """Whether the tile's edge ``t`` (below 32) is valid: bit ``t`` of the tile's ballot."""
    return f"((tile_ok >> {t}) & 1u) != 0"


def emit_edge_header(w: Writer, schedule: KernelSchedule) -> None:
    w(f"const long long e = {tile_value(schedule, 'my_edge', 't')};")
    w(f"const bool ok = {edge_ok('t')};")
    for r in schedule.call.indexed_roles:
        w(f"const long long ix_{r} = {tile_value(schedule, f'my_ix_{r}', 't')};")


def emit_transposed_sum(w: Writer, values: list[str], target: str, close: str, op: str) -> None:
    """Write (``op`` "=") or add ("+=") the warp sum of each of ``values`` (per-lane partials) to
    ``{target}q{close}``, q its position. Up to 32 values at a time by a transposed butterfly: at each step the lanes with
    the offset bit set keep the upper half of their values and receive that half from their
    partner, so V values take V - 1 shuffles (plus one per remaining step) instead of 5 V."""
    for start in range(0, len(values), WARP):
        group = values[start:start + WARP]
        p = max(0, (len(group) - 1).bit_length())
        regs = [f"s_{q}" for q in range(1 << p)]
        w.open("")
        w(" ".join(f"T {r} = {v};" for r, v in zip(regs, group + ["T(0)"] * (len(regs) - len(group)))))
        offset, count = 16, len(regs)
        while count > 1:
            half = count // 2
            w(f"const bool up{offset} = (lane & {offset}) != 0;")
            for i in range(half):
                w(f"{regs[i]} = (up{offset} ? {regs[i + half]} : {regs[i]}) + "
                  f"__shfl_xor_sync(CGTP_FULL_MASK, up{offset} ? {regs[i]} : {regs[i + half]}, {offset});")
            offset, count = offset // 2, half
        while offset >= 1:
            w(f"s_0 += __shfl_xor_sync(CGTP_FULL_MASK, s_0, {offset});")
            offset //= 2
        shift = 5 - p
        w(f"const int q = lane >> {shift};")
        mask = (1 << shift) - 1
        w(f"if ({f'(lane & {mask}) == 0 && ' if mask else ''}q < {len(group)}) {target}{start} + q{close} {op} s_0;")
        w.close()


def owned_end(schedule: KernelSchedule, out, cur: str = "cur") -> tuple[str, str]:
    """``(condition, row)`` of the flush that ends a tile's walk: the warp's own row for an owned
    output (the run's node, or a chunk walk's chunk row; written even when no edge of the tile was
    valid; in a lockstep walk, when the tile holds edges of the run), else the row ``cur`` last
    accumulated."""
    if out.flush != "own":
        return f"{cur} >= 0", cur
    return ("owned && count > 0" if schedule.lockstep else "owned"), "own_row"
