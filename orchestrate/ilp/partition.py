"""Cut the primitive graph into partitions so that each linear program stays small.

A cut goes between two consecutive nodes (in graph order) where exactly one
tensor t is live across the boundary, t forks, and one of its readers lies
beyond a compute anchor (matmul / conv / pool) that itself depends on t: the
residual stream of a transformer, the skip input of a ResNet block.  No
kernel can hold t's producer together with that reader (it would have to
swallow the anchor and everything between), so t is written by any sensible
plan and cutting there costs (almost) nothing.  Forks inside one activation
(GELU reads its input three times) are not cuts.  A partition holds at least
``min_nodes`` nodes.  Tensors that stay live across most of the
graph (an attention mask computed once and read by every layer) are
*pinned*: they do not count against the single live tensor, and like the cut
tensors they are materialised by the partition that computes them.

A span with no such cut (a long chain of elementwise nodes, many parallel
branches) is cut into pieces of at most ``max_nodes`` (``Limits.partition_nodes``), each where the fewest
bytes are live across the boundary: those tensors are written by the piece
before and read by the next, a fusion the plan gives up so that planning
time grows with the graph, not faster.

Partitions with the same structure (a transformer's identical layers) share
a signature; the planner solves one of them and reuses the answer.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrate.ir import Graph
from orchestrate.kernels.region import ANCHORS
from orchestrate.kernels.spec import KernelSpec, inlined


@dataclass(frozen=True)
class Partition:
    index: int
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]  # available: graph inputs, constants, earlier partitions' outputs
    outputs: tuple[str, ...]  # must be written: read by later partitions, or graph outputs
    span: int = 0  # pieces of one span cut for size share it (ilp.stitch)


def partition(
    graph: Graph, *, min_nodes: int = 8, pinned_fraction: float = 0.3, max_nodes: int = 512
) -> list[Partition]:
    nodes = graph.nodes
    if not nodes:
        return []
    pos = {n.name: i for i, n in enumerate(nodes)}
    last_use: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for t in n.inputs:
            if t in pos:
                last_use[t] = i
    for o in graph.outputs:
        if o in pos:
            last_use[o] = len(nodes)
    span_limit = max(32, int(pinned_fraction * len(nodes)))
    # long-lived tensors and graph outputs are materialised whatever the plan
    pinned = {t for t, end in last_use.items() if end - pos[t] > span_limit}
    pinned |= set(graph.outputs)
    consumers = graph.consumers
    cuts: list[int] = []  # cut after node index i
    live: set[str] = set()  # unpinned tensors produced so far and read later
    expiry: list[tuple[int, str]] = []  # (last use, tensor), a heap over live
    start = 0
    for i, n in enumerate(nodes):
        if n.name in last_use and n.name not in pinned:
            live.add(n.name)
            heapq.heappush(expiry, (last_use[n.name], n.name))
        while expiry and expiry[0][0] <= i:
            live.discard(heapq.heappop(expiry)[1])
        if i + 1 < len(nodes) and len(live) == 1 and i + 1 - start >= min_nodes:
            (t,) = live
            if len(consumers.get(t, ())) >= 2 and _read_beyond_an_anchor(graph, t, pos):
                cuts.append(i)
                start = i + 1
    bounds, spans = _split_large(
        [0] + [c + 1 for c in cuts] + [len(nodes)],
        _live_bytes(graph, pos, last_use, pinned),
        max_nodes,
    )
    parts = []
    graph_outputs = set(graph.outputs)
    for k in range(len(bounds) - 1):
        members = tuple(n.name for n in nodes[bounds[k] : bounds[k + 1]])
        inside = set(members)
        inputs = tuple(
            dict.fromkeys(t for m in members for t in graph.producer[m].inputs if t not in inside)
        )
        outputs = tuple(
            m
            for m in members
            if m in graph_outputs or any(c.name not in inside for c in consumers.get(m, ()))
        )
        parts.append(Partition(k, members, inputs, outputs, spans[k]))
    return parts


def _live_bytes(
    graph: Graph, pos: dict[str, int], last_use: dict[str, int], pinned: set[str]
) -> list[int]:
    """Per boundary b (after node b): the bytes of the unpinned tensors
    computed at or before b and read after it, what a cut there would write."""
    delta = [0] * (len(graph.nodes) + 1)
    for t, end in last_use.items():
        if t not in pinned and end > pos[t]:
            delta[pos[t]] += graph.types[t].nbytes
            delta[end] -= graph.types[t].nbytes
    return list(itertools.accumulate(delta))


def _split_large(bounds: list[int], live: list[int], max_nodes: int) -> tuple[list[int], list[int]]:
    """Each span of more than ``max_nodes`` nodes cut into pieces of at most
    ``max_nodes``, each cut at the boundary, in the last half of the piece,
    where the fewest bytes are live (the latest such boundary).  Returns the
    new bounds and, per piece, the index of the span it came from."""
    out, spans = [bounds[0]], []
    for s, end in enumerate(bounds[1:]):
        start = out[-1]
        while end - start > max_nodes:
            window = range(start + max(1, max_nodes // 2), start + max_nodes + 1)  # ends before b
            b = min(window, key=lambda b: (live[b - 1], -b))
            out.append(b)
            spans.append(s)
            start = b
        out.append(end)
        spans.append(s)
    return out, spans


def _read_beyond_an_anchor(graph: Graph, t: str, pos: dict[str, int]) -> bool:
    """Does some reader of ``t`` depend on ``t`` through a matmul/conv/pool?"""
    readers = {c.name for c in graph.consumers.get(t, ())}
    end = max(pos[r] for r in readers)
    through: dict[str, bool] = {t: False}  # reached from t; True once past an anchor
    for node in graph.nodes[pos[t] + 1 : end + 1]:
        flags = [
            through[i] or graph.producer[i].op in ANCHORS
            for i in node.inputs
            if i in through and i != t
        ]
        if node.name in readers and any(flags):
            return True
        if t in node.inputs or flags:
            through[node.name] = any(flags)
    return False


def _kind(graph: Graph, t: str) -> str:
    """A partition input as its signature sees it: a value, a constant, or a
    scalar constant's value (written into the kernels' source: layers that
    gather the cache at index 0 and 1 are not identical)."""
    if inlined(graph, t):
        return "c=" + repr(graph.constants[t].reshape(()).item())
    return "c" if t in graph.constants else "v"


def signature(graph: Graph, p: Partition) -> str:
    """Equal for partitions of identical structure, whatever their names."""
    local = {n: i for i, n in enumerate(p.nodes)}
    ext = {t: i for i, t in enumerate(p.inputs)}
    parts = [f"in{graph.types[t]}:{_kind(graph, t)}" for t in p.inputs]
    for n in p.nodes:
        node = graph.producer[n]
        refs = ",".join(f"n{local[i]}" if i in local else f"x{ext[i]}" for i in node.inputs)
        parts.append(f"{node.op.value}({refs}){node.type}{sorted(node.attrs.items())}")
    parts.append("out" + ",".join(str(local[o]) for o in p.outputs))
    parts.append("gout" + ",".join(str(local[o]) for o in p.outputs if o in graph.outputs))
    return hashlib.sha1("|".join(parts).encode()).hexdigest()


def transplant(
    src: Partition, dst: Partition, chosen: Sequence[tuple[KernelSpec, tuple[str, ...]]]
) -> list[tuple[KernelSpec, tuple[str, ...]]]:
    """A solution (specs and what each writes) of ``src`` mapped onto the
    identically structured ``dst`` (equal signatures)."""
    if src.index == dst.index:
        return list(chosen)
    rename = dict(zip(src.nodes, dst.nodes)) | dict(zip(src.inputs, dst.inputs))
    return [(k.renamed(rename), tuple(rename[t] for t in writes)) for k, writes in chosen]


def group_identical(graph: Graph, parts: Sequence[Partition]) -> dict[Partition, list[Partition]]:
    """Partitions grouped by signature: the first of each group (solved once)
    -> every partition with its structure, itself included, in graph order."""
    first: dict[str, Partition] = {}
    groups: dict[Partition, list[Partition]] = {}
    for p in parts:
        rep = first.setdefault(signature(graph, p), p)
        groups.setdefault(rep, []).append(p)
    return groups
