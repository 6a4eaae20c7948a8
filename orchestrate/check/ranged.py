"""Verifying a range bundle: onnxruntime against the bundle at bindings of its range.

``range_bindings`` picks them (MIN, OPT, MAX and random odd ones);
``verify_range`` compares each binding's run with onnxruntime as
``check/verify.py`` does for one shape.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import numpy as np

from orchestrate.check.verify import Report, verify
from orchestrate.errors import InputError
from orchestrate.frontend import onnxrt
from orchestrate.ir import reference
from orchestrate.plan import pipeline
from orchestrate.plan.ranged import instance
from orchestrate.run.ranged import DynamicBundle
from orchestrate.run.runtime import interpreter_refusal
from orchestrate.shapes.family import Binding, Family

__all__ = ["input_shapes", "range_bindings", "verify_range"]


def range_bindings(family: Family, trials: int, seed: int = 0) -> list[Binding]:
    """MIN, OPT and MAX, then ``trials`` random bindings of the range, odd
    where the range allows (so no block size divides them); every binding
    when the range holds no more than ``trials + 3``."""
    sizes = [d.range.max - d.range.min + 1 for d in family.dims]
    if np.prod(sizes, dtype=np.int64) <= trials + 3:
        return list(itertools.product(*(range(d.range.min, d.range.max + 1) for d in family.dims)))
    out: list[Binding] = []
    for which in ("min", "opt", "max"):
        b = family.at(which)
        if b not in out:
            out.append(b)
    rng = random.Random(seed)
    for _ in range(trials):
        b = []
        for d in family.dims:
            v = rng.randint(d.range.min, d.range.max)
            if v % 2 == 0:
                v = v + 1 if v + 1 <= d.range.max else max(d.range.min, v - 1)
            b.append(v)
        if tuple(b) not in out:
            out.append(tuple(b))
    return out


def input_shapes(loaded: DynamicBundle, binding: Binding) -> dict[str, tuple[int, ...]]:
    family = loaded.family
    return {
        i.name: family.input_shape(i.name, binding) if i.name in family.inputs else i.shape
        for i in loaded.plan.graph.inputs
    }


def verify_range(
    model,
    loaded: DynamicBundle,
    bindings: list[Binding],
    *,
    rtol,
    atol,
    source: str,
    session=None,
    progress=None,
    draws=None,
) -> Report:
    """Compare ``loaded`` with onnxruntime at each binding (one random input
    each, seeded by its position; ``draws`` may bound them, not give them:
    the shapes differ).  Where the kernels cannot run here (bf16 matmuls in
    the interpreter) the plan's graph is simulated in numpy."""
    if draws is not None and draws.given:
        name = next(iter(draws.given))
        raise InputError(
            f"--input {name}: a bundle for a range of shapes is verified at several shapes; "
            "bound its values with --input-range instead"
        )
    session = session or onnxrt.reference(model, source)
    report_step = progress or (lambda stage, i, n: None)
    checks, names, simulated = [], [], ""
    for k, b in enumerate(bindings):
        report_step("verify", k + 1, len(bindings))
        graph = pipeline.fission_model(model, input_shapes(loaded, b), source)
        inst = instance(loaded.plan, loaded.family, loaded._constants, b, source)
        refusal = interpreter_refusal(inst.graph, inst.planned.specs) if loaded.interpret else None
        run = (
            loaded.run if refusal is None else (lambda feeds, g=inst.graph: reference.run(g, feeds))
        )
        simulated = simulated or (refusal or "")
        r = verify(
            model,
            graph,
            run,
            trials=1,
            rtol=rtol,
            atol=atol,
            seed=k,
            session=session,
            source=source,
            draws=draws,
        )
        checks += [_at(c, k) for c in r.checks]
        names.append(loaded.family.named(b))
    return Report(tuple(checks), simulated, tuple(names))


def _at(check, k: int):
    return replace(check, trial=k)
