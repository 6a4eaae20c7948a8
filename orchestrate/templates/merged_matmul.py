"""The merged_matmul template: sibling matmuls reading one activation (Q/K/V,
gate/up) as one grouped launch, segment after segment."""

from __future__ import annotations

from orchestrate.cost import terms
from orchestrate.emit.siblings import merged_matmul
from orchestrate.ir import Graph
from orchestrate.kernels.siblings import RULE
from orchestrate.kernels.spec import KernelSpec, segment_specs
from orchestrate.templates.base import Template


def flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """No prologue: each segment's dots and epilogue."""
    parts = [terms.anchored_flops(graph, s) for s in segment_specs(graph, spec)]
    return sum(p[0] for p in parts), sum(p[2] for p in parts)


TEMPLATE = Template(
    RULE,
    merged_matmul,
    flops=flops,
    blocks=terms.merged_blocks,
    steps=terms.matmul_steps,
    gemm=True,
)
