"""``orchestrate verify OUT --model MODEL.onnx --exact``: a bundle's plan
against the primitive graph fission makes of the model."""

from __future__ import annotations

import os
from collections.abc import Mapping

from orchestrate import bundle
from orchestrate.bundle import regenerate
from orchestrate.check.exact.check import Result, check, kernels_of
from orchestrate.errors import InputError
from orchestrate.plan import pipeline


def verify_exact(
    out_dir: str | os.PathLike,
    model_path: str | os.PathLike,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    seed: int | None = None,
    option: str = "--shape",
) -> Result:
    """The plan as the bundle's plan.json and weights rebuild it (the graph
    type-checked, every kernel matched again by the rules, as
    ``orchestrate.bundle.regenerate`` does to load it) against fission of the
    model at the bundle's shapes (or ``shapes``)."""
    contents = bundle.read(out_dir)
    plan_graph = regenerate.primitive_graph(contents.plan, contents.constants, str(out_dir))
    made = regenerate.planned(contents.plan, plan_graph, str(out_dir))
    if shapes is None:
        shapes = {k: tuple(v) for k, v in contents.manifest.get("shapes", {}).items()}
    bound = contents.manifest.get("bound_inputs")
    original = pipeline.fission_model(
        pipeline.load(model_path, bound, "bound_inputs"), shapes, str(model_path), option=option
    )
    mine = [(i.name, i.type) for i in original.inputs]
    theirs = [(i.name, i.type) for i in plan_graph.inputs]
    if mine != theirs or tuple(original.outputs) != tuple(plan_graph.outputs):
        raise InputError(
            f"{model_path} does not match the bundle {out_dir}: their inputs or "
            "outputs differ (pass the shapes the bundle was built with)"
        )
    return check(original, plan_graph, kernels_of(made.plan, plan_graph, made.specs), seed=seed)


def verify_exact_range(
    out_dir: str | os.PathLike, model_path: str | os.PathLike, *, seed: int | None = None
) -> list[tuple[str, Result]]:
    """A dynamic bundle's plan, checked as ``verify_exact`` at MIN, OPT and
    MAX of its range: (binding, result) for each, against fission of the
    model at that binding."""
    from orchestrate.plan.ranged import instance
    from orchestrate.shapes.family import Family

    contents = bundle.read(out_dir)
    if contents.dims is None:
        raise InputError(f"{out_dir}: not a dynamic bundle (it has no {bundle.DIMS})")
    family = Family.from_json(contents.dims, f"{out_dir}/{bundle.DIMS}")
    model = pipeline.load(model_path, contents.manifest.get("bound_inputs"), "bound_inputs")
    out = []
    for b in dict.fromkeys(family.at(w) for w in ("min", "opt", "max")):
        inst = instance(contents.plan, family, contents.constants, b, str(out_dir))
        shapes = {i.name: i.type.shape for i in inst.graph.inputs}
        original = pipeline.fission_model(model, shapes, str(model_path))
        if tuple(original.outputs) != tuple(inst.graph.outputs):
            raise InputError(
                f"{model_path} does not match the bundle {out_dir}: their outputs differ"
            )
        made = inst.planned
        out.append(
            (
                family.named(b),
                check(
                    original, inst.graph, kernels_of(made.plan, inst.graph, made.specs), seed=seed
                ),
            )
        )
    return out
