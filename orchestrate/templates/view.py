"""The view template: reshapes only, no kernel; the output aliases the input."""

from __future__ import annotations

from orchestrate.cost.devices import Device
from orchestrate.ir import Graph
from orchestrate.kernels.pointwise import VIEW_RULE
from orchestrate.kernels.spec import KernelSpec
from orchestrate.templates.base import Template


def _free(graph: Graph, spec: KernelSpec, device: Device) -> tuple:
    return 0, 0, 0.0, 0.0, 0.0


def _none(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    return 0, 0


TEMPLATE = Template(VIEW_RULE, None, flops=_none, terms=_free)
