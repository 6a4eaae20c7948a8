"""The figures the cost model uses beyond the device table, each with its source.

``orchestrate/cost/devices.py`` holds datasheet peaks.  A GPU reaches none of
them exactly; these are the factors and latencies that turn a datasheet into
a prediction.  Where a figure is an estimate rather than a measurement it
says so: no GPU has timed this project's kernels yet, and the measured-cost
issue (``optimize --tune``) replaces the model's numbers with timings.  Until
then every latency the model gives is a prediction.
"""

from __future__ import annotations

# -- device memory ------------------------------------------------------------

# Fraction of the datasheet bandwidth a streaming kernel achieves.  Measured:
# a device-to-device copy on an H200 moves about 4.3 TB/s of the 4.8 TB/s
# datasheet figure (0.896; issue 10's measurement).  Taken for every device:
# an estimate elsewhere (STREAM-like kernels on A100 and H100 report 85-93%).
ACHIEVABLE_BANDWIDTH = 0.9

# Latency of one dependent access to device memory, microseconds.  Estimate:
# published Hopper and Ampere microbenchmarks put a global-memory miss at
# about 500-1,000 cycles (0.3-0.6 µs at 1.7-1.9 GHz; Luo et al., "Benchmarking
# and Dissecting the Nvidia Hopper GPU Architecture", 2024; Jia et al.,
# "Dissecting the Ampere GPU Architecture", 2021).  The upper end is taken:
# a loaded GPU queues.
DRAM_LATENCY_US = 0.6

# Bytes one SM can keep in flight to device memory.  Estimate: Hopper's
# asynchronous copies (cp.async, TMA) land in shared memory, so a pipelined
# kernel can have several stages of operand tiles outstanding; 64 KB is about
# two stages of 128 x 64 fp16 A and B tiles.  By Little's law an SM then draws
# at most this many bytes per DRAM_LATENCY_US (about 110 GB/s, 3.3x its even
# share of an H200's achieved bandwidth), and a block only what it has issued:
# one loop step of its loads, or ``num_stages - 1`` steps when pipelined.  So
# a grid of fewer blocks than SMs, or with little in flight, cannot saturate
# memory.
BYTES_IN_FLIGHT_PER_SM = 64 * 1024

# Resident warps per SM (CUDA C Programming Guide, "Features and Technical
# Specifications": 64 on compute capability 7.0, 8.0 and 9.0; 48 on 8.6 and
# 8.9, where this overestimates occupancy).
WARPS_PER_SM = 64

# Dependent device-memory accesses a split-K matmul adds after its last wave:
# the tile's last program waits for its arrival counter's atomic (a round trip
# to L2), then loads the other programs' partial tiles (issued together, one
# more round trip).  Estimate, from the kernel's structure: each taken as a
# DRAM_LATENCY_US, though both are mostly served by L2 (about half as long).
FIXUP_LATENCIES = 2

# -- arithmetic -----------------------------------------------------------------

# Fraction of the dense tensor-core peak a tiled GEMM reaches.  Published:
# cuBLAS and autotuned Triton matmuls at 8192^3 reach 0.62-0.64 of the H100's
# dense fp16 peak (tritonbench's gemm figures; the measured-cost issue's
# survey), less than the 0.7-0.8 of NVIDIA's marketing figures; 0.62 taken
# for generated kernels.
TENSOR_CORE_EFFICIENCY = 0.62
# Fraction of the fp32 CUDA-core peak an IEEE fp32 GEMM reaches (cuBLAS's
# SGEMM, a Triton dot without TF32).  Fitted: KernelBench's eager fp32
# matmuls (single-matmul programs, 253 rows on 13 GPUs) reach 0.85 on sm_80,
# 0.70 on sm_90, 0.65 on sm_100, but 0.45-0.50 on sm_86 and sm_89, whose
# datasheet peak counts a second FP32 datapath per SM partition that a
# GEMM's FMA stream cannot keep busy beside its loads.
FP32_DOT_EFFICIENCY = 0.75
# (the architectures with that second datapath: Ampere's GA10x and Ada)
DUAL_FP32_ARCHS = (86, 89)
# (their fitted share: 0.45-0.50 measured)
DUAL_FP32_DOT_EFFICIENCY = 0.45
# Fraction of the peak a generated flash-attention kernel reaches.  Published:
# Triton's fused-attention tutorial and FlashAttention-2 forward reach
# 0.29-0.48 of the H100's dense fp16 peak (FlashAttention-3 paper, Shah et
# al., 2024, figures 5-6); 0.4 taken, the library's figure too.
ATTENTION_EFFICIENCY = 0.4
# Cost of a transcendental (exp, log, tanh, erf, sqrt, reciprocal, a
# division) in fp32 operations: the special-function units deliver 16 results
# per clock per SM against 128 fp32 FMAs (CUDA C Programming Guide,
# "Arithmetic Instructions" throughput table, compute capability 8.x and 9.0).
SFU_FLOPS = 8

# -- launches -----------------------------------------------------------------------

# Per-kernel overhead when the plan is replayed from a CUDA graph (the
# runner's default on a GPU), microseconds.  NVIDIA's "Getting Started with
# CUDA Graphs" (2019, V100) measures 3.4 µs per 2.9 µs kernel in a graph
# against 3.8 µs per kernel from a stream: about 0.5 µs between graph nodes.
# Another 0.5 µs is estimated for a grid's ramp-up and drain (the last wave's
# blocks finishing while no new kernel runs).  Estimate: to be measured.
LAUNCH_US = 1.0

# -- library kernels (cuBLAS, cuDNN, SDPA through torch) ------------------------------
# All predictions: no library call has been timed on a GPU by this project.

# Fraction of the dense tensor-core peak cuBLAS reaches on a GEMM large
# enough to fill the GPU (fp16, bf16, TF32).  Published: 0.62-0.64 at 8192^3
# on H100 (as TENSOR_CORE_EFFICIENCY); 0.64 taken.  IEEE fp32 runs SGEMM on
# CUDA cores at FP32_DOT_EFFICIENCY.  Skinny problems get less through tile
# quantisation (LIBRARY_TILE) and the latency floor.
LIBRARY_GEMM_EFFICIENCY = 0.64
# Output tile (rows = columns) assumed for cuBLAS's and cuDNN's kernels when
# counting how many thread blocks a call launches (and so whole waves over the
# SMs).  Assumption: CUTLASS / cuBLAS Hopper kernels for large problems use
# 128 x 128 or 128 x 256 tiles; split-K and stream-K heuristics, which help
# skinny problems, are not modelled (a pessimistic simplification).
LIBRARY_TILE = 128

# cuBLAS splits K where a GEMM's tiles underfill the GPU (split-K kernels
# among its heuristics' choices; stream-K on Hopper), into at most this many
# parts of at least this much of K each.  Estimate: CUTLASS's split-K
# examples and cuBLAS's heuristics keep each part to a few hundred of K; the
# split is priced at whichever S makes the library's terms fastest.
LIBRARY_MAX_SPLIT_K = 16
# (the least of K each part takes: same source)
LIBRARY_MIN_K_PER_SPLIT = 256

# Fraction of the peak (TF32 for an fp32 convolution under --tf32, as
# PyTorch lets cuDNN by default; fp16 tensor cores for half precision)
# cuDNN's convolutions reach, by kind.  Fitted: KernelBench's eager
# single-convolution programs on 13 GPUs, the efficiency that best fits each
# kind: 1-D and 2-D (plain, dilated, strided, transposed) 0.21 over 332 rows;
# 3-D 0.072 over 184 rows (cuDNN's 3-D kernels reach 15-30 TFLOP/s on an
# H100); grouped and depthwise 0.018 over 86 rows (they run off the tensor
# cores, bound by their loads).  One figure for all of them (0.6 before) put
# 3-D convolutions at a quarter of their measured time.
LIBRARY_CONV_EFFICIENCY = {"2d": 0.21, "3d": 0.072, "grouped": 0.018}
# Fraction of the peak torch's scaled_dot_product_attention reaches.  Source:
# the FlashAttention-3 paper (Shah et al., 2024) measures FlashAttention-2,
# the kernel behind torch's SDPA on Hopper, at about 35% of the H100's fp16
# peak in the forward pass (up to ~50% on long sequences); 0.4 taken.  fp32
# runs the memory-efficient kernel on CUDA cores, at the same fraction of the
# fp32 peak (an estimate).
LIBRARY_ATTENTION_EFFICIENCY = ATTENTION_EFFICIENCY

# The least time one library kernel takes, beyond its launch, microseconds.
# Estimate: the smallest cuBLAS GEMMs and cuDNN convolutions on Hopper and
# Ampere run in about 2-4 µs of kernel time (their prologue loads, a K loop
# of at least a few steps, the epilogue); 2 µs is taken.
LIBRARY_LATENCY_US = 2.0

# Host cost of one torch call (dispatcher, argument checks, the library's
# heuristic lookup), microseconds.  Estimate: torch eager's per-op overhead is
# commonly measured at 5-10 µs.  The runner captures the whole plan in a
# CUDA graph on a GPU and replays it, so that cost is paid at capture only;
# the model charges each library kernel its launches (LAUNCH_US each, as a
# generated kernel) and not this figure, which is stated for the uncaptured
# case (the first run, or ``cuda_graph=False``).
LIBRARY_HOST_US = 7.0

# -- the harnesses the model is checked against (orchestrate calibrate) --------------
# A published time includes the host's time around the call: Python, the
# dispatcher, torch.compile's guards, a CUDA graph's bookkeeping; the GPU
# waits meanwhile (calibrate/harness.py).  Each timing file's floor is read
# from its own small programs (harness.floors); these are the defaults for a
# file without one, microseconds, by who launches the kernels.  Source: the
# fastest level-1 program in KernelBench's H100_together timing files
# (commit a6dea99): eager 12.5 µs (22_Tanh), torch.compile default 39.6 µs
# (31_ELU), reduce-overhead 69.8 µs (22_Tanh).
HARNESS_FLOOR_US = {"eager": 12.5, "compile": 39.6, "graph": 69.8}
# The share of a floor paid again for every kernel of the call (a dispatch,
# a Triton launch, a graph node); the rest is paid once.  Source: the same
# files' programs of 1 to 8 kernels with no GPU time to speak of: eager
# about 14 µs more per op (1.0 of its floor), torch.compile default about
# 10 µs per kernel (0.25), the CUDA-graph modes 1-2 µs (0.02).
HARNESS_PER_KERNEL = {"eager": 1.0, "compile": 0.25, "graph": 0.02}
# ATen's multi-tensor kernels (``torch._foreach_copy_``, which torch.compile's
# CUDA-graph trees run before each replay to copy a call's inputs into the
# graph's own buffers): 65,536 elements a block (``kChunkSize`` in
# ATen/native/cuda/MultiTensorApply.cuh)
FOREACH_CHUNK = 65536
# of 512 threads (the same header's ``kBlockSize``)
FOREACH_THREADS = 512
# A program whose tensors together are smaller than this is "small": its GPU
# time is a few µs on any GPU of devices.py (16 MB at 1.5-8 TB/s is 2-11 µs,
# at the slowest, a T4's 320 GB/s, 50 µs), so what was measured is mostly
# the harness.  Estimate, chosen so that every pre-2025-07 KernelBench file
# has its elementwise level-1 programs below it.
SMALL_BYTES = 16 * 2**20
