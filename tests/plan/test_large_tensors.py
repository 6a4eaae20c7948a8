"""Plans past 2**31 and 2**36 elements: attention whose scores never reach
memory, the bound on what a plan may write, and library GEMMs that split K.

Planning only (no data: these shapes would need hundreds of GB); the kernels
are printed, and one is compiled for sm_90, never run.
"""

from __future__ import annotations

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from orchestrate import cli
from orchestrate.cost.devices import get_device
from orchestrate.cost.roofline import cost
from orchestrate.emit import kernel_source
from orchestrate.ir import MAX_ELEMENTS
from orchestrate.kernels.spec import Target
from orchestrate.plan import pipeline
from orchestrate.plan.planner import PlanOptions
from orchestrate.templates import match_all
from tests.compile_util import compile_sm90


def _attention(b: int, h: int, s: int, d: int) -> onnx.ModelProto:
    """softmax(q @ k^T * d**-0.5) @ v over fp16 [b, h, s, d] inputs, as exporters write it."""
    t = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [b, h, s, d]) for n in "qkvo"]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
    ]
    scale = numpy_helper.from_array(np.array(d**-0.5, np.float16), "scale")
    g = helper.make_graph(nodes, "attention", t[:3], t[3:], [scale])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _plan(model: onnx.ModelProto, **options):
    graph = pipeline.fission_model(model, None, "att.onnx")
    return graph, pipeline.plan_graph(graph, PlanOptions(device="h100", **options))


def _written(planned) -> set[str]:
    return {t for k in planned.plan.kernels for t in k.outputs}


def test_attention_with_2_31_scores_or_more_is_one_attention_kernel():
    """8 x 8 x 16384 x 16384 scores (2**34): the flash kernel never writes
    them, so their count refuses nothing; the plan reads Q, K, V once."""
    graph, planned = _plan(_attention(8, 8, 16384, 64))
    assert graph.types["s"].size >= 2**31
    assert "attention" in {k.template for k in planned.plan.kernels}
    assert not {"s", "ss", "p"} & _written(planned)


def test_attention_past_2_36_scores_plans_and_writes_nothing_that_large(tmp_path):
    """128 x 8 x 16384 x 128: 2**38 scores, more than any tensor in memory may
    hold; Q, K and V hold 2**31 elements each, so the kernel indexes them
    with 64-bit offsets (and compiles for sm_90 so).  With generated kernels
    only, no plan exists without the attention rule: its figure of what the
    rule was worth is left out rather than failing the plan."""
    graph, planned = _plan(_attention(128, 8, 16384, 128), gemm_backends=("triton",))
    assert graph.types["s"].size > MAX_ELEMENTS
    assert all(graph.types[t].size <= MAX_ELEMENTS for t in _written(planned))
    (k, spec) = next(
        (k, s) for k, s in zip(planned.plan.kernels, planned.specs) if s.template == "attention"
    )
    source = kernel_source(graph, spec, k.outputs, "attention_1").render()
    assert "pid_b = tl.program_id(1).to(tl.int64)" in source
    assert "offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)" in source
    [(shared, _)] = compile_sm90(tmp_path, [(graph, spec, k.outputs, "attention_1", ["t"])])
    assert shared <= get_device("h100").smem_per_block_kb * 1024


def test_a_plan_that_must_write_a_tensor_too_large_is_one_line(tmp_path):
    """Without the pattern rules no kernel keeps the scores on chip: no plan."""
    path = tmp_path / "att.onnx"
    onnx.save(_attention(128, 8, 16384, 128), path)
    r = CliRunner().invoke(
        cli.main, ["plan", str(path), "-o", str(tmp_path / "p.json"), "--no-rewrites"]
    )
    assert r.exit_code == 2, r.output
    [line] = [x for x in r.output.splitlines() if x.startswith("orchestrate: error")]
    assert "out of memory" in line and "2**36" in line and "Traceback" not in r.output
    assert not (tmp_path / "p.json").exists()


def _gemm(m: int, k: int, n: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [m, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [m, n])
    w = numpy_helper.from_array(np.zeros((k, n), np.float16), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_library_gemm_splits_k_where_its_tiles_underfill_the_gpu():
    """128 x 768 x 3072 is six 128 x 128 tiles on 132 SMs: unsplit, the
    library was priced 4.7x the Triton template's split-K kernel; split, it
    fills the device as the template does."""
    graph = pipeline.fission_model(_gemm(128, 3072, 768), None, "g.onnx")
    device = get_device("h100")
    [mm] = [n.name for n in graph.nodes]
    specs = match_all(graph, [mm], Target(device))
    by_template = {s.template: cost(graph, s, device) for s in specs}
    library, triton = by_template["library_matmul"], by_template["matmul"]
    assert library.blocks > 6  # split K: more blocks than output tiles
    assert library.time_us < 1.5 * triton.time_us
    # a GEMM whose tiles fill the device is not split
    big = pipeline.fission_model(_gemm(4096, 4096, 4096), None, "g.onnx")
    [mm] = [n.name for n in big.nodes]
    lib = next(s for s in match_all(big, [mm], Target(device)) if s.template == "library_matmul")
    assert cost(big, lib, device).blocks == 32 * 32


def test_a_whole_tensor_reduction_is_split_over_the_gpu():
    """mean((a - b)**2) over 128 x 4096 is one row of 524,288: one program
    walking it took 256 loop steps of DRAM latency (155 us predicted on an
    H100, 45x its bytes' time).  Split, the planner spreads it over the SMs."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [128, 4096])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [128, 4096])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    nodes = [
        helper.make_node("Sub", ["a", "b"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["s"]),
        helper.make_node("ReduceMean", ["s"], ["y"], keepdims=0),
    ]
    g = helper.make_graph(nodes, "mse", [a, b], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    graph, planned = _plan(model)
    [spec] = planned.specs
    assert spec.template == "row_reduce" and dict(spec.config.blocks)["SPLIT_K"] > 1
    device = get_device("h100")
    unsplit = next(
        s
        for s in match_all(graph, spec.nodes, Target(device, rank=None))
        if dict(s.config.blocks).get("SPLIT_K") == 1
    )
    split, whole = cost(graph, spec, device), cost(graph, unsplit, device)
    assert split.time_us * 10 < whole.time_us
    assert split.time_us < 2 * split.bytes / (device.bandwidth_gbs * 1e3) + 5
