"""Quantization operators against onnxruntime, and models onnx's quantizer
wrote (a dynamically quantized conv net and MLP) through optimize."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import orchestrate
from orchestrate.errors import UnsupportedError
from tests.util import check_decomposition, node_model

RNG = np.random.default_rng(0)


def model_of(op, inputs, constants=None, order=None, n_outputs=1, opset=21, domain="", **attrs):
    model = node_model(
        op,
        inputs,
        constants=constants,
        input_order=order,
        n_outputs=n_outputs,
        opset=opset,
        domain=domain,
        **attrs,
    )
    model.ir_version = 10  # opset 21
    return model


def check(model, feeds, **kw):
    return check_decomposition(
        model, feeds, rtol=kw.pop("rtol", 1e-5), atol=kw.pop("atol", 1e-6), **kw
    )


def f32(*shape, scale=4.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def ints(dtype, *shape):
    lo, hi = {"int8": (-128, 128), "uint8": (0, 256)}[dtype]
    return RNG.integers(lo, hi, size=shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("form", ["tensor", "axis", "block"])
def test_quantize_and_dequantize(dtype, form):
    x = f32(4, 6, 8)
    if form == "tensor":
        scale, zp, attrs = np.float32(0.05), np.array(3, dtype), {}
    elif form == "axis":
        scale = RNG.uniform(0.01, 0.1, size=6).astype(np.float32)
        zp, attrs = ints(dtype, 6) // 8, {"axis": 1}
    else:
        scale = RNG.uniform(0.01, 0.1, size=(4, 6, 2)).astype(np.float32)
        zp, attrs = ints(dtype, 4, 6, 2) // 8, {"axis": 2, "block_size": 4}
    q = model_of("QuantizeLinear", {"x": x}, {"s": scale, "zp": zp}, **attrs)
    check(q, {"x": x})
    xq = ints(dtype, 4, 6, 8)
    dq = model_of("DequantizeLinear", {"x": xq}, {"s": scale, "zp": zp}, **attrs)
    check(dq, {"x": xq})


def test_quantize_without_a_zero_point_is_uint8_and_ties_go_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, 300.0, -7.0], dtype=np.float32)
    model = model_of("QuantizeLinear", {"x": x}, {"s": np.float32(1.0)}, order=["x", "s"])
    graph = check(model, {"x": x})
    assert graph.types["y0"].dtype == "uint8"


def test_dynamic_quantize_linear():
    x = f32(3, 5)
    check(model_of("DynamicQuantizeLinear", {"x": x}, n_outputs=3, opset=20), {"x": x})


@pytest.mark.parametrize("zero_points", ["none", "scalar", "vector"])
def test_matmul_integer(zero_points):
    a, c = ints("uint8", 2, 3, 16), ints("int8", 16, 5)
    consts, order = {"c": c}, ["a", "c"]
    if zero_points == "scalar":
        consts.update(azp=np.array(7, np.uint8), bzp=np.array(-3, np.int8))
        order += ["azp", "bzp"]
    elif zero_points == "vector":
        # onnxruntime's CPU kernel takes A's zero point as a scalar only
        consts.update(azp=np.array(9, np.uint8), bzp=ints("int8", 5))
        order += ["azp", "bzp"]
    check(model_of("MatMulInteger", {"a": a}, consts, order, opset=20), {"a": a})


def test_qlinear_matmul():
    a, c = ints("uint8", 3, 16), ints("int8", 16, 5)
    consts = {
        "as": np.float32(0.02),
        "az": np.array(120, np.uint8),
        "c": c,
        "bs": np.float32(0.01),
        "bz": np.array(2, np.int8),
        "ys": np.float32(0.05),
        "yz": np.array(100, np.uint8),
    }
    order = ["a", "as", "az", "c", "bs", "bz", "ys", "yz"]
    check(model_of("QLinearMatMul", {"a": a}, consts, order, opset=20), {"a": a})


def test_conv_integer_and_qlinear_conv():
    x, w = ints("uint8", 1, 3, 6, 6), ints("int8", 4, 3, 3, 3)
    consts = {"w": w, "xz": np.array(5, np.uint8), "wz": np.array(1, np.int8)}
    model = model_of(
        "ConvInteger", {"x": x}, consts, ["x", "w", "xz", "wz"], opset=20, pads=[1] * 4
    )
    check(model, {"x": x})
    consts = {
        "xs": np.float32(0.02),
        "xz": np.array(5, np.uint8),
        "w": w,
        "ws": RNG.uniform(0.01, 0.03, size=4).astype(np.float32),
        "wz": np.zeros(4, np.int8),
        "ys": np.float32(0.2),
        "yz": np.array(128, np.uint8),
        "bias": RNG.integers(-500, 500, size=4).astype(np.int32),
    }
    order = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"]
    check(model_of("QLinearConv", {"x": x}, consts, order, opset=20, strides=[2, 2]), {"x": x})


@pytest.mark.parametrize("zero_points", [False, True])
def test_matmul_nbits_four_bit_blocks(zero_points):
    n, k, block = 6, 40, 16
    blocks = 3
    q = RNG.integers(0, 16, size=(n, blocks * block)).astype(np.uint8)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, blocks, block // 2)
    consts = {"b": packed, "s": RNG.uniform(0.01, 0.1, size=n * blocks).astype(np.float32)}
    order = ["a", "b", "s"]
    if zero_points:
        z = RNG.integers(0, 16, size=(n, 4)).astype(np.uint8)
        consts["z"] = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8).reshape(-1)
        order.append("z")
    a = f32(2, k, scale=1.0)
    model = model_of(
        "MatMulNBits",
        {"a": a},
        consts,
        order,
        opset=20,
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=block,
    )
    check(model, {"a": a}, rtol=1e-5, atol=1e-5)


def test_unsupported_forms_are_declined_naming_them():
    x = f32(4)
    model = model_of(
        "QuantizeLinear",
        {"x": x},
        {"s": np.float32(1.0)},
        output_dtype=onnx.TensorProto.INT4,
        order=["x", "s"],
    )
    with pytest.raises(UnsupportedError, match="QuantizeLinear.*int4 is not supported"):
        check(model, {"x": x})


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(y.flatten(1))


@pytest.mark.parametrize("quantized", [["Conv", "MatMul"], ["MatMul"]])
def test_a_dynamically_quantized_net_optimizes_and_verifies(tmp_path, quantized):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch.manual_seed(0)
    src, dst = tmp_path / "net.onnx", tmp_path / "net_int8.onnx"
    torch.onnx.export(
        SmallNet().eval(), (torch.randn(1, 3, 8, 8),), str(src), dynamo=False, opset_version=17
    )
    quantize_dynamic(
        str(src), str(dst), op_types_to_quantize=quantized, weight_type=QuantType.QInt8
    )
    ops = {n.op_type for n in onnx.load(dst).graph.node}
    assert "DynamicQuantizeLinear" in ops and "MatMulInteger" in ops
    assert ("ConvInteger" in ops) == ("Conv" in quantized)
    result = orchestrate.optimize(dst, tmp_path / "net.orch", trials=2, reproducible=True)
    assert result.report.ok


def test_a_statically_quantized_qdq_net_optimizes_and_verifies(tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            gen = np.random.default_rng(1)
            self.feeds = iter(
                [{"x": gen.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
            )

        def get_next(self):
            return next(self.feeds, None)

    torch.manual_seed(0)
    src, dst = tmp_path / "net.onnx", tmp_path / "net_qdq.onnx"
    model = SmallNet().eval()
    torch.onnx.export(
        model,
        (torch.randn(1, 3, 8, 8),),
        str(src),
        dynamo=False,
        opset_version=17,
        input_names=["x"],
    )
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ)
    ops = {n.op_type for n in onnx.load(dst).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    result = orchestrate.optimize(dst, tmp_path / "qdq.orch", trials=2, reproducible=True)
    assert result.report.ok


def nbits_layer(m: int, n: int, k: int, dtype, block: int = 32) -> onnx.ModelProto:
    """``y = a @ dequantize(B)^T`` for a [m, k] ``a`` of ``dtype`` and a
    4-bit [n, k] B packed two to a byte, one scale per ``block`` values."""
    q = RNG.integers(0, 16, size=(n, k)).astype(np.uint8)
    consts = {
        "b": (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, k // block, block // 2),
        "s": RNG.uniform(0.01, 0.1, size=n * (k // block)).astype(dtype),
    }
    a = f32(m, k, scale=1.0).astype(dtype)
    model = model_of(
        "MatMulNBits",
        {"a": a},
        consts,
        ["a", "b", "s"],
        opset=20,
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=block,
    )
    elem_type = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y0", elem_type, [m, n]))
    return model


def test_a_matmul_nbits_layer_optimizes_and_verifies(tmp_path):
    """A 4-bit weight-only linear layer as onnxruntime GenAI writes them."""
    n, k = 32, 64
    model = nbits_layer(4, n, k, np.float32)
    src = tmp_path / "nbits.onnx"
    onnx.save(model, src)
    result = orchestrate.optimize(src, tmp_path / "nbits.orch", trials=2, reproducible=True)
    assert result.report.ok
    # the weights stay 4-bit: unpacked and dequantized in the matmul's operand load
    (kernel,) = [k for k in result.plan.kernels if not k.is_view]
    assert kernel.template == "matmul"
    assert "b" in kernel.inputs
    with np.load(result.path / "weights.npz") as stored:
        assert [a.dtype for a in stored.values()].count(np.uint8) == 1
        assert not any(a.dtype == np.float32 and a.size >= n * k for a in stored.values())


def test_a_4_bit_gemv_plans_its_dequantization_into_the_matmul(tmp_path):
    """Decoding reads each weight once per token: at M = 1 the B prologue
    runs once per row of tiles, so unpacking in the operand load beats
    writing the fp16 weights out first (priced per column of tiles, it
    did not)."""
    from orchestrate.plan import pipeline
    from orchestrate.plan.planner import PlanOptions

    model = nbits_layer(1, 1024, 1024, np.float16)
    src = tmp_path / "gemv.onnx"
    onnx.save(model, src)
    planned = pipeline.plan_graph(pipeline.fission_file(src), PlanOptions(device="h100"))
    kernels = [k for k in planned.plan.kernels if not k.is_view]
    assert [k.template for k in kernels] == ["matmul"]
