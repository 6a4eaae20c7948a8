"""On-chip working sets: does a kernel with this configuration fit one block?

One model per template, read from the spec's launch configuration, and the
one fit check every rule runs before it accepts a set (``fits``).  Figures
are per thread block:

``shared_bytes``  shared memory Triton allocates: the software-pipelined
                  operand tiles of ``tl.dot`` and the scratch of reductions
                  and layout conversions (calibrated against
                  ``metadata.shared`` of kernels compiled for sm_90, see
                  ``tests/test_fit.py``);
``registers``     32-bit values one thread holds at the peak: accumulator
                  tiles and the tiles an epilogue or a score chain keeps
                  live, spread over ``32 * num_warps`` threads.

A kernel fits when ``shared_bytes`` is within the device's per-block shared
memory and ``registers`` within ``MAX_REGISTERS`` per thread (what an sm_70+
thread can address; past it Triton spills to local memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrate.ir import Graph
from orchestrate.kernels.spec import (
    ATTENTION,
    CONV,
    MATMUL,
    ROW_REDUCE,
    Anchored,
    AttentionRoles,
    KernelSpec,
    Rejection,
    Rows,
)

MAX_REGISTERS = 255  # per thread
# registers a thread keeps for addresses, masks and loop state, besides tiles
BASE_REGISTERS = 40


@dataclass(frozen=True)
class WorkingSet:
    shared_bytes: int
    registers: int  # per thread


def working_set(graph: Graph, spec: KernelSpec) -> WorkingSet:
    if spec.template in (MATMUL, CONV):
        return _dot_tiles(graph, spec)
    if spec.template == ATTENTION:
        return _attention(graph, spec)
    if spec.template == ROW_REDUCE:
        return _row_reduce(graph, spec)
    return WorkingSet(0, BASE_REGISTERS)


def fits(graph: Graph, spec: KernelSpec, device) -> KernelSpec | Rejection:
    """``spec`` when its working set fits one thread block of ``device``."""
    ws = working_set(graph, spec)
    limit = device.smem_per_block_kb * 1024
    c = spec.config
    what = ", ".join(f"{k}={v}" for k, v in c.blocks) + f", {c.num_stages} stages"
    if ws.shared_bytes > limit:
        return Rejection(
            f"{spec.template} tiles ({what}) need {ws.shared_bytes // 1024} KB of shared "
            f"memory > {device.smem_per_block_kb} KB per block on {device.name}"
        )
    if ws.registers > MAX_REGISTERS:
        return Rejection(
            f"{spec.template} tiles ({what}) need about {ws.registers} registers per thread "
            f"> {MAX_REGISTERS}"
        )
    return spec


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "float16" else 8 if dtype in ("float64", "int64", "uint64") else 4


def _threads(spec: KernelSpec) -> int:
    return 32 * spec.config.num_warps


def _dot_tiles(graph: Graph, spec: KernelSpec) -> WorkingSet:
    """matmul / conv: ``num_stages`` copies of the A (BLOCK_M x BLOCK_K) and B
    (BLOCK_K x BLOCK_N) tiles in shared memory; the fp32 accumulator and one
    tile per epilogue input in registers."""
    c = spec.config
    roles = spec.roles
    assert isinstance(roles, Anchored)
    anchor = graph.producer[roles.anchor]
    item = _itemsize(graph.types[anchor.inputs[0]].dtype)
    bm, bn, bk = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]
    smem = (bm * bk + bk * bn) * item * c.num_stages
    epilogue_inputs = sum(
        1 for n in roles.epilogue for i in graph.producer[n].inputs if i not in spec.nodes
    )
    tile = math.ceil(bm * bn / _threads(spec))
    return WorkingSet(smem, BASE_REGISTERS + (1 + epilogue_inputs) * tile)


def _attention(graph: Graph, spec: KernelSpec) -> WorkingSet:
    """The query tile once and ``num_stages`` copies of the K and V tiles in
    shared memory; the output accumulator, the query tile and one score
    tile in registers."""
    c = spec.config
    roles = spec.roles
    assert isinstance(roles, AttentionRoles)
    item = _itemsize(graph.producer[roles.m1].dtype)
    bm, bn, bd, bdv = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_D"], c["BLOCK_DV"]
    smem = (bm * bd + c.num_stages * bn * (bd + bdv)) * item
    regs = math.ceil(bm * (bdv + bn + bd) / _threads(spec))
    return WorkingSet(smem, BASE_REGISTERS + regs)


def _row_reduce(graph: Graph, spec: KernelSpec) -> WorkingSet:
    """Cross-warp reductions exchange one partial value per row and warp."""
    roles = spec.roles
    assert isinstance(roles, Rows)
    c = spec.config
    smem = 4 * c["BLOCK_ROWS"] * c.num_warps * len(roles.reductions)
    return WorkingSet(smem, BASE_REGISTERS)
