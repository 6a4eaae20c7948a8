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
tensor is fp16 (``compute_dtype``) and cast back when stored.

:class:`Body` collects the statements of one kernel body with common
subexpressions named once, so the generated source stays short and readable.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrate import ir
from orchestrate.emit import helpers
from orchestrate.emit.helpers import Helper
from orchestrate.ir import Graph, Node, Op

TL_DTYPE = {
    "float16": "tl.float16", "float32": "tl.float32", "float64": "tl.float64",
    "int8": "tl.int8", "int16": "tl.int16", "int32": "tl.int32", "int64": "tl.int64",
    "uint8": "tl.uint8", "uint16": "tl.uint16", "uint32": "tl.uint32", "uint64": "tl.uint64",
    "bool": "tl.int1",
}  # fmt: skip


def compute_dtype(dtype: str) -> str:
    """The dtype values of ``dtype`` are computed in (fp16 math runs in fp32)."""
    return "float32" if dtype == "float16" else dtype


def strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def literal(value, dtype: str) -> str:
    """A Python/Triton literal for one scalar of ``dtype``."""
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


class Pointers:
    """Pointer arguments of one kernel: each tensor it reads or writes has a
    slot name (``in0``, ``out1``; see ``source.pointers``); ``params`` lists
    the slots used, inputs first, each in order."""

    def __init__(self, slots: dict[str, str]):
        self.slots = dict(slots)
        self.used: set[str] = set()

    def get(self, tensor: str) -> str:
        self.used.add(tensor)
        return f"{self.slots[tensor]}_ptr"

    def name(self, tensor: str) -> str:
        return self.slots[tensor]

    def params(self) -> list[str]:
        names = [self.slots[t] for t in self.used]
        return sorted(names, key=lambda s: (not s.startswith("in"), int(s.lstrip("inout"))))

    def tensors(self) -> list[str]:
        """The tensors behind ``params()``, in the same order."""
        by_slot = {v: k for k, v in self.slots.items()}
        return [by_slot[s] for s in self.params()]


@dataclass(frozen=True)
class Index:
    """A multi-index: one expression per dimension, plus an optional mask
    expression (False where the element does not exist, e.g. padding)."""

    dims: tuple[str, ...]
    mask: str | None = None


class Body:
    """Statements of one kernel body; equal expressions get one name."""

    def __init__(self, indent: str = "    ", counter: list[int] | None = None,
                 helpers: list[Helper] | None = None):  # fmt: skip
        self.lines: list[str] = []
        self.indent = indent
        self._names: dict[str, str] = {}
        self._counter = counter if counter is not None else [0]
        self.helpers = helpers if helpers is not None else []  # device functions called
        self.linear_of: dict[tuple, str] = {}  # (dims, shape) -> the linear index they split
        self._invariant: set[str] = set()  # names bound to block-invariant scalars

    def let(self, expr: str, stem: str = "t") -> str:
        if _trivial(expr):
            return expr
        if expr in self._names:
            return self._names[expr]
        self._counter[0] += 1
        name = f"{stem}{self._counter[0]}"
        self.lines.append(f"{self.indent}{name} = {expr}")
        self._names[expr] = name
        if self.invariant(expr):
            self._invariant.add(name)
        return name

    def invariant(self, expr: str) -> bool:
        """Whether ``expr`` is the same scalar for every lane of the block:
        built from literals, ``tl`` functions and names bound to such
        expressions (a constant gather index, say), not from block indices."""
        return all(
            w.startswith("tl.") or w in self._invariant
            for w in re.findall(r"[A-Za-z_][A-Za-z_0-9.]*", expr)
        )

    def use(self, helper: Helper) -> None:
        """Record that the body calls ``helper``."""
        if helper not in self.helpers:
            self.helpers.append(helper)

    def comment(self, text: str) -> None:
        self.lines.append(f"{self.indent}# {text}")

    def raw(self, line: str) -> None:
        self.lines.append(f"{self.indent}{line}")

    def fork(self, indent: str) -> Body:
        """A nested body (a loop): sees this one's names, numbers on from it,
        and keeps its own names to itself."""
        child = Body(indent, self._counter, self.helpers)
        child._names = dict(self._names)
        child.linear_of = dict(self.linear_of)
        child._invariant = set(self._invariant)
        return child


def _trivial(expr: str) -> bool:
    return expr.isidentifier() or _is_number(expr)


def _is_number(expr: str) -> bool:
    try:
        float(expr)
        return True
    except ValueError:
        return False


def split_linear(body: Body, linear: str, shape: Sequence[int], stem: str = "i") -> tuple[str, ...]:
    """The multi-index of a row-major ``linear`` index into ``shape``."""
    if not shape:
        return ()
    st = strides(shape)
    out = []
    for d, s in zip(shape, st):
        if d == 1:
            out.append("0")
            continue
        e = linear
        if s != 1:
            e = f"{paren(e)} // {s}"
        if s * d != math.prod(shape):
            e = f"{paren(e)} % {d}"
        out.append(body.let(e, stem))
    body.linear_of[(tuple(out), tuple(shape))] = linear
    return tuple(out)


def linearise(dims: Sequence[str], shape: Sequence[int], body: Body | None = None) -> str:
    """Row-major offset of a multi-index into a contiguous tensor."""
    if body is not None:
        known = body.linear_of.get((tuple(dims), tuple(shape)))
        if known is not None:
            return known
    terms = []
    for e, d, s in zip(dims, shape, strides(shape)):
        if d == 1 or e == "0":
            continue
        terms.append(e if s == 1 else f"{paren(e)} * {s}")
    return " + ".join(terms) if terms else "0"


def broadcast_index(index: Index, out_shape: Sequence[int], in_shape: Sequence[int]) -> Index:
    """numpy broadcasting, backwards: the index into an input of ``in_shape``."""
    lead = len(out_shape) - len(in_shape)
    dims = tuple(
        "0" if d == 1 and out_shape[lead + j] != 1 else index.dims[lead + j]
        for j, d in enumerate(in_shape)
    )
    return Index(dims, index.mask)


class Evaluator:
    """Evaluates the primitives of one kernel at indices, emitting statements.

    ``inside`` are the kernel's own nodes (computed here); anything else is
    loaded from memory through the pointer ``pointer(name)``.  Scalar
    constants are inlined as literals.  ``loaded`` lets a template supply
    values it computed itself (a matmul accumulator, a row reduction)."""

    def __init__(self, graph: Graph, inside: set[str], body: Body, pointers: Pointers,
                 mask: str | None = None, zero: str | None = None,
                 broadcast_all: bool = False):  # fmt: skip
        # ``zero``: a block-shaped integer zero; a load whose offset does not
        # vary over the block adds it so pointer and mask shapes agree
        # (always, with ``broadcast_all``, for templates whose index
        # expressions have lower rank than the block)
        self.zero = zero
        self.broadcast_all = broadcast_all
        self.graph = graph
        self.inside = inside
        self.body = body
        self.pointers = pointers
        self.mask = mask
        self.provided: dict[str, object] = {}  # name -> callable(Index) -> expr
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

    def load(self, name: str, index: Index) -> str:
        t = self.graph.types[name]
        const = self.graph.constants.get(name)
        if const is not None and const.size == 1:
            return literal(np.asarray(const).reshape(()).item(), compute_dtype(t.dtype))
        offset = linearise(index.dims, t.shape, self.body)
        if self.zero and (self.broadcast_all or self.body.invariant(offset)):
            offset = f"{self.zero} + {offset}" if offset != "0" else self.zero
        offset = self.body.let(offset, "o")
        mask = _and(self.mask, index.mask)
        ptr = self.pointers.get(name)
        other = "0" if t.dtype in ir.INTS or t.dtype == "bool" else "0.0"
        args = f"{ptr} + {offset}" + (f", mask={mask}, other={other}" if mask else "")
        expr = f"tl.load({args})"
        if t.dtype == "float16":
            expr += ".to(tl.float32)"
        return self.body.let(expr, "x")

    # -- primitives -----------------------------------------------------------

    def _node(self, n: Node, index: Index) -> str:
        if n.op in ir.ELEMENTWISE:
            args = [
                self.value(i, broadcast_index(index, n.shape, self.graph.types[i].shape))
                for i in n.inputs
            ]
            expr = elementwise(n, args, [self.graph.types[i].dtype for i in n.inputs],
                               self.body.use)  # fmt: skip
            return self.body.let(expr, "v")
        return self._layout(n, index)

    def _layout(self, n: Node, index: Index) -> str:
        g, a = self.graph, n.attrs
        src = n.inputs[0]
        in_shape = g.types[src].shape
        if n.op is Op.IDENTITY:
            return self.value(src, index)
        if n.op is Op.TRANSPOSE:
            dims = [""] * len(in_shape)
            for i, p in enumerate(a["perm"]):
                dims[p] = index.dims[i]
            return self.value(src, Index(tuple(dims), index.mask))
        if n.op is Op.RESHAPE:
            linear = self.body.let(linearise(index.dims, n.shape, self.body), "r")
            return self.value(src, Index(split_linear(self.body, linear, in_shape), index.mask))
        if n.op is Op.EXPAND:
            return self.value(src, broadcast_index(index, n.shape, in_shape))
        if n.op is Op.SLICE:
            dims = tuple(
                _affine(e, start, step)
                for e, start, step in zip(index.dims, a["starts"], a["steps"])
            )
            return self.value(src, Index(dims, index.mask))
        if n.op is Op.PAD:
            return self._pad(n, index, in_shape)
        if n.op is Op.CONCAT:
            return self._concat(n, index)
        if n.op is Op.GATHER:
            return self._gather(n, index)
        raise AssertionError(f"{n.op} is not evaluated per element")

    def _pad(self, n: Node, index: Index, in_shape) -> str:
        a, r = n.attrs, len(in_shape)
        pads = a["pads"]
        dims, conds = [], []
        for j, (e, d) in enumerate(zip(index.dims, in_shape)):
            before = pads[j]
            if not before and not pads[j + r]:
                dims.append(e)
                continue
            i = self.body.let(f"{e} - {before}" if before else e, "p")
            if a["mode"] == "constant":
                conds.append(f"({i} >= 0) & ({i} < {d})")
                dims.append(i)
            elif a["mode"] == "edge":
                dims.append(self.body.let(f"tl.minimum(tl.maximum({i}, 0), {d - 1})", "p"))
            else:  # reflect: -i before the start, 2(d-1)-i past the end
                i = self.body.let(f"tl.where({i} < 0, -{i}, {i})", "p")
                dims.append(
                    self.body.let(f"tl.where({i} > {d - 1}, {2 * (d - 1)} - {i}, {i})", "p")
                )
        if a["mode"] != "constant" or not conds:
            return self.value(n.inputs[0], Index(tuple(dims), index.mask))
        inside = self.body.let(" & ".join(conds), "m")
        v = self.value(n.inputs[0], Index(tuple(dims), _and(index.mask, inside)))
        fill = literal(a["value"], compute_dtype(n.dtype))
        return self.body.let(f"tl.where({inside}, {v}, {fill})", "v")

    def _concat(self, n: Node, index: Index) -> str:
        ax = n.attrs["axis"]
        e = index.dims[ax]
        start = 0
        pieces = []
        for src in n.inputs:
            size = self.graph.types[src].shape[ax]
            cond = self.body.let(f"({e} >= {start}) & ({e} < {start + size})", "m")
            dims = list(index.dims)
            dims[ax] = self.body.let(f"{e} - {start}", "c") if start else e
            pieces.append((cond, self.value(src, Index(tuple(dims), _and(index.mask, cond)))))
            start += size
        expr = pieces[-1][1]
        for cond, v in reversed(pieces[:-1]):
            expr = f"tl.where({cond}, {v}, {expr})"
        return self.body.let(expr, "v")

    def _gather(self, n: Node, index: Index) -> str:
        data, idx = n.inputs
        ax = n.attrs["axis"]
        idx_rank = self.graph.types[idx].rank
        dim = self.graph.types[data].shape[ax]
        which = Index(index.dims[ax : ax + idx_rank], index.mask)
        raw = self.value(idx, which)
        pos = self.body.let(f"tl.where({raw} < 0, {raw} + {dim}, {raw})", "g")
        dims = index.dims[:ax] + (pos,) + index.dims[ax + idx_rank :]
        return self.value(data, Index(dims, index.mask))


def _affine(e: str, start: int, step: int) -> str:
    if step == 1:
        return e if not start else f"{e} + {start}"
    if e == "0":
        return str(start)
    return f"{start} + {paren(e)} * {step}" if start else f"{paren(e)} * {step}"


def paren(e: str) -> str:
    """``e`` in parentheses unless it is a name or a number."""
    return e if _trivial(e) else f"({e})"


def _and(a: str | None, b: str | None) -> str | None:
    if a is None:
        return b
    if b is None:
        return a
    return f"({a}) & ({b})"


# ---------------------------------------------------------------------------
# elementwise ops in Triton


def elementwise(n: Node, args: list[str], arg_dtypes: list[str],
                use: Callable[[Helper], None] = lambda h: None) -> str:  # fmt: skip
    """A Triton expression for elementwise primitive ``n`` of ``args``;
    ``use`` is told of each helper function the expression calls."""
    op = n.op
    x = args[0] if args else ""
    dt = compute_dtype(arg_dtypes[0]) if arg_dtypes else ""
    is_int = dt in ir.INTS
    simple = {
        Op.EXP: f"tl.exp({x})", Op.LOG: f"tl.log({x})", Op.SQRT: f"tl.sqrt({x})",
        Op.SIGMOID: f"tl.sigmoid({x})", Op.NEG: f"-{x}", Op.ABS: f"tl.abs({x})",
        Op.FLOOR: f"tl.floor({x})", Op.CEIL: f"tl.ceil({x})", Op.SIN: f"tl.sin({x})",
        Op.COS: f"tl.cos({x})", Op.ERF: f"tl.math.erf({x})", Op.NOT: f"{x} == 0",
        Op.ISNAN: f"{x} != {x}", Op.ISINF: f"tl.abs({x}) == float(\"inf\")",
        Op.RECIP: f"1.0 / {x}",
    }  # fmt: skip
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
        Op.ADD: f"{x} + {y}", Op.SUB: f"{x} - {y}", Op.MUL: f"{x} * {y}",
        Op.MAX: f"tl.maximum({x}, {y})", Op.MIN: f"tl.minimum({x}, {y})",
        Op.EQ: f"{x} == {y}", Op.LT: f"{x} < {y}", Op.LE: f"{x} <= {y}",
        Op.AND: f"{x} & {y}", Op.OR: f"{x} | {y}", Op.XOR: f"{x} ^ {y}",
    }  # fmt: skip
    if op in (Op.MAX, Op.MIN) and not is_int:
        # NaN propagates, as in numpy and onnxruntime (a literal is never NaN)
        pick = "tl.maximum" if op is Op.MAX else "tl.minimum"
        if _is_number(x) and _is_number(y):
            return f"{pick}({x}, {y})"
        if _is_number(x) or _is_number(y):
            v = y if _is_number(x) else x
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
    exact = {"2.0": f"{x} * {x}", "2": f"{x} * {x}", "3.0": f"{x} * {x} * {x}",
             "1.0": x, "0.5": f"tl.sqrt({x})", "-1.0": f"1.0 / {x}"}  # fmt: skip
    return exact.get(y)
