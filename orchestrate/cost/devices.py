"""GPUs the cost model knows: public datasheet figures, one row per device.

Bandwidths are HBM/GDDR peak; throughputs are dense (no sparsity) peaks in
TFLOP/s.  ``fp32`` is the CUDA-core rate (what elementwise code and IEEE fp32
``tl.dot`` get); ``tf32`` and ``fp16`` are tensor-core rates.  Shared memory
is the most one thread block may use; the register file is per SM.  ``arch``
is the compute capability x10 that ``compile_check`` compiles for, and the
per-thread register and per-block thread limits are the CUDA programming
guide's for those capabilities (255 and 1,024 on every row here).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrate.errors import InputError


@dataclass(frozen=True)
class Device:
    name: str
    label: str
    bandwidth_gbs: float  # device memory, GB/s
    fp32_tflops: float  # CUDA cores
    tf32_tflops: float  # tensor cores, dense
    fp16_tflops: float  # tensor cores, dense, fp32 accumulate
    sms: int
    smem_per_block_kb: int  # opt-in maximum per thread block (227 KB = 232,448 B on Hopper)
    arch: int  # compute capability x10: 90 is sm_90
    registers_per_sm: int = 65536  # 32-bit registers
    registers_per_thread: int = 255
    threads_per_block: int = 1024


DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        # NVIDIA H200 SXM: 4.8 TB/s HBM3e; same SM array as H100 SXM
        Device("h200", "NVIDIA H200 SXM", 4800, 66.9, 494.7, 989.4, 132, 227, arch=90),
        # NVIDIA H100 SXM5 80GB: 3.35 TB/s HBM3
        Device("h100", "NVIDIA H100 SXM", 3350, 66.9, 494.7, 989.4, 132, 227, arch=90),
        # NVIDIA H100 PCIe 80GB: 2.0 TB/s HBM2e, 114 SMs
        Device("h100-pcie", "NVIDIA H100 PCIe", 2000, 51.2, 378.0, 756.0, 114, 227, arch=90),
        # NVIDIA A100 SXM4 80GB: 2.039 TB/s HBM2e
        Device("a100", "NVIDIA A100 SXM 80GB", 2039, 19.5, 156.0, 312.0, 108, 163, arch=80),
        # NVIDIA A100 PCIe 40GB: 1.555 TB/s HBM2
        Device("a100-40gb", "NVIDIA A100 PCIe 40GB", 1555, 19.5, 156.0, 312.0, 108, 163, arch=80),
        # NVIDIA A100 SXM4 40GB (A100 datasheet, 40GB SXM column): 1.555 TB/s HBM2
        Device(
            "a100-40gb-sxm", "NVIDIA A100 SXM 40GB", 1555, 19.5, 156.0, 312.0, 108, 163, arch=80
        ),
        # NVIDIA B200 (HGX B200 datasheet, one GPU's eighth of the board): 8 TB/s HBM3e
        Device("b200", "NVIDIA B200", 8000, 75.0, 1125.0, 2250.0, 148, 227, arch=100),
        # NVIDIA V100 SXM2: 900 GB/s HBM2; no TF32 (fp32 runs on CUDA cores)
        Device("v100", "NVIDIA V100 SXM2", 900, 15.7, 15.7, 125.0, 80, 96, arch=70),
        # NVIDIA L4: 300 GB/s GDDR6
        Device("l4", "NVIDIA L4", 300, 30.3, 60.0, 121.0, 58, 99, arch=89),
        # NVIDIA L40S: 864 GB/s GDDR6
        Device("l40s", "NVIDIA L40S", 864, 91.6, 183.0, 362.0, 142, 99, arch=89),
        # NVIDIA A10: 600 GB/s GDDR6
        Device("a10", "NVIDIA A10", 600, 31.2, 62.5, 125.0, 72, 99, arch=86),
        # NVIDIA A10G (AWS G5; no NVIDIA datasheet): A10's 600 GB/s GDDR6, 80 SMs at
        # 1.71 GHz, tensor cores at the GeForce rate (fp16 with fp32 accumulate 70 TFLOP/s)
        Device("a10g", "NVIDIA A10G", 600, 35.0, 35.0, 70.0, 80, 99, arch=86),
        # NVIDIA RTX A6000 (datasheet): 768 GB/s GDDR6, 309.7 sparse tensor TFLOP/s
        Device("rtx-a6000", "NVIDIA RTX A6000", 768, 38.7, 77.4, 154.8, 84, 99, arch=86),
        # NVIDIA T4 (datasheet): 320 GB/s GDDR6, 65 TFLOP/s fp16/fp32 mixed; no TF32 (Turing)
        Device("t4", "NVIDIA T4", 320, 8.1, 8.1, 65.0, 40, 64, arch=75),
        # GeForce RTX 4090: 1008 GB/s GDDR6X; fp16 tensor with fp32 accumulate
        Device("rtx4090", "NVIDIA GeForce RTX 4090", 1008, 82.6, 82.6, 165.2, 128, 99, arch=89),
        # GeForce RTX 3090: 936 GB/s GDDR6X
        Device("rtx3090", "NVIDIA GeForce RTX 3090", 936, 35.6, 35.6, 71.0, 82, 99, arch=86),
        # GeForce RTX 3090 Ti (Ada Lovelace whitepaper's comparison table): 1008 GB/s GDDR6X
        Device("rtx3090ti", "NVIDIA GeForce RTX 3090 Ti", 1008, 40.0, 40.0, 80.0, 84, 99, arch=86),
    )
}
DEFAULT_DEVICE = "h100"

# substrings of torch.cuda.get_device_name() -> table row, most specific first
_NAME_HINTS = (
    ("H200", "h200"),
    ("H100 PCIe", "h100-pcie"),
    ("H100", "h100"),
    ("A100-PCIE-40GB", "a100-40gb"),
    ("A100-SXM4-40GB", "a100-40gb-sxm"),
    ("A100", "a100"),
    ("B200", "b200"),
    ("V100", "v100"),
    ("L40S", "l40s"),
    ("L4", "l4"),
    ("A10G", "a10g"),
    ("A10", "a10"),
    ("RTX A6000", "rtx-a6000"),
    ("T4", "t4"),
    ("4090", "rtx4090"),
    ("3090 Ti", "rtx3090ti"),
    ("3090", "rtx3090"),
)


def get_device(name: str | None) -> Device:
    """The table row for ``name``; the GPU present when None, else h100."""
    if name is None:
        return DEVICES[detect() or DEFAULT_DEVICE]
    key = name.lower()
    if key not in DEVICES:
        raise InputError(f"--device {name}: unknown device (known: {', '.join(DEVICES)})")
    return DEVICES[key]


def detect() -> str | None:
    """The table row of the local GPU, if there is one and it is in the table."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        gpu = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - no usable CUDA means no GPU
        return None
    return from_name(gpu)


def from_name(gpu: str) -> str | None:
    """The table row of a GPU named as ``torch.cuda.get_device_name`` names it
    ("NVIDIA H100 80GB HBM3", "Tesla T4"), or None."""
    return next((row for hint, row in _NAME_HINTS if hint in gpu), None)
