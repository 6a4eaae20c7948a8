"""What a benchmark times: a runtime made ready, or the reason it cannot run.

A ``Ready`` runtime is a call of one input set (by index: the sets are staged
on the runtime's device beforehand), the seconds it took to become ready
(optimize, convert, compile: whatever a user waits for before the first
answer), and, where torch's allocator cannot see its memory, why.  An
``Unavailable`` one says why in a sentence that goes into the table and the
JSON.  Each runtime has a key, the name the JSON uses:

    orchestrate                 the bundle (replayed CUDA graph on a GPU)
    torch-eager                 the model in PyTorch
    torch-compile               torch.compile, mode "default"
    torch-compile-max-autotune  torch.compile, mode "max-autotune"
    onnxruntime-cuda            onnxruntime's CUDA provider, IO binding, CUDA graph
    onnxruntime-cpu             onnxruntime's CPU provider
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

ORCHESTRATE = "orchestrate"
TORCH_EAGER = "torch-eager"
TORCH_COMPILE = "torch-compile"
TORCH_MAX_AUTOTUNE = "torch-compile-max-autotune"
ORT_CUDA = "onnxruntime-cuda"
ORT_CPU = "onnxruntime-cpu"
KEYS = (ORCHESTRATE, TORCH_EAGER, TORCH_COMPILE, TORCH_MAX_AUTOTUNE, ORT_CUDA, ORT_CPU)

# --against names (short and long) -> key
AGAINST = {
    "eager": TORCH_EAGER,
    "compile": TORCH_COMPILE,
    "compile-max-autotune": TORCH_MAX_AUTOTUNE,
    "max-autotune": TORCH_MAX_AUTOTUNE,
    "ort-cuda": ORT_CUDA,
    "ort-cpu": ORT_CPU,
    **{k: k for k in KEYS if k != ORCHESTRATE},
}
DEFAULT_GPU = (TORCH_EAGER, TORCH_COMPILE, TORCH_MAX_AUTOTUNE, ORT_CUDA)
DEFAULT_CPU = (TORCH_EAGER, TORCH_COMPILE, TORCH_MAX_AUTOTUNE, ORT_CUDA, ORT_CPU)

Feeds = Mapping[str, np.ndarray]


@dataclass
class Ready:
    key: str
    label: str  # what the table shows
    call: Callable[[int], object]  # run on input set i
    ready_s: float  # seconds to become ready (optimize / convert / compile, first calls)
    memory_note: str | None = None  # why torch.cuda cannot see its memory, if it cannot
    note: str = ""  # how it ran (source of the torch model, options, fallbacks)


@dataclass(frozen=True)
class Unavailable:
    key: str
    reason: str


def against(names: Sequence[str]) -> tuple[str, ...]:
    """Runtime keys for --against names; ValueError naming an unknown one."""
    out = []
    for n in names:
        key = AGAINST.get(n.strip().lower())
        if key is None:
            known = ", ".join(sorted(set(AGAINST) - set(KEYS)))
            raise ValueError(f"--against {n}: unknown runtime (known: {known}, or the JSON keys)")
        if key not in out:
            out.append(key)
    return tuple(out)


def orchestrate_runtime(bundle, feed_sets: Sequence[Feeds], optimize_s: float | None) -> Ready:
    """The bundle.  On a GPU: after two runs (the second captures the CUDA
    graph) each call copies its input set (already on the GPU) into the
    graph's inputs and replays it, the device work of ``Bundle.run`` on CUDA
    tensors without its host-side input checks.  In the interpreter: ``run``."""
    program = bundle.program  # loads (and, on a GPU, compiles lazily) the kernels
    started = time.perf_counter()
    if program.interpret:
        program.run(feed_sets[0])
        ready = time.perf_counter() - started + (optimize_s or 0.0)
        return Ready(
            ORCHESTRATE,
            "orchestrate (Triton interpreter)",
            lambda i: program.run(feed_sets[i]),
            ready,
        )
    staged = [{k: program._tensor(v) for k, v in feeds.items()} for feeds in feed_sets]
    program.run(staged[0])
    program.run(staged[0])  # the second run captures the CUDA graph
    ready = time.perf_counter() - started + (optimize_s or 0.0)
    if program._graph is not None:
        call, label = (lambda i: program._replay(staged[i])), "orchestrate (CUDA graph)"
    else:
        call, label = (lambda i: program._execute(staged[i])), "orchestrate"
    return Ready(ORCHESTRATE, label, call, ready)
