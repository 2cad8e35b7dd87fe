"""The static description of one call of the primitive family: which arrays go in, which come out.

Every member of the family is a sum of *terms*. A term of output role ``o`` is the gradient with
respect to ``o`` of the quadrilinear form

    F(x, y, w, z) = sum_e sum_paths pw * C[i,j,k] * x[e,u,i] * y[e,v,j] * W[e,(uvw)] * z[e,w',k]

evaluated on three input arrays, one for each of the other roles (``o = "z"`` is the tensor
product ``T(x, y, w)``). A call may produce several outputs, each a sum of terms: the JVP of
``T`` is one output with three terms, the fused backward is three outputs with one term each.
A term flagged ``weighted_only`` runs over the weighted instructions only: it is what remains
of a term after ``w`` was replaced by a tangent (unweighted paths do not depend on ``w``).

Array arguments of a call, in order: the inputs (``roles[n]`` says which role input ``n``
plays), then one int index array per INDEXED role (canonical order ``x, y, w, z``), then a
``(perm, offsets)`` pair per role of :attr:`Call.sorted_roles`: the edges grouped by that role's
index and CSR offsets into them (:func:`~jax_cgtp.core.graph.sort_edges`). A ``deterministic`` call
reduces each node of its INDEXED outputs over that node's run, in the order of a stable sort; it
carries the ordering of every INDEXED role, unless ``orderings`` names fewer (a forward into z by
``dst`` runs needs ``dst``'s alone). An atomic call may carry one, its ``walk``: its tiles then
visit the edges grouped by that role, so that edges sharing a node are consecutive (runs of one
destination, whose z or z̄ chunk is added or staged once) whatever the input's order.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .operands import BATCHED, INDEXED, OPERANDS, SHARED
from .problem import Problem
from .settings import Settings, active


@dataclasses.dataclass(frozen=True)
class Term:
    """``args[n]`` is the input index for the n-th non-output role, in canonical order."""

    args: tuple[int, int, int]
    weighted_only: bool = False


@dataclasses.dataclass(frozen=True)
class Output:
    role: str
    terms: tuple[Term, ...]


@dataclasses.dataclass(frozen=True)
class Call:
    """Static parameters of one ``cgtp`` call (hashable; a primitive parameter)."""

    problem: Problem
    kinds: tuple[str, str, str, str]
    rows: tuple  # rows of each INDEXED role's node array (None for other roles)
    roles: tuple[str, ...]
    outputs: tuple[Output, ...]
    deterministic: bool = False
    orderings: tuple[str, ...] | None = None  # roles whose orderings it carries (None: all if deterministic, else none)
    # the CUDA lowering's tunables: those active where the call is built (:mod:`jax_cgtp.core.settings`);
    # every call derived from it (JVP, transpose, batching) keeps them
    settings: Settings = dataclasses.field(default_factory=active)

    def kind(self, role: str) -> str:
        return self.kinds[OPERANDS.index(role)]

    def row_count(self, role: str):
        return self.rows[OPERANDS.index(role)]

    @property
    def indexed_roles(self) -> tuple[str, ...]:
        return tuple(r for r in OPERANDS if self.kind(r) == INDEXED)

    @property
    def sorted_roles(self) -> tuple[str, ...]:
        """The INDEXED roles whose ``(perm, offsets)`` the call carries, in canonical order."""
        if self.orderings is None:
            return self.indexed_roles if self.deterministic else ()
        return tuple(r for r in self.indexed_roles if r in self.orderings)

    @property
    def walk(self) -> str | None:
        """The role by which an atomic call's tiles visit the edges, if it carries an ordering."""
        return None if self.deterministic or not self.sorted_roles else self.sorted_roles[0]

    @property
    def num_inputs(self) -> int:
        return len(self.roles)

    def term_roles(self, output: str) -> tuple[str, str, str]:
        """The roles of a term's three arguments, for a term of this output role."""
        return tuple(r for r in OPERANDS if r != output)

    def term_problem(self, term: Term) -> Problem:
        return self.problem.weighted_part() if term.weighted_only else self.problem

    def split(self, args):
        """``(inputs, {role: index}, {role: (perm, offsets)})`` from a call's flat arguments."""
        n = self.num_inputs
        inputs = list(args[:n])
        indexed = self.indexed_roles
        indices = dict(zip(indexed, args[n : n + len(indexed)]))
        rest = args[n + len(indexed) :]
        schedules = {r: (rest[2 * k], rest[2 * k + 1]) for k, r in enumerate(self.sorted_roles)}
        return inputs, indices, schedules

    def validate(self) -> None:
        orderings = self.orderings or ()
        if any(r not in self.indexed_roles for r in orderings) or (not self.deterministic and len(orderings) > 1):
            raise ValueError(f"cgtp: orderings {orderings!r}: INDEXED roles only, at most one for an atomic call")
        for output in self.outputs:
            if self.deterministic and self.kind(output.role) == INDEXED and output.role not in self.sorted_roles:
                raise ValueError(f"cgtp: a deterministic call's output {output.role} needs its role's ordering")
            roles = self.term_roles(output.role)
            for term in output.terms:
                for role, arg in zip(roles, term.args):
                    if self.roles[arg] != role:
                        raise ValueError(f"cgtp: term {term} of output {output.role} reads input {arg} "
                                         f"of role {self.roles[arg]} as {role}")


def common_arguments(call: Call, output_indices) -> dict[str, int] | None:
    """``{role: input index}`` read by the outputs ``call.outputs[k]`` (``k`` in ``output_indices``)
    when each has one term and, role by role, all of them read the same input; else None."""
    arrays: dict[str, int] = {}
    for k in output_indices:
        output = call.outputs[k]
        if len(output.terms) != 1:
            return None
        for role, array in zip(call.term_roles(output.role), output.terms[0].args):
            if arrays.setdefault(role, array) != array:
                return None
    return arrays


def accumulation_dtype(dtype):
    """The dtype every backend computes a call of ``dtype`` arrays in: float32 for the half
    precisions (float16, bfloat16), whose results are rounded once to ``dtype``; else ``dtype``."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def num_edges(call: Call, shapes) -> int:
    """Edge count of a call from the shapes of its flat arguments."""
    inputs, indices, _ = call.split(shapes)
    for role, shape in zip(call.roles, inputs):
        if call.kind(role) == BATCHED:
            return shape[0]
    for shape in indices.values():
        return shape[0]
    raise ValueError("cgtp: a call needs at least one batched or indexed operand")


def output_shape(call: Call, role: str, edges: int) -> tuple[int, ...]:
    dim = call.problem.operand_dim(role)
    kind = call.kind(role)
    if kind == SHARED:
        return (dim,)
    if kind == INDEXED:
        return (call.row_count(role), dim)
    return (edges, dim)


def forward_call(problem: Problem, kinds, rows=(None,) * 4, deterministic=False, orderings=None) -> Call:
    """The tensor product itself: one output ``z`` from inputs ``x, y, w``."""
    return Call(problem, tuple(kinds), tuple(rows), ("x", "y", "w"),
                (Output("z", (Term((0, 1, 2)),)),), deterministic, orderings)


def prune_inputs(call: Call, args: list):
    """Drop inputs no term reads; returns the new call and its input list."""
    used = sorted({a for out in call.outputs for t in out.terms for a in t.args})
    remap = {old: new for new, old in enumerate(used)}
    outputs = tuple(
        Output(o.role, tuple(Term(tuple(remap[a] for a in t.args), t.weighted_only) for t in o.terms))
        for o in call.outputs
    )
    roles = tuple(call.roles[a] for a in used)
    return dataclasses.replace(call, roles=roles, outputs=outputs), [args[a] for a in used]
