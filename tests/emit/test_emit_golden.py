"""Golden copies of generated kernels: any change in codegen shows up in review.

Each case is a small graph run as one kernel; its generated ``kernels.py``
must equal ``tests/golden/<case>.py`` byte for byte.  When a codegen change
is intended, regenerate the copies and review the diff:

    python -m tests.emit.test_emit_golden --update      (make golden-update)

The update runs every regenerated module in the Triton interpreter against
the float64 reference before writing it, so a golden copy is always code
that computes the right thing.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrate import emit, ir
from tests import graphs
from tests.emit_util import assert_matches_reference, one_kernel

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
UPDATE = "python -m tests.emit.test_emit_golden --update"


def _gelu(b, h):
    return b.mul(b.mul(h, 0.5), b.add(b.erf(b.mul(h, 1 / math.sqrt(2))), 1.0))


@dataclass(frozen=True)
class Case:
    name: str
    template: str  # the one kernel's template
    fn: Callable
    shapes: list[tuple[int, ...]]
    what: str

    def graph(self) -> ir.Graph:
        return graphs.build(self.fn, self.shapes, name=self.name)

    def path(self) -> Path:
        return GOLDEN / f"{self.name}.py"

    def source(self) -> tuple[ir.Graph, dict, str]:
        g = self.graph()
        plan = one_kernel(g)
        templates = [k.template for k in plan.plan.kernels]
        assert templates == [self.template], f"{self.name}: planned as {templates}"
        return g, plan, emit.emit(g, plan, title=f"Golden kernels: {self.what}.")


CASES = [
    Case(
        "pointwise_chain",
        "pointwise",
        lambda b, x, y: b.mul(b.sigmoid(b.add(b.mul(x, y), 0.5)), x),
        [(4, 6), (6,)],
        "a pointwise chain, sigmoid(x * y + 0.5) * x with a broadcast y",
    ),
    Case(
        "softmax",
        "row_reduce",
        graphs.softmax,
        [(4, 10)],
        "softmax over the last axis (a row-reduce: max, exp, sum, divide)",
    ),
    Case(
        "layernorm",
        "row_reduce",
        graphs.layernorm,
        [(4, 10), (10,), (10,)],
        "layer normalisation with scale and shift (a row-reduce: mean, variance)",
    ),
    Case(
        "matmul_bias_gelu",
        "matmul",
        lambda b, x, w, c: _gelu(b, b.add(b.matmul(x, w), c)),
        [(8, 16), (16, 12), (12,)],
        "matmul with a bias and erf GELU epilogue",
    ),
    Case(
        "maxpool",
        "window",
        lambda b, x: b.pool(
            b.relu(x), "max", kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), dilations=(1, 1)
        ),
        [(1, 3, 9, 8)],
        "ReLU then a 3x3 stride-2 max pool with padding",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_generated_source_matches_golden_copy(case: Case):
    _, _, src = case.source()
    if not case.path().exists():
        pytest.fail(f"no golden copy {case.path()}: run `{UPDATE}`")
    want = case.path().read_text()
    if src != want:
        diff = _diff(want, src, case.path())
        pytest.fail(
            f"generated source differs from {case.path().name} (if intended, run "
            f"`{UPDATE}` and review the diff):\n{diff}"
        )


def test_every_golden_copy_has_a_case():
    names = {c.name for c in CASES}
    stale = sorted(p.name for p in GOLDEN.glob("*.py") if p.stem not in names)
    assert not stale, f"golden copies without a case: {stale}"


def _diff(want: str, got: str, path: Path) -> str:
    import difflib

    lines = difflib.unified_diff(
        want.splitlines(keepends=True),
        got.splitlines(keepends=True),
        f"{path.name} (golden)",
        f"{path.name} (generated)",
        n=2,
    )
    return "".join(list(lines)[:200])


def update() -> int:
    """Regenerate every golden copy after checking it against the reference.
    Returns a process exit status."""
    GOLDEN.mkdir(exist_ok=True)
    for case in CASES:
        g, plan, src = case.source()
        assert_matches_reference(g, plan, graphs.random_inputs(g, 0), rtol=1e-4, atol=1e-5)
        old = case.path().read_text() if case.path().exists() else None
        if old == src:
            print(f"same   tests/golden/{case.path().name}")
            continue
        case.path().write_text(src)
        print(f"{'wrote ' if old is None else 'update'} tests/golden/{case.path().name}")
    return 0


def check() -> int:
    """Report stale golden copies without writing."""
    stale = 0
    for case in CASES:
        _, _, src = case.source()
        same = case.path().exists() and case.path().read_text() == src
        stale += not same
        print(f"{'ok   ' if same else 'STALE'}  {case.name}")
    if stale:
        print(f"{stale} golden copies are stale: run `{UPDATE}`")
    return 1 if stale else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m tests.emit.test_emit_golden",
        description="Check or regenerate tests/golden/*.py.",
    )
    parser.add_argument("--update", action="store_true", help="rewrite the golden copies")
    sys.exit(update() if parser.parse_args().update else check())
