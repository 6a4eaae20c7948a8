"""The scan rule: one cumulative sum over rows, with its prologue and epilogue.

The CUMSUM node's input X is viewed as rows (its positions off the scanned
axis) of ``length`` columns (the axis).  Every node of the set is evaluated
per element of X at that element's own index: the prologue (elementwise and
layout nodes feeding the scan: index arithmetic on its loads) and the
epilogue (elementwise nodes shaped like X, reading the scan's value at the
same index: ``cumsum(mask) * mask - 1``, position ids).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrate import ir
from orchestrate.ir import Graph
from orchestrate.kernels.fit import WorkingSet
from orchestrate.kernels.region import (
    POINTWISE_OPS,
    Region,
    ancestors_within,
    descendants_within,
)
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import KernelSpec, Rejection, Rows, Target
from orchestrate.templates.scan import config as spaces

SCAN = "scan"


@dataclass(frozen=True)
class Scan(Rows):
    """A scan kernel's rows: X (``x``) scanned along ``axes`` (one axis),
    ``rows`` rows of ``length``; the scan is ``reductions[0]``, no node is
    in row space; ``looped``: the row is scanned in column blocks, carrying
    each row's running sum from block to block."""


def _judges(graph: Graph, r: Region) -> bool:
    return not r.anchors and not r.reductions and sum(n.op in ir.SCAN for n in r.nodes) == 1


def scan(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    """The scan kernel running the set, or why it cannot."""
    c = next(n for n in r.nodes if n.op in ir.SCAN)
    x = graph.types[c.inputs[0]].shape
    axis = c.attrs["axis"]
    after = descendants_within(graph, c.name, r.inside)
    before = ancestors_within(graph, c.name, r.inside)
    for n in r.nodes:
        if n is c:
            continue
        if n.name in after:
            if n.op not in ir.ELEMENTWISE:
                return Rejection(f"{n.name} ({n.op.value}) cannot run after a scan")
            if n.shape != x:
                return Rejection(f"{n.name} {list(n.shape)} is not aligned with {c.name} {list(x)}")
        elif n.name in before:
            if n.op not in POINTWISE_OPS:
                return Rejection(f"{n.name} ({n.op.value}) cannot run before a scan")
            if n.name in r.sinks or n.name in r.exposed:
                return Rejection(f"prologue value {n.name} is needed outside the kernel")
        else:
            return Rejection(f"{n.name} neither feeds nor follows {c.name}")
    rows = math.prod(d for i, d in enumerate(x) if i != axis)
    length = x[axis]
    looped = length > spaces.SINGLE_PASS_ROW
    roles = Scan(x, (axis,), rows, length, (c.name,), frozenset(), ((c.name, 1),), 1, looped)
    optional = tuple(e for e in r.exposed if e in after or e == c.name)
    configs = spaces.scan(rows, length, looped)
    return accept(graph, RULE, r, x, roles, optional, configs, target)


def working_set(graph: Graph, spec: KernelSpec) -> WorkingSet:
    """Shared memory: ``tl.cumsum`` across the warps along a row exchanges one
    fp32 partial per element of the block, and the row total once more."""
    c = spec.config
    return WorkingSet(4 * c["BLOCK_ROWS"] * (c["BLOCK_COLS"] + 1), False)


RULE = Rule(
    SCAN,
    "a cumulative sum over rows with its prologue and an aligned epilogue",
    _judges,
    scan,
    working_set=working_set,
    covering=("BLOCK_COLS",),
)
