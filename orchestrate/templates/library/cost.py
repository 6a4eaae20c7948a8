"""The cost of a library kernel (cuBLAS, cuDNN, SDPA through torch).

    time = max(memory, compute, latency) + launches x LAUNCH_US

The library picks its own tiles, so none of the generated templates' terms
that read a launch configuration apply; the figures are in
``cost/figures.py``, every one a prediction.

**memory** = bytes / the achievable bandwidth: the operands and the bias read
once and the output written once (the library's tiles keep re-reads in L2),
plus what torch adds around the call:

* ``conv*`` and ``scaled_dot_product_attention`` return a new tensor, which
  the launcher copies into the plan's buffer: the output read and written
  again, one more kernel;
* ``conv*`` with a bias adds it in a kernel of its own after cuDNN's: the
  output read and written again, one more kernel;
* ``addmm`` / ``baddbmm`` with a bias that is not one row per output column
  of a 2-D product (cuBLASLt's bias epilogue) first copy the bias into the
  output: the output written and read again, one more kernel.

**compute** = dot flops / (peak x the library's efficiency) x tile
quantisation + other flops / the CUDA-core peak.  The peak is the dense
tensor-core rate for fp16 and bf16 (and for an fp32 conv under ``--tf32``,
the TF32 rate) and the CUDA-core rate for fp32 (library kernels run IEEE
fp32 otherwise, see ``templates/library/emit.py``); efficiency is
``LIBRARY_GEMM_EFFICIENCY`` (matmul on tensor cores; SGEMM at
``terms.fp32_dot_efficiency``), ``LIBRARY_CONV_EFFICIENCY`` by kind of
convolution (``conv_kind``) or ``LIBRARY_ATTENTION_EFFICIENCY``.  Blocks are ``LIBRARY_TILE`` squares of the
GEMM's output (per batch entry, per group) or 128 query rows per batch
entry (FlashAttention-2's), spread in whole waves over the SMs.

**split-K**: cuBLAS splits the K loop of a GEMM whose tiles underfill the
device (its heuristics and Hopper's stream-K kernels), so a library matmul
is priced at the split S (1 to ``LIBRARY_MAX_SPLIT_K``, at least
``LIBRARY_MIN_K_PER_SPLIT`` of K each) that its terms make fastest: S times
the blocks, the fp32 partial tiles written and read back (S x M x N x 4
bytes each way) and, for S > 1, one more kernel that reduces them.

**latency** = ``LIBRARY_LATENCY_US``: the least time one library kernel takes.

**launch** = ``LAUNCH_US`` per kernel the call launches (CUDA-graph replay:
the runner captures library calls with the rest; the host's per-call cost,
``LIBRARY_HOST_US``, is paid at capture only and not charged).
"""

from __future__ import annotations

import math

from orchestrate.cost.devices import Device
from orchestrate.cost.figures import (
    ACHIEVABLE_BANDWIDTH,
    LAUNCH_US,
    LIBRARY_ATTENTION_EFFICIENCY,
    LIBRARY_CONV_EFFICIENCY,
    LIBRARY_GEMM_EFFICIENCY,
    LIBRARY_LATENCY_US,
    LIBRARY_MAX_SPLIT_K,
    LIBRARY_MIN_K_PER_SPLIT,
    LIBRARY_TILE,
    SFU_FLOPS,
)
from orchestrate.cost.terms import fp32_dot_efficiency
from orchestrate.ir import Graph
from orchestrate.kernels.spec import (
    LIBRARY_ATTENTION,
    LIBRARY_CONV,
    LIBRARY_MATMUL,
    KernelSpec,
    LibraryAttention,
    LibraryCall,
)

HALF = ("float16", "bfloat16")
FLASH_ROWS = 128  # query rows per FlashAttention-2 block


def library_flops(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """(dot flops, other flops): the product's multiply-adds, and the
    epilogue's or softmax's work on CUDA cores."""
    r = spec.roles
    if isinstance(r, LibraryAttention):
        m1, m2 = graph.producer[r.m1], graph.producer[r.m2]
        d = graph.types[m1.inputs[0]].shape[-1]
        scores = m1.type.size
        dots = 2 * scores * d + 2 * scores * m2.shape[-1]
        # scale, mask, max, subtract, exp, sum per score; one division per output
        return dots, scores * (SFU_FLOPS + 5) + m2.type.size
    assert isinstance(r, LibraryCall)
    anchor = graph.producer[r.anchor]
    if spec.template == LIBRARY_CONV:
        dots = 2 * anchor.type.size * math.prod(graph.types[anchor.inputs[1]].shape[1:])
    else:
        dots = 2 * anchor.type.size * graph.types[anchor.inputs[0]].shape[-1]
    return dots, anchor.type.size * len(r.epilogue)


def library_terms(
    graph: Graph, spec: KernelSpec, device: Device, read: int, written: int
) -> tuple[int, int, float, float, float, float, int]:
    """(bytes, flops, memory µs, compute µs, launch µs, latency µs, blocks)
    of a library spec that reads ``read`` bytes and writes ``written``
    (counted by ``roofline.cost`` as for any kernel): ``roofline.Cost``'s
    fields."""
    out = graph.types[spec.outputs[0]].nbytes
    extra, launches = _around(graph, spec, out)
    dots, other = library_flops(graph, spec)
    rate = _rate(graph, spec, device)
    best = None
    for split in _splits(graph, spec):
        partials = 2 * split * _output_elements(graph, spec) * 4 if split > 1 else 0
        nbytes = read + written + extra + partials
        memory_us = nbytes / (device.bandwidth_gbs * 1e3 * ACHIEVABLE_BANDWIDTH)
        blocks = _blocks(graph, spec) * split
        quantised = device.sms * math.ceil(blocks / device.sms) / blocks
        compute_us = dots / (rate * 1e6) * quantised + other / (device.fp32_tflops * 1e6)
        terms = (
            nbytes,
            dots + other,
            memory_us,
            compute_us,
            LAUNCH_US * (launches + (split > 1)),
            LIBRARY_LATENCY_US,
            blocks,
        )
        time_us = max(memory_us, compute_us, LIBRARY_LATENCY_US) + terms[4]
        if best is None or time_us < best[0]:
            best = (time_us, terms)
    return best[1]


def _splits(graph: Graph, spec: KernelSpec) -> range:
    """The K splits a library matmul may run at (1 for anything else)."""
    r = spec.roles
    if spec.template != LIBRARY_MATMUL or not isinstance(r, LibraryCall):
        return range(1, 2)
    k = graph.types[graph.producer[r.anchor].inputs[0]].shape[-1]
    return range(1, max(1, min(LIBRARY_MAX_SPLIT_K, k // LIBRARY_MIN_K_PER_SPLIT)) + 1)


def _output_elements(graph: Graph, spec: KernelSpec) -> int:
    return graph.producer[spec.anchor].type.size


def _around(graph: Graph, spec: KernelSpec, out: int) -> tuple[int, int]:
    """(bytes, kernels) of the call with what torch adds around it."""
    r = spec.roles
    if spec.template == LIBRARY_ATTENTION:
        return 2 * out, 2  # SDPA, then the copy into the plan's buffer
    assert isinstance(r, LibraryCall)
    if spec.template == LIBRARY_CONV:
        return (4 * out, 3) if r.bias else (2 * out, 2)  # conv, bias add, copy
    if r.bias is None:
        return 0, 1
    anchor = graph.producer[r.anchor]
    lt_epilogue = (
        graph.types[anchor.inputs[1]].rank == 2
        and r.beta == 1.0
        and graph.types[r.bias].size == anchor.shape[-1]
    )
    return (0, 1) if lt_epilogue else (2 * out, 2)


def _blocks(graph: Graph, spec: KernelSpec) -> int:
    r = spec.roles
    if isinstance(r, LibraryAttention):
        *batch, lq, _ = graph.producer[r.m1].shape
        return max(1, math.ceil(lq / FLASH_ROWS) * math.prod(batch))
    anchor = graph.producer[r.anchor]
    if spec.template == LIBRARY_CONV:
        nb, m, *spatial = anchor.shape
        groups = anchor.attrs["group"]
        rows, cols, batch = nb * math.prod(spatial), m // groups, groups
    else:
        *lead, rows, cols = anchor.shape
        batch = math.prod(lead)
    return max(1, math.ceil(rows / LIBRARY_TILE) * math.ceil(cols / LIBRARY_TILE) * batch)


def _rate(graph: Graph, spec: KernelSpec, device: Device) -> float:
    """TFLOPS the library's dots run at: the dense peak for the dtype, times
    the library's efficiency for the call."""
    r = spec.roles
    anchor = graph.producer[r.m1 if isinstance(r, LibraryAttention) else r.anchor]
    dtype = graph.types[anchor.inputs[0]].dtype
    tensor_cores = dtype in HALF or spec.config.precision == "tf32"
    if dtype in HALF:
        peak = device.fp16_tflops
    elif spec.config.precision == "tf32":  # an fp32 conv or matmul under --tf32
        peak = device.tf32_tflops
    else:
        peak = device.fp32_tflops
    if spec.template == LIBRARY_ATTENTION:
        return peak * LIBRARY_ATTENTION_EFFICIENCY
    if spec.template == LIBRARY_CONV:
        return peak * LIBRARY_CONV_EFFICIENCY[conv_kind(anchor)]
    if not tensor_cores:  # SGEMM on CUDA cores
        return peak * fp32_dot_efficiency(device)
    return peak * LIBRARY_GEMM_EFFICIENCY


def conv_kind(conv) -> str:
    """``grouped`` (depthwise too), ``3d`` or ``2d`` (1-D too): the kinds whose
    cuDNN efficiency differs (``LIBRARY_CONV_EFFICIENCY``)."""
    if conv.attrs.get("group", 1) > 1:
        return "grouped"
    return "3d" if len(conv.shape) - 2 >= 3 else "2d"
