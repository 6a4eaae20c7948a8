"""The row-reduce rule: reductions over the same rows, with prologue and epilogue.

One or more reductions over the same axes of same-shaped inputs X.  A *row*
is one position of X's kept dimensions.  Each node of the set lives in one
of two spaces:

* full space (shape X, per element): the prologue before a reduction
  (``exp(x - max)``) and the epilogue after one (``(x - mean) * rstd``);
* row space (one value per row): the reductions and the elementwise or
  reshape nodes computed from row values only (``mean = sum / n``).

A full-space node reads a row value in keepdims form, broadcast along its
row.  The template evaluates every full-space node at the element's own
index, so a layout op (a transpose, slice, ...) may rearrange the prologue's
inputs but never a value computed from row results: that would read a row's
result at another row's position.  Reductions reading values that depend on
an earlier reduction form dependent phases (layernorm's variance).
"""

from __future__ import annotations

import math

from orchestrate import ir
from orchestrate.ir import Graph, Op
from orchestrate.kernels import config, fit
from orchestrate.kernels.region import POINTWISE_OPS, ROW_REDUCTIONS, Region, reduce_axes
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import ROW_REDUCE, KernelSpec, Rejection, Rows, Target

ROW_OPS = ir.ELEMENTWISE | {Op.RESHAPE, Op.IDENTITY}  # what may run on row values
MAX_ROW = 2**31  # column indices are int32


def _judges(r: Region) -> bool:
    return not r.anchors and bool(r.reductions)


def row_reduce(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    rows_ = analyse(graph, r)
    if isinstance(rows_, Rejection):
        return rows_
    x = rows_.x
    optional = tuple(
        e
        for e in r.exposed
        if (e in rows_.row_space and graph.types[e].size == rows_.rows)
        or (e not in rows_.row_space and graph.types[e].shape == x)
    )
    configs = config.row_reduce(rows_.rows, rows_.length, rows_.looped)
    return accept(graph, RULE, r, x, rows_, optional, configs, target)


def analyse(graph: Graph, r: Region) -> Rows | Rejection:
    """The row structure of the set, or why it has none."""
    first = r.reductions[0]
    x = graph.types[first.inputs[0]].shape
    axes = reduce_axes(first)
    for red in r.reductions[1:]:
        if graph.types[red.inputs[0]].shape != x or reduce_axes(red) != axes:
            return Rejection(
                f"reductions {first.name} and {red.name} run over different rows "
                f"({list(x)} axes {list(axes)} vs "
                f"{list(graph.types[red.inputs[0]].shape)} axes {list(reduce_axes(red))})"
            )
    rows = math.prod(d for i, d in enumerate(x) if i not in axes)
    length = math.prod(x[a] for a in axes)
    if length >= MAX_ROW:
        return Rejection(f"rows of {length} elements exceed int32 column indices")
    keep = tuple(1 if i in axes else d for i, d in enumerate(x))
    row_space: set[str] = set()
    from_rows: set[str] = set()  # full-space nodes computed from row values
    depth: dict[str, int] = {}
    for n in r.nodes:
        ins = [i for i in n.inputs if i in r.inside]
        depth[n.name] = max((depth[i] for i in ins), default=0) + (n.op in ROW_REDUCTIONS)
        if n.op in ROW_REDUCTIONS:
            if any(i in row_space for i in ins):
                return Rejection(f"{n.name} reduces a row-level value")
            row_space.add(n.name)
            continue
        if n.op not in POINTWISE_OPS:
            return Rejection(f"{n.name} ({n.op.value}) cannot run in a row-reduce kernel")
        rows_in = [i for i in ins if i in row_space]
        full_in = [i for i in ins if i not in row_space]
        if rows_in and not full_in and math.prod(n.shape) == rows:
            if n.op not in ROW_OPS:
                return Rejection(f"{n.name} ({n.op.value}) cannot run on row values")
            row_space.add(n.name)
            continue
        if n.shape != x:
            return Rejection(
                f"{n.name} {list(n.shape)} is neither a row value nor shaped like the "
                f"reduced input {list(x)}"
            )
        for i in rows_in:
            if graph.types[i].shape != keep:
                return Rejection(f"{n.name} broadcasts row value {i} that is not in keepdims form")
            if n.op not in ir.ELEMENTWISE:
                return Rejection(f"{n.name} ({n.op.value}) reads a row value through layout")
        moved = [i for i in full_in if i in from_rows]
        if moved and n.op in ir.LAYOUT and n.op is not Op.IDENTITY:
            return Rejection(
                f"{n.name} ({n.op.value}) moves {moved[0]}, computed from row results, across rows"
            )
        if rows_in or moved:
            from_rows.add(n.name)
    phases = max(depth[red.name] for red in r.reductions)
    return Rows(
        x,
        axes,
        rows,
        length,
        tuple(red.name for red in r.reductions),
        frozenset(row_space),
        tuple(depth.items()),
        phases,
        length > config.SINGLE_PASS_ROW,
    )


RULE = Rule(
    ROW_REDUCE,
    "reductions over the same rows with prologue, row ops and a broadcast "
    "epilogue (softmax, layernorm)",
    _judges,
    row_reduce,
    working_set=fit.row_reduce,
    covering=("BLOCK_COLS",),
)
