"""The anchored rules: one compute primitive with a prologue and an epilogue.

``matmul``  one MATMUL; elementwise/layout prologue on its operands
            (evaluated as tiles are loaded) and an aligned elementwise
            epilogue (bias, activation, residual, scale, cast).
``conv``    one CONV as implicit GEMM with an aligned elementwise epilogue.
``window``  one POOL with an elementwise prologue and an aligned epilogue.

The epilogue runs on the anchor's result tile, element by element, so its
nodes are elementwise and shaped like the anchor; the prologue runs on
operand tiles, so nothing outside the kernel may read it.
"""

from __future__ import annotations

import math

from orchestrate import ir
from orchestrate.ir import Graph, Node, Op
from orchestrate.kernels import config, fit
from orchestrate.kernels.region import (
    POINTWISE_OPS,
    Region,
    ancestors_within,
    descendants_within,
)
from orchestrate.kernels.rule import Rule, accept
from orchestrate.kernels.spec import (
    CONV,
    MATMUL,
    WINDOW,
    Anchored,
    KernelSpec,
    Rejection,
    Target,
)

EPILOGUE_OPS = ir.ELEMENTWISE  # keep the anchor's element alignment
MAX_GRID_AXIS1 = 65535  # the groups of a conv run on grid axis 1
POOL_DIMS = (1, 2, 3)  # spatial dimensions the window template unrolls


def roles(graph: Graph, r: Region, anchor: Node, template: str) -> Anchored | Rejection:
    """Prologue and epilogue around ``anchor``, or why the set has none."""
    downstream = descendants_within(graph, anchor.name, r.inside)
    upstream = ancestors_within(graph, anchor.name, r.inside)
    for n in r.nodes:
        if n.name == anchor.name:
            continue
        if n.name in downstream:
            if n.op not in EPILOGUE_OPS:
                return Rejection(f"{n.name} ({n.op.value}) cannot run in a {template} epilogue")
            if n.shape != anchor.shape:
                return Rejection(
                    f"{n.name} {list(n.shape)} is not aligned with {anchor.name} "
                    f"{list(anchor.shape)}"
                )
            for i in n.inputs:
                if i in r.inside and i not in downstream and i != anchor.name:
                    return Rejection(f"{n.name} mixes the epilogue with prologue value {i}")
        else:
            if template == CONV:
                return Rejection(f"{n.name} ({n.op.value}): conv kernels take no prologue")
            if n.op not in POINTWISE_OPS:
                return Rejection(f"{n.name} ({n.op.value}) cannot run in a {template} prologue")
            if n.name not in upstream:
                return Rejection(f"{n.name} neither feeds nor follows {anchor.name}")
            if n.name in r.sinks or n.name in r.exposed:
                return Rejection(f"prologue value {n.name} is needed outside the kernel")
    bad = [s for s in r.sinks if s not in downstream and s != anchor.name]
    if bad:
        return Rejection(f"{bad[0]} does not flow into {anchor.name}")
    return Anchored(
        anchor.name,
        tuple(n for n in r.names if n in upstream),
        tuple(n for n in r.names if n in downstream),
    )


def _optional(r: Region, roles_: Anchored) -> tuple[str, ...]:
    return tuple(e for e in r.exposed if e in roles_.epilogue or e == roles_.anchor)


def _one(op: Op):
    def judges(r: Region) -> bool:
        return len(r.anchors) == 1 and r.anchors[0].op is op and not r.reductions

    return judges


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
    return accept(graph, MATMUL_RULE, r, mm.shape, found, _optional(r, found), configs, target)


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
    return accept(graph, CONV_RULE, r, cv.shape, found, _optional(r, found), configs, target)


def window(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    pool = r.anchors[0]
    spatial = len(pool.shape) - 2
    if spatial not in POOL_DIMS:
        return Rejection(f"{pool.name}: {spatial}-D pooling (1-D, 2-D and 3-D are supported)")
    found = roles(graph, r, pool, WINDOW)
    if isinstance(found, Rejection):
        return found
    configs = config.window(math.prod(pool.shape))
    return accept(graph, WINDOW_RULE, r, pool.shape, found, _optional(r, found), configs, target)


MATMUL_RULE = Rule(
    MATMUL,
    "one matmul: prologue on operand tiles, aligned elementwise epilogue",
    _one(Op.MATMUL),
    matmul,
    working_set=fit.dot_tiles,
)
CONV_RULE = Rule(
    CONV,
    "one convolution as implicit GEMM with an aligned elementwise epilogue",
    _one(Op.CONV),
    conv,
    working_set=fit.dot_tiles,
)
WINDOW_RULE = Rule(
    WINDOW,
    "one max/avg pool with an elementwise prologue and an aligned epilogue",
    _one(Op.POOL),
    window,
)
