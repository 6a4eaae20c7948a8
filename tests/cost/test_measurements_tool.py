"""tools/measurements, the builder of published-measurement rows, without a
KernelBench mirror: which timing files it reads at which commit, the graph
description's round trip, the export's cache and one real export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from orchestrate.cost import measurements as M
from tools.measurements import export, history
from tools.measurements.describe import attribute, describe
from tools.measurements.kernelbench import Cache, Timed, row, write_rows

BEFORE = history.SIZES_CHANGED - 86400 * 30
AFTER = history.SIZES_CHANGED + 86400 * 30
EAGER_A100 = "results/timing/A100_modal/baseline_time_torch.json"


def _commit(sha: str, time: int, *changes: tuple[str, str, str]) -> str:
    """A commit in ``git log --format='commit %H %ct' --raw --no-abbrev`` form."""
    lines = [f"commit {sha} {time}", ""]
    for status, blob, path in changes:
        lines.append(f":100644 100644 {'0' * 40} {blob} {status}\t{path}")
    return "\n".join(lines) + "\n\n"


def test_timing_files_are_named_by_gpu_directory_and_runtime():
    listing = _commit(
        "c1",
        BEFORE,
        ("A", "b1", EAGER_A100),
        ("A", "b2", "results/timing/H100_x/baseline_time_torch_compile_inductor_default.json"),
        ("M", "b3", "results/timing/H100_x/baseline_time_torch_compile_inductor_max-autotune.json"),
        ("A", "b4", "results/timing/H100_x/baseline_time_torch_compile_cudagraphs.json"),
        ("D", "b5", "results/timing/H100_x/baseline_time_torch.json"),
        ("A", "b6", "results/timing/old/baseline_time_matx3.json"),
        ("A", "b7", "KernelBench/level1/1_Square_matrix_multiplication_.py"),
    )
    found = history.versions(listing)
    assert [(v.gpu_dir, v.runtime, v.blob) for v in found] == [
        ("A100_modal", "eager", "b1"),
        ("H100_x", "torch.compile:default", "b2"),
        ("H100_x", "torch.compile:max-autotune", "b3"),
        ("H100_x", "torch.compile:cudagraphs", "b4"),
    ]
    assert {(v.commit, v.time, v.era) for v in found} == {("c1", BEFORE, "before")}


def test_a_timing_pairs_with_the_commit_that_first_wrote_it_newest_per_side_of_the_resize():
    listing = "".join(
        [  # newest first, as git log lists them
            _commit("copy", AFTER + 20, ("A", "old2", EAGER_A100.replace("A100_modal", "A100_v0"))),
            _commit("new", AFTER + 10, ("M", "new1", EAGER_A100)),
            _commit("resized", AFTER),  # the sizes change under the old timing: no timing written
            _commit("again", BEFORE + 10, ("M", "old2", EAGER_A100)),
            _commit("first", BEFORE, ("A", "old1", EAGER_A100)),
            _commit("twin", BEFORE + 10, ("A", "old2", EAGER_A100)),  # a rebased copy, same time
        ]
    )
    picked = history.pick(history.versions(listing))
    assert [(v.gpu_dir, v.era, v.commit, v.blob) for v in picked] == [
        ("A100_modal", "before", "again", "old2"),
        ("A100_modal", "after", "new", "new1"),
    ]


def _model() -> onnx.ModelProto:
    """A program with a large and a small weight, a shape constant, a
    non-finite float and long exporter-style names."""
    x = helper.make_tensor_value_info("input0", TensorProto.FLOAT, [4, 100])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 2, 3])
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((100, 3)).astype(np.float32), "fc.weight")
    b = numpy_helper.from_array(np.array([0.1, -2.5, 3.0], np.float32), "fc.bias")
    shape = numpy_helper.from_array(np.array([2, 2, 3], np.int64), "onnx::Reshape_9")
    nodes = [
        helper.make_node("MatMul", ["input0", "fc.weight"], ["/fc/MatMul_output_0"]),
        helper.make_node("Add", ["/fc/MatMul_output_0", "fc.bias"], ["/fc/Add_output_0"]),
        helper.make_node("Constant", [], ["/Constant_output_0"], value_float=float("-inf")),
        helper.make_node("Max", ["/fc/Add_output_0", "/Constant_output_0"], ["/Max_output_0"]),
        helper.make_node("LeakyRelu", ["/Max_output_0"], ["/LeakyRelu_output_0"], alpha=0.2),
        helper.make_node("Reshape", ["/LeakyRelu_output_0", "onnx::Reshape_9"], ["out"]),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], [w, b, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _row(graph: dict) -> dict:
    return {
        "id": "t",
        "suite": "test",
        "program": "p",
        "level": 2,
        "dtype": "float32",
        "gpu": "h100",
        "hardware": "NVIDIA H100 80GB HBM3",
        "runtime": "eager",
        "time_ms": 1.0,
        "source": {"repo": "r"},
        "graph": graph,
    }


def test_a_description_keeps_small_values_only_and_rebuilds_the_same_program(tmp_path):
    original = _model()
    text = json.dumps(describe(original))
    assert str(float(np.float32(0.1))) not in text  # float32 values in their shortest text
    graph = json.loads(text)
    inits = {t["name"]: t for t in graph["initializers"]}
    assert inits["fc.weight"] == {"name": "fc.weight", "dtype": "float32", "shape": [100, 3]}
    assert inits["fc.bias"]["values"] == [0.1, -2.5, 3.0]
    assert inits["onnx::Reshape_9"]["values"] == [2, 2, 3]
    assert [n["outputs"] for n in graph["nodes"]] == [
        ["t0"],
        ["t1"],
        ["t2"],
        ["t3"],
        ["t4"],
        ["out"],
    ]
    assert graph["nodes"][2]["attrs"] == {"value_float": {"float": "-inf"}}

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(_row(graph)) + "\n")
    (m,) = M.load(path)
    rebuilt = M.model(m, seed=3)
    for old, new in zip(original.graph.node, rebuilt.graph.node, strict=True):
        assert (old.op_type, list(old.attribute)) == (new.op_type, list(new.attribute))
    assert [i.name for i in rebuilt.graph.input] == ["input0"]
    assert rebuilt.graph.output[0] == original.graph.output[0]
    weights = {t.name: numpy_helper.to_array(t) for t in rebuilt.graph.initializer}
    originals = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    assert np.array_equal(weights["fc.bias"], originals["fc.bias"])
    assert np.array_equal(weights["onnx::Reshape_9"], originals["onnx::Reshape_9"])
    assert weights["fc.weight"].shape == (100, 3)
    assert not np.array_equal(weights["fc.weight"], originals["fc.weight"])


@pytest.mark.parametrize(
    "attr",
    [
        helper.make_attribute("axes", [], attr_type=AttributeProto.INTS),
        helper.make_attribute("scales", [], attr_type=AttributeProto.FLOATS),
        helper.make_attribute("bounds", [1.0, float("inf")]),
        helper.make_attribute("mode", "constant"),
        helper.make_attribute("size", 3),
    ],
)
def test_attributes_keep_their_type_through_json(attr):
    value = json.loads(json.dumps(attribute(attr)))
    assert M._attribute(attr.name, value, np.random.default_rng(0)) == attr


def test_stripping_drops_values_of_more_than_64_elements_only():
    model = _model()
    big = numpy_helper.from_array(np.ones(65, np.float32), "c65")
    model.graph.node.append(helper.make_node("Constant", [], ["k"], value=big))
    export.strip(model)
    inits = {t.name: t for t in model.graph.initializer}
    assert list(inits["fc.weight"].dims) == [100, 3]
    assert not inits["fc.weight"].raw_data and not inits["fc.weight"].float_data
    assert numpy_helper.to_array(inits["fc.bias"]).tolist() == pytest.approx([0.1, -2.5, 3.0])
    value = model.graph.node[-1].attribute[0].t
    assert list(value.dims) == [65] and not value.raw_data


def test_a_cached_failure_is_retried_only_under_a_raised_limit(tmp_path):
    cache = Cache(tmp_path)
    cache.keep("slow", export.Outcome(False, "no export in 10 s", "time", 10.0), 10.0, 8.0)
    cache.keep("big", export.Outcome(False, "MemoryError", "memory", 3.0), 10.0, 8.0)
    cache.keep("bad", export.Outcome(False, "TypeError: x", "", 1.0), 10.0, 8.0)
    assert cache.outcome("slow", 10.0, 8.0).reason == "no export in 10 s"
    assert cache.outcome("slow", 20.0, 8.0) is None
    assert cache.outcome("big", 99.0, 8.0).limit == "memory"
    assert cache.outcome("big", 10.0, 16.0) is None
    assert cache.outcome("bad", 99.0, 99.0).reason == "TypeError: x"
    assert cache.outcome("unknown", 10.0, 8.0) is None
    cache.keep("gone", export.Outcome(True, seconds=1.0), 10.0, 8.0)  # its ONNX file is missing
    assert cache.outcome("gone", 10.0, 8.0) is None
    record = json.loads((tmp_path / "bad.json").read_text())
    (tmp_path / "bad.json").write_text(json.dumps(record | {"version": export.VERSION - 1}))
    assert cache.outcome("bad", 10.0, 8.0) is None


PROGRAM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features, scale):
        super().__init__()
        self.fc = nn.Linear(features, features)
        self.bn = nn.BatchNorm1d(features)
        self.scale = scale

    def forward(self, x):
        return torch.sigmoid(self.bn(self.fc(x) * self.scale))

batch_size = 16
features = 96

def get_inputs():
    return [torch.rand_mix(batch_size, features)]

def get_init_inputs():
    return [features, 2.0]
"""


def test_a_program_exports_in_the_mode_it_was_timed_in_and_becomes_a_row(tmp_path):
    out = tmp_path / "p.onnx"
    done = export.run(PROGRAM, out, seconds=120, memory_gb=8, threads=1)
    assert done.ok, done.reason
    graph = describe(onnx.load(str(out)))
    assert [i["shape"] for i in graph["inputs"]] == [[16, 96]]
    (bn,) = [n for n in graph["nodes"] if n["op"] == "BatchNormalization"]
    assert bn["attrs"]["training_mode"] == 1  # nn.Module's default, as KernelBench times it
    assert {t["name"]: t["shape"] for t in graph["initializers"]}["fc.weight"] == [96, 96]

    version = history.Version("c" * 40, AFTER, "b", EAGER_A100, "A100_modal", "eager")
    entry = {"mean": 0.5, "std": 0.01, "min": 0.45, "max": 0.7, "num_trials": 100}
    entry |= {"hardware": "NVIDIA A100-SXM4-40GB"}
    timed = Timed(version, 2, "5_Gemm_BN.py", entry, "a100-40gb-sxm", "f" * 64)
    rows = tmp_path / "rows.jsonl.gz"
    write_rows([row(timed, graph)], rows)
    first = rows.read_bytes()
    write_rows([row(timed, graph)], rows)
    assert rows.read_bytes() == first  # no time stamp in the gzip header
    (m,) = M.load(rows)
    assert (m.id, m.program, m.level, m.kind) == (
        f"kernelbench/A100_modal/eager/level2/5_Gemm_BN@{'f' * 8}",
        "5_Gemm_BN",
        2,
        "fused",
    )
    assert (m.gpu, m.time_us, m.min_us, m.trials) == ("a100-40gb-sxm", 500.0, 450.0, 100)
    assert m.source.problem == "KernelBench/level2/5_Gemm_BN.py"
    assert m.source.timing == EAGER_A100


def test_a_program_that_fails_says_why_in_one_line(tmp_path):
    done = export.run("raise ValueError('no such size')\n", tmp_path / "p.onnx", 60, 8, 1)
    assert (done.ok, done.reason, done.limit) == (False, "ValueError: no such size", "")


def test_an_export_over_its_time_is_stopped(tmp_path):
    done = export.run("import time\ntime.sleep(30)\n", tmp_path / "p.onnx", 1, 8, 1)
    assert (done.ok, done.limit) == (False, "time")


def test_an_export_over_its_memory_is_stopped(tmp_path):
    source = "import numpy\nx = numpy.ones(3 * 2**30, numpy.uint8)\n"
    done = export.run(source, tmp_path / "p.onnx", 60, 2, 1)
    assert (done.ok, done.limit) == (False, "memory")
    assert Path(tmp_path / "p.onnx").exists() is False
