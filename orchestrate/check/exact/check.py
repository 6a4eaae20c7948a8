"""Does the plan compute the function of the original?  Mirage's fingerprint.

"The original" is the primitive graph fission makes of the ONNX model;
"the plan" is the composition of its kernels: each kernel evaluates its own
nodes, in order, from what it declares it reads (graph inputs, constants,
tensors earlier kernels wrote; scalar constants, which the source inlines),
and only what it writes is visible after it.  A kernel wired to the wrong
tensor, work dropped or done twice, or a rewrite that changes the function
gives a different value somewhere in the fragment (``fragment.py``).

A kernel whose code computes something other than its primitives one by one
(a rewrite: merged sibling matmuls, a low-rank branch folded into its
matmul) is evaluated as its template says it computes (the template's
``exact``: ``templates/merged_matmul/exact.py``, ``templates/low_rank/exact.py``),
through :class:`KernelRun`, never from the primitives it replaces; a wrong
split of merged weights or a dropped low-rank term is then a wrong value.

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

# the registry as a module, not its names: a template's exact evaluation
# imports this package while the registry is still being built
from orchestrate import ir, templates
from orchestrate.check.exact import field as F
from orchestrate.check.exact.evaluate import Trial, Value, evaluate
from orchestrate.check.exact.fragment import Fragment, analyse

TARGET = 1e-9
MAX_TRIALS = 50


@dataclass(frozen=True)
class Kernel:
    """What the check needs of a planned kernel."""

    name: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    template: str = ""  # its template (whose ``exact`` may say what it computes)
    roles: object = None  # its spec's roles, where the plan's specs are known


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


class Wrong(Exception):
    """The plan's kernel does not compute ``tensor`` as it claims; ``detail`` says how."""

    def __init__(self, tensor: str, detail: str):
        super().__init__(detail)
        self.tensor, self.detail = tensor, detail


@dataclass
class KernelRun:
    """One planned kernel being evaluated, as a template's ``exact`` sees it:
    ``node`` evaluates one of the plan's primitives from the values at hand,
    ``read`` a tensor the kernel reads, ``wrong`` refuses (raises
    :class:`Wrong`); ``field`` and ``trial`` are the trial's arithmetic."""

    graph: ir.Graph
    kernel: Kernel
    frag: Fragment
    written: dict[str, Value]
    trial: Trial

    @property
    def field(self) -> F.Field:
        return self.trial.field

    def node(self, name: str, local: dict[str, Value]) -> Value:
        return _node(self.graph, self.kernel, name, local, self.written, self.frag, self.trial)

    def read(self, tensor: str, local: dict[str, Value] | None = None) -> Value:
        return _read(self.graph, self.kernel, tensor, local or {}, self.written, self.trial)

    def wrong(self, tensor: str, detail: str):
        raise Wrong(tensor, f"kernel {self.kernel.name}: {detail}")


def kernels_of(plan, graph: ir.Graph, specs=()) -> tuple[Kernel, ...]:
    """The kernels of an ``orchestrate.plan.Plan`` (nodes in graph order),
    with their roles from their ``specs`` (the plan's, in order), which a
    rewriting template's ``exact`` reads."""
    pos = graph.position
    roles = [s.roles for s in specs] or [None] * len(plan.kernels)
    return tuple(
        Kernel(
            k.name,
            tuple(sorted(k.primitives, key=lambda n: pos.get(n, -1))),
            tuple(k.inputs),
            tuple(k.outputs),
            k.template,
            r,
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
        rewrite = _rewrite(k)
        if rewrite is not None:  # the template says what its kernel computes
            local = rewrite(KernelRun(graph, k, frag, written, trial))
        for name in k.nodes if rewrite is None else ():
            local[name] = _node(graph, k, name, local, written, frag, trial)
        for o in k.outputs:
            if o not in local:
                raise Wrong(o, f"kernel {k.name} writes {o!r} but does not compute it")
            if o in written:
                raise Wrong(o, f"kernel {k.name} writes {o!r} a second time")
            written[o] = local[o]
        seen.update(local)
    for o in graph.outputs:
        if o not in written:
            raise Wrong(o, "no kernel writes this output")
    return {**seen, **written}


def _node(
    graph: ir.Graph, k: Kernel, name: str, local, written, frag: Fragment, trial: Trial
) -> Value:
    n = graph.producer.get(name)
    if n is None:
        raise Wrong(name, f"kernel {k.name} runs {name!r}, which the plan's graph lacks")
    args = [_read(graph, k, t, local, written, trial) for t in n.inputs]
    try:
        return (
            trial.variable(name, n.shape)
            if name in frag.outside
            else evaluate(n, args, graph, trial)
        )
    except (ValueError, IndexError, KeyError, TypeError) as e:
        raise Wrong(name, f"kernel {k.name} cannot compute it ({e})") from None


def _rewrite(k: Kernel):
    """The template's ``exact`` evaluation of ``k``, where it has one and the
    kernel's roles are known; None: the kernel computes its primitives."""
    if k.roles is None or not k.template:
        return None
    try:
        return templates.template(k.template).exact
    except KeyError:
        return None


def _read(graph: ir.Graph, k: Kernel, t: str, local, written, trial: Trial) -> Value:
    if t in local:
        return local[t]
    c = graph.constants.get(t)
    if c is not None and (t in k.inputs or c.size == 1):
        return trial.constant(t, c)
    if t not in k.inputs:
        raise Wrong(t, f"kernel {k.name} reads {t!r}, which it neither computes nor declares")
    if t not in written:
        raise Wrong(t, f"kernel {k.name} reads {t!r} before any kernel writes it")
    return written[t]


def _compare(
    original, plan_graph, kernels, fo: Fragment, fp: Fragment, compared, trial: Trial, index: int
) -> Mismatch | None:
    want = _run_original(original, fo, trial)
    try:
        got = _run_plan(plan_graph, kernels, fp, trial)
    except Wrong as e:
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
