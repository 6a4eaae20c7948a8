"""The planning's time, shared among its linear programs.

``--time-limit`` bounds the whole planning.  Each program (one per distinct
partition) gets a share of the time left, in proportion to its size (its
candidate count); what it does not use goes on to the programs after it.
Given the whole of the time left instead, one hard program (a recurrent
stack's: CBC finds its optimum early and then spends the rest proving it)
took it all, and every program after it kept its greedy plan.

A program that finds no plan at all in its share (one with no greedy
start to keep: the greedy plan writes a tensor too large to hold) takes
all the time left instead, as it did before the sharing.

Time still left once every program has run goes back to the programs the
clock stopped (``FEASIBLE``), the largest gap first: each is solved again
from the start with an equal share of it, and the better of its two
solutions stands (CBC cannot resume a search).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from orchestrate.ilp import program
from orchestrate.ilp.problem import Problem

Clock = Callable[[], float | None]  # seconds left; None: no limit
Progress = Callable[[str, int, int], None]
RESOLVE_MIN_S = 1.0  # less left than this: a stopped program keeps its solution


def share(left: float | None, sizes: Sequence[int]) -> Clock:
    """The clock of the first of the programs of ``sizes``: its share of
    ``left`` by size (None: no limit)."""
    if left is None:
        return lambda: None
    end = time.perf_counter() + left * sizes[0] / sum(sizes)
    return lambda: end - time.perf_counter()


def solve_all(
    problems: Sequence[Problem],
    prices,
    left: Clock,
    recompute: bool,
    report: Progress,
) -> list[program.Solution]:
    """Each program's solution, in the order given (module doc).  ``left``:
    the planning's time left."""
    sizes = [size(p) for p in problems]
    out = []
    for i, prob in enumerate(problems):
        report("solve", i + 1, len(problems))
        try:
            sol = prob.solve(prices, time_limit=share(left(), sizes[i:])(), recompute=recompute)
        except program.NoPlanInTime:
            # no plan at all in its share (no greedy start to keep: one that
            # writes a tensor too large to hold): it takes what is left
            if i == len(problems) - 1:
                raise
            sol = prob.solve(prices, time_limit=left(), recompute=recompute)
        out.append(sol)
    stopped = sorted(
        (i for i, s in enumerate(out) if s.status == program.FEASIBLE),
        key=lambda i: (-out[i].gap, i),
    )
    for j, i in enumerate(stopped):
        t = left()
        if t is None or t < RESOLVE_MIN_S:
            break  # (no limit: nothing was stopped)
        report("re-solve", j + 1, len(stopped))
        try:
            again = problems[i].solve(
                prices, time_limit=t / (len(stopped) - j), recompute=recompute
            )
        except program.NoPlanInTime:
            continue  # its first solution stands
        out[i] = _better(out[i], again)
    return out


def size(prob: Problem) -> int:
    """A program's size, by which it gets its share: its candidate count."""
    return max(1, len(prob.kernels))


def _better(first: program.Solution, again: program.Solution) -> program.Solution:
    """The better of a program's two solutions, its gap against the higher
    of the two solves' lower bounds, counting both solves."""
    solved = (program.OPTIMAL, program.FEASIBLE)
    best = (
        again
        if again.status in solved and again.objective_us < first.objective_us - 1e-9
        else first
    )
    bounds = [
        s.objective_us * (1 - s.gap)
        for s in (first, again)
        if s.status in solved and not math.isnan(s.gap)
    ]
    gap = best.gap
    if bounds and best.objective_us > 0:
        gap = max(0.0, (best.objective_us - max(bounds)) / best.objective_us)
    status = program.OPTIMAL if again.status == program.OPTIMAL or gap == 0 else best.status
    return replace(
        best,
        status=status,
        gap=0.0 if status == program.OPTIMAL else gap,
        rounds=first.rounds + again.rounds,
        seconds=first.seconds + again.seconds,
    )
