"""How each of the four operands of a family member is laid out along the edge (row) axis.

A family member reads three of the operands ``x``, ``y``, ``w``, ``z`` and produces the
fourth. Every operand has one of three row *kinds*:

* ``BATCHED``: shape ``(E, dim)``, row ``e`` belongs to edge ``e``;
* ``SHARED``:  shape ``(dim,)``, the same row for every edge; as an output it is summed over edges;
* ``INDEXED``: shape ``(N, dim)`` with an int index array of length ``E``; edge ``e`` reads row
  ``index[e]`` (a gather), and as an output edge ``e`` adds into row ``index[e]`` (a scatter-sum).
  Indices outside ``[0, N)`` read zeros and write nothing.

The plain tensor product has ``x, y, z`` batched and ``w`` batched or shared; the graph
convolution gathers ``x`` by ``src`` and scatters ``z`` by ``dst``.
"""

from __future__ import annotations

OPERANDS = ("x", "y", "w", "z")
BATCHED, SHARED, INDEXED = "batched", "shared", "indexed"
KINDS = (BATCHED, SHARED, INDEXED)


def input_operands(output: str) -> tuple[str, ...]:
    """The three operands a member with this output reads, in canonical order."""
    return tuple(op for op in OPERANDS if op != output)


def indexed_operands(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """Operands of kind INDEXED, in canonical order (the order of the index arguments)."""
    return tuple(op for op, kind in zip(OPERANDS, kinds) if kind == INDEXED)


def kind_of(kinds: tuple[str, ...], operand: str) -> str:
    return kinds[OPERANDS.index(operand)]
