"""The command line: decompose / inspect, and every bad input a user can cause."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

from orchestrate import cli
from orchestrate.frontend import onnxrt
from tests.util import elem, op_counts


def _model(dims=(2, 8), with_weight=False, ops=("Softmax",)) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", elem("float32"), list(dims))
    nodes, prev = [], "x"
    for k, op in enumerate(ops):
        out = "y" if k == len(ops) - 1 else f"t{k}"
        nodes.append(helper.make_node(op, [prev], [out], name=f"{op.lower()}_{k}"))
        prev = out
    inits = []
    if with_weight:
        inits = [numpy_helper.from_array(np.ones((8, 8), np.float32), "w")]
        nodes.append(helper.make_node("MatMul", ["y", "w"], ["z"], name="mm"))
    outs = [onnx.ValueInfoProto(name="z" if with_weight else "y")]
    g = helper.make_graph(nodes, "m", [x], outs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def assert_user_error(result, *needles):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    for n in needles:
        assert n in result.output, result.output


def test_decompose_writes_a_primitive_model_that_runs(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "m.prim.onnx"
    onnx.save(_model(), src)
    r = invoke("decompose", src, "-o", out)
    assert r.exit_code == 0, r.output
    prim = onnx.load(out)
    assert sorted(op_counts(prim)) == ["Div", "Exp", "ReduceMax", "ReduceSum", "Sub"]
    assert [i.name for i in prim.graph.input] == ["x"]
    assert [o.name for o in prim.graph.output] == ["y"]
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    want = onnxrt.run(_model(), {"x": x})["y"]
    np.testing.assert_allclose(onnxrt.run(prim, {"x": x})["y"], want, rtol=1e-6)


def test_inspect_counts_before_and_after(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_model(ops=("Softmax", "Relu")), src)
    r = invoke("inspect", src)
    assert r.exit_code == 0, r.output
    assert "Softmax" in r.output and "reduce_max" in r.output
    r = invoke("inspect", src, "--json")
    import json

    info = json.loads(r.output)
    assert info["onnx_ops"] == {"Relu": 1, "Softmax": 1}
    assert info["primitive_ops"] == {
        "max": 1,
        "div": 1,
        "exp": 1,
        "reduce_max": 1,
        "sub": 1,
        "sum": 1,
    }
    # sub, exp, div, max write (2, 8) float32; reduce_max and sum write (2, 1)
    assert info["intermediate_bytes"] == 4 * (2 * 8 * 4) + 2 * (2 * 1 * 4)


def test_not_onnx(tmp_path):
    src, out = tmp_path / "notes.onnx", tmp_path / "o.onnx"
    src.write_text("this is not a model\n")
    assert_user_error(invoke("decompose", src, "-o", out), "notes.onnx", "not a valid ONNX")
    assert not out.exists()


def test_truncated(tmp_path):
    src, out = tmp_path / "cut.onnx", tmp_path / "o.onnx"
    data = _model(with_weight=True).SerializeToString()
    src.write_bytes(data[: len(data) // 2])
    assert_user_error(invoke("decompose", src, "-o", out), "cut.onnx")
    assert not out.exists()


def test_missing_file(tmp_path):
    assert_user_error(invoke("inspect", tmp_path / "nope.onnx"), "nope.onnx", "no such file")


def test_unsupported_ops_are_listed_together_with_counts(tmp_path):
    x = helper.make_tensor_value_info("x", elem("float32"), [4])
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["v1", "i1"], name="top1"),
        helper.make_node("TopK", ["v1", "k"], ["v2", "i2"], name="top2"),
        helper.make_node("NonZero", ["v2"], ["nz"], name="nz"),
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
    ]
    g = helper.make_graph(
        nodes,
        "m",
        [x],
        [onnx.ValueInfoProto(name="nz"), onnx.ValueInfoProto(name="r")],
        initializer=[k],
    )
    m = onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    )
    src, out = tmp_path / "topk.onnx", tmp_path / "o.onnx"
    onnx.save(m, src)
    r = invoke("decompose", src, "-o", out)
    assert_user_error(r, "topk.onnx", "NonZero (x1)", "TopK (x2)")
    assert not out.exists()


def test_dynamic_dimension_needs_shape(tmp_path):
    src, out = tmp_path / "dyn.onnx", tmp_path / "o.onnx"
    onnx.save(_model(dims=("batch", 8)), src)
    r = invoke("decompose", src, "-o", out)
    assert_user_error(r, "dyn.onnx", "'x'", "'batch'", "--shape x=Nx8")
    assert not out.exists()
    r = invoke("decompose", src, "-o", out, "--shape", "x=3x8")
    assert r.exit_code == 0, r.output
    assert [d.dim_value for d in onnx.load(out).graph.input[0].type.tensor_type.shape.dim] == [3, 8]


@pytest.mark.parametrize(
    "shape, needles",
    [
        ("q=1x8", ["--shape q=", "no input 'q'"]),
        ("x=1x2x3", ["rank 2"]),
        ("x=3x9", ["axis 1", "fixed at 8"]),
        ("x=oops", ["--shape", "NAME=DIMS"]),
    ],
)
def test_bad_shape_option(tmp_path, shape, needles):
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_model(dims=("batch", 8)), src)
    r = invoke("decompose", src, "-o", out, "--shape", shape)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    for n in needles:
        assert n in r.output, r.output
    assert not out.exists()


def test_external_data_outside_the_folder_is_refused(tmp_path):
    m = _model(with_weight=True)
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.ones(64, np.float32).tobytes())
    w = next(t for t in m.graph.initializer if t.name == "w")
    w.ClearField("float_data")
    w.ClearField("raw_data")
    w.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "../secret.bin"), ("offset", "0"), ("length", "256")):
        e = w.external_data.add()
        e.key, e.value = key, value
    src, out = folder / "m.onnx", tmp_path / "o.onnx"
    src.write_bytes(m.SerializeToString())
    r = invoke("decompose", src, "-o", out)
    assert_user_error(r, "m.onnx", "'w'", "outside the model's folder")
    assert not out.exists()


def test_external_data_inside_the_folder_loads(tmp_path):
    m = _model(with_weight=True)
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save(m, folder / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0)
    r = invoke("decompose", folder / "m.onnx", "-o", tmp_path / "o.onnx")
    assert r.exit_code == 0, r.output


def test_output_folder_missing(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    r = invoke("decompose", src, "-o", tmp_path / "no" / "where.onnx")
    assert_user_error(r, "does not exist")
