"""The row-reduce template: reductions over the same axes, with prologue and epilogue.

The reduced input X (``k.space``) is viewed as a matrix: a *row* is one
position of X's non-reduced dimensions, its *columns* are the positions of
the reduced ones (which need not be the last or contiguous: softmax over axis
1 of NCHW works the same).  The X multi-index of an element is built back
from (row, column) by splitting the row over the kept dimensions and the
column over the reduced ones, so every load and store is plain index
arithmetic (see codegen.py).

Each node of the kernel lives in one of two spaces:

* full space (shape X): the prologue before a reduction (``exp(x - max)``)
  and the epilogue after one (``(x - mean) * rstd * gamma + beta``);
* row space (one value per row): the reductions themselves and elementwise
  or reshape nodes of row values (``mean = sum / n``, ``1 / sqrt(var + eps)``).
  A full-space node reads a row value in keepdims form, i.e. broadcast
  along the row; a row value sits at linear position ``row`` whatever its
  shape (keepdims or squeezed), so row outputs are stored at the row index.

Reductions that read a value depending on an earlier reduction (softmax's
sum of ``exp(x - max)``, layernorm's variance) form dependent *phases*.

Two forms, chosen by the rule (``Rows.looped``, rows longer than
``config.SINGLE_PASS_ROW``):

* single pass (short rows): a [BLOCK_ROWS, BLOCK_COLS] block per program
  holds whole rows; every input is loaded once, each phase reduces along
  axis 1 into [BLOCK_ROWS, 1] row values, the epilogue is computed from the
  same registers.  Memory traffic: read each input once, write each output
  once.
* looped (long rows): one loop over column blocks per phase, accumulating
  block-shaped partial results (sum, product, max/min, (value, index) for
  arg-max) that are reduced once after the loop; the prologue is reloaded
  and recomputed in every phase, and a last loop computes and stores the
  full-space outputs that need the last phase.  Memory traffic: read the
  inputs once per loop (phases, plus the epilogue loop when needed), write
  each output once.

* split (a few long rows, ``SPLIT_K`` = S > 1 in the configuration; one
  phase, nothing written from the row's result back over the row): grid
  axis 1 gives each block of rows S programs, program ``pid_k`` looping over
  its share of the column blocks into its own partial results, which it
  stores in its slot of the runner's fp32 scratch and counts its arrival
  with an acq_rel atomic (as split-K matmuls and split-KV attention do); the
  block's last program combines the S slots in slot order (the same bits
  every run), resets the counter, computes the row epilogue and stores the
  row outputs.  Rows of 2**31 elements or more are split, their columns in
  int64.  Memory traffic: the inputs read once, S partial values per row
  and reduction written and read back.

NaN propagates as in numpy: ``tl.max``/``tl.min`` may return the non-NaN
operand, so max/min reductions also reduce a NaN flag; arg-max/arg-min use
their own combine function (NaN is the extreme value, ties go to the first
index, or the last with ``select_last_index``).
"""

from __future__ import annotations

import math

import numpy as np

from orchestrate import ir
from orchestrate.emit.body import Body
from orchestrate.emit.codegen import (
    TL_DTYPE,
    Evaluator,
    Index,
    compute_dtype,
    linearise,
    literal,
    split_linear,
)
from orchestrate.emit.expr import Const, Expr, Sym
from orchestrate.emit.helpers import PROD, Helper, helper
from orchestrate.emit.source import KernelSource, describe, pointers, store
from orchestrate.ir import Graph, Node, Op
from orchestrate.kernels.spec import SPLIT_K_COUNTERS, SPLIT_K_PARTIALS, KernelSpec, split_k
from orchestrate.shapes.symint import upper


def row_reduce(graph: Graph, k: KernelSpec, writes: tuple[str, ...], name: str) -> KernelSource:
    gen = _Generator(graph, k, writes, name)
    if split_k(k.config) > 1:
        gen.split()  # (the last program of each block of rows stores them)
        return gen.source()
    if k.roles.looped:
        gen.looped()
    else:
        gen.single_pass()
    gen.store_rows()
    return gen.source()


def _neutral(op: Op, dtype: str) -> str:
    """The identity of reduction ``op`` over values of ``dtype`` (a literal)."""
    if op is Op.SUM:
        return literal(0, dtype)
    if op is Op.PROD:
        return literal(1, dtype)
    smallest = op in (Op.RMAX, Op.ARGMAX)
    if dtype in ir.FLOATS:
        return literal(-np.inf if smallest else np.inf, dtype)
    info = np.iinfo(dtype)
    return literal(info.min if smallest else info.max, dtype)


def _arg_helper(op: Op, last: bool) -> Helper:
    """The combine function of an arg-max / arg-min."""
    kind = "argmax" if op is Op.ARGMAX else "argmin"
    cmp = ">" if op is Op.ARGMAX else "<"
    return helper(
        f"_{kind}_{'last' if last else 'first'}",
        f"""(v1, i1, v2, i2):
    # numpy's {kind}: NaN wins over any number; ties go to the {"last" if last else "first"} index
    n1 = v1 != v1
    n2 = v2 != v2
    wins = (v1 {cmp} v2) | (n1 & ~n2)
    tie = ((v1 == v2) | (n1 & n2)) & (i1 {">" if last else "<"} i2)
    pick = wins | tie
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)
""",
    )


# tl.max / tl.maximum may drop NaN; numpy's max propagates it
ROW_MAX = helper(
    "_row_max",
    """(x):
    # max along axis 1; tl.max may drop NaN, numpy's max propagates it
    m = tl.max(x, axis=1, keep_dims=True)
    nan = tl.max((x != x).to(tl.int32), axis=1, keep_dims=True)
    return tl.where(nan > 0, float("nan"), m)
""",
)
ROW_MIN = helper(
    "_row_min",
    """(x):
    m = tl.min(x, axis=1, keep_dims=True)
    nan = tl.max((x != x).to(tl.int32), axis=1, keep_dims=True)
    return tl.where(nan > 0, float("nan"), m)
""",
)
MAXIMUM_NAN = helper(
    "_maximum_nan",
    """(a, b):
    return tl.where((a != a) | (b != b), a + b, tl.maximum(a, b))
""",
)
MINIMUM_NAN = helper(
    "_minimum_nan",
    """(a, b):
    return tl.where((a != a) | (b != b), a + b, tl.minimum(a, b))
""",
)
NAN_HELPERS = {"max": (ROW_MAX, MAXIMUM_NAN), "min": (ROW_MIN, MINIMUM_NAN)}


class _FullEvaluator(Evaluator):
    """Evaluates full-space nodes; a tensor that a reduction reads directly
    is loaded with that reduction's neutral ``other=``."""

    def __init__(self, *args, others: dict[str, str], base: tuple[Expr, ...], **kw):
        super().__init__(*args, **kw)
        self.others = others
        self.base = base
        self.neutral_loads: set[str] = set()  # loads whose masked-out lanes are neutral

    def load(self, name: str, index: Index) -> str:
        other = self.others.get(name)
        if other is None or index.dims != self.base or index.mask is not None:
            return super().load(name, index)
        t, b = self.graph.types[name], self.body
        offset = linearise(index.dims, t.shape, b)
        if offset == Const(0):  # a one-element tensor: the pointer needs the block's shape
            return super().load(name, index)
        offset = b.let(offset, "o")
        mask = b.text(self.mask)
        expr = f"tl.load({self.pointers.get(name)} + {b.text(offset)}, mask={mask}, other={other})"
        if t.dtype in ir.HALF:
            expr += ".to(tl.float32)"
        v = b.let(expr, "x")
        b.loaded(v, mask, other)
        self.neutral_loads.add(v)
        return v


# ---------------------------------------------------------------------------
# generation


class _Generator:
    def __init__(self, graph: Graph, k: KernelSpec, writes, name: str):
        info = k.roles
        self.graph, self.k, self.info, self.writes, self.name = graph, k, info, writes, name
        self.inside = set(k.nodes)
        self.body = Body()
        self.pointers = pointers(graph, k, writes)
        self.reductions = [graph.producer[r] for r in info.reductions]
        self.row_vars: dict[str, str] = {}  # reduction -> its [BLOCK_ROWS, 1] value
        self.accumulators = 0
        b = self.body
        wide = upper(math.prod(info.x)) >= 2**31
        self.wide_cols = upper(info.length) >= 2**31
        b.comment(f"{info.rows} rows of {info.length}: BLOCK_ROWS rows per program")
        b.raw("pid = tl.program_id(0)")
        start = "pid.to(tl.int64) * BLOCK_ROWS" if wide else "pid * BLOCK_ROWS"
        b.raw(f"rows = {start} + tl.arange(0, BLOCK_ROWS)[:, None]")
        b.raw(f"row_mask = rows < {info.rows}")
        # block-shaped zeros, for loads at a lane-invariant offset
        self.zero = b.lazy("zero_r", "rows * 0")
        self.rows = Sym("rows", 0, info.rows)
        at = len(b.lines)
        self.keep_dims = split_linear(b, self.rows, info.keep)
        if len(b.lines) > at:
            b.lines.insert(at, f"{b.indent}# index of each row into the kept dimensions")
        self.row_ev = Evaluator(
            graph, self.inside, b, self.pointers, mask=Sym("row_mask"), zero=self.zero
        )
        for r in self.reductions:
            self.row_ev.provided[r.name] = self._reduction_reader(r.name)
        # a tensor read directly by a reduction is loaded with its neutral value
        self.others: dict[str, str] = {}
        for r in self.reductions:
            src = r.inputs[0]
            const = graph.constants.get(src)
            if src not in self.inside and not (const is not None and const.size == 1):
                self.others.setdefault(src, self._neutral_of(r))

    # -- row values ---------------------------------------------------------

    def _reduction_reader(self, red: str):
        def read(index: Index) -> str:
            self._check_row_position(red, index)
            if red not in self.row_vars:
                raise AssertionError(f"{self.name}: {red} is read before it is reduced")
            return self.row_vars[red]

        return read

    def _check_row_position(self, tensor: str, index: Index) -> None:
        shape = self.graph.types[tensor].shape
        linear = linearise(index.dims, shape, self.body)
        if self.info.rows == 1 or (isinstance(linear, Sym) and linear.name == "rows"):
            return
        if index.dims != split_linear(self.body, self.rows, shape):
            raise AssertionError(f"{self.name}: a row value is read at another row's position")

    def row_value(self, tensor: str) -> str:
        """The [BLOCK_ROWS, 1] value of row-space ``tensor`` (computed once)."""
        shape = self.graph.types[tensor].shape
        index = Index(split_linear(self.body, self.rows, shape))
        return self.row_ev.value(tensor, index)

    def _keep_reader(self, tensor: str):
        """A full-space node reads row value ``tensor`` broadcast along its row."""

        def read(index: Index) -> str:
            if index.dims != self.keep_dims:  # the rule refuses such sets
                raise AssertionError(f"{self.name}: a row value is read across rows")
            return self.row_value(tensor)

        return read

    # -- full space ---------------------------------------------------------

    def columns(self, body: Body, start: str | None, end: str | None = None) -> Index:
        """Emit the column indices of a block (below ``end``, else the row's
        length) and the X multi-index."""
        info = self.info
        first = f"{start} + " if start else ""
        body.raw(f"cols = {first}tl.arange(0, BLOCK_COLS)[None, :]")
        body.raw(f"mask = row_mask & (cols < {end or info.length})")
        cols = Sym("cols", 0, info.length)
        col_dims = iter(split_linear(body, cols, info.cols_shape, "j"))
        dims = tuple(next(col_dims) if i in info.axes else d for i, d in enumerate(self.keep_dims))
        n = len(info.x)
        if info.axes == tuple(range(n - len(info.axes), n)) and info.rows != 1:
            # reduced axes last: rows are contiguous
            body.linear_of[(dims, info.x)] = self.rows * info.length + cols
        return Index(dims)

    def full_evaluator(self, body: Body, index: Index) -> _FullEvaluator:
        ev = _FullEvaluator(
            self.graph,
            self.inside,
            body,
            self.pointers,
            mask=Sym("mask"),
            zero=self.zero,
            others=self.others,
            base=index.dims,
        )
        for t in self.info.row_space:
            ev.provided[t] = self._keep_reader(t)
        return ev

    def reduced_input(self, ev: _FullEvaluator, body: Body, red: Node, index: Index) -> str:
        """The reduction's input over the block, masked-out columns neutral."""
        src = red.inputs[0]
        v = ev.value(src, index)
        if v in ev.neutral_loads and self.others[src] == self._neutral_of(red):
            return v  # loaded with other=neutral
        return body.let(f"tl.where(mask, {v}, {self._neutral_of(red)})", "v")

    def _neutral_of(self, red: Node) -> str:
        return _neutral(red.op, self._dtype(red))

    def _dtype(self, red: Node) -> str:
        return compute_dtype(self.graph.types[red.inputs[0]].dtype)

    def _is_float(self, red: Node) -> bool:
        return self._dtype(red) in ir.FLOATS

    def _arg(self, red: Node) -> tuple[str, str]:
        """(combine function, masked-out index) of an arg-max / arg-min."""
        last = bool(red.attrs["select_last_index"])
        fn = _arg_helper(red.op, last)
        self.body.use(fn)
        return fn.name, ("-1" if last else str(2**31 - 1))

    def store_full(self, ev: Evaluator, body: Body, index: Index, tensors) -> None:
        if not tensors:
            return
        body.comment("compute and store the full-space outputs")
        offset = body.text(body.let(linearise(index.dims, self.info.x, body), "o"))
        for t in tensors:
            store(body, self.graph, self.pointers, t, offset, ev.value(t, index), "mask")

    def _full_writes(self, depth: int | None = None) -> list[str]:
        return [
            t
            for t in self.writes
            if t not in self.info.row_space and (depth is None or self.info.depth_of(t) == depth)
        ]

    def _phase(self, p: int) -> list[Node]:
        return [r for r in self.reductions if self.info.depth_of(r.name) == p]

    # -- single pass --------------------------------------------------------

    def single_pass(self) -> None:
        b = self.body
        b.comment("the whole row at once")
        index = self.columns(b, None)
        ev = self.full_evaluator(b, index)
        for p in range(1, self.info.phases + 1):
            for red in self._phase(p):
                b.comment(f"{red.op.value} along the row")
                v = self.reduced_input(ev, b, red, index)
                self.row_vars[red.name] = self._reduce_block(red, v)
        self.store_full(ev, b, index, self._full_writes())

    def _reduce_block(self, red: Node, v: str) -> str:
        """Reduce a [BLOCK_ROWS, BLOCK_COLS] block along axis 1."""
        b = self.body
        if red.op is Op.SUM:
            return b.let(f"tl.sum({v}, axis=1, keep_dims=True)", "r")
        if red.op is Op.PROD:
            b.use(PROD)
            return b.let(f"tl.reduce({v}, 1, _prod, keep_dims=True)", "r")
        if red.op in (Op.RMAX, Op.RMIN):
            fn = "max" if red.op is Op.RMAX else "min"
            if self._is_float(red):
                b.use(NAN_HELPERS[fn][0])
                return b.let(f"_row_{fn}({v})", "r")
            return b.let(f"tl.{fn}({v}, axis=1, keep_dims=True)", "r")
        fn, sentinel = self._arg(red)
        idx = b.let(f"tl.where(mask, cols, {sentinel})", "j")
        return self._arg_result(b, f"tl.reduce(({v}, {idx}), 1, {fn}, keep_dims=True)")

    def _arg_result(self, b: Body, reduce_expr: str) -> str:
        name = b.fresh("r")
        b.raw(f"_, {name} = {reduce_expr}")
        return b.let(f"{name}.to(tl.int64)", "r")

    # -- looped -------------------------------------------------------------

    def looped(self) -> None:
        info, b = self.info, self.body
        for p in range(1, info.phases + 1):
            loop = b.fork(b.indent + "    ")
            index = self.columns(loop, "c0")
            ev = self.full_evaluator(loop, index)
            init, finish = [], []
            for red in self._phase(p):
                v = self.reduced_input(ev, loop, red, index)
                self._accumulate(red, v, loop, init, finish)
            # full-space outputs ready before this phase are stored on the way
            self.store_full(ev, loop, index, self._full_writes(p - 1))
            names = ", ".join(r.op.value for r in self._phase(p))
            b.comment(f"pass {p}: {names} over column blocks")
            b.lines += [f"{b.indent}{line}" for line in init]
            b.raw(f"for c0 in range(0, {info.length}, BLOCK_COLS):")
            b.lines += loop.lines
            for red, expr in finish:
                if isinstance(expr, tuple):
                    self.row_vars[red] = self._arg_result(b, expr[0])
                else:
                    self.row_vars[red] = b.let(expr, "r")
        last = self._full_writes(info.phases)
        if last:
            loop = b.fork(b.indent + "    ")
            index = self.columns(loop, "c0")
            ev = self.full_evaluator(loop, index)
            self.store_full(ev, loop, index, last)
            b.comment(f"pass {info.phases + 1}: the epilogue over column blocks")
            b.raw(f"for c0 in range(0, {info.length}, BLOCK_COLS):")
            b.lines += loop.lines

    def _accumulate(self, red: Node, v: str, loop: Body, init: list, finish: list) -> None:
        """Block-shaped partial results across the loop, reduced after it."""
        dt = TL_DTYPE[self._dtype(red)]
        self.accumulators += 1
        acc = f"acc{self.accumulators}"
        shape = "[BLOCK_ROWS, BLOCK_COLS]"
        neutral = self._neutral_of(red)
        if red.op is Op.SUM:
            init.append(f"{acc} = tl.zeros({shape}, dtype={dt})")
            loop.raw(f"{acc} += {v}")
            finish.append((red.name, f"tl.sum({acc}, axis=1, keep_dims=True)"))
        elif red.op is Op.PROD:
            init.append(f"{acc} = tl.full({shape}, 1, dtype={dt})")
            loop.raw(f"{acc} *= {v}")
            loop.use(PROD)
            finish.append((red.name, f"tl.reduce({acc}, 1, _prod, keep_dims=True)"))
        elif red.op in (Op.RMAX, Op.RMIN):
            fn = "max" if red.op is Op.RMAX else "min"
            init.append(f"{acc} = tl.full({shape}, {neutral}, dtype={dt})")
            if self._is_float(red):
                loop.use(NAN_HELPERS[fn][0])
                loop.use(NAN_HELPERS[fn][1])
                loop.raw(f"{acc} = _{fn}imum_nan({acc}, {v})")
                finish.append((red.name, f"_row_{fn}({acc})"))
            else:
                loop.raw(f"{acc} = tl.{fn}imum({acc}, {v})")
                finish.append((red.name, f"tl.{fn}({acc}, axis=1, keep_dims=True)"))
        else:
            fn, sentinel = self._arg(red)
            idx = f"{acc}_index"
            init.append(f"{acc} = tl.full({shape}, {neutral}, dtype={dt})")
            init.append(f"{idx} = tl.full({shape}, {sentinel}, dtype=tl.int32)")
            j = loop.let(f"tl.where(mask, cols, {sentinel})", "j")
            loop.raw(f"{acc}, {idx} = {fn}({acc}, {idx}, {v}, {j})")
            finish.append((red.name, (f"tl.reduce(({acc}, {idx}), 1, {fn}, keep_dims=True)",)))

    # -- split --------------------------------------------------------------

    def split(self) -> None:
        info, b = self.info, self.body
        reds = self._phase(1)
        partials = self.pointers.get(SPLIT_K_PARTIALS)
        counters = self.pointers.get(SPLIT_K_COUNTERS)
        slots = len(reds)
        b.comment("split: SPLIT_K programs share each block of rows, each its share of columns")
        b.raw("pid_k = tl.program_id(1)" + (".to(tl.int64)" if self.wide_cols else ""))
        b.raw(f"c_share = tl.cdiv(tl.cdiv({info.length}, BLOCK_COLS), SPLIT_K) * BLOCK_COLS")
        b.raw("c_lo = pid_k * c_share")
        b.raw(f"c_hi = tl.minimum(c_lo + c_share, {info.length})")
        loop = b.fork(b.indent + "    ")
        index = self.columns(loop, "c0", "c_hi")
        ev = self.full_evaluator(loop, index)
        init, finish = [], []
        for red in reds:
            v = self.reduced_input(ev, loop, red, index)
            self._accumulate(red, v, loop, init, finish)
        self.store_full(ev, loop, index, self._full_writes(0))
        b.comment(f"this program's share: {', '.join(r.op.value for r in reds)} over column blocks")
        b.lines += [f"{b.indent}{line}" for line in init]
        b.raw("for c0 in range(c_lo, c_hi, BLOCK_COLS):")
        b.lines += loop.lines
        b.comment("its partial results to its slots; the block's last program combines them")
        for j, (_, expr) in enumerate(finish):
            part = b.let(expr, "r")
            slot = f"{partials} + (pid_k * {slots} + {j}) * {info.rows} + rows"
            b.raw(f"tl.store({slot}, {part}, mask=row_mask)")
        b.raw("tl.debug_barrier()  # every thread's partial stored before the arrival counts")
        b.raw(f"counter = {counters} + pid")
        b.raw('arrived = tl.atomic_add(counter, 1, sem="acq_rel")')
        b.raw("if arrived == SPLIT_K - 1:")
        last = b.fork(b.indent + "    ")
        last.comment("the S slots combined in slot order")
        for j, (red, _) in enumerate(finish):
            node = self.graph.producer[red]
            total = last.fresh("t")
            last.raw(
                f"{total} = tl.full([BLOCK_ROWS, 1], {self._neutral_of(node)}, dtype=tl.float32)"
            )
            last.raw("for s in tl.static_range(SPLIT_K):")
            slot = f"{partials} + (s * {slots} + {j}) * {info.rows} + rows"
            last.raw(
                f"    p = tl.load({slot}, mask=row_mask, other={self._neutral_of(node)}, "
                'cache_modifier=".cg")'
            )
            last.raw(f"    {total} = {self._combine(node, total, 'p', last)}")
            self.row_vars[red] = total
        last.raw("tl.atomic_xchg(counter, 0)  # zero for the next launch")
        self.body = last  # the row epilogue and stores: in the last program's branch
        self.row_ev = Evaluator(
            self.graph, self.inside, last, self.pointers, mask=Sym("row_mask"), zero=self.zero
        )
        for r in self.reductions:
            self.row_ev.provided[r.name] = self._reduction_reader(r.name)
        self.store_rows()
        b.lines += last.lines
        self.body = b

    def _combine(self, red: Node, a: str, p: str, body: Body) -> str:
        """Two partial results of ``red`` combined (NaN propagating)."""
        if red.op is Op.SUM:
            return f"{a} + {p}"
        if red.op is Op.PROD:
            return f"{a} * {p}"
        fn = "max" if red.op is Op.RMAX else "min"
        body.use(NAN_HELPERS[fn][1])
        return f"_{fn}imum_nan({a}, {p})"

    # -- row outputs and the source -----------------------------------------

    def store_rows(self) -> None:
        rows = [t for t in self.writes if t in self.info.row_space]
        if not rows:
            return
        self.body.comment("store the row outputs (one value per row)")
        for t in rows:
            v = self.row_value(t)
            store(self.body, self.graph, self.pointers, t, "rows", v, "row_mask")

    def source(self) -> KernelSource:
        info = self.info
        splits = split_k(self.k.config)
        if splits > 1:
            traffic = (
                f"split: {splits} programs per block of rows, each a share of the columns; "
                f"{self.pointers.name(SPLIT_K_PARTIALS)}: fp32 partial results written "
                "and read back"
            )
        elif info.looped:
            passes = info.phases + (1 if self._full_writes(info.phases) else 0)
            traffic = f"looped: {passes} pass{'es' if passes > 1 else ''} over each row"
        else:
            traffic = "single pass: each row held on chip, inputs read once"
        doc = describe(self.graph, self.k, self.writes, self.pointers)
        doc.append(f"  {traffic}; reduced axes {list(info.axes)}")
        return KernelSource(
            name=self.name,
            doc=doc,
            params=self.pointers.params(),
            config=self.k.config,
            body=self.body.code(),
            grid=[
                f"    grid = (triton.cdiv({info.rows}, BLOCK_ROWS), SPLIT_K)"
                if splits > 1
                else f"    grid = (triton.cdiv({info.rows}, BLOCK_ROWS),)"
            ],
            helpers=self.body.helpers,
        )
