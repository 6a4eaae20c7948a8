"""The merged-siblings rule: matmuls that read one activation, as one launch.

A transformer multiplies the same activation by several weights: the Q, K
and V projections of attention, the gate and up projections of a gated MLP.
As separate kernels each launches its own grid, often a fraction of the
GPU's SMs, and reads the activation again.  The pattern:

    Y_i = MATMUL(X, W_i)          two or more, X the same tensor, W_i constant [K, N_i]
    Z_i = elementwise(Y_i, ...)   optionally, each sibling's own epilogue (a bias add)

The replacement is one kernel computing ``X @ concat(W_0, W_1, ...)`` whose
epilogue writes each column range, through that sibling's own epilogue, to
that sibling's tensors: the split is folded into the kernel, the consumers
are unchanged.  The original primitives stay; the linear program picks the
merged kernel or the separate ones by cost.

How the weights are concatenated: by the launch, not in memory.  The grid
holds every sibling's output tiles, segment after segment; a program finds
its segment from its program id and walks that sibling's own weight and
bias (``templates/merged_matmul/emit.py``).  Concatenating the constants instead would put
a derived constant in the plan that a bundle cannot regenerate from its
weights (``regenerate.py`` rebuilds kernels from plan.json and the model's
own constants); the grouped launch is as fast (the same tiles, one launch,
the activation shared through L2) and copies nothing.  The spec's roles
(``Siblings``) still record the columns [start, stop) each weight takes in
the concatenation, which is what the exact checker evaluates
(``exact/check.py``: one matmul over the concatenated weights, then the
split), so a wrong split in the roles is caught.

``propose`` offers, per partition and per group of matmuls sharing their
first operand, the matmuls alone and the matmuls with their epilogues; the
check declines, with the reason, a weight that is not a constant, a weight
with batch dimensions, dtypes or K that differ, an epilogue that reads two
siblings, and tiles that do not fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrate import ir
from orchestrate.ir import Graph, Node, Op
from orchestrate.kernels import config, fit
from orchestrate.kernels.anchored import roles as anchored_roles
from orchestrate.kernels.region import Region, ancestors_within, descendants_within, region
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import (
    MATMUL,
    MERGED_MATMUL,
    KernelSpec,
    Rejection,
    Segment,
    Siblings,
    Target,
)

DOT_DTYPES = ("float16", "bfloat16", "float32")
MAX_BATCH = 65535  # the batch runs on grid axis 1
WIDE = 2**31  # offsets are int32


def _judges(graph: Graph, r: Region) -> bool:
    return (
        len(r.anchors) >= 2
        and all(a.op is Op.MATMUL for a in r.anchors)
        and len({a.inputs[0] for a in r.anchors}) == 1
    )


def merged_matmul(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    """One matmul kernel over the siblings' weights, or why not."""
    found = analyse(graph, r)
    if isinstance(found, Rejection):
        return found
    x = graph.types[found.activation]
    first = graph.producer[found.anchor]
    *batch, m, _ = first.shape
    widest = max(g.stop - g.start for g in found.segments)
    # no split-K (sms 0): the merged grid is what fills the SMs
    configs = config.matmul(m, widest, x.shape[-1], x.dtype, target.tf32, math.prod(batch), 0)
    total = found.segments[-1].stop
    optional = tuple(
        e for e in r.exposed if any(e == g.anchor or e in g.epilogue for g in found.segments)
    )
    return accept(graph, RULE, r, (*batch, m, total), found, optional, configs, target)


def analyse(graph: Graph, r: Region) -> Siblings | Rejection:
    """The segments of the set (siblings in graph order), or why it is none."""
    anchors = r.anchors
    x = anchors[0].inputs[0]
    if x in r.inside:
        return Rejection(
            f"the shared activation {x} is computed in the set (merged matmuls take no prologue)"
        )
    xt = graph.types[x]
    if xt.dtype not in DOT_DTYPES:
        return Rejection(f"{x} is {xt.dtype}: merged matmuls run float16 / bfloat16 / float32")
    segments, start = [], 0
    for a in anchors:
        reason = _check_weight(graph, a, xt, r)
        if reason:
            return Rejection(reason)
        sub = region(graph, [a.name, *_own(graph, a, r)])
        if isinstance(sub, Rejection):
            return sub
        found = anchored_roles(graph, sub, a, MATMUL)
        if isinstance(found, Rejection):
            return found
        if found.prologue:
            return Rejection(f"{found.prologue[0]} feeds {a.name}: merged matmuls take no prologue")
        n = a.shape[-1]
        segments.append(Segment(a.name, a.inputs[1], start, start + n, found.epilogue))
        start += n
    claimed = {n for g in segments for n in (g.anchor, *g.epilogue)}
    stray = next((n for n in r.names if n not in claimed), None)
    if stray is not None:
        return Rejection(_stray(graph, stray, anchors, r))
    big = next((t for t in (*r.inputs, *r.names) if graph.types[t].size >= WIDE), None)
    if big is not None:
        return Rejection(f"{big} has 2**31 elements or more (int32 offsets)")
    if math.prod(anchors[0].shape[:-2]) > MAX_BATCH:
        return Rejection(f"batch of {math.prod(anchors[0].shape[:-2])} exceeds grid axis 1")
    return Siblings(x, tuple(segments))


def _check_weight(graph: Graph, a: Node, xt: ir.TensorType, r: Region) -> str | None:
    w = a.inputs[1]
    wt = graph.types[w]
    if w in r.inside:
        return f"{a.name}'s weight {w} is computed in the set (merged matmuls take no prologue)"
    if w not in graph.constants:
        return f"{a.name}'s second operand {w} is not a constant weight"
    if len(wt.shape) != 2:
        return (
            f"{a.name}'s weight {w} {list(wt.shape)} has batch dimensions "
            "(merged matmuls take [K, N] weights)"
        )
    if wt.shape[0] != xt.shape[-1]:
        return f"{a.name}'s weight {w} has K = {wt.shape[0]}, the activation {xt.shape[-1]}"
    if wt.dtype != xt.dtype:
        return f"{a.name}'s weight {w} is {wt.dtype}, the activation {xt.dtype}"
    return None


def _own(graph: Graph, a: Node, r: Region) -> list[str]:
    """The set's nodes downstream of sibling ``a`` and of no other sibling."""
    mine = descendants_within(graph, a.name, r.inside)
    others = set().union(
        *(descendants_within(graph, b.name, r.inside) for b in r.anchors if b is not a)
    )
    return [n for n in r.names if n in mine and n not in others]


def _stray(graph: Graph, n: str, anchors: Sequence[Node], r: Region) -> str:
    """Why ``n`` belongs to no sibling's epilogue."""
    up = ancestors_within(graph, n, r.inside)
    reads = [a.name for a in anchors if a.name in up]
    if len(reads) > 1:
        return f"{n} reads two siblings ({reads[0]}, {reads[1]}): each epilogue reads its own"
    return f"{n} ({graph.producer[n].op.value}) follows none of the siblings"


# -- the pattern -------------------------------------------------------------------


def propose(graph: Graph, nodes: Sequence[str]) -> list[tuple[str, ...]]:
    """Per group of two or more matmuls among ``nodes`` (a partition) that
    read the same first operand: those with a constant [K, N] weight alone
    and with their epilogues, and the whole group when some sibling cannot
    join (so ``explain --rejected`` says why)."""
    allowed = set(nodes)
    groups: dict[str, list[Node]] = {}
    for n in nodes:
        node = graph.producer[n]
        if node.op is Op.MATMUL:
            groups.setdefault(node.inputs[0], []).append(node)
    out: list[tuple[str, ...]] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        good = [a for a in members if _plain_weight(graph, a, allowed)]
        if len(good) < len(members):
            out.append(tuple(a.name for a in members))  # judged, so the decline is recorded
        if len(good) < 2:
            continue
        bare = tuple(a.name for a in good)
        grown = _with_epilogues(graph, good, allowed)
        out.append(bare)
        if len(grown) > len(bare):
            out.append(tuple(sorted(grown, key=graph.position.__getitem__)))
    return out


def _plain_weight(graph: Graph, a: Node, allowed: set[str]) -> bool:
    w = a.inputs[1]
    return w not in allowed and w in graph.constants and len(graph.types[w].shape) == 2


def _with_epilogues(graph: Graph, siblings: Sequence[Node], allowed: set[str]) -> set[str]:
    """The siblings and, for each, the chain of elementwise nodes aligned
    with it, each the only reader of the one before, reading nothing else
    that a sibling computes."""
    names = {a.name for a in siblings}
    downstream = set().union(*(descendants_within(graph, a.name, allowed) for a in siblings))
    outputs = set(graph.outputs)
    for a in siblings:
        t = a.name
        while t not in outputs:
            readers = graph.consumers.get(t, ())
            if len(readers) != 1:
                break
            c = readers[0]
            others = [i for i in c.inputs if i != t]
            if (
                c.name not in allowed
                or c.op not in ir.ELEMENTWISE
                or c.shape != a.shape
                or any(i in downstream or i in names for i in others)
            ):
                break
            names.add(c.name)
            t = c.name
    return names


RULE = Rule(
    MERGED_MATMUL,
    "sibling matmuls reading one activation (Q/K/V, gate/up) as one grouped matmul",
    _judges,
    merged_matmul,
    propose,
    working_set=fit.merged,
)
