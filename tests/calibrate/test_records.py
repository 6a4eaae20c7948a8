"""``orchestrate calibrate --records``: our own kernels' records against the
model, and learnt from beside the published rows, through the command.  The
records are written as ``make bench-gpu`` writes them (``tune/records.py``'s
``describe`` and ``line`` over a real plan's kernels); only their measured
times are made up here, and the fake ones are counted and never fitted."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchestrate.calibrate import learn, records
from orchestrate.cost import learned, measurements
from orchestrate.cost.devices import get_device
from orchestrate.cost.roofline import cost
from orchestrate.plan.planner import PlanOptions, plan
from orchestrate.tune.cache import Key, Row
from orchestrate.tune.records import RECORDS_SCHEMA, describe, line, spec_dtype
from tests import graphs
from tests.test_cli import assert_user_error, invoke

GPU = "NVIDIA H100 80GB HBM3"
FIXTURE = Path(__file__).resolve().parents[1] / "cost" / "data" / "measurements.jsonl"


def _planned(n: int):
    """A plan of a matmul, a softmax and a layer norm at width ``n`` on the H100."""
    g = graphs.build(
        lambda b, x, w, gamma, beta: (
            b.matmul(x, w),
            graphs.softmax(b, x),
            graphs.layernorm(b, x, gamma, beta),
        ),
        [(256, n), (n, n), (n,), (n,)],
    )
    return g, plan(g, PlanOptions(device="h100", reproducible=True))


def _lines(slow: dict[str, float], widths=(128, 256, 512, 1024), gpu=GPU, fake=False) -> list:
    """One record per kernel of each plan, measured ``slow[template]`` times
    the model's prediction (1 for a template not named)."""
    out = []
    for n in widths:
        g, planned = _planned(n)
        for kernel, spec in zip(planned.plan.kernels, planned.specs):
            record = describe(g, spec, get_device("h100"), 0) | {"method": "made up for a test"}
            measured = kernel.predicted_us * slow.get(kernel.template, 1.0)
            key = Key(spec.hash, gpu, spec_dtype(g, spec), "3.6.0", "570")
            row = Row(key, measured, kernel.predicted_us, fake, "2026-12-05T00:00:00+00:00", record)
            out.append(json.dumps(line(row), sort_keys=True))
    return out


def test_a_record_holds_what_the_planner_asks_the_learned_model():
    """A record read back gives the kernel's terms exactly as the planner
    computes them for ``--cost learned``, on the device row that priced it."""
    g, planned = _planned(256)
    (text,) = _lines({}, widths=(256,))[:1]
    read = records._record(json.loads(text), "test")
    kernel, spec = planned.plan.kernels[0], planned.specs[0]
    h100 = get_device("h100")
    assert read.device == h100 and read.gpu == GPU
    assert read.terms == learned.terms(g, spec, cost(g, spec, h100), kernel.predicted_us)
    s = learn.record_sample(read)
    assert s.gpu == "h100" and s.y == pytest.approx(0.0)
    assert list(s.x) == learned.features([read.terms], h100, "graph")


def test_records_are_set_against_the_model_per_gpu_and_template(tmp_path):
    f = tmp_path / "records.jsonl"
    lines = _lines({"matmul": 2.0}, widths=(128, 256))
    lines += _lines({}, widths=(128,), gpu="CPU (Triton interpreter)", fake=True)
    f.write_text("\n".join(lines) + "\n")
    r = invoke("calibrate", "--records", f)
    assert r.exit_code == 0, r.output
    fakes = len(_lines({}, widths=(128,)))
    assert f"{len(lines) - fakes} kernel records" in r.output
    assert f"{fakes} fake records left out" in r.output
    row = next(x for x in r.output.splitlines() if f"{GPU} matmul" in x).split()
    # every matmul record measured twice its prediction: geomean 0.5, error 2x, within 2x
    assert row[-5:-3] == ["2", "0.50"] and row[-3] == "2.00x" and row[-1] == "100%"


def test_records_join_the_training_and_are_learnt(tmp_path):
    """Trained on the published rows and records whose matmuls run 8x slower
    than the model says, the model corrects a matmul kernel by about 8x and
    leaves the others near 1x; the records count in the data's hash."""
    f = tmp_path / "records.jsonl"
    f.write_text("\n".join(_lines({"matmul": 8.0})) + "\n")
    out = tmp_path / "m.json"
    r = invoke("calibrate", FIXTURE, "--records", f, "--train", out)
    assert r.exit_code == 0, r.output
    kept = records.read([f]).kept
    assert f"and {len(kept)} kernel records" in r.output
    model = learned.load(out)
    assert model.data == learn.data_hash(measurements.load(FIXTURE), kept)
    assert model.data != learn.data_hash(measurements.load(FIXTURE))
    for r_ in kept:
        fix = model.scale(r_.terms, r_.device)
        if r_.template == "matmul":
            assert 4 < fix < 16, (r_.terms, fix)
        else:
            assert 0.5 < fix < 2, (r_.terms, fix)
    assert math.isclose(
        model.scale(kept[0].terms, kept[0].device),
        math.exp(model.corrections([learn.record_sample(kept[0]).x])[0]),
    )


def test_what_is_not_a_record_is_refused_naming_its_line(tmp_path):
    f = tmp_path / "r.jsonl"
    good = _lines({}, widths=(128,))[0]
    f.write_text(good + "\n" + json.dumps({"schema": "x"}) + "\n")
    assert_user_error(invoke("calibrate", "--records", f), f"{f}:2", RECORDS_SCHEMA)
    zero = json.loads(good) | {"measured_us": 0.0}
    f.write_text(json.dumps(zero) + "\n")
    assert_user_error(invoke("calibrate", "--records", f), f"{f}:1", "must be positive")
    no_bytes = {k: v for k, v in json.loads(good).items() if k != "bytes"}
    f.write_text(json.dumps(no_bytes) + "\n")
    assert_user_error(invoke("calibrate", "--records", f), f"{f}:1", "lacks its bytes")
    bad_device = json.loads(good)
    bad_device["device"]["bandwidth_gbs"] = "fast"
    f.write_text(json.dumps(bad_device) + "\n")
    assert_user_error(invoke("calibrate", "--records", f), f"{f}:1", "lacks its device")
    f.write_text(good + "\n")
    assert_user_error(invoke("calibrate", "--records", f, "--plot", tmp_path / "p.png"), "--plot")
    out = tmp_path / "m.json"
    assert_user_error(
        invoke("calibrate", "--records", f, "--kind", "matmul", "--train", out), "kind"
    )
    assert not out.exists()


def test_gpu_chooses_records_by_the_row_that_priced_them(tmp_path):
    f = tmp_path / "records.jsonl"
    lines = _lines({}, widths=(128,))
    f.write_text("\n".join(lines) + "\n")
    assert len(records.read([f], ("h100",)).kept) == len(lines)
    assert records.read([f], ("l4",)).kept == ()
