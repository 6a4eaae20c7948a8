"""The low-rank side-branch rule: x @ W + alpha (x @ A) @ B as one matmul over K + r.

Where it fires (a LoRA-adapted linear layer as peft's forward computes it:
base projection with its bias, lora_B(lora_A(x)) scaled by alpha / r, added;
two such layers stacked), the plan holds one ``low_rank`` kernel per layer in
place of the matmuls and the join, and ``orchestrate.optimize`` verifies the
bundle against onnxruntime in the interpreter (within 1e-5 in fp32, 2e-3 in
fp16); ``verify --exact`` passes.  Interpreter tiles of 16 make several row
and column tiles and K steps (the last one partial).  Where it must decline,
the reason is asserted.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

import orchestrate
from orchestrate import cli
from orchestrate import templates as rules
from orchestrate.kernels import config
from orchestrate.kernels.region import region
from orchestrate.kernels.rule import ranked
from orchestrate.kernels.spec import KernelSpec, structural_hash, with_hash
from orchestrate.plan import pipeline
from orchestrate.plan.planner import PlanOptions, plan
from orchestrate.templates import low_rank, template, working_set
from orchestrate.templates.low_rank import NAME as LOW_RANK
from tests import graphs
from tests.compile_util import compile_sm90
from tests.templates.test_every_candidate import candidate_failures, candidates
from tests.templates.test_fit import SPILL_TOLERANCE
from tests.util import has_nvidia_backend


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


def lora(
    dtype: str,
    rows=20,
    k=40,
    n=36,
    r=8,
    alpha=16.0,
    layers=1,
    a_input=False,
    t_output=False,
    relu=False,
    other_spelling=False,
) -> onnx.ModelProto:
    """``layers`` LoRA-adapted linear layers, as peft computes each:
    y = x @ W + bias + (x @ A) @ B * (alpha / r), W, A, B constants (the
    base weight as torch's Linear exports it, pre-transposed; B not zero, as
    after training).  ``other_spelling``: no bias, the branch divided by
    r / alpha and added on the left.  ``a_input``: the first A is a graph input;
    ``t_output``: the first x @ A is a graph output too; ``relu``: each
    layer's output through a ReLU."""
    rng = np.random.default_rng(0)
    consts: dict[str, np.ndarray] = {}
    inputs = [_info("x", dtype, [2, rows, k])]
    outputs: list[onnx.ValueInfoProto] = []
    nodes, x = [], "x"
    for i in range(layers):
        kin = k if i == 0 else n
        consts |= {
            f"w{i}": (rng.standard_normal((kin, n)) / np.sqrt(kin)).astype(dtype),
            f"bias{i}": (0.1 * rng.standard_normal(n)).astype(dtype),
            f"b{i}": (rng.standard_normal((r, n)) / np.sqrt(r)).astype(dtype),
            f"scaling{i}": np.array(alpha / r, dtype),
        }
        a = (rng.standard_normal((kin, r)) / np.sqrt(kin)).astype(dtype)
        if a_input and i == 0:
            inputs.append(_info("a0", dtype, [kin, r]))
        else:
            consts[f"a{i}"] = a
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"base{i}"]),
            helper.make_node("MatMul", [x, f"a{i}"], [f"lora_a{i}"]),
            helper.make_node("MatMul", [f"lora_a{i}", f"b{i}"], [f"lora_b{i}"]),
        ]
        if other_spelling:
            consts[f"scaling{i}"] = np.array(r / alpha, dtype)
            nodes += [
                helper.make_node("Div", [f"lora_b{i}", f"scaling{i}"], [f"scaled{i}"]),
                helper.make_node("Add", [f"scaled{i}", f"base{i}"], [f"y{i}"]),
            ]
        else:
            nodes += [
                helper.make_node("Add", [f"base{i}", f"bias{i}"], [f"linear{i}"]),
                helper.make_node("Mul", [f"lora_b{i}", f"scaling{i}"], [f"scaled{i}"]),
                helper.make_node("Add", [f"linear{i}", f"scaled{i}"], [f"y{i}"]),
            ]
        x = f"y{i}"
        if relu:
            nodes.append(helper.make_node("Relu", [x], [f"h{i}"]))
            x = f"h{i}"
        if t_output and i == 0:
            outputs.append(_info("lora_a0", dtype, [2, rows, r]))
    outputs.insert(0, _info(x, dtype, [2, rows, n]))
    inits = [numpy_helper.from_array(v, name) for name, v in consts.items()]
    g = helper.make_graph(nodes, "lora", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    return m


# -- where it fires ----------------------------------------------------------------


def _optimize(model: onnx.ModelProto, tmp_path: Path):
    src = tmp_path / "model.onnx"
    onnx.save(model, src)
    return orchestrate.optimize(src, tmp_path / "out", trials=2, device="h200", reproducible=True)


def _fired(result, layers: int, within: float):
    """The plan's low_rank kernels (nothing else runs), what the rule was
    worth, and the bundle's agreement with onnxruntime."""
    kernels = [k for k in result.plan.kernels if not k.is_view]
    assert [k.template for k in kernels] == [LOW_RANK] * layers, [k.template for k in kernels]
    (use,) = [u for u in result.plan.rules if u.rule == LOW_RANK]
    assert use.kernels == tuple(k.name for k in kernels) and use.with_us < use.without_us
    assert result.report.ok and max(c.rel for c in result.report.checks) <= within
    return kernels


@pytest.mark.parametrize("dtype, within", [("float32", 1e-5), ("float16", 2e-3)])
def test_a_lora_layer_is_one_matmul_over_k_plus_r(tmp_path, small_tiles, dtype, within):
    (k,) = _fired(_optimize(lora(dtype), tmp_path), 1, within)
    # x @ A, (x @ A) @ B and the base projection are never written
    assert k.outputs == ("y0",) and {"x", "w0", "bias0", "a0", "b0"} <= set(k.inputs)
    assert {"base0", "lora_a0", "lora_b0", "scaled0", "y0"} <= set(k.primitives)


def test_two_stacked_layers_with_activations_each_fold_their_branch(tmp_path, small_tiles):
    kernels = _fired(_optimize(lora("float32", layers=2, relu=True), tmp_path), 2, 1e-5)
    assert [k.outputs for k in kernels] == [("h0",), ("h1",)]


def test_a_branch_divided_and_added_on_the_left_without_a_bias_folds_too(tmp_path, small_tiles):
    (k,) = _fired(_optimize(lora("float32", other_spelling=True), tmp_path), 1, 1e-5)
    assert "bias0" not in k.inputs and k.outputs == ("y0",)


def test_roles_record_the_branch_and_the_structural_hash_covers_the_rank():
    g = pipeline.fission_model(lora("float32"), None, "lora")
    (k,) = [s for s in plan(g, PlanOptions(device="h200")).specs if s.template == LOW_RANK]
    roles = k.roles
    assert (roles.anchor, roles.x, roles.down, roles.up) == ("base0", "x", "lora_a0", "lora_b0")
    assert (roles.scaling, roles.main, roles.join) == (("scaled0",), "linear0", "y0")
    assert (roles.rank, roles.block_r, roles.main_path) == (8, 16, ("linear0",))
    assert structural_hash(g, replace(k, roles=replace(roles, rank=7))) != k.hash


def test_verify_exact_passes_on_the_bundle(tmp_path, small_tiles):
    result = _optimize(lora("float32", layers=2), tmp_path)
    assert [k.template for k in result.plan.kernels] == [LOW_RANK] * 2
    r = CliRunner().invoke(
        cli.main,
        ["verify", str(tmp_path / "out"), "--model", str(tmp_path / "model.onnx"), "--exact"],
    )
    assert r.exit_code == 0, r.output
    assert "2 tensors compared" in r.output and "OK: the plan computes" in r.output


def test_the_linear_program_keeps_separate_kernels_where_the_fused_one_costs_more(monkeypatch):
    g = pipeline.fission_model(lora("float32"), None, "lora")
    sets = low_rank.propose(g, [n.name for n in g.nodes])
    target = PlanOptions(device="h200").target()
    assert any(isinstance(rules.match(g, s, target), KernelSpec) for s in sets)
    priced = replace(template(LOW_RANK), flops=lambda graph, spec: (10**15, 0))
    monkeypatch.setitem(rules._BY_NAME, LOW_RANK, priced)
    p = plan(g, PlanOptions(device="h200", reproducible=True)).plan
    assert LOW_RANK not in {k.template for k in p.kernels}
    assert LOW_RANK not in {u.rule for u in p.rules}  # (merged_matmul may fire: x @ W, x @ A)
    assert len([k for k in p.kernels if not k.is_view]) >= 2


# -- where it declines ------------------------------------------------------------


def _declined(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    g = pipeline.fission_model(model, None, "model")
    p = plan(g, PlanOptions(device="h200", reproducible=True)).plan
    return [d.reason for d in p.declined if d.rule == LOW_RANK], [k.template for k in p.kernels]


def test_an_a_that_is_an_input_is_declined_and_explained(tmp_path):
    src = tmp_path / "model.onnx"
    onnx.save(lora("float32", a_input=True), src)
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(cli.main, ["plan", str(src), "-o", str(out), "--device", "h200"])
    assert r.exit_code == 0, r.output
    assert LOW_RANK not in {k["template"] for k in json.loads(out.read_text())["kernels"]}
    r = CliRunner().invoke(cli.main, ["explain", str(out), "--rejected"])
    assert r.exit_code == 0, r.output
    assert "low_rank at y0: lora_a0's second operand a0 is not a constant weight" in r.output


def test_a_rank_too_large_for_registers_is_declined():
    reasons, templates = _declined(lora("float32", k=32, n=24, r=160))
    assert LOW_RANK not in templates and reasons
    assert all(
        r.startswith(
            "rank 160 of a0 exceeds 128: each program keeps x @ A for its rows in registers"
        )
        for r in reasons
    ), reasons


def test_an_x_at_a_read_elsewhere_is_declined(tmp_path, small_tiles):
    """The kernel keeps x @ A in registers: where it is also a graph output
    the rule declines, and the plan runs the layer as separate kernels."""
    model = lora("float32", t_output=True)
    reasons, templates = _declined(model)
    assert LOW_RANK not in templates and reasons
    assert all(
        "lora_a0 must be written (read outside the set or a graph output), but the kernel "
        "keeps the low-rank branch in registers" in r
        for r in reasons
    ), reasons
    assert _optimize(model, tmp_path).report.ok


# -- on the GPU compiler -----------------------------------------------------------


def _candidates(g, count: int) -> list[KernelSpec]:
    """``count`` of the configurations that fit the rule's largest set, spread
    over the ranked list (the first is the one the plan takes)."""
    target = PlanOptions(device="h200").target()
    largest = max(low_rank.propose(g, [n.name for n in g.nodes]), key=len)
    r = region(g, largest)
    found = low_rank.analyse(g, r)
    m, n = g.producer[found.anchor].shape[-2:]
    x = g.types[found.x]
    configs = config.matmul(m, n, x.shape[-1], x.dtype, False, 1, 0)
    fit = ranked(
        g, template(LOW_RANK).rule, r, g.producer[found.anchor].shape, found, (), configs, target
    )
    return [with_hash(g, k) for k in fit[:: max(1, len(fit) // count)][:count]]


@pytest.mark.skipif(not has_nvidia_backend(), reason="triton has no NVIDIA backend")
def test_the_kernels_compile_for_sm90_within_the_fit_model(tmp_path):
    """LoRA layers of BERT-base and Llama-style sizes, ranks 16 to 128, three
    configurations each (the planned one first), compile for sm_90 within 1x
    to 2x of the shared memory the fit model gave, spilling no more than the
    fit model's documented miss (``tests/templates/test_fit.py``)."""
    jobs, specs = [], []
    for i, model in enumerate(
        [
            lora("float16", rows=64, k=768, n=768, r=16),
            lora("float32", rows=64, k=768, n=768, r=16),
            lora("float16", rows=64, k=1024, n=2048, r=64),
            lora("bfloat16", rows=32, k=512, n=512, r=128, relu=True),
        ]
    ):
        g = pipeline.fission_model(model, None, f"model{i}")
        for j, spec in enumerate(_candidates(g, 3)):
            jobs.append((g, spec, spec.outputs, f"low_rank_{i}_{j}", ["low_rank"]))
            specs.append((g, spec))
    assert len(jobs) == 12
    compiled = compile_sm90(tmp_path, jobs)
    for (g, spec), (shared, spill) in zip(specs, compiled):
        assert spill is None or spill <= SPILL_TOLERANCE, (spec.config, spill)
        model = working_set(g, spec).shared_bytes
        assert shared <= model <= 2 * shared, (spec.config, shared, model)


def test_every_candidate_of_two_stacked_layers_computes_the_reference(small_tiles):
    """Every kernel the rule table accepts in two stacked LoRA layers, the
    low-rank sets among them, cut out, emitted and run in the interpreter
    against the float64 reference (``tests/templates/test_every_candidate.py``)."""
    g = pipeline.fission_model(
        lora("float32", rows=6, k=24, n=20, r=4, layers=2, relu=True), None, "lora"
    )
    found, failures = candidate_failures(g, graphs.random_inputs(g, seed=1))
    assert not failures, failures
    assert LOW_RANK in {k.template for k in candidates(g)} and found > 10
