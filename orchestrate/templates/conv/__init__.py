"""The conv template: one convolution as an implicit GEMM, with an aligned
elementwise epilogue; groups run on grid axis 1."""

from __future__ import annotations

import math

from orchestrate.cost import terms
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec
from orchestrate.templates.base import Template
from orchestrate.templates.conv.emit import conv
from orchestrate.templates.conv.rule import RULE


def blocks(graph: Graph, spec: KernelSpec) -> int:
    """Tiles of the GEMM (output pixels x output channels of a group), per group."""
    c = spec.config
    cv = graph.producer[spec.anchor]
    nb, m, *spatial = cv.shape
    groups = cv.attrs["group"]
    gemm_m, gemm_n = nb * math.prod(spatial), m // groups
    return math.ceil(gemm_m / c["BLOCK_M"]) * math.ceil(gemm_n / c["BLOCK_N"]) * groups


def steps(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """Steps of BLOCK_K over the reduction (input channels x the window)."""
    c = spec.config
    w = graph.types[graph.producer[spec.anchor].inputs[1]]
    return math.ceil(math.prod(w.shape[1:]) / c["BLOCK_K"]), max(1, c.num_stages - 1)


TEMPLATE = Template(
    RULE, conv, flops=terms.anchored_split_flops, blocks=blocks, steps=steps, gemm=True
)
