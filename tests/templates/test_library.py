"""Library kernels (cuBLAS, cuDNN, SDPA through torch) as candidates beside
the generated ones: matched, emitted as plain launchers, run on the CPU
through torch against the reference executor, priced, chosen by the linear
program, and ``--gemm-backends``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from examples import EXAMPLES, gemm_backends
from orchestrate import api, ir
from orchestrate.cost.devices import get_device
from orchestrate.cost.roofline import Prices, cost
from orchestrate.ilp.baselines import greedy
from orchestrate.ilp.partition import partition
from orchestrate.ilp.problem import problem
from orchestrate.ir.export import to_onnx
from orchestrate.kernels.spec import (
    ATTENTION,
    CONV,
    LIBRARY,
    LIBRARY_ATTENTION,
    LIBRARY_CONV,
    LIBRARY_MATMUL,
    MATMUL,
    KernelSpec,
    LibraryAttention,
    LibraryCall,
    Rejection,
    Target,
)
from orchestrate.plan.candidates import enumerate_kernels
from orchestrate.plan.planner import PlanOptionError, PlanOptions, plan
from orchestrate.run.runtime import interpreter_refusal
from orchestrate.templates import match, match_all
from orchestrate.templates.library import cost as library_cost
from orchestrate.templates.library import rule as library
from tests import graphs
from tests.emit_util import assert_matches_reference, plan_from_sets
from tests.templates.test_attention import attention_fn
from tests.test_cli import invoke as run
from tests.util import has_nvidia_backend

LIB = PlanOptions(gemm_backends=("library",))
BOTH = Target(get_device("h100"))
MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"


def _names(g: ir.Graph) -> list[str]:
    return [n.name for n in g.nodes]


def _library(g: ir.Graph, names, template: str) -> KernelSpec:
    found = match_all(g, names, BOTH)
    assert not isinstance(found, Rejection), found
    (spec,) = [k for k in found if k.template == template]
    return spec


def _inputs(g: ir.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    return graphs.random_inputs(g, seed)


# -- matmul -----------------------------------------------------------------------------


def _scaled_bias(order: str):
    def fn(b, x, w, bias):
        y = b.matmul(x, w)
        if order == "scale, bias":
            return b.add(b.mul(y, 0.5), bias)
        return b.div(b.add(bias, y), 4.0)  # (bias + A @ B) / 4

    return fn


@pytest.mark.parametrize(
    "order, alpha, beta", [("scale, bias", 0.5, 1.0), ("bias, scale", 0.25, 0.25)]
)
def test_addmm_alpha_and_beta_absorb_a_scale_and_a_bias(order, alpha, beta):
    g = graphs.build(_scaled_bias(order), [(2, 3, 8), (8, 5), (5,)])
    both = match_all(g, _names(g), BOTH)
    assert [k.template for k in both] == [MATMUL, LIBRARY_MATMUL]  # two candidates, one set
    call = both[1].roles
    assert isinstance(call, LibraryCall)
    assert (call.alpha, call.beta, call.bias) == (alpha, beta, "x2")
    planned = plan_from_sets(g, [_names(g)], options=LIB)
    src = assert_matches_reference(g, planned, _inputs(g))
    assert "torch.addmm(bias, a, in1" in src and "@triton.jit" not in src


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_batched_matmul_broadcast_over_the_batch_with_a_bias(dtype):
    def fn(b, x, w, bias):
        return b.mul(b.add(b.matmul(x, w), bias), 2.0)

    g = graphs.build(fn, [(2, 3, 4, 8), (3, 8, 5), (4, 5)], dtype=dtype)
    planned = plan_from_sets(g, [_names(g)], options=LIB)
    assert planned.plan.kernels[0].template == LIBRARY_MATMUL
    tol = 1e-5 if dtype == "float32" else 2e-3
    src = assert_matches_reference(g, planned, _inputs(g), rtol=tol, atol=tol)
    assert "torch.baddbmm(" in src and ".expand(2, 3, 8, 5)" in src


def test_a_plain_matmul_ignores_the_output_it_passes_as_bias():
    g = graphs.build(lambda b, x, w: b.matmul(x, w), [(4, 6), (6, 3)])
    spec = _library(g, _names(g), LIBRARY_MATMUL)
    assert (spec.roles.alpha, spec.roles.beta, spec.roles.bias) == (1.0, 0.0, None)
    assert_matches_reference(g, plan_from_sets(g, [_names(g)], options=LIB), _inputs(g))


def test_a_library_matmul_declines_what_the_call_does_not_compute():
    def gelu(b, x, w):
        return b.erf(b.matmul(x, w))

    g = graphs.build(gelu, [(4, 6), (6, 3)])
    refused = match(g, _names(g), Target(get_device("h100"), gemm_backends=("library",)))
    assert isinstance(refused, Rejection) and "erf" in refused.reason
    assert "is not a scale or a bias add" in refused.reason
    # Triton still runs it as one kernel; only Triton's spec is a candidate
    assert [k.template for k in match_all(g, _names(g), BOTH)] == [MATMUL]

    ints = graphs.build(lambda b, x, w: b.matmul(x, w), [(4, 6), (6, 3)], dtype="int32")
    refused = match_all(ints, _names(ints), Target(get_device("h100"), gemm_backends=("library",)))
    assert isinstance(refused, Rejection) and "cuBLAS has no int32 kernel" in refused.reason


@pytest.mark.parametrize("outside", ["a reader", "a graph output"])
def test_a_product_read_outside_the_call_is_declined(outside):
    def fn(b, x, w):
        y = b.matmul(x, w)
        return (b.mul(y, 3.0), b.exp(y)) if outside == "a reader" else (b.mul(y, 3.0), y)

    g = graphs.build(fn, [(4, 6), (6, 3)])
    mm, scale = _names(g)[:2]
    refused = match(g, [mm, scale], Target(get_device("h100"), gemm_backends=("library",)))
    assert isinstance(refused, Rejection) and "writes only its result" in refused.reason


# -- convolution -------------------------------------------------------------------------


def _conv(groups=1, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), bias=True):
    def fn(b, x, w, *rest):
        y = b.conv(x, w, strides=strides, pads=pads, dilations=dilations, group=groups)
        return b.add(y, rest[0]) if bias else y

    return fn


@pytest.mark.parametrize(
    "groups, strides, pads, dilations",
    [
        (1, (1, 1), (1, 1, 1, 1), (1, 1)),
        (2, (2, 1), (0, 1, 0, 1), (1, 2)),
        (4, (1, 2), (2, 0, 1, 1), (1, 1)),  # asymmetric: the input is padded first
    ],
)
def test_library_conv_with_groups_stride_padding_dilation_and_bias(
    groups, strides, pads, dilations
):
    g = graphs.build(
        _conv(groups, strides, pads, dilations),
        [(2, 4, 7, 6), (8, 4 // groups, 3, 3), (1, 8, 1, 1)],
    )
    spec = _library(g, _names(g), LIBRARY_CONV)
    assert spec.roles.bias == "x2"
    planned = plan_from_sets(g, [_names(g)], options=LIB)
    src = assert_matches_reference(g, planned, _inputs(g), rtol=1e-5, atol=1e-5)
    assert f"groups={groups}" in src and "in2.reshape(8)" in src
    assert ("torch.nn.functional.pad(" in src) == (pads[:2] != pads[2:])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_library_conv_1d_and_3d(dtype):
    tol = 1e-5 if dtype == "float32" else 3e-3
    for x, w in (((1, 3, 9), (4, 3, 3)), ((1, 2, 4, 5, 3), (3, 2, 2, 2, 2))):
        dims = len(x) - 2

        def fn(b, xs, ws, dims=dims):
            return b.conv(
                xs, ws, strides=(1,) * dims, pads=(1,) * 2 * dims, dilations=(1,) * dims, group=1
            )

        g = graphs.build(fn, [x, w], dtype=dtype)
        src = assert_matches_reference(
            g, plan_from_sets(g, [_names(g)], options=LIB), _inputs(g), rtol=tol, atol=tol
        )
        assert f"conv{dims}d(" in src


def test_a_bias_of_one_value_for_every_channel():
    g = graphs.build(_conv(), [(1, 2, 4, 4), (3, 2, 3, 3), (1, 1, 1, 1)])
    src = assert_matches_reference(
        g, plan_from_sets(g, [_names(g)], options=LIB), _inputs(g), rtol=1e-5, atol=1e-5
    )
    assert "in2.reshape(1).expand(3)" in src


def test_a_bias_that_is_not_per_channel_is_declined():
    g = graphs.build(_conv(), [(1, 2, 4, 4), (3, 2, 3, 3), (1, 1, 4, 4)])
    refused = match(g, _names(g), Target(get_device("h100"), gemm_backends=("library",)))
    assert isinstance(refused, Rejection) and "is not a per-channel bias" in refused.reason


# -- attention ---------------------------------------------------------------------------


def _core(g: ir.Graph) -> list[str]:
    """The attention's nodes without its prologue (K's transpose, the GQA
    repeats): the set the library rule proposes."""
    (core,) = library.propose(g, _names(g))
    return list(core)


def _attention_case(fn, shapes, dtype="float32", extra=None):
    g = graphs.build(fn, shapes, dtype=dtype)
    inputs = _inputs(g)
    if extra is not None:
        inputs["x3"] = extra
    core = _core(g)
    before = [n for n in _names(g) if n not in core]
    sets = [[n] for n in before] + [core]
    return g, plan_from_sets(g, sets, options=LIB), inputs


def test_sdpa_with_scale_and_additive_mask():
    mask = np.triu(np.full((5, 5), -np.inf, np.float32), 1)  # causal, as a constant
    g, planned, inputs = _attention_case(
        attention_fn(scale=0.25, mask=mask), [(1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4)]
    )
    (lib,) = [s for s in planned.specs if s.template == LIBRARY_ATTENTION]
    assert isinstance(lib.roles, LibraryAttention) and lib.roles.scale == 0.25
    src = assert_matches_reference(g, planned, inputs)
    assert "scaled_dot_product_attention(" in src and "scale=0.25" in src
    assert lib.roles.causal and "attn_mask=None, is_causal=True" in src  # no mask tensor


def test_a_constant_mask_that_is_not_causal_stays_a_mask_and_a_function_of_its_own():
    causal = np.triu(np.full((5, 5), -np.inf, np.float32), 1)
    window = causal.copy()
    window[4, 0] = -np.inf  # a sliding window: one more key hidden

    def fn(b, q, k, v):
        out = []
        for mask in (causal, window):
            s = b.add(b.mul(b.matmul(q, k), 0.5), b.constant(mask))
            out.append(b.matmul(graphs.softmax(b, s), v))
        return tuple(out)

    g = graphs.build(fn, [(1, 2, 5, 4), (1, 2, 4, 5), (1, 2, 5, 4)])
    sets = [list(s) for s in library.propose(g, _names(g))]
    assert len(sets) == 2
    planned = plan_from_sets(g, sets, options=LIB)
    assert [s.roles.causal for s in planned.specs] == [True, False]
    assert planned.specs[0].hash != planned.specs[1].hash  # same structure, other launchers
    src = assert_matches_reference(g, planned, _inputs(g))
    assert "is_causal=True" in src and "mask = in2.to(q.dtype)" in src  # x0, x1, mask, x2


def test_sdpa_with_a_boolean_mask():
    keep = np.random.default_rng(1).random((1, 1, 3, 6)) < 0.7
    keep[..., 0] = True  # no row fully masked
    fn = attention_fn(scale=0.5, mask=keep, where=True)  # WHERE(keep, s, -inf)
    g, planned, inputs = _attention_case(fn, [(2, 2, 3, 4), (2, 2, 6, 4), (2, 2, 6, 4)])
    (lib,) = [s for s in planned.specs if s.template == LIBRARY_ATTENTION]
    assert lib.roles.mask in g.constants and lib.roles.boolean_mask
    src = assert_matches_reference(g, planned, inputs)
    assert ".to(torch.bool)" in src


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_sdpa_on_grouped_query_heads(dtype):
    fn = attention_fn(scale=0.3, kv_heads=2)
    g, planned, inputs = _attention_case(fn, [(1, 4, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8)], dtype)
    templates = [s.template for s in planned.specs]
    assert templates.count(LIBRARY_ATTENTION) == 1
    tol = 1e-5 if dtype == "float32" else 3e-3
    assert_matches_reference(g, planned, inputs, rtol=tol, atol=tol)


def test_a_library_attention_declines_a_prologue_and_what_sdpa_cannot_express():
    g = graphs.build(attention_fn(scale=0.5), [(1, 2, 3, 4)] * 3)
    lib = Target(get_device("h100"), gemm_backends=("library",))
    whole = match(g, _names(g), lib)  # with K's transpose in the set
    assert isinstance(whole, Rejection) and "takes Q, K and V from memory" in whole.reason

    def scaled_after_mask(b, q, k, v, m):
        s = b.mul(b.add(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), m), 0.5)
        return b.matmul(graphs.softmax(b, s), v)

    g = graphs.build(scaled_after_mask, [(1, 2, 3, 4)] * 3 + [(3, 3)])
    refused = match(g, _core(g), lib)
    assert isinstance(refused, Rejection) and "not a scale before one mask" in refused.reason


# -- cost and the linear program -------------------------------------------------------


def test_library_kernels_are_priced_with_their_own_figures():
    m, n, k = 132 * 128, 128, 4096  # 132 tiles of 128 x 128: one full wave on an H100
    g = graphs.build(lambda b, x, w: b.matmul(x, w), [(m, k), (k, n)], dtype="float16")
    device = get_device("h100")
    c = cost(g, _library(g, _names(g), LIBRARY_MATMUL), device)
    flops, nbytes = 2 * m * n * k, 2 * (m * k + k * n + m * n)
    compute = flops / (device.fp16_tflops * 1e6 * library_cost.LIBRARY_GEMM_EFFICIENCY)
    memory = nbytes / (device.bandwidth_gbs * 1e3 * library_cost.ACHIEVABLE_BANDWIDTH)
    assert (c.flops, c.bytes, c.blocks) == (flops, nbytes, 132)
    assert c.compute_us == pytest.approx(compute) and c.memory_us == pytest.approx(memory)
    assert c.time_us == pytest.approx(max(compute, memory) + library_cost.LAUNCH_US)
    tiny = graphs.build(lambda b, x, w: b.matmul(x, w), [(4, 6), (6, 3)])
    small = cost(tiny, _library(tiny, _names(tiny), LIBRARY_MATMUL), device)
    assert small.time_us == pytest.approx(library_cost.LIBRARY_LATENCY_US + library_cost.LAUNCH_US)


def test_the_linear_program_picks_a_library_call_and_a_generated_epilogue(monkeypatch):
    # priced as free but for its bytes, a library matmul beats the fused Triton
    # kernel; its GELU cannot join the call, so a generated kernel follows it
    monkeypatch.setattr(library_cost, "LIBRARY_LATENCY_US", 0.0)
    monkeypatch.setattr(library_cost, "LAUNCH_US", 0.0)

    def fn(b, x, w):
        y = b.matmul(x, w)
        return b.mul(y, b.sigmoid(y))

    g = graphs.build(fn, [(8, 512), (512, 16)])
    planned = plan(g, PlanOptions())
    assert [k.template for k in planned.plan.kernels] == [LIBRARY_MATMUL, "pointwise"]
    assert_matches_reference(g, planned, _inputs(g), rtol=1e-4, atol=1e-4)
    triton = plan(g, PlanOptions(gemm_backends=("triton",)))
    assert [k.template for k in triton.plan.kernels] == [MATMUL]


def test_a_baseline_kernel_is_matched_to_its_own_template_among_two_candidates():
    g = graphs.build(lambda b, x, w: b.matmul(x, w), [(4, 6), (6, 3)])
    options = PlanOptions()
    target = options.target()
    prices = Prices(g, target.device)
    (part,) = partition(g)
    prob = problem(g, part, enumerate_kernels(g, part.nodes, target), prices)
    assert [k.template for k in prob.kernels] == [MATMUL, LIBRARY_MATMUL]  # one node set
    (choice,) = prob.include(prices, greedy(g, part.nodes, target, prices))
    assert prob.kernels[choice.kernel].template == MATMUL and len(prob.kernels) == 2


def test_gemm_backends_is_validated_and_recorded():
    assert PlanOptions(gemm_backends="library,triton").gemm_backends == ("triton", "library")
    for bad in ("cublas", "", ("triton", "triton"), 3, ()):
        with pytest.raises(PlanOptionError, match="gemm_backends"):
            PlanOptions(gemm_backends=bad)
    g = graphs.build(lambda b, x, w: b.matmul(x, w), [(4, 6), (6, 3)])
    assert plan(g, LIB).plan.to_json()["options"]["gemm_backends"] == ["library"]


# -- bundles through the real API and CLI ------------------------------------------------


@pytest.mark.parametrize("backends", [("library",), ("triton",)])
def test_tiny_bert_bundles_verify_with_each_backend(tmp_path, backends):
    out = tmp_path / "b"
    made = api.optimize(MODELS / "tiny_bert.onnx", out, gemm_backends=backends)
    assert made.report.ok
    templates = {k.template for k in made.plan.kernels}
    if backends == ("library",):
        assert {LIBRARY_MATMUL, LIBRARY_ATTENTION} <= templates
        assert not templates & {MATMUL, ATTENTION, "merged_matmul"}
    else:
        assert not templates & set(LIBRARY)
    loaded = api.load(out)  # kernels.py regenerated from plan.json, the library calls too
    assert loaded.plan.options.gemm_backends == backends


def test_a_small_cnn_bundle_with_library_convolutions_verifies(tmp_path):
    import torch

    class Cnn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.b = torch.nn.Conv2d(8, 8, 3, padding=1, groups=4)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            y = torch.relu(self.b(torch.relu(self.a(x))))
            return self.fc(y.mean(dim=(2, 3)))

    torch.manual_seed(0)
    model = tmp_path / "cnn.onnx"
    torch.onnx.export(
        Cnn().eval(), (torch.randn(1, 3, 16, 16),), str(model), dynamo=False, opset_version=17
    )
    made = api.optimize(model, tmp_path / "b", gemm_backends=("library",))
    assert made.report.ok
    templates = [k.template for k in made.plan.kernels]
    assert templates.count(LIBRARY_CONV) == 2 and CONV not in templates


def test_a_bad_gemm_backends_value_is_one_line_and_exit_2(tmp_path):
    r = run(
        "plan",
        MODELS / "tiny_bert.onnx",
        "-o",
        tmp_path / "p.json",
        "--gemm-backends",
        "triton,cudnn",
    )
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        "orchestrate: error: --gemm-backends triton,cudnn: expected one or both of triton, "
        "library, each once"
    ]
    assert not (tmp_path / "p.json").exists()


def test_the_rule_table_lists_the_library_rules():
    r = run("rules")
    assert r.exit_code == 0, r.output
    rows = [line.split()[:3] for line in r.output.splitlines() if " library " in line]
    assert rows == [
        [LIBRARY_MATMUL, "template", "library"],
        [LIBRARY_CONV, "template", "library"],
        [LIBRARY_ATTENTION, "pattern", "library"],
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_example_verifies_with_library_kernels_alone_and_triton_alone(tmp_path, name):
    rows = gemm_backends.check(name, tmp_path)  # export once, optimize and verify per backend
    assert all(r.ok for r in rows), gemm_backends.table(rows)
    library, triton = rows
    assert library.library > 0 and triton.library == 0


def test_bf16_matmuls_run_in_the_interpreter_tier_when_torch_runs_them():
    def fn(b, x, w, bias):
        return b.add(b.matmul(x, w), bias)

    g = graphs.build(fn, [(4, 16), (16, 8), (8,)], dtype="bfloat16")
    triton = plan_from_sets(g, [_names(g)])
    assert "bf16 matmul" in interpreter_refusal(g, triton.specs)  # Triton's tl.dot: GPU only
    library = plan_from_sets(g, [_names(g)], options=LIB)
    assert interpreter_refusal(g, library.specs) is None
    assert_matches_reference(g, library, _inputs(g), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("form", ["keep, -1e4", "hide, lowest"])
def test_sdpa_takes_a_constant_where_mask_with_a_very_negative_fill(form):
    # GPT-2 exports WHERE(causal, s, -1e4); Llama's WHERE(hidden, lowest float, s)
    keep = np.tril(np.ones((4, 4), bool))
    keep[3, 1] = False  # not causal: stays a mask tensor
    fill = -1e4 if form.startswith("keep") else float(np.finfo(np.float32).min)

    def fn(b, q, k, v):
        s = b.mul(b.matmul(q, k), 0.5)
        if form.startswith("keep"):
            s = b.where(b.constant(keep), s, fill)
        else:
            s = b.where(b.constant(~keep), fill, s)
        return b.matmul(graphs.softmax(b, s), v)

    g = graphs.build(fn, [(1, 2, 4, 8), (1, 2, 8, 4), (1, 2, 4, 8)])
    spec = _library(g, _names(g), LIBRARY_ATTENTION)
    assert spec.roles.boolean_mask and spec.roles.hides == form.startswith("hide")
    assert not spec.roles.causal
    src = assert_matches_reference(g, plan_from_sets(g, [_names(g)], options=LIB), _inputs(g))
    assert ("mask = ~in" in src) == form.startswith("hide")


def test_a_finite_fill_that_hides_every_key_of_a_query_is_declined():
    keep = np.tril(np.ones((4, 4), bool))
    keep[2] = False  # query 2 sees nothing: the reference's row is uniform

    def fn(b, q, k, v):
        s = b.where(b.constant(keep), b.matmul(q, k), -1e9)
        return b.matmul(graphs.softmax(b, s), v)

    g = graphs.build(fn, [(1, 2, 4, 8), (1, 2, 8, 4), (1, 2, 4, 8)])
    refused = match(g, _names(g), Target(get_device("h100"), gemm_backends=("library",)))
    assert isinstance(refused, Rejection) and "hides every key of some query" in refused.reason


def test_compile_check_skips_library_launchers_and_compiles_the_rest(tmp_path):
    if not has_nvidia_backend():
        pytest.skip("triton has no NVIDIA backend")

    def fn(b, x, w):
        return b.exp(b.matmul(x, w))  # a library matmul, then a generated kernel

    g = graphs.build(fn, [(8, 64), (64, 32)])
    model = tmp_path / "m.onnx"
    onnx.save(to_onnx(g), model)
    out = api.optimize(model, tmp_path / "b", gemm_backends=("library",), trials=0).path
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "orchestrate.check.compile_check", str(out)],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "1 functions compile for sm_90" in run.stdout
    assert (
        "1 kernels skipped (k000_library_matmul): a library launcher (a torch call)" in run.stdout
    )
