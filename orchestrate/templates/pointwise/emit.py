"""The pointwise template: one program per BLOCK output elements.

Every output of the kernel has the iteration shape; each program maps its
flat offsets to a multi-index and evaluates the kernel's primitives there
(layout primitives become index arithmetic, see codegen.py).

Memory traffic: each input read once (broadcast inputs hit the cache), each
output written once.
"""

from __future__ import annotations

import math

from orchestrate.emit.body import Body
from orchestrate.emit.codegen import Evaluator, Index, split_linear
from orchestrate.emit.expr import Sym
from orchestrate.emit.source import KernelSource, describe, pointers, store
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec
from orchestrate.shapes.symint import upper


def pointwise(graph: Graph, k: KernelSpec, writes: tuple[str, ...], name: str) -> KernelSource:
    numel = math.prod(k.space)
    body = Body()
    ptrs = pointers(graph, k, writes)
    body.comment("map the program id to a block of output elements")
    body.raw("pid = tl.program_id(0)")
    wide = upper(numel) >= 2**31
    body.raw(
        "offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)"
        if wide
        else "offs = pid * BLOCK + tl.arange(0, BLOCK)"
    )
    body.raw(f"mask = offs < {numel}")
    zero = body.lazy("zero", "offs * 0")  # block-shaped, for loads at a lane-invariant offset
    body.comment(f"multi-index into the iteration space {list(k.space)}")
    index = Index(split_linear(body, Sym("offs", 0, numel), k.space))
    ev = Evaluator(graph, set(k.nodes), body, ptrs, mask=Sym("mask"), zero=zero)
    body.comment("load and compute")
    results = {t: ev.value(t, index) for t in writes}
    body.comment("store")
    for t in writes:
        store(body, graph, ptrs, t, "offs", results[t], "mask")
    return KernelSource(
        name=name,
        doc=describe(graph, k, writes, ptrs),
        params=ptrs.params(),
        config=k.config,
        body=body.code(),
        grid=[f"    grid = (triton.cdiv({numel}, BLOCK),)"],
        helpers=body.helpers,
    )
