"""The matmul template: one program per (BLOCK_M, BLOCK_N) tile of C = A @ B.

    C[batch, M, N] = A[batch_a, M, K] @ B[batch_b, K, N]

``batch_a`` and ``batch_b`` broadcast to ``batch`` (numpy rules); the batch
is the second grid axis.  Tiles are ordered in groups of GROUP_M rows of
tiles (as in the Triton matmul tutorial) so the A and B strips a group shares
stay in L2.  Each program walks K in BLOCK_K steps, loading an A tile
(BLOCK_M, BLOCK_K) and a B tile (BLOCK_K, BLOCK_N) with masks, and
accumulates in fp32 (fp16 operands feed ``tl.dot`` directly; fp32 operands
use ``input_precision="ieee"``; integer and fp64 operands multiply and sum on
CUDA cores).

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
"""

from __future__ import annotations

import math
import re

from orchestrate import ir
from orchestrate.emit.codegen import (
    TL_DTYPE,
    Body,
    Evaluator,
    Index,
    Pointers,
    broadcast_index,
    split_linear,
)
from orchestrate.emit.source import KernelSource, describe, next_pow2, store
from orchestrate.ir import Graph, Node, Op
from orchestrate.kernels.templates import MATMUL, Kernel

# tile sizes on a GPU (tl.dot needs >= 16 in every dimension)
BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M = 64, 64, 32, 8
MIN_DOT = 16
# the interpreter pays per program and per loop step, not per element: one
# tile covers a small matrix whole (each dimension up to this)
INTERPRET_BLOCK = 256
# integer / fp64 matmuls multiply (BLOCK_M, BLOCK_K, BLOCK_N) products in
# registers and sum over K: smaller tiles
SLOW_BLOCK_MN, SLOW_BLOCK_K = 32, 8
INTERPRET_SLOW_VOLUME = 1 << 20
MAX_GRID_AXIS1 = 65535
WIDE = 2**31  # tensors this large need 64-bit offsets


def clamp_pow2(n: int, lo: int, hi: int) -> int:
    """The power of two covering ``n``, clamped to [lo, hi]."""
    return max(lo, min(hi, next_pow2(n)))


def uses_dot(dtype: str) -> bool:
    """tl.dot for fp16 and fp32; a multiply-and-sum for fp64 and integers."""
    return dtype in ("float16", "float32")


def accumulator_dtype(dtype: str) -> str:
    return "float32" if dtype == "float16" else dtype


def tile_sizes(m: int, n: int, k: int, dtype: str, interpret: bool) -> dict[str, int]:
    """BLOCK_M / BLOCK_N / BLOCK_K for an (m, k) @ (k, n) product."""
    if uses_dot(dtype):
        hi_mn = INTERPRET_BLOCK if interpret else BLOCK_M
        hi_k = INTERPRET_BLOCK if interpret else BLOCK_K
        return {
            "BLOCK_M": clamp_pow2(m, MIN_DOT, hi_mn),
            "BLOCK_N": clamp_pow2(n, MIN_DOT, hi_mn),
            "BLOCK_K": clamp_pow2(k, MIN_DOT, hi_k),
        }
    if not interpret:
        return {
            "BLOCK_M": clamp_pow2(m, 1, SLOW_BLOCK_MN),
            "BLOCK_N": clamp_pow2(n, 1, SLOW_BLOCK_MN),
            "BLOCK_K": clamp_pow2(k, 1, SLOW_BLOCK_K),
        }
    bm, bn = clamp_pow2(m, 1, INTERPRET_BLOCK // 2), clamp_pow2(n, 1, INTERPRET_BLOCK // 2)
    bk = clamp_pow2(k, 1, max(1, INTERPRET_SLOW_VOLUME // (bm * bn)))
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}


def grouped_tile(body: Body, rows: int, cols: int) -> None:
    """Emit the tutorial's grouped mapping of program id 0 to (pid_m, pid_n)."""
    body.comment("map the program id to a tile, GROUP_M rows of tiles at a time (L2 reuse)")
    body.raw("pid = tl.program_id(0)")
    body.raw(f"num_pid_m = tl.cdiv({rows}, BLOCK_M)")
    body.raw(f"num_pid_n = tl.cdiv({cols}, BLOCK_N)")
    body.raw("num_pid_in_group = GROUP_M * num_pid_n")
    body.raw("group_id = pid // num_pid_in_group")
    body.raw("first_pid_m = group_id * GROUP_M")
    body.raw("group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)")
    body.raw("pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)")
    body.raw("pid_n = (pid % num_pid_in_group) // group_size_m")


def multiply_accumulate(body: Body, a: str, b: str, dtype: str, tf32: bool = False) -> None:
    """acc += a @ b for operand tiles of ``dtype`` (values as the Evaluator computed them).
    fp32 runs in IEEE fp32 unless ``tf32`` (the plan's --tf32) allows tensor cores."""
    if dtype == "float32":
        body.raw(f'acc += tl.dot({a}, {b}, input_precision="{precision(tf32)}")')
    elif dtype == "float16":
        # fp16 tensor cores, fp32 accumulation (the loads were widened to fp32)
        body.raw(f"acc += tl.dot({a}.to(tl.float16), {b}.to(tl.float16))")
    else:
        body.raw(f"acc += tl.sum({a}[:, :, None] * {b}[None, :, :], axis=1)")


def traffic_note(m: int, n: int, tiles: dict[str, int]) -> list[str]:
    """The comment lines that reason about the re-reads of A and B."""
    col_tiles = math.ceil(n / tiles["BLOCK_N"])
    row_tiles = math.ceil(m / tiles["BLOCK_M"])
    return [
        f"  traffic: A strips read by {col_tiles} column(s) of tiles, B strips by {row_tiles} "
        "row(s) of tiles;",
        "  GROUP_M ordering serves the re-reads from L2, so DRAM sees A and B about once;",
        "  epilogue inputs are read once and every output is written once.",
    ]


def precision(tf32: bool) -> str:
    return "tf32" if tf32 else "ieee"


def anchor_of(graph: Graph, k: Kernel, template: str, op: Op, writes, name: str) -> Node:
    """The matmul or conv a ``template`` kernel is built around, after checking
    that every tensor it writes is indexed like it (the epilogue's space)."""
    if k.template != template or k.anchor is None:
        raise AssertionError(f"{name}: not a {template} kernel ({k.template})")
    node = graph.producer[k.anchor]
    if node.op is not op:
        raise AssertionError(f"{name}: anchor {k.anchor} is {node.op.value}, not {op.value}")
    for t in writes:
        if graph.types[t].shape != node.shape:
            raise AssertionError(f"{name}: output {t} is not aligned with {k.anchor}")
    return node


def epilogue(graph: Graph, k: Kernel, body: Body, pointers: Pointers, dims, itype: str,
             writes, name: str) -> dict[str, str]:  # fmt: skip
    """Open the epilogue on the accumulator tile (its mask and block zero) and
    return each written tensor's value at the output index ``dims``; the
    anchor reads as ``acc``."""
    body.raw("mask_c = mask_m[:, None] & mask_n[None, :]")
    body.raw(f"zero_c = tl.zeros((BLOCK_M, BLOCK_N), dtype={itype})")
    out_index = Index(tuple(dims), "mask_c")
    ev = Evaluator(graph, set(k.nodes), body, pointers, zero="zero_c", broadcast_all=True)
    ev.provided[k.anchor] = lambda index: _accumulator(index, out_index, name)
    return {t: ev.value(t, out_index) for t in writes}


def matmul(graph: Graph, k: Kernel, writes: tuple[str, ...], name: str, *, tf32: bool = False
           ) -> KernelSource:  # fmt: skip
    mm = anchor_of(graph, k, MATMUL, Op.MATMUL, writes, name)
    a_name, b_name = mm.inputs
    a_t, b_t = graph.types[a_name], graph.types[b_name]
    dtype = a_t.dtype
    if dtype not in ir.DTYPES[Op.MATMUL]:
        raise NotImplementedError(f"{name}: matmul of {dtype} operands")
    *batch, m, n = mm.shape
    kk = a_t.shape[-1]
    nbatch = math.prod(batch)
    if nbatch > MAX_GRID_AXIS1:
        raise NotImplementedError(f"{name}: batch of {nbatch} exceeds grid axis 1")
    kernel_tensors = set(k.inputs) | set(k.nodes)
    wide = any(graph.types[t].size >= WIDE for t in kernel_tensors)
    itype = "tl.int64" if wide else "tl.int32"

    body = Body()
    pointers = Pointers()
    inside = set(k.nodes)
    body.comment(
        f"C{list(mm.shape)} = A{list(a_t.shape)} @ B{list(b_t.shape)}"
        + (f", batch {list(batch)} on grid axis 1" if batch else "")
    )
    grouped_tile(body, m, n)
    wid = ".to(tl.int64)" if wide else ""
    body.raw(f"pid_b = tl.program_id(1){wid}")
    if len(batch) > 1:
        body.comment(f"batch multi-index into {list(batch)}")
    if batch:
        bdims = split_linear(body, "pid_b", tuple(batch), "b")
    else:
        bdims = ()
    body.comment("row and column offsets of the tile")
    body.raw(f"rm = pid_m{wid} * BLOCK_M + tl.arange(0, BLOCK_M)")
    body.raw(f"rn = pid_n{wid} * BLOCK_N + tl.arange(0, BLOCK_N)")
    body.raw(f"mask_m = rm < {m}")
    body.raw(f"mask_n = rn < {n}")
    body.comment("block-shaped zeros make every load a full tile, whatever it broadcasts")
    body.raw(f"zero_a = tl.zeros((BLOCK_M, BLOCK_K), dtype={itype})")
    body.raw(f"zero_b = tl.zeros((BLOCK_K, BLOCK_N), dtype={itype})")
    acc_dtype = accumulator_dtype(dtype)
    body.raw(f"acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={TL_DTYPE[acc_dtype]})")

    # -- K loop: operand tiles through the prologue -----------------------------
    body.comment(f"walk K = {kk} in BLOCK_K steps; the prologue runs on the loaded tiles")
    body.raw(f"for k0 in range(0, {kk}, BLOCK_K):")
    loop = body.fork(body.indent + "    ")
    loop.raw(
        f"rk = (k0 + tl.arange(0, BLOCK_K)){wid}" if wide else "rk = k0 + tl.arange(0, BLOCK_K)"
    )
    loop.raw(f"mask_k = rk < {kk}")
    loop.raw("mask_a = mask_m[:, None] & mask_k[None, :]")
    loop.raw("mask_b = mask_k[:, None] & mask_n[None, :]")
    a_index = broadcast_index(
        Index(bdims + ("rm[:, None]", "rk[None, :]"), "mask_a"), (*batch, m, kk), a_t.shape
    )
    b_index = broadcast_index(
        Index(bdims + ("rk[:, None]", "rn[None, :]"), "mask_b"), (*batch, kk, n), b_t.shape
    )
    operands = []
    for tensor, index, zero, mask in (
        (a_name, a_index, "zero_a", "mask_a"),
        (b_name, b_index, "zero_b", "mask_b"),
    ):
        ev = Evaluator(graph, inside, loop, pointers, zero=zero, broadcast_all=True)
        v = ev.value(tensor, index)
        if not masked_load(loop, v, mask):
            # computed values are not zero where the mask is off: zero them so
            # the padded K columns add nothing
            zero_v = "0" if acc_dtype in ir.INTS else "0.0"
            v = loop.let(f"tl.where({mask}, {v}, {zero_v})", "v")
        operands.append(v)
    multiply_accumulate(loop, operands[0], operands[1], dtype, tf32)
    body.lines += loop.lines

    # -- epilogue on the accumulator ----------------------------------------
    body.comment("epilogue on the accumulator tile, then store")
    out_dims = bdims + ("rm[:, None]", "rn[None, :]")
    results = epilogue(graph, k, body, pointers, out_dims, itype, writes, name)
    batch_off = f"pid_b * {m * n} + " if nbatch > 1 else ""
    col = "rn[None, :]"
    row = f"rm[:, None] * {n}" if n > 1 else "rm[:, None]"
    body.raw(f"offs_c = {batch_off}{row} + {col}")
    for t in writes:
        store(body, graph, pointers, t, "offs_c", results[t], "mask_c")

    gpu = tile_sizes(m, n, kk, dtype, interpret=False)
    fast = tile_sizes(m, n, kk, dtype, interpret=True)
    doc = describe(graph, k, writes) + traffic_note(m, n, gpu)
    return KernelSource(
        name=name,
        doc=doc,
        args=list(pointers.items()),
        constexprs={**gpu, "GROUP_M": GROUP_M},
        interpret_constexprs=fast,
        body=drop_unused(body.lines, ("zero_a", "zero_b", "zero_c")),
        grid=[
            f"    grid = (triton.cdiv({m}, BLOCK_M) * triton.cdiv({n}, BLOCK_N), {nbatch})",
        ],
    )


def drop_unused(lines: list[str], names: tuple[str, ...]) -> list[str]:
    """``lines`` without the definitions of those ``names`` nothing reads."""
    out = list(lines)
    for name in names:
        define = re.compile(rf"\s*{name} = ")
        use = re.compile(rf"\b{name}\b")
        defs = [i for i, line in enumerate(out) if define.match(line)]
        if defs and not any(use.search(line) for i, line in enumerate(out) if i not in defs):
            out = [line for i, line in enumerate(out) if i not in defs]
    return out


def _accumulator(index: Index, expected: Index, name: str) -> str:
    if index.dims != expected.dims:
        raise AssertionError(f"{name}: the epilogue reads the accumulator at {index.dims}")
    return "acc"


def masked_load(body: Body, value: str, mask: str) -> bool:
    """Whether ``value`` names a load under exactly ``mask`` (zero where it is off)."""
    for expr, name in body._names.items():
        if name == value:
            load = expr.split(").to(")[0].rstrip(")")
            return expr.startswith("tl.load(") and load.endswith(
                (f", mask={mask}, other=0.0", f", mask={mask}, other=0")
            )
    return False
