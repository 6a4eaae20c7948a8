"""The scan template: a cumulative sum along one axis of X, with its prologue
and epilogue.

X (``k.space``) is viewed as rows (its positions off the axis) of
``length`` columns; each program takes ``BLOCK_ROWS`` rows.  A short row is
one ``[BLOCK_ROWS, BLOCK_COLS]`` block: its values (through the prologue,
as the Evaluator computes them at the element's index) are scanned with
``tl.cumsum`` along axis 1.  A long row is scanned block by block, each
block's scan plus the row's running sum so far (``carry``), which then
grows by the block's total; a reverse scan walks the blocks from the end.
An exclusive scan subtracts each element's own value.  The epilogue reads
the scan's value at the same index and every output is stored there.

Memory traffic: each input read once, each output written once.
"""

from __future__ import annotations

import math

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
from orchestrate.emit.expr import Sym
from orchestrate.emit.source import KernelSource, describe, pointers, store
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec
from orchestrate.shapes.symint import upper


def scan(graph: Graph, k: KernelSpec, writes: tuple[str, ...], name: str) -> KernelSource:
    info = k.roles
    c = graph.producer[info.reductions[0]]
    axis, reverse, exclusive = c.attrs["axis"], c.attrs["reverse"], c.attrs["exclusive"]
    body = Body()
    ptrs = pointers(graph, k, writes)
    wide = upper(math.prod(info.x)) >= 2**31
    body.comment(f"{info.rows} rows of {info.length}: BLOCK_ROWS rows per program")
    body.raw("pid = tl.program_id(0)")
    start = "pid.to(tl.int64) * BLOCK_ROWS" if wide else "pid * BLOCK_ROWS"
    body.raw(f"rows = {start} + tl.arange(0, BLOCK_ROWS)[:, None]")
    body.raw(f"row_mask = rows < {info.rows}")
    zero = body.lazy("zero_r", "rows * 0")
    rows = Sym("rows", 0, info.rows)
    at = len(body.lines)
    keep_dims = split_linear(body, rows, info.keep)
    if len(body.lines) > at:
        body.lines.insert(at, f"{body.indent}# index of each row into the kept dimensions")
    acc = TL_DTYPE[compute_dtype(c.dtype)]
    if info.looped:
        body.comment(
            f"the row in blocks of BLOCK_COLS{', from the end' if reverse else ''}, "
            "its running sum carried"
        )
        body.raw(f"carry = tl.zeros([BLOCK_ROWS, 1], dtype={acc})")
        body.raw(f"n_blocks = tl.cdiv({info.length}, BLOCK_COLS)")
        body.raw("for kb in range(0, n_blocks):")
        loop = body.fork(body.indent + "    ")
        loop.raw("c0 = (n_blocks - 1 - kb) * BLOCK_COLS" if reverse else "c0 = kb * BLOCK_COLS")
        first = "c0 + "
    else:
        body.comment("the whole row at once")
        loop, first = body, ""
    loop.raw(f"cols = {first}tl.arange(0, BLOCK_COLS)[None, :]")
    loop.raw(f"mask = row_mask & (cols < {info.length})")
    cols = Sym("cols", 0, info.length)
    dims = tuple(cols if i == axis else d for i, d in enumerate(keep_dims))
    if axis == len(info.x) - 1 and info.rows != 1:  # rows are contiguous
        loop.linear_of[(dims, info.x)] = rows * info.length + cols
    ev = Evaluator(graph, set(k.nodes), loop, ptrs, mask=Sym("mask"), zero=zero)
    index = Index(dims)
    v = ev.value(c.inputs[0], index)
    v = loop.let(f"tl.where(mask, {v}, {literal(0, compute_dtype(c.dtype))})", "v")
    loop.comment(
        f"{'exclusive ' if exclusive else ''}{'reverse ' if reverse else ''}scan of the block"
    )
    s = loop.let(f"tl.cumsum({v}, axis=1{', reverse=True' if reverse else ''})", "s")
    if exclusive:
        s = loop.let(f"{s} - {v}", "s")
    if info.looped:
        s = loop.let(f"{s} + carry", "s")
        loop.raw(f"carry += tl.sum({v}, axis=1, keep_dims=True)")
    ev.provided[c.name] = lambda at: _at(at, index, s, name)
    loop.comment("the epilogue at the element's index, and the stores")
    offset = loop.text(loop.let(linearise(dims, info.x, loop), "o"))
    for t in writes:
        store(loop, graph, ptrs, t, offset, ev.value(t, index), "mask")
    if info.looped:
        body.lines += loop.lines
    doc = describe(graph, k, writes, ptrs)
    doc.append(
        f"  scan along axis {axis}: "
        + ("blocks of a row one after another, each carrying" if info.looped else "rows held whole")
        + "; inputs read once, outputs written once"
    )
    return KernelSource(
        name=name,
        doc=doc,
        params=ptrs.params(),
        config=k.config,
        body=body.code(),
        grid=[f"    grid = (triton.cdiv({info.rows}, BLOCK_ROWS),)"],
        helpers=body.helpers,
    )


def _at(index: Index, expected: Index, value: str, name: str) -> str:
    if index.dims != expected.dims:  # the rule keeps the epilogue elementwise
        raise AssertionError(f"{name}: the scan is read at another element")
    return value
