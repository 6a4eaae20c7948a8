"""The real timer: one spec's kernel, alone, on the GPU present.

For each spec the timer generates the module ``emit`` would for a plan of
that one kernel (its ``@triton.jit`` function, its launcher and a
``KERNELS`` table of one entry, writing the spec's sinks), loads it, and
gives the launcher tensors of the right shapes and dtypes on the device:
the graph's own weights, random values for the rest (every gather clamps
its indices, ``orchestrate/ir/bounds.py``, so random indices read nothing out
of range), empty outputs, and the index error flag and split-K scratch the
runner would bind.  One call outside the timing compiles and warms it; then
``triton.testing.do_bench`` times it (its median; L2 flushed before each
call, so operands come from device memory as the cost model assumes).

``prepare`` compiles every module ahead, in a pool of processes across
the CPU cores (``compile_check.compile_module``, the compiler the JIT
calls, for the GPU's architecture): the results land in Triton's on-disk
cache, where the JIT finds them when a kernel is first launched.  A kernel
that fails there is compiled again by the JIT, which reports the error.

``bench`` and ``device`` let a test run the same path in the interpreter
on a CPU (``device="cpu"``, a bench that calls the function once).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

from orchestrate import templates
from orchestrate.emit import kernel_source
from orchestrate.emit.source import Launch, module, pointers
from orchestrate.errors import OrchestrateError
from orchestrate.ir import FLOATS, Graph
from orchestrate.ir.bounds import INDEX_ERROR
from orchestrate.kernels.spec import (
    SCRATCH_DTYPES,
    SPLIT_K_COUNTERS,
    SPLIT_K_PARTIALS,
    KernelSpec,
)
from orchestrate.templates import template
from orchestrate.tune.timer import TimerInfo

TIMED = "timed"  # the one planned kernel's name in the module's KERNELS table
WARMUP_MS, REP_MS = 10, 40  # do_bench's warm-up and timed milliseconds per configuration


class NoGPU(OrchestrateError):
    """Tuning asked for where no CUDA GPU is."""


def untimeable(spec: KernelSpec) -> str | None:
    """Why the timer cannot run ``spec`` alone (None: it can)."""
    if template(spec.template).generate is None:
        return f"no generated kernel for the {spec.template} template to time alone"
    return None


def kernel_module_source(graph: Graph, spec: KernelSpec) -> str:
    """The kernels module of a plan that runs ``spec`` alone, writing its sinks."""
    if (why := untimeable(spec)) is not None:
        raise OrchestrateError(why)
    writes = spec.outputs
    f = kernel_source(graph, spec, writes, f"{spec.template}_1")
    slots = {v: k for k, v in pointers(graph, spec, writes).slots.items()}
    launch = Launch(TIMED, f.name, tuple(slots[p] for p in f.params))
    return module(
        [f], [launch], [f"One {spec.template} kernel, alone, timed by orchestrate --tune"]
    )


def tensor_dtypes(graph: Graph, spec: KernelSpec) -> dict[str, str]:
    """The dtype of every tensor the module's launcher takes, by name."""
    out = {t: graph.types[t].dtype for t in (*spec.inputs, *spec.outputs)}
    out[INDEX_ERROR] = "int32"
    out.update(SCRATCH_DTYPES)
    return out


def driver_version() -> str:
    """The NVIDIA driver's version (the kernel module's, else nvidia-smi's)."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        for word in text.split():
            if word.count(".") >= 1 and word.replace(".", "").isdigit():
                return word
    except OSError:
        pass
    try:
        run = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if run.returncode == 0 and run.stdout.strip():
            return run.stdout.split()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def _compile(
    source: str, dtypes: dict[str, str], arch: int, only: set[str] | None = None
) -> str | None:
    """In a worker process: compile the module's functions (``only`` those
    named) for ``arch``; the error, if any."""
    os.environ.pop("TRITON_INTERPRET", None)
    try:
        from orchestrate.check.compile_check import compile_module
        from orchestrate.run.runtime import load_kernels

        compile_module(load_kernels(source, interpret=False), dtypes, arch, usage=False, only=only)
    except Exception as e:  # noqa: BLE001 - reported by the parent
        return f"{type(e).__name__}: {str(e)[:300]}"
    return None


def compile_ahead(
    jobs: Sequence[tuple], arch: int, workers: int, progress: Callable[[str, int, int], None]
) -> list[str | None]:
    """Compile each (module source, tensor dtypes[, the names of the
    functions to compile]) for ``arch`` in a pool of ``workers`` fresh
    processes (spawned: CUDA does not survive a fork); each job's error, or
    None.  Naming one function per job spreads one module's functions over
    the pool (a bundle's, compiled ahead of its first run)."""
    errors: list[str | None] = [None] * len(jobs)
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_compile, *job[:2], arch, *job[2:]): i for i, job in enumerate(jobs)}
        for n, done in enumerate(as_completed(futures)):
            errors[futures[done]] = done.result()
            progress("compile", n + 1, len(futures))
    return errors


class GpuTimer:
    """Times specs on the GPU present (see the module docstring)."""

    def __init__(
        self,
        *,
        workers: int | None = None,
        warmup_ms: int = WARMUP_MS,
        rep_ms: int = REP_MS,
        progress: Callable[[str, int, int], None] | None = None,
        device: str = "cuda",
        bench: Callable | None = None,
        info: TimerInfo | None = None,
        arch: int | None = None,
    ):
        import torch

        self.torch, self.device = torch, device
        self.interpret = device == "cpu"
        if self.interpret and bench is None:
            raise ValueError("GpuTimer(device='cpu') times nothing by itself: give it a bench")
        if not self.interpret and not torch.cuda.is_available():
            raise NoGPU(
                "--tune: no CUDA GPU here (torch.cuda.is_available() is false); "
                "tuning times kernels on a GPU"
            )
        self.workers = workers or max(1, (os.cpu_count() or 2) - 1)
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.progress = progress or (lambda stage, i, n: None)
        self.bench = bench
        if info is None:
            import triton

            info = TimerInfo(
                torch.cuda.get_device_name(0),
                driver_version(),
                triton.__version__,
                f"triton.testing.do_bench: median, {warmup_ms} ms warm-up, "
                f"{rep_ms} ms of calls, L2 flushed before each",
            )
        self.info = info
        if arch is None and not self.interpret:
            major, minor = torch.cuda.get_device_capability(0)
            arch = 10 * major + minor
        self.arch = arch
        self._sources: dict[str, str] = {}

    def refuses(self, spec: KernelSpec) -> str | None:
        return untimeable(spec)

    def _source(self, graph: Graph, spec: KernelSpec) -> str:
        if spec.hash not in self._sources:
            self._sources[spec.hash] = kernel_module_source(graph, spec)
        return self._sources[spec.hash]

    def prepare(self, graph: Graph, specs: Sequence[KernelSpec]) -> None:
        """Compile every spec's function ahead, in parallel (a no-op in the interpreter)."""
        jobs = []
        for s in specs:
            try:
                jobs.append((s, self._source(graph, s)))
            except OrchestrateError:
                continue  # time() says why
        if self.interpret or not jobs:
            return
        errors = compile_ahead(
            [(src, tensor_dtypes(graph, s)) for s, src in jobs],
            self.arch,
            self.workers,
            self.progress,
        )
        failed = sum(e is not None for e in errors)
        if failed:
            print(
                f"orchestrate: tune: {failed} of {len(jobs)} kernels did not compile ahead; "
                "the JIT tries them again",
                file=sys.stderr,
            )

    def time(self, graph: Graph, spec: KernelSpec) -> float:
        """Microseconds of one launch of ``spec`` (do_bench's median)."""
        from orchestrate.run.runtime import load_kernels

        kernels = load_kernels(self._source(graph, spec), interpret=self.interpret)
        launcher, names = kernels.KERNELS[TIMED]
        args = [self._tensor(graph, spec, t) for t in names]

        def call():
            launcher(*args, interpret=self.interpret)

        call()  # compiles (or loads from Triton's cache) and warms, outside the timing
        if not self.interpret:
            self.torch.cuda.synchronize()
        if self.bench is not None:  # milliseconds, as do_bench
            return float(self.bench(call)) * 1e3
        import triton.testing

        ms = triton.testing.do_bench(
            call, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"
        )
        return float(ms) * 1e3

    def _tensor(self, graph: Graph, spec: KernelSpec, name: str):
        torch, dev = self.torch, self.device
        if name == INDEX_ERROR:
            return torch.zeros(1, dtype=torch.int32, device=dev)
        if name in (SPLIT_K_PARTIALS, SPLIT_K_COUNTERS):
            partials, counters = templates.scratch(graph, spec)
            if name == SPLIT_K_PARTIALS:
                return torch.empty(partials, dtype=torch.float32, device=dev)
            return torch.zeros(counters, dtype=torch.int32, device=dev)
        if name in graph.constants:
            from orchestrate.run.runtime import to_torch

            return to_torch(graph.constants[name]).to(dev)
        ty = graph.types[name]
        dtype = getattr(torch, ty.dtype)
        if name in spec.outputs:
            return torch.empty(ty.shape, dtype=dtype, device=dev)
        if ty.dtype in FLOATS:
            return torch.randn(ty.shape, device=dev).to(dtype)
        if ty.dtype == "bool":
            return torch.rand(ty.shape, device=dev) < 0.5
        return torch.randint(0, 2, ty.shape, device=dev).to(dtype)
