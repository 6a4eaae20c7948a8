"""Inputs bound to values (``--const`` / ``constants=``): a voice-activity
style model whose ``If`` takes its branch from the sample rate, through the
CLI and the API; and the errors a user can cause."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

import orchestrate
from orchestrate import cli
from orchestrate.errors import InputError
from orchestrate.frontend import onnxrt
from orchestrate.frontend.constants import bind_constants


def branch(name: str, op: str, value: float) -> onnx.GraphProto:
    k = helper.make_tensor(f"{name}_k", onnx.TensorProto.FLOAT, [], [value])
    return helper.make_graph(
        [helper.make_node(op, ["x", f"{name}_k"], [f"{name}_y"])],
        name,
        [],
        [helper.make_tensor_value_info(f"{name}_y", onnx.TensorProto.FLOAT, [2, 8])],
        initializer=[k],
    )


def sample_rate_model() -> onnx.ModelProto:
    """``y = tanh(x) * 2`` at 16 kHz, ``tanh(x) + 1`` otherwise: the branch
    hangs on the int64 scalar input ``sr``."""
    nodes = [
        helper.make_node("Constant", [], ["khz16"], value=helper.make_tensor("", 7, [], [16000])),
        helper.make_node("Equal", ["sr", "khz16"], ["is16"]),
        helper.make_node(
            "If",
            ["is16"],
            ["branched"],
            name="by_rate",
            then_branch=branch("then", "Mul", 2.0),
            else_branch=branch("else", "Add", 1.0),
        ),
        helper.make_node("Tanh", ["branched"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "vad",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8]),
            helper.make_tensor_value_info("sr", onnx.TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "vad.onnx"
    onnx.save(sample_rate_model(), path)
    return path


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


@pytest.mark.parametrize("rate, scale", [(16000, 2.0), (8000, None)])
def test_an_if_on_a_bound_scalar_takes_its_branch(tmp_path, model_file, rate, scale):
    out = tmp_path / f"vad{rate}.orch"
    r = invoke("optimize", model_file, "-o", out, "--const", f"sr={rate}", "--trials", 2)
    assert r.exit_code == 0, r.output
    bundle = orchestrate.load(out)
    assert list(bundle.inputs) == ["x"]
    assert json.loads((out / "manifest.json").read_text())["bound_inputs"] == {"sr": rate}
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    want = onnxrt.run(sample_rate_model(), {"x": x, "sr": np.array(rate, dtype=np.int64)})["y"]
    got = bundle.run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    expected = np.tanh(x * 2.0) if scale else np.tanh(x + 1.0)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # verify binds the model as the bundle records it
    r = invoke("verify", out, "--model", model_file)
    assert r.exit_code == 0, r.output


def test_the_api_takes_constants(tmp_path, model_file):
    result = orchestrate.optimize(
        model_file, tmp_path / "vad.orch", constants={"sr": 16000}, trials=1
    )
    assert result.report.ok
    assert list(orchestrate.load(result.path).inputs) == ["x"]


def test_an_if_left_on_an_input_asks_for_const(tmp_path, model_file):
    r = invoke("optimize", model_file, "-o", tmp_path / "v.orch")
    assert r.exit_code == 2
    line = r.output.strip()
    assert "\n" not in line
    assert "'by_rate'" in line and "--const sr=VALUE" in line, line
    assert not (tmp_path / "v.orch").exists()


@pytest.mark.parametrize(
    "flag, message",
    [
        ("rate=16000", "has no input 'rate' (its inputs: sr, x)"),
        ("sr=16k", "not a value of input 'sr' (int64)"),
        ("sr=1.5", "not a value of input 'sr' (int64)"),
        ("sr=1,2", "input 'sr' is a scalar, got 2 values"),
        ("sr", "expected NAME=VALUE"),
    ],
)
def test_bad_constants_are_one_line_naming_the_flag(tmp_path, model_file, flag, message):
    r = invoke("optimize", model_file, "-o", tmp_path / "v.orch", "--const", flag)
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert "\n" not in line and "--const" in line and message in line, line
    assert not (tmp_path / "v.orch").exists()


def test_a_list_binds_a_one_dimensional_input():
    vi = helper.make_tensor_value_info("ids", onnx.TensorProto.INT32, ["n"])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["ids"], ["out"])],
        "g",
        [vi],
        [helper.make_tensor_value_info("out", onnx.TensorProto.INT32, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    bound = bind_constants(model, {"ids": ["3", "1", "2"]}, "m.onnx", "--const")
    assert not list(bound.graph.input)
    (init,) = bound.graph.initializer
    assert onnx.numpy_helper.to_array(init).tolist() == [3, 1, 2]
    assert len(model.graph.input) == 1  # the original is left alone
    with pytest.raises(InputError, match="--const ids: not a value of input 'ids' \\(int32\\)"):
        bind_constants(model, {"ids": ["x"]}, "m.onnx", "--const")


@pytest.mark.parametrize("value", ["16000", {"x": 1}, [1, "2"]])
def test_a_bundle_whose_bound_values_are_not_numbers_is_refused(tmp_path, model_file, value):
    out = tmp_path / "vad.orch"
    assert invoke("optimize", model_file, "-o", out, "--const", "sr=16000").exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["bound_inputs"] = {"sr": value}
    (out / "manifest.json").write_text(json.dumps(manifest))
    r = invoke("verify", out, "--model", model_file)
    assert r.exit_code == 2
    assert "manifest.json field 'bound_inputs' must be an object of input name -> value" in r.output


@pytest.mark.parametrize("flag", [["--const", "nope=1"], ["--input-range", "nope=0..1"]])
def test_a_hostile_input_name_stays_on_one_line_in_the_refusal(tmp_path, flag):
    bad = "x\nrm -rf /\x1b[31m"
    graph = helper.make_graph(
        [helper.make_node("Relu", [bad], ["y"])],
        "g",
        [helper.make_tensor_value_info(bad, onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    src = tmp_path / "hostile.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    r = invoke("optimize", src, "-o", tmp_path / "h.orch", *flag)
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and "\x1b" not in r.output
    assert "its inputs: x\\nrm -rf /\\x1b[31m" in r.output
