"""--dtype bf16: an fp32 model run in bfloat16 (orchestrate/ir/precision.py).

bf16 follows fp16's autocast rules exactly (matmul and conv operands and
weights in bf16, fp32 accumulation, sums, softmax and normalisation in fp32).
A CPU cannot run the bf16 matmul kernels (Triton's interpreter multiplies
bf16 tiles as integers), so here: the plans (every dtype), the bundle (bf16
weights as uint16 bit patterns), optimize's simulated check and its refusal
to call that verified, and a native bf16 model's elementwise kernels, which
the interpreter can run.  tests/check/test_compile_check.py compiles bf16 bundles
for sm_90; the `gpu` test at the end checks the numbers on a GPU."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import orchestrate
from orchestrate import bundle
from orchestrate.check.verify import compare, random_inputs
from orchestrate.errors import InputError, OrchestrateError
from orchestrate.explain import precision_text
from orchestrate.frontend import onnxrt
from orchestrate.ir import BFLOAT16, Op, precision, reference, type_rules
from orchestrate.plan import pipeline
from orchestrate.plan.planner import PlanOptions
from orchestrate.run.runtime import gpu_available, interpreter_refusal
from tests.emit_util import run_plan
from tests.ir.test_precision import _block, _half_model, _save
from tests.test_cli import assert_user_error, invoke

TINY_BERT = str(Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny_bert.onnx")
HALF = {"fp16": "float16", "bf16": "bfloat16"}


def conv_model() -> onnx.ModelProto:
    """Conv + bias -> Relu -> MaxPool -> AveragePool, 8 -> 16 channels on 16x16."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((0.2 * rng.standard_normal(s)).astype(np.float32), n)
        for n, s in (("w", (16, 8, 3, 3)), ("b", (16,)))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["p"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    g = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 4, 4])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _shape(graph) -> list[tuple]:
    """Each node's op, dtype and cast target: the lowering's decisions, free of names."""
    return [(n.op, n.dtype, n.attrs.get("to")) for n in graph.nodes]


@pytest.mark.parametrize("model", ["block", "tiny_bert", "conv"])
def test_bf16_lowers_as_fp16_does(tmp_path, model):
    """Node for node the fp16 graph, bfloat16 wherever it has float16: the
    same autocast rules (no constant here is beyond fp16's range)."""
    path = {
        "block": lambda: _save(_block(), tmp_path / "m.onnx"),
        "tiny_bert": lambda: TINY_BERT,
        "conv": lambda: _save(conv_model(), tmp_path / "c.onnx"),
    }[model]()
    graph = pipeline.fission_file(path)
    f16 = precision.lower_precision(graph, "fp16", path)
    b16 = type_rules.validate(precision.lower_precision(graph, "bf16", path))
    as_bf16 = {"float16": "bfloat16"}
    assert _shape(b16) == [(op, as_bf16.get(d, d), as_bf16.get(t, t)) for op, d, t in _shape(f16)]
    assert Counter(a.dtype.name for a in b16.constants.values()) == Counter(
        as_bf16.get(a.dtype.name, a.dtype.name) for a in f16.constants.values()
    )
    assert [(i.name, i.type) for i in b16.inputs] == [(i.name, i.type) for i in graph.inputs]
    assert [b16.types[o] for o in b16.outputs] == [graph.types[o] for o in graph.outputs]
    types = b16.types
    anchors = [n for n in b16.nodes if n.op in (Op.MATMUL, Op.CONV)]
    assert anchors and all(types[i].dtype == "bfloat16" for n in anchors for i in n.inputs)
    assert all(n.dtype == "float32" for n in b16.nodes if n.op in (Op.SUM, Op.PROD))


def test_bf16_takes_weights_beyond_fp16s_range(tmp_path):
    """bf16 has fp32's exponent range: weights of order 1e5, which fp16
    (largest 65504) refuses, are stored in bf16, rounded to 8 bits."""
    path = _save(_block(weight_scale=1e5), tmp_path / "m.onnx")
    graph = pipeline.fission_file(path)
    with pytest.raises(InputError, match="beyond float16's range"):
        precision.lower_precision(graph, "fp16", path)
    low = precision.lower_precision(graph, "bf16", path)
    assert low.constants["w"].dtype == BFLOAT16
    np.testing.assert_allclose(
        low.constants["w"].astype(np.float32), graph.constants["w"], rtol=2**-8
    )


def test_bf16_plan_of_tiny_bert_records_every_dtype(tmp_path):
    """Every matmul operand bf16 (weights stored in bf16, activations written
    in bf16 by the kernel before), sums and maxima fp32, attention planned,
    and plan.json says bf16."""
    graph = precision.lower_precision(pipeline.fission_file(TINY_BERT), "bf16", TINY_BERT)
    plan = pipeline.plan_graph(graph, PlanOptions(dtype="bf16", device="h200", time_limit=20)).plan
    types = dict(plan.types)
    types.update({k: (v.shape, v.dtype.name) for k, v in graph.constants.items()})
    prims = {p.name: p for p in plan.primitives}
    operands = {i for p in plan.primitives if p.op in ("matmul", "conv") for i in p.inputs}
    assert operands and {types[i][1] for i in operands} == {"bfloat16"}
    weights = operands & set(graph.constants)
    assert weights and all(graph.constants[w].dtype == BFLOAT16 for w in weights)
    written = {t for k in plan.kernels for t in k.outputs}
    assert operands & written and all(types[t][1] == "bfloat16" for t in operands & written)
    assert {p.dtype for p in plan.primitives if p.op in ("sum", "reduce_max")} == {"float32"}
    assert any(k.template == "attention" for k in plan.kernels)
    assert prims and interpreter_refusal(graph) is not None
    pipeline.write_plan(plan, tmp_path / "plan.json")
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["options"]["dtype"] == "bf16"
    again = pipeline.read_plan(tmp_path / "plan.json")
    held = Counter(p.dtype for p in plan.primitives)
    assert precision_text(again) == (
        "bf16, fp32 accumulation, softmax and normalisation "
        f"({held['bfloat16']} bfloat16, {held['float32']} float32)"
    )


def test_bf16_tolerance_holds_the_simulated_error_of_tiny_bert():
    """The plan's arithmetic simulated in numpy (every primitive rounded to
    its dtype): bf16's error is several times fp16's (8 mantissa bits, not
    11) and stays well inside its tolerance, 4e-2."""
    model = pipeline.load(TINY_BERT)
    graph = pipeline.fission_model(model, {}, TINY_BERT)
    session = onnxrt.reference(model, TINY_BERT)
    names = [o.name for o in session.get_outputs()]
    worst = {}
    for dtype in ("fp16", "bf16"):
        low = precision.lower_precision(graph, dtype, TINY_BERT)
        rel = []
        for seed in range(3):
            feeds = random_inputs(graph, seed)
            want = dict(zip(names, onnxrt.run_reference(session, names, feeds, TINY_BERT)))
            got = reference.run(low, feeds)
            rel += [compare(o, got[o], want[o], seed, None, None).rel for o in graph.outputs]
        worst[dtype] = max(rel)
    assert 3 * worst["fp16"] < worst["bf16"] < precision.RTOL["bf16"] / 4, worst


def test_bf16_bundle_on_a_cpu_is_simulated_never_called_verified(tmp_path):
    if gpu_available():
        pytest.skip("on a GPU the kernels run: the gpu test checks them")
    path = _save(_block(), tmp_path / "m.onnx")
    out = tmp_path / "out.orch"
    r = invoke("optimize", path, "-o", out, "--dtype", "bf16", "--device", "h200")
    assert r.exit_code == 0, r.output
    assert "precision: bf16, fp32 accumulation" in r.output
    assert "kernels not verified: they did not run (matmul" in r.output
    assert "verified against" not in r.output
    report = (out / "report.md").read_text()
    assert "PASSED (simulated)" in report and "The kernels did not run" in report
    # weights.npz holds bf16 weights as uint16 bit patterns, listed in the manifest
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "orchestrate-bundle/6"
    assert set(manifest["bfloat16"]) >= {"w", "w2"}
    with np.load(out / "weights.npz") as z:
        raw = {name: z[key] for name, key in manifest["constants"].items()}
    assert all(raw[n].dtype == np.uint16 for n in manifest["bfloat16"])
    assert all(a.dtype != np.uint16 for n, a in raw.items() if n not in manifest["bfloat16"])
    read = bundle.read(out).constants
    low = precision.lower_precision(pipeline.fission_file(path), "bf16", path)
    for name in manifest["bfloat16"]:
        assert read[name].dtype == BFLOAT16
        np.testing.assert_array_equal(
            read[name].view(np.uint16), low.constants[name].view(np.uint16)
        )
    # the bundle loads (its kernels regenerate) but refuses to run them here, in one line
    loaded = orchestrate.load(out)
    with pytest.raises(OrchestrateError, match="cannot run this plan without a GPU: matmul"):
        loaded.run(random_inputs(pipeline.fission_file(path), 0))
    assert_user_error(
        invoke("verify", out, "--model", path), "without a GPU", "Triton's interpreter"
    )


def test_a_bf16_simulation_beyond_tolerance_is_refused(tmp_path):
    """At fp32's tolerance the simulated bf16 plan fails: nothing is written,
    and the message says the plan (not the kernels) was simulated."""
    path = _save(_block(), tmp_path / "m.onnx")
    out = tmp_path / "out.orch"
    with pytest.raises(orchestrate.OrchestrateError) as e:
        orchestrate.optimize(path, out, dtype="bf16", device="h200", rtol=1e-5)
    if not gpu_available():
        assert "the plan, simulated in numpy, do not match the model" in str(e.value)
        assert e.value.report.simulated.startswith("matmul")
    assert not out.exists()


def _bf16_model() -> onnx.ModelProto:
    """A model that is bfloat16 already: m = (x + b) * 2, Softmax(m), ReduceMean(m)."""
    rng = np.random.default_rng(1)
    b = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32).astype(BFLOAT16), "b")
    assert b.data_type == TensorProto.BFLOAT16
    two = numpy_helper.from_array(np.array(2.0, np.float32).astype(BFLOAT16), "two")
    nodes = [
        helper.make_node("Add", ["x", "b"], ["s"]),
        helper.make_node("Mul", ["s", "two"], ["m"]),
        helper.make_node("Softmax", ["m"], ["p"], axis=-1),
        helper.make_node("ReduceMean", ["m"], ["n"], axes=[-1]),
    ]
    io = [
        helper.make_tensor_value_info(n, TensorProto.BFLOAT16, s)
        for n, s in (("x", [4, 32]), ("p", [4, 32]), ("n", [4, 1]))
    ]
    g = helper.make_graph(nodes, "bf16", io[:1], io[1:], [b, two])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_a_bf16_model_is_read_and_its_elementwise_kernels_run_in_the_interpreter(tmp_path):
    """The frontend takes ONNX BFLOAT16 tensors.  Without a matmul the
    interpreter can run the kernels (bf16 loads widen to fp32, stores
    round back), within a bf16 unit of the float64 reference."""
    path = _save(_bf16_model(), tmp_path / "m.onnx")
    graph = pipeline.fission_file(path)
    assert {i.type.dtype for i in graph.inputs} == {"bfloat16"}
    assert precision.model_dtype(graph) == "bfloat16"
    assert precision.lower_precision(graph, "bf16", path) is graph
    with pytest.raises(InputError, match="the model computes in bfloat16; orchestrate lowers"):
        precision.lower_precision(graph, "fp32", path)
    with pytest.raises(InputError, match="it does not mix two"):
        precision.lower_precision(graph, "fp16", path)
    assert interpreter_refusal(graph) is None
    planned = pipeline.plan_graph(graph, PlanOptions(time_limit=10))
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 32)).astype(np.float32).astype(BFLOAT16)}
    got, _ = run_plan(graph, planned, feeds)
    want = reference.run(graph, feeds, float64=True)
    for name in ("p", "n"):
        assert got[name].dtype == BFLOAT16
        g, w = got[name].astype(np.float64), want[name]
        # stored once in bf16 (the interpreter truncates: up to 2**-7 relative)
        np.testing.assert_allclose(g, w, rtol=2**-7, atol=2**-7 * np.abs(w).max(), err_msg=name)


def test_an_fp16_model_refuses_bf16(tmp_path):
    path = _save(_half_model(), tmp_path / "h.onnx")
    r = invoke("optimize", path, "-o", tmp_path / "o.orch", "--dtype", "bf16")
    assert_user_error(r, "--dtype bf16", "the model computes in float16", "does not mix two")


@pytest.mark.gpu
def test_bf16_kernels_match_onnxruntime_fp32_on_a_gpu(tmp_path):
    """On a GPU the bf16 kernels run: tiny BERT's bundle against onnxruntime
    in fp32 within bf16's tolerance, and the error is bf16's (not zero, not
    an fp32 run's)."""
    result = orchestrate.optimize(
        TINY_BERT, tmp_path / "b.orch", dtype="bf16", device="h200", trials=3
    )
    assert result.report.ok and result.report.simulated == ""
    model = pipeline.load(TINY_BERT)
    graph = pipeline.fission_model(model, {}, TINY_BERT)
    session = onnxrt.reference(model, TINY_BERT)
    names = [o.name for o in session.get_outputs()]
    loaded = orchestrate.load(tmp_path / "b.orch")
    worst = 0.0
    for seed in range(3):
        feeds = random_inputs(graph, 10 + seed)
        want = dict(zip(names, onnxrt.run_reference(session, names, feeds, TINY_BERT)))
        got = loaded.run(feeds)
        for o in graph.outputs:
            assert got[o].dtype == np.float32
            check = compare(o, got[o], want[o], seed, precision.RTOL["bf16"], None)
            assert check.ok, check
            worst = max(worst, check.rel)
    assert 1e-4 < worst < precision.RTOL["bf16"] / 2, worst
