"""Plan a primitive graph: the stages composed, one call each.

    partition   cut at single-tensor fork points; identical ones grouped  (ilp.partition)
    enumerate   candidate specs per distinct partition, rules included   (plan.candidates)
    baselines   unfused and greedy, under the same cost model             (ilp.baselines)
    solve       binary linear program + cycle cuts, per distinct partition (ilp.problem)
    budget      per-partition frontiers and a knapsack, under a budget    (ilp.budget)
    assemble    kernels named, priced and checked                         (plan, cost, ilp.checker)

Prices are computed once per structural hash (``cost.roofline.Prices``).
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from orchestrate import ir
from orchestrate.cost import learned
from orchestrate.cost.devices import DEVICES, Device, get_device
from orchestrate.cost.measured import Measured
from orchestrate.cost.roofline import Prices, Ranker
from orchestrate.errors import InputError
from orchestrate.ilp import alternatives, budget, program, timeshare
from orchestrate.ilp.baselines import Priced, greedy, price, unfused
from orchestrate.ilp.checker import check_plan
from orchestrate.ilp.neighbours import unfused_neighbours
from orchestrate.ilp.partition import group_identical, partition, transplant
from orchestrate.ilp.problem import Problem, problem
from orchestrate.ilp.stitch import stitch
from orchestrate.ir import precision
from orchestrate.kernels.spec import GEMM_BACKENDS, VIEW, KernelSpec, Rejection, Target
from orchestrate.plan import (
    Declined,
    Options,
    Plan,
    Planned,
    PlannedKernel,
    RuleUse,
    Solver,
    Summary,
    Totals,
    Tuning,
    graph_info,
    kernel_name,
    materialized,
    primitive,
)
from orchestrate.plan.candidates import Limits, enumerate_kernels
from orchestrate.templates import match
from orchestrate.tune import tuner
from orchestrate.tune.tuner import Tune

Progress = Callable[[str, int, int], None]
MAX_KERNEL_NODES = 64  # the most primitives in one candidate kernel (--max-kernel-nodes)
Chosen = list[tuple[KernelSpec, tuple[str, ...]]]


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


class PlanOptionError(InputError):
    """A bad PlanOptions field.  The message names the field as the Python API
    spells it; ``field``, ``value`` and ``problem`` let the CLI name its flag."""

    def __init__(self, name: str, value, problem: str):
        super().__init__(f"{name}={value!r}: {problem}")
        self.field, self.value, self.problem = name, value, problem


@dataclass(frozen=True)
class PlanOptions:
    """How to plan.  Every field is checked here, so the CLI and the Python
    API refuse the same values (PlanOptionError, an InputError)."""

    device: str | None = None
    memory_budget: int | None = None
    time_limit: float | None = 60.0  # seconds for planning, all programs together; None: none
    tf32: bool = False
    recompute: bool = True  # a primitive may be computed by several kernels
    limits: Limits = field(default_factory=Limits)
    reproducible: bool = False  # write 0 for wall-clock fields
    dtype: str | None = None  # fp32, fp16, bf16 (precision.lower_precision); None: the model's
    # who may run matmuls, convolutions and attention: generated Triton kernels,
    # library calls (cuBLAS, cuDNN, SDPA through torch), or both competing
    gemm_backends: tuple[str, ...] = GEMM_BACKENDS
    rewrites: bool = True  # pattern rules propose their sets (--no-rewrites: none)
    # how kernels are priced: "analytic" (cost/roofline.py), "learned" (the
    # packaged learned correction, cost/learned.py) or a learned model's file
    cost: str = "analytic"

    def __post_init__(self):
        d = self.device
        if d is not None and (not isinstance(d, str) or d.lower() not in DEVICES):
            problem = "unknown device" if isinstance(d, str) else "expected a device name"
            raise PlanOptionError("device", d, f"{problem} (known: {', '.join(DEVICES)})")
        b = self.memory_budget
        if b is not None:
            if not _is_int(b) or b < 0:
                raise PlanOptionError("memory_budget", b, "must be an integer >= 0 (bytes)")
            object.__setattr__(self, "memory_budget", int(b))
        t = self.time_limit
        if t is not None:
            if (
                not isinstance(t, numbers.Real)
                or isinstance(t, bool)
                or not (math.isfinite(t) and t > 0)
            ):
                raise PlanOptionError("time_limit", t, "must be a finite number of seconds > 0")
            object.__setattr__(self, "time_limit", float(t))
        for name in ("tf32", "recompute", "reproducible", "rewrites"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                raise PlanOptionError(name, v, "must be True or False")
            object.__setattr__(self, name, bool(v))
        if self.dtype is not None and self.dtype not in precision.SUPPORTED:
            raise PlanOptionError("dtype", self.dtype, precision.unsupported(self.dtype))
        g = self.gemm_backends
        names = g.split(",") if isinstance(g, str) else g
        if (
            not isinstance(names, (tuple, list))
            or not names
            or any(n not in GEMM_BACKENDS for n in names)
            or len(set(names)) != len(names)
        ):
            raise PlanOptionError(
                "gemm_backends", g, f"expected one or both of {', '.join(GEMM_BACKENDS)}, each once"
            )
        object.__setattr__(self, "gemm_backends", tuple(b for b in GEMM_BACKENDS if b in names))
        if not isinstance(self.cost, str):
            raise PlanOptionError("cost", self.cost, "expected analytic, learned or a model file")
        if self.cost != "analytic":
            try:
                learned.header(self.cost_file)
            except InputError as e:  # (the message names the file; the flag names it too)
                problem = str(e).removeprefix(f"{self.cost_file}: ")
                raise PlanOptionError("cost", self.cost, problem) from None
        if not isinstance(self.limits, Limits):
            raise PlanOptionError(
                "limits", self.limits, "expected an orchestrate.plan.candidates.Limits"
            )
        for f in fields(Limits):
            v = getattr(self.limits, f.name)
            if not _is_int(v) or v < 1 or (f.name == "max_nodes" and v > MAX_KERNEL_NODES):
                top = f" and <= {MAX_KERNEL_NODES}" if f.name == "max_nodes" else ""
                raise PlanOptionError(f"limits.{f.name}", v, f"must be an integer >= 1{top}")

    @classmethod
    def names(cls) -> list[str]:
        """The keyword arguments PlanOptions takes."""
        return [f.name for f in fields(cls)]

    def target(self) -> Target:
        """The rules' target: configurations ranked by predicted time."""
        device = get_device(self.device)
        return Target(
            device,
            self.tf32,
            rank=Ranker(device),
            gemm_backends=self.gemm_backends,
            rewrites=self.rewrites,
        )

    @property
    def cost_file(self) -> Path | None:
        """The learned model's file (None: the analytic model)."""
        if self.cost == "analytic":
            return None
        return learned.PACKAGED if self.cost == "learned" else Path(self.cost)

    def prices(self, graph: ir.Graph, device: Device, measured: Measured | None = None) -> Prices:
        """The kernels' prices as ``cost`` says (measured ones first)."""
        path = self.cost_file
        correct = None if path is None else learned.load(path).corrector(graph, device)
        return Prices(graph, device, measured, correct)

    def _cost_name(self) -> str:
        path = self.cost_file
        if path is None:
            return "analytic"
        return f"learned {path.name} data sha256:{learned.header(path)['data'][:16]}"

    def record(self) -> Options:
        return Options(
            self.memory_budget,
            self.time_limit,
            self.tf32,
            self.recompute,
            self.limits.max_nodes,
            self.dtype,
            self.gemm_backends,
            self.rewrites,
            self._cost_name(),
        )


def plan(
    graph: ir.Graph,
    options: PlanOptions = PlanOptions(),
    progress: Progress | None = None,
    tune: Tune | None = None,
    admit: Callable[[ir.Graph, KernelSpec], KernelSpec | Rejection] | None = None,
) -> Planned:
    """The optimal plan for ``graph``; under ``tune``, priced by measurement
    where it measured (``orchestrate/tune/``, ``cost/measured.py``).  Every
    kernel must pass ``admit`` too (a dynamic plan's range, ``plan/admit.py``)."""
    started = time.perf_counter()
    report = progress or (lambda stage, i, n: None)

    def left() -> float | None:
        """The planning's time left for the next program: ``time_limit``
        bounds the planning, from its start (enumeration, which stops at
        half of it, the programs, and the re-solves that price each rule);
        at none left, a partition keeps its greedy plan."""
        if options.time_limit is None:
            return None
        return options.time_limit - (time.perf_counter() - started)

    # enumeration may take half the time, so that the programs have some
    enumeration_deadline = None if options.time_limit is None else started + options.time_limit / 2
    target = replace(options.target(), admit=admit)
    parts = partition(graph, max_nodes=options.limits.partition_nodes)
    groups = group_identical(graph, parts)  # representative partition -> its copies
    found = {}
    for i, rep in enumerate(groups):
        report("enumerate", i + 1, len(groups))
        found[rep.index] = enumerate_kernels(
            graph, rep.nodes, target, options.limits, deadline=enumeration_deadline
        )
    tuned = None
    if tune is not None:  # time the candidates' best configurations (cache first)
        every = (k for f in found.values() for k in f.kernels)
        tuned = tuner.tune(graph, every, target, tune, report, options.reproducible)
    prices = options.prices(graph, target.device, tuned.measured if tuned is not None else None)
    problems: dict[int, Problem] = {
        rep.index: problem(graph, rep, found[rep.index], prices) for rep in groups
    }
    unfused_plan = unfused(graph, target, prices)
    part_of = {n: p.index for p in parts for n in p.nodes}
    greedy_plan: list[Priced] = []
    for rep, copies in groups.items():
        prob = problems[rep.index]
        done = greedy(graph, rep.nodes, target, prices)
        # both baselines' kernels are candidates, so the optimum is never worse
        mine = [u for u in unfused_plan if all(part_of[n] == rep.index for n in u.kernel.nodes)]
        prob.include(prices, mine)
        prob.warm = prob.include(prices, done)
        for p in copies:  # identical partitions fuse identically
            moved = transplant(rep, p, [(g.kernel, g.writes) for g in done])
            greedy_plan += [
                Priced(k, w, g.time_us, g.bytes, g.flops) for (k, w), g in zip(moved, done)
            ]
    stats = program.Stats()
    fastest: dict[int, program.Solution] = {}
    solutions: dict[int, Chosen] = {}
    order = [problems[rep.index] for rep in groups]
    solved = timeshare.solve_all(order, prices, left, options.recompute, report)
    for (rep, copies), sol in zip(groups.items(), solved):
        stats.add(sol)
        fastest[rep.index] = sol
        for p in copies:
            solutions[p.index] = transplant(rep, p, problems[rep.index].chosen(sol))
    written = [(k.template, ws) for sol in solutions.values() for k, ws in sol]
    if options.memory_budget is not None and materialized(graph, written) > options.memory_budget:
        # (a fastest plan that fits is the optimum under the budget too)
        solutions = budget.within_budget(
            graph, groups, problems, fastest, prices, options, left, stats, report
        )
    # what each rule buys (``explain``), with the time left once the plan is found
    # (out of time, a partition kept its greedy plan: no figures without each rule)
    priced = [
        (rep, copies, sol)
        for (rep, copies), sol in zip(groups.items(), solved)
        if sol.status != program.GREEDY
    ]
    worth = alternatives.fired_all(
        [(problems[rep.index], sol) for rep, _, sol in priced], prices, left, options.recompute
    )
    fired = [(f, len(copies)) for (_, copies, _), found in zip(priced, worth) for f in found]
    # under --tune, each kernel at the fastest configuration measured
    chosen = [
        (k if tuned is None else tuned.apply(k), ws, p.index)
        for p in parts
        for k, ws in solutions[p.index]
    ]
    chosen, stitched = stitch(graph, chosen, parts, target, prices)
    greedy_plan = _stitched(graph, greedy_plan, parts, part_of, target, prices)
    seconds = 0.0 if options.reproducible else round(time.perf_counter() - started, 1)
    solver = Solver(
        stats.status,
        _r(stats.gap),
        seconds,
        len(parts),
        len(groups),
        sum(len(p.kernels) for p in problems.values()),
        sum(p.found.examined for p in problems.values()),
        sum(p.found.rejected for p in problems.values()),
        sum(p.found.pruned for p in problems.values()),
        sum(1 for p in problems.values() if p.found.truncated),
        stats.rounds,
        stitched.merges,
        stitched.saved_us,
    )
    declined = tuple(Declined(*d) for p in problems.values() for d in p.found.declined)
    baselines = {"unfused": _totals(unfused_plan), "greedy": _totals(greedy_plan)}
    uses = _rule_uses(fired, lambda k: k if tuned is None else tuned.apply(k))
    return assemble(
        graph,
        chosen,
        target,
        prices,
        options.record(),
        solver,
        baselines,
        declined,
        uses,
        tuning=tuned.report if tuned is not None else None,
    )


def plan_sets(
    graph: ir.Graph,
    sets: Sequence[Sequence[str]],
    options: PlanOptions = PlanOptions(),
    writes_all: bool = True,
) -> Planned:
    """A plan whose kernels are exactly ``sets``, in order, each writing what
    is read outside it (``writes_all``) or only its sinks.  For tests and for
    plans made by hand; InputError names a set that is no kernel."""
    target = options.target()
    prices = options.prices(graph, target.device)
    chosen = []
    for i, names in enumerate(sets):
        k = match(graph, names, target)
        if isinstance(k, Rejection):
            raise InputError(f"set {i} is not a kernel: {k.reason}")
        inside = set(k.nodes)
        exposed = tuple(
            n
            for n in k.nodes
            if n not in k.outputs
            and (
                n in graph.outputs or any(c.name not in inside for c in graph.consumers.get(n, ()))
            )
        )
        if writes_all and any(n not in k.optional for n in exposed):
            bad = next(n for n in exposed if n not in k.optional)
            raise InputError(
                f"set {i}: {bad} is read outside but the {k.template} kernel cannot write it"
            )
        chosen.append((k, k.outputs + (exposed if writes_all else ()), 0))
    solver = Solver("fixed", 0.0, 0.0, 1, 1, len(sets), len(sets), 0, 0, 0, 0)
    return assemble(graph, chosen, target, prices, options.record(), solver, {}, ())


def assemble(
    graph: ir.Graph,
    chosen: Sequence[tuple[KernelSpec, tuple[str, ...], int]],
    target: Target,
    prices: Prices,
    options: Options,
    solver: Solver,
    baselines: dict[str, Totals],
    declined: tuple[Declined, ...],
    uses: Sequence[tuple[RuleUse, frozenset[str]]] = (),
    tuning: Tuning | None = None,
) -> Planned:
    """Name, price and check the chosen kernels; the plan around them."""
    kernels, raw_us = [], []
    for i, (spec, writes, part) in enumerate(chosen):
        p = prices.price(spec, writes)
        raw_us.append(p.time_us)
        kernels.append(
            PlannedKernel(
                kernel_name(i, spec.template),
                spec.template,
                spec.nodes,
                spec.inputs,
                writes,
                spec.anchor,
                p.bytes,
                p.flops,
                _r(p.time_us),
                p.bound,
                part,
                spec.hash,
                spec.config,
            )
        )
    check_plan(graph, kernels)
    real = [k for k in kernels if k.template != VIEW]
    summary = Summary(
        len(real),
        len(kernels) - len(real),
        sum(k.bytes for k in kernels),
        sum(k.flops for k in kernels),
        _r(sum(raw_us)),
        materialized(graph, [(k.template, k.outputs) for k in kernels]),
    )
    result = Plan(
        target.device.name,
        options,
        graph_info(graph),
        tuple(kernels),
        summary,
        baselines,
        solver,
        unfused_neighbours(graph, kernels, target, prices),
        declined,
        tuple(primitive(n) for n in graph.nodes),
        tuple(
            replace(u, kernels=tuple(k.name for k in kernels if k.hash in hashes))
            for u, hashes in uses
        ),
        tuning,
    )
    return Planned(result, tuple(spec for spec, _, _ in chosen))


def _rule_uses(
    fired: Sequence[tuple[alternatives.Fired, int]], final: Callable[[KernelSpec], KernelSpec]
) -> list[tuple[RuleUse, frozenset[str]]]:
    """Per rule: the predicted time of the partitions it fired in (each
    distinct partition times its copies), with and without it, and the
    hashes its kernels have in the plan (``final``: as tuning configured them)."""
    out = []
    for rule in sorted({f.rule for f, _ in fired}):
        mine = [(f, n) for f, n in fired if f.rule == rule]
        hashes = frozenset(final(k).hash for f, _ in mine for k in f.specs)
        out.append(
            (
                RuleUse(
                    rule,
                    (),
                    _r(sum(f.with_us * n for f, n in mine)),
                    _r(sum(f.without_us * n for f, n in mine)),
                ),
                hashes,
            )
        )
    return out


def _stitched(graph, plan: list[Priced], parts, part_of, target, prices) -> list[Priced]:
    """The greedy baseline fused across the size cuts as the plan is."""
    chosen = [(p.kernel, p.writes, part_of[p.kernel.nodes[0]]) for p in plan]
    merged, stitched = stitch(graph, chosen, parts, target, prices)
    if not stitched.merges:
        return plan
    return [price(prices, k, ws) for k, ws, _ in merged]


def _totals(priced: list[Priced]) -> Totals:
    real = [p for p in priced if p.kernel.template != VIEW]
    return Totals(len(real), sum(p.bytes for p in priced), _r(sum(p.time_us for p in priced)))


def _r(x: float) -> float:
    return round(float(x), 4)
