"""The rule table: which sets of primitives one kernel runs, and how.

One flat list of rules, peers: each template module exports its rules and
they are concatenated here.  ``match(graph, names, target)`` works out the
set's boundary once (``kernels/region.py``), hands it to the one rule that
judges sets of its kind, and returns that rule's ``KernelSpec`` or
``Rejection``.  It is a pure function of its arguments; every "no" carries
the reason ``orchestrate explain --rejected`` prints.

Library calls (``kernels/library.py``) judge the same matmul, conv and
attention sets as the generated templates: ``match_all`` returns every spec
the target's ``gemm_backends`` allow (Triton's first), so the linear program
can choose between them; ``match`` the first backend's answer, so callers
that want one kernel (the baselines, ``explain --rejected``) keep Triton's
unless only the library may run the set.

``orchestrate rules`` lists the table.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrate.ir import Graph
from orchestrate.kernels import (
    anchored,
    attention,
    library,
    low_rank,
    norm_matmul,
    norm_siblings,
    pointwise,
    row_reduce,
    siblings,
)
from orchestrate.kernels.region import Region, region
from orchestrate.kernels.rule import Rule
from orchestrate.kernels.spec import (
    ATTENTION,
    CONV,
    LOW_RANK,
    MATMUL,
    MERGED_MATMUL,
    NORM_MATMUL,
    NORM_MERGED_MATMUL,
    KernelSpec,
    Rejection,
    Target,
)

RULES: list[Rule] = (
    pointwise.RULES
    + row_reduce.RULES
    + anchored.RULES
    + norm_siblings.RULES
    + siblings.RULES
    + attention.RULES
    + norm_matmul.RULES
    + low_rank.RULES
    + library.RULES
)
# the Triton rules --gemm-backends governs
GEMM_RULES = frozenset(
    {MATMUL, MERGED_MATMUL, NORM_MATMUL, NORM_MERGED_MATMUL, LOW_RANK, CONV, ATTENTION}
)


def allowed(rule: Rule, target: Target) -> bool:
    """May ``rule``'s kernels run under the target's ``gemm_backends``?"""
    if rule.backend != "triton" or rule.name in GEMM_RULES:
        return rule.backend in target.gemm_backends
    return True


def match(graph: Graph, names: Iterable[str], target: Target) -> KernelSpec | Rejection:
    """The kernel that runs the node set ``names``, or why there is none:
    the first allowed backend's answer (Triton's, where it may run the set)."""
    r = _region(graph, names)
    if isinstance(r, Rejection):
        return r
    judging = _judging(r, target)
    if not judging:
        return _refusal(r, target)
    return _admitted(graph, judging[0].match(graph, r, target), target)


def _admitted(graph: Graph, spec: KernelSpec | Rejection, target: Target) -> KernelSpec | Rejection:
    """``spec`` as the target's ``admit`` takes it (itself, widened, or refused)."""
    if target.admit is None or isinstance(spec, Rejection):
        return spec
    return target.admit(graph, spec)


def match_all(graph: Graph, names: Iterable[str], target: Target) -> list[KernelSpec] | Rejection:
    """Every kernel that may run the node set ``names`` (Triton's first, then
    the library's), or why there is none (the first backend's reason)."""
    r = _region(graph, names)
    if isinstance(r, Rejection):
        return r
    judging = _judging(r, target)
    if not judging:
        return _refusal(r, target)
    found = [_admitted(graph, rule.match(graph, r, target), target) for rule in judging]
    specs = [k for k in found if isinstance(k, KernelSpec)]
    return specs or found[0]


def _region(graph: Graph, names: Iterable[str]) -> Region | Rejection:
    r = region(graph, names)
    if isinstance(r, Rejection):
        return r
    empty = next((n for n in r.nodes if n.type.size == 0), None)
    if empty is not None:  # no template emits a loop over nothing
        return Rejection(
            f"{empty.name} has no elements (shape {list(empty.shape)}); "
            "empty tensors are not supported"
        )
    return r


def _judging(r: Region, target: Target) -> list[Rule]:
    """The allowed rules that judge ``r``: the first of each backend."""
    out: list[Rule] = []
    for rule in RULES:
        if rule.judges(r) and all(o.backend != rule.backend for o in out):
            out.append(rule)
    return [rule for rule in out if allowed(rule, target)]


def _refusal(r: Region, target: Target) -> Rejection:
    barred = next((rule for rule in RULES if rule.judges(r)), None)
    if barred is not None:
        return Rejection(
            f"--gemm-backends {','.join(target.gemm_backends)} leaves no kernel "
            f"for this set (the {barred.name} rule is {barred.backend})"
        )
    return Rejection(_unjudged(r))


def _unjudged(r: Region) -> str:
    if len(r.anchors) > 1:
        return f"two compute anchors ({r.anchors[0].name}, {r.anchors[1].name})"
    if r.anchors and r.reductions:
        return f"a reduction ({r.reductions[0].name}) cannot join a {r.anchors[0].op.value}"
    return "no rule runs this set"


def pattern_rules(target: Target | None = None) -> list[Rule]:
    """The rules that propose sets enumeration never builds (those ``target``
    allows, when given: none under ``--no-rewrites``)."""
    if target is not None and not target.rewrites:
        return []
    return [
        rule
        for rule in RULES
        if rule.propose is not None and (target is None or allowed(rule, target))
    ]


def listing() -> list[str]:
    """One line per rule, for ``orchestrate rules``."""
    width = max(len(rule.name) for rule in RULES)
    return [
        f"{rule.name:<{width}}  {'pattern' if rule.propose else 'template':<8}  "
        f"{rule.backend:<7}  {rule.summary}"
        for rule in RULES
    ]
