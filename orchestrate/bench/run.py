"""Benchmark one model: the bundle and each baseline, one after another, in one process.

Every runtime gets the same input sets (``orchestrate.check.verify.random_inputs``
with seeds 0..sets-1), the same warm-up and number of timed calls, the same
clock (``clock.py``), and its GPU memory measured around its preparation and
its calls.  A runtime is released before the next is made ready, so the
peaks do not add up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from orchestrate.bench import clock
from orchestrate.bench.floor import Floor, roofline_floor
from orchestrate.bench.ort_side import ort_runtime
from orchestrate.bench.runtimes import (
    ORCHESTRATE,
    ORT_CPU,
    ORT_CUDA,
    Ready,
    Unavailable,
    orchestrate_runtime,
)
from orchestrate.bench.stats import Stats
from orchestrate.bench.torch_side import MODES, _first_line, from_onnx, torch_runtimes
from orchestrate.check.verify import random_inputs
from orchestrate.cost.devices import get_device

NO_GPU_MEMORY = "no GPU: nothing to measure"


@dataclass
class Measured:
    key: str
    label: str
    stats: Stats | None = None
    peak_mem_mb: float | None = None
    memory_note: str | None = None  # why peak_mem_mb is None
    ready_s: float | None = None
    note: str = ""
    reason: str | None = None  # why it did not run


@dataclass
class ModelResult:
    name: str
    dtype: str | None
    measured: list[Measured]
    floor: Floor
    kernels: int
    verified: bool | None  # None: not checked here
    verify_note: str = ""
    # per output: the worst error of the bundle's answer ({"rel", "max_abs", "ok"})
    verify_errors: dict = field(default_factory=dict)
    # the input shapes timed, and for a dynamic bundle where they lie in its range
    shapes: dict = field(default_factory=dict)
    binding: str = ""

    def get(self, key: str) -> Measured | None:
        return next((m for m in self.measured if m.key == key), None)


@dataclass(frozen=True)
class Settings:
    runs: int = 20
    warmup: int = 3
    sets: int = 4  # input sets, rotated
    on_gpu: bool | None = None  # None: whether torch sees a CUDA GPU
    deadline: float | None = None  # time.time() after which no further runtime starts


def bench_model(
    name: str,
    bundle,
    model,
    graph,
    keys: Sequence[str],
    settings: Settings = Settings(),
    *,
    optimize_s: float | None = None,
    verified: bool | None = None,
    verify_note: str = "",
    torch_module: Callable[[], tuple[object, str]] | None = None,
    model_type: str | tuple[str, int, int] | None = None,
) -> ModelResult:
    """Time the bundle and the runtimes ``keys`` on ``model`` (ONNX) and
    ``graph`` (its primitive graph, as fissioned for the bundle's shapes).
    ``torch_module`` makes the torch baselines' module (default: onnx2torch
    on ``model``); ``model_type`` names an onnxruntime transformer type."""
    on_gpu = clock.cuda() if settings.on_gpu is None else settings.on_gpu
    plan = bundle.plan
    dtype = plan.options.dtype
    feed_sets = [random_inputs(graph, seed=s) for s in range(max(1, settings.sets))]
    inputs = [i.name for i in graph.inputs]
    make_torch = torch_runtimes(
        torch_module or (lambda: from_onnx(model)), inputs, feed_sets, keys, dtype, on_gpu
    )

    def make(key: str) -> Ready | Unavailable:
        if key == ORCHESTRATE:
            return orchestrate_runtime(bundle, feed_sets, optimize_s)
        if key in MODES:
            return make_torch(key)
        if key in (ORT_CUDA, ORT_CPU):
            return ort_runtime(key, model, feed_sets, dtype, model_type, on_gpu)
        return Unavailable(key, "unknown runtime")

    measured = []
    for key in (ORCHESTRATE, *[k for k in keys if k != ORCHESTRATE]):
        if settings.deadline is not None and time.time() > settings.deadline:
            measured.append(Measured(key, key, reason="not run: the time budget was spent"))
        else:
            measured.append(measure(key, make, len(feed_sets), settings, on_gpu))
    floor_graph, binding = _timed_graph(bundle, feed_sets[0])
    floor = roofline_floor(floor_graph, get_device(plan.device), tf32=plan.options.tf32)
    kernels = sum(1 for k in plan.kernels if k.template != "view")
    shapes = {i.name: list(i.type.shape) for i in graph.inputs}
    return ModelResult(
        name, dtype, measured, floor, kernels, verified, verify_note, shapes=shapes, binding=binding
    )


def _timed_graph(bundle, feeds) -> tuple[object, str]:
    """The bundle's primitive graph at the shapes timed (a dynamic bundle's
    at the binding ``feeds`` give) and, for a dynamic one, that binding
    within its range."""
    family = getattr(bundle, "family", None)
    if family is None:
        return bundle.graph, ""
    from orchestrate.shapes.family import named, ranged

    at = bundle.binding(feeds)
    return bundle.graph_at(
        at
    ), f"{named(family.dims, at)} of the bundle's range {ranged(family.dims)}"


def measure(key: str, make, sets: int, settings: Settings, on_gpu: bool) -> Measured:
    """Make runtime ``key`` ready and time it; a failure is its reason."""
    with clock.PeakMemory(on_gpu) as memory:
        try:
            got = make(key)
        except Exception as e:  # noqa: BLE001 - a runtime that breaks is reported, not fatal
            got = Unavailable(key, f"failed to start: {_first_line(e)}")
        if isinstance(got, Unavailable):
            return Measured(key, key, reason=got.reason)
        try:
            times = clock.time_calls(got.call, sets, settings.runs, settings.warmup, on_gpu)
        except Exception as e:  # noqa: BLE001
            return Measured(
                key, got.label, ready_s=got.ready_s, reason=f"failed while timed: {_first_line(e)}"
            )
    note = got.memory_note if on_gpu else NO_GPU_MEMORY
    out = Measured(
        key,
        got.label,
        Stats.of(times),
        memory.mb if got.memory_note is None else None,
        note if (got.memory_note or not on_gpu) else None,
        got.ready_s,
        got.note,
    )
    del got
    clock.release(on_gpu)
    return out
