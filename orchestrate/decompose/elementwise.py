"""Elementwise ONNX operators: math, comparisons, activations, casts.

Activations are written as the formula in the ONNX spec over primitives, so
``Gelu`` or ``HardSwish`` never reach the planner as opaque ops: their pieces
fuse with whatever surrounds them.
"""

from __future__ import annotations

import math

from orchestrate import ir
from orchestrate.decompose.builder import Builder, Value, onnx_dtype
from orchestrate.errors import UnsupportedError
from orchestrate.ir import Op


def _same(b: Builder, y: Value, like: Value) -> Value:
    """``y`` in ``like``'s dtype (ONNX lets a few ops mix them)."""
    return b.cast(y, like.dtype)


# -- direct unary ------------------------------------------------------------


def _unary(op: Op):
    def fn(b: Builder, x: Value) -> Value:
        return b.unary(op, x)

    return fn


def Relu(b: Builder, x: Value) -> Value:
    return b.relu(x)


def IsInf(b: Builder, x: Value, *, detect_negative: int = 1, detect_positive: int = 1) -> Value:
    inf = b.unary(Op.ISINF, x)
    if detect_negative and detect_positive:
        return inf
    if not detect_negative and not detect_positive:
        return b.and_(inf, b.lt(x, x))  # all False, shaped like x
    side = b.gt(x, 0) if detect_positive else b.lt(x, 0)
    return b.and_(inf, side)


def Cast(b: Builder, x: Value, *, to: int, saturate: int = 1, round_mode: str = "up") -> Value:
    return b.cast(x, onnx_dtype(to))


def CastLike(b: Builder, x: Value, target: Value, *, saturate: int = 1, round_mode: str = "up"):
    return b.cast(x, target.dtype)


# -- trigonometric and hyperbolic composites ------------------------------------


def Tan(b: Builder, x: Value) -> Value:
    return b.div(b.unary(Op.SIN, x), b.unary(Op.COS, x))


def Sinh(b: Builder, x: Value) -> Value:
    return b.mul(b.sub(b.exp(x), b.exp(b.neg(x))), 0.5)


def Cosh(b: Builder, x: Value) -> Value:
    return b.mul(b.add(b.exp(x), b.exp(b.neg(x))), 0.5)


def Asinh(b: Builder, x: Value) -> Value:
    return b.log(b.add(x, b.sqrt(b.add(b.mul(x, x), 1.0))))


def Acosh(b: Builder, x: Value) -> Value:
    return b.log(b.add(x, b.sqrt(b.sub(b.mul(x, x), 1.0))))


def Atanh(b: Builder, x: Value) -> Value:
    return b.mul(b.log(b.div(b.add(x, 1.0), b.sub(1.0, x))), 0.5)


# -- binary ------------------------------------------------------------------


def _binary(op: Op):
    def fn(b: Builder, a: Value, c: Value) -> Value:
        return b.binary(op, a, c)

    return fn


def Greater(b: Builder, a: Value, c: Value) -> Value:
    return b.gt(a, c)


def GreaterOrEqual(b: Builder, a: Value, c: Value) -> Value:
    return b.ge(a, c)


def Pow(b: Builder, x: Value, y: Value) -> Value:
    if x.dtype in ir.INTS and y.dtype in ir.FLOATS:
        raise UnsupportedError(f"Pow of {x.dtype} by {y.dtype}", {"Pow int^float": 1})
    return b.pow(x, _same(b, y, x))


def Mod(b: Builder, a: Value, c: Value, *, fmod: int = 0) -> Value:
    if a.dtype in ir.FLOATS and not fmod:
        raise UnsupportedError("Mod with fmod=0 on floats is undefined", {"Mod fmod=0 float": 1})
    return b.emit(Op.MOD, [a, c], fmod=bool(fmod))


def Where(b: Builder, c: Value, x: Value, y: Value) -> Value:
    return b.where(c, x, y)


def _variadic(combine):
    def fn(b: Builder, *xs: Value) -> Value:
        out = xs[0]
        for x in xs[1:]:
            out = combine(b, out, x)
        return out

    return fn


def Mean(b: Builder, *xs: Value) -> Value:
    return b.div(_variadic(Builder.add)(b, *xs), len(xs))


# -- activations -------------------------------------------------------------


def LeakyRelu(b: Builder, x: Value, *, alpha: float = 0.01) -> Value:
    return b.where(b.lt(x, 0), b.mul(x, alpha), x)


def PRelu(b: Builder, x: Value, slope: Value) -> Value:
    return b.where(b.lt(x, 0), b.mul(x, slope), x)


def ThresholdedRelu(b: Builder, x: Value, *, alpha: float = 1.0) -> Value:
    return b.where(b.gt(x, alpha), x, 0)


def Elu(b: Builder, x: Value, *, alpha: float = 1.0) -> Value:
    return b.where(b.lt(x, 0), b.mul(b.sub(b.exp(x), 1), alpha), x)


def Selu(
    b: Builder,
    x: Value,
    *,
    alpha: float = 1.67326319217681884765625,
    gamma: float = 1.05070102214813232421875,
) -> Value:
    neg = b.sub(b.mul(b.exp(x), alpha), alpha)
    return b.mul(b.where(b.le(x, 0), neg, x), gamma)


def Celu(b: Builder, x: Value, *, alpha: float = 1.0) -> Value:
    neg = b.mul(b.sub(b.exp(b.div(x, alpha)), 1), alpha)
    return b.add(b.max(x, 0), b.min(neg, 0))


def Sigmoid(b: Builder, x: Value) -> Value:
    return b.sigmoid(x)


def HardSigmoid(b: Builder, x: Value, *, alpha: float = 0.2, beta: float = 0.5) -> Value:
    return b.max(b.min(b.add(b.mul(x, alpha), beta), 1), 0)


def HardSwish(b: Builder, x: Value) -> Value:
    return b.mul(x, HardSigmoid(b, x, alpha=1 / 6, beta=0.5))


def Softplus(b: Builder, x: Value) -> Value:
    # log(1 + exp(x)) written so that large |x| neither overflows nor underflows
    return b.add(b.relu(x), b.log(b.add(b.exp(b.neg(b.abs(x))), 1)))


def Softsign(b: Builder, x: Value) -> Value:
    return b.div(x, b.add(b.abs(x), 1))


def Mish(b: Builder, x: Value) -> Value:
    return b.mul(x, b.tanh(Softplus(b, x)))


def Swish(b: Builder, x: Value, *, alpha: float = 1.0) -> Value:
    return b.mul(x, b.sigmoid(b.mul(x, alpha) if alpha != 1.0 else x))


def Gelu(b: Builder, x: Value, *, approximate: str = "none") -> Value:
    if approximate == "tanh":
        inner = b.mul(b.add(x, b.mul(b.mul(b.mul(x, x), x), 0.044715)), math.sqrt(2 / math.pi))
        return b.mul(b.mul(x, 0.5), b.add(b.tanh(inner), 1))
    if approximate != "none":
        raise UnsupportedError(f"Gelu approximate={approximate!r}", {"Gelu.approximate": 1})
    return b.mul(b.mul(x, 0.5), b.add(b.erf(b.mul(x, 1 / math.sqrt(2))), 1))


def Shrink(b: Builder, x: Value, *, bias: float = 0.0, lambd: float = 0.5) -> Value:
    low = b.where(b.lt(x, -lambd), b.add(x, bias), 0)
    return b.where(b.gt(x, lambd), b.sub(x, bias), low)


def Clip(
    b: Builder,
    x: Value,
    lo: Value | None = None,
    hi: Value | None = None,
    *,
    min: float | None = None,
    max: float | None = None,
) -> Value:
    if min is not None:  # opset < 11: bounds are attributes
        lo = b.scalar(min, x)
    if max is not None:
        hi = b.scalar(max, x)
    out = x
    if lo is not None:
        out = b.max(out, lo)
    if hi is not None:
        out = b.min(out, hi)
    return out if out is not x else b.identity(x)


OPS = {
    **{
        name: _unary(op)
        for name, op in {
            "Exp": Op.EXP,
            "Log": Op.LOG,
            "Sqrt": Op.SQRT,
            "Reciprocal": Op.RECIP,
            "Tanh": Op.TANH,
            "Erf": Op.ERF,
            "Neg": Op.NEG,
            "Abs": Op.ABS,
            "Sign": Op.SIGN,
            "Floor": Op.FLOOR,
            "Ceil": Op.CEIL,
            "Round": Op.ROUND,
            "Sin": Op.SIN,
            "Cos": Op.COS,
            "Not": Op.NOT,
            "IsNaN": Op.ISNAN,
        }.items()
    },
    **{
        name: _binary(op)
        for name, op in {
            "Add": Op.ADD,
            "Sub": Op.SUB,
            "Mul": Op.MUL,
            "Div": Op.DIV,
            "Equal": Op.EQ,
            "Less": Op.LT,
            "LessOrEqual": Op.LE,
            "And": Op.AND,
            "Or": Op.OR,
            "Xor": Op.XOR,
        }.items()
    },
    "Sum": _variadic(Builder.add),
    "Max": _variadic(Builder.max),
    "Min": _variadic(Builder.min),
    "Mean": Mean,
    "Relu": Relu,
    "IsInf": IsInf,
    "Cast": Cast,
    "CastLike": CastLike,
    "Tan": Tan,
    "Sinh": Sinh,
    "Cosh": Cosh,
    "Asinh": Asinh,
    "Acosh": Acosh,
    "Atanh": Atanh,
    "Greater": Greater,
    "GreaterOrEqual": GreaterOrEqual,
    "Pow": Pow,
    "Mod": Mod,
    "Where": Where,
    "LeakyRelu": LeakyRelu,
    "PRelu": PRelu,
    "ThresholdedRelu": ThresholdedRelu,
    "Elu": Elu,
    "Selu": Selu,
    "Celu": Celu,
    "Sigmoid": Sigmoid,
    "HardSigmoid": HardSigmoid,
    "HardSwish": HardSwish,
    "Softplus": Softplus,
    "Softsign": Softsign,
    "Mish": Mish,
    "Swish": Swish,
    "Gelu": Gelu,
    "Shrink": Shrink,
    "Clip": Clip,
}
