"""The builder that decompositions write primitives through.

A decomposition receives :class:`Value` handles (name, static type and, for
constants, the array) and calls builder methods such as ``b.sub(x, m)``.  The
builder infers every result type with :func:`orchestrate.ir.type_rules.infer`, names the
result after the ONNX node it comes from, and folds a primitive whose inputs
are all constants into a new constant (weights preprocessing such as
BatchNormalization's ``scale / sqrt(var + eps)`` happens here, once).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from onnx import helper

from orchestrate import ir
from orchestrate.errors import GraphError, InputError, UnsupportedError
from orchestrate.ir import Attrs, Node, Op, TensorType, type_rules
from orchestrate.ir.bounds import out_of_range
from orchestrate.ir.reference import evaluate
from orchestrate.shapes.symint import SymInt, Undecided, strict

# A constant-only primitive is folded unless its result is both larger than
# this many elements and larger than its inputs together (Expand of a scalar
# mask to [B, H, S, S] stays a node and becomes index arithmetic later).
FOLD_LIMIT = 1 << 16


@dataclass(frozen=True)
class Value:
    """A tensor during decomposition: its name, type and (if known) value;
    ``sym``: a constant's values, flat, where some are formulas of a range's
    dimensions (a folded ``x.shape[1]``; ``orchestrate.shapes.symint``)."""

    name: str
    type: TensorType
    const: np.ndarray | None = None
    sym: tuple[int, ...] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return len(self.type.shape)

    @property
    def size(self) -> int:
        return self.type.size

    @property
    def is_const(self) -> bool:
        return self.const is not None


Scalar = int | float | bool
Operand = Value | Scalar


class Builder:
    """Collects primitive nodes and constants in topological order."""

    def __init__(self, reserved: Iterable[str] = (), opset: int = 18):
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        # a range's constants whose shape or values are formulas (ir.Graph's fields)
        self.constant_shapes: dict[str, tuple[int, ...]] = {}
        self.constant_values: dict[str, tuple[int, ...]] = {}
        self.opset = opset
        self.origin = ""
        self.hint = "t"
        self.n_outputs = 1  # outputs of the ONNX node being decomposed
        self._used: set[str] = set(reserved)
        self._next: dict[str, int] = {}  # fresh(): the K each name stem reached
        self._small_consts: dict[tuple, str] = {}
        self._step_start = 0
        # every non-constant value made or read by a node, and each node's
        # producer (slice looks through the CONCAT or unit RESHAPE it cuts)
        self._values: dict[str, Value] = {}
        self._made: dict[str, Node] = {}

    # -- naming -------------------------------------------------------------

    def begin(self, origin: str, hint: str, n_outputs: int = 1) -> None:
        """Start decomposing the ONNX node ``origin`` whose first output is ``hint``."""
        self.origin, self.hint = origin, hint or origin or "t"
        self.n_outputs = n_outputs
        self._step_start = len(self.nodes)

    def fresh(self, stem: str) -> str:
        """``hint/stem``, else ``hint/stem_K`` with the least unused K >= 2.
        Names are only ever added, so the search for a stem resumes where
        its last one ended (a Sum of 10,000 inputs made 10,000 ``add``s
        quadratically)."""
        base = f"{self.hint}/{stem}"
        k = self._next.get(base, 1)
        name = base if k == 1 else f"{base}_{k}"
        while name in self._used:
            k += 1
            name = f"{base}_{k}"
        self._next[base] = k
        self._used.add(name)
        return name

    def rename(self, v: Value, new: str) -> Value:
        """Give ``v`` (made during the current ONNX node) the ONNX tensor name ``new``."""
        if v.name == new:
            return v
        if v.is_const:
            if v.name not in self.constants or v.name in self._small_consts.values():
                return self.constant(v.const, name=new, shape=v.shape, sym=v.sym)
            self.constants[new] = self.constants.pop(v.name)
            for symbolic in (self.constant_shapes, self.constant_values):
                if v.name in symbolic:
                    symbolic[new] = symbolic.pop(v.name)
            return replace(v, name=new)
        for i in range(self._step_start, len(self.nodes)):
            n = self.nodes[i]
            if n.name == v.name:
                self.nodes[i] = replace(n, name=new)
            elif v.name in n.inputs:
                self.nodes[i] = replace(
                    n, inputs=tuple(new if x == v.name else x for x in n.inputs)
                )
            if n.name == v.name or v.name in n.inputs:
                self._made[self.nodes[i].name] = self.nodes[i]
        self._made.pop(v.name, None)
        self._values.pop(v.name, None)
        self._values[new] = replace(v, name=new)
        return replace(v, name=new)

    def made_here(self, v: Value) -> bool:
        """Whether ``v`` was produced by a node of the current ONNX node."""
        return any(n.name == v.name for n in self.nodes[self._step_start :])

    # -- constants ----------------------------------------------------------

    def constant(
        self,
        value,
        dtype: str | None = None,
        *,
        name: str | None = None,
        shape: Sequence[int] | None = None,
        sym: Sequence[int] | None = None,
    ) -> Value:
        """A constant of ``value``; ``shape`` and ``sym``: its shape and its
        values (flat) where they are formulas of a range's dimensions (the
        array holds them at the hint; kept only where one is a SymInt)."""
        # (asarray: a weight mapped from its file is not copied)
        arr = np.asarray(value, dtype=dtype) if dtype is not None else np.asarray(value)
        if arr.dtype.name not in ir.ALL_DTYPES:
            raise UnsupportedError(f"dtype {arr.dtype.name} is not supported")
        arr = np.array(arr, order="C", copy=None)
        shape = tuple(shape) if shape is not None and symbolic(shape) else None
        sym = tuple(sym) if sym is not None and symbolic(sym) else None
        t = _type_of(arr) if shape is None else TensorType(shape, arr.dtype.name)
        small = name is None and arr.size <= 16 and shape is None and sym is None
        if small:
            key = (arr.dtype.name, arr.shape, arr.tobytes())
            if key in self._small_consts:
                return Value(self._small_consts[key], t, arr)
        if name is None:
            name = self.fresh("const")
        else:
            self._used.add(name)
        self.constants[name] = arr
        if shape is not None:
            self.constant_shapes[name] = shape
        if sym is not None:
            self.constant_values[name] = sym
        if small:
            self._small_consts[key] = name
        return Value(name, t, arr, sym)

    def scalar(self, x: Scalar, like: Value) -> Value:
        if isinstance(x, SymInt):  # a dimension of a range as data (a mean's count)
            return self.constant(np.array(int.__int__(x), dtype=like.dtype), sym=(x,))
        return self.constant(np.array(x, dtype=like.dtype))

    def _operand(self, x: Operand, like: Value) -> Value:
        return x if isinstance(x, Value) else self.scalar(x, like)

    # -- the one place nodes are made ----------------------------------------

    def emit(self, op: Op, inputs: Sequence[Value], **attrs) -> Value:
        a = Attrs(attrs)
        try:
            t = type_rules.infer(op, tuple(v.type for v in inputs), a)
        except GraphError as e:
            raise GraphError(f"{self.origin}: {e}") from None
        except UnsupportedError as e:
            raise UnsupportedError(f"{self.origin}: {e}", {str(e): 1}) from None
        if inputs and all(v.is_const for v in inputs):
            if t.size <= max(FOLD_LIMIT, sum(v.const.size for v in inputs)):
                node = Node(op, "", tuple(v.name for v in inputs), t, a, self.origin)
                value = evaluate(node, [v.const for v in inputs])
                return self.constant(value, shape=t.shape, sym=_folded_sym(op, inputs))
        node = Node(op, self.fresh(op.value), tuple(v.name for v in inputs), t, a, self.origin)
        self.nodes.append(node)
        self._values.update((v.name, v) for v in inputs if not v.is_const)
        self._values[node.name] = out = Value(node.name, t)
        self._made[node.name] = node
        return out

    # -- elementwise ----------------------------------------------------------

    def unary(self, op: Op, x: Value) -> Value:
        return self.emit(op, [x])

    def binary(self, op: Op, x: Operand, y: Operand) -> Value:
        if not isinstance(x, Value):
            x = self.scalar(x, y)
        y = self._operand(y, x)
        return self.emit(op, [x, y])

    def exp(self, x):
        return self.unary(Op.EXP, x)

    def log(self, x):
        return self.unary(Op.LOG, x)

    def sqrt(self, x):
        return self.unary(Op.SQRT, x)

    def recip(self, x):
        return self.unary(Op.RECIP, x)

    def tanh(self, x):
        return self.unary(Op.TANH, x)

    def erf(self, x):
        return self.unary(Op.ERF, x)

    def sigmoid(self, x):
        return self.unary(Op.SIGMOID, x)

    def neg(self, x):
        return self.unary(Op.NEG, x)

    def abs(self, x):
        return self.unary(Op.ABS, x)

    def add(self, x, y):
        return self.binary(Op.ADD, x, y)

    def sub(self, x, y):
        return self.binary(Op.SUB, x, y)

    def mul(self, x, y):
        return self.binary(Op.MUL, x, y)

    def div(self, x, y):
        return self.binary(Op.DIV, x, y)

    def pow(self, x, y):
        return self.binary(Op.POW, x, y)

    def max(self, x, y):
        return self.binary(Op.MAX, x, y)

    def min(self, x, y):
        return self.binary(Op.MIN, x, y)

    def eq(self, x, y):
        return self.binary(Op.EQ, x, y)

    def lt(self, x, y):
        return self.binary(Op.LT, x, y)

    def le(self, x, y):
        return self.binary(Op.LE, x, y)

    def gt(self, x, y):
        return self.binary(Op.LT, y, x) if isinstance(y, Value) else self._flip(Op.LT, x, y)

    def ge(self, x, y):
        return self.binary(Op.LE, y, x) if isinstance(y, Value) else self._flip(Op.LE, x, y)

    def _flip(self, op: Op, x: Value, y: Scalar) -> Value:
        return self.emit(op, [self.scalar(y, x), x])

    def and_(self, x, y):
        return self.binary(Op.AND, x, y)

    def where(self, c: Value, x: Operand, y: Operand) -> Value:
        if not isinstance(x, Value):
            x = self.scalar(x, y)
        y = self._operand(y, x)
        return self.emit(Op.WHERE, [c, x, y])

    def cast(self, x: Value, dtype: str) -> Value:
        if x.dtype == dtype:
            return x
        return self.emit(Op.CAST, [x], to=dtype)

    def relu(self, x: Value) -> Value:
        return self.max(x, 0)

    # -- reductions -----------------------------------------------------------

    def reduce(self, op: Op, x: Value, axes: Iterable[int], keepdims: bool = True) -> Value:
        axes = normalize_axes(axes, x.rank)
        if not axes:
            return x
        return self.emit(op, [x], axes=axes, keepdims=bool(keepdims))

    def sum(self, x, axes, keepdims=True):
        return self.reduce(Op.SUM, x, axes, keepdims)

    def reduce_max(self, x, axes, keepdims=True):
        return self.reduce(Op.RMAX, x, axes, keepdims)

    def reduce_min(self, x, axes, keepdims=True):
        return self.reduce(Op.RMIN, x, axes, keepdims)

    def prod(self, x, axes, keepdims=True):
        return self.reduce(Op.PROD, x, axes, keepdims)

    def mean(self, x: Value, axes, keepdims=True) -> Value:
        """Mean as a sum and a scale (no composite mean primitive exists)."""
        axes = normalize_axes(axes, x.rank)
        n = math.prod(x.shape[a] for a in axes)
        return self.div(self.sum(x, axes, keepdims), n)

    # -- layout ---------------------------------------------------------------

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        shape = dims(shape)
        if shape == x.shape:
            return x
        return self.emit(Op.RESHAPE, [x], shape=shape)

    def transpose(self, x: Value, perm: Sequence[int]) -> Value:
        perm = tuple(int(p) for p in perm)
        if perm == tuple(range(x.rank)):
            return x
        return self.emit(Op.TRANSPOSE, [x], perm=perm)

    def slice(self, x: Value, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int]):
        starts, steps, shape = (dims(s) for s in (starts, steps, shape))
        if shape == x.shape and all(s == 0 for s in starts) and all(s == 1 for s in steps):
            return x
        through = self._slice_through(x, starts, steps, shape)
        if through is not None:
            return through
        return self.emit(Op.SLICE, [x], starts=starts, steps=steps, shape=shape)

    def _slice_through(self, x: Value, starts, steps, shape) -> Value | None:
        """The slice of ``x`` taken from what ``x`` is made of, where it
        cuts one part of a CONCAT, or a CONCAT across another axis, or the
        input of a RESHAPE that only adds or drops unit axes; None where it
        does not, or where the range of a dimension does not decide it. A
        decoding step's ``present[..., past:past + 1, :]`` is so its new row,
        not the whole cache it was concatenated with."""
        node = self._made.get(x.name)
        if node is None or any(s != 1 for s in steps):
            return None
        parts = [self._values.get(i) for i in node.inputs]
        if any(p is None for p in parts):
            return None
        try:
            with strict():
                if node.op is Op.CONCAT:
                    return self._slice_concat(parts, node.attrs["axis"], starts, shape)
                if node.op is Op.RESHAPE:
                    return self._slice_unit_reshape(parts[0], x, starts, shape)
        except Undecided:
            return None
        return None

    def _slice_concat(self, parts: Sequence[Value], axis: int, starts, shape) -> Value | None:
        if starts[axis] == 0 and shape[axis] == sum(p.shape[axis] for p in parts):
            cut = [list(shape) for _ in parts]
            for c, p in zip(cut, parts):
                c[axis] = p.shape[axis]
            return self.concat(
                [self.slice(p, starts, [1] * len(c), c) for p, c in zip(parts, cut)], axis
            )
        offset = 0
        for p in parts:
            n = p.shape[axis]
            if offset <= starts[axis] and starts[axis] + shape[axis] <= offset + n:
                inner = list(starts)
                inner[axis] = starts[axis] - offset
                return self.slice(p, inner, [1] * len(inner), shape)
            offset = offset + n
        return None

    def _slice_unit_reshape(self, x: Value, y: Value, starts, shape) -> Value | None:
        """``y = reshape(x)`` adding or dropping axes of 1 only."""
        keep_x = [a for a, d in enumerate(x.shape) if d != 1]
        keep_y = [a for a, d in enumerate(y.shape) if d != 1]
        if [x.shape[a] for a in keep_x] != [y.shape[a] for a in keep_y]:
            return None
        if any(shape[a] != 1 for a in range(len(y.shape)) if a not in keep_y):
            return None
        inner_starts, inner_shape = [0] * x.rank, list(x.shape)
        for ax, ay in zip(keep_x, keep_y):
            inner_starts[ax], inner_shape[ax] = starts[ay], shape[ay]
        cut = self.slice(x, inner_starts, [1] * x.rank, inner_shape)
        return self.reshape(cut, shape)

    def slice_axis(self, x: Value, axis: int, start: int, stop: int, step: int = 1) -> Value:
        """``x[..., start:stop:step, ...]`` along one axis, Python slice semantics."""
        axis = normalize_axis(axis, x.rank)
        first, count = slice_span(start, stop, step, x.shape[axis])
        starts = [0] * x.rank
        steps = [1] * x.rank
        shape = list(x.shape)
        starts[axis] = first
        steps[axis] = step
        shape[axis] = count
        return self.slice(x, starts, steps, shape)

    def concat(self, xs: Sequence[Value], axis: int) -> Value:
        xs = [x for x in xs if x.shape[axis] != 0] or list(xs[:1])
        if len(xs) == 1:
            return xs[0]
        return self.emit(Op.CONCAT, list(xs), axis=normalize_axis(axis, xs[0].rank))

    def pad(self, x: Value, pads: Sequence[int], mode: str = "constant", value: float = 0.0):
        pads = dims(pads)
        if not any(pads):
            return x
        return self.emit(Op.PAD, [x], pads=pads, mode=mode, value=float(value))

    def expand(self, x: Value, shape: Sequence[int]) -> Value:
        """Broadcast ``x`` to ``shape`` (numpy rules; rank may grow)."""
        shape = dims(shape)
        if x.rank < len(shape):
            x = self.reshape(x, (1,) * (len(shape) - x.rank) + x.shape)
        if x.shape == shape:
            return x
        return self.emit(Op.EXPAND, [x], shape=shape)

    def gather(self, x: Value, indices: Value, axis: int) -> Value:
        """``take(x, indices, axis)``.  A constant index outside ``[-n, n)``
        is refused here, naming the node (``orchestrate.ir.bounds``)."""
        axis = normalize_axis(axis, x.rank)
        if indices.is_const and x.rank:
            n = x.shape[axis]
            bad = out_of_range(indices.const, n)
            if bad is not None:
                raise InputError(f"{self.origin}: constant index {bad} out of range [{-n}, {n})")
        return self.emit(Op.GATHER, [x, indices], axis=axis)

    def identity(self, x: Value) -> Value:
        return self.emit(Op.IDENTITY, [x])

    # -- compute --------------------------------------------------------------

    def matmul(self, a: Value, b: Value) -> Value:
        return self.emit(Op.MATMUL, [a, b])

    def conv(self, x: Value, w: Value, *, strides, pads, dilations, group: int = 1) -> Value:
        return self.emit(
            Op.CONV,
            [x, w],
            strides=tuple(strides),
            pads=tuple(pads),
            dilations=tuple(dilations),
            group=int(group),
        )

    def pool(self, x: Value, kind: str, *, kernel, strides, pads, dilations) -> Value:
        return self.emit(
            Op.POOL,
            [x],
            kind=kind,
            kernel=tuple(kernel),
            strides=tuple(strides),
            pads=tuple(pads),
            dilations=tuple(dilations),
        )


def onnx_dtype_name(onnx_type: int) -> str:
    """The numpy name of an ONNX element type (its ONNX name when numpy has none)."""
    try:
        return helper.tensor_dtype_to_np_dtype(onnx_type).name
    except (KeyError, TypeError, ValueError):
        try:
            return helper.tensor_dtype_to_string(onnx_type)
        except (KeyError, TypeError, ValueError):
            return str(onnx_type)


def onnx_dtype(onnx_type: int) -> str:
    """The IR dtype of an ONNX element type (a Cast's ``to``); UnsupportedError
    when the IR has none (float8, strings, ...)."""
    name = onnx_dtype_name(onnx_type)
    if name not in ir.ALL_DTYPES:
        raise UnsupportedError(f"dtype {name} is not supported", {f"dtype {name}": 1})
    return name


def symbolic(values: Iterable) -> bool:
    """Whether any of ``values`` is a formula of a range's dimensions."""
    return any(isinstance(v, SymInt) for v in values)


def dims(values: Iterable) -> tuple[int, ...]:
    """``values`` as ints, a formula of a range's dimensions kept as one."""
    return tuple(v if isinstance(v, SymInt) else int(v) for v in values)


def slice_span(start: int, stop: int, step: int, n: int) -> tuple[int, int]:
    """(first index, count) of ``range(n)[start:stop:step]``, Python's
    slice semantics, where ``n`` (and the ends) may be formulas of a range's
    dimensions: the clamps are decided over the range
    (``orchestrate.shapes.symint``)."""
    if not any(isinstance(v, SymInt) for v in (start, stop, n)):
        idx = range(*slice(start, stop, step).indices(n))
        return (idx.start if len(idx) else 0), len(idx)
    if step <= 0:  # backwards over a dimension of the range: its first index moves
        idx = range(*slice(start, stop, step).indices(int(n)))
        return (idx.start if len(idx) else 0), len(idx)

    def clamp(v):
        if v is None:
            return None
        v = v + n if v < 0 else v
        return 0 if v < 0 else (n if v > n else v)

    lo = 0 if start is None else clamp(start)
    hi = n if stop is None else clamp(stop)
    span = hi - lo
    if span <= 0:
        return 0, 0
    count = span if step == 1 else (span + step - 1) // step
    return lo, count


def _folded_sym(op: Op, inputs: Sequence[Value]) -> tuple[int, ...] | None:
    """The formulas of a folded constant's values, where it keeps its one
    input's values in order (a cast of a counted dimension to float)."""
    if op in (Op.CAST, Op.IDENTITY, Op.RESHAPE) and inputs[0].sym is not None:
        return inputs[0].sym
    return None


def _type_of(arr: np.ndarray) -> TensorType:
    return TensorType(tuple(int(d) for d in arr.shape), arr.dtype.name)


def normalize_axis(axis: int, rank: int) -> int:
    axis = int(axis)
    if not -rank <= axis < max(rank, 1):
        raise GraphError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def normalize_axes(axes: Iterable[int], rank: int) -> tuple[int, ...]:
    return tuple(sorted({normalize_axis(a, rank) for a in axes}))
