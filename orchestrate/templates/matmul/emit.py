"""The matmul template: one program per (BLOCK_M, BLOCK_N) tile of C = A @ B.

    C[batch, M, N] = A[batch_a, M, K] @ B[batch_b, K, N]

``batch_a`` and ``batch_b`` broadcast to ``batch`` (numpy rules); the batch
is the second grid axis.  Tiles are ordered in groups of GROUP_M rows of
tiles (as in the Triton matmul tutorial) so the A and B strips a group shares
stay in L2.  Each program walks K in BLOCK_K steps, loading an A tile
(BLOCK_M, BLOCK_K) and a B tile (BLOCK_K, BLOCK_N) with masks, and
accumulates in fp32 (fp16 and bf16 operands feed ``tl.dot`` directly; fp32
operands use ``input_precision="ieee"``; integer and fp64 operands multiply
and sum on CUDA cores).

Prologue: the kernel's nodes upstream of the matmul (transposes, reshapes
splitting heads, scales, casts, gathers, ...) are evaluated on the operand
tiles as they are loaded: the tile's row and column index tensors
(``rm[:, None]``, ``rk[None, :]``) plus the batch indices form the Index
the Evaluator walks back from, so a transposed operand is a strided load.
Epilogue: the elementwise nodes downstream of the matmul are evaluated on the
accumulator tile (``ev.provided[anchor]``), then every written value is
stored once.

Memory traffic: A and B strips are each read once per tile column / row of
tiles (L2 keeps the re-reads off DRAM under grouped ordering), epilogue
inputs read once, outputs written once.

Split-K (``SPLIT_K`` > 1 in the configuration, for tiles too few to fill the
GPU): grid axis 2 gives each tile SPLIT_K programs, program ``pid_k`` walking
the ``pid_k``-th share of the K steps.  Each stores its fp32 partial tile in
slot ``pid_k`` of a workspace and counts its arrival on the tile's int32
counter (``tl.atomic_add``, acquire-release); the program that arrives last
sums the SPLIT_K partials in slot order 0, 1, ... (the same additions in the
same order on every run, whichever program arrives last: bit-identical
results, unlike fp32 atomics into the output), resets the counter to zero
for the next launch (and CUDA-graph replays), and alone runs the epilogue
and the stores, once on the full sum.  The workspace and counters are the
runner's (``SPLIT_K_PARTIALS``, ``SPLIT_K_COUNTERS`` in ``kernels/spec.py``).
Extra traffic: SPLIT_K x M x N fp32 written and read back (mostly in L2).
"""

from __future__ import annotations

import math

from orchestrate import ir
from orchestrate.emit.body import Body
from orchestrate.emit.codegen import (
    TL_DTYPE,
    Evaluator,
    Index,
    Pointers,
    broadcast_index,
    cdiv_text,
    split_linear,
)
from orchestrate.emit.expr import Sym
from orchestrate.emit.source import KernelSource, describe, pointers, store
from orchestrate.ir import Graph
from orchestrate.kernels.spec import SPLIT_K_COUNTERS, SPLIT_K_PARTIALS, KernelSpec, split_k
from orchestrate.shapes.symint import upper

WIDE = 2**31  # tensors this large need 64-bit offsets
MAX_GRID_AXIS1 = 65535  # a larger batch is counted on grid axis 0 with the tiles


def accumulator_dtype(dtype: str) -> str:
    return "float32" if dtype in ir.HALF else dtype


def grouped_tile(
    body: Body, rows: int, cols: int | str, batch_too: bool = False, pid: str = "tl.program_id(0)"
) -> None:
    """Emit the tutorial's grouped mapping of program id 0 (or ``pid``: a
    merged matmul's program id within its segment, whose width ``cols`` is
    a variable) to (pid_m, pid_n);
    ``batch_too``: program id 0 also counts the batch (``pid_b``), for
    batches beyond what grid axis 1 holds."""
    body.comment("map the program id to a tile, GROUP_M rows of tiles at a time (L2 reuse)")
    if batch_too:
        body.raw(f"pid = {pid}")
        body.raw(f"tiles = tl.cdiv({rows}, BLOCK_M) * tl.cdiv({cols}, BLOCK_N)")
        body.raw("pid_b = pid // tiles  # the batch entry: grid axis 1 holds 65,535 at most")
        body.raw("pid = pid % tiles")
    else:
        body.raw(f"pid = {pid}")
    body.raw(f"num_pid_m = tl.cdiv({rows}, BLOCK_M)")
    body.raw(f"num_pid_n = tl.cdiv({cols}, BLOCK_N)")
    body.raw("num_pid_in_group = GROUP_M * num_pid_n")
    body.raw("group_id = pid // num_pid_in_group")
    body.raw("first_pid_m = group_id * GROUP_M")
    body.raw("group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)")
    body.raw("pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)")
    body.raw("pid_n = (pid % num_pid_in_group) // group_size_m")


def multiply_accumulate(body: Body, a: str, b: str, dtype: str, precision: str) -> None:
    """acc += a @ b for operand tiles of ``dtype`` (values as the Evaluator computed them).
    fp32 runs in the spec's precision: IEEE fp32, or TF32 tensor cores (--tf32)."""
    if dtype == "float32":
        body.raw(f'acc += tl.dot({a}, {b}, input_precision="{precision}")')
    elif dtype in ir.HALF:
        # fp16 / bf16 tensor cores, fp32 accumulation (the loads were widened to fp32)
        half = TL_DTYPE[dtype]
        body.raw(f"acc += tl.dot({a}.to({half}), {b}.to({half}))")
    else:
        body.raw(f"acc += tl.sum({a}[:, :, None] * {b}[None, :, :], axis=1)")


def traffic_note(m: int, n: int, spec: KernelSpec) -> list[str]:
    """The comment lines that reason about the re-reads of A and B."""
    col_tiles = cdiv_text(n, spec.config["BLOCK_N"])
    row_tiles = cdiv_text(m, spec.config["BLOCK_M"])
    return [
        f"  traffic: A strips read by {col_tiles} column(s) of tiles, B strips by {row_tiles} "
        "row(s) of tiles;",
        "  GROUP_M ordering serves the re-reads from L2, so DRAM sees A and B about once;",
        "  epilogue inputs are read once and every output is written once.",
    ]


def epilogue(
    graph: Graph,
    k: KernelSpec,
    body: Body,
    ptrs: Pointers,
    dims,
    itype: str,
    writes,
    name: str,
    masked: bool = False,
) -> dict[str, str]:
    """Open the epilogue on the accumulator tile (its mask, unless ``masked``
    says it is defined, and block zero) and return each written tensor's
    value at the output index ``dims``; the anchor reads as ``acc``."""
    if not masked:
        body.raw("mask_c = mask_m[:, None] & mask_n[None, :]")
    zero_c = body.lazy("zero_c", f"tl.zeros((BLOCK_M, BLOCK_N), dtype={itype})")
    out_index = Index(tuple(dims), Sym("mask_c"))
    ev = Evaluator(graph, set(k.nodes), body, ptrs, zero=zero_c, broadcast_all=True)
    ev.provided[k.anchor] = lambda index: _accumulator(index, out_index, name)
    return {t: ev.value(t, out_index) for t in writes}


def matmul(graph: Graph, k: KernelSpec, writes: tuple[str, ...], name: str) -> KernelSource:
    mm = graph.producer[k.roles.anchor]
    *batch, m, n = mm.shape
    nbatch = math.prod(batch)
    splits = split_k(k.config)
    body = Body()
    ptrs = pointers(graph, k, writes)
    tile_program(graph, k, writes, name, body, ptrs)
    doc = describe(graph, k, writes, ptrs) + traffic_note(m, n, k)
    if splits > 1:
        doc.append(
            f"  split-K: {splits} programs per tile; partials {ptrs.name(SPLIT_K_PARTIALS)}: "
            f"fp32[{splits}, {nbatch * m * n}] written and read back, arrivals counted "
            f"in {ptrs.name(SPLIT_K_COUNTERS)}: int32 per tile"
        )
    return KernelSource(
        name=name,
        doc=doc,
        params=ptrs.params(),
        config=k.config,
        helpers=body.helpers,
        body=body.code(),
        grid=[_grid(m, n, nbatch, upper(nbatch) > MAX_GRID_AXIS1, splits)],
    )


def tile_program(
    graph: Graph,
    k: KernelSpec,
    writes: tuple[str, ...],
    name: str,
    body: Body,
    ptrs: Pointers,
    pid: str = "tl.program_id(0)",
) -> None:
    """Emit into ``body`` what one program does for its tile of ``k``'s
    matmul: map ``pid`` to the tile, walk K through the prologue, run the
    epilogue and store ``writes``.  ``pid``: a merged matmul's program id
    within the segment ``k`` is (``templates/merged_matmul/emit.py``)."""
    mm = graph.producer[k.roles.anchor]
    a_name, b_name = mm.inputs
    a_t, b_t = graph.types[a_name], graph.types[b_name]
    dtype = a_t.dtype
    *batch, m, n = mm.shape
    kk = a_t.shape[-1]
    nbatch = math.prod(batch)
    kernel_tensors = set(k.inputs) | set(k.nodes)
    splits = split_k(k.config)
    wide = (
        any(upper(graph.types[t].size) >= WIDE for t in kernel_tensors)
        or splits * upper(mm.type.size) >= WIDE
    )
    itype = "tl.int64" if wide else "tl.int32"

    inside = set(k.nodes)
    body.comment(
        f"C{list(mm.shape)} = A{list(a_t.shape)} @ B{list(b_t.shape)}"
        + (f", batch {list(batch)} on grid axis 1" if batch else "")
    )
    fold = upper(nbatch) > MAX_GRID_AXIS1
    grouped_tile(body, m, n, batch_too=fold, pid=pid)
    wid = ".to(tl.int64)" if wide else ""
    if not fold:
        body.raw(f"pid_b = tl.program_id(1){wid}")
    elif wide:
        body.raw("pid_b = pid_b.to(tl.int64)")
    if len(batch) > 1:
        body.comment(f"batch multi-index into {list(batch)}")
    pid_b = Sym("pid_b", 0, nbatch, lane=False)
    bdims = split_linear(body, pid_b, tuple(batch), "b") if batch else ()
    rm, rn = Sym("rm[:, None]", 0, m), Sym("rn[None, :]", 0, n)
    body.comment("row and column offsets of the tile")
    body.raw(f"rm = pid_m{wid} * BLOCK_M + tl.arange(0, BLOCK_M)")
    body.raw(f"rn = pid_n{wid} * BLOCK_N + tl.arange(0, BLOCK_N)")
    body.raw(f"mask_m = rm < {m}")
    body.raw(f"mask_n = rn < {n}")
    body.comment("block-shaped zeros make every load a full tile, whatever it broadcasts")
    zero_a = body.lazy("zero_a", f"tl.zeros((BLOCK_M, BLOCK_K), dtype={itype})")
    zero_b = body.lazy("zero_b", f"tl.zeros((BLOCK_K, BLOCK_N), dtype={itype})")
    acc_dtype = accumulator_dtype(dtype)
    body.raw(f"acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={TL_DTYPE[acc_dtype]})")

    # -- K loop: operand tiles through the prologue -----------------------------
    if splits > 1:
        body.comment(f"split-K: program pid_k of the tile's SPLIT_K walks its share of K = {kk}")
        body.raw(f"pid_k = tl.program_id(2){wid}")
        body.raw(f"k_share = tl.cdiv(tl.cdiv({kk}, BLOCK_K), SPLIT_K) * BLOCK_K")
        body.raw("k_lo = pid_k * k_share")
        body.raw(f"k_hi = tl.minimum(k_lo + k_share, {kk})")
        body.comment("the prologue runs on the loaded tiles")
        body.raw("for k0 in range(k_lo, k_hi, BLOCK_K):")
    else:
        body.comment(f"walk K = {kk} in BLOCK_K steps; the prologue runs on the loaded tiles")
        body.raw(f"for k0 in range(0, {kk}, BLOCK_K):")
    loop = body.fork(body.indent + "    ")
    loop.raw(
        f"rk = (k0 + tl.arange(0, BLOCK_K)){wid}" if wide else "rk = k0 + tl.arange(0, BLOCK_K)"
    )
    loop.raw(f"mask_k = rk < {kk}")
    loop.raw("mask_a = mask_m[:, None] & mask_k[None, :]")
    loop.raw("mask_b = mask_k[:, None] & mask_n[None, :]")
    rk_a, rk_b = Sym("rk[None, :]", 0, kk), Sym("rk[:, None]", 0, kk)
    mask_a, mask_b = Sym("mask_a"), Sym("mask_b")
    a_index = broadcast_index(Index(bdims + (rm, rk_a), mask_a), (*batch, m, kk), a_t.shape)
    b_index = broadcast_index(Index(bdims + (rk_b, rn), mask_b), (*batch, kk, n), b_t.shape)
    operands = []
    for tensor, index, zero, mask in (
        (a_name, a_index, zero_a, mask_a),
        (b_name, b_index, zero_b, mask_b),
    ):
        ev = Evaluator(graph, inside, loop, ptrs, zero=zero, broadcast_all=True)
        v = ev.value(tensor, index)
        if not loop.zero_where_off(v, mask):
            # computed values are not zero where the mask is off: zero them so
            # the padded K columns add nothing
            zero_v = "0" if acc_dtype in ir.INTS else "0.0"
            v = loop.let(f"tl.where({mask.name}, {v}, {zero_v})", "v")
        operands.append(v)
    multiply_accumulate(loop, operands[0], operands[1], dtype, k.config.precision)
    body.lines += loop.lines

    # -- epilogue on the accumulator ----------------------------------------
    batch_off = f"pid_b * {m * n} + " if nbatch != 1 else ""
    col = "rn[None, :]"
    row = f"rm[:, None] * {n}" if n != 1 else "rm[:, None]"
    last = body
    if splits > 1:
        body.raw("mask_c = mask_m[:, None] & mask_n[None, :]")
        body.raw(f"offs_c = {batch_off}{row} + {col}")
        last = fix_up(
            body,
            ptrs,
            nbatch * m * n,
            "pid" if nbatch == 1 else "pid_b * num_pid_m * num_pid_n + pid",
        )
    last.comment("epilogue on the accumulator tile, then store")
    out_dims = bdims + (rm, rn)
    results = epilogue(graph, k, last, ptrs, out_dims, itype, writes, name, masked=splits > 1)
    if splits == 1:
        last.raw(f"offs_c = {batch_off}{row} + {col}")
    for t in writes:
        store(last, graph, ptrs, t, "offs_c", results[t], "mask_c")
    if last is not body:
        body.lines += last.lines


def _grid(m: int, n: int, nbatch: int, fold: bool, splits: int) -> str:
    tiles = f"triton.cdiv({m}, BLOCK_M) * triton.cdiv({n}, BLOCK_N)"
    axes = [f"{tiles} * {nbatch}", "1"] if fold else [tiles, str(nbatch)]
    if splits > 1:
        axes.append("SPLIT_K")
    return f"    grid = ({', '.join(axes)})"


def fix_up(body: Body, ptrs: Pointers, size: int, tile: str) -> Body:
    """Split-K: store this program's partial tile (at ``offs_c`` under
    ``mask_c``) in its workspace slot and count its arrival; return the body
    of the branch the tile's last program takes, where ``acc`` is the sum of
    the SPLIT_K partials, added in slot order (``size``: the output's
    elements, one slot; ``tile``: the tile's counter)."""
    partials, counters = ptrs.get(SPLIT_K_PARTIALS), ptrs.get(SPLIT_K_COUNTERS)
    body.comment("split-K: this program's partial sum to its slot; the tile's last program")
    body.comment("adds the SPLIT_K slots in order (the same bits whoever arrives last)")
    body.raw(f"tl.store({partials} + pid_k * {size} + offs_c, acc, mask=mask_c)")
    body.raw("tl.debug_barrier()  # every thread's partial stored before the arrival counts")
    body.raw(f"counter = {counters} + {tile}")
    body.raw('arrived = tl.atomic_add(counter, 1, sem="acq_rel")')
    body.raw("if arrived == SPLIT_K - 1:")
    last = body.fork(body.indent + "    ")
    last.raw(f"acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={TL_DTYPE['float32']})")
    last.raw("for s in tl.static_range(SPLIT_K):")
    last.raw(f"    acc += tl.load({partials} + s * {size} + offs_c, mask=mask_c, other=0.0,")
    last.raw('                   cache_modifier=".cg")  # from L2: other SMs wrote them')
    last.raw("tl.atomic_xchg(counter, 0)  # zero for the next launch")
    return last


def _accumulator(index: Index, expected: Index, name: str) -> str:
    # epilogue nodes are element-aligned with the anchor (the rule's check)
    if index.dims != expected.dims:
        raise AssertionError(f"{name}: the epilogue reads the accumulator at {index.dims}")
    return "acc"
