"""Does a bundle compute what the ONNX model computes?

The truth is the float64 reference executor (``ir.reference``, every float
carried in float64) on the primitive graph the bundle runs; onnxruntime's
fp32 answer on the original model stands beside it, as the error that a
trusted runtime makes on the same inputs.  Random inputs over several seeds:
floating-point inputs are standard normal; an integer input that (through
casts and layout ops) indexes a Gather is drawn in the valid range of the
axis it indexes; one that reaches the divisor of an integer Div or Mod is 1
or 2 (integer division by zero is an error, not a value to compare); other
integer inputs are 0 or 1 (masks); booleans are random.

An output passes when it is within tolerance of the truth, elementwise
``|got - truth| <= atol + rtol * |truth|`` (by default ``atol = rtol *
max|truth|``: errors are judged against the output's scale, so values near
zero are not held to an impossible relative bound), or when its largest
error is no worse than ``ORT_MULTIPLE`` times onnxruntime's own largest
error against the truth: a bundle closer to the truth than onnxruntime is
never refused, and one close to neither never passes.  Its NaN and infinity
pattern must be the truth's or onnxruntime's (an fp32 overflow that the
float64 truth does not have is what any fp32 runtime gives).  Integer and
boolean outputs must equal the truth or onnxruntime.  The reported
"relative error" is ``max|got - truth| / max|truth|``, onnxruntime's beside it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from orchestrate import ir
from orchestrate.check.draws import Draws, check_draws, drawn
from orchestrate.errors import InputError
from orchestrate.frontend import onnxrt
from orchestrate.ir import Op, reference
from orchestrate.text import shown

RTOL = {"float16": 1e-2, "bfloat16": 4e-2, "float32": 1e-4, "float64": 1e-7}
# a bundle whose largest error against the truth is at most this many times
# onnxruntime's passes, whatever the tolerance says
ORT_MULTIPLE = 2.0
_COMPARISONS = {Op.LT, Op.LE, Op.EQ}
_PASS_THROUGH = {Op.CAST, Op.RESHAPE, Op.EXPAND, Op.IDENTITY, Op.TRANSPOSE, Op.SLICE, Op.CONCAT}


@dataclass(frozen=True)
class OutputCheck:
    trial: int
    name: str
    ok: bool
    max_abs: float  # against the truth (or the one reference ``compare`` was given)
    rel: float
    detail: str = ""
    # onnxruntime's own error against the truth on the same inputs (NaN: not compared)
    ort_max_abs: float = math.nan
    ort_rel: float = math.nan


@dataclass(frozen=True)
class Report:
    """Every output of every trial against the float64 truth, onnxruntime's
    error beside it.  ``simulated`` is
    empty when the bundle's kernels computed the outputs; otherwise it says
    why they could not run here, and the outputs are the reference
    executor's on the plan's primitive graph (``reference.run``: its dtypes,
    rounded at every primitive): a check of the precision the plan computes
    in, not of its kernels."""

    checks: tuple[OutputCheck, ...]
    simulated: str = ""
    # a dynamic bundle's: the binding each trial ran at (``batch=1, seq=2``)
    bindings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def worst(self) -> dict[str, OutputCheck]:
        out: dict[str, OutputCheck] = {}
        for c in self.checks:
            if c.name not in out or (not c.ok, c.rel) > (not out[c.name].ok, out[c.name].rel):
                out[c.name] = c
        return out

    def lines(self) -> list[str]:
        rows = [
            f"{'output':<32}{'rel. error':>12}{'max abs':>11}{'onnxruntime rel.':>18}"
            f"{'max abs':>11}  result (errors against the float64 truth)"
        ]
        for name, c in self.worst().items():
            verdict = ("ok" if c.ok else "MISMATCH") + (": " + c.detail if c.detail else "")
            rows.append(
                f"{shown(name)[:31]:<32}{c.rel:>12.3g}{c.max_abs:>11.3g}{c.ort_rel:>18.3g}"
                f"{c.ort_max_abs:>11.3g}  {shown(verdict)}"
            )
        return rows

    def verdict(self, trials: int) -> str:
        """One line: what was compared with onnxruntime over ``trials``, and
        the outcome.  A simulated report never says verified."""
        truth = "the float64 reference, onnxruntime beside it,"
        if self.bindings:
            outcome = "verified" if self.ok else "FAILED"
            return (
                f"{outcome} against {truth} at {len(self.bindings)} shapes across the "
                f"range: {'; '.join(self.bindings)}"
            )
        if not self.simulated:
            outcome = "verified" if self.ok else "FAILED"
            return f"{outcome} against {truth} over {trials} random trials"
        outcome = "within tolerance of" if self.ok else "FAILED against"
        return (
            f"kernels not verified: they did not run ({self.simulated}); the plan simulated "
            f"in numpy is {outcome} {truth} over {trials} random trials; run "
            "`orchestrate verify` on a GPU to check the kernels"
        )

    def first_failure(self) -> OutputCheck | None:
        return next((c for c in self.checks if not c.ok), None)


def integer_ranges(graph: ir.Graph) -> dict[str, int]:
    """For integer inputs, the exclusive upper bound of the values random
    inputs draw from 0: the size of the axis for an index of a Gather (the
    least, if several); else one past the largest constant it is compared
    with (a length masked against step numbers: every outcome of each
    comparison occurs, and no value exceeds what the comparisons tell
    apart)."""
    indexed: dict[str, int] = {}
    compared: dict[str, int] = {}
    for inp in graph.inputs:
        if inp.type.dtype not in ir.INTS:
            continue
        frontier, seen = [inp.name], set()
        while frontier:
            t = frontier.pop()
            for c in graph.consumers.get(t, ()):
                if c.op is Op.GATHER and c.inputs[1] == t:
                    size = graph.types[c.inputs[0]].shape[c.attrs["axis"]]
                    indexed[inp.name] = min(indexed.get(inp.name, size), size)
                elif c.op in _COMPARISONS:
                    other = [graph.constants.get(x) for x in c.inputs if x != t]
                    if other and other[0] is not None and other[0].size:
                        high = max(int(other[0].max()) + 2, 1)
                        compared[inp.name] = max(compared.get(inp.name, high), high)
                elif c.op in _PASS_THROUGH and c.name not in seen:
                    seen.add(c.name)
                    frontier.append(c.name)
    return {**compared, **indexed}


def divisors(graph: ir.Graph) -> set[str]:
    """Integer inputs that (through casts and layout ops) reach the divisor of
    an integer DIV or MOD."""
    out: set[str] = set()
    for inp in graph.inputs:
        if inp.type.dtype not in ir.INTS:
            continue
        frontier, seen = [inp.name], set()
        while frontier and inp.name not in out:
            t = frontier.pop()
            for c in graph.consumers.get(t, ()):
                if (
                    c.op in (Op.DIV, Op.MOD)
                    and c.inputs[1] == t
                    and graph.types[c.inputs[0]].dtype in ir.INTS
                ):
                    out.add(inp.name)
                elif c.op in _PASS_THROUGH and c.name not in seen:
                    seen.add(c.name)
                    frontier.append(c.name)
    return out


def random_inputs(graph: ir.Graph, seed: int, draws: Draws | None = None) -> dict[str, np.ndarray]:
    """One trial's inputs: what the graph needs, unless ``draws`` bounds or
    gives an input (``check/draws.py``)."""
    rng = np.random.default_rng(seed)
    ranges = integer_ranges(graph)
    nonzero = divisors(graph)
    draws = draws or Draws()
    feeds = {}
    for i in graph.inputs:
        shape, dtype = i.type.shape, i.type.dtype
        if i.name in draws.given:
            feeds[i.name] = np.asarray(draws.given[i.name])
        elif i.name in draws.ranges:
            feeds[i.name] = drawn(i.type, draws.ranges[i.name], rng)
        elif dtype in ir.FLOATS:
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == "bool":
            feeds[i.name] = rng.random(shape) < 0.5
        else:
            high = ranges.get(i.name, 3 if i.name in nonzero else 2)
            low = 1 if i.name in nonzero and high > 1 else 0
            feeds[i.name] = rng.integers(low, high, size=shape).astype(dtype)
    return feeds


def check_tolerance(value, name: str) -> float | None:
    """``value`` as a tolerance: None (the default), or a finite number >= 0.
    InputError naming ``name`` (``rtol``, or the CLI's ``--rtol``) otherwise."""
    if value is None:
        return None
    where = f"{name} {value!r}" if name.startswith("--") else f"{name}={value!r}"
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise InputError(f"{where}: expected a number >= 0")
    if not (math.isfinite(value) and value >= 0):
        raise InputError(f"{where}: must be a finite number >= 0")
    return float(value)


def compare(
    name: str, got: np.ndarray, want: np.ndarray, trial: int, rtol: float | None, atol: float | None
) -> OutputCheck:
    """One output against one reference ``want`` (no second runtime beside
    it): within tolerance, with the same NaN/Inf pattern (``judge`` without
    onnxruntime; the default rtol is ``want``'s dtype's)."""
    r = rtol if rtol is not None else RTOL.get(want.dtype.name, 1e-4)
    return judge(name, got, want, None, trial, r, atol)


def _special(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where ``a`` is NaN, and its infinities with their signs."""
    return np.isnan(a), np.where(np.isinf(a), np.sign(a), 0)


def judge(
    name: str,
    got: np.ndarray,
    truth: np.ndarray,
    ort: np.ndarray | None,
    trial: int,
    rtol: float | None,
    atol: float | None,
) -> OutputCheck:
    """One output of one trial against the float64 ``truth``, onnxruntime's
    answer ``ort`` beside it (the module docstring says when it passes);
    ``ort`` None: against ``truth`` alone."""
    if got.shape != truth.shape:
        return OutputCheck(
            trial, name, False, np.inf, np.inf, f"shape {got.shape} != {truth.shape}"
        )
    if truth.dtype.kind in "biu" or got.dtype.kind in "biu":
        bad = int(np.count_nonzero(got != truth))
        ok = bad == 0 or (ort is not None and ort.shape == got.shape and np.array_equal(got, ort))
        where = "the truth" if ort is None else "the truth and onnxruntime"
        return OutputCheck(
            trial,
            name,
            ok,
            float(bad),
            float(bad),
            "" if ok else f"{bad} elements differ from {where}",
        )
    g, t = got.astype(np.float64), truth.astype(np.float64)
    refs = [t] if ort is None else [t, ort.astype(np.float64)]
    r = rtol if rtol is not None else RTOL.get(got.dtype.name, 1e-4)
    finite = np.isfinite(t)
    scale = float(np.max(np.abs(t[finite]))) if finite.any() else 0.0
    a = atol if atol is not None else r * scale
    pattern = _special(g)
    same_special = any(
        all(np.array_equal(x, y) for x, y in zip(pattern, _special(ref))) for ref in refs
    )
    both = np.isfinite(g) & finite
    diff = np.abs(g - t)
    max_abs = float(diff[both].max()) if both.any() else 0.0
    ort_abs = math.nan
    if ort is not None:
        o = refs[1]
        theirs = np.isfinite(o) & finite
        ort_abs = float(np.abs(o - t)[theirs].max()) if theirs.any() else 0.0
    within = bool(np.all(diff[both] <= a + r * np.abs(t[both])))
    no_worse = ort_abs > 0 and max_abs <= ORT_MULTIPLE * ort_abs  # False for NaN
    ok = same_special and (within or no_worse)
    beside = "" if ort is None else f"; onnxruntime's {ort_abs:.3g}"
    if not same_special:
        detail = "NaN/Inf pattern differs from the truth's" + (
            "" if ort is None else " and onnxruntime's"
        )
    elif ok:
        detail = (
            ""
            if within
            else (
                f"outside rtol {r:g} of the truth, but no worse than "
                f"{ORT_MULTIPLE:g} x onnxruntime's error ({ort_abs:.3g})"
            )
        )
    else:
        detail = (
            f"max abs error {max_abs:.3g}, relative {max_abs / scale if scale else max_abs:.3g}"
            f" (rtol {r:g}, atol {a:.3g}){beside}"
        )

    def rel(x: float) -> float:
        return x / scale if scale else x

    return OutputCheck(trial, name, ok, max_abs, rel(max_abs), detail, ort_abs, rel(ort_abs))


def verify(
    model: onnx.ModelProto,
    graph: ir.Graph,
    run: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
    *,
    trials: int = 3,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    session=None,
    source: str = "model",
    draws: Draws | None = None,
) -> Report:
    """Judge ``run`` (a bundle) over ``trials`` seeds against the float64
    reference on ``graph`` (the primitive graph it runs), with onnxruntime on
    ``model`` beside it (``session``: onnxruntime's, made already;
    InputError naming ``source`` when onnxruntime refuses the model).
    ``draws`` bounds or fixes inputs (``check/draws.py``)."""
    if draws is not None:
        check_draws(draws, graph, source)
    checks = []
    session = session or onnxrt.reference(model, source)
    names = [o.name for o in session.get_outputs()]
    for trial in range(trials):
        feeds = random_inputs(graph, seed + trial, draws)
        ort = dict(zip(names, onnxrt.run_reference(session, names, feeds, source)))
        truth = reference.run(graph, feeds, float64=True)
        got = run(feeds)
        for o in graph.outputs:
            checks.append(
                judge(
                    o,
                    np.asarray(got[o]),
                    np.asarray(truth[o]),
                    np.asarray(ort[o]),
                    trial,
                    rtol,
                    atol,
                )
            )
    return Report(tuple(checks))
