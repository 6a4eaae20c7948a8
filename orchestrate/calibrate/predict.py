"""A measured program's time as the cost model predicts it.

Each measurement row names a program, a GPU and the runtime that timed it.
The program is rebuilt (``cost/measurements.py``), planned for that GPU and
priced like any plan; which plan stands for the runtime:

* ``eager`` (PyTorch running the program op by op): the plan's *unfused*
  baseline with library kernels only (``--gemm-backends library``): one
  kernel per ONNX op, cuBLAS for matmuls, cuDNN for convolutions in TF32 (as
  PyTorch lets cuDNN by default; matmuls stay IEEE fp32, its other default);
* ``torch.compile:*`` (Inductor: fused Triton kernels, library GEMMs
  unless autotuned otherwise): the plan itself, generated kernels and
  library calls competing;
* anything else (``orchestrate``, a kernel timed alone): the plan.

The model prices a plan replayed from a CUDA graph.  The measured runtimes
launch from the host: eager pays ``EAGER_OP_HOST_US`` per op, Inductor
without CUDA graphs ``COMPILE_KERNEL_HOST_US`` per kernel where the GPU
would otherwise wait for it (``cost/figures.py``); the prediction takes, per
kernel, the larger of the kernel's time and that host time.  Every figure
here is a prediction, set against a published measurement.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace

import onnx

from orchestrate.cost import learned, measurements
from orchestrate.cost.figures import COMPILE_KERNEL_HOST_US, EAGER_OP_HOST_US
from orchestrate.cost.learned import Terms
from orchestrate.cost.measurements import Measurement
from orchestrate.errors import OrchestrateError
from orchestrate.ilp.baselines import unfused
from orchestrate.ir import Graph
from orchestrate.kernels.spec import VIEW
from orchestrate.plan import pipeline
from orchestrate.plan.planner import PlanOptions
from orchestrate.text import shown

CONVS = {"Conv", "ConvTranspose"}


@dataclass(frozen=True)
class Prediction:
    measurement: Measurement
    predicted_us: float  # as the runtime would run it (see the module doc)
    model_us: float  # the plan's own time (CUDA-graph replay)
    kernels: tuple[Terms, ...]  # of the plan standing for the runtime, as priced
    host_us: float  # what the host takes per kernel (see the module doc)


@dataclass(frozen=True)
class Skipped:
    """A row the model could not price, and why (one line)."""

    measurement: Measurement
    reason: str


def runtime_class(runtime: str) -> str:
    """``eager``, ``compile`` or ``other``."""
    if runtime == "eager":
        return "eager"
    if runtime.startswith("torch.compile"):
        return "compile"
    return "other"


def host_us(runtime: str) -> float:
    """The host time per kernel a runtime waits on (0: replayed from a CUDA graph)."""
    return {"eager": EAGER_OP_HOST_US, "compile": COMPILE_KERNEL_HOST_US}.get(
        launcher(runtime), 0.0
    )


def launcher(runtime: str) -> str:
    """Who launches the kernels (the learned model's ``RUNTIMES``): ``eager``
    (the host, op by op), ``compile`` (the host, kernel by kernel) or ``graph``
    (a CUDA graph replay: torch.compile's reduce-overhead and max-autotune
    modes, and anything timed alone)."""
    if runtime == "eager":
        return "eager"
    if runtime_class(runtime) != "compile":
        return "graph"
    mode = runtime.partition(":")[2]
    graphs = "reduce-overhead" in mode or mode in ("max-autotune", "cudagraphs")
    return "graph" if graphs else "compile"


def options_for(m: Measurement) -> PlanOptions:
    """The plan options standing for the row's runtime (see the module doc)."""
    ops = {n["op"] for n in m.graph["nodes"]}
    if runtime_class(m.runtime) == "eager":
        return PlanOptions(
            device=m.gpu,
            gemm_backends=("library",),
            tf32=bool(ops & CONVS),
            time_limit=30.0,
            reproducible=True,
        )
    return PlanOptions(device=m.gpu, time_limit=30.0, reproducible=True)


def program_key(m: Measurement) -> str:
    """The same program at the same sizes (its rows on every GPU and runtime)."""
    return hashlib.sha1(json.dumps(m.graph, sort_keys=True).encode()).hexdigest()


class Graphs:
    """Each program's primitive graph, made once for all its rows."""

    def __init__(self):
        self.made: dict[str, Graph] = {}

    def __call__(self, m: Measurement) -> Graph:
        key = program_key(m)
        if key not in self.made:
            model: onnx.ModelProto = measurements.model(m)
            self.made[key] = pipeline.fission_model(model, None, m.program)
        return self.made[key]


def priced(m: Measurement, graphs: Graphs, cost: str) -> tuple[Terms, ...] | str:
    """The kernels standing for row ``m``'s runtime on its GPU, as priced
    (see the module doc), or why there are none (one line)."""
    options = replace(options_for(m), cost=cost)
    try:
        graph = graphs(m)
        target = options.target()
        prices = options.prices(graph, target.device)
        if runtime_class(m.runtime) == "eager":  # one kernel per op, library GEMMs
            chosen = [(p.kernel, p.time_us) for p in unfused(graph, target, prices)]
        else:
            planned = pipeline.plan_graph(graph, options)
            chosen = [(s, k.predicted_us) for s, k in zip(planned.specs, planned.plan.kernels)]
        return tuple(
            learned.terms(graph, spec, prices.cost(spec), us)
            for spec, us in chosen
            if spec.template != VIEW
        )
    except OrchestrateError as e:
        return shown(str(e))


def _plan_key(m: Measurement) -> tuple[str, str, bool]:
    """Rows whose kernels are the same: one program, one GPU, eager or not."""
    return program_key(m), m.gpu, runtime_class(m.runtime) == "eager"


def prediction(m: Measurement, kernels: tuple[Terms, ...] | str) -> Prediction | Skipped:
    """Row ``m`` predicted from its kernels (``priced``)."""
    if isinstance(kernels, str):
        return Skipped(m, kernels)
    host = host_us(m.runtime)
    model_us = sum(k.time_us for k in kernels)
    # each kernel waits for its launch from the host where that is longer
    predicted = sum(max(k.time_us, host) for k in kernels)
    return Prediction(m, predicted, model_us, kernels, host)


def predict(
    m: Measurement, graphs: Graphs | None = None, cost: str = "analytic"
) -> Prediction | Skipped:
    """The model's time for row ``m`` (see the module doc), or why there is
    none; ``cost`` as ``PlanOptions.cost`` (``analytic`` by default)."""
    return prediction(m, priced(m, graphs or Graphs(), cost))


def _price_all(work: tuple[list[Measurement], str]) -> list[tuple[Terms, ...] | str]:
    rows, cost = work
    graphs = Graphs()
    return [priced(m, graphs, cost) for m in rows]


def predict_all(
    rows: Iterable[Measurement], progress=None, cost: str = "analytic", jobs: int = 1
) -> list[Prediction | Skipped]:
    """Every row's prediction (``progress(done, total)`` over the distinct
    plans); each program is made and each (program, GPU, eager or not)
    planned once, in ``jobs`` processes."""
    rows = list(rows)
    first: dict[tuple, Measurement] = {}
    for m in rows:
        first.setdefault(_plan_key(m), m)
    # a worker takes whole programs, so that each fission is made once
    by_program: dict[str, list[Measurement]] = {}
    for m in first.values():
        by_program.setdefault(program_key(m), []).append(m)
    batches = [(ms, cost) for ms in by_program.values()]
    found: dict[tuple, tuple[Terms, ...] | str] = {}
    done = 0
    if jobs > 1 and len(batches) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=context) as pool:
            for (ms, _), out in zip(batches, pool.map(_price_all, batches, chunksize=4)):
                found.update(zip(map(_plan_key, ms), out))
                done += len(ms)
                if progress is not None:
                    progress(done, len(first))
    else:
        for batch in batches:
            found.update(zip(map(_plan_key, batch[0]), _price_all(batch)))
            done += len(batch[0])
            if progress is not None:
                progress(done, len(first))
    return [prediction(m, found[_plan_key(m)]) for m in rows]
