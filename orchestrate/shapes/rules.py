"""The symbolic shape rule of each ONNX op the frontend supports.

A rule takes the node's input values (symbolic shape, element type and, for
small integer tensors, their symbolic contents) and returns its output
values, or raises :class:`Decline` with a one-line reason; ``infer`` turns
that into a result value naming the node.  Integer tensors' contents are
tracked so that ``Shape -> Gather -> Concat -> Reshape`` stays symbolic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from orchestrate.shapes.dims import DimRange
from orchestrate.shapes.poly import NotExact, Poly

Shape = tuple[Poly, ...]
DATA_LIMIT = 64  # integer tensors up to this many elements keep their contents
INT_TYPES = frozenset(
    {
        onnx.TensorProto.INT64,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.BOOL,
    }
)
# a cast of a shape value to a float keeps its values (whole numbers), as
# mean pooling divides by x.shape[1]
FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16})
BOOL = onnx.TensorProto.BOOL
INT64 = onnx.TensorProto.INT64


@dataclass(frozen=True)
class Value:
    """A tensor: symbolic shape, ONNX element type, and its contents (flat,
    row-major) when it is a small integer tensor whose contents are known
    (or such a tensor cast to a float)."""

    shape: Shape
    dtype: int
    data: tuple[Poly, ...] | None = None


class Decline(Exception):
    """Raised by a rule: this node has no symbolic form; the message says why."""


def ok(x: Poly | NotExact) -> Poly:
    if isinstance(x, NotExact):
        raise Decline(x.reason)
    return x


def const(x: Poly, what: str) -> int:
    if not x.is_const:
        raise Decline(f"{what} is {x}, not a number")
    return x.const


def product(dims) -> Poly:
    """The product of dims."""
    out = Poly.of(1)
    for d in dims:
        out = out * d
    return out


def known(v: Value | None, what: str) -> tuple[Poly, ...]:
    if v is None or v.data is None:
        raise Decline(f"{what} is computed from data, not from shapes")
    return v.data


def ints(v: Value | None, what: str) -> list[int]:
    return [const(x, what) for x in known(v, what)]


@dataclass(frozen=True)
class Rules:
    """What the rules share: the declared ranges, to decide a clamp or a comparison."""

    ranges: Mapping[str, DimRange]

    def bounds(self, x: Poly) -> tuple[int, int]:
        return x.bounds(self.ranges)

    def always(self, x: Poly, lo: int) -> bool:
        return self.bounds(x)[0] >= lo

    def equal(self, a: Poly, b: Poly) -> bool | None:
        """True / False when decided for every binding, None otherwise."""
        lo, hi = self.bounds(a - b)
        if lo == hi == 0:
            return True
        return False if lo > 0 or hi < 0 else None

    def broadcast(self, shapes: list[Shape]) -> Shape:
        rank = max((len(s) for s in shapes), default=0)
        out = []
        for ax in range(rank):
            dims = [s[ax - rank + len(s)] for s in shapes if ax - rank + len(s) >= 0]
            rest = {d for d in dims if d != Poly.of(1)}
            if len(rest) > 1:
                shown = " and ".join(map(str, sorted(rest, key=str)))
                raise Decline(f"axis {ax}: dims {shown} do not broadcast for every value")
            out.append(rest.pop() if rest else Poly.of(1))
        return tuple(out)

    def clamp(self, x: Poly, dim: Poly, what: str) -> Poly:
        """``x`` (negative counts from the end) clamped to 0..dim, when that
        is decided for every binding."""
        if x.is_const and x.const < 0:
            x = dim + x
        if not self.always(x, 0):
            if self.bounds(x)[1] <= 0:
                return Poly.of(0)
            raise Decline(f"{what} {x} may be below 0")
        lo, hi = self.bounds(dim - x)
        if lo >= 0:
            return x
        if hi <= 0:
            return dim
        raise Decline(f"{what} {x} may exceed the dim {dim}")
