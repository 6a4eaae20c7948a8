"""The pointwise template: one program per BLOCK output elements.

Every output of the kernel has the iteration shape; each program maps its
flat offsets to a multi-index and evaluates the kernel's primitives there
(layout primitives become index arithmetic, see codegen.py).

Memory traffic: each input read once (broadcast inputs hit the cache), each
output written once.
"""

from __future__ import annotations

import math

from orchestrate.emit.codegen import Body, Evaluator, Index, Pointers, split_linear
from orchestrate.emit.source import KernelSource, describe, store
from orchestrate.ir import Graph
from orchestrate.kernels.templates import Kernel

MAX_BLOCK = 1024


def pointwise(graph: Graph, k: Kernel, writes: tuple[str, ...], name: str) -> KernelSource:
    numel = math.prod(k.space)
    body = Body()
    pointers = Pointers()
    body.comment("map the program id to a block of output elements")
    body.raw("pid = tl.program_id(0)")
    wide = numel >= 2**31
    body.raw("offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)" if wide
             else "offs = pid * BLOCK + tl.arange(0, BLOCK)")  # fmt: skip
    body.raw(f"mask = offs < {numel}")
    body.comment(f"multi-index into the iteration space {list(k.space)}")
    index = Index(split_linear(body, "offs", k.space))
    ev = Evaluator(graph, set(k.nodes), body, pointers, mask="mask", zero="offs * 0")
    body.comment("load and compute")
    results = {t: ev.value(t, index) for t in writes}
    body.comment("store")
    for t in writes:
        store(body, graph, pointers, t, "offs", results[t], "mask")
    args = list(pointers.items())
    block = min(MAX_BLOCK, 1 << max(0, (numel - 1).bit_length()))
    launcher = [
        f"    grid = (triton.cdiv({numel}, BLOCK),)",
    ]
    return KernelSource(
        name=name,
        doc=describe(graph, k, writes),
        args=args,
        constexprs={"BLOCK": block},
        interpret_constexprs={
            "BLOCK": min(1 << 16, max(block, 1 << max(0, (numel - 1).bit_length())))
        },
        body=body.lines,
        grid=launcher,
    )
