"""The primitive IR: one closed set of operations, immutable nodes, a graph.

Every ONNX operator is split (``orchestrate.decompose``) into these primitives.
Each primitive is a single loop nest that a kernel template knows how to place:

* elementwise: unary, binary (numpy broadcasting), ternary ``WHERE``;
* reduce: sum / max / min / prod over axes, arg-max / arg-min over one axis;
* scan: the cumulative sum along one axis (inclusive or exclusive, forward
  or reverse);
* layout: transpose, reshape, slice, concat, pad, expand, gather, identity;
* compute: matmul (batched), conv (implicit GEMM), pool (windowed reduce).

A :class:`Node` is frozen and has exactly one output tensor, named by
``node.name``.  A :class:`Graph` is a topologically ordered tuple of nodes plus
named inputs, outputs and constants.  The type rule of every primitive lives
in ``type_rules.py``: ``infer`` gives the output type of a primitive from its
input types and attributes; ``validate`` re-derives every node's type with
it, so a graph that passes is self-consistent.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16" dtype: np.dtype("bfloat16"))
import numpy as np


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
    # scans
    CUMSUM = "cumsum"
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
        Op.EXP,
        Op.LOG,
        Op.SQRT,
        Op.RECIP,
        Op.TANH,
        Op.ERF,
        Op.SIGMOID,
        Op.NEG,
        Op.ABS,
        Op.SIGN,
        Op.FLOOR,
        Op.CEIL,
        Op.ROUND,
        Op.SIN,
        Op.COS,
        Op.NOT,
        Op.ISNAN,
        Op.ISINF,
        Op.CAST,
    }
)
COMPARE = frozenset({Op.EQ, Op.LT, Op.LE})
LOGICAL = frozenset({Op.AND, Op.OR, Op.XOR})
BINARY = (
    frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN, Op.MOD}) | COMPARE | LOGICAL
)
TERNARY = frozenset({Op.WHERE})
ELEMENTWISE = UNARY | BINARY | TERNARY
REDUCE = frozenset({Op.SUM, Op.RMAX, Op.RMIN, Op.PROD, Op.ARGMAX, Op.ARGMIN})
SCAN = frozenset({Op.CUMSUM})
LAYOUT = frozenset(
    {Op.TRANSPOSE, Op.RESHAPE, Op.SLICE, Op.CONCAT, Op.PAD, Op.EXPAND, Op.GATHER, Op.IDENTITY}
)
COMPUTE = frozenset({Op.MATMUL, Op.CONV, Op.POOL})
ALL_OPS = ELEMENTWISE | REDUCE | SCAN | LAYOUT | COMPUTE
assert ALL_OPS == frozenset(Op), "every Op belongs to exactly one group"

# ---------------------------------------------------------------------------
# dtypes: numpy names ("bfloat16" is ml_dtypes' numpy dtype, which onnx uses
# too).  Which dtypes each primitive accepts is part of the IR: a
# decomposition that would need another one declines with UnsupportedError.

# the 2-byte floats: stored in 2 bytes, computed in fp32 registers by the
# kernels, multiplied on tensor cores with fp32 accumulation
HALF = ("float16", "bfloat16")
BFLOAT16 = np.dtype("bfloat16")  # numpy's own has none: ml_dtypes'
FLOATS = ("float16", "bfloat16", "float32", "float64")
SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
INTS = SIGNED + UNSIGNED
NUMERIC = FLOATS + INTS
ALL_DTYPES = NUMERIC + ("bool",)

_F = frozenset(FLOATS)
_FI = frozenset(NUMERIC)
_ALL = frozenset(ALL_DTYPES)

# The dtypes each primitive is defined for (the input dtype that decides).
# These follow what the primitive-level ONNX export can run in onnxruntime;
# bfloat16 follows float16 (onnxruntime's CPU provider has few bfloat16
# kernels: the reference executor, with ml_dtypes, is the ground truth there).
DTYPES: Mapping[Op, frozenset[str]] = {
    **{
        op: _F
        for op in (
            Op.EXP,
            Op.LOG,
            Op.SQRT,
            Op.RECIP,
            Op.TANH,
            Op.SIGMOID,
            Op.FLOOR,
            Op.CEIL,
            Op.ROUND,
            Op.SIN,
            Op.COS,
            Op.ISNAN,
        )
    },
    Op.ISINF: frozenset({"float32", "float64"}),
    Op.ERF: frozenset({"float16", "bfloat16", "float32"}),
    Op.NEG: frozenset(FLOATS + SIGNED),
    Op.ABS: _FI,
    Op.SIGN: _FI,
    Op.NOT: frozenset({"bool"}),
    Op.CAST: _ALL,
    **{op: _FI for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MOD)},
    Op.POW: frozenset(FLOATS + ("int32", "int64")),
    **{
        op: frozenset(FLOATS + ("int8", "int32", "int64", "uint8", "uint32", "uint64"))
        for op in (Op.MAX, Op.MIN)
    },
    **{op: _FI for op in COMPARE},
    Op.EQ: _ALL,
    **{op: frozenset({"bool"}) for op in LOGICAL},
    Op.WHERE: _ALL,
    Op.SUM: frozenset(FLOATS + ("int32", "int64", "uint32", "uint64")),
    Op.PROD: frozenset(FLOATS + ("int32", "int64", "uint32", "uint64")),
    Op.CUMSUM: frozenset(FLOATS + ("int32", "int64", "uint32", "uint64")),
    Op.RMAX: frozenset(FLOATS + ("int8", "int32", "int64", "uint8")),
    Op.RMIN: frozenset(FLOATS + ("int8", "int32", "int64", "uint8")),
    Op.ARGMAX: frozenset(FLOATS + ("int8", "int32", "int64", "uint8")),
    Op.ARGMIN: frozenset(FLOATS + ("int8", "int32", "int64", "uint8")),
    **{op: _ALL for op in LAYOUT},
    Op.MATMUL: frozenset(FLOATS + ("int32", "int64", "uint32", "uint64")),
    # onnxruntime has no float64 Conv / AveragePool kernels
    Op.CONV: frozenset({"float32", *HALF}),
    Op.POOL: frozenset({"float32", *HALF}),
}


# ---------------------------------------------------------------------------
# value types

# The most elements a tensor held in memory may have (a graph input or
# output, a tensor a kernel writes): 2**36 (256 GiB of float32), more than any
# GPU in the device table holds.  Kernels switch to 64-bit offsets from 2**31
# elements, so this bounds shapes that are mistakes, not the indexing.  An
# intermediate no kernel writes may be larger: attention's scores, which a
# flash kernel keeps on chip one tile at a time.
MAX_ELEMENTS = 2**36


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
    # a range's constants whose shape, or whose values, are formulas of its
    # dimensions (``orchestrate.shapes.symint``): the arrays hold them at one
    # binding, these say what they are at every binding
    constant_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    constant_values: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        frozen = {
            k: np.array(v, copy=False) if isinstance(v, np.ndarray) else np.asarray(v)
            for k, v in self.constants.items()
        }
        for arr in frozen.values():
            arr.flags.writeable = False
        object.__setattr__(self, "constants", frozen)

    @cached_property
    def types(self) -> Mapping[str, TensorType]:
        t: dict[str, TensorType] = {i.name: i.type for i in self.inputs}
        for name, arr in self.constants.items():
            t[name] = TensorType(tuple(self.constant_shapes.get(name, arr.shape)), arr.dtype.name)
        for n in self.nodes:
            t[n.name] = n.type
        return t

    @cached_property
    def position(self) -> Mapping[str, int]:
        """Each node's index in topological order."""
        return {n.name: i for i, n in enumerate(self.nodes)}

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

    def with_nodes(self, nodes, constants: Mapping[str, np.ndarray] | None = None) -> Graph:
        """This graph with other nodes (and constants), its symbolic
        constants kept where they are still constants."""
        constants = self.constants if constants is None else constants
        return Graph(
            tuple(nodes),
            self.inputs,
            self.outputs,
            constants,
            self.name,
            {k: v for k, v in self.constant_shapes.items() if k in constants},
            {k: v for k, v in self.constant_values.items() if k in constants},
        )

    def __str__(self) -> str:
        lines = [f"graph {self.name}("]
        lines += [f"  {i.name}: {i.type}" for i in self.inputs]
        lines.append(") {")
        lines += [f"  {n}" for n in self.nodes]
        lines.append(f"  return {', '.join(self.outputs)}")
        lines.append("}")
        return "\n".join(lines)
