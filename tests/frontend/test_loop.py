"""Loops with a constant trip count, unrolled by the frontend, against
onnxruntime; and the loops it leaves alone, refused naming the reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from orchestrate.errors import UnsupportedError
from orchestrate.frontend import MAX_LOOP_UNROLL
from tests.util import check_decomposition

F, I64, B = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.BOOL


def loop_model(trips: int, *, early_exit: bool = False, opset: int = 17) -> onnx.ModelProto:
    """acc <- acc * 0.5 + x * i for i in 0..trips-1, scanning each acc."""
    cond_out = (
        helper.make_node("Less", ["i_f", "limit"], ["cond_out"])
        if early_exit
        else helper.make_node("Identity", ["cond_in"], ["cond_out"])
    )
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["i_f"], to=F),
            helper.make_node("Mul", ["x", "i_f"], ["xi"]),
            helper.make_node("Mul", ["acc_in", "half"], ["decayed"]),
            helper.make_node("Add", ["decayed", "xi"], ["acc_out"]),
            helper.make_node("Identity", ["acc_out"], ["scan"]),
            cond_out,
        ],
        "body",
        [
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("cond_in", B, []),
            helper.make_tensor_value_info("acc_in", F, [2, 3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", B, []),
            helper.make_tensor_value_info("acc_out", F, [2, 3]),
            helper.make_tensor_value_info("scan", F, [2, 3]),
        ],
        initializer=[
            helper.make_tensor("half", F, [], [0.5]),
            helper.make_tensor("limit", F, [], [2.0]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node(
                "Loop", ["trips", "go", "acc0"], ["acc", "scans"], body=body, name="decay"
            )
        ],
        "loop",
        [helper.make_tensor_value_info(n, F, [2, 3]) for n in ("x", "acc0")],
        [
            helper.make_tensor_value_info("acc", F, [2, 3]),
            helper.make_tensor_value_info("scans", F, None),
        ],
        initializer=[
            helper.make_tensor("trips", I64, [], [trips]),
            helper.make_tensor("go", B, [], [True]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def feeds():
    rng = np.random.default_rng(0)
    return {
        "x": rng.standard_normal((2, 3)).astype(np.float32),
        "acc0": rng.standard_normal((2, 3)).astype(np.float32),
    }


@pytest.mark.parametrize("trips, opset", [(1, 17), (5, 17), (3, 11)])
def test_a_loop_with_a_constant_trip_count_is_unrolled(trips, opset):
    graph = check_decomposition(loop_model(trips, opset=opset), feeds(), rtol=1e-6, atol=1e-6)
    assert graph.types["scans"].shape == (trips, 2, 3)


@pytest.mark.parametrize(
    "model, reason",
    [
        (loop_model(3, early_exit=True), "its body may end the loop early"),
        (
            loop_model(MAX_LOOP_UNROLL + 1),
            f"its trip count {MAX_LOOP_UNROLL + 1} is not 1 to {MAX_LOOP_UNROLL}",
        ),
    ],
)
def test_loops_left_alone_are_refused_with_the_reason(model, reason):
    with pytest.raises(UnsupportedError, match=rf"node 'decay' \(Loop\) is not unrolled: {reason}"):
        check_decomposition(model, feeds())
