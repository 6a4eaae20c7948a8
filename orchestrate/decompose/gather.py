"""Gathers: Gather, GatherElements, GatherND and OneHot.

Each becomes one GATHER primitive on a (flattened) tensor, with the flat
indices computed by elementwise arithmetic on the index tensor, or for OneHot
an EQ against a constant iota and a WHERE.  Index arithmetic and the gather
fuse into whatever reads the result.  The ONNX index itself is always the
index of a GATHER (GatherElements and GatherND take each coordinate from a
constant ``arange(n)``), so it is checked against ``[-n, n)`` as onnxruntime
checks it; see ``orchestrate.ir.bounds``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from orchestrate.decompose.builder import Builder, Value
from orchestrate.decompose.layout import _axis, _invalid, _scalar_of


def _coordinate(b: Builder, idx: Value, n: int) -> Value:
    """``idx`` as an int64 coordinate in ``[0, n)``: gathered from a constant
    ``arange(n)``, which wraps negative indices as ONNX says and makes ``idx``
    the index of a GATHER, checked against ``[-n, n)`` like any
    (``orchestrate.ir.bounds``)."""
    return b.gather(b.constant(np.arange(n, dtype=np.int64)), idx, 0)


def Gather(b: Builder, x: Value, indices: Value, *, axis: int = 0) -> Value:
    return b.gather(x, indices, _axis(axis, x.rank, "Gather"))


def GatherElements(b: Builder, x: Value, indices: Value, *, axis: int = 0) -> Value:
    """``out[i, j] = x[idx[i, j], j]`` (axis 0) as one gather from flattened ``x``."""
    ax = _axis(axis, x.rank, "GatherElements")
    if indices.rank != x.rank:
        raise _invalid("GatherElements", f"indices rank {indices.rank} != data rank {x.rank}")
    strides = _strides(x.shape)
    idx = _coordinate(b, indices, x.shape[ax])
    if strides[ax] != 1:
        idx = b.mul(idx, strides[ax])
    # the flat offset of every other coordinate (constant along the gathered axis)
    offset = np.zeros([1 if k == ax else n for k, n in enumerate(indices.shape)], np.int64)
    for k, n in enumerate(indices.shape):
        if k != ax:
            offset = offset + _iota(n, k, x.rank) * strides[k]
    if offset.any():
        idx = b.add(idx, b.constant(offset))
    return b.gather(b.reshape(x, (x.type.size,)), idx, 0)


def GatherND(b: Builder, x: Value, indices: Value, *, batch_dims: int = 0) -> Value:
    """Index tuples become flat row numbers into ``x`` reshaped to (rows, *rest)."""
    bd = batch_dims
    k = indices.shape[-1] if indices.rank else 0
    if indices.rank < 1 or not 1 <= k <= x.rank - bd or indices.shape[:bd] != x.shape[:bd]:
        raise _invalid("GatherND", f"indices {indices.shape} do not fit data {x.shape}")
    dims = x.shape[bd : bd + k]
    if bd == 0 and k == 1:  # rows of x: a Gather
        return b.gather(x, b.reshape(indices, indices.shape[:-1]), 0)
    lead_shape = indices.shape[:-1]
    if len(set(dims)) == 1:  # one arange checks every coordinate
        idx = _coordinate(b, indices, dims[0])
        if k == 1:
            flat = b.reshape(idx, lead_shape)
        else:
            flat = b.sum(b.mul(idx, b.constant(np.array(_strides(dims), np.int64))), [-1], False)
    else:  # each coordinate against its own axis
        flat = None
        for j, (d, s) in enumerate(zip(dims, _strides(dims))):
            col = b.reshape(b.slice_axis(indices, -1, j, j + 1), lead_shape)
            term = _coordinate(b, col, d)
            term = term if s == 1 else b.mul(term, s)
            flat = term if flat is None else b.add(flat, term)
    inner = math.prod(dims)
    if bd:
        batch = np.arange(math.prod(x.shape[:bd]), dtype=np.int64) * inner
        lead = x.shape[:bd] + (1,) * (indices.rank - 1 - bd)
        flat = b.add(flat, b.constant(batch.reshape(lead)))
    rows = b.reshape(x, (math.prod(x.shape[: bd + k]),) + x.shape[bd + k :])
    return b.gather(rows, flat, 0)


def _iota(n: int, axis: int, rank: int) -> np.ndarray:
    """``arange(n)`` laid along ``axis`` of a rank-``rank`` array."""
    return np.arange(n, dtype=np.int64).reshape([n if i == axis else 1 for i in range(rank)])


def _strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def OneHot(b: Builder, indices: Value, depth: Value, values: Value, *, axis: int = -1):
    depth_ = int(_scalar_of(depth, "OneHot", "depth"))
    r = indices.rank
    if not -r - 1 <= axis <= r:
        raise _invalid("OneHot", f"axis {axis} is out of range for rank {r + 1}")
    ax = axis + r + 1 if axis < 0 else axis
    # an index outside [-depth, depth) matches no iota: a row of off values, as
    # ONNX says (no error, nothing read out of range)
    idx = b.cast(indices, "int64")
    idx = b.where(b.lt(idx, 0), b.add(idx, depth_), idx)
    idx = b.reshape(idx, indices.shape[:ax] + (1,) + indices.shape[ax:])
    iota = np.arange(depth_, dtype=np.int64).reshape((depth_,) + (1,) * (r - ax))
    hot = b.eq(idx, b.constant(iota))
    if values.is_const:
        off, on = (b.constant(v) for v in values.const.reshape(-1)[:2])
    else:
        flat = b.reshape(values, (2,))
        off, on = (b.reshape(b.slice_axis(flat, 0, i, i + 1), ()) for i in (0, 1))
    return b.where(hot, on, off)


OPS = {
    "Gather": Gather,
    "GatherElements": GatherElements,
    "GatherND": GatherND,
    "OneHot": OneHot,
}
