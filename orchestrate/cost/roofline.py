"""The roofline cost of a candidate kernel: every cost term in one place.

    time = max(bytes / bandwidth, flops / peak) + launch overhead

``bytes`` is what the kernel must move through device memory: each external
tensor it reads, once (a tensor read only through a Slice or Gather counts
only the elements taken), plus every tensor it writes.  On-chip traffic
(registers, shared memory, L2 re-reads of tiles) is free in this model.

``flops`` counts one per evaluation of a cheap elementwise op and
``SFU_FLOPS`` per transcendental (exp, log, tanh, erf, ...), evaluated once per
point of the kernel's iteration space (recomputation under broadcasting or in
a matmul prologue, once per column of ``BLOCK_N`` tiles, is counted), 2·M·N·K per matmul, 2·K per conv output
element, one per window element of a pool.

The peak is the CUDA-core fp32 rate for everything except matmul and conv in
half precision (tensor-core fp16 rate) or with TF32 precision in the spec
(tensor-core tf32 rate).  Full fp32 matmuls use IEEE fp32 on CUDA cores, which is what keeps
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
* the tiles (query rows ``BLOCK_M``, keys per step ``BLOCK_N``) are the
  spec's launch configuration.

Everything is read from the kernel spec: the template's roles (anchor,
prologue, epilogue, row space and phases, attention roles) and its launch
configuration (tiles, the fp32 ``tl.dot`` precision).  Whether the working
set fits on chip is the rules' check (``kernels/fit.py``), not a cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrate.devices import Device
from orchestrate.ir import Graph, Node, Op
from orchestrate.kernels.region import ROW_REDUCTIONS
from orchestrate.kernels.spec import (
    ATTENTION,
    CONV,
    MATMUL,
    VIEW,
    Anchored,
    AttentionRoles,
    KernelSpec,
    Operand,
    Rows,
)

SFU_OPS = frozenset(
    {Op.EXP, Op.LOG, Op.SQRT, Op.RECIP, Op.TANH, Op.ERF, Op.SIGMOID, Op.SIN, Op.COS, Op.DIV,
     Op.POW, Op.MOD}
)  # fmt: skip
SFU_FLOPS = 4
FREE_OPS = frozenset({Op.RESHAPE, Op.IDENTITY})


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


@dataclass(frozen=True)
class Price:
    """What a kernel costs when it writes a given set of tensors."""

    bytes: int
    flops: int
    time_us: float
    bound: str  # memory, compute, launch or view


def us_for_bytes(nbytes: float, device: Device) -> float:
    return nbytes / (device.bandwidth_gbs * 1e3)  # GB/s -> bytes per microsecond


def us_for_flops(flops: float, tflops: float) -> float:
    return flops / (tflops * 1e6)


class Prices:
    """The cost of each distinct spec on one device, computed once per
    structural hash (a transformer's layers share theirs)."""

    def __init__(self, graph: Graph, device: Device):
        self.graph, self.device = graph, device
        self._cache: dict[str, Cost] = {}

    def cost(self, spec: KernelSpec) -> Cost:
        if spec.hash not in self._cache:
            self._cache[spec.hash] = cost(self.graph, spec, self.device)
        return self._cache[spec.hash]

    def price(self, spec: KernelSpec, writes: Sequence[str]) -> Price:
        """``spec`` writing its sinks and the optional outputs in ``writes``."""
        if spec.template == VIEW:
            return Price(0, 0, 0.0, "view")
        c = self.cost(spec)
        extra = write_bytes(self.graph, [t for t in writes if t not in spec.outputs])
        mem = c.memory_us + us_for_bytes(extra, self.device)
        roof = max(mem, c.compute_us)
        bound = "launch" if roof < c.launch_us else "compute" if c.compute_us > mem else "memory"
        return Price(c.bytes + extra, c.flops, roof + c.launch_us, bound)

    def write_us(self, tensor: str) -> float:
        return us_for_bytes(self.graph.types[tensor].nbytes, self.device)


def attention_flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(matmul flops, other flops) of an attention kernel (see the module doc)."""
    a = spec.roles
    assert isinstance(a, AttentionRoles)
    m1, m2 = graph.producer[a.m1], graph.producer[a.m2]
    *_, lq, lk = m1.shape
    scores, outputs = m1.type.size, m2.type.size
    rows = scores // lk
    key_blocks = math.ceil(lk / spec.config["BLOCK_N"])
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
    query_blocks = math.ceil(lq / spec.config["BLOCK_M"])
    for n, operand in a.prologue:
        node = graph.producer[n]
        if node.op in FREE_OPS:
            continue
        evals = {Operand.Q: node.type.size, Operand.KV: node.type.size * query_blocks,
                 Operand.SCORES: scores}  # fmt: skip
        other += evals[operand] * _weight(node.op)
    return _anchor_flops(graph, m1) + _anchor_flops(graph, m2), other


def read_bytes(graph: Graph, spec: KernelSpec) -> int:
    inside = set(spec.nodes)
    total = 0
    for t in spec.inputs:
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


def passes(graph: Graph, spec: KernelSpec) -> int:
    """How many times a row-reduce kernel streams its inputs: once when the
    row fits in registers, else once per phase plus the epilogue pass that
    stores full-space outputs of the last phase."""
    rows = spec.roles
    if not isinstance(rows, Rows) or not rows.looped:
        return 1
    last = any(s not in rows.row_space and rows.depth_of(s) == rows.phases for s in spec.outputs)
    return rows.phases + (1 if last else 0)


def flops(graph: Graph, spec: KernelSpec) -> int:
    if spec.template == VIEW:
        return 0
    if spec.template == ATTENTION:
        return sum(attention_flops(graph, spec))
    roles = spec.roles
    total = 0
    if isinstance(roles, Anchored):
        anchor = graph.producer[roles.anchor]
        total += _anchor_flops(graph, anchor)
        reuse = _reuse(spec, anchor)
        for n in (*roles.prologue, *roles.epilogue):
            node = graph.producer[n]
            if node.op in FREE_OPS:
                continue
            evals = anchor.type.size if n in roles.epilogue else node.type.size * reuse
            total += evals * _weight(node.op)
        return total
    space = math.prod(spec.space)
    for n in spec.nodes:
        node = graph.producer[n]
        if node.op in FREE_OPS:
            continue
        if node.op in ROW_REDUCTIONS:
            total += graph.types[node.inputs[0]].size
        elif isinstance(roles, Rows) and n in roles.row_space:
            total += roles.rows * _weight(node.op)
        else:
            total += space * _weight(node.op)
    return total


def _reuse(spec: KernelSpec, anchor: Node) -> int:
    """How many programs load each operand element of a matmul: one per
    column of tiles (its prologue is evaluated that many times)."""
    if anchor.op is Op.MATMUL:
        return max(1, math.ceil(anchor.shape[-1] / spec.config["BLOCK_N"]))
    return 1


def _anchor_flops(graph: Graph, anchor: Node) -> int:
    if anchor.op is Op.MATMUL:
        k = graph.types[anchor.inputs[0]].shape[-1]
        return 2 * anchor.type.size * k
    if anchor.op is Op.CONV:
        w = graph.types[anchor.inputs[1]]
        return 2 * anchor.type.size * math.prod(w.shape[1:])
    return anchor.type.size * math.prod(anchor.attrs["kernel"])


def _weight(op: Op) -> int:
    return SFU_FLOPS if op in SFU_OPS else 1


def compute_peak(graph: Graph, spec: KernelSpec, device: Device) -> float:
    if spec.template in (MATMUL, CONV):
        dtype = graph.producer[spec.anchor].dtype
        if dtype == "float16":
            return device.fp16_tflops
        if dtype == "float32" and spec.config.precision == "tf32":
            return device.tf32_tflops
    return device.fp32_tflops


def cost(graph: Graph, spec: KernelSpec, device: Device) -> Cost:
    """Roofline cost of ``spec`` writing its sinks (optional outputs are
    priced by ``Prices.price``)."""
    if spec.template == VIEW:
        return Cost(0, 0, 0.0, 0.0, 0.0)
    nbytes = read_bytes(graph, spec) * passes(graph, spec) + write_bytes(graph, spec.outputs)
    if spec.template == ATTENTION:
        mm, other = attention_flops(graph, spec)
        a = spec.roles
        compute_us = us_for_flops(other, device.fp32_tflops)
        for m in (graph.producer[a.m1], graph.producer[a.m2]):
            peak = device.fp16_tflops if m.dtype == "float16" else device.fp32_tflops
            compute_us += us_for_flops(_anchor_flops(graph, m), peak)
        return Cost(nbytes, mm + other, us_for_bytes(nbytes, device), compute_us, device.launch_us)
    f = flops(graph, spec)
    return Cost(
        nbytes, f, us_for_bytes(nbytes, device),
        us_for_flops(f, compute_peak(graph, spec, device)), device.launch_us,
    )  # fmt: skip
