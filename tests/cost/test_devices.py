"""The GPU table's name hints: each GPU name as torch and KernelBench's timing
files spell it finds its own row, the most specific first."""

from __future__ import annotations

import pytest

from orchestrate.cost.devices import DEVICES, from_name


@pytest.mark.parametrize(
    "name, row",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm"),
        ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("Tesla T4", "t4"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA GeForce RTX 3090 Ti", "rtx3090ti"),
        ("NVIDIA GeForce RTX 3090", "rtx3090"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("AMD Instinct MI250X/MI250", None),
    ],
)
def test_a_gpu_name_finds_its_row(name, row):
    assert from_name(name) == row
    assert row is None or row in DEVICES
