"""The norm_matmul template: an RMSNorm or LayerNorm moved past the matmul it
feeds, its statistics gathered in the K loop (no split-K: each program needs
whole rows).

Cost (``cost/roofline.py`` turns these counts into time):
a matmul whose A operand is the norm's input x,
not the normalised n: bytes are x, gamma, beta, W and the epilogue inputs
read once and the outputs written (n is never written, and no row-reduce
kernel runs); grid, loop steps and dots are the matmul's (no split-K).  CUDA
cores: per element of x, once per column of tiles, x's own prologue,
``NORM_STAT_FLOPS`` for the running statistics and the multiply by gamma;
the row nodes once per row per column of tiles; each shift's column vector
@ W once per row of tiles; scaling and shifting the accumulator, then the
epilogue, once per output element.
"""

from __future__ import annotations

import math

from orchestrate.cost import terms
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec
from orchestrate.templates.base import Template
from orchestrate.templates.norm_matmul.emit import norm_matmul
from orchestrate.templates.norm_matmul.rule import RULE

NORM_STAT_FLOPS = 4


def flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(dot flops, other flops) of a norm moved past a matmul (see the module doc)."""
    roles = spec.roles
    mm = graph.producer[roles.anchor]
    *batch, m, n = mm.shape
    k = graph.types[roles.x].shape[-1]
    rows = math.prod(mm.shape[:-1])
    per_x = (
        NORM_STAT_FLOPS
        + bool(roles.scale[2])
        + sum(
            terms.weight(graph.producer[t].op)
            for t in roles.feed
            if graph.producer[t].op not in terms.FREE_OPS
        )
    )
    per_row = sum(terms.weight(graph.producer[t].op) for t in roles.rows)
    col_tiles = terms.reuse(spec, mm)
    row_tiles = math.ceil(m / spec.config["BLOCK_M"]) * math.prod(batch)
    other = (rows * k * per_x + rows * per_row) * col_tiles
    other += len(roles.shifts) * 2 * k * n * row_tiles  # h_j @ W, once per row of tiles
    other += (1 + len(roles.shifts)) * mm.type.size + terms.anchored_flops(graph, spec)[2]
    return terms.anchor_flops(graph, mm), other


TEMPLATE = Template(
    RULE, norm_matmul, flops=flops, blocks=terms.matmul_blocks, steps=terms.matmul_steps, gemm=True
)
