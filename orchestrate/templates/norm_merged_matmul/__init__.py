"""The norm_merged_matmul template: a norm moved past the sibling matmuls it
feeds, one launch over every segment.

Cost (``cost/roofline.py`` turns these counts into time):
the merged grid and bytes (x in place of n);
flops: each segment's as a ``norm_matmul`` of its columns.
"""

from __future__ import annotations

from orchestrate.cost import terms
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec, segment_specs
from orchestrate.templates import norm_matmul
from orchestrate.templates.base import Template
from orchestrate.templates.merged_matmul.exact import merged as exact_merged
from orchestrate.templates.norm_merged_matmul.emit import norm_merged_matmul
from orchestrate.templates.norm_merged_matmul.rule import RULE


def flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """Each segment as a norm_matmul of its columns."""
    parts = [norm_matmul.flops(graph, s) for s in segment_specs(graph, spec)]
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


TEMPLATE = Template(
    RULE,
    norm_merged_matmul,
    flops=flops,
    blocks=terms.merged_blocks,
    steps=terms.matmul_steps,
    gemm=True,
    exact=exact_merged,
)
