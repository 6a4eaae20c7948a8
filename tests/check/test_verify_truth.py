"""Verification against the truth: the float64 reference, onnxruntime beside it.

A bundle closer to the float64 truth than onnxruntime's fp32 answer was
refused when onnxruntime was the reference (a tf2onnx classifier, a
paddle2onnx detector whose sigmoid outputs went down to 1e-17).  These build
the two classes and go through ``optimize``, the real caller."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import orchestrate
from orchestrate.check import verify
from orchestrate.frontend import onnxrt
from orchestrate.ir import reference
from orchestrate.plan import pipeline


def model(nodes, constants: dict[str, float], shape=(64, 32)) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in constants.items()]
    g = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def optimized(tmp_path, m: onnx.ModelProto, trials: int = 2):
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    return orchestrate.optimize(path, tmp_path / "m.orch", trials=trials)


def test_outputs_down_to_1e_17_verify_where_onnxruntime_rounds_them_to_zero(tmp_path):
    """sigmoid(x - 35): the truth is 1e-17 to 1e-14; onnxruntime's fp32
    sigmoid gives 0 below -18, so against it no answer could pass."""
    m = model(
        [helper.make_node("Sub", ["x", "c"], ["s"]), helper.make_node("Sigmoid", ["s"], ["y"])],
        {"c": 35.0},
    )
    made = optimized(tmp_path, m)
    (check,) = made.report.worst().values()
    assert check.ok and check.rel < 1e-5  # the kernels are within 1e-5 of the truth
    assert check.ort_rel == pytest.approx(1.0)  # onnxruntime: every value 0
    assert "onnxruntime" in "\n".join(made.report.lines())


def test_an_ill_conditioned_model_passes_when_no_worse_than_onnxruntime(tmp_path):
    """(x + 1e4) - 1e4 loses fp32 digits in every runtime (the kernels are
    1.6e-4 off the truth, outside fp32's 1e-4), and 1e5 * sigmoid(x - 16)
    is where onnxruntime's sigmoid is far off: the kernels, closer to the
    truth than onnxruntime, pass; against onnxruntime they were refused."""
    nodes = [
        helper.make_node("Add", ["x", "big"], ["a"]),
        helper.make_node("Sub", ["a", "big"], ["cancelled"]),
        helper.make_node("Sub", ["x", "shift"], ["s"]),
        helper.make_node("Sigmoid", ["s"], ["p"]),
        helper.make_node("Mul", ["p", "gain"], ["q"]),
        helper.make_node("Add", ["cancelled", "q"], ["y"]),
    ]
    m = model(nodes, {"big": 1e4, "shift": 16.0, "gain": 1e5})
    made = optimized(tmp_path, m)
    (check,) = made.report.worst().values()
    assert check.ok
    assert check.rel > verify.RTOL["float32"]  # outside the tolerance of the truth...
    assert check.max_abs <= verify.ORT_MULTIPLE * check.ort_max_abs  # ...but no worse
    assert check.max_abs < check.ort_max_abs  # closer to the truth than onnxruntime
    assert "no worse than" in check.detail


def test_an_fp32_overflow_that_onnxruntime_shares_is_not_a_mismatch(tmp_path):
    """exp(100 x) overflows fp32 where the float64 truth does not: the
    bundle's infinities are onnxruntime's, and the finite values are judged."""
    m = model(
        [helper.make_node("Mul", ["x", "k"], ["s"]), helper.make_node("Exp", ["s"], ["y"])],
        {"k": 100.0},
    )
    made = optimized(tmp_path, m)
    assert made.report.ok


def test_a_wrong_answer_close_to_neither_is_refused(tmp_path):
    """1% off in fp32 is outside the tolerance and far worse than
    onnxruntime: refused, naming both errors."""
    m = model(
        [helper.make_node("Sub", ["x", "c"], ["s"]), helper.make_node("Tanh", ["s"], ["y"])],
        {"c": 0.5},
    )
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    graph = pipeline.fission_model(m, None, str(path))
    session = onnxrt.reference(m, str(path))

    def answer(factor: float):
        def run(feeds):
            truth = reference.run(graph, feeds, float64=True)["y"]
            return {"y": (truth * factor).astype(np.float32)}

        return run

    report = verify.verify(m, graph, answer(1.01), trials=1, session=session, source=str(path))
    (check,) = report.checks
    assert not check.ok and "onnxruntime's" in check.detail
    assert check.rel == pytest.approx(0.01, rel=1e-3) and check.ort_rel < 1e-5
    # the truth itself, rounded to fp32 as kernels would give it, passes
    exact = verify.verify(m, graph, answer(1.0), trials=1, session=session, source=str(path))
    assert exact.ok


def test_integer_outputs_equal_the_truth():
    got, truth = np.array([1, 2, 3]), np.array([1, 2, 3])
    assert verify.judge("i", got, truth, truth, 0, None, None).ok
    bad = verify.judge("i", np.array([1, 2, 4]), truth, truth, 0, None, None)
    assert not bad.ok and "1 elements differ" in bad.detail
