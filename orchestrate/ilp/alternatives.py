"""What each pattern rule that fired was worth: the partition solved without it.

A pattern rule (attention, merged sibling matmuls, ...) adds candidates over
sets enumeration never builds and keeps the original primitives, so the
linear program picks the rule's kernel or the primitives' own, by cost.  For
``orchestrate explain`` a rule that fired (its kernel is in the plan) is
shown with both prices: the partition's predicted time with the rule's
candidates, and the optimum of the same program with them removed.  That is
one more solve per (distinct partition, rule fired there); partitions where
no rule fired cost nothing.

A partition's program is built once for all its rules and re-solved with
each rule's candidates barred in turn (``program.solve_each_without``):
building it in PuLP took as long as CBC's search.  The partitions are
independent of each other and of the plan, and much of their time is CBC's
own process: ``fired_all`` runs them side by side, one thread each, up to
one per core (at most ``MAX_WORKERS``) at a time, each re-solve with its
share of the planning's time left by size, as ``timeshare`` shares it.  The
figures do not depend on the order they finish in.

Under ``--memory-budget`` the figures are those of the unbudgeted programs
(the fastest plan per partition), which is what the rules changed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate

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
    candidates (module doc).  ``left``: the planning's time left."""
    used = {i: found for i, (prob, sol) in enumerate(solved) if (found := _used(prob, sol))}
    # each re-solve's size, in the order the planning's time is shared among them
    sizes = [timeshare.size(solved[i][0]) for i, rules in used.items() for _ in rules]
    first = dict(zip(used, accumulate((len(rules) for rules in used.values()), initial=0)))

    def price(i: int) -> list[Fired | None]:
        """The figures of program ``i``'s rules, from one program re-solved."""
        prob, sol = solved[i]
        found = prob.solve_each_without(
            prices,
            [drop for _, drop, _ in used[i]],
            lambda n: timeshare.share(left(), sizes[first[i] + n :])(),
            recompute=recompute,
        )
        return [_priced(prob, sol, rule, chosen, f) for (rule, _, chosen), f in zip(used[i], found)]

    workers = max(1, min(len(used), os.cpu_count() or 1, MAX_WORKERS))
    with ThreadPoolExecutor(workers, thread_name_prefix="orchestrate-rule") as pool:
        figures = dict(zip(used, pool.map(price, used)))
    out: list[list[Fired]] = [[] for _ in solved]
    for i, found in figures.items():
        out[i] = [f for f in found if f is not None]
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
    used: set[int],
    alt: program.Solution | program.NoPlanInTime | program.NoPlan,
) -> Fired | None:
    """``rule``'s figures from ``alt``, the partition re-solved without its
    candidates, or None where there is no fair figure."""
    if not isinstance(alt, program.Solution):
        return None  # no figure in the time, or no plan at all without it (it
        # keeps a tensor too large off memory): the plan stands
    if alt.status == program.GREEDY:
        return None  # only the greedy plan in the time: no fair figure either
    return Fired(
        rule, tuple(prob.kernels[i] for i in sorted(used)), sol.objective_us, alt.objective_us
    )
