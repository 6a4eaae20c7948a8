"""The merged_matmul template: sibling matmuls reading one activation (Q/K/V,
gate/up) as one grouped launch, segment after segment.

Cost (``cost/roofline.py`` turns these counts into time):
one launch whose grid is every sibling's tiles, segment after segment (more
blocks than any one of them: fuller waves, more bytes in flight); bytes: the
activation read once, every weight and epilogue input, every output; flops
and loop steps: each segment's, as a matmul with its epilogue.
"""

from __future__ import annotations

from orchestrate.cost import terms
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec, segment_specs
from orchestrate.templates.base import Template
from orchestrate.templates.merged_matmul.emit import merged_matmul
from orchestrate.templates.merged_matmul.exact import merged as exact_merged
from orchestrate.templates.merged_matmul.rule import RULE


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
    exact=exact_merged,
)
