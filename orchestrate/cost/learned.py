"""The learned cost model: a correction of the analytic one, after AutoTVM.

Gradient-boosted trees (LightGBM) predict ``log(measured / analytic)`` of a
program of kernels from features of its kernels (the dominant kernel's
template, the dtype, bytes, flops, the length of its dot products, the
roofline's memory, compute and latency terms, its waves over the SMs; the
share of the program's time in the dominant kernel and in each common
template), of the device (bandwidth, peaks, SMs, architecture) and of the runtime that launches
it (eager: the host launches each op; compile: each kernel; graph: a CUDA
graph replays them).  A program of one kernel is a kernel: the planner asks
for each kernel's correction as a program of one, replayed from a CUDA graph.

The analytic model stays the default; ``--cost learned`` multiplies each
kernel's analytic time by ``exp(correction)`` (``Prices``'s ``scale``), so the
linear program is unchanged.  Launch configurations are still ranked by the
analytic model (``Ranker``): the correction is one factor per kernel, not a
new ordering of its tile sizes.

A model file is JSON: ``format``, the feature names and categories it was
trained with, ``data`` (the sha256 of the training rows), ``trained_on`` (their
GPUs) and LightGBM's own text model.  Training and its evaluation across GPUs
are ``orchestrate/calibrate/learn.py``; this module needs LightGBM only when a
model is used.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orchestrate.cost.devices import Device
from orchestrate.errors import InputError
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec

FORMAT = "orchestrate-learned-cost/1"
# the model shipped with orchestrate (``--cost learned``), trained on data/measurements
PACKAGED = Path(__file__).with_name("learned.json")
TEMPLATES = (
    "pointwise",
    "row_reduce",
    "scan",
    "matmul",
    "conv",
    "window",
    "attention",
    "merged_matmul",
    "norm_matmul",
    "norm_merged_matmul",
    "low_rank",
    "library_matmul",
    "library_conv",
    "library_attention",
)
# the templates whose share of a program's analytic time is a feature each
SHARED = (
    "library_conv",
    "library_matmul",
    "pointwise",
    "row_reduce",
    "window",
    "scan",
    "conv",
    "matmul",
)
RUNTIMES = ("eager", "compile", "graph")  # the host launches each op, each kernel, or none
DTYPES = ("float32", "float16", "bfloat16", "other")
FEATURES = (
    "template",
    "runtime",
    "dtype",
    "kernels",
    "log_bytes",
    "log_flops",
    "dot_share",
    "log_reduction",
    "log_outputs",
    "log_memory_us",
    "log_compute_us",
    "log_latency_us",
    "log_model_us",
    "log_call_us",
    "log_host_us",
    "waves",
    "log_intensity",
    "log_bandwidth",
    "log_fp32",
    "log_tf32",
    "log_fp16",
    "sms",
    "arch",
    "main_share",
    *(f"share_{t}" for t in SHARED),
)
CATEGORICAL = ("template", "runtime", "dtype")


@dataclass(frozen=True)
class Terms:
    """What the learned model reads of one priced kernel."""

    template: str
    dtype: str  # of what it writes
    bytes: int
    flops: int
    dots: int  # of the flops, dot products (tensor cores where the dtype allows)
    outputs: int  # elements written
    memory_us: float
    compute_us: float
    latency_us: float
    blocks: int
    time_us: float  # the analytic time


def terms(graph: Graph, spec: KernelSpec, cost, time_us: float | None = None) -> Terms:
    """The terms of ``spec`` as the analytic model priced it (``cost``, a
    ``roofline.Cost``; ``time_us``: its price with optional outputs, if any)."""
    from orchestrate.cost.roofline import split_flops

    dots, _ = split_flops(graph, spec)
    return cost_terms(
        spec.template,
        str(np.dtype(graph.types[spec.outputs[0]].dtype)) if spec.outputs else "other",
        cost,
        dots,
        sum(graph.types[t].size for t in spec.outputs),
        time_us,
    )


def cost_terms(
    template: str, dtype: str, cost, dots: int, outputs: int, time_us: float | None = None
) -> Terms:
    """The terms of a kernel priced as ``cost`` (a ``roofline.Cost``), of
    ``dots`` dot flops, writing ``outputs`` elements of ``dtype``."""
    return Terms(
        template,
        dtype,
        cost.bytes,
        cost.flops,
        dots,
        outputs,
        cost.memory_us,
        cost.compute_us,
        cost.latency_us,
        cost.blocks,
        cost.time_us if time_us is None else time_us,
    )


def _log(x: float) -> float:
    return math.log(max(float(x), 1e-6))


def features(
    kernels: Sequence[Terms],
    device: Device,
    runtime: str,
    call_us: float = 0.0,
    per_kernel_us: float = 0.0,
) -> list[float]:
    """The feature vector of a program of ``kernels`` on ``device``, launched
    by ``runtime`` (one of ``RUNTIMES``) whose host takes ``call_us`` once and
    ``per_kernel_us`` for each kernel (none for a plan's CUDA-graph replay)."""
    main = max(kernels, key=lambda t: t.time_us)
    total = lambda f: sum(getattr(t, f) for t in kernels)
    time_us = total("time_us") or 1.0
    share = lambda template: sum(t.time_us for t in kernels if t.template == template) / time_us
    nbytes, flops, dots = total("bytes"), total("flops"), total("dots")
    template = TEMPLATES.index(main.template) if main.template in TEMPLATES else len(TEMPLATES)
    return [
        template,
        RUNTIMES.index(runtime),
        DTYPES.index(main.dtype if main.dtype in DTYPES else "other"),
        len(kernels),
        _log(nbytes + 1),
        _log(flops + 1),
        dots / flops if flops else 0.0,
        _log(main.dots / (2 * main.outputs) if main.outputs else 0.0),  # K of a dot
        _log(main.outputs + 1),
        _log(total("memory_us")),
        _log(total("compute_us")),
        _log(total("latency_us")),
        _log(total("time_us")),
        _log(call_us),
        _log(per_kernel_us * len(kernels)),
        main.blocks / device.sms,
        _log((flops + 1) / (nbytes + 1)),
        _log(device.bandwidth_gbs),
        _log(device.fp32_tflops),
        _log(device.tf32_tflops),
        _log(device.fp16_tflops),
        float(device.sms),
        float(device.arch),
        main.time_us / time_us,
        *(share(t) for t in SHARED),
    ]


@dataclass(frozen=True)
class LearnedModel:
    """A trained correction (see the module doc)."""

    booster: object  # lightgbm.Booster
    data: str  # sha256 of the training rows
    trained_on: tuple[str, ...]  # their GPUs
    source: str  # where it was read from ("" when just trained)

    def corrections(self, rows: Sequence[Sequence[float]]) -> list[float]:
        """``log(measured / analytic)`` predicted for each feature row."""
        if not rows:
            return []
        return [
            float(v) for v in self.booster.predict(np.array(rows, dtype=np.float64), num_threads=1)
        ]

    def scale(self, kernel: Terms, device: Device) -> float:
        """The factor on one kernel's analytic time in a plan (a CUDA-graph replay)."""
        return math.exp(self.corrections([features([kernel], device, "graph")])[0])

    def corrector(self, graph: Graph, device: Device):
        """``Prices``'s correction: (spec, analytic cost) -> factor."""
        return lambda spec, cost: self.scale(terms(graph, spec, cost), device)

    @property
    def name(self) -> str:
        """How a plan records the model it was priced with."""
        return f"learned {self.source or '(in memory)'} data sha256:{self.data[:16]}"

    def to_json(self) -> str:
        return (
            json.dumps(
                {
                    "format": FORMAT,
                    "features": list(FEATURES),
                    "categorical": list(CATEGORICAL),
                    "templates": list(TEMPLATES),
                    "runtimes": list(RUNTIMES),
                    "dtypes": list(DTYPES),
                    "data": self.data,
                    "trained_on": list(self.trained_on),
                    "lightgbm": self.booster.model_to_string(),
                },
                indent=1,
            )
            + "\n"
        )


def lightgbm():
    """The lightgbm module, or an InputError saying how to install it."""
    try:
        import lightgbm as lgb
    except ImportError:
        raise InputError(
            "the learned cost model needs LightGBM (pip install lightgbm, or "
            "pip install 'orchestrate[learned]')"
        ) from None
    return lgb


def rows_hash(lines: Sequence[str]) -> str:
    """The sha256 of training rows (their JSON lines, sorted: order-free)."""
    h = hashlib.sha256()
    for line in sorted(lines):
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()


def header(path: str | Path) -> dict:
    """A model file's JSON, checked to be one this orchestrate reads
    (InputError, one line naming the file, otherwise); LightGBM not needed."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such learned cost model") from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not a learned cost model ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"{path}: not a learned cost model ({FORMAT} expected)")
    expected = {
        "features": list(FEATURES),
        "templates": list(TEMPLATES),
        "runtimes": list(RUNTIMES),
        "dtypes": list(DTYPES),
    }
    for key, want in expected.items():
        if data.get(key) != want:
            raise InputError(f"{path}: trained on other {key} than this orchestrate reads")
    if not isinstance(data.get("lightgbm"), str) or not isinstance(data.get("data"), str):
        raise InputError(f"{path}: not a learned cost model (no lightgbm model or data hash)")
    return data


def load(path: str | Path) -> LearnedModel:
    """The model in ``path`` (read once per file content)."""
    path = Path(path)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = 0
    return _load(str(path), stamp)


@functools.lru_cache(maxsize=4)
def _load(path: str, stamp: int) -> LearnedModel:
    data = header(path)
    lgb = lightgbm()
    try:
        booster = lgb.Booster(model_str=data["lightgbm"])
    except Exception as e:  # noqa: BLE001 - LightGBM's own errors
        raise InputError(f"{path}: LightGBM cannot read its model ({e})") from None
    return LearnedModel(booster, data["data"], tuple(data.get("trained_on", ())), path)
