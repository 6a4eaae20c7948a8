"""Dynamic bundles in the Python API: ranges in, one bundle for all of them.

orchestrate.optimize("model.onnx", "model.orch", shapes={"input_ids": "1..8x2..64@32"})
orchestrate.optimize("model.onnx", "model.orch", shapes={"input_ids": ("1..8", "2..64")})
orchestrate.optimize("model.onnx", "model.orch", dims={"batch": "1..8", "sequence": (2, 64, 32)})
model = orchestrate.load("model.orch")      # a DynamicBundle
model.run({"input_ids": ids})               # any shape in the range

``api.optimize`` and ``api.load`` come here when a shape holds a range or a
bundle has dims.json; the pipeline is ``dynamic.py``, the runner
``dynamic_runtime.py``.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from orchestrate import bundle
from orchestrate.dynamic import Ranges, instance, regenerate_dynamic
from orchestrate.frontend import onnxrt
from orchestrate.ir import reference
from orchestrate.plan import pipeline
from orchestrate.run.dynamic_runtime import DynamicProgram, binding_of, binding_of_inputs

__all__ = [
    "DynamicBundle",
    "binding_of",
    "load_dynamic",
    "parse_ranges",
    "range_bindings",
    "verify_range",
]
from orchestrate.check.verify import Report, verify
from orchestrate.errors import InputError
from orchestrate.plan import Plan
from orchestrate.run.runtime import check_runnable, gpu_available, interpreter_refusal, load_kernels
from orchestrate.shapes import binding
from orchestrate.shapes.dims import DimRange, parse_range
from orchestrate.shapes.family import Binding, Family


def _one_range(value, where: str) -> DimRange:
    if isinstance(value, DimRange):
        return value
    if isinstance(value, str):
        return parse_range(value, where)
    if (
        isinstance(value, tuple)
        and 2 <= len(value) <= 3
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return parse_range(
            "..".join(map(str, value[:2])) + (f"@{value[2]}" if len(value) == 3 else ""), where
        )
    if isinstance(value, int) and not isinstance(value, bool):
        return parse_range(str(value), where)
    raise InputError(
        f"{where}: {value!r} is not N, 'MIN..MAX[@OPT]', (MIN, MAX[, OPT]) or a DimRange"
    )


def parse_ranges(shapes, dims, option: str = "shapes") -> Ranges | None:
    """``shapes`` and ``dims`` as a :class:`Ranges`, or None when they
    declare no range (a static shape: ``frontend.check_shapes`` reads it)."""
    dims = dict(dims or {})
    if not isinstance(shapes, (Mapping, type(None))):
        return None  # check_shapes refuses it, naming the option
    shapes = dict(shapes or {})

    def ranged(v) -> bool:
        if isinstance(v, str):
            return ".." in v
        return isinstance(v, DimRange) or (
            isinstance(v, (tuple, list)) and any(isinstance(d, (str, DimRange, tuple)) for d in v)
        )

    if not dims and not any(ranged(v) for v in shapes.values()):
        return None
    out: dict[str, tuple[DimRange, ...]] = {}
    for name, value in shapes.items():
        where = f"{option}[{name!r}]" if option == "shapes" else f"{option} {name}"
        if isinstance(value, str):
            parts = value.replace(",", "x").split("x")
        elif isinstance(value, (tuple, list)):
            parts = list(value)
        else:
            raise InputError(f"{where}: expected dimensions, got {type(value).__name__}")
        out[str(name)] = tuple(_one_range(p, where) for p in parts)
    flags = binding.API if option == "shapes" else binding.CLI
    return Ranges(out, {str(k): _one_range(v, f"dims {k}") for k, v in dims.items()}, flags)


class DynamicBundle:
    """A loaded dynamic bundle: ``run(inputs)`` at any shape in its range.
    ``dims`` gives each dimension's range; ``inputs`` the input shapes at OPT."""

    def __init__(
        self,
        path: Path,
        manifest: dict,
        plan: Plan,
        family: Family,
        constants,
        source: str,
        interpret: bool | None,
    ):
        self.path, self.manifest, self.plan, self.family = path, manifest, plan, family
        self.interpret = (not gpu_available()) if interpret is None else interpret
        self._constants, self._source = constants, source
        self._program: DynamicProgram | None = None
        self._making = threading.Lock()

    @property
    def graph(self):
        """The primitive graph at OPT."""
        return self.graph_at(self.family.at("opt"))

    def graph_at(self, binding: Binding):
        """The primitive graph at ``binding`` (``bench`` prices the shape it times)."""
        return instance(self.plan, self.family, self._constants, binding, str(self.path)).graph

    @property
    def dims(self) -> dict[str, DimRange]:
        return {d.name: d.range for d in self.family.dims}

    @property
    def program(self) -> DynamicProgram:
        with self._making:  # threads that run first make one, not several
            if self._program is None:
                opt = instance(
                    self.plan, self.family, self._constants, self.family.at("opt"), str(self.path)
                )
                check_runnable(opt.graph, self.interpret, opt.planned.specs)
                module = load_kernels(self._source, self.interpret)
                self._program = DynamicProgram(
                    self.plan,
                    self.family,
                    self._constants,
                    module,
                    str(self.path),
                    interpret=self.interpret,
                )
        return self._program

    def binding(self, inputs: Mapping[str, object]) -> Binding:
        """The binding of the dimensions the inputs give (InputError outside the range)."""
        return binding_of_inputs(self.family, inputs)

    def check_inputs(self, inputs: Mapping[str, object]) -> None:
        """InputError for inputs outside the range, disagreeing on a
        dimension (both before anything is loaded), or refused by the
        binding's Program (dtype, indices)."""
        self.binding(inputs)
        self.program.check_inputs(inputs)

    def run(self, inputs: Mapping[str, object]) -> dict[str, object]:
        """As ``Bundle.run``, at the binding the inputs' shapes give."""
        self.binding(inputs)  # before anything is loaded: outside the range is refused
        return self.program.run(inputs)

    @property
    def inputs(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {i.name: (i.shape, i.dtype) for i in self.plan.graph.inputs}

    @property
    def outputs(self) -> list[str]:
        return list(self.plan.graph.outputs)


def load_dynamic(out_dir: Path, contents: bundle.Contents, interpret: bool | None) -> DynamicBundle:
    """The dynamic bundle in ``contents``, its kernels printed again and
    compared with the shipped kernels.py (as ``api.load``)."""
    family = Family.from_json(contents.dims, f"{out_dir}/{bundle.DIMS}")
    mismatch = family.stored_mismatch(contents.constants)
    if mismatch is not None:  # a re-hashed dims.json claiming a range beyond what was built
        raise InputError(
            f"{out_dir}: dims.json does not describe the bundle's weights.npz ({mismatch}); "
            "optimize the model again for that range"
        )
    made = regenerate_dynamic(
        contents.plan, family, contents.constants, contents.manifest["model"]["file"], str(out_dir)
    )
    if made.source != contents.kernels_py:
        raise InputError(
            f"{out_dir}: kernels.py is not the source orchestrate generates from "
            "plan.json and dims.json (the bundle was edited, or written by another "
            "version); optimize the model again"
        )
    return DynamicBundle(
        out_dir,
        contents.manifest,
        contents.plan,
        family,
        contents.constants,
        made.source,
        interpret,
    )


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
) -> Report:
    """Compare ``loaded`` with onnxruntime at each binding (one random input
    each, seeded by its position).  Where the kernels cannot run here (bf16
    matmuls in the interpreter) the plan's graph is simulated in numpy."""
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
        )
        checks += [_at(c, k) for c in r.checks]
        names.append(loaded.family.named(b))
    return Report(tuple(checks), simulated, tuple(names))


def _at(check, k: int):
    from dataclasses import replace

    return replace(check, trial=k)
