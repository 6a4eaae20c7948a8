"""Shared machinery of the Triton generators: index maps, loads, expressions.

Every template evaluates primitives *at an index*: a multi-index into the
node's output, one Triton expression per dimension.  Walking backwards from
the kernel's outputs, each primitive maps the index of its output to the
indices of its inputs:

* elementwise: numpy broadcasting (a size-1 dimension reads index 0);
* transpose: permute; reshape: linearise and split again; slice:
  ``start + i * step``; expand: 0 on broadcast dimensions; pad: shift, with
  a mask (constant) or reflected / clamped indices; concat: one masked
  branch per piece; gather: the index dimension reads the index tensor.

So layout primitives cost no memory traffic: they become index arithmetic on
the loads of the kernel that reads them.  Values are computed in fp32 when the
tensor is fp16 or bf16 (``compute_dtype``) and cast back when stored.

Indices are ``Expr`` trees (``emit/expr.py``): the rewrite rules simplify
them as they are built (a reshape of a split index is the index again, a
padding test that cannot fail disappears) and they become text only when a
line is written.  Values (what is loaded and computed) are Triton text named
by the :class:`Body` (``emit/body.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrate import ir
from orchestrate.emit import helpers
from orchestrate.emit.body import Body, is_number
from orchestrate.emit.expr import (
    Const,
    Expr,
    Sym,
    and_,
    as_expr,
    children,
    ge,
    gt,
    is_false,
    is_lane_invariant,
    lt,
    maximum,
    minimum,
    where,
)
from orchestrate.emit.helpers import Helper
from orchestrate.ir import Graph, Node, Op
from orchestrate.ir.bounds import INDEX_ERROR
from orchestrate.shapes.symint import SymInt, upper

TL_DTYPE = {
    "float16": "tl.float16",
    "bfloat16": "tl.bfloat16",
    "float32": "tl.float32",
    "float64": "tl.float64",
    "int8": "tl.int8",
    "int16": "tl.int16",
    "int32": "tl.int32",
    "int64": "tl.int64",
    "uint8": "tl.uint8",
    "uint16": "tl.uint16",
    "uint32": "tl.uint32",
    "uint64": "tl.uint64",
    "bool": "tl.int1",
}


def cdiv_text(n: int, block: int) -> str:
    """``ceil(n / block)`` as a comment shows it: a number, or for a
    dimension of a range its formula (``cdiv(dim1, 64)``)."""
    if isinstance(n, SymInt):
        return f"cdiv({n!s}, {block})"
    return str(-(-n // block))


def compute_dtype(dtype: str) -> str:
    """The dtype values of ``dtype`` are computed in (fp16 and bf16 math runs in fp32)."""
    return "float32" if dtype in ir.HALF else dtype


def strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def literal(value, dtype: str) -> str:
    """A Python/Triton literal for one scalar of ``dtype``; a dimension of a
    range (a SymInt: a count folded into a constant) prints as its formula."""
    if isinstance(value, SymInt):
        return f"({value} * 1.0)" if dtype in ir.FLOATS else f"{value}"
    if dtype == "bool":
        return "1" if bool(value) else "0"
    if dtype in ir.FLOATS:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return str(int(value))


def cast_literal(value: np.ndarray, to: str) -> str:
    """The literal of a CAST of the one-element constant ``value`` (a 0-d
    array) to ``to``: converted by numpy, as the reference converts it (a
    float rounds to fp16 or bf16, truncates to an integer, is 1 if nonzero
    as a bool)."""
    with np.errstate(all="ignore"):
        cast = value != 0 if to == "bool" else value.astype(to)
    return literal(cast.item(), compute_dtype(to))


class Pointers:
    """Pointer arguments of one kernel: each tensor it reads or writes has a
    slot name (``in0``, ``out1``; see ``source.pointers``, which lists the
    inputs first, each in order); ``params`` are the slots used, in that order.
    ``checks`` numbers the gathers the kernel checks on the device (the
    spec's ``checks``, from 1): the code each stores into the index error
    flag (the slot of ``bounds.INDEX_ERROR``)."""

    def __init__(self, slots: dict[str, str], checks: Sequence[str] = ()):
        self.slots = dict(slots)
        self.used: set[str] = set()
        self.checks = {g: k + 1 for k, g in enumerate(checks)}

    def get(self, tensor: str) -> str:
        self.used.add(tensor)
        return f"{self.slots[tensor]}_ptr"

    def name(self, tensor: str) -> str:
        return self.slots[tensor]

    def params(self) -> list[str]:
        return [slot for tensor, slot in self.slots.items() if tensor in self.used]


@dataclass(frozen=True)
class Index:
    """A multi-index: one expression per dimension, plus an optional mask
    (False where the element does not exist, e.g. padding)."""

    dims: tuple[Expr, ...]
    mask: Expr | None = None


def split_linear(
    body: Body, linear: Expr, shape: Sequence[int], stem: str = "i"
) -> tuple[Expr, ...]:
    """The multi-index of a row-major ``linear`` index into ``shape``.  The
    outermost dimension takes no modulo: masked-out lanes may run past it.
    Each component is simplified from ``linear`` itself, so a sum whose
    terms fall in one bucket of a stride splits exactly (``(i * 64 + j) // 64
    -> i`` for ``j`` in ``[0, 64)``); only a component that still divides the
    whole sum reads it through one let-bound name (``r``)."""
    if not shape:
        return ()
    out = []
    total = math.prod(shape)
    named: Expr | None = None  # ``linear`` bound to a name, once a component needs it
    for d, s in zip(shape, strides(shape)):
        if d == 1:
            out.append(Const(0))
            continue
        e = _component(linear, s, d, total)
        if not isinstance(linear, (Sym, Const)) and _reads(e, linear):
            if named is None:
                named = body.let(linear, "r")
            e = _component(named, s, d, total)
        out.append(_within(body.let(e, stem), d))
    body.linear_of[(tuple(out), tuple(shape))] = linear
    return tuple(out)


def _component(linear: Expr, stride: int, d: int, total: int) -> Expr:
    e = linear // stride
    return e % d if stride * d != total else e


def _reads(e: Expr, part: Expr) -> bool:
    """Whether ``part`` is a subexpression of ``e``."""
    return e == part or any(_reads(c, part) for c in children(e))


def _within(e: Expr, d: int) -> Expr:
    """A let-bound index component known to lie in [0, d) on valid lanes
    (``d`` at most its largest value, for a dimension of a range)."""
    if isinstance(e, Sym):
        lo, hi, top = e.lo, e.hi, upper(d)
        return Sym(
            e.name, 0 if lo is None else max(lo, 0), top if hi is None else min(hi, top), e.lane
        )
    return e


def linearise(dims: Sequence[Expr], shape: Sequence[int], body: Body | None = None) -> Expr:
    """Row-major offset of a multi-index into a contiguous tensor."""
    if body is not None:
        known = body.linear_of.get((tuple(dims), tuple(shape)))
        if known is not None:
            return known
    total: Expr = Const(0)
    for e, d, s in zip(dims, shape, strides(shape)):
        if d != 1:
            total = total + e * s
    return total


def broadcast_index(index: Index, out_shape: Sequence[int], in_shape: Sequence[int]) -> Index:
    """numpy broadcasting, backwards: the index into an input of ``in_shape``."""
    lead = len(out_shape) - len(in_shape)
    dims = tuple(
        Const(0) if d == 1 and out_shape[lead + j] != 1 else index.dims[lead + j]
        for j, d in enumerate(in_shape)
    )
    return Index(dims, index.mask)


class Evaluator:
    """Evaluates the primitives of one kernel at indices, emitting statements.

    ``inside`` are the kernel's own nodes (computed here); anything else is
    loaded from memory through its pointer.  Scalar constants are inlined as
    literals.  ``provided`` lets a template supply values it computed itself
    (a matmul accumulator, a row reduction).

    ``zero``: a block-shaped integer zero; a load whose offset does not vary
    over the block adds it so pointer and mask shapes agree (always, with
    ``broadcast_all``, for templates whose index expressions have lower rank
    than the block)."""

    def __init__(
        self,
        graph: Graph,
        inside: set[str],
        body: Body,
        pointers: Pointers,
        mask: Expr | None = None,
        zero: Expr | None = None,
        broadcast_all: bool = False,
    ):
        self.zero = zero
        self.broadcast_all = broadcast_all
        self.graph = graph
        self.inside = inside
        self.body = body
        self.pointers = pointers
        self.mask = mask
        self.provided: dict[str, Callable[[Index], str]] = {}
        self._memo: dict[tuple, str] = {}

    def value(self, name: str, index: Index) -> str:
        key = (name, index.dims, index.mask)
        if key in self._memo:
            return self._memo[key]
        if name in self.provided:
            expr = self.provided[name](index)
        elif name in self.inside:
            expr = self._node(self.graph.producer[name], index)
        else:
            expr = self.load(name, index)
        self._memo[key] = expr
        return expr

    # -- memory -------------------------------------------------------------

    def _scalar(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it is a one-element constant (inlined as
        a literal), as a 0-d array of its dtype; None otherwise."""
        const = self.graph.constants.get(name)
        return const.reshape(()) if const is not None and const.size == 1 else None

    def _formula(self, name: str):
        """A one-element constant's value where it is a formula of a range's
        dimensions (a SymInt), else None."""
        values = self.graph.constant_values.get(name)
        return values[0] if values is not None and len(values) == 1 else None

    def load(self, name: str, index: Index) -> str:
        t = self.graph.types[name]
        scalar = self._scalar(name)
        if scalar is not None:
            formula = self._formula(name)
            if formula is not None:
                return literal(formula, compute_dtype(t.dtype))
            return literal(scalar.item(), compute_dtype(t.dtype))
        offset = linearise(index.dims, t.shape, self.body)
        if self.zero is not None and (self.broadcast_all or is_lane_invariant(offset)):
            offset = self.zero + offset
        b = self.body
        offset = b.let(offset, "o")
        mask = and_(self.mask, index.mask)
        other = "0" if t.dtype in ir.INTS or t.dtype == "bool" else "0.0"
        mask_text = None if mask is None else b.text(mask)
        args = f"{self.pointers.get(name)} + {b.text(offset)}"
        if mask_text is not None:
            args += f", mask={mask_text}, other={other}"
        expr = f"tl.load({args})"
        if t.dtype in ir.HALF:
            expr += ".to(tl.float32)"
        v = b.let(expr, "x")
        b.loaded(v, mask_text, other)
        return v

    # -- primitives -----------------------------------------------------------

    def _node(self, n: Node, index: Index) -> str:
        if n.op is Op.CAST and self._scalar(n.inputs[0]) is not None:
            # a literal has no .to(): the cast is done here, as numpy does it
            formula = self._formula(n.inputs[0])
            if formula is not None:  # a whole number in any dtype
                return literal(formula, compute_dtype(n.attrs["to"]))
            return cast_literal(self._scalar(n.inputs[0]), n.attrs["to"])
        if n.op in ir.ELEMENTWISE:
            args = [
                self.value(i, broadcast_index(index, n.shape, self.graph.types[i].shape))
                for i in n.inputs
            ]
            expr = elementwise(
                n, args, [self.graph.types[i].dtype for i in n.inputs], self.body.use
            )
            return self.body.let(expr, "v")
        return self._layout(n, index)

    def _layout(self, n: Node, index: Index) -> str:
        g, a = self.graph, n.attrs
        src = n.inputs[0]
        in_shape = g.types[src].shape
        if n.op is Op.IDENTITY:
            return self.value(src, index)
        if n.op is Op.TRANSPOSE:
            dims: list[Expr] = [Const(0)] * len(in_shape)
            for i, p in enumerate(a["perm"]):
                dims[p] = index.dims[i]
            return self.value(src, Index(tuple(dims), index.mask))
        if n.op is Op.RESHAPE:
            linear = linearise(index.dims, n.shape, self.body)
            return self.value(src, Index(split_linear(self.body, linear, in_shape), index.mask))
        if n.op is Op.EXPAND:
            return self.value(src, broadcast_index(index, n.shape, in_shape))
        if n.op is Op.SLICE:
            dims = [e * step + start for e, start, step in zip(index.dims, a["starts"], a["steps"])]
            return self.value(src, Index(tuple(dims), index.mask))
        if n.op is Op.PAD:
            return self._pad(n, index, in_shape)
        if n.op is Op.CONCAT:
            return self._concat(n, index)
        if n.op is Op.GATHER:
            return self._gather(n, index)
        raise AssertionError(f"{n.op} is not evaluated per element")

    def _pad(self, n: Node, index: Index, in_shape) -> str:
        a, r = n.attrs, len(in_shape)
        pads, b = a["pads"], self.body
        dims, conds = [], []
        for j, (e, d) in enumerate(zip(index.dims, in_shape)):
            before = pads[j]
            if not before and not pads[j + r]:
                dims.append(e)
                continue
            i = b.let(e - before, "p")
            if a["mode"] == "constant":
                at = self._blocked(i)
                conds.append(and_(ge(at, 0), lt(at, d)))
                dims.append(i)
            elif a["mode"] == "edge":
                dims.append(b.let(minimum(maximum(i, 0), d - 1), "p"))
            else:  # reflect: -i before the start, 2(d-1)-i past the end
                i = b.let(where(lt(i, 0), -i, i), "p")
                dims.append(b.let(where(gt(i, d - 1), 2 * (d - 1) - i, i), "p"))
        inside = and_(*conds)
        if a["mode"] != "constant" or inside is None:
            return self.value(n.inputs[0], Index(tuple(dims), index.mask))
        fill = literal(a["value"], compute_dtype(n.dtype))
        if is_false(inside):
            return fill
        inside = b.let(inside, "m")
        v = self.value(n.inputs[0], Index(tuple(dims), and_(index.mask, inside)))
        return b.let(f"tl.where({b.text(inside)}, {v}, {fill})", "v")

    def _concat(self, n: Node, index: Index) -> str:
        ax, b = n.attrs["axis"], self.body
        e = index.dims[ax]
        start = 0
        pieces = []
        for src in n.inputs:
            size = self.graph.types[src].shape[ax]
            at = self._blocked(e)
            cond = and_(ge(at, start), lt(at, start + size))
            shift = start
            start += size
            if cond is not None and is_false(cond):
                continue
            dims = list(index.dims)
            dims[ax] = b.let(e - shift, "c")
            if cond is None:  # every valid lane reads this piece
                return self.value(src, Index(tuple(dims), index.mask))
            cond = b.let(cond, "m")
            pieces.append((cond, self.value(src, Index(tuple(dims), and_(index.mask, cond)))))
        expr = pieces[-1][1]
        for cond, v in reversed(pieces[:-1]):
            expr = f"tl.where({b.text(cond)}, {v}, {expr})"
        return b.let(expr, "v")

    def _blocked(self, e: Expr) -> Expr:
        """``e`` for a mask test: block-shaped even when it is one scalar for
        the whole program (a batch index), as a load's mask must be."""
        if self.zero is not None and is_lane_invariant(e) and not isinstance(e, Const):
            return self.zero + e
        return e

    def _gather(self, n: Node, index: Index) -> str:
        data, idx = n.inputs
        ax = n.attrs["axis"]
        idx_rank = self.graph.types[idx].rank
        dim = self.graph.types[data].shape[ax]
        which = Index(index.dims[ax : ax + idx_rank], index.mask)
        raw = self.value(idx, which)
        if _is_int(raw):  # a constant index: fission refused one out of range
            k = int(raw)
            pos: Expr = as_expr(min(max(k + dim if k < 0 else k, 0), dim - 1))
        else:
            b = self.body
            wrapped = b.let(f"tl.where({raw} < 0, {raw} + {dim}, {raw})", "g")
            code = self.pointers.checks.get(n.name)
            if code is not None:  # computed: flag an index out of range on a valid lane
                bad = f"({wrapped} < 0) | ({wrapped} >= {dim})"
                lanes = and_(self.mask, index.mask)
                if lanes is not None:
                    bad = f"({bad}) & {b.text(lanes)}"
                bad = b.let(bad, "e")
                flag = self.pointers.get(INDEX_ERROR)
                b.raw(f"tl.store({flag} + {bad}.to(tl.int32) * 0, {code}, mask={bad})")
            # clamped, whoever checked it: no index reads outside the tensor
            pos = Sym(b.let(f"tl.minimum(tl.maximum({wrapped}, 0), {dim - 1})", "g"), 0, dim)
        dims = index.dims[:ax] + (pos,) + index.dims[ax + idx_rank :]
        return self.value(data, Index(dims, index.mask))


def _is_int(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------------------
# elementwise ops in Triton


def elementwise(
    n: Node, args: list[str], arg_dtypes: list[str], use: Callable[[Helper], None] = lambda h: None
) -> str:
    """A Triton expression for elementwise primitive ``n`` of ``args``;
    ``use`` is told of each helper function the expression calls."""
    op = n.op
    x = args[0] if args else ""
    dt = compute_dtype(arg_dtypes[0]) if arg_dtypes else ""
    is_int = dt in ir.INTS
    simple = {
        Op.EXP: f"tl.exp({x})",
        Op.LOG: f"tl.log({x})",
        Op.SQRT: f"tl.sqrt({x})",
        Op.SIGMOID: f"tl.sigmoid({x})",
        Op.NEG: f"-{x}",
        Op.ABS: f"tl.abs({x})",
        Op.FLOOR: f"tl.floor({x})",
        Op.CEIL: f"tl.ceil({x})",
        Op.SIN: f"tl.sin({x})",
        Op.COS: f"tl.cos({x})",
        Op.ERF: f"tl.math.erf({x})",
        Op.NOT: f"{x} == 0",
        Op.ISNAN: f"{x} != {x}",
        Op.ISINF: f'tl.abs({x}) == float("inf")',
        Op.RECIP: f"1.0 / {x}",
    }
    if op in simple:
        return simple[op]
    if op is Op.TANH:
        use(helpers.TANH)
        return f"_tanh({x})"
    if op is Op.ROUND:
        use(helpers.ROUND_HALF_EVEN)
        return f"_round_half_even({x})"
    if op is Op.SIGN:
        return f"tl.where({x} > 0, 1, tl.where({x} < 0, -1, 0)).to({TL_DTYPE[dt]})"
    if op is Op.CAST:
        to = n.attrs["to"]
        if to == "bool":
            return f"{x} != 0"
        return f"{x}.to({TL_DTYPE[compute_dtype(to)]})"
    if op is Op.WHERE:
        return f"tl.where({args[0]}, {args[1]}, {args[2]})"
    y = args[1] if len(args) > 1 else ""
    binary = {
        Op.ADD: f"{x} + {y}",
        Op.SUB: f"{x} - {y}",
        Op.MUL: f"{x} * {y}",
        Op.MAX: f"tl.maximum({x}, {y})",
        Op.MIN: f"tl.minimum({x}, {y})",
        Op.EQ: f"{x} == {y}",
        Op.LT: f"{x} < {y}",
        Op.LE: f"{x} <= {y}",
        Op.AND: f"{x} & {y}",
        Op.OR: f"{x} | {y}",
        Op.XOR: f"{x} ^ {y}",
    }
    if op in (Op.MAX, Op.MIN) and not is_int:
        # NaN propagates, as in numpy and onnxruntime (a literal is never NaN)
        pick = "tl.maximum" if op is Op.MAX else "tl.minimum"
        if is_number(x) and is_number(y):
            return f"{pick}({x}, {y})"
        if is_number(x) or is_number(y):
            v = y if is_number(x) else x
            return f"tl.where({v} != {v}, {v}, {pick}({x}, {y}))"
        return f"tl.where(({x} != {x}) | ({y} != {y}), {x} + {y}, {pick}({x}, {y}))"
    if op in binary:
        return binary[op]
    if op is Op.DIV:
        if is_int and dt in ir.SIGNED:
            use(helpers.IDIV)
            return f"_idiv({x}, {y})"
        return f"{x} // {y}" if is_int else f"{x} / {y}"
    if op is Op.MOD:
        fn = (
            (helpers.IMOD_TRUNC if is_int else helpers.FMOD)
            if n.attrs["fmod"]
            else helpers.IMOD_FLOOR
        )
        use(fn)
        return f"{fn.name}({x}, {y})"
    if op is Op.POW:
        exact = _exact_pow(x, y)
        if exact is None:
            use(helpers.POW)
            return f"_pow({x}, {y})"
        return exact
    raise AssertionError(f"no Triton expression for {op}")


def _exact_pow(x: str, y: str) -> str | None:
    exact = {
        "2.0": f"{x} * {x}",
        "2": f"{x} * {x}",
        "3.0": f"{x} * {x} * {x}",
        "1.0": x,
        "0.5": f"tl.sqrt({x})",
        "-1.0": f"1.0 / {x}",
    }
    return exact.get(y)
