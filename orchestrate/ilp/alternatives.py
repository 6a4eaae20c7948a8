"""What each pattern rule that fired was worth: the partition solved without it.

A pattern rule (attention, merged sibling matmuls, ...) adds candidates over
sets enumeration never builds and keeps the original primitives, so the
linear program picks the rule's kernel or the primitives' own, by cost.  For
``orchestrate explain`` a rule that fired (its kernel is in the plan) is
shown with both prices: the partition's predicted time with the rule's
candidates, and the optimum of the same program with them removed.  That is
one more solve per (distinct partition, rule fired there); partitions where
no rule fired cost nothing.

The re-solves are independent of each other and of the plan, and much of
their time is CBC's own process: ``fired_all`` runs them side by side, one
thread each, up to one per core (at most ``MAX_WORKERS``) at a time, each
with its share of the planning's time left by size, as ``timeshare`` shares it.
The figures do not depend on the order they finish in.

Under ``--memory-budget`` the figures are those of the unbudgeted programs
(the fastest plan per partition), which is what the rules changed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from orchestrate.cost.roofline import Prices
from orchestrate.ilp import program, timeshare
from orchestrate.ilp.problem import Problem
from orchestrate.kernels.spec import KernelSpec

MAX_WORKERS = 8  # re-solves at a time (each one CBC process)


@dataclass(frozen=True)
class Fired:
    """A rule whose kernels one distinct partition's optimum uses."""

    rule: str
    specs: tuple[KernelSpec, ...]  # the rule's kernels the optimum uses
    with_us: float  # the partition's optimum
    without_us: float  # the optimum without any of the rule's candidates


def fired_all(
    solved: Sequence[tuple[Problem, program.Solution]],
    prices: Prices,
    left: Callable[[], float | None],
    recompute: bool,
) -> list[list[Fired]]:
    """For each (program, its solution): the pattern rules whose candidates
    the solution chose, each with the program re-solved without that rule's
    candidates; the re-solves run side by side (module doc).  ``left``: the
    planning's time left."""
    jobs = [(i, *used) for i, (prob, sol) in enumerate(solved) for used in _used(prob, sol)]
    sizes = [timeshare.size(solved[i][0]) for i, *_ in jobs]

    def price(j: int) -> Fired | None:
        i, rule, drop, used = jobs[j]
        prob, sol = solved[i]
        until = timeshare.share(left(), sizes[j:])()
        return _priced(prob, sol, rule, drop, used, prices, until, recompute)

    workers = max(1, min(len(jobs), os.cpu_count() or 1, MAX_WORKERS))
    with ThreadPoolExecutor(workers, thread_name_prefix="orchestrate-rule") as pool:
        found = list(pool.map(price, range(len(jobs))))
    out: list[list[Fired]] = [[] for _ in solved]
    for (i, *_), f in zip(jobs, found):
        if f is not None:
            out[i].append(f)
    return out


def _used(prob: Problem, sol: program.Solution) -> list[tuple[str, set[int], set[int]]]:
    """(rule, its candidates, those ``sol`` chose) for each rule ``sol`` uses."""
    by_rule: dict[str, set[int]] = {}
    for rule, i in prob.found.proposed:
        by_rule.setdefault(rule, set()).add(i)
    chosen = {c.kernel for c in sol.choices}
    return [
        (rule, by_rule[rule], by_rule[rule] & chosen)
        for rule in sorted(by_rule)
        if by_rule[rule] & chosen
    ]


def _priced(
    prob: Problem,
    sol: program.Solution,
    rule: str,
    drop: set[int],
    used: set[int],
    prices: Prices,
    time_limit,
    recompute: bool,
) -> Fired | None:
    """``rule``'s figures: the partition re-solved without ``drop``, or None
    where there is no fair figure."""
    try:
        alt = without(prob, drop).solve(prices, time_limit=time_limit, recompute=recompute)
    except program.NoPlanInTime:
        return None  # no figure without the rule in the time (the plan stands)
    except program.NoPlan:
        return None  # no plan at all without it (it keeps a tensor too large off memory)
    if alt.status == program.GREEDY:
        return None  # only the greedy plan in the time: no fair figure either
    return Fired(
        rule, tuple(prob.kernels[i] for i in sorted(used)), sol.objective_us, alt.objective_us
    )


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
