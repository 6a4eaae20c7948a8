"""The view template: reshapes only, no kernel; the output aliases the input."""

from __future__ import annotations

from orchestrate.cost.devices import Device
from orchestrate.ir import Graph, Op
from orchestrate.kernels.region import Region
from orchestrate.kernels.rule import Rule
from orchestrate.kernels.spec import (
    VIEW,
    Elementwise,
    KernelSpec,
    LaunchConfig,
    Rejection,
    Target,
    with_hash,
)
from orchestrate.templates.base import Template


def _is_view(graph: Graph, r: Region) -> bool:
    return all(n.op is Op.RESHAPE for n in r.nodes) and len(r.sinks) == 1 and not r.exposed


def view(graph: Graph, r: Region, target: Target) -> KernelSpec | Rejection:
    space = graph.types[r.sinks[0]].shape
    spec = KernelSpec(VIEW, r.names, r.inputs, r.sinks, (), space, Elementwise(), LaunchConfig())
    return with_hash(graph, spec)


def _free(graph: Graph, spec: KernelSpec, device: Device) -> tuple:
    return 0, 0, 0.0, 0.0, 0.0


def _none(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    return 0, 0


RULE = Rule(VIEW, "reshapes only: no kernel, the output aliases the input", _is_view, view)
TEMPLATE = Template(RULE, None, flops=_none, terms=_free)
