"""Helpers for the code generation tests: hand-made plans, run in the interpreter."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orchestrate import ir
from orchestrate.cost.devices import get_device
from orchestrate.emit import emit, kernel_source
from orchestrate.ir import reference
from orchestrate.kernels.spec import KernelSpec, Target
from orchestrate.plan import Planned
from orchestrate.plan.planner import PlanOptions, plan_sets
from orchestrate.run.runtime import Program, load_kernels
from orchestrate.templates import match
from orchestrate.templates.attention import rule as attention


def plan_from_sets(
    graph: ir.Graph,
    sets: Sequence[Sequence[str]],
    writes_all: bool = True,
    options: PlanOptions | None = None,
) -> Planned:
    """A plan whose kernels are exactly ``sets`` (in order); every value read
    outside its kernel is written.  Checked with the plan checker."""
    return plan_sets(graph, sets, options or PlanOptions(), writes_all)


def one_kernel(graph: ir.Graph, options: PlanOptions | None = None) -> Planned:
    """A plan running the whole graph as one kernel."""
    return plan_from_sets(graph, [[n.name for n in graph.nodes]], options=options)


def run_plan(graph: ir.Graph, planned: Planned, inputs: dict[str, np.ndarray]) -> tuple[dict, str]:
    """Emit, import under the interpreter and run ``planned``; (outputs, source)."""
    src = emit(graph, planned)
    program = Program(planned, graph, load_kernels(src, interpret=True), interpret=True)
    return program.run(inputs), src


def assert_matches_reference(
    graph: ir.Graph,
    planned: Planned,
    inputs: dict[str, np.ndarray],
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> str:
    """Run ``planned`` and compare every output with the float64 reference."""
    got, src = run_plan(graph, planned, inputs)
    want = reference.run(graph, inputs, float64=True)
    for name in graph.outputs:
        g, w = got[name], want[name]
        assert g.shape == w.shape, f"{name}: shape {g.shape} != {w.shape}"
        assert g.dtype.name == graph.types[name].dtype, f"{name}: dtype {g.dtype}"
        if g.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w.astype(g.dtype), err_msg=name)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w, rtol=rtol, atol=atol, err_msg=name)
    return src


def target(device: str = "h100", tf32: bool = False) -> Target:
    return Target(get_device(device), tf32)


def spec_of(graph: ir.Graph, names, device: str = "h100", tf32: bool = False):
    """The rule table's answer for ``names``: a KernelSpec or a Rejection."""
    return match(graph, names, target(device, tf32))


def attention_specs(graph: ir.Graph, nodes, device: str = "h100") -> list[KernelSpec]:
    """The attention kernels the rule proposes among ``nodes`` and accepts."""
    found = [spec_of(graph, s, device) for s in attention.propose(graph, list(nodes))]
    return [k for k in found if isinstance(k, KernelSpec)]


def one_source(graph: ir.Graph, options: PlanOptions | None = None) -> str:
    """The generated function of the whole graph as one kernel."""
    planned = one_kernel(graph, options)
    return kernel_source(graph, planned.specs[0], planned.plan.kernels[0].outputs, "k").render()
