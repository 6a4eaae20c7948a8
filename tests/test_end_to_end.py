"""The example models through `orchestrate optimize` + `verify` (tiny sizes, so
the Triton interpreter stays fast): every output within 1e-4 of onnxruntime."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import orchestrate
from examples import EXAMPLES, export_example
from orchestrate import cli

# (example, exporter, opset, dynamic shapes bound with --shape)
CASES = [(name, False, 17, False) for name in EXAMPLES] + [
    ("bert", True, 18, True),
    ("gpt2", True, 18, False),
    ("llama", True, 18, True),
    ("vit", True, 18, False),
    pytest.param("mobilenet", True, 18, False, marks=pytest.mark.slow),
    pytest.param("t5", True, 18, True, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, dynamo, opset, dynamic", CASES)
def test_optimize_and_verify(tmp_path, name, dynamo, opset, dynamic):
    src = tmp_path / f"{name}.onnx"
    _, inputs = export_example(name, src, dynamo=dynamo, opset=opset, size="tiny", dynamic=dynamic)
    shapes = {i.name: tuple(i.shape) for i in inputs} if dynamic else None
    result = orchestrate.optimize(
        src, tmp_path / f"{name}.orch", shapes=shapes, trials=2, rtol=1e-4, reproducible=True
    )
    assert result.report.ok
    assert max(c.rel for c in result.report.checks) <= 1e-4
    s, b = result.plan.summary, result.plan.baselines
    assert s.predicted_us <= b["greedy"].predicted_us + 1e-6
    assert s.predicted_us <= b["unfused"].predicted_us + 1e-6


def test_demo_model_through_the_cli(tmp_path):
    """What `make demo` does: optimize, then verify the bundle from the CLI."""
    src = "examples/models/tiny_bert.onnx"
    out = tmp_path / "tiny_bert.orch"
    r = CliRunner().invoke(cli.main, ["optimize", src, "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "orchestrate" in r.output and "verified against the float64 reference" in r.output
    r = CliRunner().invoke(cli.main, ["verify", str(out), "--model", src])
    assert r.exit_code == 0, r.output
    assert r.output.strip().splitlines()[-1].startswith("OK: 2 outputs match")
    assert set(EXAMPLES) >= {"bert", "gpt2", "llama"}
