"""Op -> symbolic shape rule (see rules.py for the value type and helpers)."""

from __future__ import annotations

import math

import numpy as np
import onnx

from orchestrate.shapes.poly import NotExact, Poly
from orchestrate.shapes.rules import (
    BOOL,
    DATA_LIMIT,
    FLOAT_TYPES,
    INT64,
    INT_TYPES,
    Decline,
    Rules,
    Value,
    const,
    ints,
    known,
    ok,
    product,
)

ONE = Poly.of(1)

SAME_SHAPE = frozenset(
    """Relu Sigmoid Tanh Exp Log Sqrt Neg Abs Erf Reciprocal Identity Not Softmax LogSoftmax
    Gelu Dropout IsNaN IsInf Floor Ceil Sin Cos Softplus Softsign LeakyRelu Elu Selu HardSigmoid
    HardSwish Clip Sign Round Mish Trilu CumSum LayerNormalization BatchNormalization
    InstanceNormalization LpNormalization Hardmax Celu ThresholdedRelu Shrink Cast CastLike
    Acosh Asinh Atanh Swish GroupNormalization LRN MeanVarianceNormalization EyeLike Tan Atan Asin Acos Sinh Cosh SimplifiedLayerNormalization RMSNormalization""".split()
)
BROADCAST = frozenset(
    """Add Sub Mul Div Pow Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor Max Min Sum
    Mean Mod PRelu BitShift Where""".split()
)
COMPARE = frozenset("Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor Not".split())
REDUCE = frozenset(
    """ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum
    ReduceLogSumExp ReduceSumSquare ArgMax ArgMin""".split()
)
POOL = frozenset("Conv ConvTranspose MaxPool AveragePool LpPool".split())


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _out_type(node, ins: list[Value | None]) -> int:
    if node.op_type in COMPARE or node.op_type in ("IsNaN", "IsInf"):
        return BOOL
    if node.op_type in ("Cast",):
        return node.attrs["to"]
    if node.op_type == "Where":
        return ins[1].dtype if ins[1] is not None else 0
    if node.op_type == "CastLike":
        return ins[1].dtype
    return ins[0].dtype if ins and ins[0] is not None else 0


def same_shape(r: Rules, node, ins):
    x = ins[0]
    dtype = _out_type(node, ins)
    data = (
        x.data
        if node.op_type in ("Identity", "Cast", "CastLike") and dtype in INT_TYPES | FLOAT_TYPES
        else None
    )
    if data is not None and dtype == BOOL and node.op_type != "Identity":
        data = (
            tuple(Poly.of(int(d.const != 0)) for d in data)
            if all(d.is_const for d in data)
            else None
        )
    if node.op_type == "Neg" and x.data is not None:
        data = tuple(-d for d in x.data)
    outs = [Value(x.shape, dtype, data)]
    if node.op_type == "LayerNormalization" and len(node.output) > 1:
        axis = _axis(node.attrs.get("axis", -1), len(x.shape))
        reduced = x.shape[:axis] + (ONE,) * (len(x.shape) - axis)
        outs += [Value(reduced, onnx.TensorProto.FLOAT)] * (len(node.output) - 1)
    if node.op_type == "Dropout" and len(node.output) > 1:
        outs.append(Value(x.shape, BOOL))
    return outs


def _elementwise(r: Rules, op: str, a: Poly, b: Poly) -> Poly | None:
    """``a op b`` on shape values; None when the contents are not decided for
    every binding (the shape still is); Decline when Mul or Div leaves affine
    form, since such a value is a dimension that cannot be expressed."""
    if op == "Add":
        return a + b
    if op == "Sub":
        return a - b
    if op == "Mul":
        return a * b
    if op == "Div" and a.is_const and b.is_const and b.const:
        q = abs(a.const) // abs(b.const)  # ONNX's integer Div truncates toward zero
        return Poly.of(q if (a.const < 0) == (b.const < 0) else -q)
    if op == "Div":
        return ok(a.floordiv(b))
    if op in ("Max", "Min"):
        lo, hi = r.bounds(a - b)
        if lo >= 0 or hi <= 0:
            return a if (lo >= 0) == (op == "Max") else b
        return None
    if op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        lo, hi = r.bounds(a - b)
        tests = {
            "Equal": (lo == hi == 0, lo > 0 or hi < 0),
            "Less": (hi < 0, lo >= 0),
            "Greater": (lo > 0, hi <= 0),
            "LessOrEqual": (hi <= 0, lo > 0),
            "GreaterOrEqual": (lo >= 0, hi < 0),
        }
        yes, no = tests[op]
        return Poly.of(int(yes)) if yes or no else None
    if op in ("And", "Or") and a.is_const and b.is_const:
        return Poly.of(
            int(bool(a.const) and bool(b.const) if op == "And" else bool(a.const) or bool(b.const))
        )
    return None


def _flat_broadcast(datas, out_shape):
    size = const(product(out_shape), "the size")
    out = []
    for k in range(size):
        out.append([d[0] if len(d) == 1 else d[k] for d in datas])
    return out


def broadcast(r: Rules, node, ins):
    if node.op_type in ("Sum", "Mean", "Max", "Min") and len(ins) == 1:
        return [Value(ins[0].shape, ins[0].dtype)]
    shape = r.broadcast([v.shape for v in ins])
    dtype = _out_type(node, ins)
    data = None
    if dtype in INT_TYPES and all(v.data is not None for v in ins) and len(shape) <= 1:
        rows = _flat_broadcast([v.data for v in ins], shape)
        if node.op_type == "Where" and all(c.is_const for c, _, _ in rows):
            data = tuple(b if c.const else e for c, b, e in rows)
        elif len(ins) == 2:
            data = tuple(_elementwise(r, node.op_type, a, b) for a, b in rows)
            data = None if None in data else data
    return [Value(shape, dtype, data)]


def matmul(r: Rules, node, ins):
    a, b = (v.shape for v in ins[:2])
    if len(a) == 0 or len(b) == 0:
        raise Decline("MatMul of a scalar")
    a2 = (ONE,) + a if len(a) == 1 else a
    b2 = b + (ONE,) if len(b) == 1 else b
    if r.equal(a2[-1], b2[-2]) is not True:
        raise Decline(f"inner dims {a2[-1]} and {b2[-2]} are not equal for every value")
    out = r.broadcast([a2[:-2], b2[:-2]]) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return [Value(out, ins[0].dtype)]


def gemm(r: Rules, node, ins):
    a, b = ins[0].shape, ins[1].shape
    m, k = (a[1], a[0]) if node.attrs.get("transA", 0) else a
    k2, n = (b[1], b[0]) if node.attrs.get("transB", 0) else b
    if r.equal(k, k2) is not True:
        raise Decline(f"inner dims {k} and {k2} are not equal for every value")
    return [Value((m, n), ins[0].dtype)]


def transpose(r: Rules, node, ins):
    x = ins[0]
    perm = node.attrs.get("perm") or list(reversed(range(len(x.shape))))
    return [Value(tuple(x.shape[p] for p in perm), x.dtype)]


def shape(r: Rules, node, ins):
    dims = ins[0].shape
    rank = len(dims)
    start = max(0, min(rank, _axis(node.attrs.get("start", 0), rank)))
    end = max(0, min(rank, _axis(node.attrs.get("end", rank), rank)))
    data = dims[start:end]
    return [Value((Poly.of(len(data)),), INT64, tuple(data))]


def size(r: Rules, node, ins):
    return [Value((), INT64, (product(ins[0].shape),))]


def reshape(r: Rules, node, ins):
    x = ins[0]
    target = list(known(ins[1], "the Reshape target"))
    allowzero = node.attrs.get("allowzero", 0)
    for k, t in enumerate(target):
        if t == Poly.of(0) and not allowzero:
            target[k] = x.shape[k]
    holes = [k for k, t in enumerate(target) if t == Poly.of(-1)]
    if len(holes) > 1:
        raise Decline("more than one -1 in the Reshape target")
    for t in target:
        if t != Poly.of(-1) and not r.always(t, 0):
            raise Decline(f"the Reshape target holds {t}, which may be negative")
    if holes:
        target[holes[0]] = _quotient(x.shape, [t for k, t in enumerate(target) if k != holes[0]])
    return [Value(tuple(target), x.dtype, x.data if len(target) <= 1 else None)]


def _quotient(num, den) -> Poly:
    """prod(num) / prod(den) when it is a polynomial for every value of the
    symbols: factors of ``den`` equal to factors of ``num`` cancel, and what
    is left must divide exactly."""
    top = list(num)
    rest = []
    for d in den:
        if not d.is_const and d in top:
            top.remove(d)
        else:
            rest.append(d)
    below = product(rest)
    if below == Poly():
        raise Decline("the Reshape target has a 0 next to -1")
    q = product(top).floordiv(below)
    if isinstance(q, NotExact):
        raise Decline(f"-1 cannot be solved: {q.reason}")
    return q


def flatten(r: Rules, node, ins):
    x = ins[0]
    axis = _axis(node.attrs.get("axis", 1), len(x.shape))
    return [Value((product(x.shape[:axis]), product(x.shape[axis:])), x.dtype)]


def _axes(node, ins, k: int) -> list[int] | None:
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if len(ins) > k and ins[k] is not None:
        return ints(ins[k], "the axes")
    if len(node.input) > k and node.input[k]:
        raise Decline("the axes are computed from data")
    return None


def unsqueeze(r: Rules, node, ins):
    x = ins[0]
    axes = _axes(node, ins, 1)
    rank = len(x.shape) + len(axes)
    axes = sorted(_axis(a, rank) for a in axes)
    out = list(x.shape)
    for a in axes:
        out.insert(a, ONE)
    return [Value(tuple(out), x.dtype, x.data)]


def squeeze(r: Rules, node, ins):
    x = ins[0]
    axes = _axes(node, ins, 1)
    if axes is None:
        axes = [k for k, d in enumerate(x.shape) if d == ONE]
        if any(not d.is_const and r.bounds(d)[0] == 1 for d in x.shape):
            raise Decline("Squeeze without axes of a symbolic dim that may be 1")
    axes = {_axis(a, len(x.shape)) for a in axes}
    for a in axes:
        if x.shape[a] != ONE:
            raise Decline(f"Squeeze of axis {a}, which is {x.shape[a]}, not 1")
    return [Value(tuple(d for k, d in enumerate(x.shape) if k not in axes), x.dtype, x.data)]


def concat(r: Rules, node, ins):
    rank = len(ins[0].shape)
    axis = _axis(node.attrs["axis"], rank)
    shape = list(ins[0].shape)
    shape[axis] = sum((v.shape[axis] for v in ins), Poly.of(0))
    for v in ins[1:]:
        for k, d in enumerate(v.shape):
            if k != axis and r.equal(d, shape[k]) is not True:
                raise Decline(f"axis {k}: dims {shape[k]} and {d} are not equal for every value")
    data = None
    if rank == 1 and all(v.data is not None for v in ins):
        data = tuple(x for v in ins for x in v.data)
    return [Value(tuple(shape), ins[0].dtype, data)]


def gather(r: Rules, node, ins):
    x, idx = ins[0], ins[1]
    axis = _axis(node.attrs.get("axis", 0), len(x.shape))
    out = x.shape[:axis] + idx.shape + x.shape[axis + 1 :]
    data = None
    if x.data is not None and idx.data is not None and len(x.shape) == 1:
        n = len(x.data)
        picks = [const(i, "a Gather index") for i in idx.data]
        if all(-n <= p < n for p in picks):
            data = tuple(x.data[p] for p in picks)
    return [Value(out, x.dtype, data)]


def gather_elements(r: Rules, node, ins):
    return [Value(ins[1].shape, ins[0].dtype)]


def gather_nd(r: Rules, node, ins):
    x, idx = ins[0], ins[1]
    b = node.attrs.get("batch_dims", 0)
    last = const(idx.shape[-1], "the GatherND index depth")
    return [Value(idx.shape[:-1] + x.shape[b + last :], x.dtype)]


def slice_(r: Rules, node, ins):
    x = ins[0]
    if "starts" in node.attrs:  # opset < 10
        starts = [Poly.of(s) for s in node.attrs["starts"]]
        ends = [Poly.of(e) for e in node.attrs["ends"]]
        axes = node.attrs.get("axes")
        steps = [1] * len(starts)
    else:
        starts = list(known(ins[1], "the Slice starts"))
        ends = list(known(ins[2], "the Slice ends"))
        axes = _axes(node, ins, 3)
        steps = (
            ints(ins[4], "the Slice steps")
            if len(ins) > 4 and ins[4] is not None
            else [1] * len(starts)
        )
    axes = [_axis(a, len(x.shape)) for a in (axes if axes is not None else range(len(starts)))]
    out = list(x.shape)
    picked = None
    for a, s, e, st in zip(axes, starts, ends, steps):
        d = x.shape[a]
        if st < 0:
            if not (d.is_const and s.is_const and e.is_const):
                raise Decline("a negative Slice step over a symbolic dim")
            n = const(d, "the dim")
            picked = range(n)[slice(s.const, e.const, st)]
            out[a] = Poly.of(len(picked))
            continue
        big = e.is_const and e.const >= r.bounds(d)[1]
        lo = r.clamp(s, d, "the Slice start")
        hi = d if big else r.clamp(e, d, "the Slice end")
        length = hi - lo
        if not r.always(length, 0):
            if r.bounds(length)[1] <= 0:
                length = Poly.of(0)
            else:
                raise Decline(f"the Slice length {length} may be negative")
        out[a] = length if st == 1 else ok((length + (st - 1)).floordiv(st))
        if x.data is not None and len(x.shape) == 1 and lo.is_const and out[a].is_const:
            picked = range(lo.const, lo.const + st * out[a].const, st)
    data = tuple(x.data[i] for i in picked) if x.data is not None and picked is not None else None
    return [Value(tuple(out), x.dtype, data)]


def expand(r: Rules, node, ins):
    x = ins[0]
    target = known(ins[1], "the Expand shape")
    rank = max(len(x.shape), len(target))
    xs = (ONE,) * (rank - len(x.shape)) + x.shape
    ts = (ONE,) * (rank - len(target)) + tuple(target)
    out = []
    for k, (a, b) in enumerate(zip(xs, ts)):
        if b == ONE or a == b:
            out.append(a)
        elif a == ONE:
            out.append(b)
        else:
            raise Decline(f"axis {k}: {a} does not expand to {b} for every value")
    return [Value(tuple(out), x.dtype)]


def constant_of_shape(r: Rules, node, ins):
    dims = known(ins[0], "the ConstantOfShape shape")
    value = node.attrs.get("value")
    arr = onnx.numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
    dtype = value.data_type if value is not None else onnx.TensorProto.FLOAT
    data = None
    if dtype in INT_TYPES and len(dims) <= 1 and all(d.is_const for d in dims):
        n = math.prod(d.const for d in dims)
        if n <= DATA_LIMIT:
            data = (Poly.of(int(arr.reshape(-1)[0])),) * n
    return [Value(tuple(dims), dtype, data)]


def range_(r: Rules, node, ins):
    start, limit, delta = (
        known(v, f"the Range {w}")[0] for v, w in zip(ins, ("start", "limit", "delta"))
    )
    step = const(delta, "the Range delta")
    span = limit - start
    n = span if step == 1 else ok((span + (step - 1 if step > 0 else step + 1)).floordiv(step))
    if not r.always(n, 0):
        raise Decline(f"the Range length {n} may be negative")
    data = None
    if n.is_const and n.const <= DATA_LIMIT and start.is_const:
        data = tuple(Poly.of(start.const + k * step) for k in range(n.const))
    return [Value((n,), ins[0].dtype, data)]


def reduce(r: Rules, node, ins):
    x = ins[0]
    rank = len(x.shape)
    keep = node.attrs.get("keepdims", 1)
    if node.op_type in ("ArgMax", "ArgMin"):
        axes = [node.attrs.get("axis", 0)]
    else:
        axes = _axes(node, ins, 1)
        if axes is None or axes == []:
            axes = [] if node.attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    axes = {_axis(a, rank) for a in axes}
    out = tuple(ONE if k in axes else d for k, d in enumerate(x.shape) if keep or k not in axes)
    dtype = INT64 if node.op_type in ("ArgMax", "ArgMin") else x.dtype
    return [Value(out, dtype)]


def split(r: Rules, node, ins):
    x = ins[0]
    axis = _axis(node.attrs.get("axis", 0), len(x.shape))
    d = x.shape[axis]
    parts = node.attrs.get("split")
    if parts is None and len(ins) > 1 and ins[1] is not None:
        parts = ints(ins[1], "the Split sizes")
    if parts is None:
        n = len(node.output)
        if not d.is_const:
            parts = [ok(d.floordiv(n))] * n
        else:
            each = -(-d.const // n)
            parts = [min(each, max(0, d.const - each * k)) for k in range(n)]
    outs = []
    for p in parts:
        shape = list(x.shape)
        shape[axis] = Poly.of(p)
        outs.append(Value(tuple(shape), x.dtype))
    return outs


def window(r: Rules, node, ins):
    """Conv and pooling: the batch may be symbolic, the spatial dims may not."""
    x = ins[0]
    spatial = x.shape[2:]
    for k, d in enumerate(spatial):
        if not d.is_const:
            raise Decline(f"spatial axis {k + 2} is {d}; only the batch may be symbolic")
    if node.op_type in ("Conv", "ConvTranspose"):
        kernel = [const(d, "a kernel dim") for d in ins[1].shape[2:]]
    else:
        kernel = list(node.attrs["kernel_shape"])
    if node.op_type == "ConvTranspose":
        raise Decline("ConvTranspose has no symbolic rule yet")
    n = len(kernel)
    sizes = [d.const for d in spatial]
    strides = list(node.attrs.get("strides", [1] * n))
    dil = list(node.attrs.get("dilations", [1] * n))
    pads = list(node.attrs.get("pads", [0] * 2 * n))
    auto = node.attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    ceil = node.attrs.get("ceil_mode", 0)
    outs = []
    for k in range(n):
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            outs.append(-(-sizes[k] // strides[k]))
            continue
        pad = 0 if auto == "VALID" else pads[k] + pads[k + n]
        span = sizes[k] + pad - ((kernel[k] - 1) * dil[k] + 1)
        outs.append((-(-span // strides[k]) if ceil else span // strides[k]) + 1)
    channels = ins[1].shape[0] if node.op_type == "Conv" else x.shape[1]
    shape = (x.shape[0], channels, *map(Poly.of, outs))
    return [Value(shape, x.dtype)] + [Value(shape, INT64)] * (len(node.output) - 1)


def global_pool(r: Rules, node, ins):
    x = ins[0]
    return [Value(x.shape[:2] + (ONE,) * (len(x.shape) - 2), x.dtype)]


def pad(r: Rules, node, ins):
    x = ins[0]
    pads = node.attrs.get("pads")
    if pads is None:
        pads = ints(ins[1], "the pads")
    axes = _axes(node, ins, 3) if len(node.input) > 3 else None
    axes = [_axis(a, len(x.shape)) for a in (axes if axes is not None else range(len(x.shape)))]
    out = list(x.shape)
    for j, a in enumerate(axes):
        out[a] = out[a] + pads[j] + pads[j + len(axes)]
    return [Value(tuple(out), x.dtype)]


def tile(r: Rules, node, ins):
    reps = ints(ins[1], "the Tile repeats")
    return [Value(tuple(d * k for d, k in zip(ins[0].shape, reps)), ins[0].dtype)]


def topk(r: Rules, node, ins):
    x = ins[0]
    k = known(ins[1], "the TopK k")[0]
    axis = _axis(node.attrs.get("axis", -1), len(x.shape))
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1 :]
    return [Value(shape, x.dtype), Value(shape, INT64)]


def einsum(r: Rules, node, ins):
    eq = node.attrs["equation"]
    eq = eq.decode() if isinstance(eq, bytes) else eq
    eq = eq.replace(" ", "")
    if "." in eq:
        raise Decline("Einsum with an ellipsis has no symbolic rule yet")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    sizes: dict[str, Poly] = {}
    for term, v in zip(terms, ins):
        for letter, d in zip(term, v.shape):
            if letter in sizes and sizes[letter] != d and ONE not in (sizes[letter], d):
                raise Decline(f"index {letter!r} is {sizes[letter]} and {d}")
            if sizes.get(letter, ONE) == ONE:
                sizes[letter] = d
    if not arrow:
        out = "".join(sorted(c for c in sizes if lhs.count(c) == 1))
    return [Value(tuple(sizes[c] for c in out), ins[0].dtype)]


def depth_space(r: Rules, node, ins):
    x = ins[0]
    b = node.attrs["blocksize"]
    n, c, h, w = x.shape
    if node.op_type == "DepthToSpace":
        shape = (n, ok(c.floordiv(b * b)), h * b, w * b)
    else:
        shape = (n, c * (b * b), ok(h.floordiv(b)), ok(w.floordiv(b)))
    return [Value(shape, x.dtype)]


def one_hot(r: Rules, node, ins):
    idx = ins[0]
    depth = known(ins[1], "the OneHot depth")[0]
    rank = len(idx.shape) + 1
    axis = _axis(node.attrs.get("axis", -1), rank)
    return [Value(idx.shape[:axis] + (depth,) + idx.shape[axis:], ins[2].dtype)]


RULES = {
    **{op: same_shape for op in SAME_SHAPE},
    **{op: broadcast for op in BROADCAST},
    **{op: reduce for op in REDUCE},
    **{op: window for op in POOL},
    "MatMul": matmul,
    "Gemm": gemm,
    "Transpose": transpose,
    "Shape": shape,
    "Size": size,
    "Reshape": reshape,
    "Flatten": flatten,
    "Unsqueeze": unsqueeze,
    "Squeeze": squeeze,
    "Concat": concat,
    "Gather": gather,
    "GatherElements": gather_elements,
    "GatherND": gather_nd,
    "Slice": slice_,
    "Expand": expand,
    "ConstantOfShape": constant_of_shape,
    "Range": range_,
    "Split": split,
    "GlobalAveragePool": global_pool,
    "GlobalMaxPool": global_pool,
    "Pad": pad,
    "Tile": tile,
    "TopK": topk,
    "GlobalLpPool": global_pool,
    "Einsum": einsum,
    "DepthToSpace": depth_space,
    "SpaceToDepth": depth_space,
    "OneHot": one_hot,
}
