"""`orchestrate bench`: the bundle side by side with onnxruntime.

Both run the same random inputs (orchestrate.verify's), after warm-up runs.
On a GPU the bundle is timed as a replayed CUDA graph with CUDA events, and
onnxruntime with its CUDA execution provider and inputs/outputs bound on the
device (IO binding), so neither side pays host copies.  Without a GPU the
bundle runs in Triton's interpreter: its time says nothing about GPU speed, and
the report says so.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import onnx

from orchestrate import onnxrt
from orchestrate.verify import random_inputs


@dataclass(frozen=True)
class Timing:
    runtime: str
    times_ms: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def p90(self) -> float:
        ordered = sorted(self.times_ms)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def time_bundle(bundle, feeds: dict[str, np.ndarray], runs: int, warmup: int) -> Timing:
    program = bundle.program
    if program.interpret:
        for _ in range(warmup):
            program.run(feeds)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            program.run(feeds)
            times.append((time.perf_counter() - t) * 1e3)
        return Timing("orchestrate (Triton interpreter)", tuple(times))
    import torch

    for _ in range(max(warmup, 2)):  # the second run captures the CUDA graph
        program.run(feeds)
    graph = program._graph
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if graph is not None:
            graph.replay()
        else:
            program._execute({k: program._tensor(v) for k, v in feeds.items()})
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return Timing("orchestrate (CUDA graph)" if graph is not None else "orchestrate", tuple(times))


def time_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray], runs: int,
                     warmup: int, cuda: bool) -> Timing:  # fmt: skip
    providers = ["CUDAExecutionProvider"] if cuda else ["CPUExecutionProvider"]
    session = onnxrt.session(model, providers)
    names = [o.name for o in session.get_outputs()]
    if cuda:
        import onnxruntime as ort

        binding = session.io_binding()
        for k, v in feeds.items():
            binding.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0))
        for n in names:
            binding.bind_output(n, "cuda")

        def once():
            session.run_with_iobinding(binding)
    else:

        def once():
            session.run(names, feeds)

    for _ in range(warmup):
        once()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        once()
        times.append((time.perf_counter() - t) * 1e3)
    label = "onnxruntime (CUDA)" if cuda else "onnxruntime (CPU)"
    return Timing(label, tuple(times))


def bench(
    bundle, model: onnx.ModelProto, graph, *, runs: int = 20, warmup: int = 3
) -> list[Timing]:
    feeds = random_inputs(graph, seed=0)
    out = [time_bundle(bundle, feeds, runs, warmup)]
    cuda = not bundle.interpret
    try:
        out.append(time_onnxruntime(model, feeds, runs, warmup, cuda))
    except Exception as e:  # noqa: BLE001 - a missing CUDA provider falls back to the CPU
        if not cuda:
            raise
        del e
        out.append(time_onnxruntime(model, feeds, runs, warmup, False))
    return out


def table(timings: list[Timing], interpret: bool) -> list[str]:
    base = timings[0].median
    lines = [f"{'runtime':<34}{'median ms':>11}{'p90 ms':>10}{'time / orchestrate':>20}"]
    for t in timings:
        lines.append(f"{t.runtime:<34}{t.median:>11.3f}{t.p90:>10.3f}{t.median / base:>19.3g}x")
    if interpret:
        lines.append("no GPU: the bundle ran in Triton's interpreter; its time says nothing "
                     "about GPU speed")  # fmt: skip
    return lines
