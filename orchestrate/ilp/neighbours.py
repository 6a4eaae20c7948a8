"""Why neighbouring kernels of a plan were not one kernel.

For each producer/consumer pair of chosen kernels: the reason the rules give
for refusing their union, or, when the union is a legal kernel, its
predicted time next to the two kernels' (the linear program found it slower,
or a third kernel's needs kept them apart).  ``orchestrate explain
--rejected`` prints these.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrate.cost.roofline import Prices
from orchestrate.ilp.baselines import fused_no_recompute
from orchestrate.ir import Graph
from orchestrate.kernels.spec import Rejection, Target
from orchestrate.plan import PlannedKernel, Unfused


def unfused_neighbours(
    graph: Graph, kernels: Sequence[PlannedKernel], target: Target, prices: Prices
) -> tuple[Unfused, ...]:
    writer: dict[str, PlannedKernel] = {}
    for k in kernels:
        for t in k.outputs:
            writer.setdefault(t, k)
    out = []
    seen = set()
    for k in kernels:
        for t in k.inputs:
            src = writer.get(t)
            if src is None or (src.name, k.name) in seen:
                continue
            seen.add((src.name, k.name))
            merged = fused_no_recompute(graph, src.primitives + k.primitives, target, prices)
            if isinstance(merged, Rejection):
                reason = merged.reason
            else:
                apart = src.predicted_us + k.predicted_us
                reason = (
                    f"legal as one {merged.kernel.template} kernel but predicted "
                    f"{merged.time_us:.2f} us vs {apart:.2f} us apart"
                )
            out.append(Unfused(src.name, k.name, t, reason))
    return tuple(out)
