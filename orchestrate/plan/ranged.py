"""A plan for a range of shapes: one bundle, every binding of its dimensions.

``--shape input_ids=1..8x2..64@32`` (or ``--dim batch=1..8``) makes the
input's dimensions symbols with ranges (``shapes/binding.py``).  Then:

1. the graph at OPT is planned as any static graph, except that every
   candidate must also be legal at MIN and MAX with its configuration
   (``plan/admit.py``), so the linear program prices at OPT and fit is
   checked at MAX;
2. the frontend runs at a grid of generic bindings (``shapes/probes.py``)
   and the family of primitive graphs is lifted from them and checked at
   MIN, OPT and MAX (``shapes/family.py``);
3. the plan's kernels, printed at each grid point with the plan's
   configurations, become one ``kernels.py`` whose kernels take the
   dimensions as runtime arguments (``emit/lift.py``).

``regenerate`` does 3 again from a bundle's files (a bundle is data: what
runs is what orchestrate prints from them); ``DynamicProgram`` runs it at any
binding in the range (``run/ranged.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx

from orchestrate import ir
from orchestrate.bundle import regenerate
from orchestrate.emit import emit
from orchestrate.emit.lift import Unliftable, lift_source
from orchestrate.errors import InputError
from orchestrate.frontend import graph_inputs
from orchestrate.ir import precision
from orchestrate.plan import Plan, Planned, pipeline
from orchestrate.plan.admit import range_admit
from orchestrate.shapes.affine import Affine
from orchestrate.shapes.binding import Ranges, bind_inputs
from orchestrate.shapes.family import Binding, Dim, Family, lift_family, named, same_array
from orchestrate.shapes.poly import Grid
from orchestrate.shapes.probes import grid_values
from orchestrate.templates import template


@dataclass(frozen=True)
class Symbolic:
    """The model's inputs bound to the declared ranges: each input's shape
    as affine dimensions and the dynamic dimensions in binding order."""

    inputs: Mapping[str, tuple[Affine, ...]]
    dims: tuple[Dim, ...]

    def shapes_at(self, binding: Binding) -> dict[str, tuple[int, ...]]:
        values = {d.name: v for d, v in zip(self.dims, binding)}
        return {k: tuple(a.evaluate(values) for a in v) for k, v in self.inputs.items()}


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
    the ``family``, the graph and specs at OPT, the lifted ``source`` and the
    ``constants`` a bundle stores (sliced ones at MAX)."""

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
            g = precision.lower_precision(g, self.dtype, self.source)
            if self.first is None:
                self.first = g
            else:
                g = _named_like(g, self.first)
                ref = self.first.constants
                shared = {
                    k: ref[k] if k in ref and same_array(ref[k], v) else v
                    for k, v in g.constants.items()
                }
                g = ir.Graph(g.nodes, g.inputs, g.outputs, shared, g.name)
            self.made[binding] = g
        return self.made[binding]


def _named_like(g: ir.Graph, ref: ir.Graph) -> ir.Graph:
    """``g`` with each constant input named as the constant ``ref`` reads in
    the same place.  The frontend names a constant after where it was
    folded, and a small one (a 2 x 2 causal mask at seq=2) is shared by every
    place that folds to the same value: the names can differ between
    bindings, the places cannot (``shapes/family.py`` checks the values)."""
    nodes = {n.name: n for n in ref.nodes}
    consts = dict(g.constants)
    changed = False
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
                    inputs[k] = theirs
                    changed = True
        new_nodes.append(replace(n, inputs=tuple(inputs)) if tuple(inputs) != n.inputs else n)
    if not changed:
        return g
    used = {i for n in new_nodes for i in n.inputs}
    consts = {k: v for k, v in consts.items() if k in used or k in ref.constants}
    return ir.Graph(tuple(new_nodes), g.inputs, g.outputs, consts, g.name)


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
    avoid = {d for n in g_opt.nodes for d in n.shape} | {
        d for i in g_opt.inputs for d in i.type.shape
    }
    grid = Grid(tuple(grid_values(d.range, avoid) for d in dims))
    points = grid.points
    for i, p in enumerate(points):
        report("range", i + 1, len(points))
        graphs(p)
    checks = {at[w]: graphs(at[w]) for w in ("min", "opt", "max")}
    family = lift_family(dims, grid, {p: graphs(p) for p in points}, checks, at["max"], source)
    plan = _pinned(planned.plan, family, checks[at["max"]], at["max"], source)
    constants = _stored(plan, g_opt, checks[at["max"]], family)
    made = regenerate_ranged(plan, family, constants, model_file, source, at_opt=g_opt)
    return Built(made.planned.plan, family, made.graph, made.planned, made.source, constants)


def _pinned(plan: Plan, family: Family, g_max: ir.Graph, top: Binding, source: str) -> Plan:
    """``plan`` with each kernel's interpreter blocks those of MAX, so that
    the recorded configuration serves the whole range there too; and one
    software-pipeline stage for a kernel whose loop takes one step at MAX.

    At every binding such a loop takes at most one step, so more stages
    buy nothing, but the lifted kernel's loop bound is a runtime value and
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
) -> regenerate.Regenerated:
    """The graph and specs at OPT and the lifted ``kernels.py`` (see the module doc)."""
    title = regenerate.title(model_file)
    opt = family.at("opt")
    here = instance(plan, family, constants, opt, source, at_opt)
    # the rules take the plan's kernels at the range's ends too
    upper = instance(plan, family, constants, family.at("max"), source).graph
    instance(plan, family, constants, family.at("min"), source)
    printed = {}
    for p in family.grid.points:
        inst = instance(plan, family, constants, p, source)
        printed[p] = emit(inst.graph, inst.planned, title=title, upper=upper)
    shown = emit(here.graph, here.planned, title=title, upper=upper)
    lifted = lift_source(
        printed, family.grid, family.codes, [d.name for d in family.dims], shown, family.named(opt)
    )
    if isinstance(lifted, Unliftable):
        where = f"kernel function {lifted.function}" if lifted.function else "the kernels"
        raise InputError(
            f"{source}: {where} cannot serve the range: {lifted.reason}; "
            "narrow the range with --shape or --dim"
        )
    return regenerate.Regenerated(here.graph, here.planned, lifted)
