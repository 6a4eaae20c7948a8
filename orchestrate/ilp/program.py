"""The binary linear program that picks kernels (Korch's formulation, extended).

Variables, for the candidates k of one partition:

    x[k]    in {0,1}   k runs
    w[k,t]  in {0,1}   k also writes its optional output t (a value of k that
                       others read; not writing it means they recompute it)
    T[k]    >= 0       k's roofline time, when k has optional outputs

    minimise   sum_k launch_k x[k] + T[k]        (T[k] = max(mem_k, comp_k, lat_k) x[k]
                                                  when k has no optional output)
    subject to
      T[k] >= mem_k x[k] + sum_t bytes_t / bandwidth w[k,t]     (memory roof)
      T[k] >= comp_k x[k]                                       (compute roof)
      T[k] >= lat_k x[k]                                        (latency floor)
      w[k,t] <= x[k]
      sum_{j writes t} >= 1          for every tensor the partition must output
      sum_{j writes t} <= 1          for every tensor (one buffer, one writer)
      sum_{j writes t} >= x[k]       for every tensor t that k reads and that is
                                     computed inside the partition
      m[t] >= (j writes t);  sum_t bytes_t m[t] <= budget     (--memory-budget)

A primitive may sit in several chosen kernels: that is recomputation, and it
is priced by each kernel that does it (``recompute=False`` adds
sum_{k holds n} x[k] <= 1 for every primitive n).  Multi-output kernels can depend on
each other in a cycle; :func:`solve` checks every solution with the plan
checker and, while it finds a cycle, adds the cut

      sum_{k in C} x[k] - sum_{j outside C writing a tensor C needs} (j writes it) <= |C| - 1

and solves again.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrate.cost.roofline import Cost
from orchestrate.errors import InputError
from orchestrate.files import signals_held
from orchestrate.ilp.checker import schedule
from orchestrate.kernels.spec import VIEW, KernelSpec

OPTIMAL = "optimal"
FEASIBLE = "feasible"  # time limit hit with an integer solution in hand
GREEDY = "greedy"  # time limit hit before any better solution: the warm start kept
_WORSE = {OPTIMAL: 0, FEASIBLE: 1, GREEDY: 2}
MAX_CYCLE_ROUNDS = 50


@dataclass(frozen=True)
class Choice:
    kernel: int  # index into the candidate list
    writes: tuple[str, ...]  # sinks plus the optional outputs it writes


class BudgetInfeasible(InputError):
    """No plan writes at most --memory-budget bytes of intermediates."""


class NoPlanInTime(InputError):
    """The time limit ran out before the solver found any plan."""


class NoPlan(InputError):
    """Every plan writes a tensor too large to hold in memory."""


@dataclass
class Stats:
    """The worst status and gap, and the solves, over several programs."""

    status: str = OPTIMAL
    gap: float = 0.0
    rounds: int = 0

    def add(self, sol: Solution) -> None:
        if _WORSE.get(sol.status, 3) > _WORSE.get(self.status, 3):
            self.status = sol.status
        if not math.isnan(sol.gap):
            self.gap = max(self.gap, sol.gap)
        self.rounds += sol.rounds


@dataclass(frozen=True)
class Solution:
    choices: tuple[Choice, ...]  # in execution order
    status: str
    objective_us: float
    gap: float
    seconds: float
    rounds: int  # solves, including re-solves after cycle cuts


# Below this many seconds left, a program is not started: its greedy plan stands.
MIN_SOLVE_S = 0.05


def solve(
    kernels: Sequence[KernelSpec],
    costs: Sequence[Cost],
    write_us: dict[str, float],
    nbytes: dict[str, int],
    available: set[str],
    required: Sequence[str],
    *,
    warm: Sequence[Choice] = (),
    time_limit: float | None = None,
    budget: int | None = None,
    budget_exempt: set[str] = frozenset(),
    recompute: bool = True,
    edges: Sequence[tuple[str, str]] = (),
    name: str = "partition",
    unwritable: Mapping[str, str] | None = None,
) -> Solution:
    """Pick the cheapest set of kernels that produces ``required`` from ``available``.

    ``edges`` are the (producer, consumer) pairs of the primitive graph; they
    only tighten the relaxation (see ``_add_computed_cuts``).  An infeasible
    ``budget`` raises BudgetInfeasible (ilp.budget says what would fit).
    ``unwritable``: tensors no chosen kernel may write, with the reason (too
    large to hold in memory: attention's scores at a long sequence, which
    only a kernel keeping them on chip may make); a plan that cannot avoid
    writing one raises NoPlan naming it."""
    started = time.perf_counter()
    unwritable = dict(unwritable or {})
    if any(t in unwritable for c in warm for t in c.writes):
        warm = ()  # the greedy plan writes one: no incumbent to start from
    if time_limit is not None and time_limit < MIN_SOLVE_S:
        if warm and _fits(warm, kernels, nbytes, budget, budget_exempt):
            # the planning's time is spent: the greedy plan stands, unsolved
            return _unsolved(warm, kernels, costs, write_us, available, started)
        if budget is not None:
            raise NoPlanInTime(f"--time-limit: no time was left to solve {name} within a budget")
    data = (kernels, costs, write_us, nbytes, available, required)
    model = _Model.build(
        *data,
        budget=budget,
        budget_exempt=budget_exempt,
        recompute=recompute,
        edges=edges,
        name=name,
        unwritable=unwritable,
    )
    return model.search(warm, time_limit, started)


def solve_each_without(
    drops: Sequence[set[int]],
    clock: Callable[[int], float | None],
    *data,
    warm: Sequence[Choice] = (),
    **options,
) -> list[Solution | InputError]:
    """``solve`` once for each set of candidates in ``drops``, with those
    candidates barred (their variables held at 0): the same optimum as the
    program without them, from one linear program built once and re-solved
    (what a rule's candidates are worth, ``ilp.alternatives``).  ``data``,
    ``warm`` and ``options`` as ``solve`` takes them (no budget);
    ``clock(i)``: the time limit of the i-th, asked as it starts.  Each
    result is the Solution, or the NoPlanInTime or NoPlan that solve would
    raise.  The warm start is used where it takes none of the barred
    candidates; the cycle cuts found along the way stay, valid for every
    subset of the candidates."""
    model = _Model.build(*data, **options)
    if any(t in model.unwritable for c in warm for t in c.writes):
        warm = ()
    out: list[Solution | InputError] = []
    for i, drop in enumerate(drops):
        started = time.perf_counter()
        start = () if any(c.kernel in drop for c in warm) else warm
        time_limit = clock(i)
        for k in drop:
            model.x[k].upBound = 0
        try:
            if start and time_limit is not None and time_limit < MIN_SOLVE_S:
                out.append(model.unsolved(start, started))
            else:
                out.append(model.search(start, time_limit, started))
        except (NoPlanInTime, NoPlan) as e:
            out.append(e)
        finally:
            for k in drop:
                model.x[k].upBound = 1
    return out


@dataclass
class _Model:
    """One partition's binary linear program, built (module doc) and ready
    to search: PuLP's problem and its variables, with what ``search`` reads."""

    prob: object  # pulp.LpProblem
    x: list
    w: dict
    y: dict
    m: dict
    writers: dict
    kernels: Sequence[KernelSpec]
    costs: Sequence[Cost]
    write_us: dict[str, float]
    nbytes: dict[str, int]
    available: set[str]
    budget: int | None
    budget_exempt: set[str]
    name: str
    unwritable: Mapping[str, str]

    @classmethod
    def build(
        cls,
        kernels,
        costs,
        write_us,
        nbytes,
        available,
        required,
        *,
        budget=None,
        budget_exempt=frozenset(),
        recompute=True,
        edges=(),
        name="partition",
        unwritable=None,
    ) -> _Model:
        """The program of ``solve``'s arguments (the module doc)."""
        import pulp  # here, not at the top: loading and running a bundle needs no PuLP

        unwritable = dict(unwritable or {})

        prob = pulp.LpProblem(_safe(name), pulp.LpMinimize)
        x = [pulp.LpVariable(f"x{k}", cat=pulp.LpBinary) for k in range(len(kernels))]
        w: dict[tuple[int, str], pulp.LpVariable] = {}
        # tensor -> (kernel, variable that says the kernel writes it)
        writers: dict[str, list[tuple[int, pulp.LpVariable]]] = {}
        objective = []
        for k, (kern, c) in enumerate(zip(kernels, costs)):
            for t in kern.outputs:
                writers.setdefault(t, []).append((k, x[k]))
            if kern.optional:
                tk = pulp.LpVariable(f"T{k}", lowBound=0)
                extra = []
                for j, t in enumerate(kern.optional):
                    v = pulp.LpVariable(f"w{k}_{j}", cat=pulp.LpBinary)
                    w[k, t] = v
                    writers.setdefault(t, []).append((k, v))
                    prob += v <= x[k]
                    extra.append(write_us[t] * v)
                prob += tk >= c.memory_us * x[k] + pulp.lpSum(extra)
                prob += tk >= c.compute_us * x[k]
                prob += tk >= c.latency_us * x[k]
                objective.append(tk + c.launch_us * x[k])
            else:
                objective.append(c.time_us * x[k])
        prob += pulp.lpSum(objective)
        for t in sorted(unwritable):
            for _, v in writers.get(t, ()):
                prob += v == 0
        written = _written(prob, writers)
        for t in required:
            if t not in writers:
                raise AssertionError(f"no candidate writes required tensor {t}")
            prob += written[t] >= 1
        for t, ws in sorted(writers.items()):  # each tensor has one buffer and one writer: two
            if len(ws) > 1:  # kernels that both recompute a value may not both store it
                prob += written[t] <= 1
        for k, kern in enumerate(kernels):
            for t in kern.inputs:
                if t in available:
                    continue
                if t not in writers:
                    prob += x[k] == 0  # nothing can feed it
                else:
                    prob += written[t] >= x[k]
        m: dict[str, pulp.LpVariable] = {}  # tensor -> it is materialised (under a budget)
        if budget is not None:
            terms = []
            for t, ws in sorted(writers.items()):
                # a view aliases its input and materialises nothing
                vs = [v for k, v in ws if kernels[k].template != VIEW]
                if t in budget_exempt or not vs:
                    continue
                m[t] = pulp.LpVariable(f"m_{len(terms)}", cat=pulp.LpBinary)
                for v in vs:
                    prob += m[t] >= v
                terms.append(nbytes[t] * m[t])
            prob += pulp.lpSum(terms) <= budget
            # valid cuts that make the relaxation see the budget: a tensor that
            # must be output, or that a chosen kernel reads, is materialised
            # (when only real kernels can write it; a view's reader is not)
            only_real = {
                t for t, ws in writers.items() if all(kernels[k].template != VIEW for k, _ in ws)
            }
            for t in required:
                if t in m and t in only_real:
                    prob += m[t] == 1
            for k, kern in enumerate(kernels):
                for t in kern.inputs:
                    if t in m and t in only_real:
                        prob += m[t] >= x[k]
        by_node: dict[str, list[pulp.LpVariable]] = {}
        for k, kern in enumerate(kernels):
            for n in kern.nodes:
                by_node.setdefault(n, []).append(x[k])
        if not recompute:
            for _, vs in sorted(by_node.items()):
                if len(vs) > 1:
                    prob += pulp.lpSum(vs) <= 1
        y = _add_computed_cuts(prob, by_node, available, required, edges)
        return cls(
            prob,
            x,
            w,
            y,
            m,
            writers,
            kernels,
            costs,
            write_us,
            nbytes,
            available,
            budget,
            budget_exempt,
            name,
            unwritable,
        )

    def unsolved(self, warm: Sequence[Choice], started: float) -> Solution:
        """The warm start as the solution, unsolved (``_unsolved``)."""
        return _unsolved(warm, self.kernels, self.costs, self.write_us, self.available, started)

    def search(self, warm: Sequence[Choice], time_limit: float | None, started: float) -> Solution:
        """Solve from ``warm`` (the greedy plan, or nothing), cutting each
        cycle the solution holds, until it has none."""
        import pulp

        prob, kernels, budget = self.prob, self.kernels, self.budget
        _set_warm_start(self.x, self.w, self.y, self.m, kernels, warm)
        rounds = 0
        while True:
            rounds += 1
            status, gap, log = _run_cbc(prob, time_limit, bool(warm), tight=budget is None)
            if (
                status is None
                and warm
                and _fits(warm, kernels, self.nbytes, budget, self.budget_exempt)
            ):
                # the time ran out first: the warm start (the greedy plan, feasible
                # by construction) is the incumbent, its gap against CBC's bound
                choices = list(warm)
                objective = _objective(choices, kernels, self.costs, self.write_us)
                status, gap = GREEDY, _incumbent_gap(objective, log)
            elif status is None and prob.status != pulp.LpStatusInfeasible:
                raise NoPlanInTime(
                    f"--time-limit: the solver found no plan for {self.name} in the "
                    f"{time_limit:g} s left to it; raise the limit"
                )
            elif status is None and budget is not None:
                raise BudgetInfeasible(f"--memory-budget {budget}: no plan fits")
            elif status is None and self.unwritable:
                t, why = next(iter(sorted(self.unwritable.items())))
                raise NoPlan(f"{self.name}: no plan keeps {t} out of memory ({why})")
            elif status is None:
                raise AssertionError(f"{self.name}: the linear program is infeasible")
            else:
                choices = _read(self.x, self.w, kernels)
            order, stuck = schedule(
                [kernels[c.kernel] for c in choices], [c.writes for c in choices], self.available
            )
            if not stuck:
                ordered = tuple(choices[i] for i in order)
                return Solution(
                    ordered,
                    status,
                    objective if status == GREEDY else float(pulp.value(prob.objective) or 0.0),
                    gap,
                    time.perf_counter() - started,
                    rounds,
                )
            if rounds >= MAX_CYCLE_ROUNDS:
                raise AssertionError(f"{self.name}: cycle cuts did not converge")
            _cut_cycle(
                prob, self.x, self.writers, kernels, [choices[i] for i in stuck], self.available
            )


def _written(prob, writers) -> dict:
    """For each tensor, the number of chosen kernels that write it: a sum of
    its writers' variables, or a continuous variable equal to it when the
    tensor has several writers.  Every reader's constraint then names one
    variable instead of every writer (a GRU's partition had 650,000
    nonzeros, most of them repeated writer lists, and CBC's preprocessing
    of them took longer than its search)."""
    import pulp

    out = {}
    for i, (t, ws) in enumerate(sorted(writers.items())):
        if len(ws) == 1:
            out[t] = ws[0][1]
        else:
            s = pulp.LpVariable(f"s{i}", lowBound=0)
            prob += s == pulp.lpSum(v for _, v in ws)
            out[t] = s
    return out


def _add_computed_cuts(prob, by_node, available, required, edges) -> dict:
    """Valid inequalities that make the LP relaxation tight; returns their
    variables y, by primitive.

    y[p] says primitive p is computed by some chosen kernel.  If p is, each
    of its inputs q (not available from outside) is computed too, by the same
    kernel or another: y[q] >= y[p].  Without these, the relaxation can serve
    one kernel's input from many fractional writers, each needing its own
    inputs only fractionally, and the bound collapses (a BERT layer's bound
    was a fifth of its optimum, and CBC timed out proving it)."""
    import pulp

    y = {n: pulp.LpVariable(f"y{i}", cat=pulp.LpBinary) for i, n in enumerate(sorted(by_node))}
    for n, vs in sorted(by_node.items()):
        for v in vs:
            prob += y[n] >= v
        prob += y[n] <= pulp.lpSum(vs)
    for t in required:
        if t in y:
            prob += y[t] == 1
    for q, p in sorted(edges):
        if q in y and p in y and q not in available:
            prob += y[q] >= y[p]
    return y


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)[:40] or "p"


def _set_warm_start(x, w, y, m, kernels, warm: Sequence[Choice]) -> None:
    """The warm start as a whole assignment of the integer variables: which
    kernels run and which optional outputs they write, and what follows from
    that, which primitives are computed (y) and, under a budget, which
    tensors are materialised (m).  CBC declines a start that leaves any
    integer variable out (it was left without y, and declined every one)."""
    if not warm:
        return
    chosen = {c.kernel: set(c.writes) for c in warm}
    for k, var in enumerate(x):
        var.setInitialValue(1 if k in chosen else 0)
    for (k, t), var in w.items():
        var.setInitialValue(1 if t in chosen.get(k, ()) else 0)
    computed = {n for k in chosen for n in kernels[k].nodes}
    for n, var in y.items():
        var.setInitialValue(1 if n in computed else 0)
    stored = _stored(warm, kernels)
    for t, var in m.items():
        var.setInitialValue(1 if t in stored else 0)


def cbc_settings(tight: bool) -> dict:
    """PuLP's CBC options for a program whose relaxation is nearly integral
    (``tight``: a partition's program without a budget) or not (CBC's own
    defaults): ``solve_cbc`` says why they differ."""
    return {"presolve": False, "options": ["preprocess off"]} if tight else {}


def solve_cbc(prob, tight: bool = False, **options) -> str:
    """Solve ``prob`` with CBC; return CBC's log.  PuLP's files (model,
    solution, log) go to a private temporary folder that is removed however
    the solve ends, an interrupt included (PuLP itself removes them only when
    CBC returns).

    A ``tight`` program runs without CLP's presolve and without CBC's
    preprocessing (``cbc_settings``): a partition's relaxation is nearly
    integral (the cuts of ``_add_computed_cuts``), and both passes cost more
    than the search.  A program under a memory budget keeps them: its
    preprocessing is what proves a budget infeasible (9 s for one tiny-UNet
    frontier step that is not proven in 60 s without it).

    CBC runs serially, without ``-threads``: PuLP's CBC 2.10.3 given
    ``-threads 1`` starts one worker thread, and about one solve in fifteen
    waited 10 s for it to start ("Thread 0 used 0 times, waiting to start
    10.000081"; 0.00 s of CPU), trivial programs included, every such wait
    counted against ``--time-limit``.  Its threaded search also called a
    program's incumbent optimal where the serial search had found a plan
    2% cheaper (a 16-step LSTM's: 67.2 against 65.6 µs)."""
    import pulp

    tmp = tempfile.mkdtemp(prefix="orchestrate-cbc-")
    try:
        log = os.path.join(tmp, "cbc.log")
        solver = pulp.PULP_CBC_CMD(
            msg=False, logPath=log, gapRel=0, **cbc_settings(tight), **options
        )
        solver.tmpDir = tmp
        prob.solve(solver)
        if not os.path.exists(log):
            return ""
        with open(log, errors="replace") as f:
            return f.read()
    finally:
        with signals_held():
            shutil.rmtree(tmp, ignore_errors=True)


def _run_cbc(prob, time_limit, warm: bool, tight: bool) -> tuple[str | None, float, str]:
    """(status, gap, CBC's log); status None: no integer solution."""
    import pulp

    text = solve_cbc(prob, tight=tight, timeLimit=time_limit, warmStart=warm)
    if prob.status != pulp.LpStatusOptimal:
        return None, math.inf, text
    if prob.sol_status == pulp.LpSolutionOptimal and "Stopped on time" not in text:
        return OPTIMAL, 0.0, text
    return FEASIBLE, _gap_from_log(text), text


def _objective(
    choices: Sequence[Choice],
    kernels: Sequence[KernelSpec],
    costs: Sequence[Cost],
    write_us: dict[str, float],
) -> float:
    """The objective's value at ``choices``, each kernel priced as its terms are."""
    total = 0.0
    for ch in choices:
        c, k = costs[ch.kernel], kernels[ch.kernel]
        if not k.optional:
            total += c.time_us
            continue
        extra = sum(write_us[t] for t in ch.writes if t in k.optional)
        total += max(c.memory_us + extra, c.compute_us, c.latency_us) + c.launch_us
    return total


def _fits(warm, kernels, nbytes, budget, exempt) -> bool:
    """Do the warm start's intermediates fit ``budget`` (None: no budget)?"""
    if budget is None:
        return True
    return sum(nbytes[t] for t in _stored(warm, kernels) if t not in exempt) <= budget


def _stored(choices: Sequence[Choice], kernels) -> set[str]:
    """The tensors ``choices`` store (a view aliases its input: nothing)."""
    return {t for c in choices if kernels[c.kernel].template != VIEW for t in c.writes}


def _unsolved(warm, kernels, costs, write_us, available, started: float) -> Solution:
    """The warm start (the greedy plan) as the solution, in its kernels'
    order, with no bound to measure it against (gap 1)."""
    choices = list(warm)
    order, stuck = schedule(
        [kernels[c.kernel] for c in choices], [c.writes for c in choices], available
    )
    assert not stuck, "the greedy plan is ordered by construction"
    return Solution(
        tuple(choices[i] for i in order),
        GREEDY,
        _objective(choices, kernels, costs, write_us),
        1.0,
        time.perf_counter() - started,
        0,
    )


def _incumbent_gap(objective: float, text: str) -> float:
    """The relative gap between ``objective`` and CBC's lower bound in its
    log; 1 (a bound of 0, which always holds) when it printed none."""
    bound = re.search(r"Lower bound:\s*([0-9.eE+-]+)", text)
    if not bound or objective <= 0:
        return 1.0
    return min(1.0, max(0.0, (objective - float(bound.group(1))) / objective))


def _gap_from_log(text: str) -> float:
    m = re.search(r"Gap:\s*([0-9.eE+-]+)", text)
    if m:
        return float(m.group(1))
    obj = re.search(r"Objective value:\s*([0-9.eE+-]+)", text)
    bound = re.search(r"Lower bound:\s*([0-9.eE+-]+)", text)
    if obj and bound and float(obj.group(1)):
        return max(0.0, (float(obj.group(1)) - float(bound.group(1))) / abs(float(obj.group(1))))
    return math.nan


def _read(x, w, kernels) -> list[Choice]:
    out = []
    for k, var in enumerate(x):
        if (var.value() or 0) > 0.5:
            opt = tuple(t for t in kernels[k].optional if (w[k, t].value() or 0) > 0.5)
            out.append(Choice(k, kernels[k].outputs + opt))
    return out


def _cut_cycle(prob, x, writers, kernels, stuck: list[Choice], available) -> None:
    """Forbid this set of mutually dependent kernels unless another kernel
    writes one of the tensors they wait for."""
    import pulp

    members = {c.kernel for c in stuck}
    written_inside = {t for c in stuck for t in c.writes}
    needed = {
        t
        for c in stuck
        for t in kernels[c.kernel].inputs
        if t not in available and t in written_inside
    }
    rescuers = [v for t in sorted(needed) for k, v in writers.get(t, ()) if k not in members]
    prob += pulp.lpSum(x[k] for k in sorted(members)) - pulp.lpSum(rescuers) <= len(members) - 1
