"""The pointwise rule: elementwise and layout primitives evaluated per output
element; all outputs share one shape (the iteration space); layout ops
become index arithmetic on the loads."""

from __future__ import annotations

import math

from orchestrate import ir
from orchestrate.ir import Graph, Op
from orchestrate.kernels.region import POINTWISE_OPS, Region
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import (
    POINTWISE,
    Elementwise,
    KernelSpec,
    Rejection,
    Target,
)
from orchestrate.templates.pointwise import config as spaces


def _judges_pointwise(graph: Graph, r: Region) -> bool:
    return not r.anchors and not r.reductions


def pointwise(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    for n in r.nodes:
        if n.op not in POINTWISE_OPS:
            return Rejection(f"{n.name} ({n.op.value}) is not pointwise")
    shape = graph.types[r.sinks[0]].shape
    for s in r.sinks[1:]:
        if graph.types[s].shape != shape:
            return Rejection(
                f"outputs {r.sinks[0]} {list(shape)} and {s} {list(graph.types[s].shape)} "
                "have different shapes"
            )
    aligned = aligned_nodes(graph, r, shape)
    optional = tuple(e for e in r.exposed if e in aligned)
    configs = spaces.pointwise(math.prod(shape))
    return accept(graph, RULE, r, shape, Elementwise(), optional, configs, target)


def aligned_nodes(graph: Graph, r: Region, shape: tuple[int, ...]) -> set[str]:
    """Nodes evaluated exactly once per iteration point (identity index map):
    elementwise nodes of the iteration shape whose in-set consumers are too."""
    aligned: set[str] = set()
    for n in reversed(r.nodes):
        if n.shape != shape or n.op not in ir.ELEMENTWISE | {Op.IDENTITY}:
            continue
        users = [c for c in graph.consumers.get(n.name, ()) if c.name in r.inside]
        if all(c.name in aligned for c in users):
            aligned.add(n.name)
    return aligned


RULE = Rule(
    POINTWISE,
    "elementwise and layout primitives per output element, one shape of outputs",
    _judges_pointwise,
    pointwise,
)
