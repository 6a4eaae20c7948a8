"""A numpy executor of the primitive IR: the semantic ground truth.

``run(graph, inputs)`` evaluates every node in order.  With ``float64=True``
every floating-point value is carried in float64 (casts to a float type keep
float64), which gives an almost exact answer to compare kernels against.

Each primitive is one small numpy function in ``IMPLS``; together they define
what the primitives mean.  Integer semantics follow ONNX (division truncates,
``mod`` takes the divisor's sign unless ``fmod``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from orchestrate.errors import InputError
from orchestrate.ir import FLOATS, HALF, Attrs, Graph, Node, Op


def run(
    graph: Graph, inputs: Mapping[str, np.ndarray], *, float64: bool = False
) -> dict[str, np.ndarray]:
    """Evaluate ``graph`` on ``inputs``; return its outputs by name."""
    env: dict[str, np.ndarray] = {}
    for i in graph.inputs:
        if i.name not in inputs:
            raise InputError(f"missing input {i.name!r}")
        arr = np.asarray(inputs[i.name])
        if tuple(arr.shape) != i.type.shape:
            raise InputError(f"input {i.name!r} has shape {arr.shape}, expected {i.type.shape}")
        env[i.name] = _widen(arr.astype(i.type.dtype, copy=False), float64)
    for name, arr in graph.constants.items():
        env[name] = _widen(arr, float64)
    with np.errstate(all="ignore"):
        for n in graph.nodes:
            env[n.name] = evaluate(n, [env[i] for i in n.inputs], float64=float64)
    return {o: env[o] for o in graph.outputs}


def evaluate(node: Node, args: list[np.ndarray], *, float64: bool = False) -> np.ndarray:
    """Evaluate one primitive on numpy arrays."""
    dtype = np.dtype("float64" if float64 and node.dtype in FLOATS else node.dtype)
    attrs = node.attrs
    if node.op is Op.CAST and float64 and attrs["to"] in FLOATS:
        attrs = Attrs(attrs, to="float64")
    with np.errstate(all="ignore"):
        out = np.asarray(IMPLS[node.op](attrs, *args))
    return out.astype(dtype, copy=False)


def _widen(arr: np.ndarray, float64: bool) -> np.ndarray:
    return arr.astype(np.float64) if float64 and arr.dtype.name in FLOATS else arr


def _half(x: np.ndarray) -> bool:
    """Whether ``x`` holds 2-byte floats (float16, or ml_dtypes' bfloat16)."""
    return x.dtype.name in HALF


def _acc(x: np.ndarray) -> Any:
    """Accumulator dtype: float16 and bfloat16 sums and products run in float32."""
    return np.float32 if _half(x) else None


def _div(_a: Attrs, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "iu":
        safe = np.where(y == 0, 1, y)
        q = np.floor_divide(x, safe)
        # C semantics: truncate toward zero.
        fix = (np.remainder(x, safe) != 0) & ((x < 0) != (safe < 0))
        return np.where(y == 0, 0, q + fix.astype(q.dtype))
    return np.divide(x, y)


def _pow(_a: Attrs, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "iu":
        return np.power(x.astype(np.float64), y.astype(np.float64)).astype(x.dtype)
    return np.power(x, y)


def _mod(a: Attrs, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "iu":
        safe = np.where(y == 0, 1, y)
        r = np.fmod(x, safe) if a["fmod"] else np.mod(x, safe)
        return np.where(y == 0, 0, r)
    return np.fmod(x, y) if a["fmod"] else np.mod(x, y)


def _erf(_a: Attrs, x: np.ndarray) -> np.ndarray:
    from math import erf

    return np.vectorize(erf, otypes=[np.float64])(x.astype(np.float64))


def _sigmoid(_a: Attrs, x: np.ndarray) -> np.ndarray:
    xf = x.astype(np.float64) if _half(x) else x
    e = np.exp(-np.abs(xf))
    return np.where(xf >= 0, 1 / (1 + e), e / (1 + e))


def _neutral(x: np.ndarray, largest: bool) -> Any:
    if x.dtype.name in FLOATS:
        return -np.inf if largest else np.inf
    info = np.iinfo(x.dtype)
    return info.min if largest else info.max


def _reduce(fn: Callable, *, neutral: str | None = None) -> Callable:
    def impl(a: Attrs, x: np.ndarray) -> np.ndarray:
        kw: dict[str, Any] = {"axis": a["axes"], "keepdims": a["keepdims"]}
        if neutral is not None:
            kw["initial"] = _neutral(x, neutral == "max")
        elif _acc(x) is not None:
            kw["dtype"] = _acc(x)
        return fn(x, **kw)

    return impl


def _cumsum(a: Attrs, x: np.ndarray) -> np.ndarray:
    """The cumulative sum along ``axis``: reverse sums from the end; exclusive
    leaves out each element's own value (the first sum is 0)."""
    ax = a["axis"]
    y = np.flip(x, ax) if a["reverse"] else x
    total = np.cumsum(y, axis=ax, dtype=_acc(x))
    if a["exclusive"]:
        total = np.concatenate(
            [np.zeros_like(np.take(total, [0], axis=ax)), np.delete(total, -1, axis=ax)], axis=ax
        )
    return np.flip(total, ax) if a["reverse"] else total


def _arg(fn: Callable) -> Callable:
    def impl(a: Attrs, x: np.ndarray) -> np.ndarray:
        ax = a["axis"]
        if a["select_last_index"]:
            flipped = np.flip(x, ax)
            r = x.shape[ax] - 1 - fn(flipped, axis=ax)
        else:
            r = fn(x, axis=ax)
        r = r.astype(np.int64)
        return np.expand_dims(r, ax) if a["keepdims"] else r

    return impl


def _slice(a: Attrs, x: np.ndarray) -> np.ndarray:
    index = []
    for start, step, count in zip(a["starts"], a["steps"], a["shape"]):
        end = start + count * step
        index.append(slice(start, None if end < 0 else end, step))
    return x[tuple(index)]


def _pad(a: Attrs, x: np.ndarray) -> np.ndarray:
    r = x.ndim
    widths = [(a["pads"][i], a["pads"][i + r]) for i in range(r)]
    if a["mode"] == "constant":
        return np.pad(x, widths, mode="constant", constant_values=a["value"])
    return np.pad(x, widths, mode=a["mode"])


def _matmul(_a: Attrs, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if _half(x):
        return np.matmul(x.astype(np.float32), y.astype(np.float32))
    return np.matmul(x, y)


def _windows(x: np.ndarray, a: Attrs, kernel: tuple[int, ...], fill: Any):
    """Yield (kernel offset, strided view of the padded input) per kernel position."""
    n = x.ndim - 2
    pads, strides, dil = a["pads"], a["strides"], a["dilations"]
    xp = np.pad(
        x, [(0, 0), (0, 0)] + [(pads[i], pads[i + n]) for i in range(n)], constant_values=fill
    )
    out = [(xp.shape[2 + i] - ((kernel[i] - 1) * dil[i] + 1)) // strides[i] + 1 for i in range(n)]
    for offset in np.ndindex(*kernel):
        idx = tuple(
            slice(
                offset[i] * dil[i], offset[i] * dil[i] + (out[i] - 1) * strides[i] + 1, strides[i]
            )
            for i in range(n)
        )
        yield offset, xp[(slice(None), slice(None)) + idx]


def _conv(a: Attrs, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    acc = np.float32 if _half(x) else x.dtype
    x, w = x.astype(acc), w.astype(acc)
    g = a["group"]
    cg, mg = w.shape[1], w.shape[0] // g
    n = x.ndim - 2
    out = None  # accumulated as (G, N * spatial, Mg): one BLAS matmul per kernel offset
    for offset, win in _windows(x, a, w.shape[2:], 0):
        spatial = win.shape[2:]
        # (N, G, Cg, *spatial) -> (G, N * spatial, Cg) @ (G, Cg, Mg)
        xs = np.moveaxis(win.reshape(win.shape[0], g, cg, *spatial), (1, 2), (0, n + 2))
        xs = xs.reshape(g, -1, cg)
        ws = w[(slice(None), slice(None)) + offset].reshape(g, mg, cg).transpose(0, 2, 1)
        term = np.matmul(xs, ws)
        out = term if out is None else out + term
    out = out.reshape(g, x.shape[0], *spatial, mg)
    out = np.moveaxis(out, 0, -2).reshape(x.shape[0], *spatial, g * mg)
    return np.moveaxis(out, -1, 1)


def _pool(a: Attrs, x: np.ndarray) -> np.ndarray:
    kernel = a["kernel"]
    if a["kind"] == "max":
        out = None
        for _, win in _windows(x, a, kernel, _neutral(x, True)):
            out = win.copy() if out is None else np.maximum(out, win)
        return out
    acc = np.float32 if _half(x) else x.dtype
    total = None
    for _, win in _windows(x.astype(acc), a, kernel, 0):
        total = win.copy() if total is None else total + win
    return total / np.prod(kernel)


def _unary(fn: Callable) -> Callable:
    return lambda _a, x: fn(x)


def _binary(fn: Callable) -> Callable:
    return lambda _a, x, y: fn(x, y)


IMPLS: dict[Op, Callable[..., np.ndarray]] = {
    Op.EXP: _unary(np.exp),
    Op.LOG: _unary(np.log),
    Op.SQRT: _unary(np.sqrt),
    Op.RECIP: _unary(np.reciprocal),
    Op.TANH: _unary(np.tanh),
    Op.ERF: _erf,
    Op.SIGMOID: _sigmoid,
    Op.NEG: _unary(np.negative),
    Op.ABS: _unary(np.abs),
    Op.SIGN: _unary(np.sign),
    Op.FLOOR: _unary(np.floor),
    Op.CEIL: _unary(np.ceil),
    Op.ROUND: _unary(np.round),
    Op.SIN: _unary(np.sin),
    Op.COS: _unary(np.cos),
    Op.NOT: _unary(np.logical_not),
    Op.ISNAN: _unary(np.isnan),
    Op.ISINF: _unary(np.isinf),
    Op.CAST: lambda a, x: x.astype(a["to"]),
    Op.ADD: _binary(np.add),
    Op.SUB: _binary(np.subtract),
    Op.MUL: _binary(np.multiply),
    Op.DIV: _div,
    Op.POW: _pow,
    Op.MAX: _binary(np.maximum),
    Op.MIN: _binary(np.minimum),
    Op.MOD: _mod,
    Op.EQ: _binary(np.equal),
    Op.LT: _binary(np.less),
    Op.LE: _binary(np.less_equal),
    Op.AND: _binary(np.logical_and),
    Op.OR: _binary(np.logical_or),
    Op.XOR: _binary(np.logical_xor),
    Op.WHERE: lambda _a, c, x, y: np.where(c, x, y),
    Op.SUM: _reduce(np.sum),
    Op.PROD: _reduce(np.prod),
    Op.RMAX: _reduce(np.max, neutral="max"),
    Op.RMIN: _reduce(np.min, neutral="min"),
    Op.ARGMAX: _arg(np.argmax),
    Op.ARGMIN: _arg(np.argmin),
    Op.CUMSUM: _cumsum,
    Op.TRANSPOSE: lambda a, x: np.transpose(x, a["perm"]),
    Op.RESHAPE: lambda a, x: np.reshape(x, a["shape"]),
    Op.SLICE: _slice,
    Op.CONCAT: lambda a, *xs: np.concatenate(xs, axis=a["axis"]),
    Op.PAD: _pad,
    Op.EXPAND: lambda a, x: np.broadcast_to(x, a["shape"]).copy(),
    Op.GATHER: lambda a, x, i: np.take(x, i, axis=a["axis"]),
    Op.IDENTITY: lambda _a, x: x.copy(),
    Op.MATMUL: _matmul,
    Op.CONV: _conv,
    Op.POOL: _pool,
}
