"""The ONNX backend node conformance cases, run through operator fission.

Each case is decomposed and its primitive graph run two ways (the reference
executor, and onnxruntime on the exported primitive model); both must match
the case's expected outputs at the case's tolerances.  A case is either

* ``passed``  - decomposed and correct as given;
* ``bound``   - correct once the integer inputs that must be compile-time
  constants (a Reshape shape, Slice starts, Pad pads, ...) are bound to the
  case's values, as a static-shape compiler does;
* ``declined`` - refused with UnsupportedError (the reason is kept);
* ``wrong`` / ``crashed`` - a bug.

Two exceptions for bfloat16: its outputs are compared at ``BF16_RTOL`` (8
significant bits: a float32 computation rounded once and the case's data,
which ONNX makes by truncating float32, differ by an ulp or two), and a
primitive graph holding bfloat16 is not run by onnxruntime, whose CPU
provider has no bfloat16 kernel for most ops (the reference check stands).

``python -m tests.conformance`` prints the counts and the decline reasons.
"""

from __future__ import annotations

import collections
import re
import sys
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from orchestrate.decompose import fission
from orchestrate.errors import OrchestrateError, UnsupportedError
from orchestrate.frontend import graph_inputs, onnxrt, prepare
from orchestrate.ir import BFLOAT16, reference
from orchestrate.ir.export import to_onnx


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  # passed | bound | declined | wrong | crashed
    detail: str = ""


def cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sorted(collect_testcases(), key=lambda c: c.name)


def _feeds(model: onnx.ModelProto, inputs: list) -> dict[str, np.ndarray]:
    names = [i.name for i in graph_inputs(model)]
    return dict(zip(names, (_array(x) for x in inputs)))


def _array(x):
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    return np.asarray(x) if isinstance(x, np.generic) else x


def _bind(model: onnx.ModelProto, feeds: dict[str, np.ndarray], bound: set[str]) -> onnx.ModelProto:
    """Bind the inputs ``bound`` as initializers (compile-time constants)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [i for i in m.graph.input if i.name not in bound]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.extend(numpy_helper.from_array(feeds[k], k) for k in sorted(bound))
    return m


BF16_RTOL = 2.0**-6  # two units in the last place of bfloat16's 8 bits


def _compare(got: dict, want: list, names: list[str], rtol: float, atol: float) -> str | None:
    for name, w in zip(names, want):
        w = _array(w)
        if not isinstance(w, np.ndarray):
            return f"{name}: expected a {type(w).__name__}"
        if w.dtype == BFLOAT16:
            rtol = max(rtol, BF16_RTOL)
        g = got[name]
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"{name}: got {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
        if w.dtype.kind in "biu":
            if not np.array_equal(g, w):
                return f"{name}: integer/bool values differ"
        elif not np.allclose(
            g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True
        ):
            err = np.nanmax(np.abs(g.astype(np.float64) - w.astype(np.float64)))
            return f"{name}: max abs error {err:.3g} (rtol {rtol}, atol {atol})"
    return None


def _attempt(case, model: onnx.ModelProto, data_sets) -> str | None:
    """None when every data set matches; else what was wrong."""
    shapes = None
    for inputs, outputs in data_sets:
        feeds = _feeds(model, inputs)
        shapes = {k: tuple(v.shape) for k, v in feeds.items() if isinstance(v, np.ndarray)}
        graph = fission(prepare(model, shapes, case.name), case.name)
        names = [o.name for o in model.graph.output]
        problem = _compare(reference.run(graph, feeds), outputs, names, case.rtol, case.atol)
        if problem:
            return "reference " + problem
        if any(t.dtype == "bfloat16" for t in graph.types.values()):
            continue  # onnxruntime's CPU provider has no bfloat16 kernels
        prim = to_onnx(graph)
        problem = _compare(onnxrt.run(prim, feeds), outputs, names, case.rtol, case.atol)
        if problem:
            return "onnxruntime-on-primitives " + problem
    return None


_CONST_NEEDED = re.compile(r"must be a constant|is not a constant|non-constant", re.I)


def run_case(case) -> Outcome:
    data_sets = [
        (inputs, outputs) for inputs, outputs in case.data_sets
    ]  # lists of arrays, by graph input / output order
    if not data_sets:
        return Outcome(case.name, "declined", "no data sets")
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                problem = _attempt(case, case.model, data_sets)
                status = "passed"
            except UnsupportedError as e:
                if not _CONST_NEEDED.search(str(e)):
                    raise
                first = _feeds(case.model, data_sets[0][0])
                problem = None
                # integer inputs first (shapes, axes, pads); then every input
                # but the data input (float scales, bool flags, fill values)
                for bound in (_bound(first), set(list(first)[1:])):
                    bound_model = _bind(case.model, first, bound)
                    bound_sets = [
                        ([v for k, v in _feeds(case.model, i).items() if k not in bound], o)
                        for i, o in data_sets
                    ]
                    try:
                        problem = _attempt(case, bound_model, bound_sets)
                        break
                    except UnsupportedError as again:
                        if not _CONST_NEEDED.search(str(again)) or bound == set(list(first)[1:]):
                            raise
                status = "bound"
    except UnsupportedError as e:
        return Outcome(case.name, "declined", _reason(e))
    except OrchestrateError as e:
        return Outcome(case.name, "crashed", f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - the harness records every crash
        return Outcome(case.name, "crashed", f"{type(e).__name__}: {str(e)[:300]}")
    if problem:
        return Outcome(case.name, "wrong", problem)
    return Outcome(case.name, status)


def _bound(feeds: dict[str, np.ndarray]) -> set[str]:
    return {k for k, v in feeds.items() if isinstance(v, np.ndarray) and v.dtype.kind in "iu"}


def _reason(e: UnsupportedError) -> str:
    if e.items:
        return ", ".join(sorted(e.items))
    return str(e).split(": ")[-1]


def main() -> int:
    outcomes = [run_case(c) for c in cases()]
    by = collections.Counter(o.status for o in outcomes)
    print(f"cases run: {len(outcomes)}")
    for status in ("passed", "bound", "declined", "wrong", "crashed"):
        print(f"  {status:<9}{by.get(status, 0):>6}")
    reasons = collections.Counter(o.detail for o in outcomes if o.status == "declined")
    print("\ndecline reasons (count):")
    for r, k in reasons.most_common():
        print(f"  {k:>4}  {r[:110]}")
    bad = [o for o in outcomes if o.status in ("wrong", "crashed")]
    for o in bad:
        print(f"{o.status.upper():>8} {o.name}: {o.detail[:200]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
