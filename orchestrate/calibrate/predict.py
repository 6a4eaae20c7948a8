"""A measured program's time as the cost model predicts it.

Each measurement row names a program, a GPU and the runtime that timed it.
The program is rebuilt (``cost/measurements.py``), planned for that GPU and
priced like any plan; which plan stands for the runtime:

* ``eager`` (PyTorch running the program op by op): the plan's *unfused*
  baseline with library kernels only (``--gemm-backends library``): one
  kernel per PyTorch op (an ONNX node, or the nodes the exporter wrote for
  one op: ``torch_ops.py``), cuBLAS for matmuls, cuDNN for convolutions in TF32 (as
  PyTorch lets cuDNN by default; matmuls stay IEEE fp32, its other default;
  the plan stays at TF32 for convolutions under torch.compile too);
* ``torch.compile:cudagraphs`` (eager's kernels replayed from a CUDA graph,
  nothing fused): eager's kernels, launched by a graph replay;
* ``torch.compile`` in its default and ``reduce-overhead`` modes (Inductor:
  fused Triton kernels around cuBLAS and cuDNN calls, which take no
  epilogue): the plan with library GEMMs and convolutions only;
* ``torch.compile:max-autotune*`` (Inductor also tries Triton GEMM and
  convolution templates with fused epilogues): the plan itself, generated
  kernels and library calls competing; but a program with a convolution
  stays with library calls, as under the default mode.  Inductor has no
  Triton template for transposed, dilated or 1-D convolutions, and its 2-D
  and 3-D templates are not this project's convolution kernel: where they
  compete, on the H100 and the L4, every level-1 convolution measured
  within 4% of the default mode's time (cuDNN), while this project's
  generated convolution is priced 2-4x faster than that (a prediction no GPU
  has checked), so it cannot stand for Inductor's templates
  (docs/calibration.md);
* anything else (``orchestrate``, a kernel timed alone): the plan.

The model prices a plan replayed from a CUDA graph.  A measured time also
holds the host's time around the call, which ``harness.py`` adds: once per
call, and per kernel where the GPU would otherwise wait for the host; and,
in torch.compile's CUDA-graph modes, the copy of the call's inputs into the
graph's buffers (``harness.input_copy``).  Every
figure here is a prediction, set against a published measurement.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import onnx

from orchestrate.calibrate import harness, torch_ops
from orchestrate.calibrate.harness import Host, host, input_copy, runtime_class
from orchestrate.cost import learned, measurements
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
    # what the runtime runs, as priced: the plan standing for it, after the copy
    # of the inputs where it makes one (``harness.input_copy``)
    kernels: tuple[Terms, ...]
    host: Host  # the harness's host time around the call (calibrate/harness.py)


@dataclass(frozen=True)
class Skipped:
    """A row the model could not price, and why (one line)."""

    measurement: Measurement
    reason: str


def op_by_op(runtime: str) -> bool:
    """Whether the runtime runs the program one kernel per op (eager's kernels)."""
    return runtime_class(runtime) in ("eager", "cudagraphs")


def _convolves(m: Measurement) -> bool:
    return any(n["op"] in CONVS for n in m.graph["nodes"])


def generated_gemms(m: Measurement) -> bool:
    """Whether row ``m``'s runtime may run a GEMM or attention as a generated
    kernel rather than a library call: torch.compile's max-autotune modes,
    in a program without a convolution (the module doc)."""
    return (
        runtime_class(m.runtime) == "compile" and "max-autotune" in m.runtime and not _convolves(m)
    )


def options_for(m: Measurement) -> PlanOptions:
    """The plan options standing for the row's runtime (see the module doc):
    TF32 where the program has a convolution, as PyTorch lets cuDNN by default
    (eager and torch.compile alike: Inductor calls cuDNN for convolutions)."""
    backends = ("triton", "library") if generated_gemms(m) else ("library",)
    return PlanOptions(
        device=m.gpu,
        gemm_backends=backends,
        tf32=_convolves(m),
        time_limit=30.0,
        reproducible=True,
    )


def program_key(m: Measurement) -> str:
    """The same program at the same sizes (its rows on every GPU and runtime)."""
    return hashlib.sha1(json.dumps(m.graph, sort_keys=True).encode()).hexdigest()


class Graphs:
    """Each program's primitive graph and the ops PyTorch ran its nodes as
    (``torch_ops.groups``), made once for all its rows."""

    def __init__(self):
        self.made: dict[str, tuple[Graph, dict[str, str]]] = {}

    def __call__(self, m: Measurement) -> tuple[Graph, dict[str, str]]:
        key = program_key(m)
        if key not in self.made:
            model: onnx.ModelProto = measurements.model(m)
            self.made[key] = pipeline.fission_model(model, None, m.program), torch_ops.groups(model)
        return self.made[key]


# The most weight elements a program is rebuilt with (random values, held
# three times over while it is made): 2**27 fp32 elements are 512 MB.  A
# 32768 x 32768 layer (4 GB) is skipped, with this reason.
MAX_WEIGHT_ELEMENTS = 2**27


def priced(m: Measurement, graphs: Graphs, cost: str) -> tuple[Terms, ...] | str:
    """The kernels standing for row ``m``'s runtime on its GPU, as priced
    (see the module doc), or why there are none (one line)."""
    weights = sum(math.prod(t["shape"]) for t in m.graph["initializers"])
    if weights > MAX_WEIGHT_ELEMENTS:
        return f"weights of {weights:,} elements: more than calibrate rebuilds (2**27)"
    options = replace(options_for(m), cost=cost)
    try:
        graph, ops = graphs(m)
        target = options.target()
        prices = options.prices(graph, target.device)
        if op_by_op(m.runtime):  # one kernel per PyTorch op, library GEMMs
            chosen = [(p.kernel, p.time_us) for p in unfused(graph, target, prices, ops)]
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


def _plan_key(m: Measurement) -> tuple[str, str, bool, bool]:
    """Rows whose kernels are the same: one program, one GPU, op by op or
    not, generated GEMMs or not."""
    return program_key(m), m.gpu, op_by_op(m.runtime), generated_gemms(m)


def ran(m: Measurement, kernels: tuple[Terms, ...]) -> tuple[Terms, ...]:
    """What row ``m``'s runtime runs of its plan's ``kernels``: the copy of
    its inputs first, where the runtime makes one (``harness.input_copy``)."""
    return input_copy(m) + kernels


def prediction(
    m: Measurement, kernels: tuple[Terms, ...] | str, floors: dict | None = None
) -> Prediction | Skipped:
    """Row ``m`` predicted from its kernels (``priced``) and the host's time
    around them (``harness.host``, from the timing files' ``floors``)."""
    if isinstance(kernels, str):
        return Skipped(m, kernels)
    h = host(m, floors)
    model_us = sum(k.time_us for k in kernels)
    runs = ran(m, kernels)
    return Prediction(m, h.total(k.time_us for k in runs), model_us, runs, h)


def predict(
    m: Measurement, graphs: Graphs | None = None, cost: str = "analytic", floors=None
) -> Prediction | Skipped:
    """The model's time for row ``m`` (see the module doc), or why there is
    none; ``cost`` as ``PlanOptions.cost`` (``analytic`` by default)."""
    return prediction(m, priced(m, graphs or Graphs(), cost), floors)


def _price_all(work: tuple[list[Measurement], str]) -> list[tuple[Terms, ...] | str]:
    rows, cost = work
    graphs = Graphs()
    return [priced(m, graphs, cost) for m in rows]


def predict_all(
    rows: Iterable[Measurement],
    progress=None,
    cost: str = "analytic",
    jobs: int = 1,
    among: Iterable[Measurement] = (),
) -> list[Prediction | Skipped]:
    """Every row's prediction (``progress(done, total)`` over the distinct
    plans); each program is made once, and planned once per standing plan
    (``_plan_key``), in ``jobs`` processes.  Each timing file's floor
    (``harness.floors``) is read from its small programs among ``rows`` and
    ``among`` (the rest of the files' rows), which are planned too."""
    rows = list(rows)
    files = {harness.timing_file(m) for m in rows}
    ids = {m.id for m in rows}
    floor_rows = [m for m in rows if harness.small(m)] + [
        m for m in among if m.id not in ids and harness.timing_file(m) in files and harness.small(m)
    ]
    first: dict[tuple, Measurement] = {}
    for m in rows + floor_rows:
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
    floors = harness.floors(
        (m, [k.time_us for k in ran(m, kernels)])
        for m in floor_rows
        if not isinstance(kernels := found[_plan_key(m)], str)
    )
    return [prediction(m, found[_plan_key(m)], floors) for m in rows]
