"""The plan checker: every tensor written before it is read and written
once, outputs produced, no cycle between kernels.

``schedule`` orders chosen kernels (or reports the ones stuck in a cycle);
``check_plan`` validates a finished plan against its primitive graph and is
run on every plan the planner returns.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from orchestrate.errors import GraphError
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec
from orchestrate.plan import PlannedKernel


def schedule(
    kernels: Sequence[KernelSpec],
    writes: Sequence[Sequence[str]],
    available: set[str],
    key: Callable[[int], object] | None = None,
) -> tuple[list[int], list[int]]:
    """An execution order of ``kernels``: (order, stuck).  ``stuck`` lists the
    kernels that can never run because they wait on each other (a cycle)."""
    key = key or (lambda i: i)
    writer: dict[str, list[int]] = {}
    for i, ws in enumerate(writes):
        for t in ws:
            writer.setdefault(t, []).append(i)
    waits = [0] * len(kernels)  # inputs not yet written, per kernel
    readers: dict[str, list[int]] = {}
    for i, k in enumerate(kernels):
        for t in set(k.inputs):
            if t not in available:
                waits[i] += 1
                readers.setdefault(t, []).append(i)
    # the ready kernel first in ``key`` order, as a scan of the sorted kernels would take
    ready = [(key(i), i) for i in range(len(kernels)) if waits[i] == 0]
    heapq.heapify(ready)
    written = set(available)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for t in writes[i]:
            if t in written:
                continue
            written.add(t)
            for j in readers.get(t, ()):
                waits[j] -= 1
                if waits[j] == 0:
                    heapq.heappush(ready, (key(j), j))
    done = set(order)
    return order, sorted((i for i in range(len(kernels)) if i not in done), key=key)


def check_plan(graph: Graph, kernels: Sequence[PlannedKernel]) -> None:
    """Raise GraphError unless ``kernels`` run ``graph`` correctly in the given order."""
    ready = {i.name for i in graph.inputs} | set(graph.constants)
    nodes = graph.producer
    for k in kernels:
        name = k.name
        prims = set(k.primitives)
        for p in prims:
            if p not in nodes:
                raise GraphError(f"kernel {name}: unknown primitive {p}")
        needed = {i for p in prims for i in nodes[p].inputs if i not in prims}
        if needed != set(k.inputs):
            raise GraphError(
                f"kernel {name}: declared inputs {sorted(k.inputs)} != {sorted(needed)}"
            )
        missing = sorted(t for t in needed if t not in ready)
        if missing:
            raise GraphError(f"kernel {name} reads {missing} before any kernel writes them")
        bad = sorted(t for t in k.outputs if t not in prims)
        if bad:
            raise GraphError(f"kernel {name} writes {bad}, which it does not compute")
        twice = sorted(t for t in k.outputs if t in ready)
        if twice:
            raise GraphError(f"kernel {name} writes {twice}, which an earlier kernel wrote")
        ready.update(k.outputs)
    lost = sorted(o for o in graph.outputs if o not in ready)
    if lost:
        raise GraphError(f"graph outputs {lost} are never written")
