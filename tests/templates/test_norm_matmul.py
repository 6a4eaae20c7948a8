"""The norm-past-matmul rule: RMSNorm / LayerNorm folded into the matmul they feed.

Where it fires (a Llama-style RMSNorm before the LM head, a BERT-style
LayerNorm before a projection with a bias and an activation, the LayerNorm
torch exports below opset 17), the plan holds one ``norm_matmul`` kernel in
place of a row-reduce and a matmul, and ``orchestrate.optimize`` verifies the
bundle against onnxruntime in the interpreter: at the default tolerances
(``verify.RTOL``: 1e-4 relative in fp32, 1e-2 in fp16), and here within
1e-5 in fp32 and 2e-3 in fp16.  Interpreter tiles of 16 make several row
and column tiles and K steps (the last one partial), so the statistics are
merged across blocks.  Where it must decline, the reason is asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import orchestrate
from orchestrate import cli
from orchestrate import templates as rules
from orchestrate.cost.devices import get_device
from orchestrate.cost.roofline import cost
from orchestrate.kernels import config
from orchestrate.kernels.spec import NORM_MATMUL, ROW_REDUCE, KernelSpec
from orchestrate.plan import pipeline
from orchestrate.plan.planner import PlanOptions, plan
from orchestrate.templates import working_set
from orchestrate.templates.norm_matmul import rule as norm_matmul
from orchestrate.tune import FakeTimer, Tune
from tests import graphs
from tests.compile_util import compile_sm90
from tests.emit_util import assert_matches_reference, plan_from_sets
from tests.templates.test_fit import SPILL_TOLERANCE
from tests.util import has_nvidia_backend

F32 = TensorProto.FLOAT


@pytest.fixture
def small_tiles(monkeypatch):
    """Interpreter matmul tiles of 16: several tiles and K steps in small shapes
    (the configuration space is cached per problem size: cleared around it)."""
    config.matmul.cache_clear()
    monkeypatch.setattr(config, "MATMUL_INTERPRET_BLOCK", 16)
    monkeypatch.setattr(config, "GROUP_M", 2)
    yield
    config.matmul.cache_clear()


# -- models ------------------------------------------------------------------------


def _info(name: str, dtype: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape
    )


def _model(nodes, inputs, outputs, constants: dict[str, np.ndarray]) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()]
    g = helper.make_graph(nodes, "block", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    return m


def llama_head(
    dtype: str, rows=6, k=40, n=24, gamma_input=False, axis=-1, also_norm=False, second=False
):
    """Residual add, then RMSNorm as transformers exports it (in fp32 between
    casts), then the LM head: logits = rmsnorm(x + res) @ W; ``second``: a
    second projection of the normalised tensor (``other``)."""
    rng = np.random.default_rng(0)
    consts = {
        "w": (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype),
        "w2": (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype),
        "two": np.array(2.0, np.float32),
        "eps": np.array(1e-5, np.float32),
        "axes": np.array([axis], np.int64),
    }
    inputs = [_info("x", dtype, [1, rows, k]), _info("res", dtype, [1, rows, k])]
    gamma = (1 + 0.1 * rng.standard_normal(k)).astype(dtype)
    if gamma_input:
        inputs.append(_info("gamma", dtype, [k]))
    else:
        consts["gamma"] = gamma
    back = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [
        helper.make_node("Add", ["x", "res"], ["h"]),
        helper.make_node("Cast", ["h"], ["hf"], to=F32),
        helper.make_node("Pow", ["hf", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Reciprocal", ["rms"], ["inv"]),
        helper.make_node("Mul", ["hf", "inv"], ["normed"]),
        helper.make_node("Cast", ["normed"], ["normed_t"], to=back),
        helper.make_node("Mul", ["gamma", "normed_t"], ["n"]),
        helper.make_node("MatMul", ["n", "w"], ["logits"]),
    ]
    outputs = [_info("logits", dtype, [1, rows, n])]
    if second:
        nodes.append(helper.make_node("MatMul", ["n", "w2"], ["other"]))
        outputs.append(_info("other", dtype, [1, rows, n]))
    if also_norm:
        outputs.append(_info("n", dtype, [1, rows, k]))
    return _model(nodes, inputs, outputs, consts)


def bert_ffn(dtype: str, rows=5, k=48, n=40, exported=False):
    """LayerNorm, then a projection with a bias and a ReLU: the LayerNorm as
    the ONNX op, or (``exported``) spelled out as torch exports it below
    opset 17 (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add)."""
    rng = np.random.default_rng(1)
    consts = {
        "gamma": (1 + 0.1 * rng.standard_normal(k)).astype(dtype),
        "beta": (0.1 * rng.standard_normal(k)).astype(dtype),
        "w": (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype),
        "bias": (0.1 * rng.standard_normal(n)).astype(dtype),
    }
    if exported:
        consts |= {
            "axes": np.array([-1], np.int64),
            "two": np.array(2.0, dtype),
            "eps": np.array(1e-5, dtype),
        }
        norm = [
            helper.make_node("ReduceMean", ["x", "axes"], ["mu"], keepdims=1),
            helper.make_node("Sub", ["x", "mu"], ["d"]),
            helper.make_node("Pow", ["d", "two"], ["d2"]),
            helper.make_node("ReduceMean", ["d2", "axes"], ["var"], keepdims=1),
            helper.make_node("Add", ["var", "eps"], ["ve"]),
            helper.make_node("Sqrt", ["ve"], ["sd"]),
            helper.make_node("Div", ["d", "sd"], ["z"]),
            helper.make_node("Mul", ["z", "gamma"], ["zg"]),
            helper.make_node("Add", ["zg", "beta"], ["n"]),
        ]
    else:
        norm = [
            helper.make_node(
                "LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5
            )
        ]
    nodes = norm + [
        helper.make_node("MatMul", ["n", "w"], ["y"]),
        helper.make_node("Add", ["y", "bias"], ["yb"]),
        helper.make_node("Relu", ["yb"], ["out"]),
    ]
    # rows that do not average to zero: the statistics must not cancel
    return _model(
        nodes, [_info("x", dtype, [2, rows, k])], [_info("out", dtype, [2, rows, n])], consts
    )


# -- where it fires ----------------------------------------------------------------


def _optimize(model: onnx.ModelProto, tmp_path: Path):
    src = tmp_path / "model.onnx"
    onnx.save(model, src)
    return orchestrate.optimize(src, tmp_path / "out", trials=2, device="h200", reproducible=True)


def _fired(result, within: float):
    """The plan's one norm_matmul kernel (no row-reduce left), what the rule
    was worth, and the bundle's agreement with onnxruntime."""
    kernels = [k for k in result.plan.kernels if not k.is_view]
    assert [k.template for k in kernels] == [NORM_MATMUL], [k.template for k in kernels]
    (use,) = [u for u in result.plan.rules if u.rule == NORM_MATMUL]
    assert use.kernels == (kernels[0].name,) and use.with_us < use.without_us
    assert result.report.ok and max(c.rel for c in result.report.checks) <= within
    return kernels[0]


@pytest.mark.parametrize("dtype, within", [("float32", 1e-5), ("float16", 2e-3)])
def test_rms_norm_moves_past_the_lm_head(tmp_path, small_tiles, dtype, within):
    k = _fired(_optimize(llama_head(dtype), tmp_path), within)
    # the residual add runs on the loaded tiles; the normalised tensor is never written
    assert "h" in k.primitives and "n" in k.primitives and k.outputs == ("logits",)
    assert {"x", "res", "gamma", "w"} <= set(k.inputs)


@pytest.mark.parametrize("dtype, within", [("float32", 1e-5), ("float16", 2e-3)])
def test_layer_norm_moves_past_a_projection_with_its_epilogue(tmp_path, small_tiles, dtype, within):
    k = _fired(_optimize(bert_ffn(dtype), tmp_path), within)
    assert k.outputs == ("out",) and {"x", "gamma", "beta", "w", "bias"} <= set(k.inputs)


def test_exported_layer_norm_with_a_division_moves_too(tmp_path, small_tiles):
    _fired(_optimize(bert_ffn("float32", exported=True), tmp_path), 1e-5)


def test_roles_record_the_statistics_and_the_row_factors():
    src = llama_head("float32")
    g = pipeline.fission_model(src, None, "llama_head")
    (k,) = [s for s in plan(g, PlanOptions(device="h200")).specs if s.template == NORM_MATMUL]
    roles = k.roles
    assert roles.x == "h" and roles.feed == ("h",)
    (total,) = [g.producer[s] for s, _ in roles.sums]
    assert total.op.value == "sum" and total.inputs == ("sq",)
    (stat,) = [stat for _, stat in roles.sums]
    assert len(stat) == 2  # the sum of a square: a product of two linear forms in x
    scale, rows, cols = roles.scale
    assert (scale, rows, cols) == (1.0, (("inv", 1),), (("gamma", 1),)) and roles.shifts == ()


def test_two_projections_each_recompute_the_statistics(small_tiles):
    """n read by two matmuls: each norm_matmul kernel recomputes the row
    statistics from x and neither writes n (the plan the linear program may
    take when that is cheaper than a row-reduce writing n)."""
    g = pipeline.fission_model(llama_head("float32", second=True), None, "two_heads")
    sets = norm_matmul.propose(g, [n.name for n in g.nodes])
    sets = [s for s in sets if "h" in s]  # the residual add recomputed by both
    assert sorted(s[-1] for s in sets) == ["logits", "other"]
    planned = plan_from_sets(g, sets, writes_all=False)
    assert [k.template for k in planned.plan.kernels] == [NORM_MATMUL] * 2
    assert all("n" not in k.outputs for k in planned.plan.kernels)
    assert_matches_reference(g, planned, graphs.random_inputs(g), rtol=1e-5, atol=1e-5)


def test_tune_times_its_configurations_and_a_slow_one_is_dropped(tmp_path):
    """--tune times the rule's kernels like any other (several configurations
    each); measured slow, the plan goes back to a row-reduce and a matmul."""
    g = pipeline.fission_model(llama_head("float32"), None, "llama_head")
    names: dict[str, str] = {}

    def figure(graph, spec):
        names[spec.hash] = spec.template
        slow = 1000.0 if spec.template == NORM_MATMUL else 1.0
        return cost(graph, spec, get_device("h200")).time_us * slow

    timer = FakeTimer(figure)
    options = PlanOptions(device="h200", reproducible=True)
    p = plan(g, options, tune=Tune(timer, 3, tmp_path / "tune.sqlite")).plan
    assert sum(names[h] == NORM_MATMUL for h in timer.timed) >= 2
    assert NORM_MATMUL in {k.template for k in plan(g, options).plan.kernels}
    assert [k.template for k in p.kernels if not k.is_view] == [ROW_REDUCE, "matmul"]


# -- where it declines ------------------------------------------------------------


def _declined(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    g = pipeline.fission_model(model, None, "model")
    p = plan(g, PlanOptions(device="h200", reproducible=True)).plan
    return [d.reason for d in p.declined if d.rule == NORM_MATMUL], [k.template for k in p.kernels]


def test_a_norm_over_another_axis_is_declined():
    reasons, templates = _declined(llama_head("float32", axis=1))
    assert NORM_MATMUL not in templates
    assert reasons and all(
        "reduces axes [1] of [1, 6, 40], not the K axis of the matmul" in r for r in reasons
    )


def test_a_gamma_that_is_an_input_is_declined_and_explained(tmp_path):
    src = tmp_path / "model.onnx"
    onnx.save(llama_head("float32", gamma_input=True), src)
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(cli.main, ["plan", str(src), "-o", str(out), "--device", "h200"])
    assert r.exit_code == 0, r.output
    assert NORM_MATMUL not in {k["template"] for k in json.loads(out.read_text())["kernels"]}
    r = CliRunner().invoke(cli.main, ["explain", str(out), "--rejected"])
    assert r.exit_code == 0, r.output
    assert (
        "norm_matmul at logits: gamma scales the normalised rows but is not a constant "
        "(gamma and beta must be)"
    ) in r.output


def test_a_normalised_tensor_that_is_an_output_stays_a_row_reduce(tmp_path, small_tiles):
    """The kernel never forms n: where n must be written (a graph output) the
    set holding it is declined, and a row-reduce writes n (the matmul may
    still take the norm, recomputing it from x)."""
    model = llama_head("float32", also_norm=True)
    reasons, _ = _declined(model)
    assert "n must be written, but the kernel never forms it" in " ".join(reasons)
    result = _optimize(model, tmp_path)
    assert ROW_REDUCE in {k.template for k in result.plan.kernels} and result.report.ok


# -- on the GPU compiler -----------------------------------------------------------


def _largest_candidate(g) -> KernelSpec:
    """The rule's kernel for the largest set it proposes (the linear program
    may prefer others: an fp32 dot on CUDA cores leaves little to save)."""
    target = PlanOptions(device="h200").target()
    found = [rules.match(g, s, target) for s in norm_matmul.propose(g, [n.name for n in g.nodes])]
    return max((k for k in found if isinstance(k, KernelSpec)), key=lambda k: len(k.nodes))


@pytest.mark.skipif(not has_nvidia_backend(), reason="triton has no NVIDIA backend")
def test_the_kernels_compile_for_sm90_within_the_fit_model(tmp_path):
    """BERT-base-sized blocks planned for an H200 compile for sm_90 within
    1x to 2x of the shared memory the fit model gave, spilling no more than
    the fit model's documented miss (``tests/templates/test_fit.py``)."""
    jobs, specs = [], []
    for i, model in enumerate(
        [
            bert_ffn("float16", rows=128, k=768, n=768),
            bert_ffn("float32", rows=128, k=768, n=768),
            llama_head("float16", rows=64, k=512, n=1024),
        ]
    ):
        g = pipeline.fission_model(model, None, f"model{i}")
        spec = _largest_candidate(g)
        jobs.append((g, spec, spec.outputs, f"norm_matmul_{i}", ["norm_matmul"]))
        specs.append((g, spec))
    assert len(jobs) == 3
    compiled = compile_sm90(tmp_path, jobs)
    for (g, spec), (shared, spill) in zip(specs, compiled):
        assert spill is None or spill <= SPILL_TOLERANCE, (spec.config, spill)
        model = working_set(g, spec).shared_bytes
        assert shared <= model <= 2 * shared, (spec.config, shared, model)
