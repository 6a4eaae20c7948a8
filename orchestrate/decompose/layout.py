"""Layout and data-movement ONNX operators: reshapes, slices, pads, gathers.

Everything here becomes the layout primitives (reshape, transpose, slice,
concat, pad, expand, gather), plus a little elementwise arithmetic on index
tensors and constant masks.  Shape-like inputs (a Reshape shape, Slice starts,
Pad pads, ...) must be compile-time constants: the frontend has folded every
computation on constants, so a non-constant one is declined.  Resize lives in
resize.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from orchestrate import ir
from orchestrate.decompose.builder import Builder, Value, dims, onnx_dtype, slice_span
from orchestrate.errors import GraphError, UnsupportedError
from orchestrate.ir import type_rules

# -- helpers -------------------------------------------------------------------


def _invalid(op: str, message: str) -> UnsupportedError:
    return UnsupportedError(f"{op}: {message}", {f"{op} invalid": 1})


def _const(v: Value, op: str, what: str) -> np.ndarray:
    if v.const is None:
        raise UnsupportedError(
            f"{op}: input '{what}' must be a constant", {f"{op} non-constant {what}": 1}
        )
    return v.const


def _ints(v: Value | Sequence[int], op: str, what: str) -> list[int]:
    """An int list given as an attribute (list) or a constant input (Value);
    a value that is a formula of a range's dimensions stays one (``Value.sym``)."""
    if isinstance(v, Value):
        arr = _const(v, op, what)
        if v.sym is not None:
            return list(dims(v.sym))
        return [int(d) for d in arr.reshape(-1)]
    return list(dims(v))


def _floats(v: Value | Sequence[float], op: str, what: str) -> list[float]:
    if isinstance(v, Value):
        return [float(d) for d in _const(v, op, what).reshape(-1)]
    return [float(d) for d in v]


def _scalar_of(v: Value, op: str, what: str):
    arr = _const(v, op, what)
    if arr.size != 1:
        raise _invalid(op, f"input '{what}' must hold one value, got shape {arr.shape}")
    if v.sym is not None:  # a formula of a range's dimensions
        return v.sym[0]
    return arr.reshape(-1)[0]


def _axis(axis: int, rank: int, op: str) -> int:
    if not -rank <= axis < rank:
        raise _invalid(op, f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def _axes(axes: Sequence[int], rank: int, op: str) -> list[int]:
    out = [_axis(int(a), rank, op) for a in axes]
    if len(set(out)) != len(out):
        raise _invalid(op, f"axes {list(axes)} repeat an axis")
    return out


# -- shape and axis reshuffles --------------------------------------------------


def Identity(b: Builder, x: Value) -> Value:
    return x


def Reshape(b: Builder, x: Value, shape=None, *, allowzero: int = 0, consumed_inputs=None):
    if shape is None:
        raise _invalid("Reshape", "no target shape")
    dims = _ints(shape, "Reshape", "shape")
    size = x.type.size
    out = []
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= x.rank:
                raise _invalid("Reshape", f"0 at position {i} has no input dim to copy")
            d = x.shape[i]
        elif d < -1:
            raise _invalid("Reshape", f"dim {d} in shape {dims}")
        out.append(d)
    if out.count(-1) > 1:
        raise _invalid("Reshape", f"more than one -1 in shape {dims}")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or size % known:
            raise _invalid("Reshape", f"cannot infer the -1 in {dims} for input {x.shape}")
        out[out.index(-1)] = size // known
    if math.prod(out) != size:
        raise _invalid("Reshape", f"cannot reshape {x.shape} to {dims}")
    if size == 0 and tuple(out) != x.shape:
        # an empty result holds no data; a constant also keeps the exported
        # Reshape (no allowzero) from reading its 0 as "copy this dim"
        return b.constant(np.zeros(out, x.dtype))
    return b.reshape(x, out)


def Flatten(b: Builder, x: Value, *, axis: int = 1) -> Value:
    if not -x.rank <= axis <= x.rank:
        raise _invalid("Flatten", f"axis {axis} is out of range for rank {x.rank}")
    axis = axis + x.rank if axis < 0 else axis
    return b.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


def Squeeze(b: Builder, x: Value, axes=None) -> Value:
    axes = [] if axes is None else _ints(axes, "Squeeze", "axes")
    if not axes:  # absent or empty: every 1
        drop = [i for i, d in enumerate(x.shape) if d == 1]
    else:
        drop = _axes(axes, x.rank, "Squeeze")
        bad = [a for a in drop if x.shape[a] != 1]
        if bad:
            raise _invalid("Squeeze", f"axis {bad[0]} of {x.shape} is not 1")
    return b.reshape(x, [d for i, d in enumerate(x.shape) if i not in drop])


def Unsqueeze(b: Builder, x: Value, axes=None) -> Value:
    if axes is None:
        raise _invalid("Unsqueeze", "no axes")
    axes = _ints(axes, "Unsqueeze", "axes")
    rank = x.rank + len(axes)
    new = set(_axes(axes, rank, "Unsqueeze"))
    dims = iter(x.shape)
    return b.reshape(x, [1 if i in new else next(dims) for i in range(rank)])


def Transpose(b: Builder, x: Value, *, perm=None) -> Value:
    perm = list(range(x.rank))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(x.rank)):
        raise _invalid("Transpose", f"perm {perm} is not a permutation of rank {x.rank}")
    return b.transpose(x, perm)


def Expand(b: Builder, x: Value, shape: Value) -> Value:
    dims = _ints(shape, "Expand", "shape")
    try:
        out = type_rules.broadcast_shapes(x.shape, tuple(dims))
    except GraphError:
        raise _invalid("Expand", f"{x.shape} does not broadcast with {dims}") from None
    return b.expand(x, out)


def Tile(b: Builder, x: Value, repeats: Value, axis: Value | None = None) -> Value:
    if b.opset < 6:
        raise UnsupportedError("Tile-1 (tiles, axis inputs)", {"Tile-1": 1})
    reps = _ints(repeats, "Tile", "repeats")
    if len(reps) != x.rank or min(reps, default=0) < 0:
        raise _invalid("Tile", f"repeats {reps} do not fit rank {x.rank}")
    # x[d0, d1] -> [1, d0, 1, d1] -> expand [r0, d0, r1, d1] -> [r0*d0, r1*d1]
    split, grown = [], []
    for d, r in zip(x.shape, reps):
        if r == 1:
            split, grown = split + [d], grown + [d]
        elif d == 1:
            split, grown = split + [1], grown + [r]
        else:
            split, grown = split + [1, d], grown + [r, d]
    y = b.expand(b.reshape(x, split), grown)
    return b.reshape(y, [d * r for d, r in zip(x.shape, reps)])


def DepthToSpace(b: Builder, x: Value, *, blocksize: int, mode: str = "DCR") -> Value:
    n, c, h, w = _rank4(x, "DepthToSpace")
    k = blocksize
    if k < 1 or c % (k * k):
        raise _invalid("DepthToSpace", f"channels {c} are not a multiple of {k}^2")
    if mode == "DCR":
        y = b.transpose(b.reshape(x, (n, k, k, c // k**2, h, w)), (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        y = b.transpose(b.reshape(x, (n, c // k**2, k, k, h, w)), (0, 1, 4, 2, 5, 3))
    else:
        raise UnsupportedError(f"DepthToSpace mode={mode!r}", {"DepthToSpace.mode": 1})
    return b.reshape(y, (n, c // k**2, h * k, w * k))


def SpaceToDepth(b: Builder, x: Value, *, blocksize: int, mode: str = "DCR") -> Value:
    n, c, h, w = _rank4(x, "SpaceToDepth")
    k = blocksize
    if k < 1 or h % k or w % k:
        raise _invalid("SpaceToDepth", f"spatial dims {h}x{w} are not multiples of {k}")
    if mode not in ("DCR", "CRD"):
        raise UnsupportedError(f"SpaceToDepth mode={mode!r}", {"SpaceToDepth.mode": 1})
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    y = b.transpose(b.reshape(x, (n, c, h // k, k, w // k, k)), perm)
    return b.reshape(y, (n, c * k * k, h // k, w // k))


def _rank4(x: Value, op: str) -> tuple[int, ...]:
    if x.rank != 4:
        raise _invalid(op, f"input must be 4-D, got {x.shape}")
    return x.shape


# -- slicing, joining, padding --------------------------------------------------


def Slice(b: Builder, x: Value, starts=None, ends=None, axes=None, steps=None) -> Value:
    if starts is None or ends is None:
        raise _invalid("Slice", "starts and ends are required")
    starts, ends = _ints(starts, "Slice", "starts"), _ints(ends, "Slice", "ends")
    n = len(starts)
    axes = list(range(n)) if axes is None else _ints(axes, "Slice", "axes")
    steps = [1] * n if steps is None else _ints(steps, "Slice", "steps")
    if not len(ends) == len(axes) == len(steps) == n:
        raise _invalid("Slice", "starts, ends, axes and steps differ in length")
    begin, step, shape = [0] * x.rank, [1] * x.rank, list(x.shape)
    for a, s, e, st in zip(_axes(axes, x.rank, "Slice"), starts, ends, steps):
        if st == 0:
            raise _invalid("Slice", "step 0")
        first, count = slice_range(x.shape[a], s, e, st)
        begin[a], step[a], shape[a] = first, st, count
    return b.slice(x, begin, step, shape)


def slice_range(dim: int, start: int, end: int, step: int) -> tuple[int, int]:
    """(first index, count) of ONNX ``Slice(start, end, step)`` over ``dim``.

    Negative start/end count from the back; then, as the spec says, both are
    clamped to [0, dim] for a positive step and to [0, dim-1] / [-1, dim-1]
    for a negative one (INT64_MAX / INT64_MIN mean "to the end" this way):
    Python's slice semantics, so ``slice_span``'s, which keeps an end that is
    a formula of a range's dimensions (a cache read up to ``past``) one.
    """
    return slice_span(start, end, step, dim)


def Concat(b: Builder, *xs: Value, axis: int | None = None) -> Value:
    if axis is None:
        if b.opset >= 4:
            raise _invalid("Concat", "attribute 'axis' is required")
        axis = 1
    if not xs or xs[0].rank == 0:
        raise _invalid("Concat", "needs inputs of rank >= 1")
    ax = _axis(axis, xs[0].rank, "Concat")
    for v in xs[1:]:
        off = [d for i, d in enumerate(v.shape) if i != ax]
        if v.rank != xs[0].rank or off != [d for i, d in enumerate(xs[0].shape) if i != ax]:
            raise _invalid("Concat", f"shapes {xs[0].shape} and {v.shape} differ off axis {ax}")
    return b.concat(list(xs), ax)


def Split(b: Builder, x: Value, split=None, *, axis: int = 0, num_outputs: int | None = None):
    ax = _axis(axis, x.rank, "Split")
    dim = x.shape[ax]
    sizes = _ints(split, "Split", "split") if split is not None else []
    if not sizes:
        n = num_outputs if num_outputs is not None else b.n_outputs
        if not n or n < 1:
            raise _invalid("Split", "cannot tell how many outputs to split into")
        chunk = -(-dim // n)  # the last chunk is the smaller one when dim % n != 0
        sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
    if sum(sizes) != dim or min(sizes) < 0:
        raise _invalid("Split", f"sizes {sizes} do not split axis {ax} of length {dim}")
    outs, pos = [], 0
    for s in sizes:
        outs.append(b.slice_axis(x, ax, pos, pos + s))
        pos += s
    return tuple(outs)


def Pad(
    b: Builder,
    x: Value,
    pads=None,
    constant_value: Value | None = None,
    axes=None,
    *,
    mode: str = "constant",
    value: float = 0.0,
    paddings=None,
) -> Value:
    if b.opset < 2:
        pads = paddings
    if pads is None:
        raise _invalid("Pad", "no pads")
    pads = _ints(pads, "Pad", "pads")
    r = x.rank
    axes = list(range(r)) if axes is None else _axes(_ints(axes, "Pad", "axes"), r, "Pad")
    if len(pads) != 2 * len(axes):
        raise _invalid("Pad", f"{len(pads)} pads for {len(axes)} axes")
    before, after = [0] * r, [0] * r
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[len(axes) + i]
    # negative pads crop first (as onnxruntime does), then the rest pads
    if any(p < 0 for p in before + after):
        starts = [max(-p, 0) for p in before]
        shape = [d - s - max(-p, 0) for d, s, p in zip(x.shape, starts, after)]
        if min(shape, default=0) < 0:
            raise _invalid("Pad", f"pads {pads} crop more than {x.shape}")
        x = b.slice(x, starts, [1] * r, shape)
        before, after = [max(p, 0) for p in before], [max(p, 0) for p in after]
    if mode == "constant":
        if b.opset >= 11:
            fill = 0 if constant_value is None else constant_value
        else:
            fill = value
        return _pad_constant(b, x, before + after, fill)
    if mode in ("reflect", "edge"):
        if any(d == 0 for d, p, q in zip(x.shape, before, after) if p or q):
            raise _invalid("Pad", f"mode {mode} cannot pad an empty axis")
        if mode == "reflect" and any(
            max(p, q) >= d for d, p, q in zip(x.shape, before, after) if p or q
        ):
            raise _invalid("Pad", f"reflect pads {pads} reach past the edge of {x.shape}")
        return b.pad(x, before + after, mode)
    if mode == "wrap":
        for a in range(r):
            x = _wrap_axis(b, x, a, before[a], after[a])
        return x
    raise UnsupportedError(f"Pad mode={mode!r}", {f"Pad mode {mode}": 1})


def _pad_constant(b: Builder, x: Value, pads: list[int], fill) -> Value:
    if isinstance(fill, Value):
        if fill.const is not None and fill.const.size == 1:
            fill = fill.const.reshape(-1)[0]
        elif fill.const is not None and fill.const.size == 0:
            fill = 0
    if not isinstance(fill, Value):
        v = np.asarray(fill).astype(x.dtype)
        if float(v) == v:  # the PAD primitive carries its value as a float
            return b.pad(x, pads, "constant", float(v))
        fill = b.constant(v)
    if fill.rank:
        fill = b.reshape(fill, ())
    # pad with 0, then put the value where a constant mask of the input is False
    r = x.rank
    widths = [(pads[i], pads[i + r]) for i in range(r)]
    core = [d if any(w) else 1 for d, w in zip(x.shape, widths)]
    inside = np.pad(np.ones(core, bool), widths, constant_values=False)
    return b.where(b.constant(inside), b.pad(x, pads, "constant", 0.0), b.cast(fill, x.dtype))


def _wrap_axis(b: Builder, x: Value, axis: int, before: int, after: int) -> Value:
    """Wrap-pad one axis: the output is the axis repeated cyclically."""
    d = x.shape[axis]
    if not before and not after:
        return x
    if d == 0:
        raise _invalid("Pad", "mode wrap cannot pad an empty axis")
    if before <= d and after <= d:
        head = b.slice_axis(x, axis, d - before, d)
        tail = b.slice_axis(x, axis, 0, after)
        return b.concat([head, x, tail], axis)
    start = (-before) % d
    copies = -(-(start + before + d + after) // d)
    tiled = b.concat([x] * copies, axis)
    return b.slice_axis(tiled, axis, start, start + before + d + after)


# -- constants and masks -------------------------------------------------------


def Shape(b: Builder, x: Value, *, start: int = 0, end: int | None = None) -> Value:
    r = x.rank

    def clamp(v: int) -> int:
        return min(max(v + r if v < 0 else v, 0), r)

    lo, hi = clamp(start), (r if end is None else clamp(end))
    return b.constant(np.array(x.shape[lo:hi], dtype=np.int64))


def Size(b: Builder, x: Value) -> Value:
    return b.constant(np.array(x.type.size, dtype=np.int64))


def Constant(
    b: Builder,
    *,
    value=None,
    value_float=None,
    value_floats=None,
    value_int=None,
    value_ints=None,
    value_string=None,
    value_strings=None,
    sparse_value=None,
) -> Value:
    if value is not None:
        arr = np.asarray(value)
    elif value_float is not None:
        arr = np.array(value_float, np.float32)
    elif value_floats is not None:
        arr = np.array(value_floats, np.float32)
    elif value_int is not None:
        arr = np.array(value_int, np.int64)
    elif value_ints is not None:
        arr = np.array(value_ints, np.int64)
    else:
        kind = "sparse_value" if sparse_value is not None else "value_string(s)"
        raise UnsupportedError(f"Constant {kind}", {f"Constant.{kind}": 1})
    if arr.dtype.name not in ir.ALL_DTYPES:
        raise UnsupportedError(f"Constant of dtype {arr.dtype.name}", {f"dtype {arr.dtype}": 1})
    return b.constant(arr)


def ConstantOfShape(b: Builder, shape: Value, *, value=None) -> Value:
    dims = _ints(shape, "ConstantOfShape", "input")
    if min(dims, default=0) < 0:
        raise _invalid("ConstantOfShape", f"negative dim in {dims}")
    fill = np.zeros((), np.float32) if value is None else np.asarray(value).reshape(-1)[0]
    if fill.dtype.name not in ir.ALL_DTYPES:
        raise UnsupportedError(f"ConstantOfShape of {fill.dtype}", {f"dtype {fill.dtype}": 1})
    return b.expand(b.constant(fill), dims)


def Range(b: Builder, start: Value, limit: Value, delta: Value) -> Value:
    s, lim, d = (
        _scalar_of(v, "Range", n) for v, n in ((start, "start"), (limit, "limit"), (delta, "delta"))
    )
    if d == 0:
        raise _invalid("Range", "delta 0")
    if start.dtype in ir.INTS:
        out = np.arange(int(s), int(lim), int(d), dtype=np.int64).astype(start.dtype)
    else:
        n = max(math.ceil((float(lim) - float(s)) / float(d)), 0)
        out = (float(s) + np.arange(n) * float(d)).astype(start.dtype)
    return b.constant(out)


def EyeLike(b: Builder, x: Value, *, dtype: int | None = None, k: int = 0) -> Value:
    if x.rank != 2:
        raise _invalid("EyeLike", f"input must be 2-D, got {x.shape}")
    out = x.dtype if dtype is None else onnx_dtype(dtype)
    return b.constant(np.eye(*x.shape, k=k, dtype=out))


def Trilu(b: Builder, x: Value, k: Value | None = None, *, upper: int = 1) -> Value:
    kk = 0 if k is None else int(_scalar_of(k, "Trilu", "k"))
    if x.rank < 2:
        raise _invalid("Trilu", f"input must be at least 2-D, got {x.shape}")
    n, m = x.shape[-2:]
    diag = np.arange(m)[None, :] - np.arange(n)[:, None]
    keep = diag >= kk if upper else diag <= kk
    if keep.all():
        return x
    return b.where(b.constant(keep), x, b.scalar(0, x))


def Dropout(
    b: Builder,
    x: Value,
    ratio=None,
    training_mode: Value | None = None,
    *,
    seed=None,
    is_test=None,
    consumed_inputs=None,
):
    """Inference: ``x`` itself, and a mask that keeps everything."""
    training = training_mode is not None and bool(
        _scalar_of(training_mode, "Dropout", "training_mode")
    )
    if training and (ratio is None or float(_scalar_of(ratio, "Dropout", "ratio")) != 0):
        # random; only a ratio of exactly 0 keeps training-mode Dropout deterministic
        raise UnsupportedError("Dropout training_mode=1", {"Dropout training_mode": 1})
    if b.opset < 12:  # onnxruntime gives this older mask as all 0 / False, the spec as all 1
        return x, None
    return x, b.expand(b.constant(np.ones((), bool)), x.shape)


OPS = {
    "Identity": Identity,
    "Reshape": Reshape,
    "Flatten": Flatten,
    "Squeeze": Squeeze,
    "Unsqueeze": Unsqueeze,
    "Transpose": Transpose,
    "Expand": Expand,
    "Tile": Tile,
    "DepthToSpace": DepthToSpace,
    "SpaceToDepth": SpaceToDepth,
    "Slice": Slice,
    "Concat": Concat,
    "Split": Split,
    "Pad": Pad,
    "Shape": Shape,
    "Size": Size,
    "Constant": Constant,
    "ConstantOfShape": ConstantOfShape,
    "Range": Range,
    "EyeLike": EyeLike,
    "Trilu": Trilu,
    "Dropout": Dropout,
}
