"""The counts every template's cost terms are made of, in one place.

``cost/roofline.py`` turns a kernel's bytes, flops, grid and loop steps into
a predicted time; each template (``orchestrate/templates/``) says how many
flops, blocks and dependent steps its kernels have, from these pieces: the
bytes a set reads and writes, the flops of an anchor (a matmul, conv or
pool) and of its prologue and epilogue, the weight of an op (``SFU_FLOPS``
for a transcendental, else one), and the rate a dot runs at.  The figures
these use live in ``cost/figures.py``; the peaks in ``cost/devices.py``.
"""

from __future__ import annotations

import math
import weakref

from orchestrate.cost.devices import Device
from orchestrate.cost.figures import (
    ACHIEVABLE_BANDWIDTH,
    ATTENTION_EFFICIENCY,
    DUAL_FP32_ARCHS,
    DUAL_FP32_DOT_EFFICIENCY,
    FP32_DOT_EFFICIENCY,
    SFU_FLOPS,
    TENSOR_CORE_EFFICIENCY,
)
from orchestrate.ir import Graph, Node, Op
from orchestrate.kernels.region import ROW_REDUCTIONS, ancestors_within
from orchestrate.kernels.spec import Anchored, KernelSpec, Rows, split_k, split_k_scratch

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


def us_for_bytes(nbytes: float, device: Device) -> float:
    """Streaming at the achievable bandwidth of the whole device."""
    return nbytes / (device.bandwidth_gbs * 1e3 * ACHIEVABLE_BANDWIDTH)  # GB/s -> bytes/µs


def us_for_flops(flops: float, tflops: float) -> float:
    return flops / (tflops * 1e6)


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
        if users and all(c.op in _SELECTS and c.inputs[0] == t for c in users):
            taken = sum(_selected(graph, c, inside) for c in users)
            total += min(taken, ty.size) * ty.itemsize
        else:
            total += ty.nbytes
    return total


_SELECTS = (Op.SLICE, Op.GATHER)


def _selected(graph: Graph, node: Node, inside: set[str]) -> int:
    """Elements of its input that a slice or gather ``node`` leads the kernel
    to read: its own size, or less where the one reader of it inside is a
    further slice or gather of it (one layer of a cache's first rows)."""
    size = node.type.size
    while True:
        nxt = [c for c in graph.consumers.get(node.name, ()) if c.name in inside]
        if len(nxt) != 1 or nxt[0].op not in _SELECTS or nxt[0].inputs[0] != node.name:
            return size
        node = nxt[0]
        size = min(size, node.type.size)


def write_bytes(graph: Graph, names) -> int:
    return sum(graph.types[t].nbytes for t in names)


def once(graph: Graph, spec: KernelSpec) -> int:
    """A kernel that streams its inputs once."""
    return 1


def passes(graph: Graph, spec: KernelSpec) -> int:
    """How many times a row-reduce kernel streams its inputs: once when the
    row fits in registers, else once per phase plus the epilogue pass that
    stores full-space outputs of the last phase."""
    rows = spec.roles
    if not isinstance(rows, Rows) or not rows.looped:
        return 1
    last = any(s not in rows.row_space and rows.depth_of(s) == rows.phases for s in spec.outputs)
    return rows.phases + (1 if last else 0)


_ANCHORED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def anchored_flops(graph: Graph, spec: KernelSpec) -> tuple[int, int, int]:
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
                prologue += node.type.size * weight(node.op)
        for n in roles.epilogue:
            node = graph.producer[n]
            if node.op not in FREE_OPS:
                epilogue += anchor.type.size * weight(node.op)
        seen[key] = (anchor_flops(graph, anchor), prologue, epilogue)
    return seen[key]


_SIDES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prologue_sides(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """The prologue flops of a matmul set per evaluation, split by the
    operand they make: (A's, B's); a node feeding both counts in both."""
    seen = _SIDES.setdefault(graph, {})
    key = (spec.nodes, spec.roles)
    if key not in seen:
        roles = spec.roles
        assert isinstance(roles, Anchored)
        inside = set(roles.prologue)
        sides = []
        for operand in graph.producer[roles.anchor].inputs:
            if operand not in inside:
                sides.append(0)  # loaded as it is
                continue
            feeding = ancestors_within(graph, operand, inside) | {operand}
            sides.append(
                sum(
                    graph.producer[n].type.size * weight(graph.producer[n].op)
                    for n in feeding
                    if graph.producer[n].op not in FREE_OPS
                )
            )
        seen[key] = (sides[0], sides[1])
    return seen[key]


def reuse(spec: KernelSpec, anchor: Node) -> int:
    """How many programs load each operand element of a matmul: one per
    column of tiles (its prologue is evaluated that many times)."""
    if anchor.op is Op.MATMUL:
        return max(1, math.ceil(anchor.shape[-1] / spec.config["BLOCK_N"]))
    return 1


def anchor_flops(graph: Graph, anchor: Node) -> int:
    if anchor.op is Op.MATMUL:
        k = graph.types[anchor.inputs[0]].shape[-1]
        return 2 * anchor.type.size * k
    if anchor.op is Op.CONV:
        w = graph.types[anchor.inputs[1]]
        return 2 * anchor.type.size * math.prod(w.shape[1:])
    return anchor.type.size * math.prod(anchor.attrs["kernel"])


def weight(op: Op) -> int:
    return SFU_FLOPS if op in SFU_OPS else 1


HALF = ("float16", "bfloat16")


def dot_tflops(dtype: str, precision: str, device: Device) -> float:
    """The rate a dot of ``dtype`` operands runs at: tensor cores for half
    precision and TF32, at the efficiency a tiled GEMM reaches; CUDA cores
    for IEEE fp32 (at ``fp32_dot_efficiency``), fp64 and integers."""
    if dtype in HALF:
        return device.fp16_tflops * TENSOR_CORE_EFFICIENCY
    if dtype == "float32" and precision == "tf32":
        return device.tf32_tflops * TENSOR_CORE_EFFICIENCY
    if dtype == "float32":
        return device.fp32_tflops * fp32_dot_efficiency(device)
    return device.fp32_tflops


def fp32_dot_efficiency(device: Device) -> float:
    """The share of the fp32 CUDA-core peak an IEEE fp32 GEMM reaches (figures.py)."""
    if device.arch in DUAL_FP32_ARCHS:
        return DUAL_FP32_DOT_EFFICIENCY
    return FP32_DOT_EFFICIENCY


def attention_tflops(dtype: str, device: Device) -> float:
    """The rate of a flash-attention kernel's dots: tensor cores for half
    precision, CUDA cores for fp32, at ``ATTENTION_EFFICIENCY`` of either."""
    peak = device.fp16_tflops if dtype in HALF else device.fp32_tflops
    return peak * ATTENTION_EFFICIENCY


def elementwise_flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(0, CUDA-core flops) of a set without an anchor: each node once per
    point of the iteration space (a row node once per row), a reduction
    once per element it reads."""
    roles = spec.roles
    space = math.prod(spec.space)
    other = 0
    for n in spec.nodes:
        node = graph.producer[n]
        if node.op in FREE_OPS:
            continue
        if node.op in ROW_REDUCTIONS:
            other += graph.types[node.inputs[0]].size
        elif isinstance(roles, Rows) and n in roles.row_space:
            other += roles.rows * weight(node.op)
        else:
            other += space * weight(node.op)
    return 0, other


def anchored_split_flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(dot flops, other flops) of an anchored set: the anchor's
    multiply-adds on the tensor cores (a pool's window sums on CUDA cores),
    its prologue once per tile that loads it (A's per column of tiles, B's
    per row), its epilogue once per output element, and split-K's
    additions of the partials."""
    roles = spec.roles
    assert isinstance(roles, Anchored)
    anchor = graph.producer[roles.anchor]
    dots, prologue, epilogue = anchored_flops(graph, spec)
    if anchor.op is Op.MATMUL and prologue:
        # A's prologue runs in every column of tiles, B's in every row
        on_a, on_b = prologue_sides(graph, spec)
        rows = max(1, math.ceil(anchor.shape[-2] / spec.config["BLOCK_M"]))
        other = on_a * reuse(spec, anchor) + on_b * rows + epilogue
    else:
        other = prologue * reuse(spec, anchor) + epilogue
    other += split_k_scratch(graph, spec)[0]  # the fix-up adds the partials
    if anchor.op in (Op.MATMUL, Op.CONV):
        return dots, other
    return 0, dots + other


def anchor_dot_us(graph: Graph, spec: KernelSpec, dots: int, device: Device) -> float:
    """The dots of an anchored kernel at the rate of its operands' dtype and
    the configuration's precision."""
    if not dots:
        return 0.0
    anchor = graph.producer[spec.anchor]
    dtype = graph.types[anchor.inputs[0]].dtype
    return us_for_flops(dots, dot_tflops(dtype, spec.config.precision, device))


def one_block(graph: Graph, spec: KernelSpec) -> int:
    return 1


def no_loop(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(dependent loop steps per block, steps in flight at once): none."""
    return 0, 1


def flat_blocks(graph: Graph, spec: KernelSpec) -> int:
    """Blocks of ``BLOCK`` points of the iteration space (pointwise, window)."""
    return math.ceil(math.prod(spec.space) / spec.config["BLOCK"])


def matmul_blocks(graph: Graph, spec: KernelSpec) -> int:
    """Output tiles per batch entry times the batch, times SPLIT_K."""
    c = spec.config
    *batch, m, n = graph.producer[spec.anchor].shape
    tiles = math.ceil(m / c["BLOCK_M"]) * math.ceil(n / c["BLOCK_N"]) * math.prod(batch)
    return tiles * split_k(c)


def matmul_steps(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """K steps of BLOCK_K (split-K: each program its share), ``num_stages - 1``
    of them in flight."""
    c = spec.config
    k = graph.types[graph.producer[spec.anchor].inputs[0]].shape[-1]
    return math.ceil(math.ceil(k / c["BLOCK_K"]) / split_k(c)), max(1, c.num_stages - 1)


def merged_blocks(graph: Graph, spec: KernelSpec) -> int:
    """Every segment's columns of tiles, for each row of tiles and batch entry."""
    c = spec.config
    *batch, m, _ = graph.producer[spec.anchor].shape
    cols = sum(
        math.ceil(graph.producer[s.anchor].shape[-1] / c["BLOCK_N"]) for s in spec.roles.segments
    )
    return math.ceil(m / c["BLOCK_M"]) * cols * math.prod(batch)
