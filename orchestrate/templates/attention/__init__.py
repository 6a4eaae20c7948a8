"""The attention template: softmax(Q @ K, scaled and masked) @ V as one
flash-attention kernel (split-KV where the blocks of query rows underfill
the device), in one package: its rule, configurations and fit
(``rule.py``), its kernel (``emit.py``) and, here, its cost terms.

Cost (``cost/roofline.py`` turns these counts into time):

* bytes: Q, K, V and every other external input (a mask, a bias) read once,
  the output written once; the scores and probabilities never leave the chip
  (K and V tiles re-read by each block of query rows are served from L2);
* flops: both matmuls (2·Lq·Lk·D and 2·Lq·Lk·Dv per batch entry), the score
  chain and the softmax per score (max, subtract, ``SFU_FLOPS`` for exp,
  sum), the online rescaling (one exp per row and one multiply per output
  element, per block of keys) and one division per output element; prologue
  nodes once per evaluation (Q once, K and V once per block of query rows,
  the score chain's side inputs once per score);
* the matmuls run at the tensor-core rate in half precision and on CUDA
  cores in fp32 (the kernel runs fp32 dots in IEEE, also under ``--tf32``);
* blocks: one per ``BLOCK_M`` query rows per batch entry; loop steps: key
  blocks of ``BLOCK_N``;
* split-KV (``SPLIT_K`` = S > 1): S times the blocks, each with 1/S of the
  key blocks; bytes: the fp32 partial states, S x (Dv + 2) per query row,
  written and read back; flops: the combine's S exps per row and its sums;
  latency: ``FIXUP_LATENCIES`` after the last wave, as split-K's fix-up.
"""

from __future__ import annotations

import math

from orchestrate.cost import terms
from orchestrate.cost.devices import Device
from orchestrate.cost.figures import SFU_FLOPS
from orchestrate.ir import Graph, Op
from orchestrate.kernels.spec import AttentionRoles, KernelSpec, Operand, split_k
from orchestrate.templates.attention.emit import attention
from orchestrate.templates.attention.rule import RULE
from orchestrate.templates.base import Template


def flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(matmul flops, other flops) of an attention kernel (see the package doc)."""
    a = spec.roles
    assert isinstance(a, AttentionRoles)
    m1, m2 = graph.producer[a.m1], graph.producer[a.m2]
    *_, lq, lk = m1.shape
    scores, outputs = m1.type.size, m2.type.size
    rows = scores // lk
    key_blocks = math.ceil(lk / spec.config["BLOCK_N"])
    other = sum(scores * terms.weight(graph.producer[n].op) for n in a.scores)
    for n in a.softmax:
        node = graph.producer[n]
        if node.op in (Op.RMAX, Op.SUM, Op.SUB, Op.EXP, Op.CAST):
            other += scores * terms.weight(node.op)
        elif node.op is Op.DIV:
            other += outputs * terms.weight(node.op)  # the output is normalised once
        else:  # a floor: one per row
            other += rows
    other += key_blocks * (rows * SFU_FLOPS + outputs)  # rescale by exp(m_old - m_new)
    splits = split_k(spec.config)
    if splits > 1:  # split-KV's combine: one exp per row and slot, the slots' sums added
        other += splits * rows * SFU_FLOPS + scratch(graph, spec)[0]
    # prologue: Q's once, K's and V's once per block of query rows, side inputs per score
    query_blocks = math.ceil(lq / spec.config["BLOCK_M"])
    for n, operand in a.prologue:
        node = graph.producer[n]
        if node.op in terms.FREE_OPS:
            continue
        evals = {
            Operand.Q: node.type.size,
            Operand.KV: node.type.size * query_blocks,
            Operand.SCORES: scores,
        }
        other += evals[operand] * terms.weight(node.op)
    return terms.anchor_flops(graph, m1) + terms.anchor_flops(graph, m2), other


def blocks(graph: Graph, spec: KernelSpec) -> int:
    """One program per ``BLOCK_M`` query rows per batch entry, times SPLIT_K."""
    a = spec.roles
    assert isinstance(a, AttentionRoles)
    *batch, lq, _ = graph.producer[a.m1].shape
    return math.ceil(lq / spec.config["BLOCK_M"]) * math.prod(batch) * split_k(spec.config)


def steps(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """Key blocks of ``BLOCK_N`` (split-KV: each program its share)."""
    a, c = spec.roles, spec.config
    assert isinstance(a, AttentionRoles)
    key_blocks = math.ceil(graph.producer[a.m1].shape[-1] / c["BLOCK_N"])
    return math.ceil(key_blocks / split_k(c)), max(1, c.num_stages - 1)


def dot_us(graph: Graph, spec: KernelSpec, dots: int, device: Device) -> float:
    """Both matmuls at a flash kernel's rate for their dtype (fp32 attention
    runs its dots in IEEE on CUDA cores)."""
    a = spec.roles
    return sum(
        terms.us_for_flops(terms.anchor_flops(graph, m), terms.attention_tflops(m.dtype, device))
        for m in (graph.producer[a.m1], graph.producer[a.m2])
    )


def scratch(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """Split-KV's scratch: SPLIT_K x (its output and two row values), and one
    counter per block of query rows (under the smaller of the GPU's and the
    interpreter's BLOCK_M: the more blocks)."""
    a = spec.roles
    *batch, lq, dv = graph.producer[a.m2].shape
    blocks = dict(spec.config.blocks)
    bm = min(blocks["BLOCK_M"], dict(spec.config.interpret).get("BLOCK_M", blocks["BLOCK_M"]))
    b = math.prod(batch)
    return split_k(spec.config) * b * lq * (dv + 2), b * -(-lq // bm)


TEMPLATE = Template(
    RULE,
    attention,
    flops=flops,
    blocks=blocks,
    steps=steps,
    dot_us=dot_us,
    gemm=True,
    scratch=scratch,
)
