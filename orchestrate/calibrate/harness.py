"""What a measured program's time holds besides its kernels: the host's
time around the call, and the copy of its inputs a CUDA graph makes.

A published time is what a harness measured around one call of the program
(KernelBench: CUDA events around ``model(*inputs)``, mean of 100 trials).
While the host is still in Python, the dispatcher or torch.compile's guards
and CUDA-graph bookkeeping, the GPU waits.  How long depends on who launches
the kernels (``launcher``) and on the machine that ran the harness: the
fastest program timed on an H100 at together.ai took 12.5 µs eager, 39.6 µs
under torch.compile's default mode and 69.8 µs under reduce-overhead, and
the same programs took 2-3 times as long on Modal's hosts, so no one figure
fits every timing file.

So each timing file's **floor** is read from the file itself, from its
*small* programs (every tensor of one together under ``SMALL_BYTES``, so
its GPU time is a few microseconds on any GPU here and what was measured is
almost all host).  Of a floor, ``figures.HARNESS_PER_KERNEL`` recurs per
kernel (a launch, a dispatch) and the rest is paid once per call:

    predicted = floor x (1 - share) + sum over kernels of max(kernel, floor x share)

Each small program, with the kernels its plan has, implies a floor (its time
over ``1 - share + share x kernels``); the file's floor is the one of these
with which the formula above misses the file's small programs least (the
sum of ``|log(predicted / measured)|``): about their median, so neither the
few programs far below the rest (a file's 6 µs outliers among 100 µs
programs) nor a slow tail moves it, and an eager program of three ops is not
taken for a slower host.  A file without a small program (the
post-2025-07-02 sizes, where everything takes milliseconds) takes the
default floor of its launcher (``figures.HARNESS_FLOOR_US``: together.ai's
H100 figures).

Eager's share is 1 (each op pays the whole dispatch), torch.compile's 0.25
(a Triton launch per kernel after the guards), a CUDA graph's 0.02 (a graph
node per kernel after the replay's bookkeeping); the shares come from the
same H100 files: programs of 1 to 8 kernels with no GPU time to speak of.

torch.compile's CUDA-graph modes (its ``cudagraphs`` backend, the
``reduce-overhead`` and ``max-autotune`` modes: CUDA-graph trees) also copy
every input of the call that is not a parameter or buffer of the module
into the graph's own buffers before each replay (``CUDAGraphNode.run``, one
``torch._foreach_copy_``).  That is GPU time, not host time: an elementwise
program over a 6.4 GB input moves twice the bytes it moves eager.
``input_copy`` is that kernel, priced by ``cost/roofline.copy``.  Measured:
the H100 PCIe's level-1 elementwise programs at 4096 x 393216 fp32 take
6.95-6.99 ms eager and under the default mode, 14.9-15.0 ms under
reduce-overhead (KernelBench's H100_PCIe files).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrate.cost import roofline
from orchestrate.cost.devices import get_device
from orchestrate.cost.figures import (
    HARNESS_FLOOR_US,
    HARNESS_PER_KERNEL,
    SMALL_BYTES,
)
from orchestrate.cost.learned import Terms, cost_terms
from orchestrate.cost.measurements import Measurement


def runtime_class(runtime: str) -> str:
    """``eager``, ``cudagraphs`` (torch.compile's backend that replays eager's
    kernels from a CUDA graph, fusing nothing), ``compile`` (Inductor) or ``other``."""
    if runtime == "eager":
        return "eager"
    if runtime == "torch.compile:cudagraphs":
        return "cudagraphs"
    if runtime.startswith("torch.compile"):
        return "compile"
    return "other"


def launcher(runtime: str) -> str:
    """Who launches the kernels (the learned model's ``RUNTIMES``): ``eager``
    (the host, op by op), ``compile`` (the host, kernel by kernel) or ``graph``
    (a CUDA-graph replay: torch.compile's cudagraphs backend, its
    reduce-overhead and max-autotune modes, and anything timed alone)."""
    if runtime == "eager":
        return "eager"
    if runtime_class(runtime) != "compile":
        return "graph"
    mode = runtime.partition(":")[2]
    return "graph" if "reduce-overhead" in mode or mode == "max-autotune" else "compile"


def copies_inputs(runtime: str) -> bool:
    """Whether the runtime copies the call's inputs into a CUDA graph's
    buffers before replaying it: torch.compile's CUDA-graph modes."""
    return runtime.startswith("torch.compile") and launcher(runtime) == "graph"


def input_copy(m: Measurement) -> tuple[Terms, ...]:
    """The copy of row ``m``'s inputs (not its weights) that its runtime
    makes before the graph replay (the module doc), as one kernel's terms;
    none where the runtime makes none."""
    inputs = m.graph["inputs"]
    if not copies_inputs(m.runtime) or not inputs:
        return ()
    sizes = [_elements(t) for t in inputs]
    cost = roofline.copy(sum(map(_bytes, inputs)), sum(sizes), get_device(m.gpu))
    dtype = max(zip(sizes, (t["dtype"] for t in inputs)))[1]
    return (cost_terms("pointwise", dtype, cost, 0, sum(sizes)),)


@dataclass(frozen=True)
class Host:
    """The host's time around one call: once per call, and per kernel."""

    call_us: float
    per_kernel_us: float

    def total(self, kernels: Iterable[float]) -> float:
        """A call of kernels taking these GPU times, as the harness measures it."""
        return self.call_us + sum(max(k, self.per_kernel_us) for k in kernels)


NONE = Host(0.0, 0.0)


def timing_file(m: Measurement) -> tuple[str, str, str]:
    """The file a row's figure comes from (and the machine that made it)."""
    return (m.source.repo, m.source.commit, m.source.timing)


def nbytes(m: Measurement) -> int:
    """Every tensor of the program (inputs, outputs, weights) together."""
    return sum(_bytes(t) for part in ("inputs", "outputs", "initializers") for t in m.graph[part])


def _elements(t: dict) -> int:
    """A described tensor's elements (its fixed dimensions)."""
    return math.prod(int(d) for d in t["shape"] if isinstance(d, int))


def _bytes(t: dict) -> int:
    return _elements(t) * _itemsize(t["dtype"])


def _itemsize(dtype: str) -> int:
    import numpy as np

    return np.dtype(dtype).itemsize


def small(m: Measurement) -> bool:
    """Whether row ``m`` is one its timing file's floor is read from (the
    module doc): a small program, from a timing file, launched by a host."""
    return bool(m.source.timing) and host(m) is not NONE and nbytes(m) < SMALL_BYTES


def floors(
    rows: Iterable[tuple[Measurement, Sequence[float]]],
) -> dict[tuple[str, str, str], float]:
    """Each timing file's floor (the module doc), from its small programs:
    ``rows`` are (row, the GPU times of the kernels it runs); rows that are
    not ``small`` are passed over."""
    by_file: dict[tuple[str, str, str], list[tuple[float, Sequence[float], float]]] = {}
    for m, kernels in rows:
        if small(m) and kernels:
            share = HARNESS_PER_KERNEL[launcher(m.runtime)]
            by_file.setdefault(timing_file(m), []).append((m.time_us, kernels, share))
    return {key: _fit(programs) for key, programs in by_file.items()}


def _fit(programs: Sequence[tuple[float, Sequence[float], float]]) -> float:
    """Of the floors the programs (time, kernel times, share) imply, the one
    that misses them least (the module doc); ties to the lowest."""
    implied = sorted({t / (1 - share + share * len(k)) for t, k, share in programs})

    def miss(floor: float) -> float:
        return sum(
            abs(math.log(Host(floor * (1 - share), floor * share).total(k) / t))
            for t, k, share in programs
        )

    return min(implied, key=miss)


def host(m: Measurement, floors_us: dict[tuple[str, str, str], float] | None = None) -> Host:
    """The host's time around row ``m``'s call (the module doc)."""
    who = launcher(m.runtime)
    if m.runtime == "orchestrate" or runtime_class(m.runtime) == "other":
        return NONE
    floor = (floors_us or {}).get(timing_file(m), HARNESS_FLOOR_US[who])
    share = HARNESS_PER_KERNEL[who]
    return Host(floor * (1 - share), floor * share)
