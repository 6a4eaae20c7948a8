"""The attention template: flash attention, in the style of Triton's fused
attention tutorial.

    S = chain(Q @ K)   [*batch, Lq, Lk]     (scale, mask, casts, ...)
    O = softmax(S) @ V [*batch, Lq, Dv]     softmax over the keys

One program per (BLOCK_M query rows, batch entry): the batch (heads included)
is grid axis 1.  The query tile is loaded once; the program walks the keys in
BLOCK_N steps, loads a K tile and a V tile, computes the score tile
``qk = dot(q, k)`` (fp32 accumulation; IEEE fp32 for fp32 operands), applies
the kernel's score chain to it at the (batch, query, key) index with the
Evaluator (``ev.provided[m1] = qk``: any scale, additive or ``where`` mask,
cast), sets keys past the end to -inf and folds the tile into the online
softmax: a running row maximum ``m_i``, a running row sum ``l_i`` and the
output accumulator ``acc``, rescaled by ``exp(m_old - m_new)`` whenever the
maximum grows.  At the end ``O = acc / l_i`` is stored at m2's index.

Prologues: Q, K, V and the score chain's side inputs are evaluated by the
Evaluator as their tiles are loaded, so transposes are strided loads, heads
split by reshapes are index arithmetic and grouped-query EXPANDs map several
query heads onto one key / value head.  Head dims are padded to a power of
two (at least 16, as ``tl.dot`` needs) and masked.

Rows whose every score is -inf give NaN, as the reference's max-subtracted
softmax does (``exp(-inf - -inf)``); ONNX Attention's guard (``max(M, c)``,
``max(Z, c)``) starts the running maximum at c and floors the final sum, so
those rows give zeros there, also as the reference does; so does the NaN
guard ``WHERE(ISNAN(P), 0, P)`` of transformers' SDPA exports (a row whose
running maximum ends at -inf stores 0).  NaN scores are not
propagated the way numpy does (``tl.max`` may skip them).

Split-KV (``SPLIT_K`` > 1 in the configuration, flash-decoding: few query
rows, many keys, too few programs to fill the GPU): grid axis 2 gives each
block of query rows SPLIT_K programs, program ``pid_k`` walking its share of
the key blocks into its own running max, sum and output.  Each stores that
state in its slot of the runner's fp32 workspace and counts its arrival with
an acq_rel atomic (as split-K matmuls do, with the same scratch); the block's
last program takes the maximum over the slots, adds each slot's sum and
output rescaled by ``exp(m_s - m)`` in slot order (the same bits every run),
resets the counter, then normalises and stores as above.

Memory traffic: Q read once, K and V once per block of query rows (the
re-reads hit L2), side inputs of the score chain once per score tile, O
written once; the scores and probabilities never leave the chip.  Split-KV
adds SPLIT_K x (Dv + 2) fp32 values per query row, written and read back.
"""

from __future__ import annotations

import math

from orchestrate.emit.body import Body
from orchestrate.emit.codegen import (
    TL_DTYPE,
    Evaluator,
    Index,
    broadcast_index,
    literal,
    split_linear,
)
from orchestrate.emit.expr import Sym
from orchestrate.emit.source import KernelSource, describe, pointers, store
from orchestrate.ir import HALF, Graph
from orchestrate.kernels.spec import SPLIT_K_COUNTERS, SPLIT_K_PARTIALS, KernelSpec, split_k
from orchestrate.shapes.symint import upper

WIDE = 2**31  # from here offsets into a tensor need 64 bits


def attention(graph: Graph, k: KernelSpec, writes: tuple[str, ...], name: str) -> KernelSource:
    a = k.roles
    m1, m2 = graph.producer[a.m1], graph.producer[a.m2]
    q_name, k_name = m1.inputs
    v_name = m2.inputs[1]
    *batch, lq, lk = m1.shape
    d, dv = graph.types[q_name].shape[-1], m2.shape[-1]
    nbatch = math.prod(batch)
    inside = set(k.nodes)

    body = Body()
    ptrs = pointers(graph, k, writes)
    body.comment(
        f"O{list(m2.shape)} = softmax(S) @ V, S = chain(Q @ K){list(m1.shape)}"
        + (f", batch {list(batch)} on grid axis 1" if batch else "")
    )
    # 64-bit offsets where a tensor in memory holds 2**31 elements or more
    # (the scores never reach memory, however many there are)
    held = [*(t for t in k.inputs if t in graph.types), *writes]
    splits = split_k(k.config)
    wide = any(upper(graph.types[t].size) >= WIDE for t in held) or (
        splits > 1 and splits * upper(nbatch * lq * (dv + 2)) >= WIDE
    )
    wid = ".to(tl.int64)" if wide else ""
    body.raw("pid_m = tl.program_id(0)")
    body.raw(f"pid_b = tl.program_id(1){wid}")
    pid_b = Sym("pid_b", 0, nbatch, lane=False)
    bdims = split_linear(body, pid_b, tuple(batch), "b") if batch else ()
    extent = {"offs_m": lq, "offs_n": lk, "offs_d": d, "offs_dv": dv}
    body.comment("query rows of this program and the (padded) head dims")
    body.raw(
        "offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M))" + wid
        if wide
        else "offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)"
    )
    body.raw("offs_d = tl.arange(0, BLOCK_D)")
    body.raw("offs_dv = tl.arange(0, BLOCK_DV)")
    body.raw(f"mask_m = offs_m < {lq}")
    body.raw(f"mask_d = offs_d < {d}")
    body.raw(f"mask_dv = offs_dv < {dv}")
    body.comment("block-shaped zeros make every load a full tile, whatever it broadcasts")
    zeros = {
        zero: body.lazy(zero, f"tl.zeros(({shape}), dtype=tl.int32)")
        for zero, shape in (
            ("zero_q", "BLOCK_M, BLOCK_D"),
            ("zero_k", "BLOCK_D, BLOCK_N"),
            ("zero_s", "BLOCK_M, BLOCK_N"),
            ("zero_v", "BLOCK_N, BLOCK_DV"),
        )
    }

    def tile(rows: str, cols: str) -> tuple[Sym, Sym]:
        """The row and column index vectors of a tile, as broadcast blocks."""
        return (Sym(f"{rows}[:, None]", 0, extent[rows]), Sym(f"{cols}[None, :]", 0, extent[cols]))

    def operand(b: Body, tensor: str, rows: str, cols: str, shape, mask: str, zero: str) -> str:
        """The tile of ``tensor`` (through its prologue), zero where ``mask`` is off."""
        ev = Evaluator(graph, inside, b, ptrs, zero=zeros[zero], broadcast_all=True)
        index = Index((*bdims, *tile(rows, cols)), Sym(mask))
        v = ev.value(tensor, broadcast_index(index, (*batch, *shape), graph.types[tensor].shape))
        if b.zero_where_off(v, Sym(mask)):
            return v
        return b.let(f"tl.where({mask}, {v}, 0.0)", "v")

    body.comment("the query tile, loaded once (zero in the padded head dims)")
    body.raw("mask_q = mask_m[:, None] & mask_d[None, :]")
    q = operand(body, q_name, "offs_m", "offs_d", (lq, d), "mask_q", "zero_q")
    start = -math.inf if a.max_floor is None else a.max_floor
    body.comment("online softmax state per query row: running max, running sum, output")
    body.raw(f"m_i = tl.full((BLOCK_M,), {literal(start, 'float32')}, dtype=tl.float32)")
    body.raw("l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)")
    body.raw("acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)")

    # -- the key loop ---------------------------------------------------------
    # one step when one BLOCK_N block holds every key the range allows: a
    # runtime loop bound would keep the loop, and its registers (tiny GPT-2
    # over 2..64 keys: 196 against 74 for the one step) (under the
    # interpreter's blocks too)
    block_n = min(k.config["BLOCK_N"], dict(k.config.interpret).get("BLOCK_N", k.config["BLOCK_N"]))
    one_step = splits == 1 and upper(lk) <= block_n
    if splits > 1:
        body.comment(
            f"split-KV: program pid_k of the row block's SPLIT_K walks its share of the {lk} keys"
        )
        body.raw("pid_k = tl.program_id(2)")
        body.raw(f"n_share = tl.cdiv(tl.cdiv({lk}, BLOCK_N), SPLIT_K) * BLOCK_N")
        body.raw("n_lo = pid_k * n_share")
        body.raw(f"n_hi = tl.minimum(n_lo + n_share, {lk})")
        body.raw("for start_n in range(n_lo, n_hi, BLOCK_N):")
    elif one_step:
        body.comment(f"the {lk} keys in one BLOCK_N step")
    else:
        body.comment(f"walk the {lk} keys in BLOCK_N steps")
        body.raw(f"for start_n in range(0, {lk}, BLOCK_N):")
    loop = body.fork(body.indent if one_step else body.indent + "    ")
    offs_n = ("" if one_step else "start_n + ") + "tl.arange(0, BLOCK_N)"
    loop.raw(f"offs_n = ({offs_n}){wid}" if wide else f"offs_n = {offs_n}")
    loop.raw(f"mask_n = offs_n < {lk}")
    loop.raw("mask_k = mask_d[:, None] & mask_n[None, :]")
    kt = operand(loop, k_name, "offs_d", "offs_n", (d, lk), "mask_k", "zero_k")
    loop.raw(f"qk = {_dot(q, kt, m1.dtype)}")
    loop.comment("the score chain on the tile, then -inf for keys past the end")
    mask_s = loop.lazy("mask_s", "mask_m[:, None] & mask_n[None, :]")
    ev = Evaluator(graph, inside, loop, ptrs, zero=zeros["zero_s"], broadcast_all=True)
    s_index = Index((*bdims, *tile("offs_m", "offs_n")), mask_s)
    ev.provided[a.m1] = lambda index: _scores(index, s_index, name)
    s = ev.value(a.x, s_index)
    loop.raw(f's = tl.where(mask_n[None, :], {s}, float("-inf"))')
    loop.comment("online softmax: grow the max, rescale what was summed so far")
    loop.raw("m_new = tl.maximum(m_i, tl.max(s, 1))")
    m_use = "m_new"
    if a.max_floor is None:
        loop.comment("a row with only -inf so far subtracts 0: its terms stay 0, not NaN")
        loop.raw('m_use = tl.where(m_new == float("-inf"), 0.0, m_new)')
        m_use = "m_use"
    loop.raw(f"alpha = tl.exp(m_i - {m_use})")
    loop.raw(f"p = tl.exp(s - {m_use}[:, None])")
    loop.raw("l_i = l_i * alpha + tl.sum(p, 1)")
    loop.raw("mask_v = mask_n[:, None] & mask_dv[None, :]")
    v = operand(loop, v_name, "offs_n", "offs_dv", (lk, dv), "mask_v", "zero_v")
    loop.raw(f"acc = acc * alpha[:, None] + {_dot('p', v, m2.dtype)}")
    loop.raw("m_i = m_new")
    body.lines += loop.lines

    # -- normalise and store --------------------------------------------------
    batch_off = f"pid_b * {lq * dv} + " if nbatch != 1 else ""
    row = f"offs_m[:, None] * {dv}" if dv != 1 else "offs_m[:, None]"
    offsets = [
        "mask_o = mask_m[:, None] & mask_dv[None, :]",
        f"offs_o = {batch_off}{row} + offs_dv[None, :]",
    ]
    last = body
    if splits > 1:  # the partial output's slot is at the output's offsets
        for line in offsets:
            body.raw(line)
        last = _combine(body, ptrs, nbatch, lq, dv)
    if a.sum_floor is not None:
        last.raw(f"l_i = tl.maximum(l_i, {literal(a.sum_floor, 'float32')})")
    last.comment("normalise (a row of only -inf gives 0 / 0 = NaN, as the reference) and store")
    last.raw("l_i = tl.where(mask_m, l_i, 1.0)  # rows past the end: nothing to divide")
    last.raw("out = acc / l_i[:, None]")
    if a.nan_guard:
        last.comment("the NaN guard WHERE(ISNAN(P), 0, P): a row of only -inf gives 0")
        last.raw('out = tl.where((m_i == float("-inf"))[:, None], 0.0, out)')
    if splits == 1:
        for line in offsets:
            last.raw(line)
    store(last, graph, ptrs, a.m2, "offs_o", "out", "mask_o")
    if last is not body:
        body.lines += last.lines

    doc = describe(graph, k, writes, ptrs) + [
        "  traffic: Q read once, K and V once per block of query rows (from L2),",
        "  score side inputs once per score tile; the scores and probabilities",
        "  stay on chip.",
    ]
    if splits > 1:
        doc.append(
            f"  split-KV: {splits} programs per block of query rows; partial states "
            f"{ptrs.name(SPLIT_K_PARTIALS)}: fp32[{splits}, {nbatch * lq * (dv + 2)}] "
            f"written and read back, arrivals counted in "
            f"{ptrs.name(SPLIT_K_COUNTERS)}: int32 per block of rows"
        )
    return KernelSource(
        name=name,
        doc=doc,
        params=ptrs.params(),
        config=k.config,
        helpers=body.helpers,
        body=body.code(),
        grid=[
            f"    grid = (triton.cdiv({lq}, BLOCK_M), {nbatch}"
            + (", SPLIT_K)" if splits > 1 else ")")
        ],
    )


def _combine(body: Body, ptrs, nbatch: int, lq: int, dv: int) -> Body:
    """Split-KV: store this program's partial state (its running max ``m_i``
    and sum ``l_i`` per row, its unnormalised output ``acc``) in its slot and
    count its arrival; return the body of the branch the row block's last
    program takes, where ``m_i``, ``l_i`` and ``acc`` are the state over all
    the keys: the partials rescaled to the largest maximum and added in slot
    order (the same bits whoever arrives last).  Slots: SPLIT_K outputs of
    ``nbatch * lq * dv`` values, then SPLIT_K row maxima and SPLIT_K row sums
    of ``nbatch * lq``."""
    partials, counters = ptrs.get(SPLIT_K_PARTIALS), ptrs.get(SPLIT_K_COUNTERS)
    rows, size = nbatch * lq, nbatch * lq * dv

    def m_at(slot: str) -> str:
        return f"{partials} + SPLIT_K * {size} + {slot} * {rows} + offs_r"

    def l_at(slot: str) -> str:
        return f"{partials} + SPLIT_K * {size + rows} + {slot} * {rows} + offs_r"

    body.comment("split-KV: this program's partial state to its slot; the row block's last")
    body.comment("program combines the SPLIT_K slots in order")
    body.raw(f"offs_r = pid_b * {lq} + offs_m" if nbatch != 1 else "offs_r = offs_m")
    body.raw(f"tl.store({partials} + pid_k * {size} + offs_o, acc, mask=mask_o)")
    body.raw(f"tl.store({m_at('pid_k')}, m_i, mask=mask_m)")
    body.raw(f"tl.store({l_at('pid_k')}, l_i, mask=mask_m)")
    body.raw("tl.debug_barrier()  # every thread's partial stored before the arrival counts")
    body.raw(f"counter = {counters} + pid_b * tl.cdiv({lq}, BLOCK_M) + pid_m")
    body.raw('arrived = tl.atomic_add(counter, 1, sem="acq_rel")')
    body.raw("if arrived == SPLIT_K - 1:")
    last = body.fork(body.indent + "    ")
    last.comment("the row maximum over all keys (a slot with no keys holds -inf or the floor)")
    last.raw('m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)')
    last.raw("for s in tl.static_range(SPLIT_K):")
    last.raw(
        f'    m_s = tl.load({m_at("s")}, mask=mask_m, other=float("-inf"), cache_modifier=".cg")'
    )
    last.raw("    m_i = tl.maximum(m_i, m_s)")
    last.raw('m_use = tl.where(m_i == float("-inf"), 0.0, m_i)')
    last.comment("each slot's sum and output rescaled to that maximum, added in slot order")
    last.raw("l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)")
    last.raw("acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)")
    last.raw("for s in tl.static_range(SPLIT_K):")
    last.raw(
        f'    m_s = tl.load({m_at("s")}, mask=mask_m, other=float("-inf"), cache_modifier=".cg")'
    )
    last.raw("    alpha = tl.exp(m_s - m_use)")
    last.raw(
        f'    l_i += alpha * tl.load({l_at("s")}, mask=mask_m, other=0.0, cache_modifier=".cg")'
    )
    last.raw(f"    acc += alpha[:, None] * tl.load({partials} + s * {size} + offs_o, mask=mask_o,")
    last.raw('                                    other=0.0, cache_modifier=".cg")')
    last.raw("tl.atomic_xchg(counter, 0)  # zero for the next launch")
    return last


def _dot(a: str, b: str, dtype: str) -> str:
    """a @ b in fp32: IEEE for fp32, tensor cores for fp16 and bf16 (fp32 accumulate)."""
    if dtype in HALF:
        return f"tl.dot({a}.to({TL_DTYPE[dtype]}), {b}.to({TL_DTYPE[dtype]}))"
    return f'tl.dot({a}, {b}, input_precision="ieee")'


def _scores(index: Index, expected: Index, name: str) -> str:
    if index.dims != expected.dims:
        raise AssertionError(f"{name}: the score chain reads the scores at {index.dims}")
    return "qk"
