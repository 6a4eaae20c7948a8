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
``emit/matmul.py``): S programs per output tile, each walking 1/S of the K
steps, so the grid has S times the blocks (more SMs busy, more bytes in
flight, fuller waves) and each block a chain 1/S as long.  What it costs:

* bytes: the fp32 partial tiles, S x M x N x 4 bytes written and the same
  read back by each tile's last program (priced at DRAM bandwidth, though
  most of it stays in L2), on top of what the kernel moves anyway; the bytes
  a block keeps in flight are its operand loads only;
* flops: S additions per output element in the fix-up (CUDA cores);
* latency: ``FIXUP_LATENCIES`` dependent accesses after the last wave (the
  arrival counter's atomic, then the partial tiles' loads).

``attention`` (flash attention, one kernel for softmax(scores) @ V):

* bytes: Q, K, V and every other external input (a mask, a bias) read once,
  the output written once; the scores and probabilities never leave the chip
  (K and V tiles re-read by each block of query rows are served from L2);
* flops: both matmuls (2·Lq·Lk·D and 2·Lq·Lk·Dv per batch entry), the score
  chain and the softmax per score (max, subtract, ``SFU_FLOPS`` for exp,
  sum), the online rescaling (one exp per row and one multiply per output
  element, per block of keys) and one division per output element; prologue
  nodes once per evaluation (Q once, K and V once per block of query rows,
  the score chain's side inputs once per score);
* the matmuls run at the tensor-core rate in half precision and on CUDA
  cores in fp32 (the kernel runs fp32 dots in IEEE, also under ``--tf32``);
* blocks: one per ``BLOCK_M`` query rows per batch entry; loop steps: key
  blocks of ``BLOCK_N``;
* split-KV (``SPLIT_K`` = S > 1): S times the blocks, each with 1/S of the
  key blocks; bytes: the fp32 partial states, S x (Dv + 2) per query row,
  written and read back; flops: the combine's S exps per row and its sums;
  latency: ``FIXUP_LATENCIES`` after the last wave, as split-K's fix-up.

``merged_matmul`` (sibling matmuls of one activation, ``kernels/siblings.py``):
one launch whose grid is every sibling's tiles, segment after segment (more
blocks than any one of them: fuller waves, more bytes in flight); bytes: the
activation read once, every weight and epilogue input, every output; flops
and loop steps: each segment's, as a matmul with its epilogue.

``norm_matmul`` (an RMSNorm / LayerNorm moved past the matmul it feeds,
``kernels/norm_matmul.py``): a matmul whose A operand is the norm's input x,
not the normalised n: bytes are x, gamma, beta, W and the epilogue inputs
read once and the outputs written (n is never written, and no row-reduce
kernel runs); grid, loop steps and dots are the matmul's (no split-K).  CUDA
cores: per element of x, once per column of tiles, x's own prologue,
``NORM_STAT_FLOPS`` for the running statistics and the multiply by gamma;
the row nodes once per row per column of tiles; each shift's column vector
@ W once per row of tiles; scaling and shifting the accumulator, then the
epilogue, once per output element.

``norm_merged_matmul`` (a norm moved past merged siblings,
``kernels/norm_siblings.py``): the merged grid and bytes (x in place of n);
flops: each segment's as a ``norm_matmul`` of its columns.

``low_rank`` (x @ W + alpha (x @ A) @ B as one matmul over K + r,
``kernels/low_rank.py``): grid and loop steps of the matmul x @ W (no
split-K); bytes: x, W, A, B and the epilogue inputs read once, the outputs
written (x @ A, its product with B and x @ W are never written); dots: x @ W,
x @ A once per column of tiles (each recomputes its rows') and t @ B, at
the rank padded to BLOCK_R (the tensor cores multiply the padding too); CUDA
cores: alpha on t per column of tiles, then the epilogue.

A ``view`` (reshapes only) costs nothing and launches nothing.

Library kernels (``library_matmul``, ``library_conv``, ``library_attention``:
cuBLAS, cuDNN and SDPA through torch) have no launch configuration; their
terms, with the library's own efficiency figures and what torch launches
around the call, are in ``cost/library.py``.

**measured** (``optimize --tune``, ``cost/measured.py``): a spec timed on the
GPU costs its measured time instead of all of the above (plus the model's
price of optional outputs it also writes); one not timed costs the model's
time x a scale learnt from the measured ones (per template, the geometric
mean of measured / predicted; stated in full there).

Everything is read from the kernel spec: the template's roles (anchor,
prologue, epilogue, row space and phases, attention roles) and its launch
configuration.  Whether the working set fits on chip is the rules' check
(``kernels/fit.py``), not a cost; the shared memory it models sets how many
blocks an SM holds.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace

from orchestrate.cost.devices import Device
from orchestrate.cost.figures import (
    ACHIEVABLE_BANDWIDTH,
    BYTES_IN_FLIGHT_PER_SM,
    DRAM_LATENCY_US,
    FIXUP_LATENCIES,
    LAUNCH_US,
    SFU_FLOPS,
    TENSOR_CORE_EFFICIENCY,
    WARPS_PER_SM,
)
from orchestrate.cost.library import library_flops, library_terms
from orchestrate.cost.measured import Measured
from orchestrate.ir import Graph, Node, Op
from orchestrate.kernels.fit import working_set
from orchestrate.kernels.region import ROW_REDUCTIONS
from orchestrate.kernels.spec import (
    ATTENTION,
    CONV,
    LIBRARY,
    LOW_RANK,
    MATMUL,
    MERGED_MATMUL,
    NORM_MATMUL,
    NORM_MERGED_MATMUL,
    POINTWISE,
    ROW_REDUCE,
    VIEW,
    WINDOW,
    Anchored,
    AttentionRoles,
    KernelSpec,
    LowRank,
    Operand,
    Rows,
    segment_specs,
    split_k,
    split_k_scratch,
)

SFU_OPS = frozenset(
    {
        Op.EXP,
        Op.LOG,
        Op.SQRT,
        Op.RECIP,
        Op.TANH,
        Op.ERF,
        Op.SIGMOID,
        Op.SIN,
        Op.COS,
        Op.DIV,
        Op.POW,
        Op.MOD,
    }
)
FREE_OPS = frozenset({Op.RESHAPE, Op.IDENTITY})


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


def us_for_bytes(nbytes: float, device: Device) -> float:
    """Streaming at the achievable bandwidth of the whole device."""
    return nbytes / (device.bandwidth_gbs * 1e3 * ACHIEVABLE_BANDWIDTH)  # GB/s -> bytes/µs


def us_for_flops(flops: float, tflops: float) -> float:
    return flops / (tflops * 1e6)


class Prices:
    """The cost of each distinct spec on one device, computed once per
    structural hash (a transformer's layers share theirs); under ``--tune``
    measured, or scaled by what the measurements taught (``measured``)."""

    def __init__(self, graph: Graph, device: Device, measured: Measured | None = None):
        self.graph, self.device, self.measured = graph, device, measured
        self._cache: dict[str, Cost] = {}

    def cost(self, spec: KernelSpec) -> Cost:
        if spec.hash not in self._cache:
            c = cost(self.graph, spec, self.device)
            m = self.measured
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


def attention_flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(matmul flops, other flops) of an attention kernel (see the module doc)."""
    a = spec.roles
    assert isinstance(a, AttentionRoles)
    m1, m2 = graph.producer[a.m1], graph.producer[a.m2]
    *_, lq, lk = m1.shape
    scores, outputs = m1.type.size, m2.type.size
    rows = scores // lk
    key_blocks = math.ceil(lk / spec.config["BLOCK_N"])
    other = sum(scores * _weight(graph.producer[n].op) for n in a.scores)
    for n in a.softmax:
        node = graph.producer[n]
        if node.op in (Op.RMAX, Op.SUM, Op.SUB, Op.EXP, Op.CAST):
            other += scores * _weight(node.op)
        elif node.op is Op.DIV:
            other += outputs * _weight(node.op)  # the output is normalised once
        else:  # a floor: one per row
            other += rows
    other += key_blocks * (rows * SFU_FLOPS + outputs)  # rescale by exp(m_old - m_new)
    splits = split_k(spec.config)
    if splits > 1:  # split-KV's combine: one exp per row and slot, the slots' sums added
        other += splits * rows * SFU_FLOPS + split_k_scratch(graph, spec)[0]
    # prologue: Q's once, K's and V's once per block of query rows, side inputs per score
    query_blocks = math.ceil(lq / spec.config["BLOCK_M"])
    for n, operand in a.prologue:
        node = graph.producer[n]
        if node.op in FREE_OPS:
            continue
        evals = {
            Operand.Q: node.type.size,
            Operand.KV: node.type.size * query_blocks,
            Operand.SCORES: scores,
        }
        other += evals[operand] * _weight(node.op)
    return _anchor_flops(graph, m1) + _anchor_flops(graph, m2), other


def read_bytes(graph: Graph, spec: KernelSpec) -> int:
    inside = set(spec.nodes)
    total = 0
    for t in spec.inputs:
        ty = graph.types[t]
        readers = graph.consumers.get(t, ())
        if len(readers) > len(inside):  # a constant read all over the graph
            users = [graph.producer[n] for n in spec.nodes if t in graph.producer[n].inputs]
        else:
            users = [c for c in readers if c.name in inside]
        if users and all(c.op in (Op.SLICE, Op.GATHER) and c.inputs[0] == t for c in users):
            taken = sum(c.type.size for c in users)
            total += min(taken, ty.size) * ty.itemsize
        else:
            total += ty.nbytes
    return total


def write_bytes(graph: Graph, names) -> int:
    return sum(graph.types[t].nbytes for t in names)


def passes(graph: Graph, spec: KernelSpec) -> int:
    """How many times a row-reduce kernel streams its inputs: once when the
    row fits in registers, else once per phase plus the epilogue pass that
    stores full-space outputs of the last phase."""
    rows = spec.roles
    if not isinstance(rows, Rows) or not rows.looped:
        return 1
    last = any(s not in rows.row_space and rows.depth_of(s) == rows.phases for s in spec.outputs)
    return rows.phases + (1 if last else 0)


def flops(graph: Graph, spec: KernelSpec) -> int:
    return sum(split_flops(graph, spec))


def split_flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(dot flops, other flops): the matmul or conv anchor's multiply-adds,
    and everything else (CUDA-core work)."""
    if spec.template == VIEW:
        return 0, 0
    if spec.template == ATTENTION:
        return attention_flops(graph, spec)
    if spec.template in LIBRARY:
        return library_flops(graph, spec)
    if spec.template == NORM_MATMUL:
        return norm_matmul_flops(graph, spec)
    if spec.template == LOW_RANK:
        return low_rank_flops(graph, spec)
    if spec.template == MERGED_MATMUL:  # no prologue: each segment's dots and epilogue
        parts = [_anchored_flops(graph, s) for s in segment_specs(graph, spec)]
        return sum(p[0] for p in parts), sum(p[2] for p in parts)
    if spec.template == NORM_MERGED_MATMUL:  # each segment as a norm_matmul of its columns
        parts = [norm_matmul_flops(graph, s) for s in segment_specs(graph, spec)]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    roles = spec.roles
    other = 0
    if isinstance(roles, Anchored):
        anchor = graph.producer[roles.anchor]
        dots, prologue, epilogue = _anchored_flops(graph, spec)
        other = prologue * _reuse(spec, anchor) + epilogue
        other += split_k_scratch(graph, spec)[0]  # the fix-up adds the partials
        if anchor.op in (Op.MATMUL, Op.CONV):
            return dots, other
        return 0, dots + other  # a pool's window sums run on CUDA cores
    space = math.prod(spec.space)
    for n in spec.nodes:
        node = graph.producer[n]
        if node.op in FREE_OPS:
            continue
        if node.op in ROW_REDUCTIONS:
            other += graph.types[node.inputs[0]].size
        elif isinstance(roles, Rows) and n in roles.row_space:
            other += roles.rows * _weight(node.op)
        else:
            other += space * _weight(node.op)
    return 0, other


# the running row statistics per element of x: subtract the block mean,
# square, and two row sums (the tensor cores do not help: CUDA cores)
NORM_STAT_FLOPS = 4


def norm_matmul_flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(dot flops, other flops) of a norm moved past a matmul (see the module doc)."""
    roles = spec.roles
    mm = graph.producer[roles.anchor]
    *batch, m, n = mm.shape
    k = graph.types[roles.x].shape[-1]
    rows = math.prod(mm.shape[:-1])
    per_x = (
        NORM_STAT_FLOPS
        + bool(roles.scale[2])
        + sum(
            _weight(graph.producer[t].op)
            for t in roles.feed
            if graph.producer[t].op not in FREE_OPS
        )
    )
    per_row = sum(_weight(graph.producer[t].op) for t in roles.rows)
    col_tiles = _reuse(spec, mm)
    row_tiles = math.ceil(m / spec.config["BLOCK_M"]) * math.prod(batch)
    other = (rows * k * per_x + rows * per_row) * col_tiles
    other += len(roles.shifts) * 2 * k * n * row_tiles  # h_j @ W, once per row of tiles
    other += (1 + len(roles.shifts)) * mm.type.size + _anchored_flops(graph, spec)[2]
    return _anchor_flops(graph, mm), other


def low_rank_flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(dot flops, other flops) of a matmul with a low-rank branch (see the module doc)."""
    roles = spec.roles
    assert isinstance(roles, LowRank)
    mm = graph.producer[roles.anchor]
    rows, n = math.prod(mm.shape[:-1]), mm.shape[-1]
    k, r = graph.types[roles.x].shape[-1], roles.block_r
    col_tiles = _reuse(spec, mm)
    dots = _anchor_flops(graph, mm) + 2 * rows * k * r * col_tiles + 2 * rows * r * n
    return dots, rows * r * col_tiles + _anchored_flops(graph, spec)[2]


_ANCHORED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _anchored_flops(graph: Graph, spec: KernelSpec) -> tuple[int, int, int]:
    """(anchor flops, prologue flops per evaluation, epilogue flops) of an
    anchored set: the parts that do not depend on the configuration."""
    seen = _ANCHORED.setdefault(graph, {})
    key = (spec.nodes, spec.roles)
    if key not in seen:
        roles = spec.roles
        assert isinstance(roles, Anchored)
        anchor = graph.producer[roles.anchor]
        prologue = epilogue = 0
        for n in roles.prologue:
            node = graph.producer[n]
            if node.op not in FREE_OPS:
                prologue += node.type.size * _weight(node.op)
        for n in roles.epilogue:
            node = graph.producer[n]
            if node.op not in FREE_OPS:
                epilogue += anchor.type.size * _weight(node.op)
        seen[key] = (_anchor_flops(graph, anchor), prologue, epilogue)
    return seen[key]


def _reuse(spec: KernelSpec, anchor: Node) -> int:
    """How many programs load each operand element of a matmul: one per
    column of tiles (its prologue is evaluated that many times)."""
    if anchor.op is Op.MATMUL:
        return max(1, math.ceil(anchor.shape[-1] / spec.config["BLOCK_N"]))
    return 1


def _anchor_flops(graph: Graph, anchor: Node) -> int:
    if anchor.op is Op.MATMUL:
        k = graph.types[anchor.inputs[0]].shape[-1]
        return 2 * anchor.type.size * k
    if anchor.op is Op.CONV:
        w = graph.types[anchor.inputs[1]]
        return 2 * anchor.type.size * math.prod(w.shape[1:])
    return anchor.type.size * math.prod(anchor.attrs["kernel"])


def _weight(op: Op) -> int:
    return SFU_FLOPS if op in SFU_OPS else 1


HALF = ("float16", "bfloat16")


def dot_tflops(dtype: str, precision: str, device: Device) -> float:
    """The rate a dot of ``dtype`` operands runs at: tensor cores for half
    precision and TF32, at the efficiency a tiled GEMM reaches; CUDA cores
    for IEEE fp32, fp64 and integers."""
    if dtype in HALF:
        return device.fp16_tflops * TENSOR_CORE_EFFICIENCY
    if dtype == "float32" and precision == "tf32":
        return device.tf32_tflops * TENSOR_CORE_EFFICIENCY
    return device.fp32_tflops


def grid(graph: Graph, spec: KernelSpec) -> int:
    """Thread blocks the kernel launches (as the templates compute their grids)."""
    c = spec.config
    if spec.template in (POINTWISE, WINDOW):
        return math.ceil(math.prod(spec.space) / c["BLOCK"])
    if spec.template == ROW_REDUCE:
        rows = spec.roles
        assert isinstance(rows, Rows)
        return math.ceil(rows.rows / c["BLOCK_ROWS"])
    if spec.template in (MATMUL, NORM_MATMUL, LOW_RANK):
        *batch, m, n = graph.producer[spec.anchor].shape
        tiles = math.ceil(m / c["BLOCK_M"]) * math.ceil(n / c["BLOCK_N"]) * math.prod(batch)
        return tiles * split_k(c)
    if spec.template in (MERGED_MATMUL, NORM_MERGED_MATMUL):
        *batch, m, _ = graph.producer[spec.anchor].shape
        cols = sum(
            math.ceil(graph.producer[s.anchor].shape[-1] / c["BLOCK_N"])
            for s in spec.roles.segments
        )
        return math.ceil(m / c["BLOCK_M"]) * cols * math.prod(batch)
    if spec.template == CONV:
        cv = graph.producer[spec.anchor]
        nb, m, *spatial = cv.shape
        groups = cv.attrs["group"]
        gemm_m, gemm_n = nb * math.prod(spatial), m // groups
        return math.ceil(gemm_m / c["BLOCK_M"]) * math.ceil(gemm_n / c["BLOCK_N"]) * groups
    if spec.template == ATTENTION:
        a = spec.roles
        assert isinstance(a, AttentionRoles)
        *batch, lq, _ = graph.producer[a.m1].shape
        return math.ceil(lq / c["BLOCK_M"]) * math.prod(batch) * split_k(c)
    return 1


def loop_steps(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(dependent loop steps per block, steps in flight at once)."""
    c = spec.config
    piped = max(1, c.num_stages - 1)
    # split-K: its share
    if spec.template in (MATMUL, MERGED_MATMUL, NORM_MATMUL, NORM_MERGED_MATMUL, LOW_RANK):
        k = graph.types[graph.producer[spec.anchor].inputs[0]].shape[-1]
        return math.ceil(math.ceil(k / c["BLOCK_K"]) / split_k(c)), piped
    if spec.template == CONV:
        w = graph.types[graph.producer[spec.anchor].inputs[1]]
        return math.ceil(math.prod(w.shape[1:]) / c["BLOCK_K"]), piped
    if spec.template == ATTENTION:
        a = spec.roles
        assert isinstance(a, AttentionRoles)
        key_blocks = math.ceil(graph.producer[a.m1].shape[-1] / c["BLOCK_N"])
        return math.ceil(key_blocks / split_k(c)), piped  # split-KV: each its share
    if spec.template == ROW_REDUCE:
        rows = spec.roles
        assert isinstance(rows, Rows)
        if rows.looped:  # no dot: Triton does not pipeline these loads
            return math.ceil(rows.length / c["BLOCK_COLS"]) * passes(graph, spec), 1
    return 0, 1


def resident(graph: Graph, spec: KernelSpec, device: Device) -> int:
    """Blocks of this kernel one SM holds at once (warps and shared memory)."""
    by_warps = max(1, WARPS_PER_SM // spec.config.num_warps)
    shared = working_set(graph, spec).shared_bytes
    by_smem = max(1, device.smem_per_block_kb * 1024 // shared) if shared else by_warps
    return max(1, min(by_warps, by_smem, 32))


def cost(graph: Graph, spec: KernelSpec, device: Device) -> Cost:
    """The cost of ``spec`` writing its sinks (optional outputs are priced
    by ``Prices.price``)."""
    if spec.template == VIEW:
        return Cost(0, 0, 0.0, 0.0, 0.0)
    if spec.template in LIBRARY:
        return Cost(
            *library_terms(
                graph, spec, device, read_bytes(graph, spec), write_bytes(graph, spec.outputs)
            )
        )
    loaded = _moved(graph, spec)
    nbytes = loaded + 2 * 4 * split_k_scratch(graph, spec)[0]  # split-K partials: out and in
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
    compute_us = _dot_us(graph, spec, dots, device) + us_for_flops(other, device.fp32_tflops)
    compute_us *= quantised
    # latency: each wave of blocks waits for its chain of dependent loads
    waves = math.ceil(blocks / (device.sms * per_sm))
    latency_us = waves * DRAM_LATENCY_US * (1 + steps / ahead)
    if split_k(spec.config) > 1:  # the last program's atomic, then its loads of the partials
        latency_us += FIXUP_LATENCIES * DRAM_LATENCY_US
    return Cost(nbytes, dots + other, memory_us, compute_us, LAUNCH_US, latency_us, blocks)


# per graph: the bytes a set moves, which do not depend on the configuration
_MOVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _moved(graph: Graph, spec: KernelSpec) -> int:
    seen = _MOVED.setdefault(graph, {})
    key = (spec.template, spec.nodes, spec.inputs, spec.outputs, spec.roles)
    if key not in seen:
        seen[key] = read_bytes(graph, spec) * passes(graph, spec) + write_bytes(graph, spec.outputs)
    return seen[key]


def _dot_us(graph: Graph, spec: KernelSpec, dots: int, device: Device) -> float:
    if not dots:
        return 0.0
    if spec.template == ATTENTION:  # fp32 attention runs its dots in IEEE
        a = spec.roles
        return sum(
            us_for_flops(_anchor_flops(graph, m), dot_tflops(m.dtype, "ieee", device))
            for m in (graph.producer[a.m1], graph.producer[a.m2])
        )
    anchor = graph.producer[spec.anchor]
    dtype = graph.types[anchor.inputs[0]].dtype
    return us_for_flops(dots, dot_tflops(dtype, spec.config.precision, device))
