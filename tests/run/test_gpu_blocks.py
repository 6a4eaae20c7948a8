"""What a GPU will launch, run on a CPU first: the full-size plans' own block sizes.

Under Triton's interpreter the launchers pick larger blocks than on a GPU
(its cost grows with the number of programs), so the GPU's block sizes, the
ones ``make bench-gpu`` launches, would otherwise run for the first time on
the GPU.  Here each model of the benchmark's fixed scope (BERT-base, GPT-2,
the Llama-style decoder, ResNet-50; fp16, planned for the H200) is planned at
its full width and sequence or image (one layer, or one block per stage:
the layers plan alike), and that plan is instantiated on a smaller instance
of the same model (fewer rows or pixels) with every configuration pinned
(``regenerate.planned(check_hash=False)``, as a dynamic bundle runs its plan
at another binding), then run with ``Program(gpu_blocks=True)``: the GPU's
tiles, warps and split-K in the interpreter, against the float64 reference.

Also: split-K forced at the GPU's tiles on a full-length K; bf16 at the
GPU's blocks (row reductions and pointwise kernels beside library GEMMs,
which the interpreter runs); and the bf16 plan with generated matmuls and
attention compiled for sm_90 within the H200's limits.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from examples import export_example
from orchestrate.bundle import regenerate
from orchestrate.check import verify
from orchestrate.cost.devices import get_device
from orchestrate.emit import emit
from orchestrate.ir import precision, reference
from orchestrate.kernels import config
from orchestrate.kernels.spec import (
    LIBRARY,
    SCRATCH_DTYPES,
    SPLIT_K_COUNTERS,
    VIEW,
    LaunchConfig,
    split_k,
)
from orchestrate.plan import graph_info, pipeline, primitive
from orchestrate.plan.planner import PlanOptions
from orchestrate.run.runtime import Program, load_kernels
from tests.compile_util import compile_sm90

DEVICE = "h200"
RTOL = precision.RTOL["fp16"]

# (example, size, overrides at full size, overrides of the smaller instance)
FIXED_SCOPE = {
    "bert": ("base", {"layers": 1, "vocab": 1000}, {"seq": 16, "vocab": 100}),
    "gpt2": ("base", {"layers": 1, "vocab": 1000}, {"seq": 16, "vocab": 100}),
    # the decoder's MLP width shrinks too (its matmuls are the interpreter's cost)
    "llama": ("wide", {"layers": 1, "vocab": 1000}, {"seq": 8, "intermediate": 384, "vocab": 100}),
    "resnet50": ("base", {"depths": (1, 1, 1, 1)}, {"image": 32}),
}


def lowered(path, dtype: str):
    g = pipeline.fission_model(pipeline.load(path), None, str(path))
    return precision.lower_precision(g, dtype, str(path))


def planned_pair(tmp_path, name: str, dtype: str = "fp16", **options):
    """(full-size plan, the smaller instance's graph, that plan pinned onto it)."""
    size, full, small = FIXED_SCOPE[name]
    paths = []
    for i, overrides in enumerate((full, {**full, **small})):
        path = tmp_path / f"{name}-{i}.onnx"
        export_example(name, path, dynamo=False, opset=17, size=size, **overrides)
        paths.append(path)
    opts = PlanOptions(device=DEVICE, dtype=dtype, time_limit=20, **options)
    big = pipeline.plan_graph(lowered(paths[0], dtype), opts).plan
    g = lowered(paths[1], dtype)
    # the full-size plan's kernels over the smaller graph's primitives and types
    at_small = replace(big, graph=graph_info(g), primitives=tuple(primitive(n) for n in g.nodes))
    return big, g, regenerate.planned(at_small, g, name, check_hash=False)


def run_at_gpu_blocks(g, pinned, seed: int = 0) -> None:
    """The pinned plan run with the GPU's blocks, every output within fp16's
    tolerance of the float64 reference."""
    program = Program(
        pinned, g, load_kernels(emit(g, pinned), True), interpret=True, gpu_blocks=True
    )
    assert program.interpret and not program.interpreter_blocks
    feeds = verify.random_inputs(g, seed)
    got = program.run(feeds)
    want = reference.run(g, feeds, float64=True)
    for name in g.outputs:
        check = verify.compare(name, np.asarray(got[name]), want[name], seed, RTOL, None)
        assert check.ok, f"{name}: {check.detail}"


def generated(specs):
    return [s for s in specs if s.template not in (VIEW, *LIBRARY)]


@pytest.mark.parametrize("name", list(FIXED_SCOPE))
def test_the_full_size_plan_runs_at_the_gpus_blocks(tmp_path, name):
    big, g, pinned = planned_pair(tmp_path, name)
    kernels = generated(pinned.specs)
    # every kernel launches the full-size plan's configuration
    assert [s.config for s in kernels] == [
        k.config for k in big.kernels if k.template not in (VIEW, *LIBRARY)
    ]
    # and on a GPU its blocks differ from the interpreter's somewhere: else
    # this would only repeat what the interpreter always runs
    assert any(s.config.interpret for s in kernels)
    if name in ("bert", "llama", "resnet50"):
        # BERT-base's FFN down-projection (128 x 3072 -> 768) splits K at
        # fp16 on the H200, as do the decoder's and ResNet-50's: the first
        # split-K launch at the GPU's tiles is not the benchmark's
        assert any(split_k(s.config) > 1 for s in kernels)
    run_at_gpu_blocks(g, pinned)


@pytest.mark.parametrize("splits", config.SPLIT_KS)
def test_split_k_forced_at_the_gpus_tiles(tmp_path, splits):
    """A matmul + bias + ReLU over K = 3072 (BERT-base's FFN), rows 40 (two
    row tiles, the second partial), its configuration forced to the GPU's
    split-K tiles: SPLIT_K programs per tile sum their partials once."""
    rng = np.random.default_rng(0)
    m, k, n = 40, 3072, 96
    w = numpy_helper.from_array((rng.standard_normal((k, n)) / k**0.5).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "ffn.onnx")
    g = lowered(tmp_path / "ffn.onnx", "fp16")
    plan = pipeline.plan_graph(g, PlanOptions(device=DEVICE, dtype="fp16")).plan
    (mm,) = [k for k in plan.kernels if k.template == "matmul"]
    tile = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": splits}
    forced = LaunchConfig(tuple(tile.items()), 4, 3, mm.config.interpret, mm.config.precision)
    kernels = tuple(replace(k, config=forced) if k is mm else k for k in plan.kernels)
    pinned = regenerate.planned(replace(plan, kernels=kernels), g, "ffn", check_hash=False)
    (spec,) = [s for s in pinned.specs if s.template == "matmul"]
    assert split_k(spec.config) == splits
    program = Program(
        pinned, g, load_kernels(emit(g, pinned), True), interpret=True, gpu_blocks=True
    )
    feeds = verify.random_inputs(g, 1)
    want = reference.run(g, feeds, float64=True)
    for _ in range(2):  # the counters are left zero for the next launch
        got = program.run(feeds)
        check = verify.compare("y", got["y"], want["y"], 0, RTOL, None)
        assert check.ok, check.detail
    counters = program._scratch[SPLIT_K_COUNTERS]
    assert int(counters.abs().sum()) == 0


def test_bf16_row_reductions_and_pointwise_run_at_the_gpus_blocks(tmp_path):
    """BERT-base's layer at bf16 with library GEMMs (torch multiplies bf16
    on a CPU; the interpreter's tl.dot cannot) and no attention rule: its
    layer norms, softmax and GELU kernels at the full-size plan's blocks."""
    big, g, pinned = planned_pair(
        tmp_path, "bert", "bf16", gemm_backends=("library",), rewrites=False
    )
    kernels = generated(pinned.specs)
    assert {s.template for s in kernels} >= {"row_reduce"}
    assert any(s.config.interpret for s in kernels)
    program = Program(
        pinned, g, load_kernels(emit(g, pinned), True), interpret=True, gpu_blocks=True
    )
    feeds = verify.random_inputs(g, 0)
    got = program.run(feeds)
    want = reference.run(g, feeds, float64=True)
    for name in g.outputs:
        check = verify.compare(
            name,
            np.asarray(got[name]).astype(np.float64),
            want[name],
            0,
            precision.RTOL["bf16"],
            None,
        )
        assert check.ok, f"{name}: {check.detail}"


def test_the_bf16_plan_compiles_for_hopper_within_its_limits(tmp_path):
    """BERT-base's layer at bf16, generated matmuls and attention (what the
    interpreter cannot run): every distinct kernel of the full-size plan
    compiled for sm_90 fits the H200's shared memory."""
    big, g, pinned = planned_pair(tmp_path, "bert", "bf16")
    distinct = {s.hash: s for s in generated(pinned.specs)}.values()
    assert {s.template for s in distinct} & {"matmul", "merged_matmul", "attention"}
    jobs = [
        (g, s, s.outputs, f"{s.template}_{i}", "bf16 at the GPU's blocks")
        for i, s in enumerate(distinct)
    ]
    limit = get_device(DEVICE).smem_per_block_kb * 1024
    for shared, _ in compile_sm90(tmp_path, jobs, SCRATCH_DTYPES):
        assert shared <= limit
