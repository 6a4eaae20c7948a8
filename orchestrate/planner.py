"""Plan a primitive graph: candidates -> costs -> linear program -> plan.

    partition   cut at single-tensor fork points          (ilp.partition)
    enumerate   legal kernels per partition               (kernels.enumerate)
    cost        roofline per candidate, once per hash     (cost.roofline)
    greedy      baseline and warm start                   (ilp.baselines)
    solve       binary linear program + cycle cuts        (ilp.program)
    check       the plan checker, on every plan           (ilp.checker)

Partitions with identical structure are solved once.  With a memory budget
all partitions go into one program, since the budget couples them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrate import ir
from orchestrate.cost.devices import Device, get_device
from orchestrate.cost.roofline import Config, Cost, cost, us_for_bytes, working_set_rejection
from orchestrate.errors import InputError
from orchestrate.ilp import budget, program
from orchestrate.ilp.baselines import Priced, greedy, unfused
from orchestrate.ilp.checker import check_plan
from orchestrate.ilp.partition import Partition, partition, signature
from orchestrate.kernels.attention import attention_candidates
from orchestrate.kernels.enumerate import Limits, enumerate_kernels, structural_hash
from orchestrate.kernels.templates import VIEW, Kernel

PLAN_FORMAT = "orchestrate-plan/1"
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class PlanOptions:
    device: str | None = None
    memory_budget: int | None = None
    time_limit: float | None = 60.0  # seconds per linear program
    tf32: bool = False
    recompute: bool = True  # a primitive may be computed by several kernels
    limits: Limits = field(default_factory=Limits)
    reproducible: bool = False  # write 0 for wall-clock fields

    def __post_init__(self):
        if self.memory_budget is not None and self.memory_budget < 0:
            raise InputError(f"--memory-budget {self.memory_budget}: must be >= 0")
        if self.time_limit is not None and self.time_limit <= 0:
            raise InputError(f"--time-limit {self.time_limit}: must be > 0")


@dataclass
class _Problem:
    """The candidates of one partition (or of all, under a budget)."""

    kernels: list[Kernel]
    costs: list[Cost]
    available: set[str]
    required: list[str]
    warm: list[program.Choice]
    examined: int = 0
    rejected: int = 0
    pruned: int = 0
    truncated: bool = False


def plan(
    graph: ir.Graph, options: PlanOptions = PlanOptions(), progress: Progress | None = None
) -> dict:
    """The optimal plan for ``graph`` as a JSON-able dict (see PLAN.json)."""
    started = time.perf_counter()
    report = progress or (lambda stage, i, n: None)
    device = get_device(options.device)
    config = Config(tf32=options.tf32)
    parts = partition(graph)
    sigs = [signature(graph, p) for p in parts]
    unique = list(dict.fromkeys(sigs))
    cost_cache: dict[str, Cost] = {}
    problems: dict[str, _Problem] = {}
    greedy_by_part: dict[int, list[Priced]] = {}
    for i, sig in enumerate(unique):
        report("enumerate", i + 1, len(unique))
        rep = parts[sigs.index(sig)]
        problems[sig] = _build(graph, rep, device, config, options.limits, cost_cache)
    greedy_by_sig = {
        sig: greedy(graph, parts[sigs.index(sig)].nodes, device, config) for sig in unique
    }
    for p, sig in zip(parts, sigs):  # identical partitions fuse identically
        rep, done = parts[sigs.index(sig)], greedy_by_sig[sig]
        moved = _transplant(graph, rep, p, [(g.kernel, g.writes) for g in done])
        greedy_by_part[p.index] = [
            Priced(k, writes, g.time_us, g.bytes, g.flops) for (k, writes), g in zip(moved, done)
        ]
    write_us = {n.name: us_for_bytes(n.type.nbytes, device) for n in graph.nodes}
    nbytes = {n.name: n.type.nbytes for n in graph.nodes}
    unfused_plan = unfused(graph, device, config)
    part_of = {n: p.index for p in parts for n in p.nodes}
    for sig, prob in problems.items():
        rep = parts[sigs.index(sig)]
        # both baselines' kernels are candidates, so the optimum is never worse
        mine = [u for u in unfused_plan if all(part_of[n] == rep.index for n in u.kernel.nodes)]
        _ensure_candidates(graph, prob, mine, device, config, cost_cache)
        prob.warm = _ensure_candidates(
            graph, prob, greedy_by_part[rep.index], device, config, cost_cache
        )
    solutions: dict[int, list[tuple[Kernel, tuple[str, ...]]]] = {}
    stats = {"status": program.OPTIMAL, "gap": 0.0, "rounds": 0}
    fastest: dict[str, program.Solution] = {}
    for i, sig in enumerate(unique):
        report("solve", i + 1, len(unique))
        rep = parts[sigs.index(sig)]
        prob = problems[sig]
        sol = program.solve(
            prob.kernels, prob.costs, write_us, nbytes, prob.available, prob.required,
            warm=prob.warm, time_limit=options.time_limit, recompute=options.recompute,
            edges=primitive_edges(graph, rep.nodes), name=f"partition {rep.index}",
        )  # fmt: skip
        _merge_stats(stats, sol)
        fastest[sig] = sol
        chosen = [(prob.kernels[c.kernel], c.writes) for c in sol.choices]
        for p, s in zip(parts, sigs):
            if s == sig:
                solutions[p.index] = _transplant(graph, rep, p, chosen)
    over = _materialized(graph, ((k.template, ws) for sol in solutions.values() for k, ws in sol))
    if options.memory_budget is not None and over > options.memory_budget:
        # (a fastest plan that fits is the optimum under the budget too)
        solutions = _within_budget(
            graph, parts, sigs, problems, fastest, write_us, nbytes, options, stats, report
        )
    kernels = []
    for p in parts:
        for k, writes in solutions[p.index]:
            kernels.append(_entry(graph, k, writes, p.index, device, config, cost_cache))
    raw_us = [k.pop("_us") for k in kernels]
    for i, k in enumerate(kernels):
        k["name"] = f"k{i:03d}_{k['template']}"
    check_plan(graph, kernels)
    rejected = _unfused_neighbours(graph, kernels, device, config)
    baselines = {
        "unfused": _summary(graph, unfused_plan),
        "greedy": _summary(graph, [g for p in parts for g in greedy_by_part[p.index]]),
    }
    seconds = 0.0 if options.reproducible else round(time.perf_counter() - started, 1)
    return {
        "format": PLAN_FORMAT,
        "device": device.name,
        "options": {
            "memory_budget": options.memory_budget,
            "time_limit": options.time_limit,
            "tf32": options.tf32,
            "recompute": options.recompute,
            "max_kernel_nodes": options.limits.max_nodes,
        },
        "graph": {
            "name": graph.name,
            "inputs": [i.name for i in graph.inputs],
            "input_types": [
                {"name": i.name, "shape": list(i.type.shape), "dtype": i.type.dtype}
                for i in graph.inputs
            ],
            "outputs": list(graph.outputs),
            "constants": sorted(graph.constants),
        },
        "kernels": kernels,
        "summary": {
            "kernels": sum(1 for k in kernels if k["template"] != VIEW),
            "views": sum(1 for k in kernels if k["template"] == VIEW),
            "bytes": sum(k["bytes"] for k in kernels),
            "flops": sum(k["flops"] for k in kernels),
            "predicted_us": _r(sum(raw_us)),
            "materialized_bytes": _materialized(
                graph, ((k["template"], k["outputs"]) for k in kernels)
            ),
        },
        "baselines": baselines,
        "solver": {
            "status": stats["status"],
            "gap": _r(stats["gap"]),
            "seconds": seconds,
            "partitions": len(parts),
            "unique_partitions": len(unique),
            "candidates": sum(len(p.kernels) for p in problems.values()),
            "examined": sum(p.examined for p in problems.values()),
            "rejected": sum(p.rejected for p in problems.values()),
            "pruned": sum(p.pruned for p in problems.values()),
            "truncated_partitions": sum(1 for p in problems.values() if p.truncated),
            "solves": stats["rounds"],
        },
        "rejected": rejected,
        "primitives": [_primitive(n) for n in graph.nodes],
    }


def _unfused_neighbours(graph, kernels: list[dict], device, config) -> list[dict]:
    """For each producer/consumer pair of chosen kernels: why they were not
    one kernel (a legality reason, or the price of the fused kernel)."""
    from orchestrate.ilp.baselines import fused_no_recompute
    from orchestrate.kernels.templates import Rejection, classify

    writer = {}
    for k in kernels:
        for t in k["outputs"]:
            writer.setdefault(t, k)
    out = []
    seen = set()
    for k in kernels:
        for t in k["inputs"]:
            src = writer.get(t)
            if src is None or (src["name"], k["name"]) in seen:
                continue
            seen.add((src["name"], k["name"]))
            merged = classify(graph, src["primitives"] + k["primitives"])
            if isinstance(merged, Rejection):
                reason = merged.reason
            else:
                priced = fused_no_recompute(graph, merged.nodes, device, config)
                if isinstance(priced, Rejection):
                    reason = priced.reason
                else:
                    apart = src["predicted_us"] + k["predicted_us"]
                    reason = (
                        f"legal as one {merged.template} kernel but predicted "
                        f"{priced.time_us:.2f} us vs {apart:.2f} us apart"
                    )
            out.append(
                {"producer": src["name"], "consumer": k["name"], "tensor": t, "reason": reason}
            )
    return out


def primitive_edges(graph: ir.Graph, nodes) -> list[tuple[str, str]]:
    inside = set(nodes)
    return [(q, n) for n in nodes for q in graph.producer[n].inputs if q in inside]


def _build(graph, part: Partition, device, config, limits, cost_cache) -> _Problem:
    e = enumerate_kernels(graph, part.nodes, limits)
    kernels, costs, rejected = [], [], e.rejected
    for k in e.kernels:
        if working_set_rejection(graph, k, device):
            rejected += 1
            continue
        kernels.append(k)
        costs.append(_cached_cost(graph, k, device, config, cost_cache))
    # -- the attention rule: flash-attention kernels that enumeration (one
    # compute anchor per set) never builds; legal by construction (classify
    # delegates sets with two matmuls to the same legality check)
    for k in attention_candidates(graph, part.nodes):
        if working_set_rejection(graph, k, device):
            rejected += 1
            continue
        kernels.append(k)
        costs.append(_cached_cost(graph, k, device, config, cost_cache))
    # -- end of the attention rule
    available = set(part.inputs)
    return _Problem(kernels, costs, available, list(part.outputs), [], e.examined, rejected,
                    e.pruned, e.truncated)  # fmt: skip


def _cached_cost(graph, k: Kernel, device, config, cache) -> Cost:
    h = structural_hash(graph, k)
    if h not in cache:
        cache[h] = cost(graph, k, device, config)
    return cache[h]


def _ensure_candidates(
    graph, prob: _Problem, plan_: list[Priced], device, config, cache
) -> list[program.Choice]:
    """Add the kernels of ``plan_`` to the candidates; return them as choices."""
    index = {(k.nodes, k.outputs): i for i, k in enumerate(prob.kernels)}
    choices = []
    for p in plan_:
        key = (p.kernel.nodes, p.kernel.outputs)
        if key not in index:
            index[key] = len(prob.kernels)
            prob.kernels.append(p.kernel)
            prob.costs.append(_cached_cost(graph, p.kernel, device, config, cache))
        choices.append(program.Choice(index[key], p.writes))
    return choices


def _merge_stats(stats: dict, sol: program.Solution) -> None:
    if sol.status != program.OPTIMAL:
        stats["status"] = sol.status
    if not math.isnan(sol.gap):
        stats["gap"] = max(stats["gap"], sol.gap)
    stats["rounds"] += sol.rounds


def _transplant(graph, src: Partition, dst: Partition, chosen):
    """Map a solution of ``src`` onto the identically structured ``dst``."""
    if src.index == dst.index:
        return chosen
    rename = dict(zip(src.nodes, dst.nodes)) | dict(zip(src.inputs, dst.inputs))
    out = []
    for k, writes in chosen:
        out.append(
            (
                Kernel(
                    k.template,
                    tuple(rename[n] for n in k.nodes),
                    tuple(rename[t] for t in k.inputs),
                    tuple(rename[t] for t in k.outputs),
                    tuple(rename[t] for t in k.optional),
                    rename[k.anchor] if k.anchor else None,
                    k.space,
                ),
                tuple(rename[t] for t in writes),
            )
        )
    return out


def _within_budget(graph, parts, sigs, problems, fastest, write_us, nbytes, options, stats,
                   report):  # fmt: skip
    """The fastest plan within --memory-budget (see ilp.budget): a frontier
    per distinct partition, then one point per partition."""
    unique = list(fastest)
    frontiers, complete = {}, True
    for i, sig in enumerate(unique):
        report("frontier", i + 1, len(unique))
        rep, prob = parts[sigs.index(sig)], problems[sig]

        def solve(b, rep=rep, prob=prob):
            sol = program.solve(
                prob.kernels, prob.costs, write_us, nbytes, prob.available, prob.required,
                time_limit=options.time_limit, recompute=options.recompute,
                edges=primitive_edges(graph, rep.nodes), name=f"partition {rep.index}",
                budget=b, budget_exempt=set(graph.outputs),
            )  # fmt: skip
            _merge_stats(stats, sol)
            return sol

        def written(sol, prob=prob):
            return _materialized(
                graph, ((prob.kernels[c.kernel].template, c.writes) for c in sol.choices)
            )

        frontiers[sig], done = budget.frontier(solve, written, fastest[sig])
        complete &= done
    per_part = [frontiers[sig] for sig in sigs]
    picks = budget.choose(per_part, options.memory_budget)
    if picks is None:
        need = budget.least(per_part)
        raise program.BudgetInfeasible(
            f"--memory-budget {options.memory_budget}: no plan fits; every plan "
            f"materialises at least {need} bytes of intermediate tensors"
            if complete
            else f"--memory-budget {options.memory_budget}: no plan fits; the least found "
            f"is {need} bytes (not proven least: a search hit --time-limit or "
            f"{budget.MAX_POINTS} plans per partition)"
        )
    if not complete and stats["status"] == program.OPTIMAL:
        stats["status"] = program.FEASIBLE
    out = {}
    for p, sig, i in zip(parts, sigs, picks):
        rep, prob = parts[sigs.index(sig)], problems[sig]
        chosen = [(prob.kernels[c.kernel], c.writes) for c in frontiers[sig][i].solution.choices]
        out[p.index] = _transplant(graph, rep, p, chosen)
    return out


def _entry(graph, k: Kernel, writes, part_index, device: Device, config, cache) -> dict:
    c = _cached_cost(graph, k, device, config, cache)
    extra = [t for t in writes if t not in k.outputs]
    extra_bytes = sum(graph.types[t].nbytes for t in extra)
    mem = c.memory_us + us_for_bytes(extra_bytes, device)
    t = 0.0 if k.template == VIEW else max(mem, c.compute_us) + c.launch_us
    bound = "view" if k.template == VIEW else (
        "launch" if max(mem, c.compute_us) < c.launch_us
        else "compute" if c.compute_us > mem else "memory"
    )  # fmt: skip
    return {
        "name": "",
        "template": k.template,
        "primitives": list(k.nodes),
        "inputs": list(k.inputs),
        "outputs": list(writes),
        "anchor": k.anchor,
        "bytes": c.bytes + extra_bytes,
        "flops": c.flops,
        "predicted_us": _r(t),
        "_us": t,
        "bound": bound,
        "partition": part_index,
        "hash": structural_hash(graph, k),
    }


def _summary(graph, priced: list[Priced]) -> dict:
    real = [p for p in priced if p.kernel.template != VIEW]
    return {
        "kernels": len(real),
        "bytes": sum(p.bytes for p in priced),
        "predicted_us": _r(sum(p.time_us for p in priced)),
    }


def _materialized(graph, written) -> int:
    """Bytes of the intermediate tensors that (template, tensors written)
    pairs put in memory: what --memory-budget bounds (a view writes nothing)."""
    tensors = {t for template, ts in written if template != VIEW for t in ts}
    return sum(graph.types[t].nbytes for t in tensors if t not in graph.outputs)


def _primitive(n: ir.Node) -> dict:
    return {
        "name": n.name,
        "op": n.op.value,
        "inputs": list(n.inputs),
        "shape": list(n.shape),
        "dtype": n.dtype,
        "origin": n.origin,
    }


def _r(x: float) -> float:
    return round(float(x), 4)
