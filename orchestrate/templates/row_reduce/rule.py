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
from orchestrate.ir import Graph, Node, Op
from orchestrate.kernels import fit
from orchestrate.kernels.fit import WorkingSet
from orchestrate.kernels.region import POINTWISE_OPS, ROW_REDUCTIONS, Region, reduce_axes
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import ROW_REDUCE, KernelSpec, Rejection, Rows, Target, inlined
from orchestrate.templates.row_reduce import config as spaces

ROW_OPS = ir.ELEMENTWISE | {Op.RESHAPE, Op.IDENTITY}  # what may run on row values


def _judges(graph: Graph, r: Region) -> bool:
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
    splittable = _splittable(graph, rows_, r)
    if rows_.length >= spaces.WIDE_ROW and not splittable:
        return Rejection(
            f"rows of {rows_.length} elements need 64-bit columns, which only a split row "
            "reduce has (one phase of float sums, products, maxima or minima, nothing "
            "written from the row's result back over the row)"
        )
    configs = spaces.row_reduce(rows_.rows, rows_.length, rows_.looped, splittable)
    return accept(graph, RULE, r, x, rows_, optional, configs, target)


SPLIT_OPS = (Op.SUM, Op.PROD, Op.RMAX, Op.RMIN)


def _splittable(graph: Graph, rows_: Rows, r: Region) -> bool:
    """Whether several programs may share a row (a split row reduce): a
    looped row, one phase of float sums, products, maxima or minima, and
    nothing computed from a row's result over the row's elements (each
    program sees only its share of them; what it writes of its share before
    the reduction it may store)."""
    if not rows_.looped or rows_.phases != 1:
        return False
    for red in r.reductions:
        if red.op not in SPLIT_OPS or graph.types[red.inputs[0]].dtype not in ir.FLOATS:
            return False
    return not any(n.name not in rows_.row_space and rows_.depth_of(n.name) >= 1 for n in r.nodes)


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
        length > spaces.SINGLE_PASS_ROW,
    )


def working_set(graph: Graph, spec: KernelSpec) -> WorkingSet:
    """Shared memory only (a row reduce keeps nothing that spills): the
    cross-warp partial sums (``4 x BLOCK_ROWS`` per warp along the row), the
    layout change of a stored row value, the conversion of a per-row input
    loaded under the whole tile's mask, and of a tile whose loads mix 2- and
    4-byte elements (half activations, fp32 parameters)."""
    return WorkingSet(_row_reduce(graph, spec), False)


def _row_reduce(graph: Graph, spec: KernelSpec) -> int:
    c, rows = spec.config, spec.roles
    assert isinstance(rows, Rows)
    br, bc, warps = c["BLOCK_ROWS"], c["BLOCK_COLS"], c.num_warps
    if bc == 1:
        return 0
    warps_along = min(warps, math.ceil(bc / 128))
    partial = 4 * br * warps_along if warps_along >= 2 else 0
    stored_row = br * warps if any(t in rows.row_space for t in spec.outputs + spec.optional) else 0
    convert = 0
    for item in _per_row_loads(graph, spec, rows):
        convert = max(
            convert, br * bc * 8 if item == 8 else min(4 * br * bc, 128 * warps * max(br, 4))
        )
    if _mixed_widths(graph, spec):
        # a 2-byte tile is loaded 8 to a thread, a 4-byte one 4: meeting in one
        # expression, one of them changes layout through shared memory
        convert = max(convert, min(4 * br * bc, 128 * warps * max(br, 4)))
    return max(partial, stored_row, convert)


def _mixed_widths(graph: Graph, spec: KernelSpec) -> bool:
    """Whether the kernel reads tensors of both 2- and 4-byte elements (a
    half-precision activation next to fp32 parameters)."""
    sizes = {
        fit.itemsize(graph, t)
        for t in spec.inputs
        if not inlined(graph, t) and graph.types[t].size > 1
    }
    return {2, 4} <= sizes


def _per_row_loads(graph: Graph, spec: KernelSpec, rows: Rows) -> list[int]:
    """Item sizes of the inputs a full-space node reads once per row (a
    keepdims bias, a gather's index): loaded under the whole tile's mask."""
    if rows.rows == 1:
        return []
    out = []
    for n in spec.nodes:
        node = graph.producer[n]
        if n in rows.row_space:
            continue
        for j, t in enumerate(node.inputs):
            if t in spec.nodes or inlined(graph, t) or graph.types[t].size != rows.rows:
                continue
            if _per_row(graph, node, j, rows):
                out.append(fit.itemsize(graph, t))
    return out


def _per_row(graph: Graph, node: Node, j: int, rows: Rows) -> bool:
    """Whether input ``j`` of full-space ``node`` varies along kept axes only."""
    shape = graph.types[node.inputs[j]].shape
    if node.op is Op.GATHER:
        if j != 1:
            return False
        ax = node.attrs["axis"]
        return all(a not in rows.axes for a in range(ax, ax + len(shape)))
    if node.op not in _BROADCASTING:
        return False
    lead = len(node.shape) - len(shape)
    return all(shape[a - lead] == 1 for a in rows.axes if a >= lead)


_BROADCASTING = ir.BINARY | ir.TERNARY


RULE = Rule(
    ROW_REDUCE,
    "reductions over the same rows with prologue, row ops and a broadcast "
    "epilogue (softmax, layernorm)",
    _judges,
    row_reduce,
    working_set=working_set,
    covering=("BLOCK_COLS",),
)
