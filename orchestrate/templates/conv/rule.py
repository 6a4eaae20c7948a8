"""The conv rule: one CONV as an implicit GEMM with an aligned elementwise
epilogue; its groups run on grid axis 1."""

from __future__ import annotations

import math

from orchestrate.ir import Graph, Op
from orchestrate.kernels import config, fit
from orchestrate.kernels.anchored import one, optional, roles
from orchestrate.kernels.region import Region
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import CONV, KernelSpec, Rejection, Target

MAX_GRID_AXIS1 = 65535  # the groups of a conv run on grid axis 1


def conv(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    cv = r.anchors[0]
    found = roles(graph, r, cv, CONV)
    if isinstance(found, Rejection):
        return found
    groups = cv.attrs["group"]
    if groups > MAX_GRID_AXIS1:
        return Rejection(f"{cv.name}: {groups} groups exceed grid axis 1")
    x, w = graph.types[cv.inputs[0]], graph.types[cv.inputs[1]]
    gemm_m = x.shape[0] * math.prod(cv.shape[2:])
    gemm_n, gemm_k = w.shape[0] // groups, math.prod(w.shape[1:])
    configs = config.conv(gemm_m, gemm_n, gemm_k, x.dtype, target.tf32)
    return accept(graph, RULE, r, cv.shape, found, optional(r, found), configs, target)


RULE = Rule(
    CONV,
    "one convolution as implicit GEMM with an aligned elementwise epilogue",
    one(Op.CONV),
    conv,
    working_set=fit.dot_tiles,
)
