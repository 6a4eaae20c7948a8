"""One clock for every runtime, and the GPU memory each one takes.

On a GPU every call is bracketed by CUDA events on the current stream and
the stream synchronised after it, so each sample is the device time of one
call, whatever the runtime (host work the GPU waits for included, as a user
pays it).  Without a GPU the clock is ``time.perf_counter`` around the call.
Warm-up calls are made before the first sample and not timed.  Inputs rotate:
call ``i`` gets input set ``i % sets``, so no runtime is timed on one cached
input.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

CUDA_EVENTS = "CUDA events"
HOST_CLOCK = "time.perf_counter"


def cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def clock_name(on_gpu: bool) -> str:
    return CUDA_EVENTS if on_gpu else HOST_CLOCK


def time_calls(
    call: Callable[[int], object], sets: int, runs: int, warmup: int, on_gpu: bool
) -> list[float]:
    """Milliseconds of ``runs`` calls of ``call(input set)``, after ``warmup``."""
    for i in range(warmup):
        call(i % sets)
    times = []
    if on_gpu:
        import torch

        torch.cuda.synchronize()
        for i in range(runs):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            call(i % sets)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return times
    for i in range(runs):
        t = time.perf_counter()
        call(i % sets)
        times.append((time.perf_counter() - t) * 1e3)
    return times


class PeakMemory:
    """``with PeakMemory(on_gpu) as m: ...`` then ``m.mb``: the most GPU memory
    that torch's allocator held inside the block beyond what it held before
    (None without a GPU).  Memory allocated outside torch (onnxruntime's own
    CUDA arena, cuBLAS workspaces created earlier) is not seen."""

    def __init__(self, on_gpu: bool):
        self.on_gpu, self.mb = on_gpu, None

    def __enter__(self) -> PeakMemory:
        if self.on_gpu:
            import torch

            gc.collect()
            torch.cuda.synchronize()
            self._before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc) -> None:
        if self.on_gpu:
            import torch

            torch.cuda.synchronize()
            self.mb = (torch.cuda.max_memory_allocated() - self._before) / 2**20


def release(on_gpu: bool) -> None:
    """Give back what the runtime just timed left cached, before the next."""
    gc.collect()
    if on_gpu:
        import torch

        torch.cuda.empty_cache()
