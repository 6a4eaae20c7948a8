"""Cases of issue 9 that once ended in "internal error", a traceback or a
misleading message: each is now one line naming the option, tensor, node or
file, with exit code 2 (or, for a model that is fine, a verified bundle)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import orchestrate
from orchestrate import ir
from orchestrate.explain.summary import format_inspection
from orchestrate.frontend import onnxrt
from tests.test_cli import assert_user_error, invoke


def _save(path, nodes, inputs, outputs, opset=17, ir_version=8):
    g = helper.make_graph(nodes, "m", inputs, [onnx.ValueInfoProto(name=o) for o in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    onnx.save(onnx.shape_inference.infer_shapes(m), path)
    return path


def _relu(path, dims=("N", 4), opset=17):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))
    return _save(
        path,
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [x],
        ["y"],
        opset,
        ir_version=10 if opset > 21 else 8,
    )


def _outer(path):
    """y = sum(a * b) for a of shape (N, 1) and b of shape (1, M): an (N, M)
    intermediate, reduced to a scalar."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 1])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, "M"])
    nodes = [
        helper.make_node("Mul", ["a", "b"], ["t"], name="outer"),
        helper.make_node("ReduceSum", ["t"], ["y"], name="total", keepdims=0),
    ]
    return _save(path, nodes, [a, b], ["y"])


# -- shapes that overflow, or need absurd memory ----------------------------------------


@pytest.mark.parametrize("command", ["inspect", "decompose", "plan", "optimize"])
@pytest.mark.parametrize(
    "shape, needles",
    [
        ("x=100000000000000x4", ["--shape x=100000000000000x4", "400,000,000,000,000 elements"]),
        ("x=100000000000000000000x4", ["--shape x=100000000000000000000x4", "elements"]),
        ("x=-1x4", ["--shape x=-1x4", "dimension 0 is -1"]),
        ("x=2xx4", ["--shape 'x=2xx4'", "NAME=DIMS"]),
    ],
)
def test_absurd_shapes_are_one_line(tmp_path, command, shape, needles):
    src = _relu(tmp_path / "m.onnx")
    out = {
        "inspect": [],
        "decompose": ["-o", tmp_path / "p.onnx"],
        "plan": ["-o", tmp_path / "p.json"],
        "optimize": ["-o", tmp_path / "m.orch"],
    }[command]
    assert_user_error(invoke(command, src, "--shape", shape, *out), *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("command", ["plan", "optimize"])
def test_an_empty_tensor_is_decomposed_but_not_planned(tmp_path, command):
    """A zero dimension is valid ONNX (inspect and decompose take it), but no
    kernel template loops over nothing: planning refuses it naming the node."""
    src = _relu(tmp_path / "m.onnx")
    assert invoke("inspect", src, "--shape", "x=0x4").exit_code == 0
    assert invoke("decompose", src, "--shape", "x=0x4", "-o", tmp_path / "p.onnx").exit_code == 0
    out = tmp_path / ("p.json" if command == "plan" else "m.orch")
    r = invoke(command, src, "--shape", "x=0x4", "-o", out)
    assert r.exit_code == 2 and "Traceback" not in r.output
    errors = [line for line in r.output.splitlines() if line.startswith("orchestrate:")]
    assert len(errors) == 1, r.output  # after the planner's progress lines
    for needle in ("relu", "has no elements (shape [0, 4])", "empty tensors are not supported"):
        assert needle in errors[0]
    assert not out.exists()


def test_an_intermediate_of_1e12_elements_is_planned_only_where_never_written(tmp_path):
    """The (10**6, 10**6) product is an intermediate: reduced in the kernel
    that makes it, it is never held in memory, and the plan stands; made a
    graph output, it would be held, and is refused where it is made, by name."""
    src = _outer(tmp_path / "outer.onnx")
    shape = ["--shape", "a=1000000x1", "--shape", "b=1x1000000"]
    r = invoke("plan", src, "-o", tmp_path / "p.json", *shape)
    assert r.exit_code == 0, r.output
    plan = json.loads((tmp_path / "p.json").read_text())
    written = {t for k in plan["kernels"] for t in k["outputs"]}
    assert written == {"y"}  # one kernel: the product and its sum, on chip
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 1])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, "M"])
    held = _save(
        tmp_path / "held.onnx",
        [helper.make_node("Mul", ["a", "b"], ["t"], name="outer")],
        [a, b],
        ["t"],
    )
    r = invoke("plan", held, "-o", tmp_path / "q.json", *shape)
    assert_user_error(r, "held.onnx", "'t'", "1000000x1000000", "1,000,000,000,000 elements")
    # a reduction whose input is given that large: the option is named
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M"])
    red = _save(
        tmp_path / "red.onnx", [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)], [x], ["y"]
    )
    r = invoke("inspect", red, "--shape", "x=1000000x1000000")
    assert_user_error(r, "--shape x=1000000x1000000", "1,000,000,000,000 elements")


def test_scores_larger_than_any_tensor_in_memory_plan_only_as_attention(tmp_path):
    """An Attention node's scores (q_len x kv_len) exist only after fission:
    9e10 of them, more than a tensor in memory may hold.  The flash kernel
    keeps them on chip (tests/plan/test_large_tensors.py: where no kernel
    can, planning names the tensor it would have to write)."""
    q = helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 1, 300000, 4])
    src = _save(
        tmp_path / "attn.onnx",
        [helper.make_node("Attention", ["q", "q", "q"], ["y"], name="attn")],
        [q],
        ["y"],
        opset=23,
        ir_version=10,
    )
    assert invoke("inspect", src).exit_code == 0
    r = invoke("plan", src, "-o", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    plan = json.loads((tmp_path / "p.json").read_text())
    assert "attention" in {k["template"] for k in plan["kernels"]}
    scores = [p for p in plan["primitives"] if p["shape"] == [1, 1, 300000, 300000]]
    assert scores and all(math.prod(p["shape"]) > ir.MAX_ELEMENTS for p in scores)
    written = {t for k in plan["kernels"] for t in k["outputs"]}
    assert not written & {p["name"] for p in scores}


def test_inspect_columns_never_run_together(tmp_path):
    """A 40 GB intermediate: every row of both tables keeps its columns apart."""
    src = _outer(tmp_path / "outer.onnx")
    r = invoke("inspect", src, "--shape", "a=100000x1", "--shape", "b=1x100000")
    assert r.exit_code == 0, r.output
    assert "40.00 GB" in r.output
    _assert_columns_apart(r.output)
    # the petabytes `--shape x=100000000000000x4` once printed as "11600000000.00 MB"
    info = json.loads(
        invoke("inspect", src, "--shape", "a=100000x1", "--shape", "b=1x100000", "--json").output
    )
    info["primitive_bytes"] = {k: v * 40000 for k, v in info["primitive_bytes"].items()}
    info["intermediate_bytes"] *= 40000
    text = format_inspection(info)
    assert "1600.00 TB" in text
    _assert_columns_apart(text)


def _assert_columns_apart(text: str) -> None:
    lines = text.splitlines()
    table = lines[lines.index(next(x for x in lines if x.startswith("ONNX op"))) :]
    rows = [x for x in table if x and not x.startswith(("largest", "constants"))]
    assert len(rows) == 8, rows
    for row in rows:
        cells = re.split(r"\s{2,}", row)
        assert len(cells) in (2, 3), row
        assert cells[1].isdigit() or cells[1] == "count", row


# -- opsets newer than onnxruntime or onnx ------------------------------------------------


def test_an_opset_newer_than_onnxruntime_is_converted_down(tmp_path, monkeypatch):
    """onnx 1.23 stamps opset 28; onnxruntime 1.31 runs up to 26.  The
    version converter brings such a model down first, so it optimizes and
    verifies; one it cannot convert is refused up front, saying why."""
    newest = onnxrt.max_opset()
    if newest >= onnx.defs.onnx_opset_version():
        pytest.skip("the installed onnxruntime supports every opset onnx knows")
    assert onnxrt.supports_opset(newest) and not onnxrt.supports_opset(newest + 1)
    src = _relu(tmp_path / "new.onnx", dims=(2, 4), opset=newest + 1)
    r = invoke("optimize", src, "-o", tmp_path / "m.orch", "--trials", 1)
    assert r.exit_code == 0 and "verified against the float64 reference" in r.output, r.output
    model = onnx.load(src)
    assert model.opset_import[0].version == newest + 1  # the file is left as it was
    prim = orchestrate.decompose(model, shapes={"x": (2, 4)})
    assert prim.graph.node and model.opset_import[0].version == newest + 1

    from onnx import version_converter

    def cannot(model, target):
        raise RuntimeError("No Adapter For Relu")

    monkeypatch.setattr(version_converter, "convert_version", cannot)
    import onnxruntime

    for args in (
        ["inspect", src],
        ["plan", src, "-o", tmp_path / "p.json"],
        ["optimize", src, "-o", tmp_path / "n.orch"],
    ):
        assert_user_error(
            invoke(*args),
            "new.onnx",
            f"opset {newest + 1}",
            f"onnxruntime {onnxruntime.__version__}",
            f"(opset {newest})",
            "cannot bring it down (No Adapter For Relu)",
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.orch", "new.onnx"]


def test_an_opset_newer_than_onnx_is_refused(tmp_path):
    newest = onnx.defs.onnx_opset_version()
    src = _relu(tmp_path / "new.onnx", dims=(2, 4), opset=newest + 1)
    assert_user_error(
        invoke("inspect", src),
        "new.onnx",
        f"opset {newest + 1}",
        f"onnx {onnx.__version__}",
        f"(opset {newest})",
    )


# -- integer division -----------------------------------------------------------------------


def test_an_integer_div_model_optimizes_and_verifies(tmp_path):
    """Random integer divisors once included 0, which onnxruntime refuses."""
    a = helper.make_tensor_value_info("a", TensorProto.INT32, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.INT32, [2, 3])
    nodes = [
        helper.make_node("Div", ["a", "b"], ["q"], name="div"),
        helper.make_node("Mod", ["a", "b"], ["r"], name="mod"),
    ]
    src = _save(tmp_path / "idiv.onnx", nodes, [a, b], ["q", "r"])
    out = tmp_path / "idiv.orch"
    r = invoke("optimize", src, "-o", out, "--trials", 2)
    assert r.exit_code == 0, r.output
    r = invoke("verify", out, "--model", src)
    assert r.exit_code == 0 and "OK: 2 outputs match" in r.output, r.output


def test_divisor_inputs_are_never_zero():
    from orchestrate.check.verify import divisors, random_inputs
    from orchestrate.plan.pipeline import fission_model

    a = helper.make_tensor_value_info("a", TensorProto.INT64, [64])
    b = helper.make_tensor_value_info("b", TensorProto.INT32, [64])
    nodes = [
        helper.make_node("Cast", ["b"], ["c"], to=TensorProto.INT64),
        helper.make_node("Div", ["a", "c"], ["y"]),
    ]
    g = helper.make_graph(nodes, "m", [a, b], [onnx.ValueInfoProto(name="y")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    graph = fission_model(onnx.shape_inference.infer_shapes(m), None, "m")
    assert divisors(graph) == {"b"}
    for seed in range(5):
        feeds = random_inputs(graph, seed)
        assert np.all(feeds["b"] != 0) and set(np.unique(feeds["a"])) <= {0, 1}


# -- verify against a model of other shapes -------------------------------------------------


@pytest.fixture(scope="module")
def relu_bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("relu")
    src = _relu(tmp / "m.onnx")
    out = tmp / "m.orch"
    r = invoke("optimize", src, "-o", out, "--shape", "x=2x4", "--trials", 1)
    assert r.exit_code == 0, r.output
    return src, out


def test_verify_names_the_input_whose_shape_differs(relu_bundle):
    src, out = relu_bundle
    r = invoke("verify", out, "--model", src, "--shape", "x=3x4")
    assert_user_error(r, "input 'x' is float32[3x4] in the model but float32[2x4] in the bundle")
    assert "names" not in r.output
    r = invoke("bench", out, "--model", src, "--shape", "x=3x4")
    assert_user_error(r, "input 'x' is float32[3x4]")
    r = invoke("verify", out, "--model", src, "--shape", "q=3x4")
    assert_user_error(r, "--shape q=...", "no input 'q'")
    assert invoke("verify", out, "--model", src, "--trials", 1).exit_code == 0


# -- plan options and tolerances, one line each ---------------------------------------------


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--time-limit", "nan"], ["--time-limit nan", "finite"]),
        (["--time-limit", "inf"], ["--time-limit inf"]),
        (["--time-limit", "-1"], ["--time-limit -1.0"]),
        (["--memory-budget", "-1"], ["--memory-budget -1", ">= 0"]),
        (["--rtol", "-0.1"], ["--rtol -0.1", ">= 0"]),
        (["--rtol", "nan"], ["--rtol nan"]),
        (["--atol", "nan"], ["--atol nan"]),
        (["--atol", "inf"], ["--atol inf"]),
    ],
)
def test_bad_plan_and_tolerance_options_are_one_line(tmp_path, args, needles):
    src = _relu(tmp_path / "m.onnx")
    r = invoke("optimize", src, "-o", tmp_path / "m.orch", "--shape", "x=2x4", *args)
    assert_user_error(r, *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize(
    "args, needle", [(["--rtol", "-1"], "--rtol -1.0"), (["--atol", "nan"], "--atol nan")]
)
def test_verify_refuses_bad_tolerances(relu_bundle, args, needle):
    src, out = relu_bundle
    assert_user_error(invoke("verify", out, "--model", src, *args), needle)
