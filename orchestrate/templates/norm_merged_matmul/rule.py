"""The composed rule: a norm moved past the sibling matmuls it feeds, one launch.

A Llama-style block normalises its residual stream once and multiplies the
result by several weights (the Q, K, V projections; the gate and up
projections):

    n   = norm(x)                 RMSNorm or LayerNorm over the last axis
    Y_i = MATMUL(n, W_i)          two or more, W_i constant [K, N_i]
    Z_i = elementwise(Y_i, ...)   optionally, each sibling's own epilogue

``merged_matmul`` (``templates/merged_matmul/rule.py``) takes no prologue, and
``norm_matmul`` (``templates/norm_matmul/rule.py``) moves a norm past one matmul,
so without this rule the norm stays a row-reduce kernel writing n (M x K)
that the merged kernel reads back.  The replacement is the merged kernel
whose shared K loop does what norm_matmul's does: raw x tiles, each row's
running statistics, the A tile times gamma, and per shift of n the column
vector h_j @ W_i of the program's own segment; after the loop the row
factors scale the accumulator and the shifts are added, then the segment's
epilogue and stores (``templates/norm_merged_matmul/emit.py``).

The analysis is the two rules' own: ``norm_matmul.analyse`` reads n as
scale * x + shifts from the norm's nodes and the first sibling, and
``siblings.analyse`` splits the rest into segments with n as their
activation; each declines with its own reason.  This rule adds one: a norm
value that must be written (a graph output: the kernel never writes n or
its statistics).
The roles are a ``Siblings`` whose ``prologue`` holds the norm's nodes, so
the exact checker evaluates them before the merged matmul, and per segment
the ``NormMatmul`` the norm_matmul fit and cost models read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrate.ir import Graph, Op
from orchestrate.kernels import config, fit
from orchestrate.kernels.region import Region, ancestors_within, region
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import (
    NORM_MERGED_MATMUL,
    KernelSpec,
    Rejection,
    Segment,
    Siblings,
    Target,
)
from orchestrate.templates.merged_matmul import rule as siblings
from orchestrate.templates.norm_matmul import rule as norm_matmul
from orchestrate.templates.norm_matmul.rule import Linear, Monomial, NormMatmul


@dataclass(frozen=True)
class NormSiblings(Siblings):
    """Merged siblings whose activation is a norm computed in the kernel
    (``prologue``: the norm's nodes, graph order); the other fields as
    ``NormMatmul``'s, shared by every segment."""

    x: str = ""  # the tensor normalised, rows of K
    feed: tuple[str, ...] = ()  # nodes computing x from memory
    rows: tuple[str, ...] = ()  # the sums and the row values computed from them
    sums: tuple[tuple[str, tuple[Linear, ...]], ...] = ()  # each sum's input: L or L * L'
    scale: Monomial = (1.0, (), ())  # n = scale * x + sum(shifts)
    shifts: tuple[Monomial, ...] = ()

    def segment_roles(self, g: Segment) -> NormMatmul:
        return NormMatmul(
            g.anchor,
            self.prologue,
            g.epilogue,
            self.x,
            self.feed,
            self.rows,
            self.sums,
            self.scale,
            self.shifts,
        )


def _judges(graph: Graph, r: Region) -> bool:
    mms = [a for a in r.anchors if a.op is Op.MATMUL]
    return (
        len(mms) >= 2
        and len(mms) == len(r.anchors)
        and bool(r.reductions)
        and len({a.inputs[0] for a in mms}) == 1
    )


def norm_merged_matmul(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    """One merged matmul kernel with the norm moved past its dots, or why not."""
    found = analyse(graph, r)
    if isinstance(found, Rejection):
        return found
    x = graph.types[found.activation]
    *batch, m, _ = graph.producer[found.anchor].shape
    widest = max(g.stop - g.start for g in found.segments)
    # no split-K (sms 0): every program walks whole rows for their statistics
    configs = config.matmul(m, widest, x.shape[-1], x.dtype, target.tf32, math.prod(batch), 0)
    total = found.segments[-1].stop
    optional = tuple(
        e for e in r.exposed if any(e == g.anchor or e in g.epilogue for g in found.segments)
    )
    return accept(graph, RULE, r, (*batch, m, total), found, optional, configs, target)


def analyse(graph: Graph, r: Region) -> NormSiblings | Rejection:
    """The norm (as norm_matmul reads it) and the segments (as merged_matmul
    reads them), or the first reason either declines."""
    n = r.anchors[0].inputs[0]
    if n not in r.inside:
        return Rejection(f"the shared activation {n} is not computed in the set")
    norm = ancestors_within(graph, n, r.inside) | {n}
    kept = next((t for t in r.names if t in norm and t in r.sinks), None)
    if kept is not None:
        return Rejection(
            f"{kept} must be written, but the kernel never forms it "
            "(only the matmuls and their epilogues are stored)"
        )
    first = region(graph, norm | {r.anchors[0].name})
    if isinstance(first, Rejection):
        return first
    found = norm_matmul.analyse(graph, first)
    if isinstance(found, Rejection):
        return found
    rest = region(graph, [t for t in r.names if t not in norm])
    if isinstance(rest, Rejection):
        return rest
    merged = siblings.analyse(graph, rest)
    if isinstance(merged, Rejection):
        return merged
    return NormSiblings(
        merged.activation,
        merged.segments,
        found.prologue,
        found.x,
        found.feed,
        found.rows,
        found.sums,
        found.scale,
        found.shifts,
    )


# -- the pattern -------------------------------------------------------------------


def propose(graph: Graph, nodes: Sequence[str]) -> list[tuple[str, ...]]:
    """Each merged-siblings set (``siblings.propose``) whose activation is a
    norm (as ``norm_matmul`` finds one), with the norm's nodes, and with the
    norm less x's own prologue (a residual add another kernel may write)."""
    allowed = set(nodes)
    out: list[tuple[str, ...]] = []
    order = graph.position.__getitem__
    for names in siblings.propose(graph, nodes):
        mms = [graph.producer[t] for t in names if graph.producer[t].op is Op.MATMUL]
        n = mms[0].inputs[0]
        if n not in allowed:
            continue
        norm = norm_matmul._norm_of(graph, n, allowed)
        if norm is None:
            continue
        cores = [norm]
        r = region(graph, norm | {mms[0].name})
        found = r if isinstance(r, Rejection) else norm_matmul.analyse(graph, r)
        if isinstance(found, NormMatmul) and found.feed:
            cores.append(norm - set(found.feed))
        for core in cores:
            out.append(tuple(sorted(core | set(names), key=order)))
    return out


RULE = Rule(
    NORM_MERGED_MATMUL,
    "RMSNorm / LayerNorm moved past the sibling matmuls it feeds (Q/K/V, gate/up), one launch",
    _judges,
    norm_merged_matmul,
    propose,
    working_set=fit.merged,
)
