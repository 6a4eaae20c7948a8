"""Gathers: Gather, GatherElements, GatherND and OneHot.

Each becomes one GATHER primitive on a (flattened) tensor, with the flat
indices computed by elementwise arithmetic on the index tensor (negative
indices wrapped as ONNX says), or for OneHot an EQ against a constant iota and
a WHERE.  Index arithmetic and the gather fuse into whatever reads the result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from orchestrate.decompose.builder import Builder, Value
from orchestrate.decompose.layout import _axis, _invalid, _scalar_of


def _wrap_negative(b: Builder, idx: Value, dims) -> Value:
    """``idx + dims`` where ``idx < 0`` (ONNX's negative indices), in int64."""
    idx = b.cast(idx, "int64")
    dims = b.constant(np.asarray(dims, dtype=np.int64))
    return b.where(b.lt(idx, 0), b.add(idx, dims), idx)


def Gather(b: Builder, x: Value, indices: Value, *, axis: int = 0) -> Value:
    return b.gather(x, indices, _axis(axis, x.rank, "Gather"))


def GatherElements(b: Builder, x: Value, indices: Value, *, axis: int = 0) -> Value:
    """``out[i, j] = x[idx[i, j], j]`` (axis 0) as one gather from flattened ``x``."""
    ax = _axis(axis, x.rank, "GatherElements")
    if indices.rank != x.rank:
        raise _invalid("GatherElements", f"indices rank {indices.rank} != data rank {x.rank}")
    strides = _strides(x.shape)
    idx = _wrap_negative(b, indices, x.shape[ax])
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
    idx = _wrap_negative(b, indices, dims)
    if k == 1:
        flat = b.reshape(idx, indices.shape[:-1])
    else:
        flat = b.sum(b.mul(idx, b.constant(np.array(_strides(dims), np.int64))), [-1], False)
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
    idx = _wrap_negative(b, indices, depth_)
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
    "Gather": Gather, "GatherElements": GatherElements, "GatherND": GatherND, "OneHot": OneHot,
}  # fmt: skip
