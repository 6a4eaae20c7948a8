"""The primitive IR: one closed set of operations, immutable nodes, a graph.

Every ONNX operator is split (``orchestrate.decompose``) into these primitives.
Each primitive is a single loop nest that a kernel template knows how to place:

* elementwise: unary, binary (numpy broadcasting), ternary ``WHERE``;
* reduce: sum / max / min / prod over axes, arg-max / arg-min over one axis;
* layout: transpose, reshape, slice, concat, pad, expand, gather, identity;
* compute: matmul (batched), conv (implicit GEMM), pool (windowed reduce).

A :class:`Node` is frozen and has exactly one output tensor, named by
``node.name``.  A :class:`Graph` is a topologically ordered tuple of nodes plus
named inputs, outputs and constants.  :func:`infer` gives the output type of a
primitive from its input types and attributes; :func:`validate` re-derives
every node's type with it, so a graph that passes is self-consistent.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from orchestrate.errors import GraphError, UnsupportedError


class Op(enum.Enum):
    # unary elementwise
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RECIP = "recip"
    TANH = "tanh"
    ERF = "erf"
    SIGMOID = "sigmoid"
    NEG = "neg"
    ABS = "abs"
    SIGN = "sign"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    SIN = "sin"
    COS = "cos"
    NOT = "not"
    ISNAN = "isnan"
    ISINF = "isinf"
    CAST = "cast"
    # binary elementwise
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MAX = "max"
    MIN = "min"
    MOD = "mod"
    EQ = "eq"
    LT = "lt"
    LE = "le"
    AND = "and"
    OR = "or"
    XOR = "xor"
    # ternary elementwise
    WHERE = "where"
    # reductions
    SUM = "sum"
    RMAX = "reduce_max"
    RMIN = "reduce_min"
    PROD = "prod"
    ARGMAX = "argmax"
    ARGMIN = "argmin"
    # layout
    TRANSPOSE = "transpose"
    RESHAPE = "reshape"
    SLICE = "slice"
    CONCAT = "concat"
    PAD = "pad"
    EXPAND = "expand"
    GATHER = "gather"
    IDENTITY = "identity"
    # compute
    MATMUL = "matmul"
    CONV = "conv"
    POOL = "pool"

    def __repr__(self) -> str:
        return f"Op.{self.name}"


UNARY = frozenset(
    {
        Op.EXP, Op.LOG, Op.SQRT, Op.RECIP, Op.TANH, Op.ERF, Op.SIGMOID, Op.NEG, Op.ABS,
        Op.SIGN, Op.FLOOR, Op.CEIL, Op.ROUND, Op.SIN, Op.COS, Op.NOT, Op.ISNAN, Op.ISINF,
        Op.CAST,
    }
)  # fmt: skip
COMPARE = frozenset({Op.EQ, Op.LT, Op.LE})
LOGICAL = frozenset({Op.AND, Op.OR, Op.XOR})
BINARY = (
    frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN, Op.MOD}) | COMPARE | LOGICAL
)
TERNARY = frozenset({Op.WHERE})
ELEMENTWISE = UNARY | BINARY | TERNARY
REDUCE = frozenset({Op.SUM, Op.RMAX, Op.RMIN, Op.PROD, Op.ARGMAX, Op.ARGMIN})
LAYOUT = frozenset(
    {Op.TRANSPOSE, Op.RESHAPE, Op.SLICE, Op.CONCAT, Op.PAD, Op.EXPAND, Op.GATHER, Op.IDENTITY}
)
COMPUTE = frozenset({Op.MATMUL, Op.CONV, Op.POOL})
ALL_OPS = ELEMENTWISE | REDUCE | LAYOUT | COMPUTE
assert ALL_OPS == frozenset(Op), "every Op belongs to exactly one group"

# ---------------------------------------------------------------------------
# dtypes: numpy names.  Which dtypes each primitive accepts is part of the IR:
# a decomposition that would need another one declines with UnsupportedError.

FLOATS = ("float16", "float32", "float64")
SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
INTS = SIGNED + UNSIGNED
NUMERIC = FLOATS + INTS
ALL_DTYPES = NUMERIC + ("bool",)

_F = frozenset(FLOATS)
_FI = frozenset(NUMERIC)
_ALL = frozenset(ALL_DTYPES)

# The dtypes each primitive is defined for (the input dtype that decides).
# These follow what the primitive-level ONNX export can run in onnxruntime.
DTYPES: Mapping[Op, frozenset[str]] = {
    **{op: _F for op in (Op.EXP, Op.LOG, Op.SQRT, Op.RECIP, Op.TANH, Op.SIGMOID, Op.FLOOR,
                         Op.CEIL, Op.ROUND, Op.SIN, Op.COS, Op.ISNAN)},
    Op.ISINF: frozenset({"float32", "float64"}),
    Op.ERF: frozenset({"float16", "float32"}),
    Op.NEG: frozenset(FLOATS + SIGNED),
    Op.ABS: _FI,
    Op.SIGN: _FI,
    Op.NOT: frozenset({"bool"}),
    Op.CAST: _ALL,
    **{op: _FI for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MOD)},
    Op.POW: frozenset(FLOATS + ("int32", "int64")),
    **{op: frozenset(FLOATS + ("int8", "int32", "int64", "uint8", "uint32", "uint64"))
       for op in (Op.MAX, Op.MIN)},
    **{op: _FI for op in COMPARE},
    Op.EQ: _ALL,
    **{op: frozenset({"bool"}) for op in LOGICAL},
    Op.WHERE: _ALL,
    Op.SUM: frozenset(FLOATS + ("int32", "int64", "uint32", "uint64")),
    Op.PROD: frozenset(FLOATS + ("int32", "int64", "uint32", "uint64")),
    Op.RMAX: frozenset(FLOATS + ("int8", "int32", "int64", "uint8")),
    Op.RMIN: frozenset(FLOATS + ("int8", "int32", "int64", "uint8")),
    Op.ARGMAX: frozenset(FLOATS + ("int8", "int32", "int64", "uint8")),
    Op.ARGMIN: frozenset(FLOATS + ("int8", "int32", "int64", "uint8")),
    **{op: _ALL for op in LAYOUT},
    Op.MATMUL: frozenset(FLOATS + ("int32", "int64", "uint32", "uint64")),
    # onnxruntime has no float64 Conv / AveragePool kernels
    Op.CONV: frozenset({"float32", "float16"}),
    Op.POOL: frozenset({"float32", "float16"}),
}  # fmt: skip


# ---------------------------------------------------------------------------
# value types


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{'x'.join(map(str, self.shape))}]"


class Attrs(Mapping[str, Any]):
    """An immutable, hashable attribute mapping (values: ints, floats, strs, tuples)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | None = None, **kw: Any):
        merged = dict(items or {}, **kw)
        self._items = tuple(sorted((k, _freeze(v)) for k, v in merged.items()))

    def __getitem__(self, key: str) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attrs) and self._items == other._items

    def __repr__(self) -> str:
        return "Attrs(" + ", ".join(f"{k}={v!r}" for k, v in self._items) + ")"


def _freeze(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.ndarray):
        return tuple(_freeze(x) for x in v.tolist())
    return v


@dataclass(frozen=True)
class Node:
    """One primitive.  ``name`` is the name of its single output tensor;
    ``origin`` names the ONNX node it was split from."""

    op: Op
    name: str
    inputs: tuple[str, ...]
    type: TensorType
    attrs: Attrs = field(default_factory=Attrs)
    origin: str = ""

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    def __str__(self) -> str:
        args = ", ".join(self.inputs)
        extra = "".join(f", {k}={v}" for k, v in self.attrs.items())
        return f"{self.name}: {self.type} = {self.op.value}({args}{extra})"


@dataclass(frozen=True)
class Input:
    name: str
    type: TensorType


@dataclass(frozen=True, eq=False)
class Graph:
    """Topologically ordered primitive nodes with named inputs, outputs and
    constants.  Constants are read-only numpy arrays."""

    nodes: tuple[Node, ...]
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    constants: Mapping[str, np.ndarray]
    name: str = "graph"

    def __post_init__(self) -> None:
        frozen = {k: np.array(v, copy=False) if isinstance(v, np.ndarray) else np.asarray(v)
                  for k, v in self.constants.items()}  # fmt: skip
        for arr in frozen.values():
            arr.flags.writeable = False
        object.__setattr__(self, "constants", frozen)

    @cached_property
    def types(self) -> Mapping[str, TensorType]:
        t: dict[str, TensorType] = {i.name: i.type for i in self.inputs}
        for name, arr in self.constants.items():
            t[name] = TensorType(tuple(arr.shape), arr.dtype.name)
        for n in self.nodes:
            t[n.name] = n.type
        return t

    @cached_property
    def producer(self) -> Mapping[str, Node]:
        return {n.name: n for n in self.nodes}

    @cached_property
    def consumers(self) -> Mapping[str, tuple[Node, ...]]:
        c: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                c.setdefault(i, []).append(n)
        return {k: tuple(v) for k, v in c.items()}

    def __str__(self) -> str:
        lines = [f"graph {self.name}("]
        lines += [f"  {i.name}: {i.type}" for i in self.inputs]
        lines.append(") {")
        lines += [f"  {n}" for n in self.nodes]
        lines.append(f"  return {', '.join(self.outputs)}")
        lines.append("}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# type inference: the shape and dtype rules of every primitive


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
    Op.TRANSPOSE: 1, Op.RESHAPE: 1, Op.SLICE: 1, Op.PAD: 1, Op.EXPAND: 1, Op.IDENTITY: 1,
    Op.GATHER: 2, Op.MATMUL: 2, Op.CONV: 2, Op.POOL: 1,
}  # fmt: skip


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
    for name, arr in graph.constants.items():
        if name in known:
            raise GraphError(f"constant {name!r} shadows another tensor")
        known[name] = TensorType(tuple(arr.shape), arr.dtype.name)
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
