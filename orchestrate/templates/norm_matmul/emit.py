"""The norm_matmul template: a matmul whose A operand is normalised on the fly.

    C[batch, M, N] = norm(x)[batch, M, K] @ W[K, N],   norm(x) = scale * x + shifts

(``templates/norm_matmul/rule.py`` reads n that way: ``scale`` a row factor times a
column factor, r[m] * g[k]; each shift a row factor times a column vector.)
The row factors are constant along K, so they leave the dot:

    C = r[:, None] * ((x * g[None, :]) @ W) + sum_j beta_j[:, None] * (h_j @ W)[None, :]

One program per (BLOCK_M, BLOCK_N) tile, grouped as in the Triton matmul
tutorial.  Its K loop loads the raw x tile (through x's own prologue, a
residual add say), folds the tile into each row's running mean and sum of
squared deviations (Chan et al.'s pairwise update: no cancellation however
large the mean), multiplies it by g per column and accumulates the dot; it
also sums ``h_j @ W`` for each shift from the same W tile.  After the loop
the row values (the means, variances, 1 / sqrt(var + eps), ...) are the
graph's own row nodes, evaluated on the statistics; they scale the
accumulator, the shifts are added, then the matmul's usual epilogue and
stores.

Memory traffic: x (instead of the normalised tensor n) and W strips re-read
per column / row of tiles from L2, g and the shifts' vectors once per K step,
outputs written once; n is never written.  Each program recomputes the
statistics of its rows: once per column of tiles (CUDA-core work beside the
dot).
"""

from __future__ import annotations

import math

from orchestrate.emit.body import Body
from orchestrate.emit.codegen import (
    TL_DTYPE,
    Evaluator,
    Index,
    broadcast_index,
    split_linear,
)
from orchestrate.emit.expr import Const, Sym
from orchestrate.emit.source import KernelSource, describe, pointers, store
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec
from orchestrate.templates.matmul.emit import (
    accumulator_dtype,
    epilogue,
    grouped_tile,
    multiply_accumulate,
    traffic_note,
)
from orchestrate.templates.norm_matmul.rule import Linear, Monomial, NormMatmul


def norm_matmul(graph: Graph, k: KernelSpec, writes: tuple[str, ...], name: str) -> KernelSource:
    roles = k.roles
    assert isinstance(roles, NormMatmul)
    mm = graph.producer[roles.anchor]
    a_name, w_name = mm.inputs
    a_t, w_t = graph.types[a_name], graph.types[w_name]
    *batch, m, n = mm.shape
    kk = a_t.shape[-1]
    nbatch = math.prod(batch)
    body = Body()
    ptrs = pointers(graph, k, writes)

    body.comment(
        f"C{list(mm.shape)} = norm(x){list(a_t.shape)} @ W{list(w_t.shape)}; "
        "the norm's row factors move past the dot"
    )
    grouped_tile(body, m, n)
    body.raw("pid_b = tl.program_id(1)")
    pid_b = Sym("pid_b", 0, nbatch, lane=False)
    bdims = split_linear(body, pid_b, tuple(batch), "b") if batch else ()
    rm, rn = Sym("rm[:, None]", 0, m), Sym("rn[None, :]", 0, n)
    body.comment("row and column offsets of the tile")
    body.raw("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    body.raw("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
    body.raw(f"mask_m = rm < {m}")
    body.raw(f"mask_n = rn < {n}")
    zero_a = body.lazy("zero_a", "tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.int32)")
    zero_b = body.lazy("zero_b", "tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.int32)")
    b_index = broadcast_index(
        Index(bdims + (Sym("rk[:, None]", 0, kk), rn), Sym("mask_b")), (*batch, kk, n), w_t.shape
    )

    def weight(loop: Body) -> str:
        return Evaluator(graph, set(), loop, ptrs, zero=zero_b, broadcast_all=True).value(
            w_name, b_index
        )

    # -- K loop ------------------------------------------------------------------
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
        f"walk K = {kk} in BLOCK_K steps: raw x tiles, their statistics, the dot",
    )

    # -- row values from the statistics, then the epilogue ----------------------
    body.comment("the row values: the graph's row nodes on the statistics")
    rows_index = Index(bdims + (rm, Const(0)), None)
    rows = Evaluator(graph, set(roles.rows), body, ptrs, broadcast_all=True)
    for s, stat in roles.sums:
        rows.provided[s] = lambda _, stat=stat: _sum(body, rows, rows_index, stat, kk)
    alpha = _monomial(body, rows, rows_index, roles.scale)
    terms = [_times(alpha, "acc")]
    for j, shift in enumerate(roles.shifts):
        beta = _monomial(body, rows, rows_index, shift)
        terms.append(_times(beta, f"{shifted[j]}[None, :]"))
    body.raw(f"acc = {' + '.join(terms)}")
    body.comment("epilogue on the accumulator tile, then store")
    results = epilogue(graph, k, body, ptrs, bdims + (rm, rn), "tl.int32", writes, name)
    batch_off = f"pid_b * {m * n} + " if nbatch != 1 else ""
    row = f"rm[:, None] * {n}" if n != 1 else "rm[:, None]"
    body.raw(f"offs_c = {batch_off}{row} + rn[None, :]")
    for t in writes:
        store(body, graph, ptrs, t, "offs_c", results[t], "mask_c")

    doc = describe(graph, k, writes, ptrs) + traffic_note(m, n, k)
    doc.append("  the normalised A operand is never written: x is read in its place")
    return KernelSource(
        name=name,
        doc=doc,
        params=ptrs.params(),
        config=k.config,
        helpers=body.helpers,
        body=body.code(),
        grid=[f"    grid = (triton.cdiv({m}, BLOCK_M) * triton.cdiv({n}, BLOCK_N), {nbatch})"],
    )


def statistics_loop(
    graph: Graph,
    body: Body,
    ptrs,
    roles,
    bdims,
    rm,
    a_shape,
    zero_a,
    weight,
    dtype: str,
    precision: str,
    walk: str,
) -> list[str]:
    """The accumulators and the K loop of a norm moved past its matmul: each
    raw x tile (through the kernel's prologue) feeds the rows' running mean
    and squared deviations (Chan et al.'s merge), times gamma the dot with
    the W tile that ``weight(loop)`` loads, and each shift's column vector
    @ W.  Returns the names of the shifts' accumulators."""
    *_, kk = a_shape
    acc_dtype = TL_DTYPE[accumulator_dtype(dtype)]
    body.raw(f"acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={acc_dtype})  # (x * g) @ W")
    body.comment("each row's running mean and sum of squared deviations")
    body.raw("mean = tl.zeros((BLOCK_M,), dtype=tl.float32)")
    body.raw("m2 = tl.zeros((BLOCK_M,), dtype=tl.float32)")
    shifted = [f"hw{j}" for j in range(len(roles.shifts))]
    for j, (_, _, cols) in enumerate(roles.shifts):
        what = f"shift {j}'s column vector @ W" if cols else "the column sums of W"
        body.raw(f"{shifted[j]} = tl.zeros((BLOCK_N,), dtype=tl.float32)  # {what}")
    body.comment(walk)
    body.raw(f"for k0 in range(0, {kk}, BLOCK_K):")
    loop = body.fork(body.indent + "    ")
    loop.raw("rk = k0 + tl.arange(0, BLOCK_K)")
    loop.raw(f"mask_k = rk < {kk}")
    loop.raw("mask_a = mask_m[:, None] & mask_k[None, :]")
    loop.raw("mask_b = mask_k[:, None] & mask_n[None, :]")
    mask_a = Sym("mask_a")
    a_index = broadcast_index(
        Index(bdims + (rm, Sym("rk[None, :]", 0, kk)), mask_a), a_shape, graph.types[roles.x].shape
    )
    ev = Evaluator(graph, set(roles.feed), loop, ptrs, zero=zero_a, broadcast_all=True)
    x = ev.value(roles.x, a_index)
    if not loop.zero_where_off(x, mask_a):  # padded columns must add nothing
        x = loop.let(f"tl.where(mask_a, {x}, 0.0)", "x")
    loop.comment("this block's row statistics, merged into the running ones (Chan et al.)")
    loop.raw(f"count = tl.minimum({kk} - k0, BLOCK_K).to(tl.float32)")
    loop.raw(f"block_mean = tl.sum({x}, axis=1) / count")
    loop.raw(f"centred = tl.where(mask_a, {x} - block_mean[:, None], 0.0)")
    loop.raw("delta = block_mean - mean")
    loop.raw("seen = k0 + count")
    loop.raw("mean += delta * (count / seen)")
    loop.raw("m2 += tl.sum(centred * centred, axis=1) + delta * delta * (k0 * count / seen)")
    cols_row = _columns(graph, loop, ptrs, "rk[None, :]", "mask_k[None, :]")
    g = _product(loop, [cols_row(t, e) for t, e in roles.scale[2]])
    a = loop.let(f"{x} * {g}", "a") if g else x
    wv = weight(loop)
    multiply_accumulate(loop, a, wv, dtype, precision)
    cols_col = _columns(graph, loop, ptrs, "rk[:, None]", "mask_k[:, None]")
    for j, (_, _, cols) in enumerate(roles.shifts):
        h = _product(loop, [cols_col(t, e) for t, e in cols])
        loop.raw(f"{shifted[j]} += tl.sum({f'{h} * {wv}' if h else wv}, axis=0)")
    body.lines += loop.lines
    return shifted


def _columns(graph: Graph, body: Body, ptrs, rk: str, mask: str):
    """Loads of a column vector (gamma, beta: varying along K only) at ``rk``."""
    ev = Evaluator(graph, set(), body, ptrs)

    def value(t: str, e: int) -> str:
        shape = graph.types[t].shape
        dims = (Const(0),) * (len(shape) - 1) + (Sym(rk, 0, shape[-1]),)
        v = ev.value(t, Index(dims, Sym(mask)))
        return v if e == 1 else body.let(f"1.0 / {v}", "v")

    return value


def _product(body: Body, factors: list[str]) -> str:
    return body.let(" * ".join(factors), "v") if factors else ""


def _monomial(body: Body, rows: Evaluator, index: Index, mono: Monomial) -> str:
    """scale * the row values' product, a (BLOCK_M, 1) column or a literal."""
    scale, factors, _ = mono
    parts = [] if scale == 1.0 else [repr(scale)]
    for t, e in factors:
        v = rows.value(t, index)
        parts.append(v if e == 1 else f"(1.0 / {v})")
    return body.let(" * ".join(parts), "r") if parts else "1.0"


def _linear_at_mean(body: Body, rows: Evaluator, index: Index, form: Linear) -> tuple[str, str]:
    """(a, e) of a linear form a * x + b: its x coefficient and its value at
    the row mean (x - mean sums to zero over the row)."""
    a = _sum_of(body, rows, index, form[0])
    b = _sum_of(body, rows, index, form[1])
    return a, body.let(_plus(_times(a, "mean[:, None]"), b), "e")


def _sum_of(body: Body, rows: Evaluator, index: Index, monomials) -> str:
    parts = [_monomial(body, rows, index, m) for m in monomials]
    return body.let(" + ".join(parts), "r") if parts else "0.0"


def _sum(body: Body, rows: Evaluator, index: Index, stat: tuple[Linear, ...], k: int) -> str:
    """A row sum over K from the statistics: K e for a linear form,
    a a' M2 + K e e' for a product of two."""
    if len(stat) == 1:
        _, e = _linear_at_mean(body, rows, index, stat[0])
        return body.let(_times(f"{float(k)!r}", e), "s")
    (a, e), (a2, e2) = (_linear_at_mean(body, rows, index, f) for f in stat)
    spread = _times(_times(a, a2), "m2[:, None]")
    return body.let(_plus(spread, _times(_times(f"{float(k)!r}", e), e2)), "s")


def _times(a: str, b: str) -> str:
    if "0.0" in (a, b):
        return "0.0"
    return b if a == "1.0" else a if b == "1.0" else f"{a} * {b}"


def _plus(a: str, b: str) -> str:
    return b if a == "0.0" else a if b == "0.0" else f"{a} + {b}"
