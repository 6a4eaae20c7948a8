"""The roofline floor of a whole model: no runtime can be faster on the device.

    floor = max(bytes / achievable bandwidth, dot flops / tensor peak + other flops / fp32 peak)

``bytes`` is the least any runtime must move through device memory: every
graph input and every constant (the weights) read once, every graph output
written once; intermediates never leave the chip.  ``dot flops`` are the
multiply-adds of the matmuls (2·M·N·K) and convolutions (2 per weight per
output element), priced at the device's dense peak for their operands'
dtype (fp16 and bf16 tensor cores; TF32 under ``tf32``; otherwise the fp32
CUDA cores); every other primitive costs one flop per output element, or
``SFU_FLOPS`` for a transcendental (a reduction one per input element), at
the fp32 CUDA-core peak.  The bandwidth is the achievable fraction of the
datasheet (``cost.figures.ACHIEVABLE_BANDWIDTH``), the flop rates the
datasheet peaks (``devices.py``): a floor, not a prediction.  No launch
overhead, no latency: the fraction of the floor a runtime reaches,
``floor / measured``, is at most 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrate.cost.devices import Device
from orchestrate.cost.figures import ACHIEVABLE_BANDWIDTH, SFU_FLOPS
from orchestrate.cost.terms import FREE_OPS, SFU_OPS
from orchestrate.ir import Graph, Op
from orchestrate.kernels.region import ROW_REDUCTIONS

HALF = ("float16", "bfloat16")


@dataclass(frozen=True)
class Floor:
    device: str
    bytes: int
    dot_flops: int
    other_flops: int
    memory_ms: float
    compute_ms: float

    @property
    def ms(self) -> float:
        return max(self.memory_ms, self.compute_ms)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_ms >= self.compute_ms else "compute"


def least_bytes(graph: Graph) -> int:
    """Inputs and the constants some node reads, once each; outputs, once each."""
    types = graph.types
    read = {t for n in graph.nodes for t in n.inputs}
    names = [i.name for i in graph.inputs] + [c for c in graph.constants if c in read]
    return sum(types[t].nbytes for t in names) + sum(types[t].nbytes for t in set(graph.outputs))


def node_flops(graph: Graph) -> tuple[dict[str, int], int]:
    """(dot flops by operand dtype, other flops) of every primitive."""
    dots: dict[str, int] = {}
    other = 0
    types = graph.types
    for n in graph.nodes:
        if n.op is Op.MATMUL:
            a = types[n.inputs[0]]
            dots[a.dtype] = dots.get(a.dtype, 0) + 2 * n.type.size * a.shape[-1]
        elif n.op is Op.CONV:
            a, w = types[n.inputs[0]], types[n.inputs[1]]
            dots[a.dtype] = dots.get(a.dtype, 0) + 2 * n.type.size * math.prod(w.shape[1:])
        elif n.op in ROW_REDUCTIONS:
            other += types[n.inputs[0]].size
        elif n.op not in FREE_OPS:
            other += n.type.size * (SFU_FLOPS if n.op in SFU_OPS else 1)
    return dots, other


def dot_peak_tflops(dtype: str, device: Device, tf32: bool) -> float:
    """The dense datasheet rate of a dot on ``dtype`` operands."""
    if dtype in HALF:
        return device.fp16_tflops
    if dtype == "float32" and tf32:
        return device.tf32_tflops
    return device.fp32_tflops


def roofline_floor(graph: Graph, device: Device, *, tf32: bool = False) -> Floor:
    """The floor of ``graph`` (the primitive graph at the precision it runs in)."""
    nbytes = least_bytes(graph)
    dots, other = node_flops(graph)
    compute_s = sum(f / (dot_peak_tflops(d, device, tf32) * 1e12) for d, f in dots.items())
    compute_s += other / (device.fp32_tflops * 1e12)
    memory_s = nbytes / (device.bandwidth_gbs * 1e9 * ACHIEVABLE_BANDWIDTH)
    return Floor(device.name, nbytes, sum(dots.values()), other, memory_s * 1e3, compute_s * 1e3)
