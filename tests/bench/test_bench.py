"""`orchestrate bench` and the benchmark's parts that run on a CPU:
statistics, the roofline floor against a hand computation, the results
schema, onnxruntime's CUDA provider labelled unavailable with its reason, and
the command's one-line errors."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from orchestrate import cli
from orchestrate.bench import report
from orchestrate.bench.floor import roofline_floor
from orchestrate.bench.ort_side import cuda_refusal, ort_runtime
from orchestrate.bench.run import Measured, ModelResult
from orchestrate.bench.runtimes import ORT_CUDA, against
from orchestrate.bench.stats import Stats, percentile
from orchestrate.cost.devices import DEVICES
from orchestrate.cost.figures import ACHIEVABLE_BANDWIDTH
from orchestrate.plan.pipeline import fission_model


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def test_percentiles_interpolate_between_ordered_samples():
    times = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(times, 50) == 3.0
    assert percentile(times, 10) == pytest.approx(1.4)  # 1 + 0.4 * (2 - 1)
    assert percentile(times, 90) == pytest.approx(4.6)
    s = Stats.of(times)
    assert (s.median, s.runs) == (3.0, 5) and s.p10 <= s.median <= s.p90
    assert Stats.of([7.0]) == Stats(7.0, 7.0, 7.0, 1)
    with pytest.raises(ValueError):
        percentile([], 50)


def matmul_model(m=4, k=8, n=16) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((k, n), np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "mm", [x], [y], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_roofline_floor_is_least_bytes_and_flops_over_the_peaks():
    m, k, n = 4, 8, 16
    graph = fission_model(matmul_model(m, k, n), {}, "mm.onnx")
    h200 = DEVICES["h200"]
    f = roofline_floor(graph, h200)
    # bytes: x, w and the ReLU's scalar 0 (max(h, 0)) read once, y written once, fp32
    assert f.bytes == 4 * (m * k + k * n + 1 + m * n) == 900
    assert f.dot_flops == 2 * m * n * k == 1024
    assert f.other_flops == m * n  # the ReLU, one flop per element
    memory_ms = 900 / (4800e9 * ACHIEVABLE_BANDWIDTH) * 1e3
    compute_ms = (1024 / 66.9e12 + 64 / 66.9e12) * 1e3  # IEEE fp32 dots run on CUDA cores
    assert f.memory_ms == pytest.approx(memory_ms) and f.compute_ms == pytest.approx(compute_ms)
    assert f.ms == pytest.approx(max(memory_ms, compute_ms)) and f.bound == "memory"
    tf32 = roofline_floor(graph, h200, tf32=True)
    assert tf32.compute_ms == pytest.approx((1024 / 494.7e12 + 64 / 66.9e12) * 1e3)


def result(**over) -> ModelResult:
    graph = fission_model(matmul_model(), {}, "mm.onnx")
    measured = [
        Measured(
            "orchestrate",
            "orchestrate (Triton interpreter)",
            Stats.of([2.0, 3.0]),
            None,
            "no GPU",
            1.5,
        ),
        Measured("torch-eager", "torch eager", Stats.of([1.0]), None, "no GPU", 0.1),
        Measured(ORT_CUDA, ORT_CUDA, reason="no CUDA GPU on this machine"),
    ]
    args = dict(
        name="mm",
        dtype="fp16",
        measured=measured,
        floor=roofline_floor(graph, DEVICES["h200"]),
        kernels=1,
        verified=True,
    )
    args.update(over)
    return ModelResult(**args)


def test_the_results_document_keeps_its_schema():
    rec = report.model_record(result())
    doc = report.document(
        [rec],
        device="CPU (Triton interpreter)",
        clock="time.perf_counter",
        interpreter=True,
        date="2026-01-01",
    )
    assert report.check_document(json.loads(json.dumps(doc))) == []
    assert rec["latency_ms"] == {"orchestrate": 2.5, "torch-eager": 1.0, ORT_CUDA: None}
    assert rec["unavailable"] == {ORT_CUDA: "no CUDA GPU on this machine"}
    assert rec["roofline_fraction"]["orchestrate"] == pytest.approx(rec["roofline_ms"] / 2.5)
    assert {"device", "date", "commit", "torch", "triton", "models"} <= set(doc)
    assert "say nothing about GPU speed" in doc["note"]
    # what the check refuses
    bad = json.loads(json.dumps(doc))
    del bad["models"][0]["unavailable"][ORT_CUDA]
    bad["models"][0]["p90_ms"]["tvm"] = 1.0
    bad["models"][0]["roofline_ms"] = "fast"
    del bad["commit"]
    problems = report.check_document(bad)
    assert any("onnxruntime-cuda has no latency and no reason" in p for p in problems)
    assert any("p90_ms.tvm: unknown runtime" in p for p in problems)
    assert any("roofline_ms" in p for p in problems) and any(
        p.startswith("commit") for p in problems
    )
    assert report.check_document([]) == ["the document is not an object"]


def test_the_table_and_chart(tmp_path):
    r = result()
    lines = report.table(r, interpreter=True)
    assert "unavailable: no CUDA GPU on this machine" in "\n".join(lines)
    assert lines[-1] == report.INTERPRETER_NOTE
    doc = report.document([report.model_record(r)], device="cpu", clock="c", interpreter=True)
    pytest.importorskip("matplotlib")
    assert report.chart(doc, tmp_path / "c.png") == f"wrote {tmp_path / 'c.png'}"
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_onnxruntime_cuda_is_unavailable_with_its_reason_never_the_cpu(monkeypatch):
    feeds = [{"x": np.ones((4, 8), np.float32)}]
    got = ort_runtime(ORT_CUDA, matmul_model(), feeds, None, None, on_gpu=False)
    assert got.reason == "no CUDA GPU on this machine"
    # a GPU, but the CPU build of onnxruntime: said so, not run on the CPU provider
    import onnxruntime as ort

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    why = cuda_refusal(on_gpu=True)
    assert "onnxruntime-gpu is not installed" in why and "CPUExecutionProvider" in why
    got = ort_runtime(ORT_CUDA, matmul_model(), feeds, None, None, on_gpu=True)
    assert got.key == ORT_CUDA and got.reason == why
    assert ort_runtime(ORT_CUDA, matmul_model(), feeds, "bf16", None, False).reason


def test_against_names():
    assert against(["eager", "ort-cuda", "torch-eager"]) == ("torch-eager", "onnxruntime-cuda")
    with pytest.raises(ValueError, match="--against tvm: unknown runtime"):
        against(["tvm"])


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "mm.onnx"
    onnx.save(matmul_model(), path)
    return path


def test_bench_an_onnx_model_writes_table_json_and_chart(model_file, tmp_path):
    r = invoke(
        "bench",
        model_file,
        "--runs",
        2,
        "--warmup",
        1,
        "--inputs",
        2,
        "--against",
        "eager,ort-cuda,ort-cpu",
        "--json",
        tmp_path / "r.json",
        "--chart",
        tmp_path / "r.png",
    )
    assert r.exit_code == 0, r.output
    assert "orchestrate (Triton interpreter)" in r.output
    assert "onnxruntime-cuda" in r.output and "unavailable: no CUDA GPU" in r.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert report.check_document(doc) == []
    (m,) = doc["models"]
    assert m["verified"] is True
    if importlib.util.find_spec("onnx2torch") is None:  # not a dependency (make test's venv)
        assert "onnx2torch is not installed" in m["unavailable"]["torch-eager"]
        assert m["latency_ms"]["torch-eager"] is None
    else:
        assert m["latency_ms"]["torch-eager"] > 0
        assert m["notes"]["torch-eager"].startswith("model from onnx2torch")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["nowhere.onnx"], "nowhere.onnx: no such file or bundle folder"),
        (["{model}", "--against", "tvm"], "--against tvm: unknown runtime"),
        (["{model}", "--dtype", "fp8"], "--dtype fp8"),
        (["{model}", "--json", "r.txt"], "r.txt: expected a .json file name"),
        (["{model}", "--model", "{model}"], "--model"),
        (["{dir}"], "give --model MODEL.onnx"),
    ],
)
def test_bench_errors_are_one_line(model_file, tmp_path, args, needle):
    subs = {"{model}": str(model_file), "{dir}": str(tmp_path)}
    r = invoke("bench", *[subs.get(a, a) for a in args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_bench_a_bundle_times_only_the_model_it_was_made_from(model_file, tmp_path):
    """Another model of the same interface (other weights) would give timings
    of nothing: refused by the manifest's sha256, in one line."""
    import orchestrate

    out = tmp_path / "mm.orch"
    orchestrate.optimize(model_file, out, trials=0)
    other = matmul_model()
    w = other.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(w), w.name))
    onnx.save(other, tmp_path / "other.onnx")
    r = invoke(
        "bench", out, "--model", tmp_path / "other.onnx", "--runs", 1, "--against", "ort-cpu"
    )
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "not the model" in r.output and "mm.onnx, by its sha256" in r.output
    r = invoke("bench", out, "--model", model_file, "--runs", 1, "--against", "ort-cpu")
    assert r.exit_code == 0, r.output
    assert "timed at x=4x8" in r.output


def test_bench_a_dynamic_bundle_at_a_shape_in_its_range(tmp_path):
    """bench times OPT by default and any --shape inside the range, says
    which, and prices the roofline floor at the shape it times."""
    import orchestrate

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 64])],
    )
    src, out = tmp_path / "relu.onnx", tmp_path / "relu.orch"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), src)
    orchestrate.optimize(src, out, dims={"b": "1..8"}, trials=0)
    common = ("--model", src, "--runs", 1, "--against", "ort-cpu")
    r = invoke("bench", out, *common, "--json", tmp_path / "opt.json")
    assert r.exit_code == 0, r.output
    assert "timed at x=8x64 (b=8 of the bundle's range b 1..8)" in r.output
    r = invoke("bench", out, *common, "--shape", "x=3x64", "--json", tmp_path / "three.json")
    assert r.exit_code == 0, r.output
    assert "timed at x=3x64 (b=3 of the bundle's range b 1..8)" in r.output
    opt, three = (
        json.loads((tmp_path / f).read_text())["models"][0] for f in ("opt.json", "three.json")
    )
    assert opt["shapes"] == {"x": [8, 64]} and three["shapes"] == {"x": [3, 64]}
    assert three["roofline_ms"] < opt["roofline_ms"]  # the floor of the shape timed
    r = invoke("bench", out, *common, "--shape", "x=9x64")
    assert r.exit_code == 2 and "b=9, outside the bundle's range 1..8" in r.output, r.output
