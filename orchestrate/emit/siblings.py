"""The merged-matmul template: sibling matmuls of one activation, one launch.

    C_i[batch, M, N_i] = A[batch, M, K] @ W_i[K, N_i]    for each segment i

as A @ concat(W_0, W_1, ...) along N (``kernels/siblings.py``).  The grid
lists every segment's output tiles, segment after segment: programs
``[end_{i-1}, end_i)`` of grid axis 0 compute segment i, each one tile of
C_i exactly as the matmul template does (``emit/matmul.py``: grouped tile
order, K loop, fp32 accumulator), then that segment's own epilogue (its bias
add) and its stores.  The concatenation is done by the launch: a program
reads its own segment's weight and writes its own segment's outputs, so no
weight is copied and the consumers read the tensors they always read.

Memory traffic: A is read by every column of tiles of every segment (L2
serves the re-reads: one launch, its programs in flight together), each
weight and epilogue input once, each output written once.
"""

from __future__ import annotations

import math

from orchestrate.emit.body import Body
from orchestrate.emit.matmul import tile_program
from orchestrate.emit.source import KernelSource, describe, pointers
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec, Siblings, segment_specs


def merged_matmul(graph: Graph, k: KernelSpec, writes: tuple[str, ...], name: str) -> KernelSource:
    roles = k.roles
    assert isinstance(roles, Siblings)
    first = graph.producer[roles.anchor]
    *batch, m, _ = first.shape
    nbatch = math.prod(batch)
    body = Body()
    ptrs = pointers(graph, k, writes)
    segments = segment_specs(graph, k)
    body.comment(f"{len(segments)} matmuls of {ptrs.name(roles.activation)} as one: "
                 "which segment's tiles this program computes")  # fmt: skip
    body.raw("tile = tl.program_id(0)")
    ends = []
    for i, g in enumerate(roles.segments[:-1]):  # the last segment takes the rest
        n = g.stop - g.start
        before = f"end_{i - 1} + " if i else ""
        body.raw(f"end_{i} = {before}tl.cdiv({m}, BLOCK_M) * tl.cdiv({n}, BLOCK_N)")
        ends.append(f"end_{i}")
    for i, (g, seg) in enumerate(zip(roles.segments, segments)):
        last = i == len(segments) - 1
        body.raw("else:" if last else f"{'if' if i == 0 else 'elif'} tile < {ends[i]}:")
        branch = body.fork(body.indent + "    ")
        branch.comment(f"segment {i}: columns [{g.start}, {g.stop}) of the merged weights, "
                       f"{ptrs.name(g.weight)}")  # fmt: skip
        pid = f"tile - {ends[i - 1]}" if i else "tile"
        tile_program(graph, seg, tuple(t for t in writes if t in seg.nodes), name, branch, ptrs,
                     pid=pid)  # fmt: skip
        body.lines += branch.lines
    doc = describe(graph, k, writes, ptrs)
    doc += [f"  segment {i}: {ptrs.name(g.weight)} as columns [{g.start}, {g.stop}), written to "
            + ", ".join(ptrs.name(t) for t in writes if t in seg.nodes)
            for i, (g, seg) in enumerate(zip(roles.segments, segments))]  # fmt: skip
    doc += [f"  traffic: {ptrs.name(roles.activation)} read by every column of tiles of every "
            "segment (from L2: one launch), each weight once, each output written once"]  # fmt: skip
    tiles = " + ".join(f"triton.cdiv({m}, BLOCK_M) * triton.cdiv({g.stop - g.start}, BLOCK_N)"
                       for g in roles.segments)  # fmt: skip
    return KernelSource(
        name=name,
        doc=doc,
        params=ptrs.params(),
        config=k.config,
        helpers=body.helpers,
        body=body.code(),
        grid=[f"    grid = ({tiles}, {nbatch})"],
    )
