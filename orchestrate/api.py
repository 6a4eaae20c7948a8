"""The end-to-end Python API: ``optimize`` a model into a bundle, ``load`` it.

import orchestrate
orchestrate.optimize("model.onnx", "model.orch", shapes={"ids": (1, 128)})
model = orchestrate.load("model.orch")
outputs = model.run({"ids": ids})  # numpy arrays in, numpy arrays out
outputs = model.run({"ids": torch_ids})  # torch tensors in, torch tensors out
"""

from __future__ import annotations

import math
import numbers
import os
import shutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from orchestrate import bundle, explain, text
from orchestrate.bundle import regenerate
from orchestrate.check import ranged as range_check
from orchestrate.check.draws import Draws, check_draws
from orchestrate.check.verify import Report, check_tolerance, verify
from orchestrate.emit import emit
from orchestrate.errors import InputError, OrchestrateError
from orchestrate.frontend import check_shapes, decode, graph_inputs, onnxrt
from orchestrate.frontend.constants import recorded
from orchestrate.ir import precision, reference
from orchestrate.plan import Plan, pipeline, ranged
from orchestrate.plan.planner import PlanOptions
from orchestrate.run.ranged import binding_of, load_dynamic
from orchestrate.run.runtime import (
    IndexChecks,
    Program,
    check_inputs,
    check_runnable,
    gpu_available,
    interpreter_refusal,
    load_kernels,
)
from orchestrate.shapes.binding import parse_ranges
from orchestrate.shapes.family import Family
from orchestrate.tune import Tune
from orchestrate.version import __version__

TF32_RTOL = 5e-3  # TF32 keeps 10 mantissa bits


class VerificationError(OrchestrateError):
    """The bundle does not compute what the model computes."""

    def __init__(self, message: str, report: Report):
        super().__init__(message)
        self.report = report


class Bundle:
    """A loaded bundle: ``run(inputs) -> outputs`` (numpy arrays or torch
    tensors by name).

    Its kernels are the source orchestrate generates from its plan (see
    ``orchestrate.bundle.regenerate``); they are compiled (on a GPU) on the first run."""

    def __init__(
        self, path: Path, manifest: dict, made: regenerate.Regenerated, interpret: bool | None
    ):
        self.path, self.manifest = path, manifest
        self.plan, self._made = made.planned.plan, made
        self.interpret = (not gpu_available()) if interpret is None else interpret
        self._indices = IndexChecks(made.graph, made.planned)  # checks the constants now
        self._program: Program | None = None
        self._making = threading.Lock()

    @property
    def graph(self):
        """The primitive graph the plan runs (``orchestrate.ir.Graph``)."""
        return self._made.graph

    @property
    def planned(self):
        """The plan with the spec of every kernel (``orchestrate.plan.Planned``)."""
        return self._made.planned

    @property
    def program(self) -> Program:
        with self._making:  # threads that run first make one Program, not several
            if self._program is None:
                # before the kernels are loaded
                check_runnable(self._made.graph, self.interpret, self._made.planned.specs)
                module = load_kernels(self._made.source, self.interpret)
                self._program = Program(
                    self._made.planned,
                    self._made.graph,
                    module,
                    interpret=self.interpret,
                    indices=self._indices,
                )
        return self._program

    def check_inputs(self, inputs: Mapping[str, object]) -> None:
        """InputError for a missing, misshapen or unknown input, or an index
        out of range (before anything is compiled or run)."""
        self._indices.check_inputs(check_inputs(self.inputs, inputs))

    def run(self, inputs: Mapping[str, object]) -> dict[str, object]:
        """The outputs on ``inputs`` (by input name), by output name.

        Numpy arrays in, numpy arrays out.  Torch tensors in (CUDA tensors on
        a GPU, CPU tensors in the interpreter), torch tensors out on the same
        device: read in place and returned without a copy through the host,
        so a caller inside a PyTorch program pays no transfer.  Either way
        every input is checked first (name, shape, dtype, and the indices of
        gathers it feeds: for tensors, a min and a max on the device); a bad
        one is an InputError naming it."""
        if self._program is None:
            self.check_inputs(inputs)  # before the kernels are loaded
        return self.program.run(inputs)

    def generate(self, prompt_ids, max_new_tokens: int, **options):
        """Refused: decoding needs a bundle for a range of past lengths."""
        raise InputError(
            f"{self.path}: generate needs a bundle made for a range of past lengths "
            "(optimize the decode step with --dim past=MIN..MAX); this one has fixed shapes"
        )

    @property
    def inputs(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {i.name: (i.shape, i.dtype) for i in self.plan.graph.inputs}

    @property
    def outputs(self) -> list[str]:
        return list(self.plan.graph.outputs)


def load(out_dir: str | os.PathLike, *, interpret: bool | None = None) -> Bundle:
    """Load a bundle: every file checked against the manifest and parsed, the
    kernels generated again from the plan, and the bundle refused if its
    ``kernels.py`` is not that source.  Nothing the bundle ships is imported."""
    out_dir = _path(out_dir, "out_dir")
    if interpret is not None and not isinstance(interpret, bool):
        raise InputError(f"interpret={interpret!r}: expected True, False or None")
    contents = bundle.read(out_dir)
    if contents.dims is not None:
        return load_dynamic(Path(out_dir), contents, interpret)
    made = regenerate.regenerate(
        contents.plan, contents.constants, contents.manifest["model"]["file"], str(out_dir)
    )
    if made.source != contents.kernels_py:
        made_by = contents.manifest["orchestrate"]
        why = (
            f"it was written by orchestrate {made_by}, this is {__version__}"
            if made_by != __version__
            else "the bundle was edited"
        )
        raise InputError(
            f"{out_dir}: kernels.py is not the source orchestrate generates from plan.json ({why});"
            " kernels.py is there to read, not to run: optimize the model again"
        )
    return Bundle(Path(out_dir), contents.manifest, made, interpret)


@dataclass
class Optimized:
    path: Path
    plan: Plan
    report: Report | None
    family: Family | None = None  # a dynamic bundle's dimensions and how shapes follow them
    in_place: str = ""  # a decode step's: its in-place bundle planned, or why not (one line)


def optimize(
    model_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    dims: Mapping[str, object] | None = None,
    options: PlanOptions | None = None,
    trials: int = 2,
    rtol: float | None = None,
    atol: float | None = None,
    progress=None,
    tune: Tune | None = None,
    constants: Mapping[str, object] | None = None,
    input_ranges: Mapping[str, tuple[float, float]] | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    in_place_cache: bool = True,
    _shape_option: str = "shapes",
    _const_option: str = "constants",
    **plan_options,
) -> Optimized:
    """Fission, plan, emit and verify ``model_path``; write the bundle to ``out_dir``.

    Keyword options not listed are PlanOptions fields (``device``,
    ``memory_budget``, ``time_limit``, ...), or give ``options``, not both.
    Nothing is left at ``out_dir`` unless the bundle verified (``trials=0``
    skips verification of one shape; a range is always checked at MIN, OPT
    and MAX).  Where the kernels cannot run (bf16 matmuls without
    a GPU: ``runtime.interpreter_refusal``) the plan is simulated in numpy
    instead, and the report says so (``Report.simulated``): the bundle is
    written if the simulation is within tolerance, not called verified.
    ``tune`` (``orchestrate.tune.Tune``: a timer, configurations per spec,
    a cache file) prices the candidates by measurement (``optimize --tune``).
    ``constants`` binds inputs to values (``{"sr": 16000}``): they become
    constants of the model, folded (an ``If`` on them takes its branch),
    and the bundle's interface no longer has them.  Verification draws each
    input from what the graph needs, or from ``input_ranges`` (``{"x": (0,
    1)}``), or feeds it ``inputs`` (``{"x": array}``, every trial; static
    shapes only).  A bad argument is an
    InputError that names it (``_shape_option`` and ``_const_option`` are
    the names errors give ``shapes`` and ``constants``).  A decode step over
    a range of past lengths also gets its step over caches kept in place,
    unless ``in_place_cache`` is False (``frontend/decode.py``).

    A range in ``shapes`` (``{"x": "1..8x2..64@32"}``, or per dimension
    ``("1..8", (2, 64, 32))``) or in ``dims`` (``{"seq": "2..64"}``) makes a
    dynamic bundle, one for every shape in the range (``run/ranged.py``);
    it is verified at MIN, OPT, MAX and ``trials`` random shapes between."""
    model_path = _path(model_path, "model_path")
    out_dir = _path(out_dir, "out_dir")
    ranges = parse_ranges(shapes, dims, _shape_option)
    if ranges is None:
        shapes = check_shapes(shapes, _shape_option)
    trials = _count(trials, "trials", 0)
    rtol, atol = check_tolerance(rtol, "rtol"), check_tolerance(atol, "atol")
    draws = _draws(input_ranges, inputs)
    if progress is not None and not callable(progress):
        raise InputError(
            f"progress: expected a function (stage, done, total), got {type(progress).__name__}"
        )
    options = _plan_options(options, plan_options)
    if tune is not None and not isinstance(tune, Tune):
        raise InputError(f"tune: expected an orchestrate.tune.Tune, got {type(tune).__name__}")
    out = Path(out_dir)
    bundle.check_destination(out, model_path)
    if rtol is None:
        rtol = default_rtol(options.dtype, options.tf32)
    model = pipeline.load(model_path, constants, _const_option)
    bound = recorded(model, constants or {})
    if ranges is not None:  # every range a point: the static shape it fixes
        point = ranged.point_shapes(model, ranges, str(model_path))
        ranges, shapes = (None, point) if point is not None else (ranges, shapes)
    if ranges is not None:
        if tune is not None:
            raise InputError(
                "--tune: not with a range of shapes yet (it times kernels at one "
                "shape); tune a static shape, or plan the range by the cost model"
            )
        if draws is not None and draws.given:
            raise InputError(
                f"inputs {next(iter(draws.given))}: a bundle for a range of shapes is verified "
                "at several shapes; bound its values with input_ranges (--input-range) instead"
            )
        return _optimize_range(
            model_path,
            model,
            out,
            ranges,
            options,
            trials,
            rtol,
            atol,
            progress,
            bound,
            draws,
            in_place_cache,
        )
    report_step = progress or (lambda stage, i, n: None)
    # made before the work, so a model onnxruntime refuses is refused up front
    session = onnxrt.reference(model, str(model_path)) if trials > 0 else None
    graph = pipeline.fission_model(model, shapes, str(model_path), option=_shape_option)
    if draws is not None and trials > 0:  # refused before the planning, not after
        check_draws(draws, graph, str(model_path))
    graph = precision.lower_precision(graph, options.dtype, str(model_path))
    planned = pipeline.plan_graph(graph, options, progress=progress, tune=tune)
    plan = planned.plan
    report_step("emit", 1, 1)
    source = emit(graph, planned, title=regenerate.title(Path(model_path).name))
    used = {t for k in plan.kernels for t in k.inputs}
    constants = {k: v for k, v in graph.constants.items() if k in used}
    staging = bundle.Staging(out, model_path)
    try:
        info = {
            "orchestrate": __version__,
            "model": {"file": Path(model_path).name, "sha256": bundle.sha256(Path(model_path))},
            "shapes": {k: list(v) for k, v in (shapes or {}).items()},
            **({"bound_inputs": bound} if bound else {}),
        }
        staging.write(plan, source, constants, _report_md(plan, None), info)
        result = None
        if trials > 0:
            report_step("verify", 1, 1)
            loaded = load(staging.path)
            refusal = interpreter_refusal(graph, planned.specs) if loaded.interpret else None
            run = loaded.run if refusal is None else (lambda feeds: reference.run(graph, feeds))
            result = verify(
                model,
                graph,
                run,
                trials=trials,
                rtol=rtol,
                atol=atol,
                session=session,
                source=str(model_path),
                draws=draws,
            )
            result = replace(result, simulated=refusal or "")
            staging.write(plan, source, constants, _report_md(plan, result), info)
            if not result.ok:
                bad = result.first_failure()
                what = "the plan, simulated in numpy," if refusal else "the generated kernels"
                raise VerificationError(
                    f"{model_path}: {what} do not match the model (its float64 reference, "
                    f"onnxruntime beside it) on output {bad.name!r} (trial {bad.trial}): "
                    f"{bad.detail}",
                    result,
                )
        path = staging.commit()
    except BaseException:
        staging.discard()
        raise
    return Optimized(path, plan, result)


def _optimize_range(
    model_path: Path,
    model: onnx.ModelProto,
    out: Path,
    ranges,
    options: PlanOptions,
    trials: int,
    rtol,
    atol,
    progress,
    bound: dict,
    draws,
    in_place_cache: bool,
) -> Optimized:
    """``optimize`` for a range of shapes (``model``, loaded from
    ``model_path``): one dynamic bundle, verified at MIN, OPT, MAX and
    ``trials`` random bindings."""
    report_step = progress or (lambda stage, i, n: None)
    session = onnxrt.reference(model, str(model_path))  # refused up front, as for one shape
    made = ranged.build(model, ranges, options, model_path.name, str(model_path), progress)
    plan, family = made.plan, made.family
    staging = bundle.Staging(out, model_path)
    try:
        info = {
            "orchestrate": __version__,
            "model": {"file": model_path.name, "sha256": bundle.sha256(model_path)},
            "shapes": {i.name: list(i.shape) for i in plan.graph.inputs if i.name in family.inputs},
            **({"bound_inputs": bound} if bound else {}),
        }
        dims = family.to_json()
        staging.write(plan, made.source, made.constants, _report_md(plan, None, family), info, dims)
        report_step("emit", 1, 1)
        result = _verify_staged(
            model,
            staging.path,
            family,
            trials,
            rtol,
            atol,
            str(model_path),
            session,
            progress,
            draws,
        )
        said, in_place = "", None
        if in_place_cache:
            try:
                said, in_place = _in_place_step(
                    model,
                    model_path,
                    family,
                    staging,
                    options,
                    trials,
                    rtol,
                    atol,
                    progress,
                    made.constants,
                )
            except OrchestrateError as e:  # the bundle stands without it: said, not fatal
                shutil.rmtree(staging.path / bundle.IN_PLACE, ignore_errors=True)
                why = (str(e).splitlines() or [type(e).__name__])[0]
                said = f"in-place cache: not planned ({text.shown(why)})"
        info = {**info, **({"in_place": in_place} if in_place else {})}
        staging.write(
            plan, made.source, made.constants, _report_md(plan, result, family), info, dims
        )
        path = staging.commit()
    except BaseException:
        staging.discard()
        raise
    return Optimized(path, plan, result, family, said)


def _verify_staged(
    model,
    folder: Path,
    family: Family,
    trials,
    rtol,
    atol,
    source: str,
    session,
    progress,
    draws=None,
) -> Report:
    """The range bundle staged at ``folder`` checked against ``model`` at MIN,
    OPT, MAX and ``trials`` random bindings; VerificationError naming the
    first output that does not match."""
    result = range_check.verify_range(
        model,
        load(folder),
        range_check.range_bindings(family, trials),
        rtol=rtol,
        atol=atol,
        source=source,
        session=session,
        progress=progress,
        draws=draws,
    )
    if not result.ok:
        bad = result.first_failure()
        raise VerificationError(
            f"{source}: the generated kernels do not match the model (its float64 "
            f"reference, onnxruntime beside it) on output {bad.name!r} at "
            f"{result.bindings[bad.trial]}: {bad.detail}",
            result,
        )
    return result


BUCKET = 64  # past lengths a decode step rounds up to, one Program (CUDA graph) each
PAD_CHECK = 5  # masked slots the in-place step is checked not to be moved by


def _in_place_step(
    model,
    model_path: Path,
    family: Family,
    staging,
    options,
    trials,
    rtol,
    atol,
    progress,
    outer: Mapping[str, np.ndarray],
) -> tuple[str, dict | None]:
    """For a decode step: the step over caches kept in place
    (``frontend/decode.py``) planned for the same range, verified, and
    written to ``bundle.IN_PLACE`` inside the staged bundle, storing only
    the constants that differ from ``outer`` (the outer bundle's); (what to
    say, the manifest's ``in_place`` field). Not a decode step: ("", None)."""
    inputs = {i.name: i for i in graph_inputs(model)}
    outputs = {o.name: o for o in model.graph.output}
    try:
        io = decode.decode_io(list(inputs), list(outputs), "")
    except InputError:
        return "", None
    first, grown = io.caches[0]
    found = decode.growing_axis(inputs[first], outputs[grown])
    if isinstance(found, str):
        return f"in-place cache: not planned ({found})", None
    step = found[1]
    past = {d.name: d for d in family.dims}
    if step not in past:
        return "in-place cache: not planned (the caches' past length is not a range)", None
    capacity = past[step].range.max + 1
    rewritten = decode.in_place(model, io, capacity)
    if isinstance(rewritten, str):
        return f"in-place cache: not planned ({rewritten})", None
    source = f"{model_path} (in place)"
    dims = {d.name: f"{d.range.min}..{d.range.max}@{d.range.opt}" for d in family.dims}
    ranges = parse_ranges(None, dims)
    session = onnxrt.reference(rewritten.model, source)
    names = [o.name for o in rewritten.model.graph.output]

    def run_step(feeds):
        return dict(zip(names, onnxrt.run_reference(session, names, feeds, source)))

    r = past[step].range
    at = min(r.opt, max(r.min, r.max - PAD_CHECK))
    moved = (
        decode.padding_changes(rewritten, run_step, at, min(r.max, at + PAD_CHECK))
        if r.max > at
        else "the range holds one past length"
    )
    bucket = BUCKET if moved is None else 1
    steps = None if progress is None else (lambda stage, i, n: progress(f"in place: {stage}", i, n))
    made = ranged.build(rewritten.model, ranges, options, model_path.name, source, steps)
    folder = bundle.IN_PLACE
    info = {
        "orchestrate": __version__,
        "model": {"file": model_path.name, "sha256": bundle.sha256(model_path)},
        "shapes": {
            i.name: list(i.shape) for i in made.plan.graph.inputs if i.name in made.family.inputs
        },
    }
    dims_json = made.family.to_json()
    plan = made.plan
    staging.write(plan, made.source, made.constants, "", info, dims_json, folder, outer)
    result = _verify_staged(
        rewritten.model,
        staging.path / folder,
        made.family,
        trials,
        rtol,
        atol,
        source,
        session,
        steps,
    )
    report = _report_md(plan, result, made.family)
    staging.write(plan, made.source, made.constants, report, info, dims_json, folder, outer)
    written = sum(k.bytes for k in plan.kernels)
    field = {
        "manifest": staging.manifest_sha256(folder),
        "past": step,
        "capacity": capacity,
        "axes": dict(rewritten.axis),
        "bucket": bucket,
    }
    said = (
        f"in-place cache: {folder}/ planned and verified, "
        f"{sum(not k.is_view for k in plan.kernels)} kernels, "
        f"{written:,} bytes a step at OPT (buffers of {capacity} rows); "
        + (
            f"past lengths rounded up to buckets of {bucket} (masked slots checked to change nothing)"
            if moved is None
            else f"no buckets: {moved}"
        )
    )
    return said, field


def verify_bundle(
    out_dir: str | os.PathLike,
    model_path: str | os.PathLike,
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    trials: int = 3,
    rtol: float | None = None,
    atol: float | None = None,
    input_ranges: Mapping[str, tuple[float, float]] | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    _shape_option: str = "shapes",
) -> Report:
    """Compare a bundle with onnxruntime running ``model_path`` over ``trials``
    (>= 1) random inputs (``input_ranges`` and ``inputs`` as for
    ``optimize``).  A bad argument is an InputError that names it
    (``_shape_option`` is the name shape errors give ``shapes``)."""
    trials = _count(trials, "trials", 1)
    rtol, atol = check_tolerance(rtol, "rtol"), check_tolerance(atol, "atol")
    draws = _draws(input_ranges, inputs)
    if (_path(out_dir, "out_dir") / bundle.DIMS).exists():
        return _verify_range(out_dir, model_path, shapes, trials, rtol, atol, _shape_option, draws)
    loaded, model, graph = bundle_and_model(
        out_dir, model_path, shapes, _shape_option=_shape_option
    )
    if rtol is None:
        rtol = default_rtol(loaded.plan.options.dtype, loaded.plan.options.tf32)
    return verify(
        model,
        graph,
        loaded.run,
        trials=trials,
        rtol=rtol,
        atol=atol,
        source=str(model_path),
        draws=draws,
    )


def _draws(input_ranges, inputs) -> Draws | None:
    """``input_ranges`` and ``inputs`` checked, as verification's Draws."""
    if input_ranges is None and inputs is None:
        return None
    for name, value in (("input_ranges", input_ranges), ("inputs", inputs)):
        if value is not None and not isinstance(value, Mapping):
            raise InputError(
                f"{name}: expected a mapping by input name, got {type(value).__name__}"
            )
    ranges = {}
    for k, v in (input_ranges or {}).items():
        if not (
            isinstance(v, tuple | list)
            and len(v) == 2
            and all(isinstance(x, numbers.Real) for x in v)
            and all(math.isfinite(x) for x in v)
            and v[0] <= v[1]
        ):
            raise InputError(
                f"input_ranges[{k!r}]: expected (low, high), finite, low <= high; got {v!r}"
            )
        ranges[k] = (float(v[0]), float(v[1]))
    given = {}
    for k, v in (inputs or {}).items():
        if not isinstance(v, np.ndarray):
            raise InputError(f"inputs[{k!r}]: expected a numpy array, got {type(v).__name__}")
        given[k] = v
    return Draws(ranges, given)


def _verify_range(
    out_dir, model_path, shapes, trials: int, rtol, atol, option: str, draws=None
) -> Report:
    """``verify_bundle`` of a dynamic bundle: at the binding ``shapes`` give,
    else at MIN, OPT, MAX and ``trials`` random bindings of its range."""
    loaded = load(out_dir)
    model_path = _path(model_path, "model_path")
    model = pipeline.load(model_path, loaded.manifest.get("bound_inputs"), "bound_inputs")
    family = loaded.family
    at_opt = pipeline.fission_model(
        model, range_check.input_shapes(loaded, family.at("opt")), str(model_path), option=option
    )
    _check_same_interface(at_opt, loaded, model_path, Path(out_dir))
    if shapes is not None:
        shapes = check_shapes(shapes, option)
        bindings = [binding_of(family, shapes)]
    else:
        bindings = range_check.range_bindings(family, trials)
    if rtol is None:
        rtol = default_rtol(loaded.plan.options.dtype, loaded.plan.options.tf32)
    return range_check.verify_range(
        model, loaded, bindings, rtol=rtol, atol=atol, source=str(model_path), draws=draws
    )


def default_rtol(dtype: str | None, tf32: bool) -> float | None:
    """The verification tolerance a plan's precision calls for (None: by the
    output's dtype, verify.RTOL)."""
    found = [r for r in (precision.RTOL.get(dtype), TF32_RTOL if tf32 else None) if r]
    return max(found, default=None)


def bundle_and_model(
    out_dir: str | os.PathLike,
    model_path: str | os.PathLike,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    _shape_option: str = "shapes",
):
    """(bundle, ONNX model, its primitive graph) for comparing the two; the
    shapes default to those the bundle was built with (a dynamic bundle's
    OPT), and a dynamic bundle takes any in its range.  InputError when the
    model's inputs and outputs are not the bundle's, naming the first that
    differs."""
    out_dir = _path(out_dir, "out_dir")
    model_path = _path(model_path, "model_path")
    shapes = check_shapes(shapes, _shape_option) if shapes is not None else None
    loaded = load(out_dir)
    model = pipeline.load(model_path, loaded.manifest.get("bound_inputs"), "bound_inputs")
    family = getattr(loaded, "family", None)
    if family is not None:
        binding = family.at("opt") if shapes is None else binding_of(family, shapes)
        shapes = range_check.input_shapes(loaded, binding)
    elif shapes is None:
        shapes = {k: tuple(v) for k, v in loaded.manifest.get("shapes", {}).items()}
    graph = pipeline.fission_model(model, shapes, str(model_path), option=_shape_option)
    _check_same_interface(graph, loaded, model_path, out_dir, shapes if family else None)
    return loaded, model, graph


def _check_same_interface(
    graph, loaded: Bundle, model_path: Path, out_dir: Path, shapes: Mapping | None = None
) -> None:
    """InputError naming the first input or output in which the model (with
    the shapes given) and the bundle (at ``shapes``, default its own) differ."""
    mine = {i.name: (tuple(i.type.shape), i.type.dtype) for i in graph.inputs}
    shapes = shapes or {}
    theirs = {k: (tuple(shapes.get(k, s)), d) for k, (s, d) in loaded.inputs.items()}

    def typed(io: tuple) -> str:
        return f"{io[1]}[{'x'.join(map(str, io[0]))}]"

    problem = None
    if set(mine) != set(theirs):
        only_model = sorted(set(mine) - set(theirs))
        only_bundle = sorted(set(theirs) - set(mine))
        problem = "inputs differ: " + "; ".join(
            [f"only the model has {n!r}" for n in only_model]
            + [f"only the bundle has {n!r}" for n in only_bundle]
        )
    else:
        for name, io in mine.items():
            if io != theirs[name]:
                problem = (
                    f"input {name!r} is {typed(io)} in the model but {typed(theirs[name])} "
                    "in the bundle"
                )
                if io[1] == theirs[name][1]:
                    problem += " (pass the shapes the bundle was built with)"
                break
    if problem is None and list(graph.outputs) != list(loaded.outputs):
        problem = f"outputs differ: {list(graph.outputs)} in the model, {list(loaded.outputs)} in the bundle"
    if problem is not None:
        raise InputError(f"{model_path} does not match the bundle {out_dir}: {problem}")


def _path(value, name: str) -> Path:
    """``value`` as a Path; InputError naming the argument ``name`` otherwise."""
    if isinstance(value, str) and not value:
        raise InputError(f"{name}: an empty path")
    try:
        return Path(value)
    except TypeError:
        raise InputError(
            f"{name}: expected a path (str or os.PathLike), got {type(value).__name__}"
        ) from None


def _count(value, name: str, least: int) -> int:
    """``value`` as an int >= ``least`` (a bool is not a count)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
        raise InputError(f"{name}={value!r}: expected an integer >= {least}")
    if value < least:
        raise InputError(f"{name}={value!r}: must be an integer >= {least}")
    return int(value)


def _plan_options(options, keywords: dict) -> PlanOptions:
    """The PlanOptions of ``optimize``: ``options``, or made from the keywords."""
    if options is not None:
        if not isinstance(options, PlanOptions):
            raise InputError(
                f"options: expected an orchestrate.plan.planner.PlanOptions, got "
                f"{type(options).__name__}"
            )
        if keywords:
            raise InputError(
                f"options and {', '.join(sorted(keywords))}: give the plan options "
                "as a PlanOptions or as keywords, not both"
            )
        return options
    known = PlanOptions.names()
    unknown = sorted(set(keywords) - set(known))
    if unknown:
        raise InputError(
            f"{unknown[0]}: no such argument of optimize (it takes model_path, out_dir, shapes, "
            f"options, trials, rtol, atol, progress, tune and the plan options "
            f"{', '.join(known)})"
        )
    return PlanOptions(**keywords)


def _report_md(plan: Plan, result: Report | None, family: Family | None = None) -> str:
    lines = [f"# orchestrate report: {plan.graph.name}", "", "## Summary", "", "```"]
    if family is not None:
        lines += explain.range_lines(family)
    lines += explain.summary_lines(plan)
    lines += ["```", "", "## Kernels", "", "```", explain.kernel_table(plan), "```", ""]
    lines += ["## Verification", ""]
    if result is None:
        lines.append("not run")
    else:
        if result.simulated:
            lines += [
                f"The kernels did not run: {result.simulated}. The outputs below are the "
                "plan's primitive graph run by orchestrate's numpy reference executor "
                "(its dtypes, rounded at every primitive): a check of the precision, "
                "not of the kernels; run `orchestrate verify` on a GPU for that.",
                "",
            ]
        verdict = "PASSED" if result.ok else "FAILED"
        lines += [
            "```",
            *result.lines(),
            "```",
            "",
            f"{verdict} (simulated)" if result.simulated else verdict,
        ]
    return "\n".join(lines) + "\n"
