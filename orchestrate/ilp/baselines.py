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
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrate.cost.devices import Device
from orchestrate.cost.roofline import Config, cost, us_for_bytes, working_set_rejection, write_bytes
from orchestrate.ir import Graph
from orchestrate.kernels.templates import VIEW, Kernel, Rejection, classify


@dataclass(frozen=True)
class Priced:
    kernel: Kernel
    writes: tuple[str, ...]
    time_us: float
    bytes: int
    flops: int


def price(graph: Graph, k: Kernel, writes: Sequence[str], device: Device, config: Config) -> Priced:
    c = cost(graph, k, device, config)
    extra = [t for t in writes if t not in k.outputs]
    extra_bytes = write_bytes(graph, extra)
    mem = c.memory_us + us_for_bytes(extra_bytes, device)
    t = max(mem, c.compute_us) + c.launch_us
    return Priced(k, tuple(writes), t, c.bytes + extra_bytes, c.flops)


def fused_no_recompute(graph: Graph, names, device: Device, config: Config) -> Priced | Rejection:
    """The kernel for ``names`` writing everything read outside it, or why not."""
    k = classify(graph, names)
    if isinstance(k, Rejection):
        return k
    ws = working_set_rejection(graph, k, device)
    if ws:
        return ws
    exposed = _exposed(graph, k)
    if any(e not in k.optional for e in exposed):
        bad = next(e for e in exposed if e not in k.optional)
        return Rejection(
            f"{bad} is read outside the kernel but the {k.template} template cannot store it"
        )
    return price(graph, k, k.outputs + tuple(exposed), device, config)


def _exposed(graph: Graph, k: Kernel) -> list[str]:
    inside = set(k.nodes)
    outs = set(graph.outputs)
    return [
        n
        for n in k.nodes
        if n not in k.outputs
        and (n in outs or any(c.name not in inside for c in graph.consumers.get(n, ())))
    ]


def greedy(graph: Graph, nodes: Sequence[str], device: Device, config: Config) -> list[Priced]:
    """Greedy pairwise fusion over the primitive ``nodes`` of one partition."""
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    groups: dict[int, Priced] = {}
    owner: dict[str, int] = {}
    ids = itertools.count()
    for n in nodes:
        p = fused_no_recompute(graph, [n], device, config)
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
                graph, groups[a].kernel.nodes + groups[b].kernel.nodes, device, config
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
            graph, groups[a].kernel.nodes + groups[b].kernel.nodes, device, config
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


def unfused(graph: Graph, device: Device, config: Config) -> list[Priced]:
    """One kernel per ONNX node of the original model."""
    return [p for members in origins(graph).values() for p in onnx_node_kernels(
        graph, members, device, config)]  # fmt: skip


def origins(graph: Graph) -> dict[str, list[str]]:
    """Primitive names grouped by the ONNX node they were split from."""
    by_origin: dict[str, list[str]] = {}
    for n in graph.nodes:
        by_origin.setdefault(n.origin or n.name, []).append(n.name)
    return by_origin


def onnx_node_kernels(
    graph: Graph, members: Sequence[str], device: Device, config: Config
) -> list[Priced]:
    """How an op-by-op runtime runs one ONNX node: one kernel when a template
    can run all its primitives, else the fewest kernels that can (greedy
    fusion inside the node; e.g. ONNX Attention's two matmuls)."""
    p = fused_no_recompute(graph, members, device, config)
    if not isinstance(p, Rejection):
        if p.kernel.template == VIEW:
            return [Priced(p.kernel, p.writes, 0.0, 0, 0)]
        return [p]
    return greedy(graph, members, device, config)
