"""The binary linear program: optimal (equal to brute force), recomputation,
memory budgets, cycle cuts, and the known fusion cases."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest

from orchestrate.cost.devices import get_device
from orchestrate.cost.roofline import cost
from orchestrate.cost.terms import us_for_bytes
from orchestrate.errors import InputError
from orchestrate.ilp import program
from orchestrate.ilp.checker import schedule
from orchestrate.kernels.spec import Elementwise, KernelSpec, LaunchConfig, Target
from orchestrate.plan import Plan, planner
from orchestrate.plan.candidates import enumerate_kernels
from orchestrate.plan.planner import PlanOptions
from tests import graphs

DEVICE = get_device("h100")


def plan(g, options: PlanOptions | None = None) -> Plan:
    return planner.plan(g, options or PlanOptions()).plan


def _problem(g):
    kernels = enumerate_kernels(g, [n.name for n in g.nodes], Target(DEVICE)).kernels
    costs = [cost(g, k, DEVICE) for k in kernels]
    write_us = {n.name: us_for_bytes(n.type.nbytes, DEVICE) for n in g.nodes}
    nbytes = {n.name: n.type.nbytes for n in g.nodes}
    available = {i.name for i in g.inputs} | set(g.constants)
    return kernels, costs, write_us, nbytes, available


def _brute_force(g, kernels, costs, write_us, nbytes, available, budget=None, recompute=True):
    """Cheapest valid plan by trying every set of (kernel, optional writes) choices."""
    options = []
    for k, (kern, c) in enumerate(zip(kernels, costs)):
        for r in range(len(kern.optional) + 1):
            for extra in itertools.combinations(kern.optional, r):
                mem = c.memory_us + sum(write_us[t] for t in extra)
                options.append(
                    (k, kern.outputs + extra, max(mem, c.compute_us, c.latency_us) + c.launch_us)
                )
    best = math.inf
    # choose at most one option per kernel
    per_kernel: dict[int, list] = {}
    for o in options:
        per_kernel.setdefault(o[0], []).append(o)
    slots = [[None] + v for _, v in sorted(per_kernel.items())]
    required = set(g.outputs)
    for combo in itertools.product(*slots):
        chosen = [o for o in combo if o is not None]
        if not chosen:
            continue
        total = sum(o[2] for o in chosen)
        if total >= best:
            continue
        written = {t for o in chosen for t in o[1]}
        if not required <= written:
            continue
        if not recompute:
            seen = [n for o in chosen for n in kernels[o[0]].nodes]
            if len(seen) != len(set(seen)):
                continue
        if budget is not None:
            real = {t for o in chosen if kernels[o[0]].template != "view" for t in o[1]}
            if sum(nbytes[t] for t in real if t not in g.outputs) > budget:
                continue
        order, stuck = schedule([kernels[o[0]] for o in chosen], [o[1] for o in chosen], available)
        if stuck:
            continue
        best = total
    return best


SEEDS = [s for s in range(60) if len(graphs.random_dag(s).nodes) <= 6][:24]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("recompute", [True, False])
def test_ilp_equals_brute_force(seed, recompute):
    g = graphs.random_dag(seed)
    kernels, costs, write_us, nbytes, available = _problem(g)
    slots = sum(len(k.optional) for k in kernels) + len(kernels)
    if slots > 22:
        pytest.skip(f"{slots} choices: too many to brute-force")
    sol = program.solve(
        kernels, costs, write_us, nbytes, available, list(g.outputs), recompute=recompute
    )
    assert sol.status == "optimal"
    want = _brute_force(g, kernels, costs, write_us, nbytes, available, recompute=recompute)
    assert sol.objective_us == pytest.approx(want, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_one_program_resolved_without_candidates_equals_each_built_without_them(seed):
    """``solve_each_without`` (what a rule's candidates are worth) re-solves
    one built program with candidates barred in turn: each optimum equals
    that of the program built from the candidates left, its choices avoid
    the barred ones, and the order of the re-solves does not matter."""
    g = graphs.random_dag(seed)
    kernels, costs, write_us, nbytes, available = _problem(g)
    fused = [k for k, kern in enumerate(kernels) if len(kern.nodes) > 1]
    if not fused:
        pytest.skip("no fused candidate to bar")
    rng = np.random.default_rng(seed)
    drops = [set(fused), {fused[0]}, set(rng.choice(fused, (len(fused) + 1) // 2).tolist())]
    want = []
    for drop in drops:
        keep = [k for k in range(len(kernels)) if k not in drop]
        want.append(
            program.solve(
                [kernels[k] for k in keep],
                [costs[k] for k in keep],
                write_us,
                nbytes,
                available,
                list(g.outputs),
            ).objective_us
        )
    for order in (drops, drops[::-1]):
        found = program.solve_each_without(
            order, lambda i: None, kernels, costs, write_us, nbytes, available, list(g.outputs)
        )
        got = [f.objective_us for f in found]
        assert got == pytest.approx(want if order is drops else want[::-1], rel=1e-9, abs=1e-9)
        for drop, sol in zip(order, found):
            assert not {c.kernel for c in sol.choices} & drop
    best = program.solve(kernels, costs, write_us, nbytes, available, list(g.outputs))
    assert min(want) >= best.objective_us - 1e-9


@pytest.mark.parametrize("seed", SEEDS[:12])
def test_ilp_equals_brute_force_under_a_memory_budget(seed):
    g = graphs.random_dag(seed)
    kernels, costs, write_us, nbytes, available = _problem(g)
    if sum(len(k.optional) for k in kernels) + len(kernels) > 22:
        pytest.skip("too many choices to brute-force")
    free = program.solve(kernels, costs, write_us, nbytes, available, list(g.outputs))
    used = {t for c in free.choices if kernels[c.kernel].template != "view" for t in c.writes}
    used_bytes = sum(nbytes[t] for t in used if t not in g.outputs)
    for budget in (used_bytes, used_bytes // 2, 0):
        want = _brute_force(g, kernels, costs, write_us, nbytes, available, budget=budget)
        if math.isinf(want):
            with pytest.raises(InputError, match="memory-budget"):
                program.solve(
                    kernels,
                    costs,
                    write_us,
                    nbytes,
                    available,
                    list(g.outputs),
                    budget=budget,
                    budget_exempt=set(g.outputs),
                )
            continue
        sol = program.solve(
            kernels,
            costs,
            write_us,
            nbytes,
            available,
            list(g.outputs),
            budget=budget,
            budget_exempt=set(g.outputs),
        )
        assert sol.objective_us == pytest.approx(want, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("seed", SEEDS[:12])
def test_an_infeasible_budget_names_the_least_that_fits(seed):
    """The error gives the fewest intermediate bytes any plan writes: that
    budget is feasible, one byte less is not (and says the same)."""
    g = graphs.random_dag(seed)

    def solve(budget):
        return plan(g, PlanOptions(device="h100", memory_budget=budget)).solver

    try:
        solve(0)
        pytest.skip("every output is computed without materialising anything")
    except InputError as e:
        least = int(re.search(r"at least (\d+) bytes", str(e)).group(1))
    assert least > 0 and solve(least).status == "optimal"
    with pytest.raises(InputError, match=f"at least {least} bytes"):
        solve(least - 1)


def _kernels(p):
    return [k for k in p.kernels if k.template != "view"]


def test_softmax_becomes_one_row_reduce_kernel():
    p = plan(graphs.build(graphs.softmax, [(4096, 1024)]), PlanOptions(device="h100"))
    (k,) = _kernels(p)
    assert k.template == "row_reduce"
    assert sorted(x.op for x in p.primitives if x.name in k.primitives) == [
        "div",
        "exp",
        "reduce_max",
        "sub",
        "sum",
    ]
    assert p.solver.status == "optimal"


def test_layernorm_becomes_one_kernel():
    g = graphs.build(graphs.layernorm, [(128, 768), (768,), (768,)])
    p = plan(g, PlanOptions(device="a100"))
    (k,) = _kernels(p)
    assert k.template == "row_reduce" and len(k.primitives) == len(g.nodes)


def test_mlp_bias_and_gelu_fuse_into_the_matmul_epilogue():
    g = graphs.build(graphs.mlp, [(128, 768), (768, 3072), (3072,), (3072, 768)])
    p = plan(g, PlanOptions(device="h100"))
    first, second = _kernels(p)
    ops = {x.name: x.op for x in p.primitives}
    assert first.template == "matmul"
    # matmul, + bias, then gelu: h*0.5, h*(1/sqrt 2), erf, +1, product
    assert sorted(ops[n] for n in first.primitives) == [
        "add",
        "add",
        "erf",
        "matmul",
        "mul",
        "mul",
        "mul",
    ]
    assert second.template == "matmul" and len(second.primitives) == 1


def test_recomputation_beats_materialising():
    g = graphs.build(graphs.exp_into_two_reductions, [(1024, 1024)])
    p = plan(g, PlanOptions(device="h100"))
    exp = next(x.name for x in p.primitives if x.op == "exp")
    holders = [k for k in _kernels(p) if exp in k.primitives]
    assert len(holders) == 2, "exp is computed in both reduction kernels"
    assert all(exp not in k.outputs for k in holders), "exp(x) is never materialised"
    assert p.summary.predicted_us < p.baselines["greedy"].predicted_us
    strict = plan(g, PlanOptions(device="h100", recompute=False))
    assert strict.summary.predicted_us > p.summary.predicted_us


def test_ilp_is_never_worse_than_either_baseline():
    for seed in range(40, 52):
        p = plan(graphs.random_dag(seed, n_nodes=8), PlanOptions(device="l4"))
        assert p.summary.predicted_us <= p.baselines["greedy"].predicted_us + 1e-6
        assert p.summary.predicted_us <= p.baselines["unfused"].predicted_us + 1e-6


def test_memory_budget_trades_time_for_bytes():
    g = graphs.build(graphs.exp_into_two_reductions, [(512, 512)])
    free = plan(g, PlanOptions(device="h100", recompute=False))
    assert free.summary.materialized_bytes > 0
    with pytest.raises(InputError, match="memory-budget"):
        plan(g, PlanOptions(device="h100", recompute=False, memory_budget=0))
    tight = plan(g, PlanOptions(device="h100", memory_budget=0))
    assert tight.summary.materialized_bytes == 0


def test_a_budget_the_fastest_plan_meets_changes_nothing():
    """The fastest plan is optimal under any budget it meets; just below, the
    budgeted program must trade time for bytes (or say what would fit)."""
    g = graphs.build(
        lambda b, x, w: graphs.mlp(
            b,
            graphs.layernorm(b, x, w, w),
            *([b.constant(np.full(s, 0.01, np.float32)) for s in ((96, 384), (384,), (384, 96))]),
        ),
        [(64, 96), (96,)],
    )
    free = plan(g, PlanOptions(device="h100", reproducible=True))
    need = free.summary.materialized_bytes
    assert need > 0
    met = plan(g, PlanOptions(device="h100", reproducible=True, memory_budget=need))
    assert met.kernels == free.kernels and met.solver.status == "optimal"
    try:
        below = plan(g, PlanOptions(device="h100", memory_budget=need - 1))
    except InputError as e:
        assert "no plan fits" in str(e)
    else:
        assert below.summary.materialized_bytes < need
        assert below.summary.predicted_us >= free.summary.predicted_us


def _two_layers(b, x, g):
    """Residual layers whose exp feeds two reductions over different axes:
    recomputing it saves bytes, storing it saves time."""
    w = b.constant(np.full((64, 64), 0.01, np.float32))
    for _ in range(2):
        h = b.matmul(graphs.layernorm(b, x, g, g), w)
        e = b.exp(h)
        x = b.add(x, b.add(b.add(h, b.sum(e, [1])), b.reduce_max(e, [0])))
    return x


def test_budgets_across_partitions_are_exact_and_monotone():
    """The budget couples partitions; per-partition frontiers and a knapsack
    must find, for every budget, a plan within it, never faster than the
    fastest plan, no slower for a larger budget, and name exactly the least
    that fits (that figure plans, one byte less does not)."""
    from orchestrate.ilp.partition import partition

    g = graphs.build(_two_layers, [(64, 64), (64,)])
    assert len(partition(g)) > 1
    free = plan(g, PlanOptions(device="h100"))
    with pytest.raises(InputError, match=r"at least \d+ bytes") as e:
        plan(g, PlanOptions(device="h100", memory_budget=0))
    least = int(re.search(r"at least (\d+) bytes", str(e.value)).group(1))
    top = free.summary.materialized_bytes
    assert 0 < least < top
    with pytest.raises(InputError, match=f"at least {least} bytes"):
        plan(g, PlanOptions(device="h100", memory_budget=least - 1))
    times = []
    for b in sorted({least, (least + top) // 2, top - 1, top}):
        p = plan(g, PlanOptions(device="h100", memory_budget=b))
        assert p.summary.materialized_bytes <= b
        assert p.summary.predicted_us >= free.summary.predicted_us - 1e-9
        times.append(p.summary.predicted_us)
    assert times == sorted(times, reverse=True)
    assert times[-1] == pytest.approx(free.summary.predicted_us)


def test_same_model_and_options_give_identical_plans():
    import json

    g = graphs.build(graphs.mlp, [(64, 96), (96, 384), (384,), (384, 96)])
    a = json.dumps(plan(g, PlanOptions(reproducible=True, device="h200")).to_json())
    b = json.dumps(plan(g, PlanOptions(reproducible=True, device="h200")).to_json())
    assert a == b


def test_cost_model_by_hand():
    """Two kernels priced on paper, on the H100 row (3350 GB/s, 66.9 TFLOP/s
    fp32, 494.7 TF32) with the figures of cost/figures.py."""
    from orchestrate.cost.figures import (
        ACHIEVABLE_BANDWIDTH,
        FP32_DOT_EFFICIENCY,
        LAUNCH_US,
        TENSOR_CORE_EFFICIENCY,
    )

    g = graphs.build(graphs.softmax, [(4096, 1024)])
    (k,) = _kernels(plan(g, PlanOptions(device="h100")))
    elements = 4096 * 1024
    assert k.bytes == 2 * elements * 4  # read x once, write y once
    # reduce_max 1 + sub 1 + exp 8 + sum 1 + div 8 flops per element
    assert k.flops == 19 * elements
    # 1,024 blocks of 4 rows keep the whole device busy: the achievable bandwidth
    assert k.predicted_us == pytest.approx(
        2 * elements * 4 / (3350e3 * ACHIEVABLE_BANDWIDTH) + LAUNCH_US, rel=1e-4
    )
    assert k.bound == "memory"

    g = graphs.build(lambda b, x, w: b.matmul(x, w), [(2048, 2048), (2048, 2048)])
    for tf32, rate in (
        (False, 66.9e6 * FP32_DOT_EFFICIENCY),  # IEEE fp32 on CUDA cores
        (True, 494.7e6 * TENSOR_CORE_EFFICIENCY),
    ):
        options = PlanOptions(device="h100", tf32=tf32, gemm_backends=("triton",))
        (k,) = _kernels(plan(g, options))
        assert k.bytes == 3 * 2048 * 2048 * 4  # read A and B, write C
        assert k.flops == 2 * 2048**3
        blocks = (2048 // k.config["BLOCK_M"]) * (2048 // k.config["BLOCK_N"])
        waves = -(-blocks // 132) * 132 / blocks  # tiles in whole waves over 132 SMs
        assert k.predicted_us == pytest.approx(2 * 2048**3 / rate * waves + LAUNCH_US, rel=1e-4)
        assert k.bound == "compute"


def test_cycle_between_multi_output_kernels_is_cut():
    """Two convex multi-output kernels that feed each other form a cycle; the
    checker must catch it and the cut must remove it."""

    def kernel(nodes, inputs, outputs):
        return KernelSpec(
            "pointwise", nodes, inputs, outputs, (), (1,), Elementwise(), LaunchConfig()
        )

    a = kernel(("x", "y"), ("i", "v"), ("x", "y"))
    b = kernel(("u", "v"), ("x",), ("u", "v"))
    order, stuck = schedule([a, b], [a.outputs, b.outputs], {"i"})
    assert stuck == [0, 1] and order == []
    c1 = kernel(("x",), ("i",), ("x",))
    c2 = kernel(("u", "v"), ("x",), ("u", "v"))
    c3 = kernel(("y",), ("v",), ("y",))
    kernels = [a, b, c1, c2, c3]
    from orchestrate.cost.roofline import Cost

    # the cyclic pair is the cheapest on paper; the cut must route around it
    costs = [Cost(0, 0, 1.0, 0, 0), Cost(0, 0, 1.0, 0, 0)] + [Cost(0, 0, 1.5, 0, 0)] * 3
    sol = program.solve(kernels, costs, {}, {}, {"i"}, ["y", "u"])
    chosen = sorted(c.kernel for c in sol.choices)
    assert sol.rounds >= 2
    # a+b alone is a cycle; keeping both and letting c1 compute x from the
    # input (3.5 us) would write x twice (a and c1 both store it: one buffer,
    # one writer), so the way out is b, c1, c3 (4.0 us)
    assert chosen == [1, 2, 4]
    assert sol.objective_us == pytest.approx(4.0)
    order, stuck = schedule(
        [kernels[c.kernel] for c in sol.choices], [c.writes for c in sol.choices], {"i"}
    )
    assert not stuck


def test_greedy_warm_start_and_reported_solver_fields():
    p = plan(graphs.build(graphs.mlp, [(32, 64), (64, 256), (256,), (256, 64)]))
    s = p.solver
    assert s.status == "optimal" and s.gap == 0
    assert s.partitions >= 1 and s.candidates > len(p.primitives)
    assert s.seconds >= 0 and s.examined >= len(p.primitives) and s.solves >= 1


def test_cbc_takes_the_warm_start_whole(monkeypatch):
    """The unfused plan as the warm start: CBC starts from it.  It declines a
    start that leaves out an integer variable, as every start without the
    computed-primitive ones was.  (Under a budget, CBC 2.10's preprocessing,
    which the budgeted programs keep, declines even a whole start.)"""
    g = graphs.build(graphs.mlp, [(32, 64), (64, 256), (256,), (256, 64)])
    kernels, costs, write_us, nbytes, available = _problem(g)
    alone = {k.nodes[0]: i for i, k in enumerate(kernels) if len(k.nodes) == 1}
    warm = [program.Choice(alone[n.name], (n.name,)) for n in g.nodes]
    logs = []
    real = program.solve_cbc
    monkeypatch.setattr(
        program, "solve_cbc", lambda prob, **o: logs.append(real(prob, **o)) or logs[-1]
    )
    edges = [(i, n.name) for n in g.nodes for i in n.inputs if i in alone]
    sol = program.solve(
        kernels, costs, write_us, nbytes, available, list(g.outputs), warm=warm, edges=edges
    )
    assert sol.status == program.OPTIMAL
    assert "MIPStart provided solution" in logs[0], logs[0][-2000:]
    assert "could not be used" not in logs[0]


def test_cbc_runs_without_a_thread_to_wait_for():
    """CBC 2.10.3 with ``-threads 1`` waited 10 s for its worker thread to
    start in about one solve of fifteen; run serially, it starts none (its
    log's thread report is absent) and a trivial program takes no such wait."""
    import pulp

    for _ in range(3):
        prob = pulp.LpProblem("p", pulp.LpMinimize)
        x, y = (pulp.LpVariable(n, cat=pulp.LpBinary) for n in "xy")
        prob += x + 2 * y
        prob += x + y >= 1
        log = program.solve_cbc(prob, tight=True)
        assert prob.status == pulp.LpStatusOptimal and pulp.value(prob.objective) == 1
        assert "Objective value:" in log
        assert "Thread 0 used" not in log and "-threads" not in log, log[:1500]


def test_no_time_left_keeps_the_greedy_plan_only_where_it_fits_the_budget():
    """With the planning's time spent, a program keeps its warm start unsolved;
    under a budget that start exceeds, it has no plan to keep (a frontier's
    step then ends, ``ilp/budget.py``), not one that breaks the budget."""
    g = graphs.build(graphs.mlp, [(32, 64), (64, 256), (256,), (256, 64)])
    kernels, costs, write_us, nbytes, available = _problem(g)
    alone = {k.nodes[0]: i for i, k in enumerate(kernels) if len(k.nodes) == 1}
    warm = [program.Choice(alone[n.name], (n.name,)) for n in g.nodes]
    args = (kernels, costs, write_us, nbytes, available, list(g.outputs))
    kept = program.solve(*args, warm=warm, time_limit=0.0)
    assert kept.status == program.GREEDY and list(kept.choices) == warm
    stored = sum(nbytes[n.name] for n in g.nodes if n.name not in g.outputs)
    fits = program.solve(
        *args, warm=warm, time_limit=0.0, budget=stored, budget_exempt=set(g.outputs)
    )
    assert fits.status == program.GREEDY
    with pytest.raises(program.NoPlanInTime, match="no time was left"):
        program.solve(
            *args, warm=warm, time_limit=0.0, budget=stored - 1, budget_exempt=set(g.outputs)
        )


def test_enumeration_stays_tractable_on_a_wide_graph():
    """60 parallel branches joined by one concat have ~2^60 connected sets: the
    budgets stop the search (smallest sets kept), the plan says so, and the
    optimum still fuses the whole graph into one kernel."""

    def wide(b, x):
        return b.concat([b.exp(b.mul(x, float(i + 1))) for i in range(60)], 0)

    g = graphs.build(wide, [(4, 64)])
    p = plan(g, PlanOptions(device="h100"))
    s = p.solver
    assert s.truncated_partitions == 1 and s.candidates <= 2_000 + len(g.nodes) + 1
    assert s.status == "optimal"
    assert p.summary.kernels <= p.baselines["greedy"].kernels


def test_two_kernels_never_write_one_tensor():
    """Two candidates that both compute (and, as their sink, store) x: the
    program takes one of them, though both together are cheapest on paper."""

    def kernel(nodes, inputs, outputs):
        return KernelSpec(
            "pointwise", nodes, inputs, outputs, (), (1,), Elementwise(), LaunchConfig()
        )

    from orchestrate.cost.roofline import Cost

    a = kernel(("x", "y"), ("i",), ("x", "y"))  # y and x, both sinks
    b = kernel(("x", "z"), ("i",), ("x", "z"))
    y, z = kernel(("y",), ("i",), ("y",)), kernel(("z",), ("x",), ("z",))
    costs = [Cost(0, 0, 1.0, 0, 0)] * 2 + [Cost(0, 0, 1.6, 0, 0)] * 2
    sol = program.solve([a, b, y, z], costs, {}, {}, {"i"}, ["y", "z"])
    assert sorted(c.kernel for c in sol.choices) in ([0, 3], [1, 2])  # not a and b: x twice


def _scaled_layers(b, x, g):
    """Layers alike but for the scalar each scales by (written into the
    kernels' source as a literal); the last writes the graph's output."""
    w = b.constant(np.full((64, 64), 0.01, np.float32))
    for scale in (2.0, 3.0, 2.0):
        h = b.matmul(graphs.layernorm(b, x, g, g), w)
        x = b.add(x, b.mul(b.exp(h), b.constant(np.array(scale, np.float32))))
    return x


def test_partitions_that_differ_in_an_inlined_scalar_are_not_identical():
    """A partition solved once serves the identical ones renamed; layers that
    differ only in a scalar the source inlines are not identical (their
    kernels' hashes differ, and one function must not serve both)."""
    from orchestrate.bundle.regenerate import planned as regenerated
    from orchestrate.ilp.partition import group_identical, partition, signature

    g = graphs.build(_scaled_layers, [(64, 64), (64,)])
    parts = partition(g)
    assert len(parts) == 3 and len({signature(g, p) for p in parts}) == 3
    assert all(len(same) == 1 for same in group_identical(g, parts).values())
    made = plan(g, PlanOptions(device="h100", reproducible=True))
    regenerated(made, g, "scaled")  # every kernel's hash as the plan recorded it
