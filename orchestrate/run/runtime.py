"""Running a plan: buffers by liveness, kernels in plan order, CUDA graphs.

:class:`Program` holds a plan with its kernel specs (``orchestrate.plan.Planned``),
the primitive graph it was made from (with the constants), and the generated
kernels module.  Made, it binds every kernel's arguments once: each
intermediate and output gets a buffer from a pool (a buffer goes back to the
pool after its last reader and is reused by the next tensor of the same
size), and each kernel becomes a step, its launcher and where its arguments
are.  ``run(inputs)`` checks the inputs, binds them, calls the launchers in
order and returns the outputs: numpy arrays for numpy arrays, torch tensors
for torch tensors (no copy through the host).  Gather indices are checked as
onnxruntime checks them (:class:`IndexChecks`): the inputs that are indices
before launch, and after the run the int32 flags that the kernels checking
computed indices set (``orchestrate.ir.bounds``).  Split-K matmuls share one
fp32 workspace for their partial tiles and one int32 array of arrival
counters, zeroed once: each kernel leaves its counters zero.

With no GPU the same kernels run in Triton's interpreter (``TRITON_INTERPRET``
is set before the kernels module is imported), and the runner says so once;
a plan that multiplies bfloat16 tiles is refused there
(:func:`interpreter_refusal`).
On a GPU the first run compiles, the second captures the whole plan in a CUDA
graph, and later runs replay it.
"""

from __future__ import annotations

import contextlib
import hashlib
import linecache
import operator
import os
import sys
import threading
import types
from collections.abc import Mapping, Sequence

import numpy as np

from orchestrate import ir, templates
from orchestrate.errors import InputError, OrchestrateError
from orchestrate.ir.bounds import (
    INDEX_ERROR,
    IndexBound,
    check_values,
    device_error,
    host_checked_inputs,
    index_bounds,
)
from orchestrate.kernels.spec import (
    LIBRARY,
    SCRATCH_DTYPES,
    SPLIT_K_COUNTERS,
    SPLIT_K_PARTIALS,
    KernelSpec,
    split_k,
)
from orchestrate.plan import Planned

_WARNED = threading.Event()
# set once orchestrate itself has imported triton under the interpreter: its
# standard library is then the interpreter's, whatever the environment says now
_BUILT_FOR_INTERPRETER = threading.Event()
_INTERPRETER = threading.RLock()  # interpreted runs take turns (Program._lock)


def gpu_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def interpreter_refusal(graph: ir.Graph, specs: Sequence[KernelSpec] | None = None) -> str | None:
    """Why Triton's interpreter cannot run the kernels of ``graph`` (None: it
    can).  It stores bfloat16 as uint16 and converts it to and from fp32
    correctly, so elementwise and reduction kernels (which compute in fp32)
    run; but its ``tl.dot`` multiplies bfloat16 tiles as the integers of
    their bit patterns, so a bf16 matmul or conv computes nonsense there.
    Given the plan's ``specs``, only generated kernels count: a library call
    multiplies bf16 through torch, which the CPU runs."""
    generated = (
        None if specs is None else {n for s in specs if s.template not in LIBRARY for n in s.nodes}
    )
    for n in graph.nodes:
        if generated is not None and n.name not in generated:
            continue
        if n.op in (ir.Op.MATMUL, ir.Op.CONV) and graph.types[n.inputs[0]].dtype == "bfloat16":
            return (
                f"{n.op.value} {n.name!r} multiplies bfloat16 tiles, which Triton's "
                "interpreter computes as integers (no bf16 tl.dot on a CPU); bf16 matmul "
                "and conv kernels run on a GPU only"
            )
    return None


def check_runnable(
    graph: ir.Graph, interpret: bool, specs: Sequence[KernelSpec] | None = None
) -> None:
    """OrchestrateError when ``graph``'s kernels (``specs``, when given) cannot
    run where asked."""
    if interpret and (why := interpreter_refusal(graph, specs)) is not None:
        raise OrchestrateError(f"cannot run this plan without a GPU: {why}")


def to_torch(arr: np.ndarray, copy: bool = True):
    """``arr`` as a C-ordered torch tensor (kernels index buffers densely, and
    numpy's default copy keeps the strides of a transposed array), a copy
    unless ``copy`` is false.  torch reads no ml_dtypes bfloat16: it takes
    the bit patterns."""
    import torch

    arr = np.array(arr, copy=True, order="C") if copy else np.ascontiguousarray(arr)
    if arr.dtype == ir.BFLOAT16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def to_numpy(tensor) -> np.ndarray:
    """A CPU torch tensor as a numpy array it shares (bfloat16 as ml_dtypes')."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ir.BFLOAT16)
    return tensor.numpy()


def load_kernels(source: str, interpret: bool):
    """Run generated kernels source as a module (under the interpreter when
    asked).  The source is compiled from memory, never imported from a file:
    what runs is what orchestrate generated.  Triton reads a jitted
    function's source through ``linecache``, where it is registered."""
    if interpret:
        foreign = not _BUILT_FOR_INTERPRETER.is_set() and os.environ.get("TRITON_INTERPRET") != "1"
        if foreign and "triton.language" in sys.modules:
            # triton builds its standard library (tl.sum, tl.cdiv, ...) for the
            # compiler or the interpreter once, when first imported
            raise OrchestrateError(
                "no GPU, and triton was imported before orchestrate could switch on its "
                "interpreter: set TRITON_INTERPRET=1 before importing triton (torch's "
                "dynamo ONNX exporter and torch.compile import it)"
            )
        if not _WARNED.is_set():
            _WARNED.set()
            print(
                "orchestrate: no GPU found; running the Triton kernels in the interpreter "
                "(correct but slow)",
                file=sys.stderr,
            )
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    name = f"orchestrate_kernels_{digest}"
    filename = f"<orchestrate kernels {digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # Triton resolves a jitted function's globals through it
    with interpreting(interpret):  # @triton.jit reads it as it decorates
        exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - our own source
    return module


@contextlib.contextmanager
def interpreting(on: bool):
    """TRITON_INTERPRET=1 while our kernels are defined and run (the
    interpreter reads it as it decorates and as it launches), the caller's
    value (or none) again after: the process's environment, the caller's
    own Triton code and every child process are left as they were.  Runs
    under the interpreter take turns (``_INTERPRETER``), so no two threads
    set and restore it at once."""
    if not on:
        yield
        return
    with _INTERPRETER:
        before = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            first = "triton.language" not in sys.modules
            import triton.language  # noqa: F401 - built for the interpreter if first here

            if first:
                _BUILT_FOR_INTERPRETER.set()

            yield
        finally:
            if before is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = before


def check_inputs(
    types: Mapping[str, tuple[tuple[int, ...], str]], inputs: Mapping[str, object]
) -> dict[str, object]:
    """The inputs, checked: numpy arrays, or torch tensors as given when any
    input is a torch tensor (then every input must be one).  InputError
    naming the first bad one."""
    if not isinstance(inputs, Mapping):
        raise InputError(
            f"inputs: expected a dict of arrays by input name, got {type(inputs).__name__}"
        )
    names = list(types)
    unknown = sorted(set(inputs) - set(names), key=str)
    if unknown:
        raise InputError(f"unknown input {unknown[0]!r} (inputs: {', '.join(names)})")
    torch = sys.modules.get("torch")
    tensors = torch is not None and any(isinstance(v, torch.Tensor) for v in inputs.values())
    out = {}
    for name, (shape, dtype) in types.items():
        if name not in inputs:
            raise InputError(f"missing input {name!r}: expected {dtype}{list(shape)}")
        value = inputs[name]
        if tensors:
            if not isinstance(value, torch.Tensor):
                raise InputError(
                    f"input {name!r}: a {type(value).__name__} among torch tensors; "
                    "give every input as a torch tensor or every one as an array"
                )
            got = str(value.dtype).removeprefix("torch.")
        else:
            value = np.asarray(value)
            got = value.dtype.name
        if tuple(value.shape) != tuple(shape):
            raise InputError(f"input {name!r}: shape {list(value.shape)}, expected {list(shape)}")
        if got != dtype:
            raise InputError(f"input {name!r}: dtype {got}, expected {dtype}")
        out[name] = value
    return out


def _min_max(values) -> tuple[int, int]:
    """The least and greatest of an integer array or tensor (on a GPU: two
    reductions on the device and one copy of two numbers back)."""
    if isinstance(values, np.ndarray):
        return int(values.min()), int(values.max())
    import torch

    lo, hi = torch.stack(values.aminmax()).tolist()
    return lo, hi


class IndexChecks:
    """Where a plan's gather indices are checked (``orchestrate.ir.bounds``).
    Made, it has checked the constants (a bundle's weights are data too);
    ``check_inputs`` checks the inputs before a run (one min and one max per
    input that indexes); ``kernels`` lists, per kernel that checks on the
    device, its gathers in flag-code order (the spec's ``checks``: decided by
    the rules, not again here), and ``device_error`` says what a flag means."""

    def __init__(self, graph: ir.Graph, planned: Planned):
        for reserved in (INDEX_ERROR, *SCRATCH_DTYPES):
            if reserved in graph.types:
                raise InputError(f"the tensor name {reserved!r} is reserved")
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

    def check_inputs(self, feeds: Mapping[str, object]) -> None:
        """InputError naming the first input with an index out of range for
        a gather it feeds (numpy arrays, or torch tensors on their device)."""
        for name, found in self.inputs.items():
            values = feeds[name]
            if values.size == 0 if isinstance(values, np.ndarray) else values.numel() == 0:
                continue
            lo, hi = _min_max(values)
            for b in found:
                if lo < -b.size or hi >= b.size:
                    host = values if isinstance(values, np.ndarray) else values.cpu().numpy()
                    check_values(b, f"input {name!r}", host)

    def device_error(self, kernel: str, code: int) -> InputError:
        checked = self.kernels.get(kernel, ())
        if 1 <= code <= len(checked):
            return device_error(checked[code - 1])
        return InputError(f"kernel {kernel!r}: a computed gather index is out of range")


class Program:
    """An executable plan, its kernels' arguments bound once.

    Made, it has given every intermediate and output its buffer (the pool's
    schedule, played once: ``stats`` counts the buffers allocated and the
    tensors that reuse one freed earlier) and made, per kernel, a step: the
    launcher and where its arguments are.  A run binds the inputs, calls the
    launchers in order and copies the outputs out of the program's buffers.
    """

    def __init__(
        self,
        planned: Planned,
        graph: ir.Graph,
        kernels_module,
        *,
        interpret: bool | None = None,
        cuda_graph: bool = True,
        indices: IndexChecks | None = None,
        dims: Mapping[str, int] | None = None,
        gpu_blocks: bool = False,
        shared: Mapping[str, object] | None = None,
    ):
        import torch

        self.torch = torch
        plan = self.plan = planned.plan
        self.interpret = (not gpu_available()) if interpret is None else interpret
        check_runnable(graph, self.interpret, planned.specs)
        self.device = "cpu" if self.interpret else "cuda"
        # the block sizes the launchers pick: the interpreter's, unless
        # ``gpu_blocks`` asks for the GPU's there too (a CPU check of what a
        # GPU will launch: tests/run/test_gpu_blocks.py)
        self.interpreter_blocks = self.interpret and not gpu_blocks
        self.launches = kernels_module.KERNELS
        # a dynamic bundle's launchers take the binding of its dimensions
        self.dims = dict(dims or {})
        self.types = plan.types
        self.input_types = {i.name: (i.shape, i.dtype) for i in plan.graph.inputs}
        self.outputs = list(plan.graph.outputs)
        self.indices = indices or IndexChecks(graph, planned)
        # ``shared``: constants another Program of the same bundle already
        # holds as tensors (a range's weights, the same at every binding)
        given = shared or {}
        self.constants = {
            k: given[k] if k in given else self._tensor(v) for k, v in graph.constants.items()
        }
        # the index error flags: one int32 slot per kernel that checks on the device
        checked = list(self.indices.kernels)
        self._flags = torch.zeros(max(1, len(checked)), dtype=torch.int32, device=self.device)
        self._flag_of = {k: self._flags[i : i + 1] for i, k in enumerate(checked)}
        # split-K matmuls' scratch, shared (kernels run one at a time): fp32
        # partials, and arrival counters zeroed once (each kernel leaves them zero)
        scratch = [templates.scratch(graph, s) for s in planned.specs if split_k(s.config) > 1]
        self._scratch = {
            SPLIT_K_PARTIALS: torch.empty(
                max((p for p, _ in scratch), default=0), dtype=torch.float32, device=self.device
            ),
            SPLIT_K_COUNTERS: torch.zeros(
                max((c for _, c in scratch), default=0), dtype=torch.int32, device=self.device
            ),
        }
        self._lifetimes()
        self._bind()
        self.use_cuda_graph = cuda_graph and not self.interpret
        self._graph = None
        self._static: dict | None = None
        self._runs = 0
        # one run at a time in the shared buffers; in the interpreter, one run
        # at a time in the process (Triton's interpreter keeps the launch's
        # grid in global state, so two kernels interpreted at once clash)
        self._lock = _INTERPRETER if self.interpret else threading.Lock()

    # -- set-up -------------------------------------------------------------

    def _tensor(self, arr: np.ndarray):
        t = to_torch(arr)
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

    def _bind(self) -> None:
        """The steps of a run.  Every tensor gets a slot in a list of values:
        constants, buffers, views of them and the flags are filled in now
        (``_fixed``), the inputs and views of them at each run.  A step is a
        launcher and a getter of its arguments from that list."""
        fixed: list = []
        slot: dict[str, int] = {}

        def place(name: str, value) -> int:
            slot[name] = len(fixed)
            fixed.append(value)
            return slot[name]

        for name, t in self.constants.items():
            place(name, t)
        self._input_slots = [(name, place(name, None)) for name in self.input_types]
        per_run = set(self.input_types)  # tensors known only at a run: inputs, views of them
        self._input_views: list[tuple[int, int, tuple[int, ...]]] = []
        pool: dict[int, list] = {}  # freed buffers by size in bytes
        base: dict[str, object] = {}  # buffer (uint8) of each tensor a kernel writes
        self.stats = {"allocated": 0, "reused": 0}  # buffers
        steps = []
        for i, k in enumerate(self.plan.kernels):
            if k.is_view:
                (src,), (dst,) = k.inputs, k.outputs
                shape = self.types[dst][0]
                if src in per_run:
                    per_run.add(dst)
                    self._input_views.append((place(dst, None), slot[src], shape))
                else:
                    place(dst, fixed[slot[src]].reshape(shape))
            else:
                for t in k.outputs:
                    base[t], view = self._buffer(pool, t)
                    place(t, view)
                launch, tensors = self.launches[k.name]
                at = []
                for t in tensors:
                    if t == INDEX_ERROR:
                        at.append(place(f"{k.name}/{INDEX_ERROR}", self._flag_of[k.name]))
                    elif t in self._scratch:
                        at.append(slot[t] if t in slot else place(t, self._scratch[t]))
                    else:
                        at.append(slot[t])
                steps.append((launch, _getter(at)))
            for r in self.free_after.get(i, ()):
                if r in base:
                    pool.setdefault(base[r].numel(), []).append(base[r])
        self._fixed = fixed
        self._steps = steps
        self._output_slots = [(o, slot[o]) for o in self.outputs]

    def _buffer(self, pool: dict, name: str):
        """(buffer, tensor ``name`` in it): a freed buffer of its size in
        bytes when there is one and ``name`` is not an output."""
        torch = self.torch
        shape, dtype = self.types[name]
        tdtype = getattr(torch, dtype)
        numel = int(np.prod(shape, dtype=np.int64))
        nbytes = max(1, numel * np.dtype(dtype).itemsize)
        if name not in self.outputs and pool.get(nbytes):
            self.stats["reused"] += 1
            buf = pool[nbytes].pop()
        else:
            self.stats["allocated"] += 1
            buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        if numel == 0:
            return buf, torch.empty(shape, dtype=tdtype, device=self.device)
        return buf, buf.view(tdtype).view(shape)

    # -- running ------------------------------------------------------------

    def check_inputs(self, inputs: Mapping[str, object]) -> dict[str, object]:
        """The inputs checked (``check_inputs``): numpy arrays, or torch tensors
        made contiguous where they are (InputError for one on another device
        than the program's)."""
        feeds = check_inputs(self.input_types, inputs)
        torch = self.torch
        if not any(isinstance(v, torch.Tensor) for v in feeds.values()):
            return feeds
        device = self._flags.device
        for name, t in feeds.items():
            if t.device != device:
                raise InputError(
                    f"input {name!r}: a tensor on {t.device}, expected one on "
                    f"{device} (where this program runs)"
                )
            feeds[name] = (t.detach() if t.requires_grad else t).contiguous()
        return feeds

    def run(
        self, inputs: Mapping[str, object], resident: frozenset[str] = frozenset()
    ) -> dict[str, object]:
        """Outputs of the plan on ``inputs``, by name: numpy arrays for numpy
        arrays, or torch tensors for torch tensors (on the program's device:
        CUDA on a GPU, CPU in the interpreter), read in place and returned
        without a copy through the host.  InputError for a missing, unknown
        or misshapen input, and when an index is out of range: an input's
        before anything runs (for tensors, a min and a max on the device),
        one computed in the model after the run.  Safe to call from many
        threads: runs share the program's buffers, so they take turns.

        ``resident``: inputs given as tensors that stay where they are from
        run to run (a decode step's cache buffers): the CUDA graph reads them
        where they lie instead of copying them in, and is captured again if
        one is given at another address."""
        feeds = self.check_inputs(inputs)
        tensors = any(isinstance(v, self.torch.Tensor) for v in feeds.values())
        self.indices.check_inputs(feeds)
        with self._lock, interpreting(self.interpret):
            self._runs += 1
            if self._flag_of:
                self._flags.zero_()
            if self.use_cuda_graph and self._runs >= 2:
                out = self._replay(feeds, resident & feeds.keys() if tensors else frozenset())
            else:
                out = self._execute(
                    feeds if tensors else {k: self._tensor(v) for k, v in feeds.items()}
                )
            self._check_flags()
            if tensors:  # out of the program's buffers, which the next run overwrites
                return {o: t.clone() for o, t in out.items()}
            if self.device == "cuda":
                return {o: to_numpy(t.cpu()) for o, t in out.items()}
            return {o: to_numpy(t).copy() for o, t in out.items()}

    def _check_flags(self) -> None:
        if self._flag_of:
            for kernel, code in zip(self._flag_of, self._flags.cpu().numpy()):
                if code:
                    raise self.indices.device_error(kernel, int(code))

    def _values(self, feeds: Mapping[str, object]) -> list:
        """Every tensor of a run on ``feeds`` (tensors on the device, by
        input name), by slot: the fixed ones and the inputs bound."""
        values = self._fixed.copy()
        for name, s in self._input_slots:
            values[s] = feeds[name]
        for s, src, shape in self._input_views:
            values[s] = values[src].reshape(shape)
        return values

    def _execute(self, feeds: Mapping[str, object]) -> dict[str, object]:
        """Launch every kernel on ``feeds`` (tensors on the device, by input
        name); the outputs, in the program's buffers."""
        values = self._values(feeds)
        interpret, dims = self.interpreter_blocks, self.dims
        for launch, args in self._steps:
            launch(*args(values), interpret=interpret, **dims)
        return {o: values[s] for o, s in self._output_slots}

    def kernel_calls(self, inputs: Mapping[str, object]) -> list[tuple[str, object]]:
        """Each launched kernel of the plan, in plan order, as (kernel name,
        a function of no arguments that launches it alone), bound to the
        buffers of a run on ``inputs``, which is made first: every kernel
        reads what the run left, as in the plan.  For timing kernels one by
        one (``bench``'s per-kernel records); a kernel rewrites its outputs
        whole each launch, so repeated calls leave the run's values."""
        feeds = self.check_inputs(inputs)
        feeds = {
            k: v if isinstance(v, self.torch.Tensor) else self._tensor(v) for k, v in feeds.items()
        }
        values = self._values(feeds)
        interpret, dims = self.interpreter_blocks, self.dims
        names = [k.name for k in self.plan.kernels if not k.is_view]
        calls = []
        for name, (launch, args) in zip(names, self._steps):
            bound = args(values)
            launch(*bound, interpret=interpret, **dims)  # the run, kernel by kernel
            calls.append((name, lambda f=launch, a=bound: f(*a, interpret=interpret, **dims)))
        return calls

    def _replay(self, feeds: Mapping[str, object], resident=frozenset()) -> dict[str, object]:
        """The outputs, by a replay of the CUDA graph of ``_execute`` (captured
        at the first call, on its own copy of the inputs but the ``resident``
        ones, read where they lie; captured again when one of those moved)."""
        torch = self.torch
        if self._graph is not None and any(
            self._static["in"][k].data_ptr() != feeds[k].data_ptr() for k in resident
        ):
            self._graph = None  # a resident input moved: its address is in the graph
        if self._graph is None:
            static_in = {
                k: self._tensor(v)
                if isinstance(v, np.ndarray)
                else (v if k in resident else v.clone())
                for k, v in feeds.items()
            }
            self._execute(static_in)  # warm: every kernel compiled
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._execute(static_in)
            self._graph, self._static = graph, {"in": static_in, "out": out}
        for k, v in feeds.items():
            if k in resident:
                continue
            static = self._static["in"][k]
            static.copy_(to_torch(v, copy=False) if isinstance(v, np.ndarray) else v)
        self._graph.replay()
        return self._static["out"]


def _getter(at: list[int]):
    """A function of the list of values: the tuple of those at ``at``."""
    if len(at) == 1:
        (j,) = at
        return lambda values: (values[j],)
    if not at:
        return lambda values: ()
    return operator.itemgetter(*at)
