"""The two baselines every plan is compared with, under the same cost model.

``unfused``: one kernel per ONNX node of the original model (its primitives
grouped by origin), as an op-by-op runtime runs it.  Reshape-only nodes are
free views.

``greedy``: rule-based fusion.  Start from one kernel per primitive and
repeatedly merge the legal producer/consumer pair that saves the most
predicted time, until no merge saves anything.  Greedy never recomputes: a
merged kernel writes every value that anything outside it reads.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrate.cost.roofline import Prices
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec, Rejection, Target
from orchestrate.templates import match


@dataclass(frozen=True)
class Priced:
    kernel: KernelSpec
    writes: tuple[str, ...]
    time_us: float
    bytes: int
    flops: int


def price(prices: Prices, k: KernelSpec, writes: Sequence[str]) -> Priced:
    p = prices.price(k, writes)
    return Priced(k, tuple(writes), p.time_us, p.bytes, p.flops)


def fused_no_recompute(graph: Graph, names, target: Target, prices: Prices) -> Priced | Rejection:
    """The kernel for ``names`` writing everything read outside it, or why not."""
    k = match(graph, names, target)
    if isinstance(k, Rejection):
        return k
    exposed = _exposed(graph, k)
    if any(e not in k.optional for e in exposed):
        bad = next(e for e in exposed if e not in k.optional)
        return Rejection(
            f"{bad} is read outside the kernel but the {k.template} template cannot store it"
        )
    return price(prices, k, k.outputs + tuple(exposed))


def _exposed(graph: Graph, k: KernelSpec) -> list[str]:
    inside = set(k.nodes)
    outs = set(graph.outputs)
    return [
        n
        for n in k.nodes
        if n not in k.outputs
        and (n in outs or any(c.name not in inside for c in graph.consumers.get(n, ())))
    ]


def greedy(graph: Graph, nodes: Sequence[str], target: Target, prices: Prices) -> list[Priced]:
    """Greedy pairwise fusion over the primitive ``nodes`` of one partition."""
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    groups: dict[int, Priced] = {}
    owner: dict[str, int] = {}
    ids = itertools.count()
    for n in nodes:
        p = fused_no_recompute(graph, [n], target, prices)
        assert not isinstance(p, Rejection), p
        gid = next(ids)
        groups[gid] = p
        owner[n] = gid

    def succ(gid: int) -> set[int]:
        out = set()
        for n in groups[gid].kernel.nodes:
            for c in graph.consumers.get(n, ()):
                o = owner.get(c.name)
                if o is not None and o != gid:
                    out.add(o)
        return out

    def creates_cycle(a: int, b: int) -> bool:
        """Would merging a and b close a cycle through a third kernel?"""
        for src, dst in ((a, b), (b, a)):
            stack = [s for s in succ(src) if s != dst]
            seen = set(stack)
            while stack:
                g = stack.pop()
                for s in succ(g):
                    if s == dst:
                        return True
                    if s not in seen:
                        seen.add(s)
                        stack.append(s)
        return False

    heap: list[tuple[float, int, int, int]] = []
    tie = itertools.count()

    def push_pairs(gid: int) -> None:
        for other in sorted(succ(gid) | _preds(gid)):
            a, b = (gid, other) if gid < other else (other, gid)
            merged = fused_no_recompute(
                graph, groups[a].kernel.nodes + groups[b].kernel.nodes, target, prices
            )
            if isinstance(merged, Rejection):
                continue
            saving = groups[a].time_us + groups[b].time_us - merged.time_us
            if saving > 1e-12:
                heapq.heappush(heap, (-saving, next(tie), a, b))

    def _preds(gid: int) -> set[int]:
        out = set()
        for n in groups[gid].kernel.nodes:
            for i in graph.producer[n].inputs:
                o = owner.get(i)
                if o is not None and o != gid:
                    out.add(o)
        return out

    for gid in sorted(groups):
        push_pairs(gid)
    while heap:
        _, _, a, b = heapq.heappop(heap)
        if a not in groups or b not in groups or creates_cycle(a, b):
            continue
        merged = fused_no_recompute(
            graph, groups[a].kernel.nodes + groups[b].kernel.nodes, target, prices
        )
        if isinstance(merged, Rejection):
            continue
        gid = next(ids)
        del groups[a], groups[b]
        groups[gid] = merged
        for n in merged.kernel.nodes:
            owner[n] = gid
        push_pairs(gid)
    return sorted(groups.values(), key=lambda p: order[p.kernel.nodes[0]])


def unfused(
    graph: Graph, target: Target, prices: Prices, ops: Mapping[str, str] | None = None
) -> list[Priced]:
    """One kernel per ONNX node of the original model; ``ops``: the op that
    several nodes were exported from, where a runtime ran them as one
    (``calibrate/torch_ops.py``; by default each node is its own op)."""
    return [
        p
        for members in origins(graph, ops).values()
        for p in onnx_node_kernels(graph, members, target, prices)
    ]


def origins(graph: Graph, ops: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """Primitive names grouped by the ONNX node they were split from (by the
    op that node was exported from, where ``ops`` names one)."""
    ops = ops or {}
    by_origin: dict[str, list[str]] = {}
    for n in graph.nodes:
        origin = n.origin or n.name
        by_origin.setdefault(ops.get(origin, origin), []).append(n.name)
    return by_origin


def onnx_node_kernels(
    graph: Graph, members: Sequence[str], target: Target, prices: Prices
) -> list[Priced]:
    """How an op-by-op runtime runs one ONNX node (or one op's nodes): one
    kernel when a template can run all its primitives, else the fewest
    kernels that can (greedy fusion inside the node; e.g. ONNX Attention's
    two matmuls)."""
    p = fused_no_recompute(graph, members, target, prices)
    if not isinstance(p, Rejection):
        return [p]
    return greedy(graph, members, target, prices)
