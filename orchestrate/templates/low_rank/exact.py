"""What a matmul with a folded low-rank branch computes, for the exact check
(``check/exact/check.py``).

Not the branch's own matmuls: one matmul of [x | alpha (x @ A)[:, :rank]]
by [W ; B[:rank]] (alpha the product of the branch's scales, in the field),
P's adds on that, P as the join's value, then the nodes after the join.  A
dropped low-rank term, a dropped alpha, a wrong rank slice or B applied
without A is then a wrong value.
"""

from __future__ import annotations

import numpy as np

from orchestrate import ir
from orchestrate.check.exact import field as F


def low_rank(run) -> dict:
    """The values a low-rank kernel computes (``run``: a ``KernelRun``)."""
    graph, roles = run.graph, run.kernel.roles
    branch = {roles.down, roles.up, *roles.scaling}
    stray = next(
        (n for n in run.kernel.nodes if n not in {roles.anchor, *branch, *roles.epilogue}), None
    )
    if stray is not None:
        run.wrong(stray, f"runs {stray!r} in none of its roles")
    mm = graph.producer.get(roles.anchor)
    if mm is None or mm.op is not ir.Op.MATMUL or mm.inputs[0] != roles.x:
        run.wrong(roles.anchor, f"{roles.anchor!r} is not {roles.x} @ W in the plan's graph")
    down = graph.producer.get(roles.down)
    if roles.down and (down is None or down.op is not ir.Op.MATMUL or down.inputs[0] != roles.x):
        run.wrong(roles.down, f"{roles.down!r} is not {roles.x} @ A in the plan's graph")
    join = graph.producer.get(roles.join)
    if join is None or join.op is not ir.Op.ADD or roles.main not in join.inputs:
        run.wrong(
            roles.join,
            f"{roles.join!r} does not add the low-rank branch to {roles.main!r} in the plan's graph",
        )
    f = run.field
    x = run.read(roles.x)
    w = run.read(mm.inputs[1])
    # B applied to (x @ A), or to x itself where the roles name no A
    t = x
    if roles.down:
        a = run.read(_weight(run, roles.down))
        t = tuple(F.matmul(x[i], a[i][..., : roles.rank], m) for i, m in ((0, f.p), (1, f.q)))
    b = run.read(_weight(run, roles.up))
    alpha = [1, 1]
    for name in roles.scaling:
        n = graph.producer.get(name)
        c = next((i for i in (n.inputs if n else ()) if i in graph.constants), None)
        if c is None or n.op not in (ir.Op.MUL, ir.Op.DIV):
            run.wrong(name, f"{name!r} is not a scale by a constant")
        v = run.trial.constant(c, graph.constants[c])
        for i, m in ((0, f.p), (1, f.q)):
            s = int(v[i].reshape(-1)[0])
            alpha[i] = alpha[i] * (pow(s, -1, m) if n.op is ir.Op.DIV else s) % m
    try:
        y = tuple(
            F.matmul(
                np.concatenate(
                    [x[i], F.mulmod(t[i][..., : roles.rank], F.U64(alpha[i]), m)], axis=-1
                ),
                np.concatenate([w[i], b[i][: roles.rank]], axis=0),
                m,
            )
            for i, m in ((0, f.p), (1, f.q))
        )
    except ValueError as e:
        run.wrong(roles.anchor, f"cannot multiply its concatenated operands ({e})")
    local = {roles.anchor: y}
    for name in roles.epilogue:
        if name == roles.join:
            local[name] = local[roles.main]
            continue
        n = graph.producer.get(name)
        other = next((i for i in (n.inputs if n else ()) if i in branch), None)
        if other is not None:
            run.wrong(name, f"reads the branch's {other!r}, which it never forms")
        local[name] = run.node(name, local)
    return local


def _weight(run, node: str) -> str:
    n = run.graph.producer.get(node)
    if n is None or n.op is not ir.Op.MATMUL:
        run.wrong(node, f"{node!r} is not a matmul in the plan's graph")
    return n.inputs[1]
