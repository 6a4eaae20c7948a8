"""The matmul template: one matmul, its prologue on operand tiles and an
aligned elementwise epilogue (split-K where the tiles underfill the device)."""

from __future__ import annotations

from orchestrate.cost import terms
from orchestrate.templates.base import Template
from orchestrate.templates.matmul.emit import matmul
from orchestrate.templates.matmul.rule import RULE

TEMPLATE = Template(
    RULE,
    matmul,
    flops=terms.anchored_split_flops,
    blocks=terms.matmul_blocks,
    steps=terms.matmul_steps,
    gemm=True,
)
