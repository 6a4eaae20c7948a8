"""The matmul template: one matmul, its prologue on operand tiles and an
aligned elementwise epilogue (split-K where the tiles underfill the device)."""

from __future__ import annotations

from orchestrate.cost import terms
from orchestrate.emit.matmul import matmul
from orchestrate.kernels.anchored import MATMUL_RULE
from orchestrate.templates.base import Template

TEMPLATE = Template(
    MATMUL_RULE,
    matmul,
    flops=terms.anchored_split_flops,
    blocks=terms.matmul_blocks,
    steps=terms.matmul_steps,
    gemm=True,
)
