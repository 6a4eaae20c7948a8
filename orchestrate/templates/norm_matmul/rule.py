"""The norm-past-matmul rule: an RMSNorm or LayerNorm and the matmul it feeds, as one kernel.

Fission leaves a normalisation over the last axis as row sums and
elementwise nodes (``decompose/normalization.py``; exporters' Pow /
ReduceMean / Sqrt / Reciprocal spell it the same way):

    S  = SUM(f(x), last axis, keepdims)    one or two: mean, mean of squares or of (x - mean)^2
    r  = row nodes of S                    scale by 1/K, add eps, sqrt, reciprocal, ...
    n  = x * r * g            (RMS)        g, b constant column vectors (gamma, beta)
    n  = (x - mu) * r * g + b (LayerNorm)
    C  = MATMUL(n, W)                      W constant, K = the normalised axis
    Z  = elementwise(C, ...)               optionally: bias, activation, residual

As two kernels a row-reduce writes n (M x K) and the matmul reads it.  The
row factors are constant along K, so they move past the dot, exactly in
real arithmetic:

    RMS:  (x r g) @ W            = r * ((x g) @ W)
    LN:   ((x - mu) r g + b) @ W = r * ((x g) @ W) - (mu r) * (g @ W) + (b @ W)

The replacement (``templates/norm_matmul/emit.py``) is one matmul kernel whose K loop
loads raw x tiles (through x's own elementwise prologue, a residual add say),
accumulates each row's mean and sum of squared deviations beside the dot,
and multiplies the A tile by g before it; the column vectors g @ W and b @ W
are summed in the same loop.  After the loop the row values come from the
statistics and scale the accumulator; then the usual epilogue and stores.
n is never written: the kernel may leave it to others (a row-reduce that
writes it, or another norm_matmul kernel recomputing the statistics for the
next projection), and the linear program weighs that.

How n is read: as a linear form in x, ``n = a * x + b``, whose coefficients
are sums of monomials (a scale, row values and constant column vectors, each
to the power 1 or -1), built by walking n's nodes back to x (add, sub, neg,
mul, div by a row value, float casts).  The rule needs the x coefficient to
be one monomial (one row factor times one column factor: ``roles.scale``);
each monomial of b (``roles.shifts``) becomes one column vector summed in the
K loop.  Each sum is read the same way, as a linear form in x or the product
of two (a square), with row-valued coefficients only (``roles.sums``); the
kernel forms it from the statistics as ``a a' M2 + K e e'`` with ``e = a *
mean + b`` (``M2`` the sum of squared deviations), so (x - mu)^2 summed costs
no cancellation.  Float casts inside the norm are treated as exact: the
kernel computes the norm in fp32 and casts only the dot's operand.

The check declines, with the reason: a sum not over the matmul's K axis, a
reduction that is not a sum, gamma, beta or W not constants, n not affine in
one tensor, a node that is none of norm, matmul or epilogue, and tiles that
do not fit.  No split-K: each program needs the whole row for its statistics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrate import ir
from orchestrate.ir import Graph, Op
from orchestrate.kernels import config, fit
from orchestrate.kernels.region import (
    POINTWISE_OPS,
    Region,
    ancestors_within,
    convexity,
    descendants_within,
    region,
)
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import NORM_MATMUL, Anchored, KernelSpec, Rejection, Target

DOT_DTYPES = ("float16", "bfloat16", "float32")
MAX_BATCH = 65535  # the batch runs on grid axis 1
WIDE = 2**31  # offsets are int32

# scale x the product of row values and of constant column vectors, each
# (tensor, exponent 1 or -1), sorted
Factors = tuple[tuple[str, int], ...]
Monomial = tuple[float, Factors, Factors]
Linear = tuple[tuple[Monomial, ...], tuple[Monomial, ...]]  # (coefficient of x, the rest)


@dataclass(frozen=True)
class NormMatmul(Anchored):
    """A norm folded into a matmul.  ``prologue``: every node upstream of
    the matmul (what the kernel computes besides the dot); ``epilogue`` as a
    matmul's.  The spec's renaming and the matmul cost and fit models read
    it as an ``Anchored``."""

    x: str = ""  # the tensor normalised, rows of K, made on the A tiles
    feed: tuple[str, ...] = ()  # set nodes computing x from memory (x's prologue)
    rows: tuple[str, ...] = ()  # the sums and the row values computed from them
    sums: tuple[tuple[str, tuple[Linear, ...]], ...] = ()  # each sum's input: L or L * L'
    scale: Monomial = (1.0, (), ())  # n = scale * x + sum(shifts)
    shifts: tuple[Monomial, ...] = ()


def _judges(graph: Graph, r: Region) -> bool:
    return len(r.anchors) == 1 and r.anchors[0].op is Op.MATMUL and bool(r.reductions)


def norm_matmul(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    """One matmul kernel with the norm moved past its dot, or why not."""
    found = analyse(graph, r)
    if isinstance(found, Rejection):
        return found
    mm = graph.producer[found.anchor]
    a = graph.types[mm.inputs[0]]
    *batch, m, n = mm.shape
    # no split-K (sms 0): every program walks whole rows for their statistics
    configs = config.matmul(m, n, a.shape[-1], a.dtype, target.tf32, math.prod(batch), 0)
    optional = tuple(e for e in r.exposed if e in found.epilogue or e == found.anchor)
    return accept(graph, RULE, r, mm.shape, found, optional, configs, target)


def analyse(graph: Graph, r: Region) -> NormMatmul | Rejection:
    """The roles of the set's nodes, or why the norm cannot move past the matmul."""
    mm = r.anchors[0]
    n, w = mm.inputs
    nt, wt = graph.types[n], graph.types[w]
    if n not in r.inside:
        return Rejection(f"{mm.name}'s first operand {n} is not computed in the set")
    if w in r.inside or w not in graph.constants:
        return Rejection(f"{mm.name}'s weight {w} is not a constant")
    if nt.shape[:-1] != mm.shape[:-1]:
        return Rejection(f"{n} {list(nt.shape)} is broadcast into {mm.name} {list(mm.shape)}")
    if nt.dtype not in DOT_DTYPES or wt.dtype != nt.dtype:
        return Rejection(
            f"{mm.name} multiplies {nt.dtype} by {wt.dtype}: norm_matmul runs "
            "float16 / bfloat16 / float32 matmuls of one dtype"
        )
    reason = _check_sums(graph, r, n)
    if reason:
        return Rejection(reason)
    rows = _row_values(graph, r, nt.shape)
    down = descendants_within(graph, mm.name, r.inside)
    reason = _check_epilogue(graph, r, mm, down)
    if reason:
        return Rejection(reason)
    tainted = set().union(*(descendants_within(graph, s.name, r.inside) for s in r.reductions))
    forms = _Forms(graph, r.inside, rows, tainted, nt.shape)
    form = forms.linear(n)
    if isinstance(form, str):
        return Rejection(form)
    coefficient, rest = form
    if forms.x is None or len(coefficient) != 1:
        return Rejection(
            f"{n} is not x times one row factor and one column factor "
            f"(x's coefficient has {len(coefficient)} terms)"
        )
    sums = []
    for s in r.reductions:
        stat = forms.statistic(s.inputs[0])
        if isinstance(stat, str):
            return Rejection(stat)
        if any(f[2] for lin in stat for part in lin for f in part):
            return Rejection(f"{s.name} sums a value scaled per column (not a row statistic)")
        sums.append((s.name, stat))
    x = forms.x
    feed = ancestors_within(graph, x, r.inside) | {x} if x in r.inside else set()
    covered = feed | rows | forms.visited | down | {mm.name}
    stray = next((t for t in r.names if t not in covered), None)
    if stray is not None:
        op = graph.producer[stray].op.value
        return Rejection(f"{stray} ({op}) is neither the norm of {x}, {mm.name} nor its epilogue")
    bad = next((t for t in feed if graph.producer[t].op not in POINTWISE_OPS), None)
    if bad is not None:
        op = graph.producer[bad].op.value
        return Rejection(f"{bad} ({op}) cannot run on the loaded tiles of {x}")
    unwritten = next((s for s in r.sinks if s not in down and s != mm.name), None)
    if unwritten is not None:
        return Rejection(
            f"{unwritten} must be written, but the kernel never forms it "
            "(only the matmul and its epilogue are stored)"
        )
    big = next((t for t in (*r.inputs, *r.names) if graph.types[t].size >= WIDE), None)
    if big is not None:
        return Rejection(f"{big} has 2**31 elements or more (int32 offsets)")
    if math.prod(mm.shape[:-2]) > MAX_BATCH:
        return Rejection(f"batch of {math.prod(mm.shape[:-2])} exceeds grid axis 1")
    order = graph.position.__getitem__
    return NormMatmul(
        mm.name,
        tuple(t for t in r.names if t not in down and t != mm.name),
        tuple(t for t in r.names if t in down),
        x,
        tuple(sorted(feed, key=order)),
        tuple(sorted(rows, key=order)),
        tuple(sums),
        coefficient[0],
        rest,
    )


def _check_sums(graph: Graph, r: Region, n: str) -> str | None:
    shape = graph.types[n].shape
    last = len(shape) - 1
    for s in r.reductions:
        src = graph.types[s.inputs[0]].shape
        if s.op is not Op.SUM:
            return f"{s.name} ({s.op.value}) is not a sum: only means and sums normalise rows"
        axes = sorted(a % len(src) for a in s.attrs["axes"])
        if src != shape or axes != [last]:
            return (
                f"{s.name} reduces axes {axes} of {list(src)}, not the K axis of the "
                f"matmul (axis {last} of {n} {list(shape)})"
            )
        if not s.attrs["keepdims"]:
            return f"{s.name} drops the reduced axis (a norm keeps it to broadcast back)"
    return None


def _row_values(graph: Graph, r: Region, shape: tuple[int, ...]) -> set[str]:
    """The sums and the elementwise nodes computed from them and scalars only."""
    row_shape = (*shape[:-1], 1)
    rows = {s.name for s in r.reductions}
    for node in r.nodes:
        if node.name in rows or node.op not in ir.ELEMENTWISE or node.shape != row_shape:
            continue
        ins = node.inputs
        if any(i in rows for i in ins) and all(i in rows or _scalar(graph, i) for i in ins):
            rows.add(node.name)
    return rows


def _check_epilogue(graph: Graph, r: Region, mm, down: set[str]) -> str | None:
    for t in sorted(down, key=graph.position.__getitem__):
        node = graph.producer[t]
        if node.op not in ir.ELEMENTWISE:
            return f"{t} ({node.op.value}) cannot run in a matmul epilogue"
        if node.shape != mm.shape:
            return f"{t} {list(node.shape)} is not aligned with {mm.name} {list(mm.shape)}"
        for i in node.inputs:
            if i in r.inside and i not in down and i != mm.name:
                return f"{t} mixes the epilogue with norm value {i}"
    return None


def _scalar(graph: Graph, t: str) -> bool:
    c = graph.constants.get(t)
    return c is not None and c.size == 1


# -- the algebra of n: linear forms in x -------------------------------------------

X: Linear = (((1.0, (), ()),), ())


class _Forms:
    """Reads set values as linear forms in the one tensor ``x`` they normalise."""

    def __init__(self, graph: Graph, inside, rows: set[str], tainted: set[str], shape):
        self.graph, self.inside, self.rows, self.tainted = graph, inside, rows, tainted
        self.shape = tuple(shape)
        self.x: str | None = None
        self.visited: set[str] = set()

    def linear(self, t: str) -> Linear | str:
        g = self.graph
        if t == self.x:
            return X
        if t in self.rows:
            return ((), ((1.0, ((t, 1),), ()),))
        if t not in self.inside or t not in self.tainted:
            c = g.constants.get(t)
            if c is not None and c.size == 1:
                return ((), ((float(c.reshape(())), (), ()),))
            if self._column(t):
                if c is None:
                    return (
                        f"{t} scales the normalised rows but is not a constant "
                        "(gamma and beta must be)"
                    )
                return ((), ((1.0, (), ((t, 1),)),))
            return self._leaf(t)
        node = g.producer[t]
        self.visited.add(t)
        op, ins = node.op, node.inputs
        if op is Op.CAST and g.types[ins[0]].dtype in ir.FLOATS and node.dtype in ir.FLOATS:
            return self.linear(ins[0])
        if op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV) or op is Op.NEG:
            parts = [self.linear(i) for i in ins]
            bad = next((p for p in parts if isinstance(p, str)), None)
            if bad is not None:
                return bad
            if op is Op.NEG:
                return _scaled(parts[0], -1.0)
            p, q = parts
            if op is Op.ADD:
                return _add(p, q)
            if op is Op.SUB:
                return _add(p, _scaled(q, -1.0))
            if op is Op.DIV:
                if q[0] or len(q[1]) != 1 or q[1][0][0] == 0.0:
                    return f"{t} divides by {ins[1]}, which is not one row or column factor"
                q = ((), (_inverse(q[1][0]),))
            if p[0] and q[0]:
                return f"{t} multiplies x by x: the normalised tensor is not linear in x"
            return _times(p, q)
        return f"{t} ({op.value}) is not linear in the normalised rows"

    def statistic(self, t: str) -> tuple[Linear, ...] | str:
        """A sum's input as one linear form or the product of two."""
        g = self.graph
        while t != self.x and t in self.inside and g.producer[t].op is Op.CAST:
            self.visited.add(t)
            t = g.producer[t].inputs[0]
        node = g.producer.get(t) if t in self.inside else None
        if node is None or node.op not in (Op.MUL, Op.POW):
            form = self.linear(t)
            return form if isinstance(form, str) else (form,)
        u, v = node.inputs
        if node.op is Op.POW:
            c = g.constants.get(v)
            if c is None or c.size != 1 or float(c.reshape(())) != 2.0:
                return f"{t} raises to a power other than 2"
            v = u
        self.visited.add(t)
        p, q = self.linear(u), self.linear(v)
        bad = next((f for f in (p, q) if isinstance(f, str)), None)
        if bad is not None:
            return bad
        return (p, q) if p[0] and q[0] else (_times(p, q),)

    def _column(self, t: str) -> bool:
        """Whether ``t`` varies along the last axis only (a gamma or beta)."""
        s = self.graph.types[t].shape
        return (
            len(s) >= 1
            and len(s) <= len(self.shape)
            and s[-1] == self.shape[-1]
            and all(d == 1 for d in s[:-1])
        )

    def _leaf(self, t: str) -> Linear | str:
        if self.graph.types[t].shape != self.shape:
            return f"{t} {list(self.graph.types[t].shape)} is not a row-aligned part of the norm"
        if self.x is None:
            self.x = t
        elif self.x != t:
            return f"the norm reads two tensors as rows ({self.x}, {t})"
        return X


def _mono(scale: float, rows: Factors, cols: Factors) -> Monomial:
    return (scale, rows, cols)


def _merge(a: Factors, b: Factors) -> Factors:
    power: dict[str, int] = {}
    for t, e in (*a, *b):
        power[t] = power.get(t, 0) + e
    return tuple(sorted((t, e) for t, e in power.items() if e))


def _collect(terms: Sequence[Monomial]) -> tuple[Monomial, ...]:
    """Like monomials added, zeros dropped, in a fixed order."""
    total: dict[tuple[Factors, Factors], float] = {}
    for s, rows, cols in terms:
        total[(rows, cols)] = total.get((rows, cols), 0.0) + s
    return tuple(_mono(s, rows, cols) for (rows, cols), s in sorted(total.items()) if s != 0.0)


def _add(p: Linear, q: Linear) -> Linear:
    return _collect(p[0] + q[0]), _collect(p[1] + q[1])


def _scaled(p: Linear, c: float) -> Linear:
    a, b = p
    return tuple(_mono(s * c, r, k) for s, r, k in a), tuple(_mono(s * c, r, k) for s, r, k in b)


def _product(a: Sequence[Monomial], b: Sequence[Monomial]) -> tuple[Monomial, ...]:
    return _collect([_mono(s * t, _merge(r, q), _merge(k, m)) for s, r, k in a for t, q, m in b])


def _times(p: Linear, q: Linear) -> Linear:
    return _collect(_product(p[0], q[1]) + _product(q[0], p[1])), _product(p[1], q[1])


def _inverse(m: Monomial) -> Monomial:
    s, rows, cols = m
    return _mono(1.0 / s, tuple((t, -e) for t, e in rows), tuple((t, -e) for t, e in cols))


# -- the pattern -------------------------------------------------------------------


def propose(graph: Graph, nodes: Sequence[str]) -> list[tuple[str, ...]]:
    """Per matmul among ``nodes`` (a partition) whose first operand is
    computed by elementwise nodes from a row sum (no exp: not a softmax):
    the matmul with those nodes (each read only inside the set, but the
    operand itself), with and without x's own prologue (a residual add
    another kernel may already write), alone and with its epilogue chain.
    Sets the check then declines (a sum over another axis, a gamma that is
    an input) are judged all the same, so ``explain --rejected`` says why."""
    allowed = set(nodes)
    out: list[tuple[str, ...]] = []
    order = graph.position.__getitem__
    for name in nodes:
        mm = graph.producer[name]
        if mm.op is not Op.MATMUL or mm.inputs[0] not in allowed:
            continue
        norm = _norm_of(graph, mm.inputs[0], allowed)
        if norm is None:
            continue
        cores = [norm | {name}]
        r = region(graph, cores[0])
        found = r if isinstance(r, Rejection) else analyse(graph, r)
        if isinstance(found, NormMatmul) and found.feed:
            cores.append(cores[0] - set(found.feed))
        grown = _with_epilogue(graph, mm, allowed)
        for core in cores:
            out.append(tuple(sorted(core, key=order)))
            if grown and convexity(graph, core | grown) is None:
                out.append(tuple(sorted(core | grown, key=order)))
    return out


def _norm_of(graph: Graph, n: str, allowed: set[str]) -> set[str] | None:
    """``n`` and its elementwise / row-sum ancestors in ``allowed`` whose
    readers are all among them (``n`` itself may be read anywhere), when
    they hold a sum."""
    node = graph.producer[n]
    if node.op not in ir.ELEMENTWISE:
        return None
    names = {n}
    outputs = set(graph.outputs)
    grown = True
    while grown:
        grown = False
        for t in sorted({i for m in names for i in graph.producer[m].inputs} - names):
            p = graph.producer.get(t)
            if p is None or t not in allowed or t in outputs:
                continue
            if p.op not in POINTWISE_OPS and p.op is not Op.SUM:
                continue
            if all(c.name in names for c in graph.consumers.get(t, ())):
                names.add(t)
                grown = True
    ops = {graph.producer[t].op for t in names}
    return names if Op.SUM in ops and Op.EXP not in ops else None


def _with_epilogue(graph: Graph, mm, allowed: set[str]) -> set[str]:
    """The elementwise nodes after ``mm`` aligned with it (a bias, a GELU's
    several nodes, a residual add) whose inputs are epilogue values or do not
    depend on ``mm``."""
    after = descendants_within(graph, mm.name, allowed)
    names = {mm.name}
    for t in sorted(after, key=graph.position.__getitem__):
        c = graph.producer[t]
        if (
            c.op in ir.ELEMENTWISE
            and c.shape == mm.shape
            and all(i in names or i not in after for i in c.inputs)
        ):
            names.add(t)
    return names - {mm.name}


RULE = Rule(
    NORM_MATMUL,
    "RMSNorm / LayerNorm moved past the matmul it feeds: statistics in the K loop",
    _judges,
    norm_matmul,
    propose,
    working_set=fit.dot_tiles,
)
