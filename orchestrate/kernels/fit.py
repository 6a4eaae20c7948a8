"""On-chip working sets: does a kernel with this configuration fit one block?

One model per template, read from the spec (its roles and its launch
configuration), which the template's rule names as its ``working_set``, and
the one fit check every rule runs before it accepts a set (``fits``).  Per thread block:

``shared_bytes``  shared memory Triton allocates for the kernel as emitted.
                  Calibrated against ``metadata.shared`` of 4,512 compiles for
                  sm_90 (Triton 3.9, pointers 16-byte aligned as the JIT
                  specialises them); ``tests/templates/test_fit.py`` keeps every
                  template x configuration the examples use between 1x and 2x
                  of the compiled figure.
``spills``        a rule per template that says when ptxas would spill
                  registers to local memory (fp32 accumulators and operand
                  tiles per thread, and IEEE fp32 dots' K tile); calibrated
                  on the same compiles: it catches every fp32 attention and
                  fp32 matmul that spills, and misses fp16 matmul and
                  attention spills of at most 0.6 KB (``tests/templates/test_fit.py``
                  holds every planned kernel of the examples under 1 KB).

The terms, with ``it`` the operand item size (2 for fp16 and bf16, 4 for
fp32), ``S`` stages and ``W`` warps:

* matmul / conv: the A (BLOCK_M x BLOCK_K) and B (BLOCK_K x BLOCK_N) tiles
  ``T``; every tile load of the K loop (operands and prologue inputs) is
  buffered ``S - 1`` more times when the loop is software-pipelined (more
  than one K step and ``S >= 2``); wgmma (fp16, bf16 and TF32, BLOCK_M >=
  64) keeps both tiles in shared memory, IEEE fp32 only computed tiles; the result tile
  is converted to the store layout through ``min(BLOCK_M, 128) x BLOCK_N``
  in the stored dtype (fp32 when an fp16 matmul's epilogue casts up).
  Split-K adds no shared memory (its partial tiles go through the result
  tile's layout conversion) but registers: ``SPLIT_K_SPILL``.
* merged matmul: one K loop whatever the segments (``templates/merged_matmul/emit.py``),
  so the largest segment's as a matmul (sm_90 compiles of 32
  configurations, 1 to 3 segments, fp16 and fp32: equal to the compiled
  figure, or twice it where the matmul model is).  A loop per segment
  would cost their sum: Triton gives each branch's pipelined buffers their
  own shared memory, though only one branch runs.
* attention and row reduce: their own models, beside their rules
  (``templates/attention/rule.py``, ``templates/row_reduce/rule.py``).
* pointwise, window, view: none.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from orchestrate.ir import HALF, Graph, Op
from orchestrate.kernels.region import ancestors_within
from orchestrate.kernels.spec import (
    Anchored,
    KernelSpec,
    Rejection,
    inlined,
    segment_specs,
    split_k,
)

# split-K (a matmul's SPLIT_K programs per tile): the tile's last program
# loads all SPLIT_K fp32 partial tiles at once (an unrolled loop) beside
# their sum, (SPLIT_K + 1) values per output element it holds.  ptxas spills
# from 288 such values per thread (fp16 with a GELU epilogue, sm_90: 64 x 64
# tiles at 4 warps, SPLIT_K 8: 128 B; 128 x 64, SPLIT_K 4: 168 B) and does
# not at 192 (128 x 64, SPLIT_K 2: 148 registers) or 160 (64 x 64, SPLIT_K 4:
# 144 registers): refused from 256.
SPLIT_K_SPILL = 256


@dataclass(frozen=True)
class WorkingSet:
    shared_bytes: int
    spills: bool  # ptxas would spill registers to local memory


def nothing_on_chip(graph: Graph, spec: KernelSpec) -> WorkingSet:
    """The working set of a kernel that keeps nothing in shared memory and
    cannot spill (pointwise, window, view)."""
    return WorkingSet(0, False)


def fits(
    graph: Graph, spec: KernelSpec, device, working_set: Callable[[Graph, KernelSpec], WorkingSet]
) -> KernelSpec | Rejection:
    """``spec`` when its ``working_set`` (the rule's) fits one thread block of ``device``."""
    ws = working_set(graph, spec)
    if ws.shared_bytes > device.smem_per_block_kb * 1024:
        return Rejection(
            f"{_tiles(spec)} need {ws.shared_bytes // 1024} KB of shared "
            f"memory > {device.smem_per_block_kb} KB per block on {device.name}"
        )
    if ws.spills:
        return Rejection(f"{_tiles(spec)} spill registers to local memory")
    return spec


def _tiles(spec: KernelSpec) -> str:
    c = spec.config
    blocks = ", ".join(f"{k}={v}" for k, v in c.blocks)
    return f"{spec.template} tiles ({blocks}, {c.num_warps} warps, {c.num_stages} stages)"


def itemsize(graph: Graph, tensor: str) -> int:
    return graph.types[tensor].itemsize


def tile_loads(graph: Graph, spec: KernelSpec, operand: str, prologue) -> list[int]:
    """Item sizes of the tensors loaded to make one tile of ``operand``: the
    operand itself, or each input its prologue nodes read from memory."""
    inside = set(spec.nodes)
    if operand not in inside:
        return [] if inlined(graph, operand) else [itemsize(graph, operand)]
    nodes = (ancestors_within(graph, operand, prologue) | {operand}) & set(prologue)
    return [
        itemsize(graph, i)
        for n in nodes
        for i in graph.producer[n].inputs
        if i not in inside and not inlined(graph, i)
    ]


# per graph: the operand loads of a matmul set, which do not depend on the
# configuration (the rules try every configuration of the same set)
_LOADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _operand_loads(graph: Graph, spec: KernelSpec) -> tuple[list[int], list[int]]:
    seen = _LOADS.setdefault(graph, {})
    key = (spec.nodes, spec.roles)
    if key not in seen:
        roles = spec.roles
        assert isinstance(roles, Anchored)
        a, b = graph.producer[roles.anchor].inputs
        seen[key] = (
            tile_loads(graph, spec, a, roles.prologue),
            tile_loads(graph, spec, b, roles.prologue),
        )
    return seen[key]


def dot_tiles(graph: Graph, spec: KernelSpec) -> WorkingSet:
    c, roles = spec.config, spec.roles
    assert isinstance(roles, Anchored)
    anchor = graph.producer[roles.anchor]
    dtype = graph.types[anchor.inputs[0]].dtype
    half = dtype in HALF
    it = 2 if half else graph.types[anchor.inputs[0]].itemsize
    bm, bn, bk, stages, warps = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c.num_stages, c.num_warps
    a, b = bm * bk, bk * bn
    if anchor.op is Op.CONV:
        k = math.prod(graph.types[anchor.inputs[1]].shape[1:])
        a_loads, b_loads = (
            [itemsize(graph, anchor.inputs[0])],
            [itemsize(graph, anchor.inputs[1])],
        )
        a_piped = not half  # the im2col gather of 2-byte values is not pipelined
        b_piped = not (half and k % 8)  # nor weight rows off 16-byte alignment
        a_direct = b_direct = True
    else:
        k = graph.types[anchor.inputs[0]].shape[-1]
        a_loads, b_loads = _operand_loads(graph, spec)
        a_piped = b_piped = True
        a_direct, b_direct = (t not in spec.nodes for t in anchor.inputs)
    looped = sum(a_loads) * a * a_piped + sum(b_loads) * b * b_piped
    steps = math.ceil(k / bk)
    piped = stages >= 2 and steps > 1 and looped > 0
    tensor_cores = half or c.precision == "tf32"
    # the result tile is converted in the dtype it is stored in (an fp16
    # matmul whose epilogue casts up and adds an fp32 residual: fp32)
    out_it = max((itemsize(graph, t) for t in spec.outputs), default=it)
    result = min(bm, 128) * bn * max(it, out_it)
    tiles = (a + b) * it
    if tensor_cores and bm >= 64:  # wgmma: both operand tiles in shared memory
        body = tiles + (stages - 1) * looped if piped else tiles
        # an operand gathered without pipelining (half im2col) keeps its
        # buffer live while the result tile is converted: no reuse
        smem = body + result if not a_piped else max(result, body)
    elif not piped:
        smem = tiles + result if steps == 1 else max(tiles, result)
    else:
        computed = a * it * (not a_direct or not a_piped) + b * it * (not b_direct or not b_piped)
        smem = max(result, (stages - 1) * looped + computed)
    per_thread = 32 * warps
    # split-K's fix-up loads the SPLIT_K partial tiles at once beside their sum
    fix_up = (split_k(c) + 1) * bm * bn / per_thread if split_k(c) > 1 else 0
    if tensor_cores:
        spills = bm * bn / per_thread >= 128 or fix_up >= SPLIT_K_SPILL
        # a half im2col tile is gathered into registers, unpipelined: at 64
        # values a thread (64 x 128 tiles, 4 warps) ResNet-50's and
        # Inception's deep convs spilled 1.3-2.1 KB
        spills = spills or (anchor.op is Op.CONV and half and a / per_thread >= 64)
    else:
        # IEEE fp32: the FMA loop over BLOCK_K is unrolled with its operand
        # slices in registers.  At BLOCK_K >= 64 ptxas spills kilobytes once an
        # epilogue adds pressure (16 x 128 x 64 with a GELU: 11 KB at 4 warps,
        # 4.7 KB at 8; 16 x 64 x 64 with one: none), so 64 is refused
        # outright; and past 512 FMAs a thread per K step (a UNet stem's
        # 64 x 64 x 32 at 4 warps: 12 KB; MobileNet's 128 x 64 x 32: 21 KB)
        spills = bk >= 64 or bm * bn * bk / per_thread > 512
        spills = spills or (bm * bn + (bm + bn) * bk) / per_thread >= 128
        spills = spills or fix_up >= SPLIT_K_SPILL
    return WorkingSet(smem, spills)


def merged(graph: Graph, spec: KernelSpec) -> WorkingSet:
    """One K loop for all segments: the largest segment's working set as a
    matmul (their tiles are the same; their epilogues' inputs differ)."""
    parts = [dot_tiles(graph, s) for s in segment_specs(graph, spec)]
    return WorkingSet(max(p.shared_bytes for p in parts), any(p.spills for p in parts))
