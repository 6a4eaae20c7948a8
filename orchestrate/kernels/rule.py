"""What a rule is, and the last step every rule takes: pick a configuration that fits.

A :class:`Rule` is data: a name (its template's), a one-line summary, which
sets it judges, ``match(graph, region, target) -> KernelSpec | Rejection``,
its ``backend`` (generated Triton, or a library call), and how it checks a
configuration's fit: the on-chip ``working_set`` of a spec
(``kernels/fit.py``) and the blocks that must ``cover`` a whole dimension.
A rule that recognises a pattern enumeration never builds (two matmuls
around a softmax) also ``propose``s node sets; the planner judges those
through the same table.  Each rule is part of one template
(``orchestrate/templates/``), whose registry is the rule table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from orchestrate.ir import Graph
from orchestrate.ir.bounds import device_checked
from orchestrate.kernels.fit import WorkingSet, fits, nothing_on_chip
from orchestrate.kernels.region import Region
from orchestrate.kernels.spec import (
    KernelSpec,
    LaunchConfig,
    Rejection,
    Roles,
    Target,
    with_hash,
)

Match = Callable[[Graph, Region, Target], "KernelSpec | Rejection"]
Propose = Callable[[Graph, Sequence[str]], Iterable[Iterable[str]]]


@dataclass(frozen=True)
class Rule:
    name: str
    summary: str  # one line, for `orchestrate rules`
    judges: Callable[[Graph, Region], bool]  # is this set this rule's to judge?
    match: Match
    propose: Propose | None = None  # sets beyond enumeration (pattern rules)
    backend: str = "triton"  # who runs the kernel: generated Triton, or a library call
    # the on-chip working set of a spec (``kernels/fit.py``): checked before it is accepted
    working_set: Callable[[Graph, KernelSpec], WorkingSet] = nothing_on_chip
    # blocks that must hold a whole dimension (the rest tile it, with masks): a
    # pinned configuration must be at least as large as the rule's own choice
    covering: tuple[str, ...] = ()


def accept(
    graph: Graph,
    rule: Rule,
    r: Region,
    space: tuple[int, ...],
    roles: Roles,
    optional: tuple[str, ...],
    configs: Sequence[LaunchConfig],
    target: Target,
) -> KernelSpec | Rejection:
    """The spec with the best configuration that fits the device (the
    target's ``rank``; without one, the first that fits), or the reason the
    last (smallest) configuration does not fit."""
    found = ranked(graph, rule, r, space, roles, optional, configs, target)
    if isinstance(found, Rejection):
        return found
    return with_hash(graph, found[0])


def pinned_config(
    rule: Rule, pin: LaunchConfig, space: Sequence[LaunchConfig], own_interpret: bool = False
) -> LaunchConfig | Rejection:
    """``pin`` for this shape (its interpreter blocks the rule's own here
    when ``own_interpret``, else the pin's), when every block the rule
    ``covering`` names holds what its first configuration holds, on the
    GPU and in the interpreter (whose blocks are the GPU's, overridden by
    ``interpret``)."""
    if not space:
        return Rejection(f"no {rule.name} configuration")
    own = space[0]
    if own_interpret:
        pin = replace(pin, interpret=own.interpret)
    for key in rule.covering:
        for mine, theirs in (
            (dict(pin.blocks), dict(own.blocks)),
            (
                {**dict(pin.blocks), **dict(pin.interpret)},
                {**dict(own.blocks), **dict(own.interpret)},
            ),
        ):
            if key in theirs and mine.get(key, 0) < theirs[key]:
                return Rejection(
                    f"{key}={mine.get(key, 0)} of the plan's configuration does not "
                    f"cover this shape, which needs {theirs[key]}"
                )
    return pin


def ranked(
    graph: Graph,
    rule: Rule,
    r: Region,
    space: tuple[int, ...],
    roles: Roles,
    optional: tuple[str, ...],
    configs: Sequence[LaunchConfig],
    target: Target,
) -> list[KernelSpec] | Rejection:
    """Every configuration that fits, as unhashed specs, best first: the
    order a tuner measures them in.  A Rejection when none fits."""
    template = rule.name
    refused: KernelSpec | Rejection = Rejection(f"no {template} configuration")
    if target.pin is not None and target.pin[0] == template:
        pinned = pinned_config(rule, target.pin[1], configs, target.pin[2])
        if isinstance(pinned, Rejection):
            return pinned
        configs = [pinned]
    checks = device_checked(graph, r.names)
    fitting: list[KernelSpec] = []
    for c in configs:
        spec = KernelSpec(template, r.names, r.inputs, r.sinks, optional, space, roles, c, checks)
        refused = fits(graph, spec, target.device, rule.working_set)
        if isinstance(refused, KernelSpec):
            if target.rank is None:
                return [spec]
            fitting.append(spec)
    if not fitting:
        return refused
    scores = [target.rank(graph, s) for s in fitting]
    order = sorted(range(len(fitting)), key=lambda i: (scores[i], i))
    return [fitting[i] for i in order]
