"""Measurement rows (orchestrate/cost/measurements.py): what a row says is
read back exactly, a malformed row is refused in one line naming its place,
and each row's program rebuilds as an ONNX model the planner accepts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from orchestrate.cost import measurements as M
from orchestrate.errors import InputError
from orchestrate.plan.pipeline import fission_model

FIXTURE = Path(__file__).parent / "data" / "measurements.jsonl"
LINES = FIXTURE.read_text().splitlines()


def _by_id():
    return {m.id: m for m in M.load(FIXTURE)}


def test_rows_are_read_as_written_times_in_microseconds():
    rows = _by_id()
    assert list(rows) == [
        "fixture/h100/eager/matmul",
        "fixture/a100/compile/conv",
        "fixture/l4/eager/fused",
    ]
    mm = rows["fixture/h100/eager/matmul"]
    assert (mm.gpu, mm.hardware, mm.runtime, mm.level) == (
        "h100",
        "NVIDIA H100 80GB HBM3",
        "eager",
        1,
    )
    assert (mm.time_us, mm.min_us, mm.trials) == (250.0, 200.0, 100)
    assert mm.source == M.Source(
        "example/suite",
        "0123456789abcdef0123456789abcdef01234567",
        "results/h100/eager.json",
        "level1/small_matmul.py",
    )
    fused = rows["fixture/l4/eager/fused"]
    assert (fused.time_us, fused.min_us, fused.trials) == (3000.0, None, None)
    assert fused.source == M.Source("example/suite")


def test_a_folder_is_every_jsonl_in_it_and_an_id_is_one_row(tmp_path):
    (tmp_path / "a.jsonl").write_text(LINES[0] + "\n")
    (tmp_path / "b.jsonl").write_text("\n" + LINES[1] + "\n")
    (tmp_path / "notes.txt").write_text("not rows")
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress((LINES[2] + "\n").encode()))
    assert [m.program for m in M.load(tmp_path)] == [
        "small_matmul",
        "small_conv",
        "gemm_scale_batchnorm_sigmoid",
    ]
    assert [m.program for m in M.load(tmp_path / "c.jsonl.gz")] == ["gemm_scale_batchnorm_sigmoid"]
    (tmp_path / "d.jsonl").write_text(LINES[0] + "\n")
    with pytest.raises(InputError, match=r"d\.jsonl:1: id: .* is also the id on .*a\.jsonl:1$"):
        M.load(tmp_path)


def _edited(row: str, change) -> str:
    data = json.loads(row)
    change(data)
    return json.dumps(data)


def _drop(key):
    return lambda d: d.pop(key)


def _drop_in(path: str, key: str):
    def change(d):
        for p in path.split("."):
            d = d[int(p)] if p.isdigit() else d[p]
        d.pop(key)

    return change


def _set(path: str, value):
    def change(d):
        *parents, last = path.split(".")
        for p in parents:
            d = d[int(p)] if p.isdigit() else d[p]
        d[int(last) if last.isdigit() else last] = value

    return change


@pytest.mark.parametrize(
    "line, field, problem",
    [
        ('{"id": "x", ', "", "not JSON"),
        ("[1, 2]", "", "a row is a JSON object"),
        (_edited(LINES[0], _drop("time_ms")), "time_ms", "missing"),
        (_edited(LINES[0], _set("time_ms", -1)), "time_ms", "not a positive time"),
        (_edited(LINES[0], _set("time_ms", "0.25")), "time_ms", "str, not float"),
        (_edited(LINES[0], _set("gpu", "mi250")), "gpu", "'mi250' is not a device"),
        (_edited(LINES[0], _set("level", "1")), "level", "str, not int"),
        (_edited(LINES[0], _drop("source")), "source", "missing"),
        (_edited(LINES[0], _set("source.repo", 7)), "source: repo", "int, not str"),
        (_edited(LINES[0], _set("graph.nodes.0", {"inputs": []})), "graph.nodes[0].op", "missing"),
        (
            _edited(LINES[1], _set("graph.inputs.0.dtype", "float99")),
            "graph.inputs[0].dtype",
            "'float99' is not a tensor type",
        ),
        (
            _edited(LINES[1], _drop_in("graph.outputs.0", "dtype")),
            "graph.outputs[0].dtype",
            "None is not a tensor type",
        ),
        (
            _edited(LINES[1], _set("graph.initializers.0.shape", [4, "x", None])),
            "graph.initializers[0].shape",
            "not a list of sizes",
        ),
        (_edited(LINES[0], _drop("graph")), "graph", "missing"),
        (
            _edited(LINES[1], _set("graph.initializers.1.values", [1.0, 2.0])),
            "graph.initializers[1].values",
            "2 values for the shape [4]",
        ),
        (
            _edited(LINES[1], _set("graph.nodes.0.attrs.group", None)),
            "graph.nodes[0].attrs.group",
            "not a number, a string or a list",
        ),
        (
            _edited(LINES[1], _set("graph.nodes.0.attrs.pads", {"ints": [1], "floats": []})),
            "graph.nodes[0].attrs.pads",
            "a typed value is one of",
        ),
        (_edited(LINES[0], _set("min_ms", 0.5)), "min_ms", "not a time between 0 and time_ms"),
    ],
)
def test_a_malformed_row_is_refused_in_one_line_naming_file_line_and_field(
    tmp_path, line, field, problem
):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join([LINES[0], LINES[1], line]) + "\n")
    with pytest.raises(InputError) as e:
        M.load(path)
    message = str(e.value)
    assert message.startswith(f"{path}:3: {field}")
    assert problem in message
    assert "\n" not in message


def test_a_missing_path_is_refused():
    with pytest.raises(InputError, match="no such file or folder"):
        M.load(FIXTURE.parent / "absent.jsonl")


@pytest.mark.parametrize("row_id", [json.loads(line)["id"] for line in LINES])
def test_each_row_rebuilds_as_a_checked_model_that_fission_accepts(row_id):
    m = _by_id()[row_id]
    model = M.model(m)
    onnx.checker.check_model(model, full_check=True)
    graph = m.graph
    assert [n.op_type for n in model.graph.node] == [n["op"] for n in graph["nodes"]]
    shapes = {
        i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input
    }
    assert shapes == {i["name"]: i["shape"] for i in graph["inputs"]}
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for t in graph["initializers"]:
        assert inits[t["name"]].shape == tuple(t["shape"])
        assert inits[t["name"]].dtype == np.dtype(t["dtype"])
    fissioned = fission_model(model, None, m.id)
    assert fissioned.nodes


def test_small_values_are_kept_and_large_weights_are_drawn_from_the_seed():
    conv = _by_id()["fixture/a100/compile/conv"]

    def weights(seed):
        return {t.name: numpy_helper.to_array(t) for t in M.model(conv, seed).graph.initializer}

    first, again, other = weights(0), weights(0), weights(1)
    assert first["conv.bias"].tolist() == [0.5, -0.25, 0.0, 1.0]
    assert np.array_equal(first["conv.weight"], again["conv.weight"])
    assert not np.array_equal(first["conv.weight"], other["conv.weight"])
    assert np.all(np.abs(first["conv.weight"]) <= 1.0)


def test_a_batchnorm_variance_is_drawn_positive():
    fused = _by_id()["fixture/l4/eager/fused"]
    for seed in range(5):
        inits = {t.name: numpy_helper.to_array(t) for t in M.model(fused, seed).graph.initializer}
        assert inits["bn.running_var"].min() >= 0.5
        assert inits["bn.running_mean"].min() < 0  # the others span [-1, 1)


def test_a_graph_whose_shapes_disagree_is_refused_in_one_line(tmp_path):
    path = tmp_path / "row.jsonl"
    path.write_text(_edited(LINES[0], _set("graph.inputs.1.shape", [16, 16])) + "\n")
    (m,) = M.load(path)
    with pytest.raises(InputError) as e:
        M.model(m)
    message = str(e.value)
    assert message.startswith("fixture/h100/eager/matmul: the graph does not make a valid ONNX")
    assert "\n" not in message


def _graph(*ops: str, attrs=None) -> dict:
    nodes = [{"op": op, "inputs": [], "outputs": []} for op in ops]
    if attrs:
        nodes[-1]["attrs"] = attrs
    return {"nodes": nodes}


@pytest.mark.parametrize(
    "ops, kind",
    [
        (("MatMul",), "matmul"),
        (("Transpose", "MatMul"), "matmul"),  # A.T @ B
        (("Gemm",), "matmul"),
        (("Conv",), "conv"),
        (("ConvTranspose", "Reshape"), "conv"),
        (("Gemm", "Mul", "Sigmoid"), "fused"),
        (("Conv", "Relu", "Add"), "fused"),
        (("Conv", "Conv"), "fused"),
        (("Gemm", "Relu", "Gemm", "Relu", "Gemm"), "model"),
        (("MatMul", "Div", "Softmax", "MatMul"), "attention"),
        (("Relu",), "elementwise"),
        (("Mul", "Erf", "Add", "Mul"), "elementwise"),  # GELU
        (("Concat",), "elementwise"),
        (("ReduceSum",), "reduction"),
        (("Softmax",), "reduction"),
        (("Sub", "Pow", "ReduceMean"), "reduction"),  # a loss
        (("MaxPool",), "pooling"),
        (("AveragePool", "Relu"), "pooling"),
    ],
)
def test_the_kind_follows_the_ops(ops, kind):
    assert M.kind_of(_graph(*ops)) == kind
    assert kind in M.KINDS


def test_a_batchnorm_is_a_reduction_only_when_it_computes_statistics():
    assert M.kind_of(_graph("BatchNormalization", attrs={"training_mode": 1})) == "reduction"
    assert M.kind_of(_graph("BatchNormalization")) == "elementwise"
