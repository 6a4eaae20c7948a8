"""Does a bundle compute what the ONNX model computes?

Random inputs over several seeds, every output compared with onnxruntime on
the original model.  Floating-point inputs are standard normal; an integer
input that (through casts and layout ops) indexes a Gather is drawn in the
valid range of the axis it indexes; one that reaches the divisor of an
integer Div or Mod is 1 or 2 (integer division by zero is an error, not a
value to compare); other integer inputs are 0 or 1 (masks); booleans are
random.

An output passes when, elementwise, ``|got - want| <= atol + rtol * |want|``
with NaN matching NaN.  By default ``atol = rtol * max|want|``: errors are
judged against the output's scale, so values near zero are not held to an
impossible relative bound.  The reported "relative error" is
``max|got - want| / max|want|``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from orchestrate import ir
from orchestrate.errors import InputError
from orchestrate.frontend import onnxrt
from orchestrate.ir import Op

RTOL = {"float16": 1e-2, "bfloat16": 4e-2, "float32": 1e-4, "float64": 1e-7}
_PASS_THROUGH = {Op.CAST, Op.RESHAPE, Op.EXPAND, Op.IDENTITY, Op.TRANSPOSE, Op.SLICE, Op.CONCAT}


@dataclass(frozen=True)
class OutputCheck:
    trial: int
    name: str
    ok: bool
    max_abs: float
    rel: float
    detail: str = ""


@dataclass(frozen=True)
class Report:
    """Every output of every trial against onnxruntime.  ``simulated`` is
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
        rows = [f"{'output':<32}{'worst rel. error':>18}{'max abs error':>16}  result"]
        for name, c in self.worst().items():
            rows.append(
                f"{name[:31]:<32}{c.rel:>18.3g}{c.max_abs:>16.3g}  "
                f"{'ok' if c.ok else 'MISMATCH ' + c.detail}"
            )
        return rows

    def verdict(self, trials: int) -> str:
        """One line: what was compared with onnxruntime over ``trials``, and
        the outcome.  A simulated report never says verified."""
        if self.bindings:
            outcome = "verified" if self.ok else "FAILED"
            return (
                f"{outcome} against onnxruntime at {len(self.bindings)} shapes across the "
                f"range: {'; '.join(self.bindings)}"
            )
        if not self.simulated:
            outcome = "verified" if self.ok else "FAILED"
            return f"{outcome} against onnxruntime over {trials} random trials"
        outcome = "within tolerance of" if self.ok else "FAILED against"
        return (
            f"kernels not verified: they did not run ({self.simulated}); the plan simulated "
            f"in numpy is {outcome} onnxruntime over {trials} random trials; run "
            "`orchestrate verify` on a GPU to check the kernels"
        )

    def first_failure(self) -> OutputCheck | None:
        return next((c for c in self.checks if not c.ok), None)


def index_ranges(graph: ir.Graph) -> dict[str, int]:
    """For integer inputs that index a Gather: the size of the indexed axis."""
    out: dict[str, int] = {}
    for inp in graph.inputs:
        if inp.type.dtype not in ir.INTS:
            continue
        frontier, seen = [inp.name], set()
        while frontier:
            t = frontier.pop()
            for c in graph.consumers.get(t, ()):
                if c.op is Op.GATHER and c.inputs[1] == t:
                    size = graph.types[c.inputs[0]].shape[c.attrs["axis"]]
                    out[inp.name] = min(out.get(inp.name, size), size)
                elif c.op in _PASS_THROUGH and c.name not in seen:
                    seen.add(c.name)
                    frontier.append(c.name)
    return out


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


def random_inputs(graph: ir.Graph, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ranges = index_ranges(graph)
    nonzero = divisors(graph)
    feeds = {}
    for i in graph.inputs:
        shape, dtype = i.type.shape, i.type.dtype
        if dtype in ir.FLOATS:
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
    if got.shape != want.shape:
        return OutputCheck(trial, name, False, np.inf, np.inf, f"shape {got.shape} != {want.shape}")
    if want.dtype.kind in "biu" or got.dtype.kind in "biu":
        bad = int(np.count_nonzero(got != want))
        return OutputCheck(
            trial, name, bad == 0, float(bad), float(bad), f"{bad} elements differ" if bad else ""
        )
    g, w = got.astype(np.float64), want.astype(np.float64)
    r = rtol if rtol is not None else RTOL.get(want.dtype.name, 1e-4)
    finite = np.isfinite(w)
    scale = float(np.max(np.abs(w[finite]))) if finite.any() else 0.0
    a = atol if atol is not None else r * scale
    same_special = np.array_equal(np.isnan(g), np.isnan(w)) and np.array_equal(
        np.where(np.isinf(w), w, 0), np.where(np.isinf(g) & np.isinf(w), g, 0)
    )
    both = finite & np.isfinite(g)
    diff = np.abs(g - w)
    max_abs = float(diff[both].max()) if both.any() else 0.0
    rel = max_abs / scale if scale else max_abs
    ok = same_special and bool(np.all(diff[both] <= a + r * np.abs(w[both])))
    ok = ok and bool(np.all(np.isfinite(g) == finite))
    detail = (
        ""
        if ok
        else (
            f"max abs error {max_abs:.3g}, relative {rel:.3g} (rtol {r:g}, atol {a:.3g})"
            if same_special
            else "NaN/Inf pattern differs from onnxruntime"
        )
    )
    return OutputCheck(trial, name, ok, max_abs, rel, detail)


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
) -> Report:
    """Compare ``run`` (a bundle) with onnxruntime on ``model`` over ``trials``
    seeds (``session``: onnxruntime's, made already; InputError naming
    ``source`` when onnxruntime refuses the model)."""
    checks = []
    session = session or onnxrt.reference(model, source)
    names = [o.name for o in session.get_outputs()]
    for trial in range(trials):
        feeds = random_inputs(graph, seed + trial)
        want = dict(zip(names, onnxrt.run_reference(session, names, feeds, source)))
        got = run(feeds)
        for o in graph.outputs:
            checks.append(compare(o, np.asarray(got[o]), np.asarray(want[o]), trial, rtol, atol))
    return Report(tuple(checks))
