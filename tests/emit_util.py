"""Helpers for the code generation tests: hand-made plans, run in the interpreter."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from orchestrate import ir, reference
from orchestrate.emit import emit
from orchestrate.ilp.checker import check_plan
from orchestrate.kernels.templates import Rejection, classify
from orchestrate.runtime import Program, load_kernels


def plan_from_sets(graph: ir.Graph, sets: Sequence[Sequence[str]], writes_all: bool = True) -> dict:
    """A minimal plan whose kernels are exactly ``sets`` (in order); every
    value read outside its kernel is written.  Checked with the plan checker."""
    kernels = []
    for i, names in enumerate(sets):
        k = classify(graph, names)
        if isinstance(k, Rejection):
            raise AssertionError(f"set {i} is not a legal kernel: {k.reason}")
        inside = set(k.nodes)
        exposed = [
            n for n in k.nodes if n not in k.outputs and (
                n in graph.outputs or any(c.name not in inside for c in graph.consumers.get(n, ()))
            )
        ]  # fmt: skip
        kernels.append({
            "name": f"k{i:03d}_{k.template}", "template": k.template,
            "primitives": list(k.nodes), "inputs": list(k.inputs),
            "outputs": list(k.outputs) + (exposed if writes_all else []),
        })  # fmt: skip
    check_plan(graph, kernels)
    return {
        "format": "orchestrate-plan/1", "device": "h100",
        "graph": {
            "name": graph.name, "inputs": [i.name for i in graph.inputs],
            "input_types": [{"name": i.name, "shape": list(i.type.shape), "dtype": i.type.dtype}
                            for i in graph.inputs],
            "outputs": list(graph.outputs), "constants": sorted(graph.constants),
        },
        "kernels": kernels,
        "primitives": [
            {"name": n.name, "op": n.op.value, "inputs": list(n.inputs), "shape": list(n.shape),
             "dtype": n.dtype, "origin": n.origin}
            for n in graph.nodes
        ],
    }  # fmt: skip


def one_kernel(graph: ir.Graph) -> dict:
    """A plan running the whole graph as one kernel."""
    return plan_from_sets(graph, [[n.name for n in graph.nodes]])


def run_plan(graph: ir.Graph, plan: dict, inputs: dict[str, np.ndarray]) -> tuple[dict, str]:
    """Emit, import under the interpreter and run ``plan``; (outputs, source)."""
    src = emit(graph, plan)
    folder = Path(tempfile.mkdtemp(prefix="orchestrate-emit-"))
    (folder / "kernels.py").write_text(src)
    program = Program(plan, load_kernels(folder / "kernels.py", interpret=True), graph.constants,
                      interpret=True)  # fmt: skip
    return program.run(inputs), src


def assert_matches_reference(graph: ir.Graph, plan: dict, inputs: dict[str, np.ndarray],
                             rtol: float = 1e-5, atol: float = 1e-6) -> str:  # fmt: skip
    """Run ``plan`` and compare every output with the float64 reference."""
    got, src = run_plan(graph, plan, inputs)
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
