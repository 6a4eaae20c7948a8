"""The templates, one line each, and the rule table over them.

``REGISTRY`` lists every template (``templates/base.py``): its rule,
its generator and its cost terms.  The planner, the cost model and the
emitter look a spec's template up here (``template(name)``) and never
dispatch on its name; adding a template is one package beside these, its
import and its line in ``REGISTRY``.

The rules are peers, judged in the registry's order: of the rules that
judge a set, the first of each backend decides it (a norm moved past merged
siblings before the merged siblings alone).  ``match(graph,
names, target)`` works out the set's boundary once (``kernels/region.py``),
hands it to the one rule that judges sets of its kind, and returns that
rule's ``KernelSpec`` or ``Rejection``.  It is a pure function of its
arguments; every "no" carries the reason ``orchestrate explain --rejected``
prints.

Library calls (``templates/library/``) judge the same matmul, conv and
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
from orchestrate.kernels.fit import WorkingSet
from orchestrate.kernels.region import Region, region
from orchestrate.kernels.rule import Rule
from orchestrate.kernels.spec import KernelSpec, Rejection, Target, split_k
from orchestrate.templates import (
    attention,
    conv,
    library,
    low_rank,
    matmul,
    merged_matmul,
    norm_matmul,
    norm_merged_matmul,
    pointwise,
    row_reduce,
    scan,
    view,
    window,
)
from orchestrate.templates.base import Template

REGISTRY: tuple[Template, ...] = (
    view.TEMPLATE,
    scan.TEMPLATE,
    pointwise.TEMPLATE,
    row_reduce.TEMPLATE,
    matmul.TEMPLATE,
    conv.TEMPLATE,
    window.TEMPLATE,
    norm_merged_matmul.TEMPLATE,
    merged_matmul.TEMPLATE,
    attention.TEMPLATE,
    norm_matmul.TEMPLATE,
    low_rank.TEMPLATE,
    *library.TEMPLATES,
)
_BY_NAME = {t.name: t for t in REGISTRY}
RULES: tuple[Rule, ...] = tuple(t.rule for t in REGISTRY)
NAMES: frozenset[str] = frozenset(_BY_NAME)


def template(name: str) -> Template:
    """The registered template called ``name`` (KeyError for any other: a
    plan naming one is refused when it is read)."""
    return _BY_NAME[name]


def scratch(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(fp32 workspace elements, int32 counters) ``spec`` needs of the
    runner's shared scratch: none unless its configuration splits
    (``SPLIT_K`` > 1), then as its template says."""
    if split_k(spec.config) == 1:
        return 0, 0
    return template(spec.template).scratch(graph, spec)


def working_set(graph: Graph, spec: KernelSpec) -> WorkingSet:
    """The on-chip working set of ``spec``, as its template's rule models it."""
    return template(spec.template).rule.working_set(graph, spec)


def allowed(rule: Rule, target: Target) -> bool:
    """May ``rule``'s kernels run under the target's ``gemm_backends``?"""
    if rule.backend != "triton" or template(rule.name).gemm:
        return rule.backend in target.gemm_backends
    return True


def match(graph: Graph, names: Iterable[str], target: Target) -> KernelSpec | Rejection:
    """The kernel that runs the node set ``names``, or why there is none:
    the first allowed backend's answer (Triton's, where it may run the set)."""
    r = _region(graph, names)
    if isinstance(r, Rejection):
        return r
    judging = _judging(graph, r, target)
    if not judging:
        return _refusal(graph, r, target)
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
    judging = _judging(graph, r, target)
    if not judging:
        return _refusal(graph, r, target)
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


def _judging(graph: Graph, r: Region, target: Target) -> list[Rule]:
    """The allowed rules that judge ``r``: the first of each backend."""
    out: list[Rule] = []
    for rule in RULES:
        if rule.judges(graph, r) and all(o.backend != rule.backend for o in out):
            out.append(rule)
    return [rule for rule in out if allowed(rule, target)]


def _refusal(graph: Graph, r: Region, target: Target) -> Rejection:
    barred = next((rule for rule in RULES if rule.judges(graph, r)), None)
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
