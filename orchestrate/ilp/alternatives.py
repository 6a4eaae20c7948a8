"""What each pattern rule that fired was worth: the partition solved without it.

A pattern rule (attention, merged sibling matmuls, ...) adds candidates over
sets enumeration never builds and keeps the original primitives, so the
linear program picks the rule's kernel or the primitives' own, by cost.  For
``orchestrate explain`` a rule that fired (its kernel is in the plan) is
shown with both prices: the partition's predicted time with the rule's
candidates, and the optimum of the same program with them removed.  That is
one more solve per (distinct partition, rule fired there); partitions where
no rule fired cost nothing.

Under ``--memory-budget`` the figures are those of the unbudgeted programs
(the fastest plan per partition), which is what the rules changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from orchestrate.cost.roofline import Prices
from orchestrate.ilp import program
from orchestrate.ilp.problem import Problem
from orchestrate.kernels.spec import KernelSpec


@dataclass(frozen=True)
class Fired:
    """A rule whose kernels one distinct partition's optimum uses."""

    rule: str
    specs: tuple[KernelSpec, ...]  # the rule's kernels the optimum uses
    with_us: float  # the partition's optimum
    without_us: float  # the optimum without any of the rule's candidates


def fired(
    prob: Problem, sol: program.Solution, prices: Prices, *, time_limit, recompute: bool
) -> list[Fired]:
    """The pattern rules whose candidates ``sol`` (the solution of ``prob``)
    chose, each with the partition re-solved without that rule's candidates."""
    by_rule: dict[str, set[int]] = {}
    for rule, i in prob.found.proposed:
        by_rule.setdefault(rule, set()).add(i)
    chosen = {c.kernel for c in sol.choices}
    out = []
    for rule in sorted(by_rule):
        used = by_rule[rule] & chosen
        if not used:
            continue
        try:
            alt = without(prob, by_rule[rule]).solve(
                prices, time_limit=time_limit, recompute=recompute
            )
        except program.NoPlanInTime:
            continue  # no figure without the rule in the time (the plan stands)
        except program.NoPlan:
            continue  # no plan at all without it (it keeps a tensor too large off memory)
        if alt.status == program.GREEDY:
            continue  # only the greedy plan in the time: no fair figure either
        out.append(
            Fired(
                rule,
                tuple(prob.kernels[i] for i in sorted(used)),
                sol.objective_us,
                alt.objective_us,
            )
        )
    return out


def without(prob: Problem, drop: set[int]) -> Problem:
    """``prob`` without the candidates at ``drop`` (the warm start is kept
    when it uses none of them)."""
    keep = [i for i in range(len(prob.kernels)) if i not in drop]
    moved: Mapping[int, int] = {old: new for new, old in enumerate(keep)}
    warm = [program.Choice(moved[c.kernel], c.writes) for c in prob.warm if c.kernel in moved]
    return replace(
        prob,
        kernels=[prob.kernels[i] for i in keep],
        costs=[prob.costs[i] for i in keep],
        warm=warm if len(warm) == len(prob.warm) else [],
    )
