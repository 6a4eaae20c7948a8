"""A plan for a range of shapes: one bundle, every binding of its dimensions.

``--shape input_ids=1..8x2..64@32`` (or ``--dim batch=1..8``) makes the
input's dimensions symbols with ranges (``shapes/binding.py``).  Then:

1. the graph at OPT is planned as any static graph, except that every
   candidate must also be legal at MIN and MAX with its configuration
   (``plan/admit.py``), so the linear program prices at OPT and fit is
   checked at MAX;
2. the primitive graph is made once more with the dimensions as symbols
   (``trace``): the frontend prepares the model at the hint binding
   (``shapes/hints.py``), symbolic shape inference gives the folded
   tensors their formulas (``shapes/formulas.py``), and fission carries
   them as SymInts (``shapes/symint.py``) into every shape and attribute;
   its formulas are the family (``shapes/family.py``), checked against the
   graphs the frontend makes at MIN, OPT and MAX;
3. the plan's kernels are printed once from that graph: each dimension is
   its formula over code names (``dim0 * dim1``), a runtime argument of the
   kernels that use it (``emit/source.py``); printing it again at a second
   hint must give the same text, so no kernel depends on the binding.

``regenerate_ranged`` does 3 again from a bundle's files (a bundle is data:
what runs is what orchestrate prints from them); ``DynamicProgram`` runs it
at any binding in the range (``run/ranged.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx

from orchestrate import frontend, ir
from orchestrate.bundle import regenerate
from orchestrate.decompose import fission
from orchestrate.emit import emit
from orchestrate.errors import InputError, OrchestrateError
from orchestrate.frontend import graph_inputs
from orchestrate.ir import precision
from orchestrate.plan import Plan, Planned, pipeline
from orchestrate.plan.admit import range_admit
from orchestrate.shapes.binding import Ranges, bind_inputs
from orchestrate.shapes.family import (
    Binding,
    Dim,
    Family,
    check_instance,
    family_of,
    named,
    same_array,
)
from orchestrate.shapes.formulas import Formulas
from orchestrate.shapes.hints import hint_binding
from orchestrate.shapes.infer import infer_shapes
from orchestrate.shapes.poly import Poly
from orchestrate.shapes.symint import Symbols, Undecided, strict
from orchestrate.templates import template


@dataclass(frozen=True)
class Symbolic:
    """The model's inputs bound to the declared ranges: each input's shape
    as affine dimensions and the dynamic dimensions in binding order."""

    inputs: Mapping[str, tuple[Poly, ...]]
    dims: tuple[Dim, ...]

    def shapes_at(self, binding: Binding) -> dict[str, tuple[int, ...]]:
        values = {d.name: v for d, v in zip(self.dims, binding)}
        return {k: tuple(a.evaluate(values) for a in v) for k, v in self.inputs.items()}

    def symbols(self, hint: Binding) -> Symbols:
        return Symbols(
            tuple(d.name for d in self.dims),
            {d.name: d.range for d in self.dims},
            {d.name: v for d, v in zip(self.dims, hint)},
        )


def bind(model: onnx.ModelProto, ranges: Ranges, source: str) -> Symbolic:
    """The model's inputs bound to ``ranges``; InputError naming the flag
    when they do not fit the model.  With every range a point (MIN = MAX)
    no dimension is left dynamic: ``dims`` is empty (``point_shapes``)."""
    inputs, found = bind_inputs(
        graph_inputs(model), ranges.shapes, ranges.dims, source, ranges.flags
    )
    order: list[str] = []
    for shape in inputs.values():
        for a in shape:
            order += [s for s in sorted(a.symbols) if s not in order]
    dims = tuple(Dim(name, f"dim{i}", found[name]) for i, name in enumerate(order))
    return Symbolic(inputs, dims)


def point_shapes(
    model: onnx.ModelProto, ranges: Ranges, source: str
) -> dict[str, tuple[int, ...]] | None:
    """The input shapes ``ranges`` fix when each is a range of one point
    (``x=2..2x16..16``, ``--dim seq=16``): a static shape, planned, emitted,
    run and verified as one.  None when a dimension is left dynamic."""
    symbolic = bind(model, ranges, source)
    return None if symbolic.dims else symbolic.shapes_at(())


@dataclass(frozen=True)
class Built:
    """A dynamic plan: ``plan`` at OPT (configurations pinned for the range),
    the ``family``, the graph and specs at OPT, the ``source`` printed with
    the dimensions as symbols and the ``constants`` a bundle stores (sliced
    ones at MAX)."""

    plan: Plan
    family: Family
    graph: ir.Graph
    planned: Planned
    source: str
    constants: dict[str, np.ndarray]


class _Graphs:
    """The primitive graph at a binding, made once; constants equal to the
    first graph's share its arrays (a model's weights are held once)."""

    def __init__(self, model, symbolic: Symbolic, dtype: str | None, source: str):
        self.model, self.symbolic, self.dtype, self.source = model, symbolic, dtype, source
        self.made: dict[Binding, ir.Graph] = {}
        self.first: ir.Graph | None = None

    def __call__(self, binding: Binding) -> ir.Graph:
        if binding not in self.made:
            g = pipeline.fission_model(self.model, self.symbolic.shapes_at(binding), self.source)
            self.made[binding] = self.like_first(
                precision.lower_precision(g, self.dtype, self.source)
            )
        return self.made[binding]

    def like_first(self, g: ir.Graph) -> ir.Graph:
        if self.first is None:
            self.first = g
            return g
        g = _named_like(g, self.first)
        ref = self.first.constants
        shared = {
            k: ref[k] if k in ref and same_array(ref[k], v) else v for k, v in g.constants.items()
        }
        return replace(g, constants=shared)


def _named_like(g: ir.Graph, ref: ir.Graph) -> ir.Graph:
    """``g`` with each constant input named as the constant ``ref`` reads in
    the same place.  The frontend names a constant after where it was
    folded, and a small one (a 2 x 2 causal mask at seq=2) is shared by every
    place that folds to the same value: the names can differ between
    bindings, the places cannot (``check_instance`` checks the values)."""
    nodes = {n.name: n for n in ref.nodes}
    consts = dict(g.constants)
    renamed: dict[str, str] = {}
    new_nodes = []
    for n in g.nodes:
        other = nodes.get(n.name)
        inputs = list(n.inputs)
        if other is not None and len(other.inputs) == len(inputs):
            for k, (mine, theirs) in enumerate(zip(n.inputs, other.inputs)):
                if (
                    mine != theirs
                    and mine in g.constants
                    and theirs in ref.constants
                    and (
                        theirs not in g.constants
                        or theirs in consts
                        and consts[theirs] is g.constants[mine]
                    )
                ):
                    consts[theirs] = g.constants[mine]
                    renamed.setdefault(mine, theirs)
                    inputs[k] = theirs
        new_nodes.append(replace(n, inputs=tuple(inputs)) if tuple(inputs) != n.inputs else n)
    if not renamed:
        return g
    used = {i for n in new_nodes for i in n.inputs}
    consts = {k: v for k, v in consts.items() if k in used or k in ref.constants}

    def moved(symbolic: Mapping[str, tuple]) -> dict[str, tuple]:
        out = {renamed.get(k, k): v for k, v in symbolic.items()}
        return {k: v for k, v in out.items() if k in consts}

    return ir.Graph(
        tuple(new_nodes),
        g.inputs,
        g.outputs,
        consts,
        g.name,
        moved(g.constant_shapes),
        moved(g.constant_values),
    )


def trace(
    model: onnx.ModelProto,
    ranges: Ranges,
    symbolic: Symbolic,
    hint: Binding,
    dtype: str | None,
    source: str,
) -> ir.Graph:
    """The primitive graph with the dimensions as symbols (SymInts valued at
    ``hint``): the frontend at ``hint``, the formulas of its folded tensors
    from symbolic shape inference, fission carrying both."""
    symbols = symbolic.symbols(hint)
    inferred = infer_shapes(model, ranges.shapes, ranges.dims, source)
    formulas = Formulas(symbols, inferred.values, source)
    prepared = frontend.prepare(model, symbolic.shapes_at(hint), source)
    try:
        g = fission(prepared, source, consume=True, symbols=formulas)
    except OrchestrateError as e:
        declined = "; ".join(str(d) for d in inferred.declined[:2])
        why = f" (symbolic shape inference declined {declined})" if declined else ""
        raise InputError(
            f"{source}: the model's shapes cannot be followed as formulas of "
            f"{', '.join(d.shown for d in symbolic.dims)}{why}: {e}; narrow the range "
            "with --shape or --dim"
        ) from None
    return precision.lower_precision(g, dtype, source)


def build(
    model: onnx.ModelProto, ranges: Ranges, options, model_file: str, source: str, progress=None
) -> Built:
    """Plan ``model`` for ``ranges`` (see the module doc)."""
    report = progress or (lambda stage, i, n: None)
    symbolic = bind(model, ranges, source)
    dims = symbolic.dims
    assert dims, "a range of one point is a static shape: plan it as one (point_shapes)"
    graphs = _Graphs(model, symbolic, options.dtype, source)
    at = {w: tuple(getattr(d.range, w) for d in dims) for w in ("opt", "min", "max")}
    g_opt = graphs(at["opt"])
    ends = {named(dims, at[w]): graphs(at[w]) for w in ("max", "min") if at[w] != at["opt"]}
    admit = range_admit(ends, options.target()) if ends else None
    planned = pipeline.plan_graph(g_opt, options, progress=progress, admit=admit)
    report("range", 1, 2)
    hint = range_hint(dims, g_opt)
    traced = graphs.like_first(trace(model, ranges, symbolic, hint, options.dtype, source))
    family = family_of(dims, traced, source)
    checks = {at[w]: graphs(at[w]) for w in ("min", "opt", "max")}
    top = checks[at["max"]]
    for b, g in checks.items():
        check_instance(family, traced, g, b, top, source)
    report("range", 2, 2)
    plan = _pinned(planned.plan, family, top, at["max"], source)
    constants = _stored(plan, g_opt, top, family)
    made = regenerate_ranged(
        plan, family, constants, model_file, source, at_opt=g_opt, check_hints=True
    )
    return Built(made.planned.plan, family, made.graph, made.planned, made.source, constants)


def range_hint(dims, graph: ir.Graph, taken: Binding = ()) -> Binding:
    """The hint binding of ``dims`` (``shapes/hints.py``), unlike every
    dimension of ``graph`` (a plan's graph at OPT) and every value of ``taken``."""
    avoid = {d for n in graph.nodes for d in n.shape} | {
        d for i in graph.inputs for d in i.type.shape
    }
    return hint_binding((d.range for d in dims), avoid | set(taken))


def _pinned(plan: Plan, family: Family, g_max: ir.Graph, top: Binding, source: str) -> Plan:
    """``plan`` with each kernel's interpreter blocks those of MAX, so that
    the recorded configuration serves the whole range there too; and one
    software-pipeline stage for a kernel whose loop takes one step at MAX.

    At every binding such a loop takes at most one step, so more stages
    buy nothing, but the range kernel's loop bound is a runtime value and
    Triton pipelines it anyway, allocating every stage's buffers, where
    the fit model sees one step.  (Attention whose keys fit one block at
    MAX prints no loop at all: ``templates/attention/emit.py``.)"""
    bare = replace(
        plan,
        kernels=tuple(replace(k, config=replace(k.config, interpret=())) for k in plan.kernels),
    )
    at_max = regenerate.planned(
        family.plan_at(bare, top), g_max, source, check_hash=False, own_interpret=True
    )
    kernels = []
    for k, s in zip(plan.kernels, at_max.specs):
        if not k.is_view:
            one_step = template(s.template).steps(g_max, s)[0] == 1
            config = replace(s.config, num_stages=1) if one_step else s.config
            k = replace(k, config=config)
        kernels.append(k)
    return replace(plan, kernels=tuple(kernels))


def _stored(plan: Plan, g_opt: ir.Graph, g_max: ir.Graph, family: Family) -> dict[str, np.ndarray]:
    """The constants the kernels read, the sliced ones at MAX."""
    used = {t for k in plan.kernels for t in k.inputs}
    return {
        k: (g_max if k in family.sliced else g_opt).constants[k]
        for k in g_opt.constants
        if k in used
    }


@dataclass(frozen=True)
class Instance:
    """A dynamic plan at one binding: the primitive graph, the plan with its
    specs, as a static plan has them."""

    graph: ir.Graph
    planned: Planned


def instance(
    plan: Plan,
    family: Family,
    constants: Mapping[str, np.ndarray],
    binding: Binding,
    source: str,
    graph: ir.Graph | None = None,
) -> Instance:
    """The plan at ``binding`` (its graph rebuilt from the plan and the
    constants, and type-checked, unless ``graph`` is given)."""
    at = family.plan_at(plan, binding)
    if graph is None:
        graph = regenerate.primitive_graph(at, family.constants_at(constants, binding), source)
    try:
        return Instance(graph, regenerate.planned(at, graph, source, check_hash=False))
    except InputError as e:
        raise InputError(f"{e} (at {family.named(binding)})") from None


def regenerate_ranged(
    plan: Plan,
    family: Family,
    constants: Mapping[str, np.ndarray],
    model_file: str,
    source: str,
    at_opt: ir.Graph | None = None,
    check_hints: bool = False,
) -> regenerate.Regenerated:
    """The graph and specs at OPT and the ``kernels.py`` printed with the
    dimensions as symbols (see the module doc).  ``check_hints``: print it
    at a second hint too and refuse the range if the two differ."""
    title = regenerate.title(model_file)
    opt = family.at("opt")
    here = instance(plan, family, constants, opt, source, at_opt)
    # the rules take the plan's kernels at the range's ends too
    instance(plan, family, constants, family.at("max"), source)
    instance(plan, family, constants, family.at("min"), source)
    hint = range_hint(family.dims, here.graph)
    printed = _printed(plan, family, constants, hint, title, source)
    if check_hints:
        other = range_hint(family.dims, here.graph, taken=hint)
        again = _printed(plan, family, constants, other, title, source)
        if again != printed:
            where = _first_difference(printed, again)
            raise InputError(
                f"{source}: {where} cannot serve the range: it prints differently at "
                f"{family.named(hint)} and {family.named(other)}; narrow the range with "
                "--shape or --dim"
            )
    return regenerate.Regenerated(here.graph, here.planned, printed)


def _printed(
    plan: Plan,
    family: Family,
    constants: Mapping[str, np.ndarray],
    hint: Binding,
    title: str,
    source: str,
) -> str:
    """``kernels.py`` printed from the plan's graph with its dimensions as
    SymInts valued at ``hint``; InputError where a kernel needs to know more
    of a dimension than its range says."""
    at = instance(plan, family, constants, hint, source)
    graph = family.symbolic(at.planned.plan, at.graph, hint)
    planned = regenerate.planned(at.planned.plan, graph, source, check_hash=False)
    try:
        with strict():
            return emit(graph, planned, title=title, dims=family.dims)
    except Undecided as e:
        raise InputError(
            f"{source}: the kernels cannot serve the range of "
            f"{', '.join(d.shown for d in family.dims)}: {e}; narrow the range with "
            "--shape or --dim"
        ) from None


def _first_difference(a: str, b: str) -> str:
    """The generated function in which ``a`` and ``b`` first differ."""
    function = "the kernels"
    for x, y in zip(a.splitlines(), b.splitlines()):
        if x.startswith("def "):
            function = f"kernel function {x[4:].split('(')[0]}"
        if x != y:
            return function
    return function
