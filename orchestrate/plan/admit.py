"""Admitting a kernel to a dynamic plan: legal at every binding of the range.

The planner enumerates and prices candidates on the graph at OPT.  A kernel
it may choose must also be one kernel, with the same launch configuration,
on the graphs at the range's ends.  So fit on chip is checked at MAX, and a
block that must hold a whole dimension (its rule's ``covering``: a
single-pass row's columns) is widened to what MAX needs, then checked to fit
at OPT and at every end: the linear program prices the widened kernel.
``range_admit`` returns that check (``Target.admit``); a refused kernel is
declined with its reason, which ``explain --rejected`` shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from orchestrate import ir
from orchestrate.kernels.spec import VIEW, KernelSpec, LaunchConfig, Rejection, Target
from orchestrate.templates import match_all, template


def range_admit(
    graphs: Mapping[str, ir.Graph], target: Target
) -> Callable[[ir.Graph, KernelSpec], KernelSpec | Rejection]:
    """The check of a kernel ``spec`` matched on a graph (at OPT) against
    each of ``graphs`` (by where it is: ``batch=8, seq=64``)."""
    plain = replace(target, rank=None, admit=None)

    def same(graph: ir.Graph, spec: KernelSpec, pin: LaunchConfig | None) -> KernelSpec | Rejection:
        found = match_all(graph, spec.nodes, replace(plain, pin=pin and (spec.template, pin, True)))
        if isinstance(found, Rejection):
            return found
        return next(
            (s for s in found if s.template == spec.template),
            Rejection(f"no {spec.template} kernel there"),
        )

    def judged(graph: ir.Graph, spec: KernelSpec) -> KernelSpec | Rejection:
        if spec.template == VIEW:
            pin = None
        else:
            pin = replace(spec.config, interpret=())
            for where, other in graphs.items():
                own = same(other, spec, None)
                if isinstance(own, Rejection):
                    return Rejection(f"legal at OPT, not at {where}: {own.reason}")
                pin = _widened(spec.template, pin, own.config)
        for where, other in graphs.items():
            there = same(other, spec, pin)
            if isinstance(there, Rejection):
                return Rejection(f"legal at OPT, not at {where}: {there.reason}")
            looped = getattr(spec.roles, "looped", None)
            if looped is not None and getattr(there.roles, "looped", None) != looped:
                return Rejection(
                    f"rows are {'looped' if looped else 'one pass'} at OPT but not "
                    f"at {where}: the range crosses the single-pass row limit"
                )
        if pin is None or pin == replace(spec.config, interpret=()):
            return spec
        here = same(graph, spec, pin)  # the widened kernel, fitted and hashed at OPT
        if isinstance(here, Rejection):
            return Rejection(f"widened for the range, it does not fit: {here.reason}")
        return here

    # the planner asks again of a kernel it met before (the baselines match
    # sets enumeration did): each answer is kept, with the graph it is of
    answers: dict[tuple[int, KernelSpec], tuple[ir.Graph, KernelSpec | Rejection]] = {}

    def admit(graph: ir.Graph, spec: KernelSpec) -> KernelSpec | Rejection:
        key = (id(graph), spec)
        if key not in answers:
            answers[key] = (graph, judged(graph, spec))
        return answers[key][1]

    return admit


def _widened(name: str, pin: LaunchConfig, own: LaunchConfig) -> LaunchConfig:
    """``pin`` with each covering block at least ``own``'s."""
    mine, theirs = dict(pin.blocks), dict(own.blocks)
    for key in template(name).rule.covering:
        if key in mine and key in theirs and theirs[key] > mine[key]:
            mine[key] = theirs[key]
    return replace(pin, blocks=tuple(mine.items()))
