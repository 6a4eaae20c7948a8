"""The matmul rule: one MATMUL, its prologue evaluated on operand tiles as
they are loaded and an aligned elementwise epilogue on the result tile."""

from __future__ import annotations

import math

from orchestrate.ir import Graph, Op
from orchestrate.kernels import config, fit
from orchestrate.kernels.anchored import one, optional, roles
from orchestrate.kernels.region import Region
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import MATMUL, KernelSpec, Rejection, Target


def matmul(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    mm = r.anchors[0]
    found = roles(graph, r, mm, MATMUL)
    if isinstance(found, Rejection):
        return found
    a = graph.types[mm.inputs[0]]
    *batch, m, n = mm.shape
    configs = config.matmul(
        m, n, a.shape[-1], a.dtype, target.tf32, math.prod(batch), target.device.sms
    )
    return accept(graph, RULE, r, mm.shape, found, optional(r, found), configs, target)


RULE = Rule(
    MATMUL,
    "one matmul: prologue on operand tiles, aligned elementwise epilogue",
    one(Op.MATMUL),
    matmul,
    working_set=fit.dot_tiles,
)
