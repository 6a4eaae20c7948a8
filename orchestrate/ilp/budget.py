"""A memory budget across partitions: per-partition frontiers, one knapsack.

``--memory-budget`` bounds the bytes of intermediate tensors the whole plan
writes, which couples the partitions; but both what it bounds and what is
minimised (time) are sums over partitions.  So, for each distinct partition,
:func:`frontier` finds its Pareto frontier of plans by the epsilon-constraint
method: the fastest plan, then the fastest that writes fewer bytes than the
last, and so on until no plan writes fewer.  :func:`choose` then picks one
frontier point per partition, least total time within the budget (a
multiple-choice knapsack, itself a small binary program).  Both steps are
exact, so the result is the optimum of the one program over the whole graph,
found from small programs; and when the budget is infeasible the least that
fits is known exactly: the sum of each partition's smallest point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrate.ilp import program, timeshare
from orchestrate.ilp.partition import Partition, transplant
from orchestrate.ilp.program import BudgetInfeasible, NoPlanInTime, Solution
from orchestrate.ir import Graph
from orchestrate.plan import materialized

MAX_POINTS = 32  # frontier points per partition before the search stops


@dataclass(frozen=True)
class Point:
    """One plan of a partition on its frontier."""

    bytes: int  # intermediate bytes it writes
    time_us: float  # its predicted time
    solution: Solution


def frontier(
    solve: Callable[[int | None], Solution],
    bytes_of: Callable[[Solution], int],
    fastest: Solution | None = None,
    max_points: int = MAX_POINTS,
) -> tuple[list[Point], bool]:
    """The frontier, fastest point first (bytes strictly falling, time rising),
    and whether it is complete.  ``solve(b)`` is the partition's program with
    budget ``b`` (None: none), raising BudgetInfeasible when nothing fits and
    NoPlanInTime when its time limit ends the search first (the frontier is
    then incomplete: its last point need not be the least)."""
    sol = fastest if fastest is not None else solve(None)
    points = [Point(bytes_of(sol), sol.objective_us, sol)]
    while points[-1].bytes > 0:
        if len(points) >= max_points:
            return points, False
        try:
            sol = solve(points[-1].bytes - 1)
        except BudgetInfeasible:
            break
        except NoPlanInTime:
            return points, False
        points.append(Point(bytes_of(sol), sol.objective_us, sol))
    return points, True


def least(frontiers: Sequence[Sequence[Point]]) -> int:
    """The fewest bytes any combination writes."""
    return sum(f[-1].bytes for f in frontiers)


def choose(frontiers: Sequence[Sequence[Point]], budget: int) -> list[int] | None:
    """The point each partition takes: least total time with total bytes
    within ``budget``; None when even the least exceeds it."""
    import pulp  # here: loading and running a bundle needs no PuLP

    if least(frontiers) > budget:
        return None
    prob = pulp.LpProblem("budget", pulp.LpMinimize)
    z = [
        [pulp.LpVariable(f"z{p}_{i}", cat=pulp.LpBinary) for i in range(len(f))]
        for p, f in enumerate(frontiers)
    ]
    prob += pulp.lpSum(pt.time_us * v for f, zs in zip(frontiers, z) for pt, v in zip(f, zs))
    for zs in z:
        prob += pulp.lpSum(zs) == 1
    prob += (
        pulp.lpSum(pt.bytes * v for f, zs in zip(frontiers, z) for pt, v in zip(f, zs)) <= budget
    )
    program.solve_cbc(prob)
    if prob.status != pulp.LpStatusOptimal:
        raise AssertionError("the budget knapsack failed although its least fits")
    return [max(range(len(zs)), key=lambda i: zs[i].value() or 0) for zs in z]


def within_budget(
    graph: Graph,
    groups: Mapping[Partition, list[Partition]],
    problems,
    fastest: Mapping[int, Solution],
    prices,
    options,
    left: timeshare.Clock,
    stats: program.Stats,
    report,
) -> dict[int, list]:
    """The fastest plan within ``options.memory_budget``: a frontier per
    distinct partition (``problems`` by representative index), then one
    point per partition.  Returns each partition's (spec, writes) choices.
    ``left``: the planning's time left, shared among the partitions' frontiers
    by size (``timeshare``); a frontier its share stops is incomplete."""
    frontiers, complete = {}, True
    sizes = [timeshare.size(problems[rep.index]) for rep in groups]
    for i, rep in enumerate(groups):
        report("frontier", i + 1, len(groups))
        prob = problems[rep.index]
        until = timeshare.share(left(), sizes[i:])

        def solve(b, prob=prob, until=until):
            sol = prob.solve(
                prices,
                time_limit=until(),
                recompute=options.recompute,
                budget=b,
                budget_exempt=set(graph.outputs),
            )
            stats.add(sol)
            return sol

        def written(sol, prob=prob):
            return materialized(graph, [(k.template, ws) for k, ws in prob.chosen(sol)])

        frontiers[rep.index], done = frontier(solve, written, fastest[rep.index])
        complete &= done
    order = [(rep, p) for rep, copies in groups.items() for p in copies]
    per_part = [frontiers[rep.index] for rep, _ in order]
    picks = choose(per_part, options.memory_budget)
    if picks is None:
        need = least(per_part)
        raise BudgetInfeasible(
            f"--memory-budget {options.memory_budget}: no plan fits; every plan "
            f"materialises at least {need} bytes of intermediate tensors"
            if complete
            else f"--memory-budget {options.memory_budget}: no plan fits; the least found "
            f"is {need} bytes (not proven least: a search hit --time-limit or "
            f"{MAX_POINTS} plans per partition)"
        )
    if not complete and stats.status == program.OPTIMAL:
        stats.status = program.FEASIBLE
    out = {}
    for (rep, p), i in zip(order, picks):
        prob = problems[rep.index]
        out[p.index] = transplant(rep, p, prob.chosen(frontiers[rep.index][i].solution))
    return out
