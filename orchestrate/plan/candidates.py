"""Enumerate candidate kernels: the legal connected node sets of a partition.

Connected sets are generated level by level, smallest first: the sets of
size k+1 are those of size k grown by one neighbouring node (every connected
set has a connected subset one node smaller, so none is missed).  Growth is
cut early by rules no superset can undo (two compute anchors, an anchor with
a reduction, reductions over different rows).  Two budgets keep a wide graph
(many parallel branches) tractable: ``max_sets`` connected sets examined and
``max_candidates`` legal kernels kept per partition.  Because levels go from
small to large, what a budget drops is the largest sets; the counts of what
was cut are reported.

Every single node is a candidate, so a plan always exists (a node no rule
runs alone, a row of 2**31 elements say, is an UnsupportedError naming it).

Pattern rules (attention) then propose the sets enumeration never builds;
they are judged by the same rule table, and each refusal is kept with its
reason (``declined``) for ``orchestrate explain --rejected``.

A set can be run by a generated kernel and by a library call
(``templates.match_all``): both are candidates, and the linear program chooses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from orchestrate.errors import UnsupportedError
from orchestrate.ir import Graph, Node
from orchestrate.kernels.region import ANCHORS, ROW_REDUCTIONS, convex_sets, reduce_axes
from orchestrate.kernels.spec import KernelSpec, Rejection, Target
from orchestrate.templates import match_all, pattern_rules


@dataclass(frozen=True)
class Limits:
    max_nodes: int = 16  # nodes in one kernel
    max_sets: int = 50_000  # connected sets examined per partition
    max_candidates: int = 2_000  # legal kernels kept per partition
    max_anchor_fanout: int = 24  # epilogue / prologue nodes around one anchor
    partition_nodes: int = 512  # primitives in one linear program (ilp.partition)


@dataclass
class Enumeration:
    kernels: list[KernelSpec]
    examined: int = 0
    rejected: int = 0
    pruned: int = 0  # growths cut by the monotone rules
    truncated: bool = False  # a budget stopped the search
    declined: list[tuple[str, str, str]] = field(default_factory=list)  # (rule, at, reason)
    proposed: list[tuple[str, int]] = field(default_factory=list)  # (rule, index in kernels)


def enumerate_kernels(
    graph: Graph,
    nodes: Sequence[str],
    target: Target,
    limits: Limits = Limits(),
    deadline: float | None = None,
) -> Enumeration:
    """Legal kernels over connected subsets of ``nodes`` (a partition), small
    first; past ``deadline`` (a ``time.perf_counter()`` instant) the growth
    stops, truncated, as at a budget (the singletons and the pattern rules'
    kernels are always there)."""

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    members = list(nodes)
    index = {n: i for i, n in enumerate(members)}
    adj = [0] * len(members)  # each member's neighbours in the partition, as a bit mask
    for i, n in enumerate(members):
        for inp in graph.producer[n].inputs:
            j = index.get(inp)
            if j is not None and j != i:
                adj[i] |= 1 << j
                adj[j] |= 1 << i
    nodes_by_index = [graph.producer[n] for n in members]
    row_keys = [
        (graph.types[n.inputs[0]].shape, reduce_axes(n)) if n.op in ROW_REDUCTIONS else None
        for n in nodes_by_index
    ]
    result = Enumeration([])
    convex = convex_sets(graph, members)

    def consider(s: int) -> None:
        if not convex.convex(s):  # as region() refuses it, without walking the graph
            result.rejected += 1
            return
        k = match_all(graph, (members[i] for i in bits(s)), target)
        if isinstance(k, Rejection):
            result.rejected += 1
        else:
            result.kernels += k

    # a set is a bit mask over ``members``, with its state and its members' neighbours
    level: dict[int, tuple[_State, int]] = {}
    for i in range(len(members)):  # singletons first: a plan always exists
        level[1 << i] = (_State().add(nodes_by_index[i], row_keys[i], limits), adj[i])
        alone = match_all(graph, (members[i],), target)
        if isinstance(alone, Rejection):
            n = nodes_by_index[i]
            raise UnsupportedError(
                f"{n.origin or n.name}: primitive {n.name} ({n.op.value}) has no kernel: "
                f"{alone.reason}",
                {n.op.value: 1},
            )
        result.kernels += alone
    result.examined = len(members)
    for _ in range(2, limits.max_nodes + 1):
        grown: dict[int, tuple[_State, int]] = {}
        for s, (state, near) in level.items():
            for v in bits(near & ~s):  # its neighbours, in index order
                t = s | 1 << v
                if t in grown:
                    continue
                nxt = state.add(nodes_by_index[v], row_keys[v], limits)
                if nxt is None:
                    result.pruned += 1
                    continue
                grown[t] = (nxt, near | adj[v])
            if result.examined + len(grown) >= limits.max_sets:
                result.truncated = True
                break
        for t in grown:
            if len(result.kernels) >= limits.max_candidates or late():
                result.truncated = True
                break
            consider(t)
        result.examined += len(grown)
        if result.truncated or not grown:
            break
        level = grown
    judged: set[frozenset[str]] = set()  # two pattern rules may propose one set
    for rule in pattern_rules(target):
        for proposed in rule.propose(graph, members):
            if frozenset(proposed) in judged:
                continue
            judged.add(frozenset(proposed))
            k = match_all(graph, proposed, target)
            if isinstance(k, Rejection):
                result.declined.append((rule.name, max(proposed, key=index.get), k.reason))
            else:
                result.proposed += [(rule.name, len(result.kernels) + j) for j in range(len(k))]
                result.kernels += k
    return result


def bits(mask: int) -> Iterator[int]:
    """The indices of the set bits of ``mask``, smallest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


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
