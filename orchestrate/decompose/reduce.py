"""Reductions and the softmax family: ReduceSum ... ReduceLogSumExp, ArgMax,
ArgMin, Softmax, LogSoftmax, Hardmax.

Every composite reduction is its formula over the four reduce primitives
(sum, max, min, prod): ``ReduceMean`` is a sum and a scale, ``ReduceL2`` a sum
of squares and a square root.  Softmax, LogSoftmax and ReduceLogSumExp always
subtract the maximum first, so inputs of any magnitude neither overflow nor
underflow to NaN.

Axes: ReduceSum takes them as an attribute before opset 13 and as an input
from 13 on; the other reductions switch at opset 18.  The dispatcher passes
either form to the same ``axes`` parameter (a list from the attribute, a
Value from the input).  Empty axes mean every axis, unless
``noop_with_empty_axes`` is set, when the reduction runs over no axis at all
(ReduceSumSquare then squares, ReduceL1 takes the absolute value, ...).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from orchestrate import ir
from orchestrate.decompose.builder import Builder, Value
from orchestrate.errors import UnsupportedError
from orchestrate.ir import Op


def check_axis(op: str, axis: int, rank: int, *, upper: int | None = None) -> int:
    """``axis`` in ``[0, upper)`` (``upper`` defaults to ``rank``); UnsupportedError otherwise."""
    upper = rank if upper is None else upper
    axis = int(axis)
    if not -rank <= axis < max(upper, 1):
        raise UnsupportedError(
            f"{op}: axis {axis} is out of range for rank {rank}", {f"{op}.axis": 1}
        )
    return axis + rank if axis < 0 else axis


def reduce_axes(
    b: Builder, op: str, x: Value, axes: Value | Sequence[int] | None, noop: int
) -> tuple[int, ...]:
    """The sorted axes a Reduce* node reduces over (``()`` for a no-op)."""
    if isinstance(axes, Value):
        if axes.const is None:
            raise UnsupportedError(f"{op}: input 'axes' must be a constant", {f"{op}.axes": 1})
        axes = [int(a) for a in np.asarray(axes.const).reshape(-1)]
    axes = list(axes or [])
    if not axes:
        return () if noop else tuple(range(x.rank))
    return tuple(sorted({check_axis(op, a, x.rank) for a in axes}))


def mean_over(b: Builder, x: Value, axes: tuple[int, ...], keepdims: bool = True) -> Value:
    """Sum, then scale by the element count (an empty set sums to 0, as in onnxruntime)."""
    total = b.sum(x, axes, keepdims)
    n = math.prod(x.shape[a] for a in axes)
    return b.div(total, n) if n > 1 else total


def _squeeze(b: Builder, y: Value, axes: tuple[int, ...], keepdims: int) -> Value:
    """Drop the (size-1) reduced axes of ``y`` unless ``keepdims``."""
    if keepdims or not axes:
        return y
    return b.reshape(y, [d for i, d in enumerate(y.shape) if i not in axes])


def _via_float(b: Builder, x: Value, fn) -> Value:
    """``fn`` on a float view of ``x``: integers go through float64 and back
    (truncating, as onnxruntime does for ReduceL2 / ReduceLogSum on ints)."""
    if x.dtype in ir.FLOATS:
        return fn(x)
    return b.cast(fn(b.cast(x, "float64")), x.dtype)


# -- Reduce* -----------------------------------------------------------------


def _reduction(name: str, body):
    """A Reduce* decomposition: ``body(b, x, axes, keepdims)`` does the math."""

    def fn(
        b: Builder,
        x: Value,
        axes: Value | list[int] | None = None,
        *,
        keepdims: int = 1,
        noop_with_empty_axes: int = 0,
    ) -> Value:
        ax = reduce_axes(b, name, x, axes, noop_with_empty_axes)
        return body(b, x, ax, bool(keepdims))

    fn.__name__ = fn.__qualname__ = name
    return fn


def _extreme(op: Op):
    def body(b: Builder, x: Value, axes, keepdims) -> Value:
        if x.dtype == "bool":  # opset 20: max is any, min is all
            return b.cast(b.reduce(op, b.cast(x, "uint8"), axes, keepdims), "bool")
        return b.reduce(op, x, axes, keepdims)

    return body


def _sum_square(b: Builder, x: Value, axes, keepdims) -> Value:
    return b.sum(b.mul(x, x), axes, keepdims)


def _l1(b: Builder, x: Value, axes, keepdims) -> Value:
    return b.sum(b.abs(x), axes, keepdims)


def _l2(b: Builder, x: Value, axes, keepdims) -> Value:
    return _via_float(b, _sum_square(b, x, axes, keepdims), b.sqrt)


def _log_sum(b: Builder, x: Value, axes, keepdims) -> Value:
    return _via_float(b, b.sum(x, axes, keepdims), b.log)


def log_sum_exp(b: Builder, x: Value, axes: tuple[int, ...], keepdims: bool = True) -> Value:
    """``m + log(sum(exp(x - m)))`` with ``m`` the maximum, or 0 where the
    maximum is infinite (so all -inf gives -inf and +inf gives +inf, not NaN)."""
    if x.dtype not in ir.FLOATS:
        raise UnsupportedError(
            f"ReduceLogSumExp of {x.dtype} is not supported", {f"ReduceLogSumExp {x.dtype}": 1}
        )
    m = b.reduce_max(x, axes)
    m = b.where(b.lt(b.abs(m), math.inf), m, 0)
    y = b.add(b.log(b.sum(b.exp(b.sub(x, m)), axes)), m)
    return _squeeze(b, y, axes, keepdims)


REDUCTIONS = {
    "ReduceSum": lambda b, x, axes, keep: b.sum(x, axes, keep),
    "ReduceMean": mean_over,
    "ReduceMax": _extreme(Op.RMAX),
    "ReduceMin": _extreme(Op.RMIN),
    "ReduceProd": lambda b, x, axes, keep: b.prod(x, axes, keep),
    "ReduceL1": _l1,
    "ReduceL2": _l2,
    "ReduceLogSum": _log_sum,
    "ReduceLogSumExp": log_sum_exp,
    "ReduceSumSquare": _sum_square,
}


# -- ArgMax / ArgMin ---------------------------------------------------------


def _arg(op: Op, name: str):
    def fn(
        b: Builder, x: Value, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0
    ) -> Value:
        ax = check_axis(name, axis, x.rank)
        return b.emit(
            op, [x], axis=ax, keepdims=bool(keepdims), select_last_index=bool(select_last_index)
        )

    fn.__name__ = fn.__qualname__ = name
    return fn


ArgMax = _arg(Op.ARGMAX, "ArgMax")
ArgMin = _arg(Op.ARGMIN, "ArgMin")


# -- the softmax family ------------------------------------------------------


def softmax_axes(b: Builder, op: str, x: Value, axis: int | None) -> tuple[int, ...]:
    """The axes a softmax normalises over.  Before opset 13 the input is
    coerced to 2-D at ``axis`` (default 1): every axis from ``axis`` on is one
    row.  From opset 13 it is the single ``axis`` (default -1)."""
    if b.opset < 13:
        ax = check_axis(op, 1 if axis is None else axis, x.rank, upper=x.rank + 1)
        return tuple(range(ax, x.rank))
    return (check_axis(op, -1 if axis is None else axis, x.rank),)


def Softmax(b: Builder, x: Value, *, axis: int | None = None) -> Value:
    axes = softmax_axes(b, "Softmax", x, axis)
    e = b.exp(b.sub(x, b.reduce_max(x, axes)))
    return b.div(e, b.sum(e, axes))


def LogSoftmax(b: Builder, x: Value, *, axis: int | None = None) -> Value:
    axes = softmax_axes(b, "LogSoftmax", x, axis)
    shifted = b.sub(x, b.reduce_max(x, axes))
    return b.sub(shifted, b.log(b.sum(b.exp(shifted), axes)))


def Hardmax(b: Builder, x: Value, *, axis: int | None = None) -> Value:
    """One-hot of the first maximum: ``cast(argmax(x) == iota)``."""
    axes = softmax_axes(b, "Hardmax", x, axis)
    if not axes:  # rows of one element (axis == rank before opset 13)
        return b.cast(b.eq(x, x), x.dtype)
    a0 = axes[0]
    size = math.prod(x.shape[a] for a in axes)
    rows = b.reshape(x, x.shape[:a0] + (size,) + x.shape[axes[-1] + 1 :])
    first = b.emit(Op.ARGMAX, [rows], axis=a0, keepdims=True, select_last_index=False)
    iota = b.constant(
        np.arange(size, dtype=np.int64).reshape((size,) + (1,) * (rows.rank - 1 - a0))
    )
    return b.reshape(b.cast(b.eq(first, iota), x.dtype), x.shape)


def CumSum(b: Builder, x: Value, axis: Value, *, exclusive: int = 0, reverse: int = 0) -> Value:
    """The cumulative sum along ``axis``: the CUMSUM primitive, a scan
    (``templates/scan/``).  Transformer exports use it for position ids from
    an attention mask."""
    if axis.const is None:
        raise UnsupportedError("CumSum: input 'axis' must be a constant", {"CumSum axis": 1})
    ax = int(np.asarray(axis.const).reshape(-1)[0])
    if not -x.rank <= ax < x.rank or x.rank == 0:
        raise UnsupportedError(f"CumSum: axis {ax} out of range", {"CumSum axis": 1})
    if x.dtype not in ir.DTYPES[Op.CUMSUM]:
        raise UnsupportedError(f"CumSum of {x.dtype}", {f"CumSum {x.dtype}": 1})
    return b.emit(
        Op.CUMSUM, [x], axis=ax % x.rank, exclusive=bool(exclusive), reverse=bool(reverse)
    )


OPS = {
    "CumSum": CumSum,
    **{name: _reduction(name, body) for name, body in REDUCTIONS.items()},
    "ArgMax": ArgMax,
    "ArgMin": ArgMin,
    "Softmax": Softmax,
    "LogSoftmax": LogSoftmax,
    "Hardmax": Hardmax,
}
