"""The cost of a candidate kernel: every cost term in one place.

    time = max(memory, compute, latency) + launch

over the kernel's launch configuration (the spec's ``config``: tiles, warps,
stages) and its grid of ``blocks`` thread blocks.  The figures that are not
datasheet peaks live, with their sources, in ``cost/figures.py``; the peaks
in ``devices.py``.  Every number this model gives is a prediction.

**memory** = bytes / bandwidth.  ``bytes`` is what the kernel must move
through device memory: each external tensor it reads, once (a tensor read
only through a Slice or Gather counts only the elements taken), plus every
tensor it writes; a row reduction too long for registers streams its inputs
once per phase.  On-chip traffic (registers, shared memory, L2 re-reads of
operand tiles) is free.  The bandwidth is the achievable fraction of the
datasheet (``ACHIEVABLE_BANDWIDTH``), but at most what the grid's SMs can
keep in flight: by Little's law each busy SM draws its bytes in flight
(``BYTES_IN_FLIGHT_PER_SM``, or what its resident warps can issue) per
``DRAM_LATENCY_US``.  A grid of 24 blocks uses 24 of 132 SMs.

**compute** = (dot flops / dot rate + other flops / CUDA-core rate) x tile
quantisation.  Dot flops (2·M·N·K per matmul, 2·K per conv output element)
run at the tensor-core rate for fp16 and bf16, and for fp32 under TF32, at
``TENSOR_CORE_EFFICIENCY`` of the dense peak; IEEE fp32 and integer dots run
on CUDA cores.  Everything else runs on CUDA cores: one flop per cheap
elementwise op, ``SFU_FLOPS`` per transcendental, evaluated once per point of
the kernel's iteration space (a matmul prologue once per column of
``BLOCK_N`` tiles; it runs between the tensor-core steps, so the two times
add).  Tile quantisation: blocks spread over the SMs in whole waves, so
``sms x ceil(blocks / sms) / blocks`` >= 1 (a grid of 24 blocks runs at
24/132 of the peak).

**latency**: a block cannot finish faster than its chain of dependent
memory accesses.  A block waits ``DRAM_LATENCY_US`` for its first loads,
then once per loop step (K steps of a matmul or conv, key blocks of an
attention, column blocks of a looped row reduction), with ``num_stages - 1``
steps in flight when a dot loop is software-pipelined; blocks run in waves
of what the SMs hold at once (warps and shared memory permitting).  This is
what makes a small GEMM cost microseconds rather than nothing.

**launch** = ``LAUNCH_US`` per kernel (CUDA-graph replay; see figures.py).

Split-K (a matmul whose configuration has ``SPLIT_K`` = S > 1; see
``templates/matmul/emit.py``): S programs per output tile, each walking 1/S of the K
steps, so the grid has S times the blocks (more SMs busy, more bytes in
flight, fuller waves) and each block a chain 1/S as long.  What it costs:

* bytes: the fp32 partial tiles, S x M x N x 4 bytes written and the same
  read back by each tile's last program (priced at DRAM bandwidth, though
  most of it stays in L2), on top of what the kernel moves anyway; the bytes
  a block keeps in flight are its operand loads only;
* flops: S additions per output element in the fix-up (CUDA cores);
* latency: ``FIXUP_LATENCIES`` dependent accesses after the last wave (the
  arrival counter's atomic, then the partial tiles' loads).

A ``view`` (reshapes only) costs nothing and launches nothing.

A ``copy`` is no kernel of a plan: it is what torch.compile runs before
each CUDA-graph replay to copy the call's inputs into the graph's buffers,
priced as a streaming kernel for calibrate (``calibrate/harness.py``).

Library kernels (``library_matmul``, ``library_conv``, ``library_attention``:
cuBLAS, cuDNN and SDPA through torch) have no launch configuration; their
terms, with the library's own efficiency figures and what torch launches
around the call, are in ``templates/library/cost.py``.

**measured** (``optimize --tune``, ``cost/measured.py``): a spec timed on the
GPU costs its measured time instead of all of the above (plus the model's
price of optional outputs it also writes); one not timed costs the model's
time x a scale learnt from the measured ones (per template, the geometric
mean of measured / predicted; stated in full there).

**learned** (``--cost learned``, ``cost/learned.py``): a kernel not timed
costs the model's time x ``exp`` of what gradient-boosted trees, trained on
published measurements, predict of ``log(measured / model)`` for it.

Everything is read from the kernel spec: the template's roles (anchor,
prologue, epilogue, row space and phases, attention roles) and its launch
configuration.  Each template (``orchestrate/templates/``) says how many
flops, blocks and loop steps its kernels have, from the counts in
``cost/terms.py``; this module turns them into time, the same way for all.
Whether the working set fits on chip is the rules' check (``kernels/fit.py``),
not a cost; the shared memory it models sets how many blocks an SM holds.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from orchestrate.cost.devices import Device
from orchestrate.cost.figures import (
    ACHIEVABLE_BANDWIDTH,
    BYTES_IN_FLIGHT_PER_SM,
    DRAM_LATENCY_US,
    FIXUP_LATENCIES,
    FOREACH_CHUNK,
    FOREACH_THREADS,
    LAUNCH_US,
    WARPS_PER_SM,
)
from orchestrate.cost.measured import Measured
from orchestrate.cost.terms import read_bytes, us_for_bytes, us_for_flops, write_bytes
from orchestrate.ir import Graph
from orchestrate.kernels.spec import VIEW, KernelSpec, split_k
from orchestrate.templates import scratch, template, working_set


@dataclass(frozen=True)
class Cost:
    bytes: int
    flops: int
    memory_us: float
    compute_us: float
    launch_us: float
    latency_us: float = 0.0
    blocks: int = 0  # thread blocks in the grid
    measured_us: float | None = None  # timed on the GPU (--tune): replaces the model's time
    scale: float = 1.0  # not timed, under --tune: the model's time x this (cost/measured.py)

    @property
    def time_us(self) -> float:
        if self.measured_us is not None:
            return self.measured_us
        return (max(self.memory_us, self.compute_us, self.latency_us) + self.launch_us) * self.scale


@dataclass(frozen=True)
class Price:
    """What a kernel costs when it writes a given set of tensors."""

    bytes: int
    flops: int
    time_us: float
    bound: str  # memory, compute, latency, launch or view


class Prices:
    """The cost of each distinct spec on one device, computed once per
    structural hash (a transformer's layers share theirs); under ``--tune``
    measured, or scaled by what the measurements taught (``measured``);
    otherwise scaled by ``correct(spec, cost)`` when given (the learned model,
    ``cost/learned.py``)."""

    def __init__(
        self,
        graph: Graph,
        device: Device,
        measured: Measured | None = None,
        correct: Callable[[KernelSpec, Cost], float] | None = None,
    ):
        self.graph, self.device, self.measured = graph, device, measured
        self.correct = correct
        self._cache: dict[str, Cost] = {}

    def cost(self, spec: KernelSpec) -> Cost:
        if spec.hash not in self._cache:
            c = cost(self.graph, spec, self.device)
            m = self.measured
            if m is None and self.correct is not None and spec.template != VIEW:
                c = replace(c, scale=self.correct(spec, c))
            if m is not None and spec.template != VIEW:
                us = m.times.get(spec.hash)
                c = (
                    replace(c, measured_us=us)
                    if us is not None
                    else replace(c, scale=m.scale(spec.template))
                )
            self._cache[spec.hash] = c
        return self._cache[spec.hash]

    def price(self, spec: KernelSpec, writes: Sequence[str]) -> Price:
        """``spec`` writing its sinks and the optional outputs in ``writes``."""
        if spec.template == VIEW:
            return Price(0, 0, 0.0, "view")
        c = self.cost(spec)
        extra = write_bytes(self.graph, [t for t in writes if t not in spec.outputs])
        mem = c.memory_us + us_for_bytes(extra, self.device)
        roof = max(mem, c.compute_us, c.latency_us)
        if roof < c.launch_us:
            bound = "launch"
        elif c.compute_us >= max(mem, c.latency_us):
            bound = "compute"
        else:
            bound = "memory" if mem >= c.latency_us else "latency"
        if c.measured_us is not None:  # the bound stays the model's reading of the kernel
            return Price(
                c.bytes + extra, c.flops, c.measured_us + us_for_bytes(extra, self.device), bound
            )
        return Price(c.bytes + extra, c.flops, (roof + c.launch_us) * c.scale, bound)

    def write_us(self, tensor: str) -> float:
        return us_for_bytes(self.graph.types[tensor].nbytes, self.device)


class Ranker:
    """The rules' ``Target.rank`` for one device: the predicted time of a
    spec, remembered per (template, primitives, sinks, configuration), since
    enumeration and the baselines judge the same sets more than once."""

    def __init__(self, device: Device):
        self.device = device
        self._graph: Graph | None = None
        self._seen: dict[tuple, float] = {}

    def __call__(self, graph: Graph, spec: KernelSpec) -> float:
        if graph is not self._graph:
            self._graph, self._seen = graph, {}
        key = (spec.template, spec.nodes, spec.outputs, spec.config)
        if key not in self._seen:
            self._seen[key] = cost(graph, spec, self.device).time_us
        return self._seen[key]


def flops(graph: Graph, spec: KernelSpec) -> int:
    return sum(split_flops(graph, spec))


def split_flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(dot flops, other flops): tensor-core work and CUDA-core work, as the
    spec's template counts them."""
    return template(spec.template).flops(graph, spec)


def grid(graph: Graph, spec: KernelSpec) -> int:
    """Thread blocks the kernel launches (as its template computes its grid)."""
    return template(spec.template).blocks(graph, spec)


def loop_steps(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(dependent loop steps per block, steps in flight at once)."""
    return template(spec.template).steps(graph, spec)


def resident(graph: Graph, spec: KernelSpec, device: Device) -> int:
    """Blocks of this kernel one SM holds at once (warps and shared memory)."""
    by_warps = max(1, WARPS_PER_SM // spec.config.num_warps)
    shared = working_set(graph, spec).shared_bytes
    by_smem = max(1, device.smem_per_block_kb * 1024 // shared) if shared else by_warps
    return max(1, min(by_warps, by_smem, 32))


def cost(graph: Graph, spec: KernelSpec, device: Device) -> Cost:
    """The cost of ``spec`` writing its sinks (optional outputs are priced
    by ``Prices.price``)."""
    t = template(spec.template)
    if t.terms is not None:  # a view, a library call: the template's own terms
        return Cost(*t.terms(graph, spec, device))
    loaded = _moved(graph, spec)
    nbytes = loaded + 2 * 4 * scratch(graph, spec)[0]  # a split's partials: out and in
    blocks = max(1, grid(graph, spec))
    per_sm = resident(graph, spec, device)
    busy = min(blocks, device.sms)
    steps, ahead = loop_steps(graph, spec)
    # memory: the device's achievable bandwidth, or what the busy SMs keep in
    # flight: each block issues one step's loads (``ahead`` steps when pipelined)
    per_block = loaded / blocks / max(1, steps) * min(ahead, max(1, steps))
    in_flight = min(BYTES_IN_FLIGHT_PER_SM, min(per_sm, math.ceil(blocks / busy)) * per_block)
    bandwidth = min(
        device.bandwidth_gbs * 1e3 * ACHIEVABLE_BANDWIDTH, busy * in_flight / DRAM_LATENCY_US
    )  # bytes per µs
    memory_us = nbytes / bandwidth if nbytes else 0.0
    # compute: dots at their rate, the rest on CUDA cores, in whole waves over the SMs
    dots, other = split_flops(graph, spec)
    quantised = device.sms * math.ceil(blocks / device.sms) / blocks
    dots_us = t.dot_us(graph, spec, dots, device) if dots else 0.0
    compute_us = dots_us + us_for_flops(other, device.fp32_tflops)
    compute_us *= quantised
    # latency: each wave of blocks waits for its chain of dependent loads
    waves = math.ceil(blocks / (device.sms * per_sm))
    latency_us = waves * DRAM_LATENCY_US * (1 + steps / ahead)
    if split_k(spec.config) > 1:  # the last program's atomic, then its loads of the partials
        latency_us += FIXUP_LATENCIES * DRAM_LATENCY_US
    return Cost(nbytes, dots + other, memory_us, compute_us, LAUNCH_US, latency_us, blocks)


def copy(nbytes: int, elements: int, device: Device) -> Cost:
    """A device-to-device copy of ``elements`` elements (``nbytes`` bytes) as
    ATen's multi-tensor copy runs it (``FOREACH_CHUNK`` elements a block of
    ``FOREACH_THREADS``): every byte read once and written once at the
    achievable bandwidth, each wave of blocks waiting for one dependent
    access, and a launch.  Not a kernel of a plan: torch.compile runs it
    before a CUDA-graph replay (``calibrate/harness.py``)."""
    blocks = max(1, math.ceil(elements / FOREACH_CHUNK))
    waves = math.ceil(blocks / (device.sms * max(1, WARPS_PER_SM * 32 // FOREACH_THREADS)))
    moved = 2 * nbytes
    return Cost(
        moved, 0, us_for_bytes(moved, device), 0.0, LAUNCH_US, waves * DRAM_LATENCY_US, blocks
    )


# per graph: the bytes a set moves, which do not depend on the configuration
_MOVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _moved(graph: Graph, spec: KernelSpec) -> int:
    seen = _MOVED.setdefault(graph, {})
    key = (spec.template, spec.nodes, spec.inputs, spec.outputs, spec.roles)
    if key not in seen:
        streams = template(spec.template).passes(graph, spec)
        seen[key] = read_bytes(graph, spec) * streams + write_bytes(graph, spec.outputs)
    return seen[key]
