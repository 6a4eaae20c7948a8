"""The roofline cost of a candidate kernel: every cost term in one place.

    time = max(bytes / bandwidth, flops / peak) + launch overhead

``bytes`` is what the kernel must move through device memory: each external
tensor it reads, once (a tensor read only through a Slice or Gather counts
only the elements taken), plus every tensor it writes.  On-chip traffic
(registers, shared memory, L2 re-reads of tiles) is free in this model.

``flops`` counts one per evaluation of a cheap elementwise op and
``SFU_FLOPS`` per transcendental (exp, log, tanh, erf, ...), evaluated once per
point of the kernel's iteration space (recomputation under broadcasting or in
a matmul prologue is counted), 2·M·N·K per matmul, 2·K per conv output
element, one per window element of a pool.

The peak is the CUDA-core fp32 rate for everything except matmul and conv in
half precision (tensor-core fp16 rate) or in TF32 mode (tensor-core tf32
rate).  Full fp32 matmuls use IEEE fp32 on CUDA cores, which is what keeps
verification at 1e-4 possible.

A ``view`` (reshapes only) costs nothing and launches nothing.

``attention`` (flash attention, one kernel for softmax(scores) @ V):

* bytes: Q, K, V and every other external input (a mask, a bias) read once,
  the output written once; the scores and probabilities never leave the chip
  (K and V tiles re-read by each block of query rows are served from L2);
* flops: both matmuls (2·Lq·Lk·D and 2·Lq·Lk·Dv per batch entry), the score
  chain and the softmax per score (max, subtract, ``SFU_FLOPS`` for exp,
  sum), the online rescaling (one exp per row and one multiply per output
  element, per block of keys) and one division per output element; prologue
  nodes once per evaluation (Q once, K and V once per block of query rows,
  the score chain's side inputs once per score);
* compute time: the matmul flops at the matmul rate (tensor-core fp16 for
  half precision, else CUDA-core fp32: the kernel runs fp32 in IEEE, also
  under ``--tf32``) plus the rest at the CUDA-core fp32 rate;
* working set: the query tile (``ATTENTION_BLOCK_M`` x head dim) and
  ``ATTENTION_STAGES`` copies of the K and V tiles (``ATTENTION_BLOCK_N`` x
  head dim each) in shared memory, the accumulator and one score tile in
  registers; a head dim that does not fit is no candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrate import ir
from orchestrate.cost.devices import Device
from orchestrate.ir import Graph, Op
from orchestrate.kernels.attention import analyse, prologue_operands
from orchestrate.kernels.templates import (
    ATTENTION,
    CONV,
    MATMUL,
    ROW_REDUCE,
    ROW_REDUCTIONS,
    VIEW,
    WINDOW,
    Kernel,
    Rejection,
)

SFU_OPS = frozenset(
    {Op.EXP, Op.LOG, Op.SQRT, Op.RECIP, Op.TANH, Op.ERF, Op.SIGMOID, Op.SIN, Op.COS, Op.DIV,
     Op.POW, Op.MOD}
)  # fmt: skip
SFU_FLOPS = 4
# a row longer than this is reduced in a loop over column blocks, re-reading
# its inputs once per phase, instead of being held in registers
SINGLE_PASS_ROW = 16384
# matmul / conv tile shape the working-set check assumes (Triton defaults)
TILE_M, TILE_N, TILE_K, STAGES = 128, 128, 32, 3
FREE_OPS = frozenset({Op.RESHAPE, Op.IDENTITY})
# flash-attention tiles (query rows x keys) the emitter uses on a GPU, and the
# copies of each K / V tile in flight
ATTENTION_BLOCK_M, ATTENTION_BLOCK_N, ATTENTION_STAGES = 64, 64, 2


@dataclass(frozen=True)
class Config:
    """What the cost model needs besides the device."""

    tf32: bool = False  # let fp32 matmuls use TF32 tensor cores


@dataclass(frozen=True)
class Cost:
    bytes: int
    flops: int
    memory_us: float
    compute_us: float
    launch_us: float

    @property
    def time_us(self) -> float:
        return max(self.memory_us, self.compute_us) + self.launch_us

    @property
    def bound(self) -> str:
        if self.launch_us and max(self.memory_us, self.compute_us) < self.launch_us:
            return "launch"
        return "compute" if self.compute_us > self.memory_us else "memory"


def us_for_bytes(nbytes: float, device: Device) -> float:
    return nbytes / (device.bandwidth_gbs * 1e3)  # GB/s -> bytes per microsecond


def us_for_flops(flops: float, tflops: float) -> float:
    return flops / (tflops * 1e6)


def working_set_rejection(graph: Graph, k: Kernel, device: Device) -> Rejection | None:
    """Reject a kernel whose on-chip working set cannot fit one thread block.

    matmul / conv: the software-pipelined A and B tiles live in shared memory
    (``STAGES`` copies), the accumulator and one tile per epilogue input in
    registers.  The other templates stream through registers in blocks and
    always fit (long rows fall back to the looped form, priced in ``cost``)."""
    if k.template == ATTENTION:
        return _attention_working_set(graph, k, device)
    if k.template not in (MATMUL, CONV):
        return None
    anchor = graph.producer[k.anchor]
    item = 2 if anchor.dtype == "float16" else 4
    smem = (TILE_M * TILE_K + TILE_K * TILE_N) * item * STAGES
    if smem > device.smem_per_block_kb * 1024:
        return Rejection(
            f"tiles need {smem // 1024} KB of shared memory > {device.smem_per_block_kb} KB"
        )
    epilogue_inputs = sum(
        1 for n in k.nodes if n != k.anchor for i in graph.producer[n].inputs if i not in k.nodes
    )
    registers = (1 + epilogue_inputs) * TILE_M * TILE_N  # 32-bit values held per block
    if registers > device.registers_per_sm:
        return Rejection(
            f"{epilogue_inputs} epilogue inputs need {registers} registers per block "
            f"> {device.registers_per_sm}"
        )
    return None


def _attention_working_set(graph: Graph, k: Kernel, device: Device) -> Rejection | None:
    m1 = graph.producer[_attention(graph, k).m1]
    item = 2 if m1.dtype == "float16" else 4
    d = _pow2(graph.types[m1.inputs[0]].shape[-1])
    dv = _pow2(graph.types[k.anchor].shape[-1])
    smem = (ATTENTION_BLOCK_M * d + ATTENTION_STAGES * ATTENTION_BLOCK_N * (d + dv)) * item
    if smem > device.smem_per_block_kb * 1024:
        return Rejection(
            f"head dims {d} / {dv} need {smem // 1024} KB of shared memory "
            f"> {device.smem_per_block_kb} KB"
        )
    registers = ATTENTION_BLOCK_M * (dv + ATTENTION_BLOCK_N)  # accumulator + scores
    if registers > device.registers_per_sm:
        return Rejection(f"head dim {dv} needs {registers} registers per block")
    return None


def _pow2(n: int) -> int:
    return max(16, 1 << max(0, (n - 1).bit_length()))


def _attention(graph: Graph, k: Kernel):
    a = analyse(graph, k.nodes)
    if isinstance(a, Rejection):
        raise AssertionError(f"not an attention kernel: {a.reason}")
    return a


def attention_flops(graph: Graph, k: Kernel) -> tuple[int, int]:
    """(matmul flops, other flops) of an attention kernel (see the module doc)."""
    a = _attention(graph, k)
    m1, m2 = graph.producer[a.m1], graph.producer[a.m2]
    *_, lq, lk = m1.shape
    scores, outputs = m1.type.size, m2.type.size
    rows = scores // lk
    key_blocks = math.ceil(lk / ATTENTION_BLOCK_N)
    other = sum(scores * _weight(graph.producer[n].op) for n in a.scores)
    for n in a.softmax:
        node = graph.producer[n]
        if node.op in (Op.RMAX, Op.SUM, Op.SUB, Op.EXP, Op.CAST):
            other += scores * _weight(node.op)
        elif node.op is Op.DIV:
            other += outputs * _weight(node.op)  # the output is normalised once
        else:  # a floor: one per row
            other += rows
    other += key_blocks * (rows * SFU_FLOPS + outputs)  # rescale by exp(m_old - m_new)
    # prologue: Q's once, K's and V's once per block of query rows, side inputs per score
    query_blocks = math.ceil(lq / ATTENTION_BLOCK_M)
    for n, operand in prologue_operands(graph, a).items():
        node = graph.producer[n]
        if node.op in FREE_OPS:
            continue
        evals = {"q": node.type.size, "kv": node.type.size * query_blocks, "scores": scores}
        other += evals[operand] * _weight(node.op)
    return _anchor_flops(graph, m1) + _anchor_flops(graph, m2), other


def read_bytes(graph: Graph, k: Kernel) -> int:
    inside = set(k.nodes)
    total = 0
    for t in k.inputs:
        ty = graph.types[t]
        users = [c for c in graph.consumers.get(t, ()) if c.name in inside]
        if users and all(c.op in (Op.SLICE, Op.GATHER) and c.inputs[0] == t for c in users):
            taken = sum(c.type.size for c in users)
            total += min(taken, ty.size) * ty.itemsize
        else:
            total += ty.nbytes
    return total


def write_bytes(graph: Graph, names) -> int:
    return sum(graph.types[t].nbytes for t in names)


def passes(graph: Graph, k: Kernel) -> int:
    """How many times a row-reduce kernel streams its inputs: once when the
    row fits in registers, else once per dependent reduction plus the
    epilogue."""
    if k.template != ROW_REDUCE:
        return 1
    anchor = graph.producer[k.anchor]
    x = graph.types[anchor.inputs[0]]
    axes = anchor.attrs["axes"] if "axes" in anchor.attrs else (anchor.attrs["axis"],)
    row = math.prod(x.shape[a] for a in axes)
    if row <= SINGLE_PASS_ROW:
        return 1
    depth = _reduction_depth(graph, k)
    has_epilogue = any(
        graph.types[s].shape == k.space
        for s in k.outputs
        if graph.producer[s].op not in ROW_REDUCTIONS
    )
    return depth + (1 if has_epilogue else 0)


def _reduction_depth(graph: Graph, k: Kernel) -> int:
    inside = set(k.nodes)
    depth: dict[str, int] = {}
    for n in k.nodes:
        node = graph.producer[n]
        d = max((depth.get(i, 0) for i in node.inputs if i in inside), default=0)
        depth[n] = d + (1 if node.op in ROW_REDUCTIONS else 0)
    return max(depth.values(), default=1)


def flops(graph: Graph, k: Kernel) -> int:
    if k.template == VIEW:
        return 0
    if k.template == ATTENTION:
        return sum(attention_flops(graph, k))
    space = math.prod(k.space)
    total = 0
    if k.template in (MATMUL, CONV, WINDOW):
        anchor = graph.producer[k.anchor]
        total += _anchor_flops(graph, anchor)
        downstream = {n for n in k.nodes if graph.types[n].shape == anchor.shape}
        for n in k.nodes:
            node = graph.producer[n]
            if n == k.anchor or node.op in FREE_OPS:
                continue
            evals = anchor.type.size if n in downstream else node.type.size * _reuse(graph, anchor)
            total += evals * _weight(node.op)
        return total
    rows = 0
    if k.template == ROW_REDUCE:
        anchor = graph.producer[k.anchor]
        x = graph.types[anchor.inputs[0]]
        axes = anchor.attrs["axes"] if "axes" in anchor.attrs else (anchor.attrs["axis"],)
        rows = x.size // max(1, math.prod(x.shape[a] for a in axes))
    for n in k.nodes:
        node = graph.producer[n]
        if node.op in FREE_OPS:
            continue
        if node.op in ROW_REDUCTIONS:
            total += graph.types[node.inputs[0]].size
        elif k.template == ROW_REDUCE and node.type.size == rows and node.shape != k.space:
            total += rows * _weight(node.op)
        else:
            total += space * _weight(node.op)
    return total


def _reuse(graph: Graph, anchor) -> int:
    """How many programs load each operand element of a matmul (its prologue
    is evaluated that many times)."""
    if anchor.op is Op.MATMUL:
        n = anchor.shape[-1]
        return max(1, math.ceil(n / TILE_N))
    if anchor.op is Op.POOL:
        return 1
    return 1


def _anchor_flops(graph: Graph, anchor) -> int:
    if anchor.op is Op.MATMUL:
        k = graph.types[anchor.inputs[0]].shape[-1]
        return 2 * anchor.type.size * k
    if anchor.op is Op.CONV:
        w = graph.types[anchor.inputs[1]]
        return 2 * anchor.type.size * math.prod(w.shape[1:])
    return anchor.type.size * math.prod(anchor.attrs["kernel"])


def _weight(op: Op) -> int:
    return SFU_FLOPS if op in SFU_OPS else 1


def compute_peak(graph: Graph, k: Kernel, device: Device, config: Config) -> float:
    if k.template in (MATMUL, CONV):
        dtype = graph.producer[k.anchor].dtype
        if dtype == "float16":
            return device.fp16_tflops
        if dtype == "float32" and config.tf32:
            return device.tf32_tflops
    return device.fp32_tflops


def cost(graph: Graph, k: Kernel, device: Device, config: Config = Config()) -> Cost:
    """Roofline cost of ``k`` writing its sinks (optional outputs are priced
    separately by ``us_for_bytes``)."""
    if k.template == VIEW:
        return Cost(0, 0, 0.0, 0.0, 0.0)
    nbytes = read_bytes(graph, k) * passes(graph, k) + write_bytes(graph, k.outputs)
    if k.template == ATTENTION:
        mm, other = attention_flops(graph, k)
        a = _attention(graph, k)
        compute_us = us_for_flops(other, device.fp32_tflops)
        for m in (graph.producer[a.m1], graph.producer[a.m2]):
            half = m.dtype == "float16"
            peak = device.fp16_tflops if half else device.fp32_tflops
            compute_us += us_for_flops(_anchor_flops(graph, m), peak)
        return Cost(nbytes, mm + other, us_for_bytes(nbytes, device), compute_us, device.launch_us)
    f = flops(graph, k)
    return Cost(
        nbytes,
        f,
        us_for_bytes(nbytes, device),
        us_for_flops(f, compute_peak(graph, k, device, config)),
        device.launch_us,
    )


def dtype_bytes(dtype: str) -> int:
    return ir.TensorType((), dtype).itemsize
