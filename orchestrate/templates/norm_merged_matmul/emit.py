"""The norm_merged_matmul template: merged sibling matmuls of a normalised activation.

    C_i[batch, M, N_i] = norm(x)[batch, M, K] @ W_i[K, N_i]    for each segment i

The grid and segment selection are the merged matmul's (``templates/merged_matmul/emit.py``:
each segment's tiles in turn, a program finds its weight, width and first
tile from its program id); the K loop and what follows it are norm_matmul's
(``templates/norm_matmul/emit.py``): raw x tiles through x's own prologue, each row's
running mean and sum of squared deviations, the A tile times gamma, and each
shift's column vector @ the segment's W tile; after the loop the row values
scale the accumulator and the shifts are added, then the segment's own
epilogue and stores.

Memory traffic: x (instead of the normalised tensor n, never written) read
by every column of tiles of every segment (from L2: one launch), each weight
and epilogue input once, each output written once.  Each program recomputes
its rows' statistics.
"""

from __future__ import annotations

import math

from orchestrate.emit.body import Body
from orchestrate.emit.codegen import Evaluator, Index, split_linear
from orchestrate.emit.expr import Const, Sym
from orchestrate.emit.source import KernelSource, describe, pointers, store
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec, segment_specs
from orchestrate.templates.matmul.emit import epilogue, grouped_tile
from orchestrate.templates.merged_matmul.emit import select_segment
from orchestrate.templates.norm_matmul.emit import _monomial, _sum, _times, statistics_loop
from orchestrate.templates.norm_merged_matmul.rule import NormSiblings


def norm_merged_matmul(
    graph: Graph, k: KernelSpec, writes: tuple[str, ...], name: str
) -> KernelSource:
    roles = k.roles
    assert isinstance(roles, NormSiblings)
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
        f"{len(segments)} matmuls of norm(x) as one: the grid "
        "holds each segment's tiles in turn; the norm's row factors move past the dots"
    )
    start = select_segment(body, ptrs, roles, m)
    grouped_tile(body, m, "n", pid=f"tile - {start}")
    body.raw("pid_b = tl.program_id(1)")
    pid_b = Sym("pid_b", 0, nbatch, lane=False)
    bdims = split_linear(body, pid_b, tuple(batch), "b") if batch else ()
    rm = Sym("rm[:, None]", 0, m)
    body.comment("row and column offsets of the tile")
    body.raw("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    body.raw("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
    body.raw(f"mask_m = rm < {m}")
    body.raw("mask_n = rn < n")
    zero_a = body.lazy("zero_a", "tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.int32)")

    def weight(loop: Body) -> str:
        loop.raw("w = tl.load(w_ptr + rk[:, None] * n + rn[None, :], mask=mask_b, other=0.0)")
        return "w"

    # -- one K loop for every segment: raw x tiles, their statistics, the dot --------
    shifted = statistics_loop(
        graph,
        body,
        ptrs,
        roles,
        bdims,
        rm,
        (*batch, m, kk),
        zero_a,
        weight,
        a_t.dtype,
        k.config.precision,
        f"walk K = {kk} in BLOCK_K steps: x tiles shared by all segments, W tiles "
        "from this segment's weight",
    )

    # -- row values from the statistics, then each segment's epilogue ---------------
    body.comment("the row values: the graph's row nodes on the statistics")
    rows_index = Index(bdims + (rm, Const(0)), None)
    rows = Evaluator(graph, set(roles.rows), body, ptrs, broadcast_all=True)
    for s, stat in roles.sums:
        rows.provided[s] = lambda _, stat=stat: _sum(body, rows, rows_index, stat, kk)
    terms = [_times(_monomial(body, rows, rows_index, roles.scale), "acc")]
    for j, shift in enumerate(roles.shifts):
        terms.append(_times(_monomial(body, rows, rows_index, shift), f"{shifted[j]}[None, :]"))
    body.raw(f"acc = {' + '.join(terms)}")
    body.comment("the segment's epilogue on the accumulator tile, then its stores")
    for i, (seg_roles, seg) in enumerate(zip(roles.segments, segments)):
        last = i == len(segments) - 1
        body.raw("else:" if last else f"{'if' if i == 0 else 'elif'} tile < end_{i}:")
        branch = body.fork(body.indent + "    ")
        width = seg_roles.stop - seg_roles.start
        branch.comment(
            f"segment {i}: columns [{seg_roles.start}, {seg_roles.stop}) of the merged weights"
        )
        mine = tuple(t for t in writes if t in seg.nodes and t not in roles.prologue)
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
        "  traffic: x read by every column of tiles of every segment "
        "(from L2: one launch), each weight once, each output written once",
        "  the normalised A operand is never written: x is read in its place",
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
