"""The merged-matmul template: sibling matmuls of one activation, one launch.

    C_i[batch, M, N_i] = A[batch, M, K] @ W_i[K, N_i]    for each segment i

as A @ concat(W_0, W_1, ...) along N (``templates/merged_matmul/rule.py``).  The grid
lists every segment's output tiles, segment after segment: programs
``[end_{i-1}, end_i)`` of grid axis 0 compute tiles of segment i.  A program
first selects its segment's weight pointer, width and first tile from its
program id, then runs the matmul template's body once for all segments
(``templates/matmul/emit.py``: grouped tile order, K loop with masked loads, fp32
accumulator), and ends in its segment's own epilogue (its bias add) and
stores.  The concatenation is done by the launch: a program reads its own
segment's weight and writes its own segment's outputs, so no weight is
copied and the consumers read the tensors they always read.  One K loop
(not one per segment) keeps one set of pipelined operand buffers in shared
memory, whatever the number of segments.

Memory traffic: A is read by every column of tiles of every segment (L2
serves the re-reads: one launch, its programs in flight together), each
weight and epilogue input once, each output written once.
"""

from __future__ import annotations

import math

from orchestrate.emit.body import Body
from orchestrate.emit.codegen import TL_DTYPE, Evaluator, Index, broadcast_index, split_linear
from orchestrate.emit.expr import Sym
from orchestrate.emit.source import KernelSource, describe, pointers, store
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec, Siblings, segment_specs
from orchestrate.templates.matmul.emit import (
    accumulator_dtype,
    epilogue,
    grouped_tile,
    multiply_accumulate,
)


def merged_matmul(graph: Graph, k: KernelSpec, writes: tuple[str, ...], name: str) -> KernelSource:
    roles = k.roles
    assert isinstance(roles, Siblings)
    segments = segment_specs(graph, k)
    a_t = graph.types[roles.activation]
    kk = a_t.shape[-1]
    *batch, m, _ = graph.producer[roles.anchor].shape
    nbatch = math.prod(batch)
    widths = [g.stop - g.start for g in roles.segments]
    body = Body()
    ptrs = pointers(graph, k, writes)

    # -- the segment: its weight, its width, its first tile ------------------------
    body.comment(
        f"{len(segments)} matmuls of {ptrs.name(roles.activation)} as one: the grid "
        "holds each segment's tiles in turn"
    )
    start = select_segment(body, ptrs, roles, m)
    body.comment(
        f"C{list(graph.producer[roles.anchor].shape[:-1])} x N = "
        f"A{list(a_t.shape)} @ W[{kk}, N]"
        + (f", batch {list(batch)} on grid axis 1" if batch else "")
    )
    grouped_tile(body, m, "n", pid=f"tile - {start}")
    body.raw("pid_b = tl.program_id(1)")
    if len(batch) > 1:
        body.comment(f"batch multi-index into {list(batch)}")
    bdims = (
        split_linear(body, Sym("pid_b", 0, nbatch, lane=False), tuple(batch), "b") if batch else ()
    )
    body.comment("row and column offsets of the tile")
    body.raw("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    body.raw("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
    body.raw(f"mask_m = rm < {m}")
    body.raw("mask_n = rn < n")
    zero_a = body.lazy("zero_a", "tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.int32)")
    acc_dtype = accumulator_dtype(a_t.dtype)
    body.raw(f"acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={TL_DTYPE[acc_dtype]})")

    # -- one K loop for every segment -----------------------------------------------
    body.comment(
        f"walk K = {kk} in BLOCK_K steps: A tiles shared by all segments, W tiles "
        "from this segment's weight"
    )
    body.raw(f"for k0 in range(0, {kk}, BLOCK_K):")
    loop = body.fork(body.indent + "    ")
    loop.raw("rk = k0 + tl.arange(0, BLOCK_K)")
    loop.raw(f"mask_k = rk < {kk}")
    loop.raw("mask_a = mask_m[:, None] & mask_k[None, :]")
    loop.raw("mask_b = mask_k[:, None] & mask_n[None, :]")
    rm, rk = Sym("rm[:, None]", 0, m), Sym("rk[None, :]", 0, kk)
    a_index = broadcast_index(Index(bdims + (rm, rk), Sym("mask_a")), (*batch, m, kk), a_t.shape)
    a = Evaluator(graph, set(), loop, ptrs, zero=zero_a, broadcast_all=True).value(
        roles.activation, a_index
    )
    loop.raw("w = tl.load(w_ptr + rk[:, None] * n + rn[None, :], mask=mask_b, other=0.0)")
    multiply_accumulate(loop, a, "w", a_t.dtype, k.config.precision)
    body.lines += loop.lines

    # -- each segment's own epilogue and stores ------------------------------------------
    body.comment("the segment's epilogue on the accumulator tile, then its stores")
    for i, (g, seg) in enumerate(zip(roles.segments, segments)):
        last = i == len(segments) - 1
        body.raw("else:" if last else f"{'if' if i == 0 else 'elif'} tile < end_{i}:")
        branch = body.fork(body.indent + "    ")
        width = g.stop - g.start
        branch.comment(f"segment {i}: columns [{g.start}, {g.stop}) of the merged weights")
        mine = tuple(t for t in writes if t in seg.nodes)
        dims = bdims + (rm, Sym("rn[None, :]", 0, width))
        results = epilogue(graph, seg, branch, ptrs, dims, "tl.int32", mine, name)
        row = f"rm[:, None] * {width}" if width != 1 else "rm[:, None]"
        batch_off = f"pid_b * {m * width} + " if nbatch != 1 else ""
        branch.raw(f"offs_c = {batch_off}{row} + rn[None, :]")
        for t in mine:
            store(branch, graph, ptrs, t, "offs_c", results[t], "mask_c")
        body.lines += branch.lines

    doc = describe(graph, k, writes, ptrs)
    doc += [
        f"  segment {i}: {ptrs.name(g.weight)} as columns [{g.start}, {g.stop}), written to "
        + ", ".join(ptrs.name(t) for t in writes if t in seg.nodes)
        for i, (g, seg) in enumerate(zip(roles.segments, segments))
    ]
    doc += [
        f"  traffic: {ptrs.name(roles.activation)} read by every column of tiles of every "
        "segment (from L2: one launch), each weight once, each output written once"
    ]
    tiles = " + ".join(f"triton.cdiv({m}, BLOCK_M) * triton.cdiv({n}, BLOCK_N)" for n in widths)
    return KernelSource(
        name=name,
        doc=doc,
        params=ptrs.params(),
        config=k.config,
        helpers=body.helpers,
        body=body.code(),
        grid=[f"    grid = ({tiles}, {nbatch})"],
    )


def select_segment(body: Body, ptrs, roles: Siblings, m: int) -> str:
    """Emit the mapping of program id 0 to this program's segment: its weight
    (``w_ptr``), its width (``n``); return the segment's first tile."""
    widths = [g.stop - g.start for g in roles.segments]
    body.raw("tile = tl.program_id(0)")
    for i, n in enumerate(widths[:-1]):  # the last segment takes the rest
        before = f"end_{i - 1} + " if i else ""
        body.raw(f"end_{i} = {before}tl.cdiv({m}, BLOCK_M) * tl.cdiv({n}, BLOCK_N)")
    body.comment("this program's segment: its weight, its width N and its first tile")
    w, n, start = _select(
        body,
        [ptrs.get(g.weight) for g in roles.segments],
        [str(x) for x in widths],
        ["0", *(f"end_{i}" for i in range(len(widths) - 1))],
    )
    body.raw(f"w_ptr = {w}")
    body.raw(f"n = {n}")
    return start


def _select(body: Body, *choices: list[str]) -> list[str]:
    """Per list of choices (one per segment), the expression that picks this
    program's: ``tl.where`` on the segment boundaries ``tile < end_i``."""
    out = []
    for values in choices:
        expr = values[-1]
        for i in range(len(values) - 2, -1, -1):
            expr = f"tl.where(tile < end_{i}, {values[i]}, {expr})"
        out.append(expr)
    return out
