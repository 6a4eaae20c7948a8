"""A set of primitives seen as one would-be kernel: what every rule asks first.

``region(graph, names)`` orders the set, checks that it is convex (no path
leaves it and comes back: such a set can never be one kernel) and works out
its boundary once, for all the rules:

* ``inputs``: tensors read from outside (graph inputs, constants, others);
* ``sinks``: nodes with no reader inside (always written);
* ``exposed``: other nodes read outside or graph outputs (the rule says
  whether its template can also write them: the ``optional`` outputs).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrate import ir
from orchestrate.ir import Graph, Node, Op
from orchestrate.kernels.spec import Rejection

ANCHORS = frozenset({Op.MATMUL, Op.CONV, Op.POOL})
ROW_REDUCTIONS = frozenset({Op.SUM, Op.RMAX, Op.RMIN, Op.PROD, Op.ARGMAX, Op.ARGMIN})
POINTWISE_OPS = ir.ELEMENTWISE | ir.LAYOUT


@dataclass(frozen=True)
class Region:
    names: tuple[str, ...]  # in graph order
    nodes: tuple[Node, ...]
    inside: frozenset[str]
    inputs: tuple[str, ...]
    sinks: tuple[str, ...]
    exposed: tuple[str, ...]
    anchors: tuple[Node, ...]  # matmul / conv / pool nodes
    reductions: tuple[Node, ...]


def region(graph: Graph, names: Iterable[str]) -> Region | Rejection:
    names = tuple(sorted(set(names), key=graph.position.__getitem__))
    if not names:
        return Rejection("empty set")
    inside = frozenset(names)
    reason = convexity(graph, inside)
    if reason is not None:
        return Rejection(reason)
    nodes = tuple(graph.producer[n] for n in names)
    consumers = graph.consumers
    outputs_of_graph = set(graph.outputs)

    def read_outside(n: str) -> bool:
        return any(c.name not in inside for c in consumers.get(n, ()))

    sinks = tuple(
        n
        for n in names
        if n in outputs_of_graph or not any(c.name in inside for c in consumers.get(n, ()))
    )
    exposed = tuple(
        n for n in names if n not in sinks and (n in outputs_of_graph or read_outside(n))
    )
    inputs = tuple(dict.fromkeys(i for n in nodes for i in n.inputs if i not in inside))
    return Region(
        names,
        nodes,
        inside,
        inputs,
        sinks,
        exposed,
        tuple(n for n in nodes if n.op in ANCHORS),
        tuple(n for n in nodes if n.op in ROW_REDUCTIONS),
    )


def convexity(graph: Graph, inside: frozenset[str] | set[str]) -> str | None:
    """Why ``inside`` is not convex (a path leaves it and comes back), or None.
    The set is walked in graph order, so the path named is the same in every
    run (a set's own order follows the process's string hashing)."""
    consumers = graph.consumers
    order = graph.position
    members = sorted(inside, key=order.__getitem__)
    last = order[members[-1]]
    frontier = [c.name for n in members for c in consumers.get(n, ()) if c.name not in inside]
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


@dataclass(frozen=True)
class ConvexSets:
    """Convexity of subsets of a fixed list of nodes (``convex_sets``), each
    subset given as a bit mask over that list: worked out once over the
    graph, then a test costs a few integer operations per member of the set.
    A set is not convex when one of its members feeds a node outside it
    from which one of its members is reached."""

    # per member: the members reached from its consumers outside the list
    beyond: tuple[int, ...]
    # per member: (its consumer in the list as a bit, the members reached from it)
    within: tuple[tuple[tuple[int, int], ...], ...]

    def convex(self, mask: int) -> bool:
        """Whether the members at the set bits of ``mask`` form a convex
        set (as ``convexity`` says of their names)."""
        rest = mask
        while rest:
            low = rest & -rest
            rest ^= low
            i = low.bit_length() - 1
            if self.beyond[i] & mask:
                return False
            for bit, reached in self.within[i]:
                if not bit & mask and reached & mask:
                    return False
        return True


def convex_sets(graph: Graph, members: Sequence[str]) -> ConvexSets:
    """The convexity test of subsets of ``members`` (distinct nodes of
    ``graph``).  A path that leaves a set and comes back runs between its
    first and last member in graph order, so only the nodes there are
    walked, once, in reverse order: each gets the members reachable from it."""
    if not members:
        return ConvexSets((), ())
    index = {n: i for i, n in enumerate(members)}
    position = graph.position
    consumers = graph.consumers
    first = min(position[n] for n in members)
    last = max(position[n] for n in members)
    reached: dict[str, int] = {}  # node -> the members reachable from it (not itself)
    for n in reversed(graph.nodes[first : last + 1]):
        mask = 0
        for c in consumers.get(n.name, ()):
            if position[c.name] <= last:
                j = index.get(c.name)
                mask |= reached[c.name] | (0 if j is None else 1 << j)
        reached[n.name] = mask
    beyond = []
    within = []
    for n in members:
        out = 0
        inner = []
        for c in consumers.get(n, ()):
            if position[c.name] > last:
                continue
            j = index.get(c.name)
            if j is None:
                out |= reached[c.name]
            else:
                inner.append((1 << j, reached[c.name]))
        beyond.append(out)
        within.append(tuple(inner))
    return ConvexSets(tuple(beyond), tuple(within))


def reduce_axes(n: Node) -> tuple[int, ...]:
    return (n.attrs["axis"],) if n.op in (Op.ARGMAX, Op.ARGMIN) else n.attrs["axes"]


def ancestors_within(graph: Graph, start: str, inside: Iterable[str]) -> set[str]:
    """Nodes of ``inside`` that ``start`` depends on (not ``start`` itself)."""
    inside = set(inside)
    out: set[str] = set()
    stack = [start]
    while stack:
        for i in graph.producer[stack.pop()].inputs:
            if i in inside and i not in out:
                out.add(i)
                stack.append(i)
    return out


def descendants_within(graph: Graph, start: str, inside: Iterable[str]) -> set[str]:
    """Nodes of ``inside`` that depend on ``start`` (not ``start`` itself)."""
    inside = set(inside)
    out: set[str] = set()
    stack = [start]
    while stack:
        for c in graph.consumers.get(stack.pop(), ()):
            if c.name in inside and c.name not in out:
                out.add(c.name)
                stack.append(c.name)
    return out
