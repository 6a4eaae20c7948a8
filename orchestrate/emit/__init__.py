"""Triton emission: one jitted function per distinct spec, one launch per planned kernel.

``emit(graph, planned)`` returns the source of ``kernels.py``.  It prints the
plan's kernel specs and never refuses one: what the rules accepted, a
generator can print (a set no generator can print is refused by its rule).
Each spec is printed by its template's generator (``orchestrate/templates/``).
It depends on the primitive IR, the specs, the plain plan and the templates,
never on the planner, the cost model or the linear program.

Planned kernels whose specs have the same structural hash and write the same
outputs (a transformer's layers) share one ``@triton.jit`` function; the
module's ``KERNELS`` table binds each planned kernel to it with its own
tensors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

# the registry as a module, not its names: a template's generator imports
# this package's modules while the registry is still being built
from orchestrate import templates
from orchestrate.emit.source import KernelSource, Launch, module, pointers
from orchestrate.ir import Graph
from orchestrate.kernels.spec import VIEW, KernelSpec
from orchestrate.plan import Planned


def function_key(spec_hash: str, nodes: Sequence[str], writes: Sequence[str]) -> str:
    """Equal for planned kernels one jitted function serves: the same spec
    (structural hash) writing the same of its nodes."""
    local = {n: i for i, n in enumerate(nodes)}
    which = ",".join(str(local[t]) for t in writes)
    return hashlib.sha1(f"{spec_hash}|{which}".encode()).hexdigest()[:16]


def kernel_source(graph: Graph, spec: KernelSpec, writes: Sequence[str], name: str) -> KernelSource:
    """The generated function (or library launcher) for one spec writing
    ``writes``, printed by its template's generator.  A dimension of a
    range is a SymInt in ``graph`` (``orchestrate.shapes.symint``): it prints
    as its formula, and what a generator decides of it the range decides."""
    generate = templates.template(spec.template).generate
    assert generate is not None, f"a {spec.template} kernel launches nothing"
    return generate(graph, spec, tuple(writes), name)


def emit(graph: Graph, planned: Planned, title: str = "", dims: Sequence = ()) -> str:
    """``kernels.py`` for ``planned`` at ``graph``'s shapes; ``dims``: a
    range's dimensions (``shapes.family.Dim``), whose code names every
    launcher takes as keywords, when ``graph``'s shapes are their formulas."""
    plan = planned.plan
    functions: dict[str, KernelSource] = {}
    counts: dict[str, int] = {}
    launches = []
    for entry, spec in zip(plan.kernels, planned.specs):
        if spec.template == VIEW:
            continue
        key = function_key(spec.hash, spec.nodes, entry.outputs)
        if key not in functions:
            counts[spec.template] = counts.get(spec.template, 0) + 1
            name = f"{spec.template}_{counts[spec.template]}"
            functions[key] = kernel_source(graph, spec, entry.outputs, name)
        f = functions[key]
        slots = {v: k for k, v in pointers(graph, spec, entry.outputs).slots.items()}
        launches.append(Launch(entry.name, f.name, tuple(slots[p] for p in f.params)))
    calls = sum(1 for f in functions.values() if getattr(f, "calls_torch", False))
    n, k = len(functions) - calls, len(launches)
    title = (
        title or f"Triton kernels for {plan.graph.name} ({k} kernels, planned for {plan.device})"
    )
    library_calls = f" and {calls} library launcher{'s' if calls != 1 else ''}" if calls else ""
    count = (
        f"{n} jitted function{'s' if n != 1 else ''}{library_calls} for {k} planned "
        f"kernel{'s' if k != 1 else ''}."
    )
    return module(list(functions.values()), launches, [title, "", count], dims)
