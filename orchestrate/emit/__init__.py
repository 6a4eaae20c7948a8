"""Triton emission: one generated kernel per planned kernel, in one module.

``emit(graph, plan)`` returns the source of ``kernels.py``.  It depends only
on the primitive IR and the plain plan (template, primitives, outputs), never
on planner internals: the kernel structure is re-derived with the same pure
legality function the planner used.
"""

from __future__ import annotations

from orchestrate.emit.pointwise import pointwise
from orchestrate.emit.source import KernelSource, module
from orchestrate.ir import Graph
from orchestrate.kernels.templates import POINTWISE, VIEW, Rejection, classify

GENERATORS = {POINTWISE: pointwise}


def _register() -> None:
    """Fill GENERATORS with every template module that exists."""
    import importlib

    for template in ("row_reduce", "matmul", "conv", "window", "attention"):
        if template in GENERATORS:
            continue
        try:
            module = importlib.import_module(f"orchestrate.emit.{template}")
        except ImportError:
            continue
        GENERATORS[template] = getattr(module, template)


def kernel_source(graph: Graph, entry: dict, *, tf32: bool = False) -> KernelSource:
    """The generated kernel for one plan entry (``tf32``: the plan's --tf32)."""
    _register()
    k = classify(graph, entry["primitives"])
    if isinstance(k, Rejection):
        raise AssertionError(f"{entry['name']}: planned kernel is not legal: {k.reason}")
    gen = GENERATORS.get(k.template)
    if gen is None:
        raise NotImplementedError(f"no Triton generator for the {k.template} template yet")
    if tf32 and k.template in ("matmul", "conv"):
        return gen(graph, k, tuple(entry["outputs"]), entry["name"], tf32=True)
    return gen(graph, k, tuple(entry["outputs"]), entry["name"])


def emit(graph: Graph, plan: dict, title: str = "") -> str:
    tf32 = bool(plan.get("options", {}).get("tf32"))
    kernels = [kernel_source(graph, e, tf32=tf32) for e in plan["kernels"] if e["template"] != VIEW]
    head = (
        title
        or f"Triton kernels for {plan['graph']['name']} ({len(kernels)} kernels, "
        f"planned for {plan['device']})"
    )
    return module(kernels, head)
