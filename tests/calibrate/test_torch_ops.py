"""The nodes the ONNX exporter writes for one PyTorch op, priced as eager runs
them: one op, not one op per node (``calibrate/torch_ops.py``)."""

from __future__ import annotations

import importlib
import io
import math
from dataclasses import replace

import onnx
import pytest
from onnx import TensorProto, helper

from orchestrate.calibrate import torch_ops
from orchestrate.cost import measurements
from tools.measurements.describe import describe

from .test_calibrate import FIXTURE

predict = importlib.import_module("orchestrate.calibrate.predict")


def _exported() -> onnx.ModelProto:
    """GELU, Mish, GroupNorm and ReLU as torch.onnx.export writes them at
    opset 17 (as the measurement rows were made): 14 nodes, not counting
    constants, for four PyTorch ops."""
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.GroupNorm(4, 8)

        def forward(self, x):
            y = torch.nn.functional.mish(torch.nn.functional.gelu(x))
            return torch.relu(self.norm(y))

    buf = io.BytesIO()
    torch.onnx.export(Net(), (torch.randn(2, 8, 16),), buf, opset_version=17, dynamo=False)
    return onnx.load_from_string(buf.getvalue())


def _as_row(model: onnx.ModelProto, runtime: str):
    row = measurements.load(FIXTURE)[0]
    return replace(row, id=f"test/{runtime}", runtime=runtime, graph=describe(model))


def test_the_exporters_gelu_mish_and_group_norm_are_found_as_one_op_each():
    model = _exported()
    rebuilt = measurements.model(_as_row(model, "eager"))
    ops = torch_ops.groups(rebuilt)
    by_op: dict[str, list[str]] = {}
    for node, op in ops.items():
        by_op.setdefault(op, []).append(node.rsplit("_", 1)[0])
    shapes = sorted(sorted(nodes) for nodes in by_op.values())
    assert shapes == [
        ["Add", "Div", "Erf", "Mul", "Mul"],  # GELU
        ["Add", "InstanceNormalization", "Mul", "Reshape", "Reshape", "Shape"],  # GroupNorm
        ["Mul", "Softplus", "Tanh"],  # Mish
    ]
    assert not any(name.startswith("Relu") for name in ops)


def test_eager_runs_one_kernel_per_pytorch_op_through_calibrate():
    """The real caller: eager's kernels are GELU's one, Mish's one,
    GroupNorm's two (statistics, then their use) at most, and ReLU's."""
    model = _exported()
    eager = predict.predict(_as_row(model, "eager"))
    assert isinstance(eager, predict.Prediction)
    assert 4 <= len(eager.kernels) <= 5
    nodes = sum(n.op_type not in ("Constant", "Shape") for n in model.graph.node)
    assert nodes >= 12  # what one kernel per ONNX node would have launched
    floor = eager.host.per_kernel_us
    assert eager.predicted_us == pytest.approx(sum(max(k.time_us, floor) for k in eager.kernels))


def _gelu_graph(divisor: float, erf_also_out: bool) -> onnx.ModelProto:
    c = lambda name, v: helper.make_node(
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.FLOAT, [], [v])
    )
    nodes = [
        c("r2", divisor),
        helper.make_node("Div", ["x", "r2"], ["a"]),
        helper.make_node("Erf", ["a"], ["b"]),
        c("one", 1.0),
        helper.make_node("Add", ["b", "one"], ["d"]),
        helper.make_node("Mul", ["x", "d"], ["e"]),
        c("half", 0.5),
        helper.make_node("Mul", ["e", "half"], ["y"]),
    ]
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [4, 8])
    outputs = [vi("y")] + ([vi("b")] if erf_also_out else [])
    graph = helper.make_graph(nodes, "g", [vi("x")], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_only_the_exporters_own_shape_is_one_op():
    """GELU's shape with its constants is one op; dividing by 2 instead of
    sqrt(2) is another function, and an Erf whose value is also an output was
    computed by itself: each node its own op then."""
    found = torch_ops.groups(_gelu_graph(math.sqrt(2), erf_also_out=False))
    assert sorted(found) == ["Add_4", "Div_1", "Erf_2", "Mul_5", "Mul_7"]
    assert set(found.values()) == {"Div_1"}
    assert torch_ops.groups(_gelu_graph(2.0, erf_also_out=False)) == {}
    assert torch_ops.groups(_gelu_graph(math.sqrt(2), erf_also_out=True)) == {}


def _losses() -> onnx.ModelProto:
    """KernelBench's cosine-similarity and KL-divergence losses, added, as
    torch.onnx.export writes them at opset 17: 29 nodes for seven PyTorch ops
    (cosine_similarity, rsub, mean; log, kl_div, div; add)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional

    class Net(torch.nn.Module):
        def forward(self, a, b):
            cosine = torch.mean(1 - F.cosine_similarity(a, b, dim=1))
            return cosine + F.kl_div(torch.log(a), b, reduction="batchmean")

    buf = io.BytesIO()
    args = (torch.rand(4, 32) + 0.1, torch.rand(4, 32) + 0.1)
    torch.onnx.export(Net(), args, buf, opset_version=17, dynamo=False)
    return onnx.load_from_string(buf.getvalue())


def test_the_exporters_cosine_similarity_and_kl_div_are_one_op_each():
    rebuilt = measurements.model(_as_row(_losses(), "eager"))
    by_op: dict[str, list[str]] = {}
    for node, op in torch_ops.groups(rebuilt).items():
        by_op.setdefault(op, []).append(node.rsplit("_", 1)[0])
    shapes = sorted(sorted(nodes) for nodes in by_op.values())
    cosine = ["Div", "Max", "Mul", "Mul", "Mul", "Mul", "ReduceSum", "ReduceSum", "ReduceSum"]
    kl_div = ["ConstantOfShape", "Greater", "Log", "Mul", "ReduceSum", "Shape", "Sub", "Where"]
    assert shapes == [sorted(kl_div), sorted(cosine + ["Sqrt"])]
    eager = predict.predict(_as_row(_losses(), "eager"))
    assert isinstance(eager, predict.Prediction)
    assert len(eager.kernels) <= 8  # one kernel per node would be 20 or more


def _kl_graph(value_out: bool) -> onnx.ModelProto:
    """F.kl_div's exported shape by hand; ``value_out``: t * (log t - x) is
    also a graph output (then PyTorch computed it by itself)."""
    c = lambda name, v: helper.make_node(
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.FLOAT, [], [v])
    )
    nodes = [
        helper.make_node("Log", ["t"], ["lt"]),
        helper.make_node("Sub", ["lt", "x"], ["d"]),
        helper.make_node("Mul", ["t", "d"], ["m"]),
        helper.make_node("Shape", ["m"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["z"]),
        c("zero", 0.0),
        helper.make_node("Greater", ["t", "zero"], ["g"]),
        helper.make_node("Where", ["g", "m", "z"], ["w"]),
        helper.make_node("ReduceSum", ["w"], ["y"], keepdims=0),
    ]
    vi = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    outputs = [vi("y", [])] + ([vi("m", [4, 8])] if value_out else [])
    graph = helper.make_graph(nodes, "g", [vi("x", [4, 8]), vi("t", [4, 8])], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_kl_div_is_one_op_only_where_its_inner_values_are_its_own():
    assert len(torch_ops.groups(_kl_graph(value_out=False))) == 8
    assert torch_ops.groups(_kl_graph(value_out=True)) == {}
