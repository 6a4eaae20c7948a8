"""How long a GPU run will take, from what it has to do.

The counts come from the prepare step (``prepare.py``), which exports and
plans every model: kernels launched, distinct Triton functions to compile,
weights, ONNX nodes, the plan's predicted time, and the seconds its own
export, planning, loading, onnxruntime check and torch build took.  The
dry run measures them on the full-size models on its CPU, so it projects
the real run before any GPU is asked for; the real run measures them again
on the GPU machine and projects what is left before its first GPU step.

Each step is projected from those counts and the figures of ``costs.py``
and given a hard cap.  The required steps must fit the budget or the run is
refused; optional ones (max-autotune) are projected in order into what is
left, and those that do not fit are listed as not reached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace

from orchestrate.bench.runtimes import ORCHESTRATE, TORCH_COMPILE, TORCH_EAGER, TORCH_MAX_AUTOTUNE
from tools.bench_gpu import costs
from tools.bench_gpu.scope import Step


@dataclass(frozen=True)
class Counts:
    """What one model's prepare step found and took (seconds measured)."""

    name: str
    nodes: int  # ONNX nodes (eager launches about one kernel each)
    weights_mb: float  # the bundle's weights at the run's dtype
    kernels: int  # kernels the bundle launches (views excluded)
    functions: int  # distinct generated Triton functions: what is compiled
    predicted_ms: float  # the plan's predicted total on the planned-for GPU
    export_s: float
    optimize_s: float
    load_s: float  # orchestrate.load: the kernels generated again, weights read
    verify_s: float  # onnxruntime's CPU session made and run once (the verification)
    build_s: float  # the torch module built with its random weights
    compile_s: float | None = None  # the compile ahead, wall seconds (None: not compiled)

    @staticmethod
    def from_json(data: Mapping) -> Counts:
        return Counts(**{f.name: data[f.name] for f in fields(Counts) if f.name in data})


@dataclass(frozen=True)
class Runs:
    warmup: int
    runs: int


@dataclass(frozen=True)
class Line:
    what: str
    seconds: float
    cap: float
    basis: str
    optional: bool = False


@dataclass(frozen=True)
class Projection:
    lines: tuple[Line, ...]
    budget: float

    @property
    def required(self) -> float:
        return sum(x.seconds for x in self.lines if not x.optional)

    @property
    def reached(self) -> tuple[Line, ...]:
        """The optional lines the run starts, in order: those projected to
        fit in what the required ones leave, and then the first that does
        not, when at least ``costs.OPTIONAL_LEAST_S`` is left, with what is
        left as its time and cap (a projection may be pessimistic)."""
        left, out = self.budget - self.required, []
        for x in self.lines:
            if not x.optional:
                continue
            if x.seconds <= left:
                out.append(x)
                left -= x.seconds
            else:
                if left >= costs.OPTIONAL_LEAST_S:
                    out.append(
                        replace(
                            x,
                            seconds=left,
                            cap=left,
                            basis=f"what is left of the budget ({x.basis})",
                        )
                    )
                break
        return tuple(out)

    @property
    def total(self) -> float:
        return self.required + sum(x.seconds for x in self.reached)

    @property
    def fits(self) -> bool:
        return self.required <= self.budget

    def table(self) -> list[str]:
        reached = {x.what: x for x in self.reached}
        rows = [f"{'step':<36}{'projected s':>12}{'cap s':>8}  basis"]
        for x in self.lines:
            mark = ""
            if x.optional:
                x = reached.get(x.what, x)
                mark = " (optional)" if x.what in reached else " (NOT REACHED)"
            rows.append(f"{x.what + mark:<36}{x.seconds:>12.1f}{x.cap:>8.0f}  {x.basis}")
        rows.append(f"{'required':<36}{self.required:>12.1f}")
        rows.append(
            f"{'total projected':<36}{self.total:>12.1f}   of a {self.budget:.0f} s budget"
            + ("" if self.fits else ": OVER, the run is refused")
        )
        return rows

    def to_json(self) -> dict:
        return {
            "budget_s": self.budget,
            "required_s": round(self.required, 1),
            "total_s": round(self.total, 1),
            "fits": self.fits,
            "lines": [asdict(x) | {"reached": not x.optional} for x in self.lines if not x.optional]
            + [asdict(x) | {"reached": True} for x in self.reached]
            + [
                asdict(x) | {"reached": False}
                for x in self.lines
                if x.optional and x.what not in {r.what for r in self.reached}
            ],
        }


def prepare_seconds(
    counts: Sequence[Counts], workers: int, compile_unit: costs.Figure
) -> tuple[float, str]:
    """The prepare step: every model at once (export, plan, load, check,
    build), each then compiling its functions ahead on its share of the
    workers; the slowest model's time."""
    share = max(1, workers // max(1, len(counts)))
    worst, basis = 0.0, ""
    for c in counts:
        compile_s = (
            c.compile_s if c.compile_s is not None else (c.functions * compile_unit.seconds / share)
        )
        s = c.export_s + c.optimize_s + c.load_s + c.verify_s + c.build_s + compile_s
        if s >= worst:
            worst = s
            basis = (
                f"{c.name}, the slowest: export {c.export_s:.0f} + plan {c.optimize_s:.0f} "
                f"+ load {c.load_s:.0f} + check {c.verify_s:.0f} + build {c.build_s:.0f} "
                f"+ compile {c.functions} functions {compile_s:.0f} (measured"
                + (
                    ""
                    if c.compile_s is not None
                    else f"; compile {compile_unit.seconds:.2g} s a function x {share} workers: "
                    f"{compile_unit.source}"
                )
                + ")"
            )
    return costs.PROCESS.seconds + worst, basis


def compile_unit(counts: Sequence[Counts], share: int) -> costs.Figure:
    """Seconds to compile one function on one core, from the compiles ahead
    the counts measured (each model's on ``share`` workers); the assumed
    figure where none was measured."""
    done = [c for c in counts if c.compile_s is not None and c.functions]
    if not done:
        return costs.COMPILE_FUNCTION
    seconds = sum(c.compile_s * share for c in done) / sum(c.functions for c in done)
    return costs.Figure(
        seconds,
        f"measured: the compile ahead of {sum(c.functions for c in done)} "
        f"functions on {share} worker(s) a model",
    )


def step_seconds(step: Step, c: Counts, runs: Runs, unit: costs.Figure) -> tuple[float, str]:
    """One (model, runtime) child, from its model's counts."""
    calls = runs.warmup + runs.runs
    start = costs.PROCESS.seconds
    if step.runtime == ORCHESTRATE:
        upload = c.weights_mb / costs.HOST_MB_PER_S.seconds
        jit = c.functions * unit.seconds  # as if Triton's cache missed (costs.py)
        timed = calls * c.predicted_ms / 1e3
        records = c.functions * costs.RECORD_KERNEL.seconds
        s = start + c.load_s + upload + jit + timed + c.verify_s + records
        return s, (
            f"load {c.load_s:.1f} + JIT of {c.functions} functions {jit:.1f} + {calls} "
            f"calls {timed:.1f} + check {c.verify_s:.1f} + {c.functions} kernel records "
            f"{records:.1f}"
        )
    upload = 2 * c.weights_mb / costs.HOST_MB_PER_S.seconds  # built at fp32, then cast
    extra = {
        TORCH_EAGER: costs.Figure(0.0, ""),
        TORCH_COMPILE: costs.TORCH_COMPILE,
        TORCH_MAX_AUTOTUNE: costs.MAX_AUTOTUNE,
    }[step.runtime]
    timed = calls * (3 * c.predicted_ms + c.nodes * costs.EAGER_LAUNCH_MS.seconds) / 1e3
    s = start + c.build_s + upload + extra.seconds + timed
    basis = f"build {c.build_s:.1f} + {calls} calls {timed:.1f}"
    if extra.seconds:
        basis += f" + compile {extra.seconds:.0f} ({extra.source})"
    return s, basis


def project(
    steps: Sequence[Step],
    counts: Mapping[str, Counts],
    runs: Runs,
    budget: float,
    *,
    workers: int,
    unit: costs.Figure = costs.COMPILE_FUNCTION,
    prepare_s: float | None = None,
) -> Projection:
    """The run's projection: its prepare step (``prepare_s`` when it is
    done already), every step, and the end."""
    if prepare_s is None:
        seconds, basis = prepare_seconds(list(counts.values()), workers, unit)
        lines = [Line("prepare (every model at once)", seconds, costs.cap(seconds), basis)]
    else:
        lines = [Line("prepare (every model at once)", prepare_s, prepare_s, "measured: done")]
    for step in steps:
        seconds, basis = step_seconds(step, counts[step.model], runs, unit)
        lines.append(
            Line(f"{step.model} {step.runtime}", seconds, costs.cap(seconds), basis, step.optional)
        )
    lines.append(Line("finish", costs.FINISH.seconds, costs.FINISH.seconds, costs.FINISH.source))
    return Projection(tuple(lines), budget)
