"""Does the plan compute the function of the original?  Mirage's fingerprint.

"The original" is the primitive graph fission makes of the ONNX model;
"the plan" is the composition of its kernels: each kernel evaluates its own
nodes, in order, from what it declares it reads (graph inputs, constants,
tensors earlier kernels wrote; scalar constants, which the source inlines),
and only what it writes is visible after it.  A kernel wired to the wrong
tensor, work dropped or done twice, or a rewrite that changes the function
gives a different value somewhere in the fragment (``fragment.py``).

A merged matmul (``templates/merged_matmul/rule.py``) is evaluated from its roles, not
from the sibling matmuls it replaces: its activation times its segments'
weights concatenated along N (in segment order), each segment's recorded
columns [start, stop) as that sibling's result, then each segment's own
epilogue, which sees only its own segment.  A wrong split of the merged
weights (ranges swapped or shifted, a weight in the wrong segment, a sibling
dropped, an epilogue on another sibling's columns) is a wrong value.  A norm moved
past the siblings (``templates/norm_merged_matmul/rule.py``) is the roles' ``prologue``:
its nodes are evaluated first, as any kernel's (what is outside the fragment
becomes a variable, as in a norm_matmul kernel), and give the activation.

A low-rank branch folded into its matmul (``templates/low_rank/``) is
evaluated from its roles too: one matmul of [x | alpha (x @ A)[:, :rank]]
by [W ; B[:rank]] (alpha the product of the branch's scales, in the field),
P's adds on that, P as the join's value, then the nodes after the join.  The
branch's own matmuls are never evaluated, so a dropped low-rank term, a
dropped alpha, a wrong rank slice or B applied without A is a wrong value.

Both are evaluated on the same random point in Z_p x Z_q (``field.py``):
inputs, constants' images and the variables standing for nodes outside the
fragment.  Compared: every graph output, every tensor a kernel writes and
every tensor a node outside reads, where the fragment holds it on both
sides (the Z_q half too where no exp reached); and every node outside must
be the original's (op, attributes, inputs, type).

False-pass bound.  Where the two sides compute different functions, a
compared value of Z_p-degree d (exp values counting as variables of degree
1) downstream of exp arguments of Z_q-degree e agrees at a random point
with probability at most ``d/p + e/q`` (Schwartz-Zippel over Z_p and over
Z_q, as in Mirage: two different exp arguments collide only where their
difference vanishes mod q, since w has order exactly q).  Each trial draws
fresh p, q, w and point, so over t trials the bound is the product of the
per-trial ``max over compared values (d/p + e/q)``, and trials are added
until it is below ``target`` (1e-9).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrate import ir
from orchestrate.check.exact import field as F
from orchestrate.check.exact.evaluate import Trial, Value, evaluate
from orchestrate.check.exact.fragment import Fragment, analyse
from orchestrate.kernels.spec import Siblings
from orchestrate.templates.low_rank import LowRank

TARGET = 1e-9
MAX_TRIALS = 50


@dataclass(frozen=True)
class Kernel:
    """What the check needs of a planned kernel."""

    name: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    merged: Siblings | None = None  # a merged matmul's segments (its spec's roles)
    low_rank: LowRank | None = None  # a low-rank branch folded into its matmul (its roles)


@dataclass(frozen=True)
class Mismatch:
    tensor: str
    trial: int
    detail: str


@dataclass(frozen=True)
class Result:
    trials: int
    bound: float  # the false-pass bound reached
    compared: tuple[str, ...]
    regions: tuple[str, ...]  # outside the fragment: left to the random-input check
    unchecked: tuple[str, ...]  # graph outputs outside the fragment
    fields: tuple[tuple[int, int], ...]  # (p, q) of each trial
    mismatch: Mismatch | None

    @property
    def ok(self) -> bool:
        return self.mismatch is None and self.bound < TARGET

    def lines(self) -> list[str]:
        out = [
            f"exact check: {len(self.compared)} tensors compared over {self.trials} trials "
            f"in Z_p x Z_q (p < 2^31, q | p-1); false-pass bound {self.bound:.3g}"
        ]
        if self.unchecked:
            out.append(
                "outputs outside the fragment (left to the random-input check): "
                + ", ".join(self.unchecked)
            )
        if self.regions:
            out.append(
                f"{len(self.regions)} regions outside the fragment (left to the "
                "random-input check):"
            )
            out += [f"  {r}" for r in self.regions]
        return out


class _Wrong(Exception):
    def __init__(self, tensor: str, detail: str):
        super().__init__(detail)
        self.tensor, self.detail = tensor, detail


def kernels_of(plan, graph: ir.Graph, specs=()) -> tuple[Kernel, ...]:
    """The kernels of an ``orchestrate.plan.Plan`` (nodes in graph order),
    with the merged matmuls' and low-rank branches' roles from their
    ``specs`` (the plan's, in order)."""
    pos = graph.position
    roles = [s.roles for s in specs] or [None] * len(plan.kernels)
    return tuple(
        Kernel(
            k.name,
            tuple(sorted(k.primitives, key=lambda n: pos.get(n, -1))),
            tuple(k.inputs),
            tuple(k.outputs),
            r if isinstance(r, Siblings) else None,
            r if isinstance(r, LowRank) else None,
        )
        for k, r in zip(plan.kernels, roles)
    )


def check(
    original: ir.Graph,
    plan_graph: ir.Graph,
    kernels: Sequence[Kernel],
    *,
    seed: int | None = None,
    target: float = TARGET,
) -> Result:
    """The fingerprint check of ``kernels`` over ``plan_graph`` against
    ``original``; ``seed`` None draws fresh primes, roots and points."""
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    fo, fp = analyse(original), analyse(plan_graph)
    compared = _compared(original, plan_graph, kernels, fo, fp)
    regions = tuple(fo.regions(original))
    unchecked = tuple(o for o in original.outputs if o in fo.outside)
    fields: list[tuple[int, int]] = []
    bound, mismatch = 1.0, _structure(original, plan_graph, fo, fp)
    while mismatch is None and bound >= target and len(fields) < MAX_TRIALS:
        trial = Trial(F.draw(rng), np.random.default_rng(rng.getrandbits(64)), original)
        fields.append((trial.field.p, trial.field.q))
        mismatch = _compare(original, plan_graph, kernels, fo, fp, compared, trial, len(fields) - 1)
        bound *= _per_trial(compared, fo, fp, trial.field) if compared else 0.0
    return Result(len(fields), bound, compared, regions, unchecked, tuple(fields), mismatch)


def _per_trial(compared, fo: Fragment, fp: Fragment, f: F.Field) -> float:
    worst = 0.0
    for t in compared:
        a, b = fo.inside[t], fp.inside[t]
        worst = max(worst, max(a.deg, b.deg) / f.p + max(a.exp_deg, b.exp_deg) / f.q)
    return min(worst, 1.0)


def _compared(original, plan_graph, kernels, fo: Fragment, fp: Fragment) -> tuple[str, ...]:
    wanted = set(original.outputs) | {t for k in kernels for t in k.outputs}
    wanted |= {t for n in plan_graph.nodes if n.name in fp.outside for t in n.inputs}
    wanted |= {t for n in original.nodes if n.name in fo.outside for t in n.inputs}
    return tuple(
        n.name
        for n in original.nodes
        if n.name in wanted and n.name in fo.inside and n.name in fp.inside
    )


def _structure(
    original: ir.Graph, plan_graph: ir.Graph, fo: Fragment, fp: Fragment
) -> Mismatch | None:
    """Same inputs and outputs, and every node outside the fragment the
    original's (so the variables standing for them mean the same)."""
    if [(i.name, i.type) for i in original.inputs] != [(i.name, i.type) for i in plan_graph.inputs]:
        return Mismatch("", -1, "the plan's graph inputs are not the original's")
    if tuple(original.outputs) != tuple(plan_graph.outputs):
        return Mismatch("", -1, "the plan's graph outputs are not the original's")
    for n in plan_graph.nodes:
        if n.name not in fp.outside:
            continue
        o = original.producer.get(n.name)
        if o is None:
            return Mismatch(
                n.name, -1, f"outside the fragment ({fp.outside[n.name]}) and not in the original"
            )
        if (o.op, o.attrs, o.inputs, o.type) != (n.op, n.attrs, n.inputs, n.type):
            return Mismatch(
                n.name,
                -1,
                f"outside the fragment ({fp.outside[n.name]}), and not "
                f"the original's node: {n} vs {o}",
            )
    for name, why in fo.outside.items():
        if name in fp.inside:
            return Mismatch(
                name, -1, f"outside the fragment in the original ({why}) but not in the plan"
            )
    return None


def _run_original(graph: ir.Graph, frag: Fragment, trial: Trial) -> dict[str, Value]:
    env: dict[str, Value] = {i.name: trial.values[i.name] for i in graph.inputs}
    for c, arr in graph.constants.items():
        env[c] = trial.constant(c, arr)
    for n in graph.nodes:
        if n.name in frag.outside:
            env[n.name] = trial.variable(n.name, n.shape)
        else:
            env[n.name] = evaluate(n, [env[i] for i in n.inputs], graph, trial)
    return env


def _run_plan(
    graph: ir.Graph, kernels: Sequence[Kernel], frag: Fragment, trial: Trial
) -> dict[str, Value]:
    """Each kernel from what it reads; only what it writes survives it."""
    written: dict[str, Value] = {i.name: trial.values[i.name] for i in graph.inputs}
    seen: dict[str, Value] = {}
    for k in kernels:
        local: dict[str, Value] = {}
        if k.merged is not None:
            local = _run_merged(graph, k, frag, written, trial)
        elif k.low_rank is not None:
            local = _run_low_rank(graph, k, frag, written, trial)
        for name in k.nodes if k.merged is None and k.low_rank is None else ():
            local[name] = _node(graph, k, name, local, written, frag, trial)
        for o in k.outputs:
            if o not in local:
                raise _Wrong(o, f"kernel {k.name} writes {o!r} but does not compute it")
            if o in written:
                raise _Wrong(o, f"kernel {k.name} writes {o!r} a second time")
            written[o] = local[o]
        seen.update(local)
    for o in graph.outputs:
        if o not in written:
            raise _Wrong(o, "no kernel writes this output")
    return {**seen, **written}


def _node(
    graph: ir.Graph, k: Kernel, name: str, local, written, frag: Fragment, trial: Trial
) -> Value:
    n = graph.producer.get(name)
    if n is None:
        raise _Wrong(name, f"kernel {k.name} runs {name!r}, which the plan's graph lacks")
    args = [_read(graph, k, t, local, written, trial) for t in n.inputs]
    try:
        return (
            trial.variable(name, n.shape)
            if name in frag.outside
            else evaluate(n, args, graph, trial)
        )
    except (ValueError, IndexError, KeyError, TypeError) as e:
        raise _Wrong(name, f"kernel {k.name} cannot compute it ({e})") from None


def _run_merged(
    graph: ir.Graph, k: Kernel, frag: Fragment, written, trial: Trial
) -> dict[str, Value]:
    """A merged matmul as its roles say: activation @ concat(weights), split
    by the recorded columns, each segment's epilogue on its own columns."""
    roles = k.merged
    claimed = {n for g in roles.segments for n in (g.anchor, *g.epilogue)}
    stray = next((n for n in k.nodes if n not in claimed and n not in roles.prologue), None)
    if stray is not None:
        raise _Wrong(stray, f"kernel {k.name} runs {stray!r} in none of its segments")
    for g in roles.segments:  # the roles describe the plan's own matmuls
        n = graph.producer.get(g.anchor)
        if n is None or n.op is not ir.Op.MATMUL or n.inputs != (roles.activation, g.weight):
            raise _Wrong(
                g.anchor,
                f"kernel {k.name}: segment {g.anchor!r} is not "
                f"{roles.activation} @ {g.weight} in the plan's graph",
            )
    before: dict[str, Value] = {}  # the activation's own nodes (a norm), as the kernel's
    for name in roles.prologue:
        before[name] = _node(graph, k, name, before, written, frag, trial)
    x = _read(graph, k, roles.activation, before, written, trial)
    weights = [_read(graph, k, g.weight, {}, written, trial) for g in roles.segments]
    f = trial.field
    try:
        y = tuple(
            F.matmul(x[i], np.concatenate([w[i] for w in weights], axis=-1), m)
            for i, m in ((0, f.p), (1, f.q))
        )
    except ValueError as e:
        raise _Wrong(
            roles.anchor, f"kernel {k.name} cannot multiply its merged weights ({e})"
        ) from None
    local: dict[str, Value] = dict(before)
    for g in roles.segments:
        mine: dict[str, Value] = {
            g.anchor: (y[0][..., g.start : g.stop], y[1][..., g.start : g.stop])
        }
        for name in g.epilogue:
            n = graph.producer.get(name)
            other = next(
                (t for t in (n.inputs if n else ()) if t in claimed and t not in mine), None
            )
            if other is not None:
                raise _Wrong(
                    name,
                    f"kernel {k.name} computes {name!r} in the segment of "
                    f"{g.anchor!r} from {other!r}, another segment's",
                )
            mine[name] = _node(graph, k, name, mine, written, frag, trial)
        local.update(mine)
    return local


def _run_low_rank(
    graph: ir.Graph, k: Kernel, frag: Fragment, written, trial: Trial
) -> dict[str, Value]:
    """A low-rank branch as its roles say: [x | alpha (x @ A)[:, :rank]] @
    [W ; B[:rank]], P's adds on it, P as the join, then the join's readers."""
    roles = k.low_rank
    branch = {roles.down, roles.up, *roles.scaling}
    stray = next((n for n in k.nodes if n not in {roles.anchor, *branch, *roles.epilogue}), None)
    if stray is not None:
        raise _Wrong(stray, f"kernel {k.name} runs {stray!r} in none of its roles")
    mm = graph.producer.get(roles.anchor)
    if mm is None or mm.op is not ir.Op.MATMUL or mm.inputs[0] != roles.x:
        raise _Wrong(
            roles.anchor,
            f"kernel {k.name}: {roles.anchor!r} is not {roles.x} @ W in the plan's graph",
        )
    down = graph.producer.get(roles.down)
    if roles.down and (down is None or down.op is not ir.Op.MATMUL or down.inputs[0] != roles.x):
        raise _Wrong(
            roles.down, f"kernel {k.name}: {roles.down!r} is not {roles.x} @ A in the plan's graph"
        )
    join = graph.producer.get(roles.join)
    if join is None or join.op is not ir.Op.ADD or roles.main not in join.inputs:
        raise _Wrong(
            roles.join,
            f"kernel {k.name}: {roles.join!r} does not add the low-rank "
            f"branch to {roles.main!r} in the plan's graph",
        )
    f = trial.field
    x = _read(graph, k, roles.x, {}, written, trial)
    w = _read(graph, k, mm.inputs[1], {}, written, trial)
    # B applied to (x @ A), or to x itself where the roles name no A
    t = (
        x
        if not roles.down
        else tuple(
            F.matmul(
                x[i],
                _read(graph, k, _weight(graph, k, roles.down), {}, written, trial)[i][
                    ..., : roles.rank
                ],
                m,
            )
            for i, m in ((0, f.p), (1, f.q))
        )
    )
    b = _read(graph, k, _weight(graph, k, roles.up), {}, written, trial)
    alpha = [1, 1]
    for name in roles.scaling:
        n = graph.producer.get(name)
        c = next((i for i in (n.inputs if n else ()) if i in graph.constants), None)
        if c is None or n.op not in (ir.Op.MUL, ir.Op.DIV):
            raise _Wrong(name, f"kernel {k.name}: {name!r} is not a scale by a constant")
        v = trial.constant(c, graph.constants[c])
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
        raise _Wrong(
            roles.anchor, f"kernel {k.name} cannot multiply its concatenated operands ({e})"
        ) from None
    local: dict[str, Value] = {roles.anchor: y}
    for name in roles.epilogue:
        if name == roles.join:
            local[name] = local[roles.main]
        else:
            n = graph.producer.get(name)
            other = next((i for i in (n.inputs if n else ()) if i in branch), None)
            if other is not None:
                raise _Wrong(
                    name, f"kernel {k.name} reads the branch's {other!r}, which it never forms"
                )
            local[name] = _node(graph, k, name, local, written, frag, trial)
    return local


def _weight(graph: ir.Graph, k: Kernel, node: str) -> str:
    n = graph.producer.get(node)
    if n is None or n.op is not ir.Op.MATMUL:
        raise _Wrong(node, f"kernel {k.name}: {node!r} is not a matmul in the plan's graph")
    return n.inputs[1]


def _read(graph: ir.Graph, k: Kernel, t: str, local, written, trial: Trial) -> Value:
    if t in local:
        return local[t]
    c = graph.constants.get(t)
    if c is not None and (t in k.inputs or c.size == 1):
        return trial.constant(t, c)
    if t not in k.inputs:
        raise _Wrong(t, f"kernel {k.name} reads {t!r}, which it neither computes nor declares")
    if t not in written:
        raise _Wrong(t, f"kernel {k.name} reads {t!r} before any kernel writes it")
    return written[t]


def _compare(
    original, plan_graph, kernels, fo: Fragment, fp: Fragment, compared, trial: Trial, index: int
) -> Mismatch | None:
    want = _run_original(original, fo, trial)
    try:
        got = _run_plan(plan_graph, kernels, fp, trial)
    except _Wrong as e:
        return Mismatch(e.tensor, index, e.detail)
    for t in compared:
        if t not in got:
            return Mismatch(t, index, "the plan never computes it")
        (wp, wq), (gp, gq) = want[t], got[t]
        if wp.shape != gp.shape:
            return Mismatch(t, index, f"shape {gp.shape} in the plan, {wp.shape} in the original")
        same = np.array_equal(wp, gp)
        if same and not (fo.inside[t].exps or fp.inside[t].exps):
            same = np.array_equal(wq, gq)
        if not same:
            bad = int(np.count_nonzero(wp != gp)) or int(np.count_nonzero(wq != gq))
            return Mismatch(t, index, f"{bad} of {wp.size} elements differ (p = {trial.field.p})")
    return None
