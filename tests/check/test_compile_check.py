"""compile_check: every generated kernel compiles for its device's GPU with
the real Triton compiler, no GPU needed (Triton wheels ship ptxas and
cuobjdump), and fits the device's limits.  The run over the examples is
slow (minutes); the parsers, the limits and one small bundle are fast."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import orchestrate
from examples import export_example
from orchestrate import bundle
from orchestrate.bundle import regenerate
from orchestrate.check.compile_check import (
    Compiled,
    limit_violations,
    local_traffic,
    resource_usage,
    slowdowns,
)
from orchestrate.cost.devices import DEVICES
from orchestrate.templates import working_set
from tests.util import has_nvidia_backend

ROOT = Path(__file__).resolve().parents[2]

# `cuobjdump -res-usage -sass` of a compiled Relu kernel (Triton 3.9, sm_90;
# the cuobjdump the wheel ships), instructions cut after the first load
RELU_DUMP = """
Resource usage:
 Common:
  GLOBAL:0
 Function relu:
  REG:22 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:568 TEXTURE:0 SURFACE:0 SAMPLER:0

\tcode for sm_90a
\t.target\tsm_90a

\t\tFunction : relu
\t.headerflags\t@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                          /* 0x00000a00ff017b82 */
                                                                                   /* 0x000fe20000000800 */
        /*0010*/                   S2R R7, SR_CTAID.X ;                            /* 0x0000000000077919 */
                                                                                   /* 0x000e2e0000002500 */
        /*0160*/              @!P6 LDG.E R6, desc[UR4][R8.64] ;                    /* 0x000000040806e981 */
                                                                                   /* 0x000ea2000c1e1900 */
\t\t..........
"""

# the same of a 128 x 128 fp32 dot on one warp, which spills: its
# local-memory stores and loads, one of each width (ptxas -v reported 61,448 B
# of spill stores and 61,524 B of spill loads for the whole function, and
# local_traffic of the whole dump is their sum, 122,972 B)
SPILLING_DUMP = """
Resource usage:
 Common:
  GLOBAL:0
 Function big:
  REG:64 STACK:23752 SHARED:1024 LOCAL:0 CONSTANT[0]:568 TEXTURE:0 SURFACE:0 SAMPLER:0

\tcode for sm_90a
\t.target\tsm_90a

\t\tFunction : big
\t.headerflags\t@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                          /* 0x00000a00ff017b82 */
                                                                                   /* 0x000e220000000800 */
        /*0060*/                   STL [R1+0xac4], R56 ;                           /* 0x000ac43801007387 */
                                                                                   /* 0x000fe20000100800 */
        /*0180*/                   STL.64 [R1+0x1b0], R52 ;                        /* 0x0001b03401007387 */
                                                                                   /* 0x004fe80000100a00 */
        /*2cc0*/                   LDL.LU R44, [R1+0x60] ;                         /* 0x00006000012c7983 */
                                                                                   /* 0x001ea80000300800 */
        /*3470*/                   LDL.LU.64 R46, [R1+0x19f0] ;                    /* 0x0019f000012e7983 */
                                                                                   /* 0x001ee80000300a00 */
        /*9d00*/                   LDL R7, [R1+0xac4] ;                            /* 0x000ac40001077983 */
                                                                                   /* 0x001ea80000100800 */
        /*a2d0*/                   LDL.64 R46, [R1+0x1048] ;                       /* 0x00104800012e7983 */
                                                                                   /* 0x028ee80000100a00 */
\t\t..........
"""


def test_cuobjdump_resource_usage_is_read_per_function():
    assert resource_usage(RELU_DUMP) == {
        "relu": {
            "REG": 22,
            "STACK": 0,
            "SHARED": 0,
            "LOCAL": 0,
            "CONSTANT[0]": 568,
            "TEXTURE": 0,
            "SURFACE": 0,
            "SAMPLER": 0,
        }
    }
    assert resource_usage(SPILLING_DUMP)["big"]["STACK"] == 23752
    assert resource_usage("") == {}


def test_spill_bytes_are_the_local_stores_and_loads_by_width():
    assert local_traffic(RELU_DUMP) == {"relu": 0}  # a predicated global load is not one
    # STL 4 + STL.64 8 + LDL.LU 4 + LDL.LU.64 8 + LDL 4 + LDL.64 8
    assert local_traffic(SPILLING_DUMP) == {"big": 36}


# -- the device's limits ------------------------------------------------------------------

H200 = DEVICES["h200"]


def _compiled(**figures) -> Compiled:
    return Compiled(
        **{
            "function": "k",
            "shared": 0,
            "num_warps": 4,
            "num_stages": 3,
            "registers": 32,
            "spill_bytes": 0,
            "stack_bytes": 0,
            **figures,
        }
    )


def test_devices_name_their_target_and_limits():
    assert {d.name: d.arch for d in DEVICES.values()} == {
        "h200": 90,
        "h100": 90,
        "h100-pcie": 90,
        "a100": 80,
        "a100-40gb": 80,
        "a100-40gb-sxm": 80,
        "b200": 100,
        "v100": 70,
        "l4": 89,
        "l40s": 89,
        "rtx4090": 89,
        "a10": 86,
        "a10g": 86,
        "rtx-a6000": 86,
        "t4": 75,
        "rtx3090": 86,
        "rtx3090ti": 86,
    }
    assert H200.smem_per_block_kb * 1024 == 232_448
    assert {(d.registers_per_thread, d.threads_per_block) for d in DEVICES.values()} == {
        (255, 1024)
    }


def test_a_kernel_at_every_limit_is_within_them():
    assert limit_violations(_compiled(shared=232_448, registers=255, num_warps=8), H200) == []
    assert limit_violations(_compiled(registers=128, num_warps=16), H200) == []  # 65,536


@pytest.mark.parametrize(
    "figures, reason",
    [
        ({"shared": 232_449}, "shared memory 232,449 B > 232,448 B per block"),
        ({"registers": 256, "num_warps": 1}, "256 registers > 255 per thread"),
        (
            {"registers": 130, "num_warps": 16},
            "130 registers x 512 threads = 66,560 > 65,536 per SM",
        ),
        ({"registers": 16, "num_warps": 64}, "2048 threads > 1024 per block"),
    ],
)
def test_a_kernel_over_a_limit_gets_that_reason(figures, reason):
    assert limit_violations(_compiled(**figures), H200) == [reason]


def test_unknown_registers_are_not_checked_and_spills_do_not_fail():
    assert (
        limit_violations(_compiled(registers=None, spill_bytes=None, stack_bytes=None), H200) == []
    )
    spilling = _compiled(spill_bytes=11_368, stack_bytes=3_792)
    assert limit_violations(spilling, H200) == []
    assert slowdowns(spilling) == [
        "spills 11,368 B of registers (stores + loads)",
        "3,792 B of stack per thread",
    ]
    assert slowdowns(_compiled()) == []


# -- one small bundle through the command ------------------------------------------------

# main() in a process without TRITON_INTERPRET; argv[1] lowers the limits the
# bundle's device is checked against (not those it was planned with) or hides
# cuobjdump, to see each refusal through the real command
_MAIN = """
import json, sys
from dataclasses import replace
from orchestrate.check import compile_check
patch = json.loads(sys.argv[1])
device = compile_check.bundle_device
compile_check.bundle_device = lambda folder: replace(device(folder), **patch.get("limits", {}))
if patch.get("no_cuobjdump"):
    compile_check.cuobjdump_path = lambda: None
sys.exit(compile_check.main(sys.argv[2:]))
"""


def _compile_check(*args: str, **patch) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-c", _MAIN, json.dumps(patch), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory) -> Path:
    """y = softmax(relu(x @ w + b)): a matmul and a row reduction."""
    if not has_nvidia_backend():
        pytest.skip("triton has no NVIDIA backend")
    tmp = tmp_path_factory.mktemp("small")
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
        for n, s in (("w", (64, 32)), ("b", (32,)))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Softmax", ["r"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, tmp / "small.onnx")
    return orchestrate.optimize(tmp / "small.onnx", tmp / "small.orch", trials=0).path


@pytest.fixture(scope="module")
def small_report(small_bundle) -> list[dict]:
    run = _compile_check(str(small_bundle), "--json")
    if run.returncode and "ptxas" in run.stderr and "not found" in run.stderr:
        pytest.skip("no ptxas to compile with")
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout)


def _functions(folder: Path) -> dict[str, str]:
    """Planned kernel name -> the function it launches, from the KERNELS table."""
    text = (folder / "kernels.py").read_text()
    return dict(re.findall(r'"(k\d+_\w+)": \(launch_(\w+),', text))


def test_json_gives_each_kernel_its_figures(small_bundle, small_report):
    assert {r["kernel"] for r in small_report} == set(_functions(small_bundle).values())
    assert len(small_report) >= 2
    for r in small_report:
        assert r["bundle"] == str(small_bundle) and r["device"] == "h100" and r["arch"] == 90
        assert r["registers"] > 0 and r["shared_bytes"] >= 0, r
        assert r["spill_bytes"] >= 0 and r["stack_bytes"] >= 0, r
        assert r["num_warps"] in (1, 2, 4, 8, 16, 32) and r["num_stages"] >= 1, r
        assert r["within_limits"] is True and r["violations"] == [], r
    assert any(r["shared_bytes"] > 0 for r in small_report)  # the matmul's tiles


def test_the_working_set_model_bounds_the_compiled_shared_memory(small_bundle, small_report):
    """The spec's model (kernels/fit.py) is at least what the compiler
    allocates, so a kernel the planner accepts launches (tests/templates/test_fit.py
    checks every template and configuration of the examples the same way)."""
    contents = bundle.read(small_bundle)
    made = regenerate.regenerate(
        contents.plan, contents.constants, contents.manifest["model"]["file"], str(small_bundle)
    )
    compiled = {r["kernel"]: r["shared_bytes"] for r in small_report}
    functions = _functions(small_bundle)
    checked = 0
    for kernel, spec in zip(made.planned.plan.kernels, made.planned.specs):
        if kernel.name in functions:
            model = working_set(made.graph, spec).shared_bytes
            assert model >= compiled[functions[kernel.name]], (kernel.name, spec.config)
            checked += 1
    assert checked == len(functions)


def test_a_kernel_over_the_device_limits_fails_the_command(small_bundle):
    """Limits patched down to what the kernels exceed: exit 1, one line each;
    --arch compiles for another target under the same device's limits."""
    run = _compile_check(
        str(small_bundle),
        "--arch",
        "80",
        limits={"smem_per_block_kb": 0, "registers_per_thread": 8},
    )
    assert run.returncode == 1, run.stdout + run.stderr[-4000:]
    assert "compile for sm_80" in run.stdout
    lines = [line for line in run.stderr.splitlines() if ": exceeds h100: " in line]
    assert any("shared memory" in line and "> 0 B per block" in line for line in lines), lines
    assert any("registers > 8 per thread" in line for line in lines), lines
    assert all(line.startswith(f"{small_bundle}: ") for line in lines)


def test_without_cuobjdump_registers_are_unknown(small_bundle):
    run = _compile_check(str(small_bundle), "--json", no_cuobjdump=True)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "cuobjdump not found" in run.stderr
    rows = json.loads(run.stdout)
    assert rows and all(r["registers"] is None and r["spill_bytes"] is None for r in rows)


# -- bf16 bundles: the kernels a CPU cannot run, compiled ---------------------------------


@pytest.fixture(scope="module")
def bf16_bundles(tmp_path_factory) -> list[Path]:
    """Tiny BERT (matmuls, attention, row reductions) and a conv net with
    pools, at --dtype bf16 for an H200."""
    if not has_nvidia_backend():
        pytest.skip("triton has no NVIDIA backend")
    from tests.ir.test_precision_bf16 import TINY_BERT, conv_model

    tmp = tmp_path_factory.mktemp("bf16")
    onnx.save(conv_model(), tmp / "conv.onnx")
    return [
        orchestrate.optimize(
            src, tmp / f"{name}.orch", dtype="bf16", device="h200", trials=0, time_limit=20
        ).path
        for name, src in (("tiny_bert", TINY_BERT), ("conv", tmp / "conv.onnx"))
    ]


def test_bf16_bundles_compile_for_hopper_within_its_limits(bf16_bundles):
    """Every function of both bf16 bundles compiles for sm_90 (bf16 tensor-core
    dots) within the H200's limits."""
    run = _compile_check(*map(str, bf16_bundles), "--json")
    if run.returncode and "ptxas" in run.stderr and "not found" in run.stderr:
        pytest.skip("no ptxas to compile with")
    assert run.returncode == 0, run.stderr[-4000:]
    rows = json.loads(run.stdout)
    for folder in bf16_bundles:
        mine = {r["kernel"]: r for r in rows if r["bundle"] == str(folder)}
        functions = _functions(folder)
        assert set(mine) == set(functions.values())
        assert all(r["device"] == "h200" and r["arch"] == 90 for r in mine.values())
        assert all(r["within_limits"] and not r["violations"] for r in mine.values()), mine
        source = (folder / "kernels.py").read_text()
        assert "tl.float16" not in source
        assert re.search(r"tl\.dot\(\w+\.to\(tl\.bfloat16\)|tl\.dot\(a, b\)  # bf16", source)


# -- every example -------------------------------------------------------------------------


@pytest.mark.slow
def test_example_bundles_compile_for_hopper(tmp_path):
    if not has_nvidia_backend():
        pytest.skip("triton has no NVIDIA backend")
    bundles = []
    for name in ("bert", "resnet", "unet"):
        export_example(name, tmp_path / f"{name}.onnx", dynamo=False, opset=17, size="tiny")
        bundles.append(
            orchestrate.optimize(
                tmp_path / f"{name}.onnx", tmp_path / f"{name}.orch", trials=0
            ).path
        )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "orchestrate.check.compile_check", *map(str, bundles)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.count("compile for sm_90") == 3


# -- split-K: the atomics and the fix-up compile for Hopper --------------------------------


def test_a_split_k_matmul_compiles_for_hopper_within_its_limits(tmp_path):
    """BERT-base's FFN down-projection with its bias and residual, fp16 for an
    H200: the planner splits K (tests/cost/test_cost.py), and the kernel, with
    its atomic counter and fix-up, compiles for sm_90 within the limits,
    without spills."""
    if not has_nvidia_backend():
        pytest.skip("triton has no NVIDIA backend")
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
        for n, s in (("w", (3072, 768)), ("b", (768,)))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Add", ["a", "r"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ffn_down",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 3072]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [128, 768]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 768])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, tmp_path / "ffn.onnx")
    folder = orchestrate.optimize(
        tmp_path / "ffn.onnx", tmp_path / "ffn.orch", dtype="fp16", device="h200", trials=0
    ).path
    source = (folder / "kernels.py").read_text()
    assert "SPLIT_K = " in source and "tl.atomic_add(" in source
    run = _compile_check(str(folder), "--json")
    if run.returncode and "ptxas" in run.stderr and "not found" in run.stderr:
        pytest.skip("no ptxas to compile with")
    assert run.returncode == 0, run.stderr[-4000:]
    rows = json.loads(run.stdout)
    functions = {f.split("(")[0]: f for f in source.split("@triton.jit\ndef ")[1:]}
    split = [r for r in rows if "SPLIT_K: tl.constexpr" in functions[r["kernel"]]]
    assert split and all(r["within_limits"] and r["spill_bytes"] == 0 for r in split), rows
