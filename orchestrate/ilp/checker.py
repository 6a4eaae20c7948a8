"""The plan checker: every tensor written before it is read and written
once, outputs produced, no cycle between kernels.

``schedule`` orders chosen kernels (or reports the ones stuck in a cycle);
``check_plan`` validates a finished plan against its primitive graph and is
run on every plan the planner returns.
"""

from __future__ import annotations

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
    ready = set(available)
    pending = sorted(range(len(kernels)), key=key)
    order: list[int] = []
    progress = True
    while pending and progress:
        progress = False
        for i in pending:
            if all(t in ready for t in kernels[i].inputs):
                order.append(i)
                ready.update(writes[i])
                pending.remove(i)
                progress = True
                break
    return order, pending


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
