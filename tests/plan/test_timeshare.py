"""--time-limit shared among the partitions' programs (ilp/timeshare.py),
through the planner: a program that takes all of its time leaves the later
ones theirs, and time left at the end goes back to a program the clock
stopped."""

from __future__ import annotations

import time

import pulp
import pytest

from orchestrate.ilp import program, timeshare
from orchestrate.ilp.partition import group_identical, partition
from orchestrate.plan import planner
from orchestrate.plan.candidates import Limits
from orchestrate.plan.planner import PlanOptions
from tests import graphs

LIMIT = 4.0
PIECE = 6  # primitives a partition


def _chain(b, x):
    """Ops in a period of five, cut every six: no two pieces alike, so each
    is a program of its own."""
    for i in range(24):
        x = (b.exp, b.tanh, b.relu, b.sigmoid, lambda v: b.mul(v, 0.5))[i % 5](x)
    return x


def _graph():
    g = graphs.build(_chain, [(4, 64)])
    parts = partition(g, max_nodes=PIECE)
    assert len(group_identical(g, parts)) == len(parts) >= 4
    return g, len(parts)


def _plan(g):
    options = PlanOptions(
        device="h100", time_limit=LIMIT, limits=Limits(partition_nodes=PIECE), reproducible=True
    )
    return planner.plan(g, options).plan


def _hard_first(monkeypatch, first_log: str = ""):
    """CBC as it is, but its first program takes all of its time limit (then,
    where ``first_log`` is given, says it was stopped with that log)."""
    real = program.solve_cbc
    limits = []

    def solve(prob, **options):
        limits.append(options["timeLimit"])
        if len(limits) > 1:
            return real(prob, **options)
        time.sleep(options["timeLimit"])
        if not first_log:
            prob.status = pulp.LpStatusNotSolved
            return "Result - Stopped on time limit\n\nNo feasible solution found\n"
        return real(prob, **options) + first_log

    monkeypatch.setattr(program, "solve_cbc", solve)
    return limits


def test_a_program_that_takes_all_its_time_leaves_the_others_theirs(monkeypatch):
    g, n = _graph()
    limits = _hard_first(monkeypatch)
    p = _plan(g)
    # every program ran, the first with at most its share of the limit (by
    # size, the pieces being alike in size: about 1/n), the rest with time
    assert len(limits) == n
    assert limits[0] <= 1.5 * LIMIT / n
    assert all(t > program.MIN_SOLVE_S for t in limits[1:])
    # the first kept its greedy plan; the others were solved
    assert p.solver.status == "greedy" and p.solver.solves == n


def test_time_left_goes_back_to_a_program_the_clock_stopped(monkeypatch):
    g, n = _graph()
    limits = _hard_first(monkeypatch, "\nStopped on time\nGap: 0.25\n")
    p = _plan(g)
    # n programs, then the stopped one again with what the others left
    assert len(limits) == n + 1
    assert limits[-1] > limits[0]
    # solved to optimality the second time: the first solution was optimal after all
    assert p.solver.status == "optimal" and p.solver.gap == 0
    assert p.solver.solves == n + 1


def test_without_a_limit_every_program_has_none():
    clock = timeshare.share(None, [3, 1])
    assert clock() is None


@pytest.mark.parametrize("sizes, part", [([1, 1, 2], 0.25), ([3, 1], 0.75), ([5], 1.0)])
def test_a_share_is_in_proportion_to_the_programs_size(sizes, part):
    clock = timeshare.share(8.0, sizes)
    assert 8.0 * part - 0.5 < clock() <= 8.0 * part


class _Program:
    """A program that needs ``needs`` seconds to find any plan (and then
    finds the optimum), as ``Problem.solve`` is called."""

    def __init__(self, needs: float, size: int = 10):
        self.needs, self.kernels, self.limits = needs, [None] * size, []

    def solve(self, prices, *, time_limit, recompute):
        self.limits.append(time_limit)
        if time_limit is not None and time_limit < self.needs:
            raise program.NoPlanInTime(f"no plan in {time_limit:g} s")
        return program.Solution((), program.OPTIMAL, 1.0, 0.0, 0.0, 1)


def test_a_program_without_a_plan_in_its_share_takes_the_time_left():
    slow, quick = _Program(needs=5.0), _Program(needs=0.0)
    solved = timeshare.solve_all(
        [slow, quick], None, timeshare.share(8.0, [1]), True, lambda *a: None
    )
    assert [s.status for s in solved] == [program.OPTIMAL] * 2
    assert slow.limits[0] < 5.0 <= slow.limits[1]  # its half, then all of it
    # the last program has all that is left: no plan there is the user's error
    with pytest.raises(program.NoPlanInTime):
        timeshare.solve_all(
            [quick, _Program(needs=60.0)], None, timeshare.share(8.0, [1]), True, lambda *a: None
        )


class _Stopped:
    """A program the clock stops the first time and once more, with these
    (objective, gap) figures."""

    def __init__(self, *figures):
        self.figures, self.kernels = list(figures), [None]

    def solve(self, prices, *, time_limit, recompute):
        objective, gap = self.figures.pop(0)
        return program.Solution((), program.FEASIBLE, objective, gap, 0.0, 1)


@pytest.mark.parametrize(
    "first, again, objective, gap",
    [
        ((10.0, 0.5), (9.0, 0.1), 9.0, 0.1),  # the re-solve's plan and bound
        ((9.0, 0.5), (10.0, 0.15), 9.0, 0.5 / 9),  # the first plan, the re-solve's bound
    ],
)
def test_a_re_solved_program_keeps_the_better_plan_and_the_higher_bound(
    first, again, objective, gap
):
    (sol,) = timeshare.solve_all(
        [_Stopped(first, again)], None, timeshare.share(8.0, [1]), True, lambda *a: 0
    )
    assert sol.status == program.FEASIBLE and sol.rounds == 2
    assert sol.objective_us == objective and sol.gap == pytest.approx(gap)


def test_a_memory_budget_plans_within_the_time_limit(monkeypatch):
    """Under --memory-budget each partition's frontier is a series of
    programs; they share the planning's time like the rest (each once had
    the whole --time-limit: n partitions, n times the limit).  Here no
    budgeted program finds a plan before its time ends: the planning stops
    near the limit and says the least it found is not proven."""
    g, n = _graph()
    real = program.solve_cbc
    budgeted = []

    def solve(prob, tight=False, **options):
        if tight:  # the fastest plans, solved as they are
            return real(prob, tight=tight, **options)
        budgeted.append(options["timeLimit"])
        time.sleep(options["timeLimit"])
        prob.status = pulp.LpStatusNotSolved
        return "Result - Stopped on time limit\n\nNo feasible solution found\n"

    monkeypatch.setattr(program, "solve_cbc", solve)
    options = PlanOptions(
        device="h100",
        time_limit=LIMIT,
        limits=Limits(partition_nodes=PIECE),
        memory_budget=0,
        recompute=False,
    )
    started = time.perf_counter()
    with pytest.raises(program.BudgetInfeasible, match="not proven least: a search hit"):
        planner.plan(g, options)
    assert time.perf_counter() - started < 1.5 * LIMIT
    # every partition whose fastest plan writes bytes tried its frontier, in its share
    assert n - 1 <= len(budgeted) <= n and sum(budgeted) <= LIMIT
