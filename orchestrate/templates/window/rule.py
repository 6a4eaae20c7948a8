"""The window rule: one max or average pool with an elementwise prologue and
an aligned epilogue."""

from __future__ import annotations

import math

from orchestrate.ir import Graph, Op
from orchestrate.kernels.anchored import one, optional, roles
from orchestrate.kernels.region import Region
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import WINDOW, KernelSpec, Rejection, Target
from orchestrate.templates.window import config as spaces

POOL_DIMS = (1, 2, 3)  # spatial dimensions the window template unrolls


def window(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    pool = r.anchors[0]
    spatial = len(pool.shape) - 2
    if spatial not in POOL_DIMS:
        return Rejection(f"{pool.name}: {spatial}-D pooling (1-D, 2-D and 3-D are supported)")
    found = roles(graph, r, pool, WINDOW)
    if isinstance(found, Rejection):
        return found
    configs = spaces.window(math.prod(pool.shape))
    return accept(graph, RULE, r, pool.shape, found, optional(r, found), configs, target)


RULE = Rule(
    WINDOW,
    "one max/avg pool with an elementwise prologue and an aligned epilogue",
    one(Op.POOL),
    window,
)
