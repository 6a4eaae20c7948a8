"""What each part of a GPU run costs, in seconds: the one place these figures live.

Each figure says where it comes from.  "measured" ones are read off the run
itself (the prepare step times its export, planning, loading, onnxruntime
check and torch build for every model, and the compile ahead of its
kernels); "assumed" ones are a GPU machine's and no GPU has measured them
here yet: they are predictions, and the caps (``cap``) keep a wrong one
from costing more than its step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    seconds: float
    source: str


# a child process: python3, imports (torch, onnx, orchestrate: 3-4 s measured
# on this project's 2-core CPU machine) and a CUDA context
PROCESS = Figure(8.0, "assumed: start, imports (3-4 s measured on a CPU) and a CUDA context")
# weights read from a bundle or built by torch, then copied to the GPU
HOST_MB_PER_S = Figure(2000.0, "assumed: MB/s from numpy or torch host memory onto the GPU")
# one Triton function compiled for the GPU's architecture, on one core.  The
# run measures it (the prepare step's compile ahead); at the first launch the
# JIT should find that compile in Triton's cache, but no GPU has shown that
# it does, so the bundle's step is priced as if it compiled every function
# again, one after another
COMPILE_FUNCTION = Figure(
    2.0, "assumed where the run did not compile: one Triton function for sm_90 on one core"
)
# the per-kernel records: triton.testing.do_bench's 10 ms warm-up + 40 ms
# of calls, its L2 flushes, and the launch around them
RECORD_KERNEL = Figure(0.15, "assumed: do_bench's 50 ms per kernel, with its flushes")
# torch.compile of a whole model (Inductor, cold caches), per mode
TORCH_COMPILE = Figure(45.0, "assumed: Inductor's cold compile of one model (mode default)")
MAX_AUTOTUNE = Figure(
    240.0, "assumed: Inductor's max-autotune, which benchmarks every candidate GEMM configuration"
)
# eager runs every launch from the host: a model's kernels take this each
EAGER_LAUNCH_MS = Figure(0.01, "assumed: ms of host time per eager kernel launch")
# the last step: the chart (matplotlib's import), records and files
FINISH = Figure(10.0, "assumed: chart, records and results written")
# a child the run waits for a little longer than projected: twice the
# projection, and at least this much beyond it
CAP_SLACK_S = 30.0
# an optional step projected beyond what is left still starts, capped at what
# is left, when at least this much is (the figures above may be pessimistic)
OPTIONAL_LEAST_S = 60.0


def cap(projected: float) -> float:
    """The hard limit of a step projected to take ``projected`` seconds."""
    return max(2 * projected, projected + CAP_SLACK_S)
