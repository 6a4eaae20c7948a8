"""Enumerate candidate kernels: the legal connected node sets of a partition.

Connected sets are generated with the ESU algorithm (Wernicke 2006), which
visits every connected induced subgraph of up to ``max_nodes`` vertices
exactly once.  Branches are cut early by rules that no superset can undo
(two compute anchors, an anchor with a reduction, reductions over different
rows), and the whole search is bounded by ``max_sets`` so that a wide graph
(many parallel branches) stays tractable; what was cut is counted.

Every single node is a candidate, so a plan always exists.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from orchestrate.ir import Graph, Node
from orchestrate.kernels.templates import (
    ANCHORS,
    ROW_REDUCTIONS,
    Kernel,
    Rejection,
    classify,
    reduce_axes,
)


@dataclass(frozen=True)
class Limits:
    max_nodes: int = 16  # nodes in one kernel
    max_sets: int = 50_000  # connected sets examined per partition
    max_anchor_fanout: int = 24  # epilogue / prologue nodes around one anchor


@dataclass
class Enumeration:
    kernels: list[Kernel]
    examined: int = 0
    rejected: int = 0
    truncated: bool = False
    rejections: dict[str, str] = field(default_factory=dict)  # small sample for explain


def enumerate_kernels(
    graph: Graph, nodes: Sequence[str], limits: Limits = Limits(), keep_reasons: int = 0
) -> Enumeration:
    """All legal kernels over connected subsets of ``nodes`` (a partition)."""
    members = list(nodes)
    index = {n: i for i, n in enumerate(members)}
    adj: list[list[int]] = [[] for _ in members]
    for i, n in enumerate(members):
        for inp in graph.producer[n].inputs:
            j = index.get(inp)
            if j is not None and j != i:
                adj[i].append(j)
                adj[j].append(i)
        for c in graph.consumers.get(n, ()):
            j = index.get(c.name)
            if j is not None and j != i:
                adj[i].append(j)
                adj[j].append(i)
    adj = [sorted(set(a)) for a in adj]
    nodes_by_index = [graph.producer[n] for n in members]
    row_keys = [
        (graph.types[n.inputs[0]].shape, reduce_axes(n)) if n.op in ROW_REDUCTIONS else None
        for n in nodes_by_index
    ]
    result = Enumeration([])
    seen_sets: set[frozenset[int]] = set()

    def consider(s: frozenset[int]) -> None:
        if s in seen_sets:
            return
        seen_sets.add(s)
        k = classify(graph, (members[i] for i in s))
        if isinstance(k, Rejection):
            result.rejected += 1
            if len(result.rejections) < keep_reasons:
                result.rejections[", ".join(members[i] for i in sorted(s))] = k.reason
        else:
            result.kernels.append(k)

    for i in range(len(members)):  # singletons first: a plan always exists
        consider(frozenset((i,)))
    budget = [limits.max_sets]

    def extend(sub: list[int], ext: list[int], v: int, state: _State) -> None:
        if budget[0] <= 0:
            result.truncated = True
            return
        budget[0] -= 1
        result.examined += 1
        if len(sub) > 1:
            consider(frozenset(sub))
        if len(sub) >= limits.max_nodes:
            return
        ext = list(ext)
        sub_set = set(sub)
        near = set()
        for u in sub:
            near.update(adj[u])
        while ext:
            w = ext.pop()
            nxt = state.add(nodes_by_index[w], row_keys[w], limits)
            if nxt is None:
                continue
            new_ext = ext + [
                u for u in adj[w] if u > v and u not in sub_set and u not in near and u not in ext
            ]
            extend(sub + [w], new_ext, v, nxt)

    for v in range(len(members)):
        first = _State().add(nodes_by_index[v], row_keys[v], limits)
        extend([v], [u for u in adj[v] if u > v], v, first)
    return result


@dataclass(frozen=True)
class _State:
    """What a growing set already holds, for the monotone pruning rules."""

    anchors: int = 0
    reduction: tuple | None = None  # (input shape, axes) of the reductions
    size: int = 0

    def add(self, node: Node, row_key: tuple | None, limits: Limits) -> _State | None:
        anchors = self.anchors + (node.op in ANCHORS)
        reduction = self.reduction
        if row_key is not None:
            if reduction is not None and reduction != row_key:
                return None
            reduction = row_key
        if anchors > 1 or (anchors and reduction is not None):
            return None
        if anchors and self.size + 1 > limits.max_anchor_fanout + 1:
            return None
        return _State(anchors, reduction, self.size + 1)


def structural_hash(graph: Graph, k: Kernel) -> str:
    """Identical kernels (same ops, attributes, shapes, dtypes, wiring, outputs)
    share this hash whatever their tensors are called."""
    local = {n: i for i, n in enumerate(k.nodes)}
    ext = {t: i for i, t in enumerate(k.inputs)}
    parts = [k.template]
    for t in k.inputs:
        parts.append(f"in{graph.types[t]}")
    for n in k.nodes:
        node = graph.producer[n]
        refs = ",".join(f"n{local[i]}" if i in local else f"x{ext[i]}" for i in node.inputs)
        parts.append(f"{node.op.value}({refs}){node.type}{sorted(node.attrs.items())}")
    parts.append("out" + ",".join(str(local[o]) for o in k.outputs))
    parts.append("opt" + ",".join(str(local[o]) for o in k.optional))
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def kernel_for(graph: Graph, names: Iterable[str]) -> Kernel:
    """classify() for sets known to be legal (baselines); raises otherwise."""
    k = classify(graph, names)
    if isinstance(k, Rejection):
        raise AssertionError(k.reason)
    return k
