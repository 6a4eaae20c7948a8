"""Normalizations: LayerNormalization, RMSNormalization, BatchNormalization,
InstanceNormalization, GroupNormalization, MeanVarianceNormalization,
LpNormalization, LRN.

Each is its statistics as reductions over the normalised axes (mean, then
variance as the mean of squared deviations, over the same axes: one
row-reduce kernel can hold both) and an elementwise epilogue that
broadcasts the per-row results back.  The reciprocal square root is taken
on the reduced tensor, so the per-element work is a multiply.

Precision: LayerNormalization, RMSNormalization and GroupNormalization (21)
compute in ``stash_type``, or in the input's dtype when that is wider (float64
stays float64, as in onnxruntime's kernels and the ONNX reference).  The ops
without that attribute compute float16 statistics in float32 too (what a
kernel accumulates in anyway) and cast the result back.

BatchNormalization in inference form is a per-channel affine map
``x * a + c`` with ``a = scale / sqrt(var + eps)`` and ``c = bias - mean * a``;
the builder folds both to constants when the statistics are initializers.
"""

from __future__ import annotations

import math

import numpy as np

from orchestrate import ir
from orchestrate.decompose.builder import Builder, Value, onnx_dtype_name
from orchestrate.decompose.reduce import check_axis, mean_over
from orchestrate.errors import UnsupportedError


def _stash_dtype(op: str, stash_type: int) -> str:
    name = onnx_dtype_name(stash_type)
    if name not in ir.FLOATS:
        raise UnsupportedError(
            f"{op}: stash_type {stash_type} ({name}) is not supported", {f"{op}.stash_type": 1}
        )
    return name


def _compute_dtype(op: str, x: Value, stash_type: int) -> str:
    """The wider of ``stash_type`` and x's dtype: stash_type raises the
    precision of float16 statistics; float64 inputs stay float64 (as in
    onnxruntime and the ONNX reference)."""
    stash = _stash_dtype(op, stash_type)
    return max(stash, x.dtype, key=lambda d: np.dtype(d).itemsize)


def _float_input(op: str, x: Value) -> None:
    if x.dtype not in ir.FLOATS:
        raise UnsupportedError(f"{op} of {x.dtype} is not supported", {f"{op} {x.dtype}": 1})


def _wide(x: Value) -> str:
    """The dtype statistics of ``x`` are computed in: float16, bfloat16 -> float32."""
    return "float32" if x.dtype in ir.HALF else x.dtype


def _moments(b: Builder, x: Value, axes: tuple[int, ...]) -> tuple[Value, Value, Value]:
    """(mean, x - mean, variance) over ``axes``, kept as size-1 axes."""
    mu = mean_over(b, x, axes)
    d = b.sub(x, mu)
    return mu, d, mean_over(b, b.mul(d, d), axes)


def _rsqrt(b: Builder, v: Value, epsilon: float) -> Value:
    return b.recip(b.sqrt(b.add(v, epsilon)))


def _per_channel(b: Builder, p: Value, rank: int, dtype: str) -> Value:
    """A (C,) parameter as (C, 1, ..., 1): broadcastable against (N, C, D1, ...)."""
    return b.cast(b.reshape(p, (p.shape[0],) + (1,) * (rank - 2)), dtype)


def _channels(op: str, x: Value, *params: Value | None) -> int:
    if x.rank < 2:
        raise UnsupportedError(f"{op}: input of rank {x.rank} has no channel axis", {op: 1})
    c = x.shape[1]
    for p in params:
        if p is not None and p.shape != (c,):
            raise UnsupportedError(
                f"{op}: parameter of shape {p.shape} does not match {c} channels", {op: 1}
            )
    return c


# -- over trailing axes --------------------------------------------------------


def LayerNormalization(
    b: Builder,
    x: Value,
    scale: Value,
    bias: Value | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> tuple[Value, Value, Value]:
    """Y = (x - mean) * inv_std * scale + bias over axes [axis, rank); also
    returns Mean and InvStdDev (stash dtype, reduced axes kept as 1)."""
    _float_input("LayerNormalization", x)
    u = _compute_dtype("LayerNormalization", x, stash_type)
    axes = tuple(range(check_axis("LayerNormalization", axis, x.rank), x.rank))
    mu, d, var = _moments(b, b.cast(x, u), axes)
    inv = _rsqrt(b, var, epsilon)
    y = b.mul(b.cast(b.mul(d, inv), x.dtype), scale)
    if bias is not None:
        y = b.add(y, bias)
    stash = _stash_dtype("LayerNormalization", stash_type)
    return y, b.cast(mu, stash), b.cast(inv, stash)


def RMSNormalization(
    b: Builder,
    x: Value,
    scale: Value,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> Value:
    """Y = x / sqrt(mean(x^2) + eps) * scale over axes [axis, rank)."""
    _float_input("RMSNormalization", x)
    u = _compute_dtype("RMSNormalization", x, stash_type)
    axes = tuple(range(check_axis("RMSNormalization", axis, x.rank), x.rank))
    xu = b.cast(x, u)
    inv = _rsqrt(b, mean_over(b, b.mul(xu, xu), axes), epsilon)
    return b.mul(b.cast(b.mul(xu, inv), scale.dtype), scale)


def MeanVarianceNormalization(b: Builder, x: Value, *, axes: list[int] = (0, 2, 3)) -> Value:
    """Y = (x - mean) / (sqrt(var) + 1e-9) over ``axes`` (the spec's epsilon)."""
    _float_input("MeanVarianceNormalization", x)
    ax = tuple(sorted({check_axis("MeanVarianceNormalization", a, x.rank) for a in axes}))
    _, d, var = _moments(b, b.cast(x, _wide(x)), ax)
    return b.cast(b.mul(d, b.recip(b.add(b.sqrt(var), 1e-9))), x.dtype)


def LpNormalization(b: Builder, x: Value, *, axis: int = -1, p: int = 2) -> Value:
    """Y = x / ||x||_p along ``axis`` (p = 1 or 2); an all-zero row stays zero."""
    _float_input("LpNormalization", x)
    ax = (check_axis("LpNormalization", axis, x.rank),)
    if p == 1:
        norm = b.sum(b.abs(x), ax)
    elif p == 2:
        norm = b.sqrt(b.sum(b.mul(x, x), ax))
    else:
        raise UnsupportedError(f"LpNormalization: p={p} is not supported", {"LpNormalization.p": 1})
    return b.div(x, b.where(b.eq(norm, 0), 1, norm))


# -- per channel ----------------------------------------------------------------


def BatchNormalization(
    b: Builder,
    x: Value,
    scale: Value,
    bias: Value,
    mean: Value,
    var: Value,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    training_mode: int = 0,
    spatial: int = 1,
    is_test: int | None = None,
    consumed_inputs: list[int] | None = None,
) -> Value:
    """Inference form: Y = x * a + c per channel (or per activation when
    ``spatial=0`` before opset 9).  ``consumed_inputs`` is ignored.

    Training form (``training_mode=1``, opset 14): Y normalised by the
    batch's own statistics over every axis but the channels (the variance
    the population one, as the ONNX reference computes it), and the running
    statistics ``mean * momentum + batch_mean * (1 - momentum)`` (likewise
    the variance) as the optional outputs."""
    op = "BatchNormalization"
    _float_input(op, x)
    if training_mode:
        return _batch_norm_training(b, x, scale, bias, mean, var, epsilon, momentum)
    if b.opset < 7 and not is_test:
        raise UnsupportedError(
            f"{op}: is_test=0 (training mode) is not supported", {f"{op}.training": 1}
        )
    if x.rank < 2:
        raise UnsupportedError(f"{op}: input of rank {x.rank} has no channel axis", {op: 1})
    per_channel = spatial or b.opset >= 9
    if per_channel:
        _channels(op, x, scale, bias, mean, var)
    elif any(p.shape != x.shape[1:] for p in (scale, bias, mean, var)):
        raise UnsupportedError(  # per activation: parameters of shape (C, D1, ...)
            f"{op}: spatial=0 parameters must have shape {x.shape[1:]}", {f"{op}.spatial": 1}
        )
    u = max(_wide(x), scale.dtype, key=lambda d: np.dtype(d).itemsize)
    a = b.div(b.cast(scale, u), b.sqrt(b.add(b.cast(var, u), epsilon)))
    c = b.sub(b.cast(bias, u), b.mul(b.cast(mean, u), a))
    if per_channel:
        a, c = (_per_channel(b, p, x.rank, u) for p in (a, c))
    # x * a and c nearly cancel where |mean| is large: float16 runs in float32
    return b.cast(b.add(b.mul(b.cast(x, u), a), c), x.dtype)


def _batch_norm_training(
    b: Builder,
    x: Value,
    scale: Value,
    bias: Value,
    mean: Value,
    var: Value,
    epsilon: float,
    momentum: float,
) -> tuple[Value, Value, Value]:
    op = "BatchNormalization"
    _channels(op, x, scale, bias, mean, var)
    u = max(_wide(x), scale.dtype, key=lambda d: np.dtype(d).itemsize)
    axes = (0,) + tuple(range(2, x.rank))
    mu, d, batch_var = _moments(b, b.cast(x, u), axes)
    gain = b.mul(_rsqrt(b, batch_var, epsilon), _per_channel(b, scale, x.rank, u))
    y = b.cast(b.add(b.mul(d, gain), _per_channel(b, bias, x.rank, u)), x.dtype)

    def running(old: Value, batch: Value) -> Value:
        now = b.reshape(batch, (x.shape[1],))
        mixed = b.add(b.mul(b.cast(old, u), momentum), b.mul(now, 1.0 - momentum))
        return b.cast(mixed, old.dtype)

    return y, running(mean, mu), running(var, batch_var)


def InstanceNormalization(
    b: Builder,
    x: Value,
    scale: Value,
    bias: Value,
    *,
    epsilon: float = 1e-5,
    consumed_inputs: list[int] | None = None,
) -> Value:
    """Y = (x - mean) * (inv_std * scale) + bias, statistics over the spatial axes."""
    op = "InstanceNormalization"
    _float_input(op, x)
    _channels(op, x, scale, bias)
    u = _wide(x)
    _, d, var = _moments(b, b.cast(x, u), tuple(range(2, x.rank)))
    gain = b.mul(_rsqrt(b, var, epsilon), _per_channel(b, scale, x.rank, u))
    y = b.add(b.mul(d, gain), _per_channel(b, bias, x.rank, u))
    return b.cast(y, x.dtype)


def GroupNormalization(
    b: Builder,
    x: Value,
    scale: Value,
    bias: Value,
    *,
    num_groups: int,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> Value:
    """Statistics per (sample, group of C / num_groups channels).  Opset 18:
    scale and bias per group; opset 21: per channel, computed in stash_type.

    Runs on the view (N, G, C/G, D1, ...) of x, reshaped back at the end."""
    op = "GroupNormalization"
    _float_input(op, x)
    c = _channels(op, x)
    g = int(num_groups)
    if g < 1 or c % g:
        raise UnsupportedError(
            f"{op}: {c} channels do not split into {g} groups", {f"{op}.num_groups": 1}
        )
    per_channel = b.opset >= 21
    want = c if per_channel else g
    if scale.shape != (want,) or bias.shape != (want,):
        raise UnsupportedError(
            f"{op}: scale and bias must have shape ({want},) at opset {b.opset}", {op: 1}
        )
    u = _compute_dtype(op, x, stash_type) if per_channel else _wide(x)
    spatial = x.shape[2:]
    grouped = b.reshape(b.cast(x, u), (x.shape[0], g, c // g) + spatial)
    _, d, var = _moments(b, grouped, tuple(range(2, grouped.rank)))
    normalized = b.mul(d, _rsqrt(b, var, epsilon))
    param_shape = (g, c // g if per_channel else 1) + (1,) * len(spatial)
    if per_channel:  # the spec rounds to the input dtype before the affine map
        normalized, u = b.cast(normalized, x.dtype), x.dtype
    s, t = (b.cast(b.reshape(p, param_shape), u) for p in (scale, bias))
    return b.reshape(b.cast(b.add(b.mul(normalized, s), t), x.dtype), x.shape)


# -- across channels ------------------------------------------------------------


def LRN(
    b: Builder,
    x: Value,
    *,
    size: int,
    alpha: float = 1e-4,
    beta: float = 0.75,
    bias: float = 1.0,
) -> Value:
    """Y = x / (bias + alpha / size * square_sum) ^ beta, where square_sum
    sums x^2 over a window of ``size`` channels around each channel.

    The window sum is an average pool over the channel axis: x^2 is viewed
    as (N, 1, C, D1*...*Dk) and pooled with a (size, 1) window padded by
    floor((size-1)/2) before and ceil((size-1)/2) after; the pool's average
    (zero padding counted) is square_sum / size."""
    _float_input("LRN", x)
    if x.rank < 2 or size < 1:
        raise UnsupportedError(f"LRN: size {size} on rank {x.rank} is not supported", {"LRN": 1})
    n, c = x.shape[:2]
    sq = b.reshape(b.mul(x, x), (n, 1, c, math.prod(x.shape[2:])))
    lo, hi = (size - 1) // 2, size // 2
    avg = b.pool(sq, "avg", kernel=(size, 1), strides=(1, 1), pads=(lo, 0, hi, 0), dilations=(1, 1))
    den = b.pow(b.add(b.mul(b.reshape(avg, x.shape), alpha), bias), beta)
    return b.div(x, den)


OPS = {
    "LayerNormalization": LayerNormalization,
    "RMSNormalization": RMSNormalization,
    "MeanVarianceNormalization": MeanVarianceNormalization,
    "LpNormalization": LpNormalization,
    "BatchNormalization": BatchNormalization,
    "InstanceNormalization": InstanceNormalization,
    "GroupNormalization": GroupNormalization,
    "LRN": LRN,
}
