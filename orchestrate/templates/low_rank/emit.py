"""The low_rank template: a matmul with a low-rank side branch, one K loop.

    Y[batch, M, N] = [x | alpha (x @ A)] @ [W ; B] + P's adds
                   = x @ W + alpha (x @ A) @ B + bias ...

(``rule.py``; x [.., M, K], W [K, N], A [K, r], B [r, N].)
One program per (BLOCK_M, BLOCK_N) tile, grouped as in the Triton matmul
tutorial.  Its K loop loads each x tile once and feeds two dots: the W tile
into the output tile's accumulator, the A tile (BLOCK_K, BLOCK_R) into
``acc_t``, x @ A for the tile's rows, kept in registers (BLOCK_R: the rank
padded to a power of two of at least 16, the padded columns masked to
zero).  After the loop the last r steps of the concatenated K: ``acc +=
(alpha acc_t) @ B``'s (BLOCK_R, BLOCK_N) tile.  Then P's adds on the
accumulator (the bias), which is the join's value, the epilogue after it,
and the stores.

Memory traffic: x and W strips re-read per column / row of tiles from L2 as
in a matmul, A once per column of tiles, a B tile once per program,
epilogue inputs once, outputs written once; x @ A, (x @ A) @ B and the
matmul's own result are never written.
"""

from __future__ import annotations

import math

from orchestrate.emit.body import Body
from orchestrate.emit.codegen import TL_DTYPE, Evaluator, Index, broadcast_index, split_linear
from orchestrate.emit.expr import Sym
from orchestrate.emit.source import KernelSource, describe, pointers, store
from orchestrate.ir import HALF, Graph, Op
from orchestrate.kernels.spec import KernelSpec
from orchestrate.templates.low_rank.roles import LowRank
from orchestrate.templates.matmul.emit import accumulator_dtype, grouped_tile, traffic_note


def low_rank(graph: Graph, k: KernelSpec, writes: tuple[str, ...], name: str) -> KernelSource:
    roles = k.roles
    assert isinstance(roles, LowRank)
    mm = graph.producer[roles.anchor]
    x_name, w_name = mm.inputs
    a_name = graph.producer[roles.down].inputs[1]
    b_name = graph.producer[roles.up].inputs[1]
    x_t = graph.types[x_name]
    dtype = x_t.dtype
    *batch, m, n = mm.shape
    kk, r, br = x_t.shape[-1], roles.rank, roles.block_r
    nbatch = math.prod(batch)
    body = Body()
    ptrs = pointers(graph, k, writes)

    body.comment(
        f"C{list(mm.shape)} = [x | alpha x @ A] @ [W ; B]: x{list(x_t.shape)}, "
        f"W [{kk}, {n}], A [{kk}, {r}], B [{r}, {n}]"
    )
    grouped_tile(body, m, n)
    body.raw("pid_b = tl.program_id(1)")
    pid_b = Sym("pid_b", 0, nbatch, lane=False)
    bdims = split_linear(body, pid_b, tuple(batch), "b") if batch else ()
    rm, rn = Sym("rm[:, None]", 0, m), Sym("rn[None, :]", 0, n)
    body.comment("row and column offsets of the tile, and the rank's columns (padded to BLOCK_R)")
    body.raw("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    body.raw("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
    body.raw(f"rr = tl.arange(0, {br})")
    body.raw(f"mask_m = rm < {m}")
    body.raw(f"mask_n = rn < {n}")
    body.raw(f"mask_r = rr < {r}")
    zero_x = body.lazy("zero_x", "tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.int32)")
    zero_w = body.lazy("zero_w", "tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.int32)")
    zero_a = body.lazy("zero_a", f"tl.zeros((BLOCK_K, {br}), dtype=tl.int32)")
    zero_b = body.lazy("zero_b", f"tl.zeros(({br}, BLOCK_N), dtype=tl.int32)")
    acc_dtype = TL_DTYPE[accumulator_dtype(dtype)]
    body.raw(f"acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={acc_dtype})  # x @ W, then + t @ B")
    body.raw(f"acc_t = tl.zeros((BLOCK_M, {br}), dtype={acc_dtype})  # t = x @ A, this tile's rows")

    # -- K loop: one x tile, two dots ------------------------------------------------
    body.comment(f"walk K = {kk} in BLOCK_K steps: each x tile multiplies the W and the A tile")
    body.raw(f"for k0 in range(0, {kk}, BLOCK_K):")
    loop = body.fork(body.indent + "    ")
    loop.raw("rk = k0 + tl.arange(0, BLOCK_K)")
    loop.raw(f"mask_k = rk < {kk}")
    loop.raw("mask_x = mask_m[:, None] & mask_k[None, :]")
    loop.raw("mask_w = mask_k[:, None] & mask_n[None, :]")
    loop.raw("mask_a = mask_k[:, None] & mask_r[None, :]")
    rk_row, rk_col = Sym("rk[None, :]", 0, kk), Sym("rk[:, None]", 0, kk)
    x_index = broadcast_index(
        Index(bdims + (rm, rk_row), Sym("mask_x")), (*batch, m, kk), x_t.shape
    )
    x = _load(graph, loop, ptrs, zero_x, x_name, x_index)
    w = _load(graph, loop, ptrs, zero_w, w_name, Index((rk_col, rn), Sym("mask_w")))
    a = _load(
        graph, loop, ptrs, zero_a, a_name, Index((rk_col, Sym("rr[None, :]", 0, br)), Sym("mask_a"))
    )
    _dot(loop, "acc", x, w, dtype, k.config.precision)
    _dot(loop, "acc_t", x, a, dtype, k.config.precision)
    body.lines += loop.lines

    # -- the low-rank columns of the concatenated K -----------------------------------
    body.comment(f"the last {r} columns of the concatenated K: acc += (alpha t) @ B's tile")
    body.raw("mask_b = mask_r[:, None] & mask_n[None, :]")
    b = _load(
        graph, body, ptrs, zero_b, b_name, Index((Sym("rr[:, None]", 0, br), rn), Sym("mask_b"))
    )
    alpha = _alpha(graph, roles)
    t = "acc_t" if alpha == 1.0 else body.let(f"acc_t * {alpha!r}", "t")
    _dot(body, "acc", t, b, dtype, k.config.precision)

    # -- P's adds on the accumulator, then the epilogue ------------------------------
    body.comment("epilogue: the bias adds on the accumulator are the join's value; then store")
    body.raw("mask_c = mask_m[:, None] & mask_n[None, :]")
    zero_c = body.lazy("zero_c", "tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)")
    out_index = Index(bdims + (rm, rn), Sym("mask_c"))
    ev = Evaluator(graph, set(k.nodes), body, ptrs, zero=zero_c, broadcast_all=True)
    ev.provided[roles.anchor] = lambda index: "acc"  # the rule keeps the epilogue aligned
    ev.provided[roles.join] = lambda index: ev.value(roles.main, index)
    results = {t: ev.value(t, out_index) for t in writes}
    body.raw(
        f"offs_c = {f'pid_b * {m * n} + ' if nbatch != 1 else ''}"
        f"{f'rm[:, None] * {n}' if n != 1 else 'rm[:, None]'} + rn[None, :]"
    )
    for tensor in writes:
        store(body, graph, ptrs, tensor, "offs_c", results[tensor], "mask_c")

    doc = describe(graph, k, writes, ptrs) + traffic_note(m, n, k)
    doc.append(f"  x @ A (rank {r}) stays in registers, recomputed by each column of tiles")
    return KernelSource(
        name=name,
        doc=doc,
        params=ptrs.params(),
        config=k.config,
        helpers=body.helpers,
        body=body.code(),
        grid=[f"    grid = (triton.cdiv({m}, BLOCK_M) * triton.cdiv({n}, BLOCK_N), {nbatch})"],
    )


def _load(graph: Graph, body: Body, ptrs, zero: str, tensor: str, index: Index) -> str:
    return Evaluator(graph, set(), body, ptrs, zero=zero, broadcast_all=True).value(tensor, index)


def _dot(body: Body, acc: str, a: str, b: str, dtype: str, precision: str) -> None:
    """``acc`` += a @ b on tensor cores (fp16 / bf16 operands, fp32 as ``precision``)."""
    if dtype in HALF:
        half = TL_DTYPE[dtype]
        body.raw(f"{acc} += tl.dot({a}.to({half}), {b}.to({half}))")
    else:
        body.raw(f'{acc} += tl.dot({a}, {b}, input_precision="{precision}")')


def _alpha(graph: Graph, roles: LowRank) -> float:
    """The product of the branch's scalar scales (a DIV divides)."""
    alpha = 1.0
    for t in roles.scaling:
        node = graph.producer[t]
        c = next(i for i in node.inputs if i in graph.constants)
        value = float(graph.constants[c].reshape(()))
        alpha = alpha / value if node.op is Op.DIV else alpha * value
    return alpha
