"""``orchestrate calibrate --records``: our own kernels' records against the
model, through the command; fake records counted and never fitted."""

from __future__ import annotations

import json
import math

from orchestrate.tune.records import RECORDS_SCHEMA
from tests.test_cli import assert_user_error, invoke


def _record(gpu: str, template: str, predicted: float, measured: float, fake=False) -> str:
    return json.dumps(
        {
            "schema": RECORDS_SCHEMA,
            "device": {"gpu": gpu, "name": "h200"},
            "template": template,
            "predicted_us": predicted,
            "measured_us": measured,
            "fake": fake,
        }
    )


def test_records_are_set_against_the_model_per_gpu_and_template(tmp_path):
    f = tmp_path / "records.jsonl"
    lines = [
        _record("NVIDIA H200", "matmul", 10.0, 20.0),
        _record("NVIDIA H200", "matmul", 10.0, 5.0),
        _record("NVIDIA H200", "matmul", 30.0, 30.0),
        _record("NVIDIA H200", "pointwise", 4.0, 1.0),
        _record("CPU (Triton interpreter)", "matmul", 1.0, 5000.0, fake=True),
    ]
    f.write_text("\n".join(lines) + "\n")
    r = invoke("calibrate", "--records", f)
    assert r.exit_code == 0, r.output
    assert "4 kernel records" in r.output and "1 fake records left out" in r.output
    row = next(line for line in r.output.splitlines() if "NVIDIA H200 matmul" in line).split()
    # predicted / measured 0.5, 2, 1: geomean 1, error 2 ** (2 / 3), all within 2x
    assert row[-5:] == ["3", "1.00", f"{2 ** (2 / 3):.2f}x", "0.87", "100%"]
    every = next(line for line in r.output.splitlines() if line.split()[:1] == ["all"]).split()
    geomean = math.exp((math.log(0.5) + math.log(2) + math.log(4)) / 4)
    assert every[1:3] == ["4", f"{geomean:.2f}"]


def test_what_is_not_a_record_is_refused_naming_its_line(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(_record("g", "matmul", 1.0, 1.0) + "\n" + json.dumps({"schema": "x"}) + "\n")
    assert_user_error(invoke("calibrate", "--records", f), f"{f}:2", RECORDS_SCHEMA)
    f.write_text(_record("g", "matmul", 1.0, 0.0) + "\n")
    assert_user_error(invoke("calibrate", "--records", f), f"{f}:1", "must be positive")
    f.write_text(_record("g", "matmul", 1.0, 1.0) + "\n")
    assert_user_error(invoke("calibrate", "--records", f, "--transfer"), "not with --transfer")
