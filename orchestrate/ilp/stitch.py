"""Kernels fused back across the cuts made for size.

A span of the graph with no natural cut is planned in pieces of at most
``Limits.partition_nodes`` primitives (``ilp.partition``), so that planning
time grows with the graph.  Each piece is solved optimally, but a fusion
across a piece boundary is one no linear program saw: a long elementwise
chain would become one kernel per piece.  ``stitch`` recovers those: it
merges a producer kernel with a consumer kernel of another piece of the same
span, greedily, largest predicted saving first, while one rule runs both as
one kernel, the merged kernel can write everything other kernels still read
from it, it saves predicted time, and no cycle between kernels is closed.
Pairs are taken by the bytes passed between them and priced when taken, so
that the work grows with the merges, not with the pairs times the size of
the kernels; at most ``TRIES_PER_KERNEL`` pairs per kernel of the plan are
priced.  It never recomputes more
than the plan already did.  The result is reported (``Stitched``), since it
is the one step of planning that is greedy.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrate.cost.roofline import Prices
from orchestrate.ilp.checker import schedule
from orchestrate.ilp.partition import Partition
from orchestrate.ir import Graph
from orchestrate.kernels.spec import VIEW, KernelSpec, Rejection, Target
from orchestrate.templates import match

Chosen = list[tuple[KernelSpec, tuple[str, ...], int]]  # spec, writes, partition index
TRIES_PER_KERNEL = 4


@dataclass(frozen=True)
class Stitched:
    merges: int  # kernel pairs merged across piece boundaries
    saved_us: float  # predicted time they saved


def stitch(
    graph: Graph, chosen: Chosen, parts: Sequence[Partition], target: Target, prices: Prices
) -> tuple[Chosen, Stitched]:
    """``chosen`` with kernels merged across the size cuts between ``parts``,
    in execution order."""
    span = {p.index: p.span for p in parts}
    if len(set(span.values())) == len(span):
        return list(chosen), Stitched(0, 0.0)  # no span was cut for size
    available = {i.name for i in graph.inputs} | set(graph.constants)
    alive = dict(enumerate(chosen))
    origin = {i: frozenset({part}) for i, (_, _, part) in alive.items()}
    readers: dict[str, set[int]] = {}
    writer: dict[str, int] = {}
    for i, (spec, writes, _) in alive.items():
        for t in spec.inputs:
            readers.setdefault(t, set()).add(i)
        for t in writes:
            writer[t] = i
    order, _ = schedule([k[0] for k in chosen], [k[1] for k in chosen], available)
    rank = {i: r for r, i in enumerate(order)}  # a topological order of the kernels alive
    ids = itertools.count(len(chosen))
    heap: list[tuple[float, int, int, int]] = []
    tie = itertools.count()

    def time_us(k) -> float:
        return prices.price(k[0], k[1]).time_us

    def merged(a: int, b: int):
        """The kernel running a and b together, writing what others read from them."""
        (sa, wa, pa), (sb, wb, _) = alive[a], alive[b]
        spec = match(graph, dict.fromkeys(sa.nodes + sb.nodes), target)
        if isinstance(spec, Rejection):
            return None
        keep = [
            t
            for t in dict.fromkeys(wa + wb)
            if t in graph.outputs or any(r not in (a, b) for r in readers.get(t, ()))
        ]
        if any(t not in spec.outputs and t not in spec.optional for t in keep):
            return None
        writes = spec.outputs + tuple(t for t in keep if t not in spec.outputs)
        if any(writer.get(t, a) not in (a, b) for t in writes):
            return None  # a value another kernel stores (it recomputes it)
        return spec, writes, pa

    def saving(a: int, b: int, m) -> float:
        return time_us(alive[a]) + time_us(alive[b]) - time_us(m)

    def push(i: int) -> None:
        """Queue i with each kernel it feeds and each kernel that feeds it,
        the pairs that pass between them the most bytes first (the exact
        saving is priced when a pair is taken)."""
        spec, writes, _ = alive[i]
        pairs = {(i, j) for t in writes for j in readers.get(t, ())}
        pairs |= {(writer[t], i) for t in spec.inputs if t in writer}
        for a, b in sorted(pairs):
            if VIEW in (alive[a][0].template, alive[b][0].template):
                continue
            if span[alive[a][2]] != span[alive[b][2]] or len(origin[a] | origin[b]) < 2:
                continue  # another span, or one piece whose linear program saw this
            passed = sum(graph.types[t].nbytes for t in alive[a][1] if b in readers.get(t, ()))
            heapq.heappush(heap, (-passed, next(tie), a, b))

    def between(a: int, b: int) -> bool:
        """Is there a path a -> third kernel -> ... -> b?"""
        stack, seen = [a], {a}
        while stack:
            k = stack.pop()
            for t in alive[k][1]:
                for r in readers.get(t, ()):
                    if r == b:
                        if k != a:
                            return True
                    elif r not in seen and rank[r] < rank[b]:
                        seen.add(r)
                        stack.append(r)
        return False

    for i in sorted(alive):
        push(i)
    merges, saved, tries = 0, 0.0, TRIES_PER_KERNEL * len(chosen)
    while heap and tries:
        _, _, a, b = heapq.heappop(heap)
        if a not in alive or b not in alive:
            continue
        tries -= 1
        m = merged(a, b)
        gain = saving(a, b, m) if m is not None else 0.0
        if gain <= 1e-9 or between(a, b):
            continue
        merges, saved = merges + 1, saved + gain
        c = next(ids)
        for k in (a, b):
            spec, writes, _ = alive.pop(k)
            for t in spec.inputs:
                readers[t].discard(k)
            for t in writes:
                writer.pop(t, None)
        alive[c], origin[c] = m, origin.pop(a) | origin.pop(b)
        for t in m[0].inputs:
            readers.setdefault(t, set()).add(c)
        for t in m[1]:
            writer[t] = c
        keys = sorted(alive)
        order, _ = schedule([alive[k][0] for k in keys], [alive[k][1] for k in keys], available)
        rank = {keys[i]: r for r, i in enumerate(order)}
        push(c)
    keys = sorted(alive, key=rank.__getitem__)
    return [alive[k] for k in keys], Stitched(merges, round(saved, 4))
