"""What a merged matmul computes, for the exact check (``check/exact/check.py``).

Not its sibling matmuls one by one: its activation times the segments'
weights concatenated along N (in segment order), each segment's recorded
columns [start, stop) as that sibling's result, then each segment's own
epilogue, which sees only its own segment.  A wrong split of the merged
weights (ranges swapped or shifted, a weight in the wrong segment, a sibling
dropped, an epilogue on another sibling's columns) is a wrong value.  A norm
moved past the siblings (``norm_merged_matmul``) is the roles' ``prologue``:
its nodes are evaluated first, as any kernel's, and give the activation.
"""

from __future__ import annotations

import numpy as np

from orchestrate import ir
from orchestrate.check.exact import field as F


def merged(run) -> dict:
    """The values a merged matmul kernel computes (``run``: a ``KernelRun``)."""
    graph, roles = run.graph, run.kernel.roles
    claimed = {n for g in roles.segments for n in (g.anchor, *g.epilogue)}
    stray = next(
        (n for n in run.kernel.nodes if n not in claimed and n not in roles.prologue), None
    )
    if stray is not None:
        run.wrong(stray, f"runs {stray!r} in none of its segments")
    for g in roles.segments:  # the roles describe the plan's own matmuls
        n = graph.producer.get(g.anchor)
        if n is None or n.op is not ir.Op.MATMUL or n.inputs != (roles.activation, g.weight):
            run.wrong(
                g.anchor,
                f"segment {g.anchor!r} is not {roles.activation} @ {g.weight} in the plan's graph",
            )
    before: dict = {}  # the activation's own nodes (a norm), as the kernel's
    for name in roles.prologue:
        before[name] = run.node(name, before)
    x = run.read(roles.activation, before)
    weights = [run.read(g.weight) for g in roles.segments]
    f = run.field
    try:
        y = tuple(
            F.matmul(x[i], np.concatenate([w[i] for w in weights], axis=-1), m)
            for i, m in ((0, f.p), (1, f.q))
        )
    except ValueError as e:
        run.wrong(roles.anchor, f"cannot multiply its merged weights ({e})")
    local = dict(before)
    for g in roles.segments:
        mine = {g.anchor: (y[0][..., g.start : g.stop], y[1][..., g.start : g.stop])}
        for name in g.epilogue:
            n = graph.producer.get(name)
            other = next(
                (t for t in (n.inputs if n else ()) if t in claimed and t not in mine), None
            )
            if other is not None:
                run.wrong(
                    name,
                    f"computes {name!r} in the segment of {g.anchor!r} from {other!r}, "
                    "another segment's",
                )
            mine[name] = run.node(name, mine)
        local.update(mine)
    return local
