"""Anchored sets: one compute primitive with a prologue and an epilogue.

What the matmul, conv and window templates (``orchestrate/templates/``)
and the merged siblings share: ``roles`` finds the prologue around the
anchor (evaluated on operand tiles as they are loaded) and its aligned
elementwise epilogue (bias, activation, residual, scale, cast).

The epilogue runs on the anchor's result tile, element by element, so its
nodes are elementwise and shaped like the anchor; the prologue runs on
operand tiles, so nothing outside the kernel may read it.
"""

from __future__ import annotations

from orchestrate import ir
from orchestrate.ir import Graph, Node, Op
from orchestrate.kernels.region import (
    POINTWISE_OPS,
    Region,
    ancestors_within,
    descendants_within,
)
from orchestrate.kernels.spec import (
    CONV,
    Anchored,
    Rejection,
)

EPILOGUE_OPS = ir.ELEMENTWISE  # keep the anchor's element alignment


def roles(graph: Graph, r: Region, anchor: Node, template: str) -> Anchored | Rejection:
    """Prologue and epilogue around ``anchor``, or why the set has none."""
    downstream = descendants_within(graph, anchor.name, r.inside)
    upstream = ancestors_within(graph, anchor.name, r.inside)
    for n in r.nodes:
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
                if i in r.inside and i not in downstream and i != anchor.name:
                    return Rejection(f"{n.name} mixes the epilogue with prologue value {i}")
        else:
            if template == CONV:
                return Rejection(f"{n.name} ({n.op.value}): conv kernels take no prologue")
            if n.op not in POINTWISE_OPS:
                return Rejection(f"{n.name} ({n.op.value}) cannot run in a {template} prologue")
            if n.name not in upstream:
                return Rejection(f"{n.name} neither feeds nor follows {anchor.name}")
            if n.name in r.sinks or n.name in r.exposed:
                return Rejection(f"prologue value {n.name} is needed outside the kernel")
    bad = [s for s in r.sinks if s not in downstream and s != anchor.name]
    if bad:
        return Rejection(f"{bad[0]} does not flow into {anchor.name}")
    return Anchored(
        anchor.name,
        tuple(n for n in r.names if n in upstream),
        tuple(n for n in r.names if n in downstream),
    )


def optional(r: Region, roles_: Anchored) -> tuple[str, ...]:
    return tuple(e for e in r.exposed if e in roles_.epilogue or e == roles_.anchor)


def one(op: Op):
    def judges(graph: Graph, r: Region) -> bool:
        return len(r.anchors) == 1 and r.anchors[0].op is op and not r.reductions

    return judges
