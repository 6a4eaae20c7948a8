"""Quantization operators: linear (de)quantization and integer products.

``QuantizeLinear`` is ``saturate(round(x / scale) + zero_point)`` with ties
to even; ``DequantizeLinear`` ``(x - zero_point) * scale``, per tensor, per
axis or per block of an axis; ``DynamicQuantizeLinear`` finds the uint8 scale
and zero point of its input first.  Integer products (``MatMulInteger``,
``QLinearMatMul``, ``MatMulNBits``) subtract the zero points in int32 and
multiply in int32, exactly; ``ConvInteger`` and ``QLinearConv`` run their
convolution in float32 (the conv primitive is float only), which is exact
while every partial sum stays below 2**24 in magnitude.

Each is the spec's formula as onnxruntime computes it (a quantized matmul's
requantization multiplies by ``a_scale * b_scale / y_scale`` in float32 and
rounds once), checked against onnxruntime in
``tests/decompose/test_decompose_quantize.py``.
"""

from __future__ import annotations

import math

import numpy as np

from orchestrate.decompose import conv as conv_ops
from orchestrate.decompose.builder import Builder, Value, normalize_axis, onnx_dtype
from orchestrate.errors import GraphError, UnsupportedError
from orchestrate.ir import Op

# the integer types a quantized tensor may have here, with their ranges
_RANGES = {
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "uint16": (0, 65535),
}


def _quantized(op: str, dtype: str) -> tuple[int, int]:
    if dtype not in _RANGES:
        raise UnsupportedError(f"{op} to {dtype}", {f"{op} {dtype}": 1})
    return _RANGES[dtype]


def _broadcast(b: Builder, p: Value, x: Value, axis: int, block_size: int, op: str) -> Value:
    """A scale or zero point shaped to broadcast against ``x``: a scalar (per
    tensor), a vector along ``axis``, or a tensor of blocks along it."""
    if p.rank == 0 or p.shape == (1,) and block_size == 0:
        return b.reshape(p, ())
    axis = normalize_axis(axis, x.rank)
    if block_size > 0:
        want = list(x.shape)
        want[axis] = math.ceil(x.shape[axis] / block_size)
        if list(p.shape) != want:
            raise GraphError(f"{op}: blocked parameter {p.shape} for {x.shape}, expected {want}")
        index = b.constant(np.arange(x.shape[axis], dtype=np.int64) // block_size)
        return b.gather(p, index, axis)
    if p.rank != 1 or p.shape[0] != x.shape[axis]:
        raise GraphError(f"{op}: parameter {p.shape} along axis {axis} of {x.shape}")
    shape = [1] * x.rank
    shape[axis] = p.shape[0]
    return b.reshape(p, shape)


def _saturate(b: Builder, v: Value, dtype: str, op: str) -> Value:
    """``v`` (float, integer-valued) clipped to ``dtype``'s range and cast."""
    lo, hi = _quantized(op, dtype)
    return b.cast(b.min(b.max(v, float(lo)), float(hi)), dtype)


def _round(b: Builder, v: Value) -> Value:
    """Half to even, as onnxruntime's nearbyint."""
    return b.unary(Op.ROUND, v)


def _work(x: Value) -> str:
    """The float type quantization computes in: float32 for half inputs."""
    return "float32" if x.dtype in ("float16", "bfloat16") else x.dtype


def QuantizeLinear(
    b: Builder,
    x: Value,
    scale: Value,
    zero_point: Value | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    saturate: int = 1,
    precision: int = 0,
) -> Value:
    dtype = (
        zero_point.dtype
        if zero_point is not None
        else (onnx_dtype(output_dtype) if output_dtype else "uint8")
    )
    _quantized("QuantizeLinear", dtype)
    u = _work(x)
    s = b.cast(_broadcast(b, scale, x, axis, block_size, "QuantizeLinear"), u)
    v = _round(b, b.div(b.cast(x, u), s))
    if zero_point is not None:
        zp = _broadcast(b, zero_point, x, axis, block_size, "QuantizeLinear")
        v = b.add(v, b.cast(zp, u))
    return _saturate(b, v, dtype, "QuantizeLinear")


def DequantizeLinear(
    b: Builder,
    x: Value,
    scale: Value,
    zero_point: Value | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
) -> Value:
    if x.dtype not in (*_RANGES, "int32"):
        raise UnsupportedError(f"DequantizeLinear of {x.dtype}", {f"DequantizeLinear {x.dtype}": 1})
    v = b.cast(x, "int32")
    if zero_point is not None:
        zp = _broadcast(b, zero_point, x, axis, block_size, "DequantizeLinear")
        v = b.sub(v, b.cast(zp, "int32"))
    s = _broadcast(b, scale, x, axis, block_size, "DequantizeLinear")
    y = b.mul(b.cast(v, _work(s)), b.cast(s, _work(s)))
    return b.cast(y, onnx_dtype(output_dtype) if output_dtype else scale.dtype)


def DynamicQuantizeLinear(b: Builder, x: Value):
    """uint8 ``y``, ``y_scale`` and ``y_zero_point`` of ``x``: the range
    [min(0, min x), max(0, max x)] over 255 steps."""
    axes = list(range(x.rank))
    lo = b.min(b.reduce_min(x, axes, keepdims=False), 0.0)
    hi = b.max(b.reduce_max(x, axes, keepdims=False), 0.0)
    scale = b.div(b.sub(hi, lo), 255.0)
    op = "DynamicQuantizeLinear"
    zp = _saturate(b, _round(b, b.sub(0.0, b.div(lo, scale))), "uint8", op)
    y = _saturate(b, b.add(_round(b, b.div(x, scale)), b.cast(zp, x.dtype)), "uint8", op)
    return y, scale, zp


def _centered(b: Builder, x: Value, zp: Value | None, axis_of_vector: int) -> Value:
    """``x - zero_point`` in int32; a vector zero point runs along
    ``axis_of_vector`` of ``x``."""
    v = b.cast(x, "int32")
    if zp is None:
        return v
    z = b.cast(zp, "int32")
    if z.rank == 1 and z.shape[0] != 1:
        shape = [1] * x.rank
        shape[axis_of_vector] = z.shape[0]
        z = b.reshape(z, shape)
    elif z.rank <= 1:
        z = b.reshape(z, ())
    return b.sub(v, z)


def MatMulInteger(
    b: Builder,
    a: Value,
    c: Value,
    a_zero_point: Value | None = None,
    b_zero_point: Value | None = None,
) -> Value:
    """int32 ``(A - a_zp) @ (B - b_zp)``: A's zero point per row, B's per column."""
    if a.rank < 2 or c.rank < 2:
        raise UnsupportedError(f"MatMulInteger of {a.shape} and {c.shape}", {"MatMulInteger": 1})
    return b.matmul(
        _centered(b, a, a_zero_point, a.rank - 2), _centered(b, c, b_zero_point, c.rank - 1)
    )


def _requantize(b: Builder, acc: Value, multiplier: Value, zp: Value, dtype: str, op: str):
    v = _round(b, b.mul(b.cast(acc, "float32"), multiplier))
    v = b.add(v, b.cast(b.reshape(zp, ()) if zp.size == 1 else zp, "float32"))
    return _saturate(b, v, dtype, op)


def QLinearMatMul(
    b: Builder,
    a: Value,
    a_scale: Value,
    a_zero_point: Value,
    c: Value,
    b_scale: Value,
    b_zero_point: Value,
    y_scale: Value,
    y_zero_point: Value,
) -> Value:
    """``MatMulInteger`` requantized: ``round(acc * a_scale * b_scale / y_scale) + y_zp``."""
    acc = MatMulInteger(b, a, c, a_zero_point, b_zero_point)
    scales = [b.cast(s, "float32") for s in (a_scale, b_scale, y_scale)]
    multiplier = b.div(b.mul(scales[0], scales[1]), scales[2])
    return _requantize(b, acc, multiplier, y_zero_point, y_zero_point.dtype, "QLinearMatMul")


def _conv_integer(b, x, w, x_zp, w_zp, attrs) -> Value:
    xf = b.cast(_centered(b, x, x_zp, 1), "float32")
    wf = b.cast(_centered(b, w, w_zp, 0), "float32")
    y = conv_ops.Conv(b, xf, wf, **attrs)
    return b.cast(_round(b, y), "int32")


def ConvInteger(
    b: Builder,
    x: Value,
    w: Value,
    x_zero_point: Value | None = None,
    w_zero_point: Value | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations=None,
    group: int = 1,
    kernel_shape=None,
    pads=None,
    strides=None,
) -> Value:
    """int32 convolution of ``x - x_zp`` and ``w - w_zp`` (per output channel)."""
    attrs = dict(
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    return _conv_integer(b, x, w, x_zero_point, w_zero_point, attrs)


def QLinearConv(
    b: Builder,
    x: Value,
    x_scale: Value,
    x_zero_point: Value,
    w: Value,
    w_scale: Value,
    w_zero_point: Value,
    y_scale: Value,
    y_zero_point: Value,
    bias: Value | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations=None,
    group: int = 1,
    kernel_shape=None,
    pads=None,
    strides=None,
) -> Value:
    """``ConvInteger`` plus the int32 bias, requantized per output channel."""
    attrs = dict(
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    acc = _conv_integer(b, x, w, x_zero_point, w_zero_point, attrs)
    channels = [1, w.shape[0]] + [1] * (x.rank - 2)
    if bias is not None:
        acc = b.add(acc, b.reshape(b.cast(bias, "int32"), channels))
    ws = b.cast(w_scale, "float32")
    if ws.size > 1:
        ws = b.reshape(ws, channels)
    else:
        ws = b.reshape(ws, ())
    multiplier = b.div(
        b.mul(b.cast(b.reshape(x_scale, ()), "float32"), ws),
        b.cast(b.reshape(y_scale, ()), "float32"),
    )
    return _requantize(b, acc, multiplier, y_zero_point, y_zero_point.dtype, "QLinearConv")


def MatMulNBits(
    b: Builder,
    a: Value,
    packed: Value,
    scales: Value,
    zero_points: Value | None = None,
    g_idx: Value | None = None,
    bias: Value | None = None,
    *,
    K: int,
    N: int,
    bits: int = 4,
    block_size: int,
    accuracy_level: int = 0,
) -> Value:
    """``A @ dequantize(B)^T``: B is [N, K] in ``bits``-bit unsigned values
    packed low bits first into bytes, [N, blocks, block_size * bits / 8],
    with a float scale (and a packed zero point, default 2**(bits-1)) per
    block of ``block_size`` along K.  The weights are unpacked and
    dequantized by primitives the planner can fuse into the matmul's
    operand load (integer division and remainder by 2**bits)."""
    if bits not in (2, 4, 8) or g_idx is not None:
        raise UnsupportedError(f"MatMulNBits with bits={bits} or g_idx", {"MatMulNBits": 1})
    blocks = math.ceil(K / block_size)
    per_byte = 8 // bits
    if packed.shape != (N, blocks, block_size // per_byte):
        raise GraphError(f"MatMulNBits B {packed.shape} for N={N}, K={K}, block {block_size}")
    levels = 1 << bits

    def low_bits(x: Value) -> Value:  # x mod 2**bits, x >= 0
        return b.emit(Op.MOD, [x, b.scalar(levels, x)], fmod=False)

    # the packed weights stay packed: unfolded, so the kernels read 4 bits a weight
    packed = Value(packed.name, packed.type)
    v = b.cast(packed, "int32")  # [N, blocks, bytes]
    parts = []
    for k in range(per_byte):  # low bits first
        shifted = b.div(v, levels**k) if k else v
        parts.append(b.reshape(low_bits(shifted), (N, blocks, packed.shape[2], 1)))
    q = b.reshape(b.concat(parts, -1) if len(parts) > 1 else parts[0], (N, blocks, block_size))
    if zero_points is None:
        zp = b.scalar(levels // 2, q)
    elif zero_points.dtype == "uint8":
        zbytes = math.ceil(blocks / per_byte)  # a row's zero points, packed
        z = b.reshape(b.cast(zero_points, "int32"), (N, zbytes))
        zparts = [low_bits(b.div(z, levels**k) if k else z) for k in range(per_byte)]
        zs = b.reshape(
            b.concat([b.reshape(p, (N, z.shape[1], 1)) for p in zparts], -1),
            (N, z.shape[1] * per_byte),
        )
        zp = b.reshape(b.slice_axis(zs, 1, 0, blocks), (N, blocks, 1))
    else:
        raise UnsupportedError("MatMulNBits with float zero points", {"MatMulNBits": 1})
    s = b.reshape(scales, (N, blocks, 1))
    w = b.mul(b.cast(b.sub(q, zp), s.dtype), s)  # [N, blocks, block_size]
    w = b.slice_axis(b.reshape(w, (N, blocks * block_size)), 1, 0, K)
    y = b.matmul(a if a.rank >= 2 else b.reshape(a, (1, K)), b.transpose(w, (1, 0)))
    if bias is not None:
        y = b.add(y, bias)
    return y if a.rank >= 2 else b.reshape(y, (N,))


OPS = {
    "QuantizeLinear": QuantizeLinear,
    "DequantizeLinear": DequantizeLinear,
    "DynamicQuantizeLinear": DynamicQuantizeLinear,
    "MatMulInteger": MatMulInteger,
    "QLinearMatMul": QLinearMatMul,
    "ConvInteger": ConvInteger,
    "QLinearConv": QLinearConv,
    "com.microsoft::MatMulNBits": MatMulNBits,
}
