"""A bundle is data: the kernels it runs are printed again from its plan.

``load`` never imports the ``kernels.py`` a bundle ships.  It rebuilds the
primitive graph from plan.json and weights.npz, checks it with the IR's type
rules, matches every planned kernel again with the rule table (the spec's
structural hash must be the one recorded), and emits the source, which is
deterministic.  That source is what runs; the shipped ``kernels.py`` is for
people to read, and a bundle whose copy differs from it is refused as edited.

So what a bundle can make orchestrate do is bounded by what a plan can
describe: primitives with attributes, constants, and kernels the rules
accept.  Its text reaches the generated source only through
``orchestrate.text``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from orchestrate import ir
from orchestrate.cost.devices import get_device
from orchestrate.emit import emit
from orchestrate.errors import GraphError, InputError, OrchestrateError, UnsupportedError
from orchestrate.ir import type_rules
from orchestrate.kernels.spec import VIEW, Rejection, Target
from orchestrate.plan import Plan, Planned
from orchestrate.templates import match_all


def title(model_file: str) -> str:
    """The first line of ``kernels.py``'s docstring."""
    return f"Triton kernels for {model_file}"


def primitive_graph(plan: Plan, constants: Mapping[str, np.ndarray], source: str) -> ir.Graph:
    """The primitive graph a plan was made from, type-checked; InputError
    names what does not hold together."""
    dtypes = set(ir.ALL_DTYPES)
    for name, arr in constants.items():
        if arr.dtype.name not in dtypes:
            raise InputError(f"{source}: constant {name!r} has unsupported dtype {arr.dtype}")
    ops = {op.value: op for op in ir.Op}
    nodes = []
    for p in plan.primitives:
        if p.op not in ops:
            raise InputError(f"{source}: primitive {p.name!r} has unknown op {p.op!r}")
        nodes.append(
            ir.Node(
                ops[p.op],
                p.name,
                p.inputs,
                _type(p.shape, p.dtype, p.name, source, p.name in plan.graph.outputs),
                p.attrs,
                p.origin,
            )
        )
    inputs = tuple(
        ir.Input(i.name, _type(i.shape, i.dtype, i.name, source)) for i in plan.graph.inputs
    )
    extra = sorted(set(constants) - set(plan.graph.constants))
    if extra:
        raise InputError(f"{source}: weights hold constant {extra[0]!r}, which the plan lacks")
    graph = ir.Graph(tuple(nodes), inputs, plan.graph.outputs, dict(constants), plan.graph.name)
    try:
        return type_rules.validate(graph)
    except (GraphError, UnsupportedError) as e:
        raise InputError(f"{source}: {e}") from None
    except (KeyError, TypeError, ValueError, IndexError) as e:  # an attribute of the wrong kind
        raise InputError(f"{source}: a primitive's attributes do not type-check ({e!r})") from None


def _type(
    shape: tuple[int, ...], dtype: str, name: str, source: str, held: bool = True
) -> ir.TensorType:
    """``held``: a tensor in memory (a graph input or output), bounded by
    ``ir.MAX_ELEMENTS``; any other is held only if a kernel writes it, which
    the rules refuse past that bound when the plan is matched again."""
    if dtype not in ir.ALL_DTYPES:
        raise InputError(f"{source}: tensor {name!r} has unsupported dtype {dtype!r}")
    if any(d < 0 for d in shape):
        raise InputError(f"{source}: tensor {name!r} has a negative dimension {list(shape)}")
    if held and int(np.prod(shape, dtype=object)) > ir.MAX_ELEMENTS:
        raise InputError(
            f"{source}: tensor {name!r} of shape {list(shape)} has more than "
            f"{ir.MAX_ELEMENTS:,} elements"
        )
    return ir.TensorType(tuple(shape), dtype)


def planned(
    plan: Plan,
    graph: ir.Graph,
    source: str,
    *,
    check_hash: bool = True,
    own_interpret: bool = False,
) -> Planned:
    """The plan with the spec of every kernel, matched again by the rules and
    checked against the structural hash and launch configuration recorded.
    ``check_hash=False`` for the plan instantiated at another binding of a
    dynamic bundle's dimensions (``orchestrate/shapes/family.py``): its specs
    hold other shapes, so their hashes differ; the template, the
    configuration and the tensors must still be the recorded ones."""
    try:
        target = Target(
            get_device(plan.device), plan.options.tf32, gemm_backends=plan.options.gemm_backends
        )
    except OrchestrateError as e:
        raise InputError(f"{source}: {e}") from None
    specs = []
    covered: list[str] = []
    for i, k in enumerate(plan.kernels):
        where = f"{source}: kernel {i} ({k.name!r})"
        if k.name != f"k{i:03d}_{k.template}":
            raise InputError(f"{where}: expected the name k{i:03d}_{k.template}")
        # the recorded configuration first: the rules still check that it fits
        recorded = replace(target, rank=lambda _, s, c=k.config: 0 if s.config == c else 1)
        if not check_hash and k.template != VIEW:  # another binding: the plan's configuration
            recorded = replace(recorded, pin=(k.template, k.config, own_interpret))
        found = match_all(graph, k.primitives, recorded)
        # the generated kernel or the library call, as the plan says
        spec = (
            found
            if isinstance(found, Rejection)
            else next((s for s in found if s.template == k.template), found[0])
        )
        if isinstance(spec, Rejection):
            raise InputError(f"{where}: its primitives are not one kernel ({spec.reason})")
        if spec.template != k.template or (
            check_hash and k.template != VIEW and spec.hash != k.hash
        ):
            raise InputError(
                f"{where}: does not match the kernel its primitives make "
                f"({spec.template}, hash {spec.hash})"
            )
        if k.template != VIEW and spec.config != k.config:
            # at another binding the configuration is pinned to the recorded
            # one; only interpreter blocks the plan left empty are the rules'
            if check_hash or replace(spec.config, interpret=()) != replace(k.config, interpret=()):
                raise InputError(f"{where}: launch configuration differs from the rules' choice")
        if not set(spec.outputs) <= set(k.outputs) <= set(spec.outputs) | set(spec.optional):
            raise InputError(f"{where}: writes {list(k.outputs)}, which its primitives do not")
        if tuple(spec.inputs) != tuple(k.inputs):
            raise InputError(f"{where}: reads {list(k.inputs)}, expected {list(spec.inputs)}")
        specs.append(spec)
        covered += k.primitives
    _check_schedule(plan, graph, covered, source)
    return Planned(plan, tuple(specs))


def _check_schedule(plan: Plan, graph: ir.Graph, covered: list[str], source: str) -> None:
    """Every primitive in some kernel (a recomputed one in several); every
    tensor written once; every kernel reads only what is written before it;
    every graph output written."""
    if set(covered) != {n.name for n in graph.nodes}:
        raise InputError(f"{source}: the kernels do not run every primitive")
    ready = {i.name for i in graph.inputs} | set(graph.constants)
    for k in plan.kernels:
        missing = [t for t in k.inputs if t not in ready]
        if missing:
            raise InputError(
                f"{source}: kernel {k.name!r} reads {missing[0]!r} before it is written"
            )
        twice = [t for t in k.outputs if t in ready]
        if twice:
            raise InputError(f"{source}: kernel {k.name!r} writes {twice[0]!r} a second time")
        ready.update(k.outputs)
    lost = [o for o in graph.outputs if o not in ready]
    if lost:
        raise InputError(f"{source}: no kernel writes output {lost[0]!r}")


@dataclass(frozen=True)
class Regenerated:
    """What a plan is made of again: its primitive graph (with the
    constants), the plan with its kernel specs, and the kernels' source."""

    graph: ir.Graph
    planned: Planned
    source: str


def regenerate(
    plan: Plan, constants: Mapping[str, np.ndarray], model_file: str, source: str
) -> Regenerated:
    """The graph, specs and ``kernels.py`` orchestrate makes for this plan;
    InputError (naming ``source``) for a plan that does not hold together."""
    graph = primitive_graph(plan, constants, source)
    made = planned(plan, graph, source)
    return Regenerated(graph, made, emit(graph, made, title=title(model_file)))
