"""The rule table: which sets of primitives one kernel runs, and how.

One flat list of rules, peers: each template module exports its rules and
they are concatenated here.  ``match(graph, names, target)`` works out the
set's boundary once (``kernels/region.py``), hands it to the one rule that
judges sets of its kind, and returns that rule's ``KernelSpec`` or
``Rejection``.  It is a pure function of its arguments; every "no" carries
the reason ``orchestrate explain --rejected`` prints.

``orchestrate rules`` lists the table.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrate.ir import Graph
from orchestrate.kernels import anchored, attention, pointwise, row_reduce
from orchestrate.kernels.region import Region, region
from orchestrate.kernels.rule import Rule
from orchestrate.kernels.spec import KernelSpec, Rejection, Target

RULES: list[Rule] = pointwise.RULES + row_reduce.RULES + anchored.RULES + attention.RULES


def match(graph: Graph, names: Iterable[str], target: Target) -> KernelSpec | Rejection:
    """The kernel that runs the node set ``names``, or why there is none."""
    r = region(graph, names)
    if isinstance(r, Rejection):
        return r
    empty = next((n for n in r.nodes if n.type.size == 0), None)
    if empty is not None:  # no template emits a loop over nothing
        return Rejection(f"{empty.name} has no elements (shape {list(empty.shape)}); "
                         "empty tensors are not supported")  # fmt: skip
    for rule in RULES:
        if rule.judges(r):
            return rule.match(graph, r, target)
    return Rejection(_unjudged(r))


def _unjudged(r: Region) -> str:
    if len(r.anchors) > 1:
        return f"two compute anchors ({r.anchors[0].name}, {r.anchors[1].name})"
    if r.anchors and r.reductions:
        return f"a reduction ({r.reductions[0].name}) cannot join a {r.anchors[0].op.value}"
    return "no rule runs this set"


def pattern_rules() -> list[Rule]:
    """The rules that propose sets enumeration never builds."""
    return [rule for rule in RULES if rule.propose is not None]


def listing() -> list[str]:
    """One line per rule, for ``orchestrate rules``."""
    width = max(len(rule.name) for rule in RULES)
    return [
        f"{rule.name:<{width}}  {'pattern' if rule.propose else 'template':<8}  {rule.summary}"
        for rule in RULES
    ]
