"""Running a plan: buffers by liveness, kernels in plan order, CUDA graphs.

:class:`Program` holds a plan with its kernel specs (``orchestrate.plan.Planned``),
the primitive graph it was made from (with the constants), and the generated
kernels module.  ``run(inputs)`` checks the inputs, allocates every
intermediate from a pool (a buffer is returned to the pool after its last
reader and reused by the next tensor of the same size), launches the
kernels in order and returns the outputs as numpy arrays.  Gather indices
are checked as onnxruntime checks them (:class:`IndexChecks`): the inputs
that are indices before launch, and after the run the int32 flags that the
kernels checking computed indices set (``orchestrate.bounds``).

With no GPU the same kernels run in Triton's interpreter (``TRITON_INTERPRET``
is set before the kernels module is imported), and the runner says so once.
On a GPU the first run compiles, the second captures the whole plan in a CUDA
graph, and later runs replay it.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import sys
import threading
import types
from collections.abc import Mapping

import numpy as np

from orchestrate import ir
from orchestrate.bounds import (
    INDEX_ERROR,
    IndexBound,
    check_values,
    device_error,
    host_checked_inputs,
    index_bounds,
)
from orchestrate.errors import InputError, OrchestrateError
from orchestrate.plan import Planned

_WARNED = threading.Event()


def gpu_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def load_kernels(source: str, interpret: bool):
    """Run generated kernels source as a module (under the interpreter when
    asked).  The source is compiled from memory, never imported from a file:
    what runs is what orchestrate generated.  Triton reads a jitted
    function's source through ``linecache``, where it is registered."""
    if interpret:
        if os.environ.get("TRITON_INTERPRET") != "1" and "triton.language" in sys.modules:
            # triton builds its standard library (tl.sum, tl.cdiv, ...) for the
            # compiler or the interpreter once, when first imported
            raise OrchestrateError(
                "no GPU, and triton was imported before orchestrate could switch on its "
                "interpreter: set TRITON_INTERPRET=1 before importing triton (torch's "
                "dynamo ONNX exporter and torch.compile import it)"
            )
        os.environ["TRITON_INTERPRET"] = "1"
        if not _WARNED.is_set():
            _WARNED.set()
            print("orchestrate: no GPU found; running the Triton kernels in the interpreter "
                  "(correct but slow)", file=sys.stderr)  # fmt: skip
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    name = f"orchestrate_kernels_{digest}"
    filename = f"<orchestrate kernels {digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # Triton resolves a jitted function's globals through it
    exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - our own source
    return module


def check_inputs(
    types: Mapping[str, tuple[tuple[int, ...], str]], inputs: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The inputs as arrays, or InputError naming the first bad one."""
    names = list(types)
    unknown = sorted(set(inputs) - set(names))
    if unknown:
        raise InputError(f"unknown input {unknown[0]!r} (inputs: {', '.join(names)})")
    out = {}
    for name, (shape, dtype) in types.items():
        if name not in inputs:
            raise InputError(f"missing input {name!r}: expected {dtype}{list(shape)}")
        arr = np.asarray(inputs[name])
        if tuple(arr.shape) != tuple(shape):
            raise InputError(f"input {name!r}: shape {list(arr.shape)}, expected {list(shape)}")
        if arr.dtype.name != dtype:
            raise InputError(f"input {name!r}: dtype {arr.dtype.name}, expected {dtype}")
        out[name] = arr
    return out


class IndexChecks:
    """Where a plan's gather indices are checked (``orchestrate.bounds``).
    Made, it has checked the constants (a bundle's weights are data too);
    ``check_inputs`` checks the inputs before a run (one min and one max per
    input that indexes); ``kernels`` lists, per kernel that checks on the
    device, its gathers in flag-code order (the spec's ``checks``: decided by
    the rules, not again here), and ``device_error`` says what a flag means."""

    def __init__(self, graph: ir.Graph, planned: Planned):
        if INDEX_ERROR in graph.types:
            raise InputError(f"the tensor name {INDEX_ERROR!r} is reserved")
        found = index_bounds(graph)
        for b in found:
            if b.source in graph.constants:
                check_values(b, f"constant {b.source!r}", graph.constants[b.source])
        self.inputs = host_checked_inputs(found, [i.name for i in graph.inputs])
        by_name = {b.gather: b for b in found}
        self.kernels: dict[str, tuple[IndexBound, ...]] = {
            k.name: tuple(by_name[g] for g in spec.checks)
            for k, spec in zip(planned.plan.kernels, planned.specs)
            if spec.checks
        }

    def check_inputs(self, feeds: Mapping[str, np.ndarray]) -> None:
        """InputError naming the first input with an index out of range for
        a gather it feeds."""
        for name, found in self.inputs.items():
            arr = np.asarray(feeds[name])
            if arr.size == 0:
                continue
            lo, hi = int(arr.min()), int(arr.max())
            for b in found:
                if lo < -b.size or hi >= b.size:
                    check_values(b, f"input {name!r}", arr)

    def device_error(self, kernel: str, code: int) -> InputError:
        checked = self.kernels.get(kernel, ())
        if 1 <= code <= len(checked):
            return device_error(checked[code - 1])
        return InputError(f"kernel {kernel!r}: a computed gather index is out of range")


class Program:
    """An executable plan."""

    def __init__(self, planned: Planned, graph: ir.Graph, kernels_module, *,
                 interpret: bool | None = None, cuda_graph: bool = True,
                 indices: IndexChecks | None = None):  # fmt: skip
        import torch

        self.torch = torch
        plan = self.plan = planned.plan
        self.interpret = (not gpu_available()) if interpret is None else interpret
        self.device = "cpu" if self.interpret else "cuda"
        self.launches = kernels_module.KERNELS
        self.types = plan.types
        self.input_types = {i.name: (i.shape, i.dtype) for i in plan.graph.inputs}
        self.outputs = list(plan.graph.outputs)
        self.indices = indices or IndexChecks(graph, planned)
        self.constants = {k: self._tensor(v) for k, v in graph.constants.items()}
        # the index error flags: one int32 slot per kernel that checks on the device
        checked = list(self.indices.kernels)
        self._flags = torch.zeros(max(1, len(checked)), dtype=torch.int32, device=self.device)
        self._flag_of = {k: self._flags[i : i + 1] for i, k in enumerate(checked)}
        self._lifetimes()
        self.use_cuda_graph = cuda_graph and not self.interpret
        self._graph = None
        self._static: dict | None = None
        self._runs = 0
        self.stats = {"allocated": 0, "reused": 0}  # buffers, in the last run

    # -- set-up -------------------------------------------------------------

    def _tensor(self, arr: np.ndarray):
        # a C-ordered copy: kernels index buffers densely, and numpy's default
        # copy keeps the strides of a transposed or Fortran-ordered array
        t = self.torch.from_numpy(np.array(arr, copy=True, order="C"))
        return t.to(self.device) if self.device != "cpu" else t

    def _lifetimes(self) -> None:
        """When each buffer can go back to the pool: after the last kernel that
        reads it or any view of it.  Inputs, constants and outputs never do."""
        root: dict[str, str] = {}  # tensor -> the buffer it lives in
        last: dict[str, int] = {}
        allocated: set[str] = set()
        for i, k in enumerate(self.plan.kernels):
            for t in k.inputs:
                r = root.get(t, t)
                last[r] = i
            for t in k.outputs:
                if k.is_view:
                    root[t] = root.get(k.inputs[0], k.inputs[0])
                else:
                    root[t] = t
                    allocated.add(t)
                    last.setdefault(t, i)
        keep = {root.get(o, o) for o in self.outputs}
        self.free_after: dict[int, list[str]] = {}
        for r in sorted(allocated - keep):
            self.free_after.setdefault(last[r], []).append(r)

    # -- running ------------------------------------------------------------

    def check_inputs(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return check_inputs(self.input_types, inputs)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs of the plan on ``inputs`` (numpy arrays by input name).
        InputError when an index is out of range: an input's before anything
        runs, one computed in the model after the run."""
        feeds = self.check_inputs(inputs)
        self.indices.check_inputs(feeds)
        self._runs += 1
        if self._flag_of:
            self._flags.zero_()
        if self.use_cuda_graph and self._runs >= 2:
            out = self._replay(feeds)
        else:
            env = self._execute({k: self._tensor(v) for k, v in feeds.items()})
            if self.device == "cuda":
                self.torch.cuda.synchronize()
            out = {o: env[o].cpu().numpy() for o in self.outputs}
        self._check_flags()
        return out

    def _check_flags(self) -> None:
        if self._flag_of:
            for kernel, code in zip(self._flag_of, self._flags.cpu().numpy()):
                if code:
                    raise self.indices.device_error(kernel, int(code))

    def _args(self, kernel: str, tensors, env: dict) -> list:
        return [self._flag_of[kernel] if t == INDEX_ERROR else env[t] for t in tensors]

    def _execute(self, feeds: dict) -> dict:
        self.stats = {"allocated": 0, "reused": 0}
        env = dict(self.constants)
        env.update(feeds)
        pool: dict[int, list] = {}
        for i, k in enumerate(self.plan.kernels):
            if k.is_view:
                (src,), (dst,) = k.inputs, k.outputs
                env[dst] = env[src].reshape(self.types[dst][0])
            else:
                for t in k.outputs:
                    shape, dtype = self.types[t]
                    env[t] = self._allocate(pool, shape, dtype, keep=t in self.outputs)
                launch, tensors = self.launches[k.name]
                launch(*self._args(k.name, tensors, env), interpret=self.interpret)
            for r in self.free_after.get(i, ()):
                buf = env.get(r)
                if buf is not None:
                    pool.setdefault(buf.untyped_storage().nbytes(), []).append(buf)
        return env

    def _allocate(self, pool: dict, shape, dtype: str, keep: bool):
        torch = self.torch
        tdtype = getattr(torch, dtype) if dtype != "bool" else torch.bool
        nbytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        if not keep and pool.get(nbytes):
            self.stats["reused"] += 1
            base = pool[nbytes].pop()
            flat = torch.empty(0, dtype=tdtype, device=base.device)
            flat.set_(base.untyped_storage(), 0, (int(np.prod(shape)),))
            return flat.view(shape)
        self.stats["allocated"] += 1
        return torch.empty(shape, dtype=tdtype, device=self.device)

    def _replay(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        if self._graph is None:
            static_in = {k: self._tensor(v) for k, v in feeds.items()}
            self._execute(static_in)  # warm: every kernel compiled
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                env = self._execute(static_in)
            self._graph, self._static = (
                graph,
                {"in": static_in, "out": {o: env[o] for o in self.outputs}},
            )
        for k, v in feeds.items():
            self._static["in"][k].copy_(torch.from_numpy(np.ascontiguousarray(v)))
        self._graph.replay()
        torch.cuda.synchronize()
        return {o: t.cpu().numpy() for o, t in self._static["out"].items()}
