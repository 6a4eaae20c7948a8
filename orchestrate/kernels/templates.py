"""Kernel templates and their legality: which sets of primitives one kernel runs.

A candidate kernel is a set S of primitive nodes.  ``classify(graph, S)`` says
which template can run S, or why none can.  It is a pure function of the
graph and the set; every "no" carries a reason that ``orchestrate explain``
prints.

Templates (each a Triton kernel shape, see ``orchestrate/emit``):

``view``       reshapes only: no kernel at all, the output aliases the input.
``pointwise``  elementwise and layout primitives evaluated per output element;
               all outputs share one shape (the iteration space); layout ops
               become index arithmetic on the loads.
``row_reduce`` one or more reductions over the same axes of same-shaped
               inputs, with a prologue (evaluated per element before
               reducing), row-level ops (per row) and an epilogue that
               broadcasts row results back (softmax, layernorm, RMSNorm).
``matmul``     one MATMUL; elementwise/layout prologue on its operands
               (evaluated as tiles are loaded) and an aligned elementwise
               epilogue (bias, activation, residual, scale, cast).
``conv``       one CONV as implicit GEMM with an aligned elementwise epilogue.
``window``     one POOL with an elementwise prologue and aligned epilogue.
``attention``  two MATMULs around a softmax (flash attention): added by a rule,
               ``kernels/attention.py``, which also judges sets with two matmuls.

Vocabulary: the *sinks* of S are its nodes with no consumer inside S; they
are always written to memory.  Other nodes of S that are consumed outside S
*may* be written (the linear program decides) when the template can store
them cheaply: the ``optional`` outputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from orchestrate import ir
from orchestrate.ir import Graph, Node, Op

VIEW = "view"
POINTWISE = "pointwise"
ROW_REDUCE = "row_reduce"
MATMUL = "matmul"
CONV = "conv"
WINDOW = "window"
ATTENTION = "attention"
TEMPLATES = (VIEW, POINTWISE, ROW_REDUCE, MATMUL, CONV, WINDOW, ATTENTION)

ANCHORS = frozenset({Op.MATMUL, Op.CONV, Op.POOL})
ROW_REDUCTIONS = frozenset({Op.SUM, Op.RMAX, Op.RMIN, Op.PROD, Op.ARGMAX, Op.ARGMIN})
POINTWISE_OPS = ir.ELEMENTWISE | ir.LAYOUT
# epilogue ops keep the anchor's element alignment: elementwise only
EPILOGUE_OPS = ir.ELEMENTWISE


@dataclass(frozen=True)
class Kernel:
    """A legal candidate: the template, its nodes (in graph order) and its I/O."""

    template: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]  # tensors read from memory (graph inputs, constants, others)
    outputs: tuple[str, ...]  # sinks: always written
    optional: tuple[str, ...]  # may be written as well (the ILP decides)
    anchor: str | None = None  # the matmul / conv / pool node, or a reduction
    space: tuple[int, ...] = ()  # iteration space: output shape, or the reduced input

    @property
    def size(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class Rejection:
    reason: str

    def __bool__(self) -> bool:
        return False


def reduce_axes(n: Node) -> tuple[int, ...]:
    return (n.attrs["axis"],) if n.op in (Op.ARGMAX, Op.ARGMIN) else n.attrs["axes"]


def classify(graph: Graph, names: Iterable[str]) -> Kernel | Rejection:
    """The kernel that runs the node set ``names``, or why there is none."""
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    names = tuple(sorted(set(names), key=order.__getitem__))
    if not names:
        return Rejection("empty set")
    nodes = [graph.producer[n] for n in names]
    inside = set(names)
    reason = convexity(graph, inside)
    if reason:
        return Rejection(reason)
    consumers = graph.consumers
    outputs_of_graph = set(graph.outputs)
    sinks = tuple(
        n.name
        for n in nodes
        if n.name in outputs_of_graph
        or not any(c.name in inside for c in consumers.get(n.name, ()))
    )
    exposed = tuple(
        n.name
        for n in nodes
        if n.name not in sinks
        and (
            n.name in outputs_of_graph
            or any(c.name not in inside for c in consumers.get(n.name, ()))
        )
    )
    inputs = tuple(dict.fromkeys(i for n in nodes for i in n.inputs if i not in inside))
    anchors = [n for n in nodes if n.op in ANCHORS]
    reductions = [n for n in nodes if n.op in ROW_REDUCTIONS]
    if len(anchors) == 2 and all(a.op is Op.MATMUL for a in anchors):
        # two matmuls: only the attention rule's template holds them (one hook)
        from orchestrate.kernels.attention import attention_legality

        return attention_legality(graph, names)
    if len(anchors) > 1:
        return Rejection(f"two compute anchors ({anchors[0].name}, {anchors[1].name})")
    if anchors and reductions:
        return Rejection(f"a reduction ({reductions[0].name}) cannot join a {anchors[0].op.value}")
    if all(n.op is Op.RESHAPE for n in nodes) and len(sinks) == 1 and not exposed:
        return Kernel(VIEW, names, inputs, sinks, (), None, graph.types[sinks[0]].shape)
    if anchors:
        return _anchored(graph, nodes, inside, inputs, sinks, exposed, anchors[0])
    if reductions:
        return _row_reduce(graph, nodes, inside, inputs, sinks, exposed, reductions)
    return _pointwise(graph, nodes, inputs, sinks, exposed)


def convexity(graph: Graph, inside: set[str]) -> str | None:
    """A set is convex when no path leaves it and comes back."""
    consumers = graph.consumers
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    last = max(order[n] for n in inside)
    frontier = [c.name for n in inside for c in consumers.get(n, ()) if c.name not in inside]
    seen: set[str] = set()
    while frontier:
        v = frontier.pop()
        if v in seen or order[v] > last:
            continue
        seen.add(v)
        for c in consumers.get(v, ()):
            if c.name in inside:
                return f"not convex: {v} leaves the set and feeds {c.name} back into it"
            frontier.append(c.name)
    return None


def _pointwise(graph, nodes, inputs, sinks, exposed) -> Kernel | Rejection:
    for n in nodes:
        if n.op not in POINTWISE_OPS:
            return Rejection(f"{n.name} ({n.op.value}) is not pointwise")
    shape = graph.types[sinks[0]].shape
    for s in sinks[1:]:
        if graph.types[s].shape != shape:
            return Rejection(
                f"outputs {sinks[0]} {list(shape)} and {s} {list(graph.types[s].shape)} "
                "have different shapes"
            )
    aligned = _aligned(graph, nodes, shape)
    optional = tuple(e for e in exposed if e in aligned)
    return Kernel(POINTWISE, tuple(n.name for n in nodes), inputs, sinks, optional, None, shape)


def _aligned(graph: Graph, nodes: list[Node], shape: tuple[int, ...]) -> set[str]:
    """Nodes evaluated exactly once per iteration point (identity index map):
    elementwise nodes of the iteration shape whose in-set consumers are too."""
    names = {n.name for n in nodes}
    aligned: set[str] = set()
    for n in reversed(nodes):
        if n.shape != shape or n.op not in ir.ELEMENTWISE | {Op.IDENTITY}:
            continue
        users = [c for c in graph.consumers.get(n.name, ()) if c.name in names]
        if all(c.name in aligned for c in users):
            aligned.add(n.name)
    return aligned


def _row_reduce(graph, nodes, inside, inputs, sinks, exposed, reductions) -> Kernel | Rejection:
    first = reductions[0]
    x_shape = graph.types[first.inputs[0]].shape
    axes = reduce_axes(first)
    for r in reductions[1:]:
        if graph.types[r.inputs[0]].shape != x_shape or reduce_axes(r) != axes:
            return Rejection(
                f"reductions {first.name} and {r.name} run over different rows "
                f"({list(x_shape)} axes {list(axes)} vs "
                f"{list(graph.types[r.inputs[0]].shape)} axes {list(reduce_axes(r))})"
            )
    rows = math.prod(d for i, d in enumerate(x_shape) if i not in axes)
    keep = tuple(1 if i in axes else d for i, d in enumerate(x_shape))
    # each node lives in the full space (x_shape, per element) or the row space
    row_space: set[str] = set()
    for n in nodes:
        ins_inside = [i for i in n.inputs if i in inside]
        if n.op in ROW_REDUCTIONS:
            if any(i in row_space for i in ins_inside):
                return Rejection(f"{n.name} reduces a row-level value")
            row_space.add(n.name)
            continue
        if n.op not in POINTWISE_OPS:
            return Rejection(f"{n.name} ({n.op.value}) cannot run in a row-reduce kernel")
        from_rows = [i for i in ins_inside if i in row_space]
        from_full = [i for i in ins_inside if i not in row_space]
        if from_rows and not from_full and math.prod(n.shape) == rows:
            if n.op not in ir.ELEMENTWISE | {Op.RESHAPE, Op.IDENTITY}:
                return Rejection(f"{n.name} ({n.op.value}) cannot run on row values")
            row_space.add(n.name)
            continue
        if n.shape != x_shape:
            return Rejection(
                f"{n.name} {list(n.shape)} is neither a row value nor shaped like the "
                f"reduced input {list(x_shape)}"
            )
        for i in from_rows:
            if graph.types[i].shape != keep:
                return Rejection(f"{n.name} broadcasts row value {i} that is not in keepdims form")
            if n.op not in ir.ELEMENTWISE:
                return Rejection(f"{n.name} ({n.op.value}) reads a row value through layout")
    for r in reductions:
        src = r.inputs[0]
        if src in inside and src in row_space:
            return Rejection(f"{r.name} reduces a row-level value")
    optional = tuple(
        e for e in exposed
        if (e in row_space and graph.types[e].size == rows)
        or (e not in row_space and graph.types[e].shape == x_shape)
    )  # fmt: skip
    names = tuple(n.name for n in nodes)
    return Kernel(ROW_REDUCE, names, inputs, sinks, optional, first.name, x_shape)


def _anchored(graph, nodes, inside, inputs, sinks, exposed, anchor) -> Kernel | Rejection:
    downstream = descendants_within(graph, anchor.name, inside)
    upstream = ancestors_within(graph, anchor.name, inside)
    template = {Op.MATMUL: MATMUL, Op.CONV: CONV, Op.POOL: WINDOW}[anchor.op]
    for n in nodes:
        if n.name == anchor.name:
            continue
        if n.name in downstream:
            if n.op not in EPILOGUE_OPS:
                return Rejection(f"{n.name} ({n.op.value}) cannot run in a {template} epilogue")
            if n.shape != anchor.shape:
                return Rejection(
                    f"{n.name} {list(n.shape)} is not aligned with {anchor.name} "
                    f"{list(anchor.shape)}"
                )
            for i in n.inputs:
                if i in inside and i not in downstream and i != anchor.name:
                    return Rejection(f"{n.name} mixes the epilogue with prologue value {i}")
        else:
            if template == CONV:
                return Rejection(f"{n.name} ({n.op.value}): conv kernels take no prologue")
            if n.op not in POINTWISE_OPS:
                return Rejection(f"{n.name} ({n.op.value}) cannot run in a {template} prologue")
            if n.name not in upstream:
                return Rejection(f"{n.name} neither feeds nor follows {anchor.name}")
            if n.name in sinks or n.name in exposed:
                return Rejection(f"prologue value {n.name} is needed outside the kernel")
    if any(s not in downstream and s != anchor.name for s in sinks):
        bad = next(s for s in sinks if s not in downstream and s != anchor.name)
        return Rejection(f"{bad} does not flow into {anchor.name}")
    optional = tuple(e for e in exposed if e in downstream or e == anchor.name)
    names = tuple(n.name for n in nodes)
    return Kernel(template, names, inputs, sinks, optional, anchor.name, anchor.shape)


def ancestors_within(graph: Graph, start: str, inside: set[str]) -> set[str]:
    """Nodes of ``inside`` that ``start`` depends on (not ``start`` itself)."""
    out: set[str] = set()
    stack = [start]
    while stack:
        for i in graph.producer[stack.pop()].inputs:
            if i in inside and i not in out:
                out.add(i)
                stack.append(i)
    return out


def descendants_within(graph: Graph, start: str, inside: set[str]) -> set[str]:
    """Nodes of ``inside`` that depend on ``start`` (not ``start`` itself)."""
    out: set[str] = set()
    stack = [start]
    while stack:
        for c in graph.consumers.get(stack.pop(), ()):
            if c.name in inside and c.name not in out:
                out.add(c.name)
                stack.append(c.name)
    return out
