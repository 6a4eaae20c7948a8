"""The low_rank template: x @ W + alpha (x @ A) @ B (LoRA, low-rank layers) as
one matmul over K + r, in one package: its roles (``roles.py``), its rule,
configurations and fit (``rule.py``), its kernel (``emit.py``), what it
computes for the exact check (``exact.py``) and, here, its cost terms and
its registry entry.

Cost (``cost/roofline.py`` turns these counts into time):
grid and loop
steps of the matmul x @ W (no split-K); bytes: x, W, A, B and the epilogue
inputs read once, the outputs written (x @ A, its product with B and x @ W
are never written); dots: x @ W, x @ A once per column of tiles (each
recomputes its rows') and t @ B, at the rank padded to BLOCK_R (the tensor
cores multiply the padding too); CUDA cores: alpha on t per column of
tiles, then the epilogue.
"""

from __future__ import annotations

import math

from orchestrate.cost import terms
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec
from orchestrate.templates.base import Template
from orchestrate.templates.low_rank.emit import low_rank
from orchestrate.templates.low_rank.exact import low_rank as exact_low_rank
from orchestrate.templates.low_rank.roles import NAME, LowRank
from orchestrate.templates.low_rank.rule import RULE, analyse, propose

__all__ = ["NAME", "RULE", "TEMPLATE", "LowRank", "analyse", "flops", "propose"]


def flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(dot flops, other flops) of a matmul with a low-rank branch (see the package doc)."""
    roles = spec.roles
    assert isinstance(roles, LowRank)
    mm = graph.producer[roles.anchor]
    rows, n = math.prod(mm.shape[:-1]), mm.shape[-1]
    k, r = graph.types[roles.x].shape[-1], roles.block_r
    col_tiles = terms.reuse(spec, mm)
    dots = terms.anchor_flops(graph, mm) + 2 * rows * k * r * col_tiles + 2 * rows * r * n
    return dots, rows * r * col_tiles + terms.anchored_flops(graph, spec)[2]


TEMPLATE = Template(
    RULE,
    low_rank,
    flops=flops,
    blocks=terms.matmul_blocks,
    steps=terms.matmul_steps,
    gemm=True,
    exact=exact_low_rank,
)
