"""--dtype fp16: an fp32 model run in half precision (orchestrate/ir/precision.py).

The lowered primitive graph holds fp16 tensors where autocast would (matmul
and conv operands, their outputs, elementwise chains after them) and fp32
where it keeps fp32 (sums, softmax, normalisation); the model's interface is
unchanged; bundles verify against onnxruntime at the fp16 tolerance."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import orchestrate
from examples import export_example
from orchestrate import bundle
from orchestrate.check.verify import random_inputs
from orchestrate.errors import InputError
from orchestrate.ir import Op, precision, reference, type_rules
from orchestrate.plan import pipeline
from tests.test_cli import assert_user_error, invoke
from tests.util import elem


def _block(rows=8, hidden=16, weight_scale=0.3, eps=1e-12) -> onnx.ModelProto:
    """x @ w + b -> LayerNorm -> Softmax -> @ w2, made with onnx.helper."""
    rng = np.random.default_rng(0)
    inits = {
        "w": (rng.standard_normal((hidden, hidden)) * weight_scale).astype(np.float32),
        "b": rng.standard_normal(hidden).astype(np.float32),
        "gamma": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
        "beta": (0.1 * rng.standard_normal(hidden)).astype(np.float32),
        "w2": (rng.standard_normal((hidden, hidden)) * 0.3).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
        helper.make_node(
            "LayerNormalization", ["hb", "gamma", "beta"], ["n"], name="ln", axis=-1, epsilon=eps
        ),
        helper.make_node("Softmax", ["n"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "w2"], ["y"], name="mm2"),
    ]
    g = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", elem("float32"), [rows, hidden])],
        [helper.make_tensor_value_info("y", elem("float32"), [rows, hidden])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def _lowered(path: str):
    graph = pipeline.fission_file(path)
    return graph, precision.lower_precision(graph, "fp16", path)


def test_block_is_lowered_as_autocast_would(tmp_path):
    graph, low = _lowered(_save(_block(), tmp_path / "m.onnx"))
    type_rules.validate(low)
    types = low.types
    # the interface is the model's
    assert [(i.name, i.type) for i in low.inputs] == [(i.name, i.type) for i in graph.inputs]
    assert low.outputs == graph.outputs
    assert types["y"].dtype == "float32" and low.producer["y"].op is Op.CAST
    # matmuls: fp16 operands, fp16 result; their weights stored in fp16
    for mm in (n for n in low.nodes if n.op is Op.MATMUL):
        assert [types[i].dtype for i in mm.inputs] == ["float16", "float16"], mm
        assert mm.dtype == "float16"
    assert low.constants["w"].dtype == np.float16
    # every sum (mean, variance, softmax denominator) and max is fp32
    reductions = [n for n in low.nodes if n.op in (Op.SUM, Op.RMAX)]
    assert len(reductions) == 4 and all(n.dtype == "float32" for n in reductions)
    # the LayerNorm epsilon (1e-12 is 0 in fp16) stays fp32
    assert any(a.dtype == np.float32 and 0 < a.max() < 1e-11 for a in low.constants.values())
    # upcast once at the chain's start: one cast to fp32 (the bias add) and one
    # to fp16 (the probabilities) besides the output's
    casts = Counter(n.attrs["to"] for n in low.nodes if n.op is Op.CAST)
    assert casts == Counter({"float16": 2, "float32": 2}), casts
    feeds = random_inputs(graph, 0)
    want = reference.run(graph, feeds, float64=True)["y"]
    got = reference.run(low, feeds)["y"]
    assert got.dtype == np.float32
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()


def test_fp32_and_the_default_change_nothing(tmp_path):
    graph = pipeline.fission_file(_save(_block(), tmp_path / "m.onnx"))
    assert precision.lower_precision(graph, None) is graph
    assert precision.lower_precision(graph, "fp32") is graph


def test_fp16_model_refuses_fp32(tmp_path):
    graph, low = _lowered(_save(_block(), tmp_path / "m.onnx"))
    # a model whose every float is fp16 (the lowered graph without its interface casts)
    half = pipeline.fission_file(_save(_half_model(), tmp_path / "h.onnx"))
    assert precision.model_dtype(half) == "float16"
    with pytest.raises(InputError, match="dtype='fp32': the model computes in float16"):
        precision.lower_precision(half, "fp32", "h.onnx")
    assert precision.lower_precision(half, "fp16") is half


def _half_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", elem("float16"), [4, 8])
    y = helper.make_tensor_value_info("y", elem("float16"), [4, 8])
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "h", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_a_weight_beyond_fp16_is_refused_by_name(tmp_path):
    path = _save(_block(weight_scale=1e5), tmp_path / "m.onnx")
    graph = pipeline.fission_file(path)
    with pytest.raises(InputError, match=r"weight 'w' read by matmul .* beyond float16's range"):
        precision.lower_precision(graph, "fp16", path)


def test_a_large_constant_outside_a_matmul_stays_fp32(tmp_path):
    x = helper.make_tensor_value_info("x", elem("float32"), [4, 8])
    y = helper.make_tensor_value_info("y", elem("float32"), [4, 8])
    big = numpy_helper.from_array(np.full((8,), 1e6, np.float32), "big")
    w = numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Sub", ["h", "big"], ["y"]),
    ]
    m = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], initializer=[big, w]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    m.ir_version = 8
    graph, low = _lowered(_save(m, tmp_path / "m.onnx"))
    assert low.constants["big"].dtype == np.float32 and low.constants["w"].dtype == np.float16
    sub = next(n for n in low.nodes if n.op is Op.SUB)
    assert sub.dtype == "float32"
    feeds = random_inputs(graph, 0)
    np.testing.assert_allclose(reference.run(low, feeds)["y"], feeds["x"] - 1e6, rtol=1e-6)


def test_bad_dtype_is_a_one_line_error(tmp_path):
    path = _save(_block(), tmp_path / "m.onnx")
    out = tmp_path / "out.orch"
    for value in ("fp8", "bfloat16", "BF16"):
        r = invoke("optimize", path, "-o", out, "--dtype", value)
        assert_user_error(r, f"--dtype {value}", "expected fp16, bf16 or fp32")
        assert len(r.output.strip().splitlines()) == 1, r.output
        assert not out.exists()
    assert_user_error(invoke("inspect", path, "--dtype", "fp8"), "--dtype fp8")
    with pytest.raises(InputError, match="dtype='fp64'"):
        orchestrate.optimize(path, out, dtype="fp64")
    half = _save(_half_model(), tmp_path / "h.onnx")
    r = invoke("optimize", half, "-o", out, "--dtype", "fp32")
    assert_user_error(r, "--dtype fp32", "the model computes in float16")
    assert not out.exists()


def test_block_bundle_through_the_cli(tmp_path):
    path = _save(_block(), tmp_path / "m.onnx")
    out = tmp_path / "out.orch"
    r = invoke("optimize", path, "-o", out, "--dtype", "fp16", "--device", "h200")
    assert r.exit_code == 0, r.output
    assert "precision: fp16, fp32 accumulation" in r.output
    plan = json.loads((out / "plan.json").read_text())
    assert plan["options"]["dtype"] == "fp16"
    assert plan["graph"]["input_types"] == [{"name": "x", "shape": [8, 16], "dtype": "float32"}]
    dtypes = {p["name"]: p["dtype"] for p in plan["primitives"]}
    assert dtypes["y"] == "float32" and "float16" in dtypes.values()
    assert "precision: fp16" in invoke("explain", out / "plan.json").output
    # verify reads the bundle's precision for its tolerance
    r = invoke("verify", out, "--model", path)
    assert r.exit_code == 0, r.output
    loaded = orchestrate.load(out)
    got = loaded.run(random_inputs(pipeline.fission_file(path), 1))["y"]
    assert got.dtype == np.float32


@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_examples_verify_at_fp16(tmp_path, name):
    src = tmp_path / f"{name}.onnx"
    export_example(name, src, dynamo=False, opset=17, size="tiny")
    out = tmp_path / "out.orch"
    result = orchestrate.optimize(src, out, dtype="fp16", device="h200")
    assert result.report.ok
    # the half error is there, and within the fp16 tolerance by a wide margin
    worst = max(c.rel for c in result.report.checks)
    assert 1e-5 < worst < precision.RTOL["fp16"] / 5, worst
    assert result.plan.options.dtype == "fp16"
    types = result.plan.types
    types.update({k: (v.shape, v.dtype.name) for k, v in bundle.read(out).constants.items()})
    anchors = [p for p in result.plan.primitives if p.op in ("matmul", "conv")]
    assert anchors and all(types[i][1] == "float16" for p in anchors for i in p.inputs)
    sums = [p for p in result.plan.primitives if p.op == "sum"]
    assert sums and all(p.dtype == "float32" for p in sums)
    if name == "bert":  # the softmax stays one pattern: attention kernels are planned
        assert any(k.template == "attention" for k in result.plan.kernels)


def test_a_slice_of_an_input_is_cast_after_it_selects():
    """The rows a slice of a graph input selects are cast, not the whole
    input (a decode step reads the first rows of a cache buffer): the slice
    reads the fp32 input, one cast to fp16 follows it, and the values are
    the fp32 graph's within fp16's rounding."""
    from tests import graphs

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8)).astype(np.float32)

    def fn(b, x):
        rows = b.slice_axis(x, 0, 0, 2)
        return b.matmul(rows, b.constant(w))

    graph = graphs.build(fn, [(64, 8)])
    low = precision.lower_precision(graph, "fp16")
    [cut] = [n for n in low.nodes if n.op is Op.SLICE]
    assert cut.inputs == ("x0",) and cut.dtype == "float32" and cut.shape == (2, 8)
    [cast] = [n for n in low.nodes if n.op is Op.CAST and n.attrs["to"] == "float16"]
    assert cast.inputs == (cut.name,)
    feeds = {"x0": rng.standard_normal((64, 8)).astype(np.float32)}
    want = reference.run(graph, feeds)[graph.outputs[0]]
    got = reference.run(low, feeds)[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
