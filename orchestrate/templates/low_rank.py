"""The low_rank template: x @ W + alpha (x @ A) @ B (LoRA, low-rank layers) as
one matmul over K + r."""

from __future__ import annotations

import math

from orchestrate.cost import terms
from orchestrate.emit.low_rank import low_rank
from orchestrate.ir import Graph
from orchestrate.kernels.low_rank import RULE
from orchestrate.kernels.spec import KernelSpec, LowRank
from orchestrate.templates.base import Template


def flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(dot flops, other flops) of a matmul with a low-rank branch (see the module doc)."""
    roles = spec.roles
    assert isinstance(roles, LowRank)
    mm = graph.producer[roles.anchor]
    rows, n = math.prod(mm.shape[:-1]), mm.shape[-1]
    k, r = graph.types[roles.x].shape[-1], roles.block_r
    col_tiles = terms.reuse(spec, mm)
    dots = terms.anchor_flops(graph, mm) + 2 * rows * k * r * col_tiles + 2 * rows * r * n
    return dots, rows * r * col_tiles + terms.anchored_flops(graph, spec)[2]


TEMPLATE = Template(
    RULE, low_rank, flops=flops, blocks=terms.matmul_blocks, steps=terms.matmul_steps, gemm=True
)
