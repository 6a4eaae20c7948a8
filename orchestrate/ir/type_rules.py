"""The type rule of every primitive, and the graph validity check.

``infer(op, input types, attrs)`` is the one place that says what a
primitive accepts and produces; the builder, the validator and the tests all
use it.  ``validate(graph)`` re-derives every node's type.
"""

from __future__ import annotations

import math

from orchestrate.errors import GraphError, UnsupportedError
from orchestrate.ir import (
    BINARY,
    COMPARE,
    DTYPES,
    REDUCE,
    UNARY,
    Attrs,
    Graph,
    Op,
    TensorType,
)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for ax in range(rank):
        dims = {s[ax - rank + len(s)] for s in shapes if ax - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise GraphError(f"shapes {' and '.join(map(str, shapes))} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def window_out(size: int, k: int, stride: int, pad: int, dilation: int) -> int:
    """Output length of a sliding window (conv / pool) along one axis."""
    return (size + pad - ((k - 1) * dilation + 1)) // stride + 1


def infer(op: Op, ins: tuple[TensorType, ...], attrs: Attrs) -> TensorType:
    """The output type of ``op`` applied to inputs of types ``ins``.

    Raises :class:`GraphError` when the inputs or attributes do not fit the
    primitive, and :class:`UnsupportedError` when the dtype is not one the
    primitive is defined for.
    """
    arity = _ARITY.get(op)
    if arity is not None and len(ins) != arity:
        raise GraphError(f"{op.value} takes {arity} inputs, got {len(ins)}")
    decider = ins[1] if op is Op.WHERE else ins[0]
    if decider.dtype not in DTYPES[op]:
        raise UnsupportedError(f"primitive {op.value} is not defined for dtype {decider.dtype}")
    if op in UNARY:
        if op is Op.CAST:
            return TensorType(ins[0].shape, attrs["to"])
        if op in (Op.NOT, Op.ISNAN, Op.ISINF):
            return TensorType(ins[0].shape, "bool")
        return ins[0]
    if op in BINARY:
        a, b = ins
        if a.dtype != b.dtype:
            raise GraphError(f"{op.value}: dtypes {a.dtype} and {b.dtype} differ")
        shape = broadcast_shapes(a.shape, b.shape)
        return TensorType(shape, "bool" if op in COMPARE else a.dtype)
    if op is Op.WHERE:
        c, a, b = ins
        if c.dtype != "bool" or a.dtype != b.dtype:
            raise GraphError(f"where: needs (bool, T, T), got {c.dtype}, {a.dtype}, {b.dtype}")
        return TensorType(broadcast_shapes(c.shape, a.shape, b.shape), a.dtype)
    if op in REDUCE:
        return _infer_reduce(op, ins[0], attrs)
    return _INFER_OTHER[op](ins, attrs)


_ARITY = {
    **{op: 1 for op in UNARY},
    **{op: 2 for op in BINARY},
    Op.WHERE: 3,
    **{op: 1 for op in REDUCE},
    Op.TRANSPOSE: 1,
    Op.RESHAPE: 1,
    Op.SLICE: 1,
    Op.PAD: 1,
    Op.EXPAND: 1,
    Op.IDENTITY: 1,
    Op.GATHER: 2,
    Op.MATMUL: 2,
    Op.CONV: 2,
    Op.POOL: 1,
    Op.CUMSUM: 1,
}


def _axes_ok(axes: tuple[int, ...], rank: int, what: str) -> None:
    if list(axes) != sorted(set(axes)) or any(not 0 <= a < rank for a in axes):
        raise GraphError(f"{what}: axes {axes} must be sorted, unique and in [0, {rank})")


def _infer_reduce(op: Op, x: TensorType, attrs: Attrs) -> TensorType:
    if op in (Op.ARGMAX, Op.ARGMIN):
        axes = (attrs["axis"],)
    else:
        axes = attrs["axes"]
        if not axes:
            raise GraphError(f"{op.value}: axes must not be empty")
    _axes_ok(axes, x.rank, op.value)
    keep = attrs["keepdims"]
    shape = tuple((1 if keep else None) if i in axes else d for i, d in enumerate(x.shape))
    shape = tuple(d for d in shape if d is not None)
    return TensorType(shape, "int64" if op in (Op.ARGMAX, Op.ARGMIN) else x.dtype)


def _infer_cumsum(ins, attrs):
    (x,) = ins
    if not 0 <= attrs["axis"] < x.rank:
        raise GraphError(f"cumsum: axis {attrs['axis']} out of range for rank {x.rank}")
    return x


def _infer_transpose(ins, attrs):
    (x,) = ins
    perm = attrs["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise GraphError(f"transpose: perm {perm} is not a permutation of rank {x.rank}")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _infer_reshape(ins, attrs):
    (x,) = ins
    shape = attrs["shape"]
    if any(d < 0 for d in shape) or math.prod(shape) != x.size:
        raise GraphError(f"reshape: cannot reshape {x.shape} to {shape}")
    return TensorType(tuple(shape), x.dtype)


def _check_slice(dim: int, start: int, step: int, count: int) -> None:
    last = start + (count - 1) * step
    if count and not (0 <= start < dim and 0 <= last < dim):
        raise GraphError(f"slice: start {start} step {step} count {count} leaves [0, {dim})")


def _infer_slice(ins, attrs):
    (x,) = ins
    starts, steps, shape = attrs["starts"], attrs["steps"], attrs["shape"]
    if not len(starts) == len(steps) == len(shape) == x.rank:
        raise GraphError("slice: starts, steps and shape must cover every axis")
    for d, s, st, c in zip(x.shape, starts, steps, shape):
        if st == 0:
            raise GraphError("slice: step 0")
        _check_slice(d, s, st, c)
    return TensorType(tuple(shape), x.dtype)


def _infer_concat(ins, attrs):
    ax = attrs["axis"]
    first = ins[0]
    if not 0 <= ax < first.rank:
        raise GraphError(f"concat: axis {ax} out of range for rank {first.rank}")
    for t in ins[1:]:
        same = all(a == b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != ax)
        if t.rank != first.rank or t.dtype != first.dtype or not same:
            raise GraphError(f"concat: {t} does not match {first} off axis {ax}")
    shape = list(first.shape)
    shape[ax] = sum(t.shape[ax] for t in ins)
    return TensorType(tuple(shape), first.dtype)


def _infer_pad(ins, attrs):
    (x,) = ins
    pads = attrs["pads"]
    if len(pads) != 2 * x.rank or any(p < 0 for p in pads):
        raise GraphError(f"pad: pads {pads} must be 2*rank non-negative ints")
    if attrs["mode"] not in ("constant", "reflect", "edge"):
        raise GraphError(f"pad: unknown mode {attrs['mode']}")
    r = x.rank
    shape = tuple(d + pads[i] + pads[i + r] for i, d in enumerate(x.shape))
    return TensorType(shape, x.dtype)


def _infer_expand(ins, attrs):
    (x,) = ins
    shape = attrs["shape"]
    if len(shape) != x.rank or any(d not in (1, s) for d, s in zip(x.shape, shape)):
        raise GraphError(f"expand: {x.shape} does not expand to {shape}")
    return TensorType(tuple(shape), x.dtype)


def _infer_gather(ins, attrs):
    data, idx = ins
    ax = attrs["axis"]
    if idx.dtype not in ("int32", "int64"):
        raise GraphError(f"gather: indices must be int32/int64, got {idx.dtype}")
    if not 0 <= ax < data.rank:
        raise GraphError(f"gather: axis {ax} out of range")
    return TensorType(data.shape[:ax] + idx.shape + data.shape[ax + 1 :], data.dtype)


def _infer_identity(ins, attrs):
    return ins[0]


def _infer_matmul(ins, attrs):
    a, b = ins
    if a.rank < 2 or b.rank < 2:
        raise GraphError(f"matmul: operands must be at least 2-D, got {a.shape} and {b.shape}")
    if a.dtype != b.dtype:
        raise GraphError(f"matmul: dtypes {a.dtype} and {b.dtype} differ")
    if a.shape[-1] != b.shape[-2]:
        raise GraphError(f"matmul: inner dimensions of {a.shape} and {b.shape} differ")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return TensorType(batch + (a.shape[-2], b.shape[-1]), a.dtype)


def _window_attrs(x: TensorType, attrs: Attrs, kernel: tuple[int, ...], what: str):
    n = x.rank - 2
    strides, pads, dil = attrs["strides"], attrs["pads"], attrs["dilations"]
    if n < 1 or len(kernel) != n or len(strides) != n or len(dil) != n or len(pads) != 2 * n:
        raise GraphError(f"{what}: attributes do not match {n} spatial dims")
    if min(strides + dil) < 1 or min(pads) < 0:
        raise GraphError(f"{what}: strides/dilations must be >= 1 and pads >= 0")
    out = tuple(
        window_out(x.shape[2 + i], kernel[i], strides[i], pads[i] + pads[i + n], dil[i])
        for i in range(n)
    )
    if min(out) < 1:
        raise GraphError(f"{what}: window larger than padded input {x.shape}")
    return out


def _infer_conv(ins, attrs):
    x, w = ins
    g = attrs["group"]
    if x.dtype != w.dtype or w.rank != x.rank:
        raise GraphError(f"conv: input {x} and weight {w} do not match")
    if x.shape[1] != w.shape[1] * g or w.shape[0] % g:
        raise GraphError(f"conv: channels of {x.shape} and {w.shape} do not fit group {g}")
    out = _window_attrs(x, attrs, w.shape[2:], "conv")
    return TensorType((x.shape[0], w.shape[0]) + out, x.dtype)


def _infer_pool(ins, attrs):
    (x,) = ins
    if attrs["kind"] not in ("max", "avg"):
        raise GraphError(f"pool: unknown kind {attrs['kind']}")
    out = _window_attrs(x, attrs, attrs["kernel"], "pool")
    return TensorType(x.shape[:2] + out, x.dtype)


_INFER_OTHER = {
    Op.CUMSUM: _infer_cumsum,
    Op.TRANSPOSE: _infer_transpose,
    Op.RESHAPE: _infer_reshape,
    Op.SLICE: _infer_slice,
    Op.CONCAT: _infer_concat,
    Op.PAD: _infer_pad,
    Op.EXPAND: _infer_expand,
    Op.GATHER: _infer_gather,
    Op.IDENTITY: _infer_identity,
    Op.MATMUL: _infer_matmul,
    Op.CONV: _infer_conv,
    Op.POOL: _infer_pool,
}


# ---------------------------------------------------------------------------
# validity


def validate(graph: Graph) -> Graph:
    """Check that ``graph`` is well formed; return it unchanged or raise GraphError.

    Well formed: names are unique; every node reads only inputs, constants or
    earlier nodes; every node's type is what :func:`infer` derives; every
    output exists.
    """
    known: dict[str, TensorType] = {}
    for i in graph.inputs:
        if i.name in known:
            raise GraphError(f"duplicate input name {i.name!r}")
        known[i.name] = i.type
    for name in graph.constants:
        if name in known:
            raise GraphError(f"constant {name!r} shadows another tensor")
        known[name] = graph.types[name]
    for n in graph.nodes:
        if n.name in known:
            raise GraphError(f"tensor {n.name!r} is defined twice")
        missing = [i for i in n.inputs if i not in known]
        if missing:
            raise GraphError(f"node {n.name!r} reads {missing} before they are defined")
        try:
            t = infer(n.op, tuple(known[i] for i in n.inputs), n.attrs)
        except (GraphError, UnsupportedError) as e:
            raise GraphError(f"node {n.name!r} ({n.op.value}): {e}") from None
        if t != n.type:
            raise GraphError(f"node {n.name!r} ({n.op.value}) has type {n.type}, expected {t}")
        known[n.name] = n.type
    for o in graph.outputs:
        if o not in known:
            raise GraphError(f"output {o!r} is never defined")
    return graph
