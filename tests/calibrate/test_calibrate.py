"""orchestrate calibrate: its statistics by hand, its predictions of a small
fixture (tests/cost/data/measurements.jsonl) and its command line."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrate import cli
from orchestrate.calibrate.predict import Prediction, host_us, runtime_class
from orchestrate.calibrate.run import calibrate, choose
from orchestrate.calibrate.stats import fit, ranks, spearman
from orchestrate.cost import measurements
from orchestrate.cost.figures import COMPILE_KERNEL_HOST_US, EAGER_OP_HOST_US

FIXTURE = Path(__file__).resolve().parents[1] / "cost" / "data" / "measurements.jsonl"


def test_statistics_by_hand():
    """(2, 1), (1, 2), (1, 1): unbiased on average (2 * 1/2 * 1 = 1), a
    typical miss of 2**(2/3), all within 2x; the ranks (3, 1.5, 1.5) and
    (1.5, 3, 1.5) correlate at -0.75 / 1.5 = -0.5."""
    f = fit([(2, 1), (1, 2), (1, 1)])
    assert f.n == 3 and f.geomean == pytest.approx(1.0)
    assert f.error == pytest.approx(2 ** (2 / 3)) and f.within == 1.0
    assert f.spearman == pytest.approx(-0.5)
    assert ranks([5, 1, 5, 3]) == [3.5, 1.0, 3.5, 2.0]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2], [2, 1]) is None and spearman([1, 1, 1], [1, 2, 3]) is None
    miss = fit([(10, 1), (1, 1)])
    assert miss.within == 0.5 and math.isclose(miss.geomean, math.sqrt(10))


def test_runtimes_and_their_host_time():
    assert runtime_class("eager") == "eager" and runtime_class("torch.compile:default") == "compile"
    assert runtime_class("orchestrate") == "other"
    assert host_us("eager") == EAGER_OP_HOST_US
    assert host_us("torch.compile:default") == COMPILE_KERNEL_HOST_US
    assert host_us("torch.compile:max-autotune-no-cudagraphs") == COMPILE_KERNEL_HOST_US
    for graphed in ("torch.compile:reduce-overhead", "torch.compile:max-autotune", "orchestrate"):
        assert host_us(graphed) == 0.0


def test_each_runtime_is_priced_as_it_runs():
    """Eager: one library or generated kernel per ONNX op, each waiting at
    least for its launch from the host; torch.compile: the plan, each kernel
    at least a Triton launch (default mode)."""
    found, skipped = calibrate([FIXTURE])
    assert not skipped and len(found) == 3
    by_runtime = {p.measurement.runtime: p for p in found}
    eager = by_runtime["eager"]
    assert {k.template for k in eager.kernels} <= {"library_matmul", "library_conv", "pointwise"}
    assert eager.predicted_us == pytest.approx(
        sum(max(k.time_us, EAGER_OP_HOST_US) for k in eager.kernels)
    )
    compiled = by_runtime["torch.compile:default"]
    assert compiled.predicted_us >= COMPILE_KERNEL_HOST_US * len(compiled.kernels)
    assert all(isinstance(p, Prediction) and p.predicted_us > 0 for p in found)


def test_rows_are_chosen_by_gpu_runtime_and_kind():
    rows = measurements.load(FIXTURE)
    assert {m.gpu for m in choose(rows, gpus=["h100"])} == {"h100"}
    assert {runtime_class(m.runtime) for m in choose(rows, runtimes=["compile"])} == {"compile"}
    assert [m.kind for m in choose(rows, kinds=["conv"])] == ["conv"]
    assert choose(rows, gpus=["t4"]) == []


def test_a_program_that_cannot_be_planned_is_skipped_with_its_reason(monkeypatch):
    row = measurements.load(FIXTURE)[0]

    def refuse(m):
        from orchestrate.errors import UnsupportedError

        raise UnsupportedError("no decomposition for Frobnicate", {"Frobnicate": 1})

    module = importlib.import_module("orchestrate.calibrate.predict")
    monkeypatch.setattr(module.measurements, "model", refuse)
    s = module.predict(row)
    assert isinstance(s, module.Skipped) and "Frobnicate" in s.reason


def test_the_command_prints_tables_and_writes_its_rows(tmp_path):
    out = tmp_path / "c.json"
    r = CliRunner().invoke(cli.main, ["calibrate", str(FIXTURE), "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "by GPU and runtime" in r.output and "h100 eager" in r.output
    data = json.loads(out.read_text())
    assert len(data["predictions"]) == 3 and not data["skipped"]
    r = CliRunner().invoke(cli.main, ["calibrate", str(FIXTURE), "--gpu", "t4"])
    assert r.exit_code == 2 and "no measurement row matches" in r.output
    r = CliRunner().invoke(cli.main, ["calibrate", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2 and "missing.jsonl" in r.output and "Traceback" not in r.output
