"""The attention rule, its legality and cost, and the flash-attention kernel
against the reference executor (in the interpreter)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrate import ir
from orchestrate.cost import figures, roofline
from orchestrate.cost.devices import get_device
from orchestrate.decompose import fission
from orchestrate.frontend import prepare
from orchestrate.ir import Op
from orchestrate.kernels.spec import ATTENTION, KernelSpec, Rejection
from orchestrate.plan import Planned
from orchestrate.plan.planner import PlanOptions, plan
from tests import graphs
from tests.emit_util import assert_matches_reference, attention_specs, plan_from_sets, spec_of
from tests.util import node_model

# -- graphs ---------------------------------------------------------------------------


def attention_fn(scale=None, mask=None, kv_heads=None, split_heads=None, where=False, guard=None):
    """softmax(Q @ K^T * scale + mask) @ V from 4-D (or, with ``split_heads``,
    3-D [B, L, H*D]) inputs; ``kv_heads``: K and V repeated as grouped-query;
    ``guard``: P = WHERE(ISNAN(P), guard, P) as transformers' SDPA exports
    (``guard=0.0``)."""

    def fn(b, q, k, v, *extra):
        if split_heads:
            q, k, v = (_split(b, t, h) for t, h in zip((q, k, v), split_heads))
        if kv_heads:
            k, v = (_repeat(b, t, q.shape[1] // t.shape[1]) for t in (k, v))
        s = b.matmul(q, b.transpose(k, (0, 1, 3, 2)))
        if scale is not None:
            s = b.mul(s, scale)
        if mask is not None:
            m = extra[0] if extra else b.constant(mask)
            s = b.where(m, s, float("-inf")) if where else b.add(s, m)
        p = graphs.softmax(b, s)
        if guard is not None:
            p = b.where(b.unary(Op.ISNAN, p), guard, p)
        return b.matmul(p, v)

    return fn


def _split(b, x, heads):
    batch, seq, hidden = x.shape
    return b.transpose(b.reshape(x, (batch, seq, heads, hidden // heads)), (0, 2, 1, 3))


def _repeat(b, t, reps):
    batch, heads, seq, dim = t.shape
    t = b.expand(b.reshape(t, (batch, heads, 1, seq, dim)), (batch, heads, reps, seq, dim))
    return b.reshape(t, (batch, heads * reps, seq, dim))


def _kernel(g: ir.Graph, device: str = "h100") -> KernelSpec:
    ks = attention_specs(g, [n.name for n in g.nodes], device)
    assert len(ks) == 1, ks
    return ks[0]


def _plan(g: ir.Graph, k: KernelSpec) -> Planned:
    """The attention kernel (at its anchor's place) and one kernel per other node."""
    sets = [[n.name] for n in g.nodes if n.name not in k.nodes or n.name == k.anchor]
    return plan_from_sets(g, [list(k.nodes) if s == [k.anchor] else s for s in sets])


def _check(g, inputs=None, rtol=1e-5, atol=1e-6) -> str:
    inputs = inputs or graphs.random_inputs(g)
    return assert_matches_reference(g, _plan(g, _kernel(g)), inputs, rtol, atol)


# -- the rule on exported models ------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_graphs(tmp_path_factory):
    import onnx

    from examples import export_example
    from orchestrate.plan import pipeline

    out = {}
    for name in ("bert", "gpt2", "llama"):
        path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
        _, inputs = export_example(name, path, dynamo=False, opset=17, size="tiny")
        shapes = {i.name: tuple(i.shape) for i in inputs}
        out[name] = pipeline.fission_model(onnx.load(path), shapes, str(path))
    return out


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_rule_finds_one_kernel_per_attention_block(tiny_graphs, name):
    from orchestrate.ilp.partition import partition

    g = tiny_graphs[name]
    pv = [n for n in g.nodes if n.op is Op.MATMUL and n.shape[1:2] == (4,) and len(n.shape) == 4]
    found = [k for p in partition(g) for k in attention_specs(g, p.nodes)]
    assert len(found) == 2 == len(pv) // 2  # two layers, QK^T and PV per layer
    for k in found:
        assert k.template == ATTENTION and k.outputs == (k.anchor,)
        assert spec_of(g, k.nodes) == k
        a = k.roles
        assert {graph_op(g, n) for n in a.softmax} == {Op.RMAX, Op.SUB, Op.EXP, Op.SUM, Op.DIV}
        prologue_ops = {graph_op(g, n) for n, _ in a.prologue}
        assert Op.TRANSPOSE in prologue_ops
        if name == "llama":  # grouped-query heads and rotary embeddings
            assert {Op.EXPAND, Op.CONCAT, Op.SLICE} <= prologue_ops


def graph_op(g, n):
    return g.producer[n].op


def _onnx_attention(feeds, **attrs):
    model = node_model("Attention", feeds, opset=23, **attrs)
    return fission(prepare(model, {k: v.shape for k, v in feeds.items()}))


def _rand(shape, seed, dtype="float32"):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_rule_on_onnx_attention_gqa_causal_with_float_mask():
    feeds = {
        "q": _rand((2, 5, 16), 0),
        "k": _rand((2, 7, 8), 1),
        "v": _rand((2, 7, 8), 2),
        "mask": _rand((5, 7), 3),
    }
    g = _onnx_attention(feeds, q_num_heads=4, kv_num_heads=2, is_causal=1)
    a = _kernel(g).roles
    # the float mask switches the decomposition's guard on: max(M, lowest), max(Z, 1)
    assert a.max_floor == float(np.finfo(np.float32).min) and a.sum_floor == 1.0
    assert Op.EXPAND in {graph_op(g, n) for n, _ in a.prologue}
    _check(g, feeds)


def test_onnx_attention_fully_masked_rows_are_zero_like_the_reference():
    mask = np.ones((3, 5), bool)
    mask[1] = False
    feeds = {
        "q": _rand((1, 2, 3, 24), 0),
        "k": _rand((1, 2, 5, 24), 1),
        "v": _rand((1, 2, 5, 4), 2),
        "mask": mask,
    }
    g = _onnx_attention(feeds, softcap=2.5)
    _check(g, feeds)


# -- legality -----------------------------------------------------------------------------


def _names(g):
    return [n.name for n in g.nodes]


def test_softmax_over_another_axis_is_rejected():
    def fn(b, q, k, v):
        s = b.matmul(q, b.transpose(k, (0, 1, 3, 2)))
        return b.matmul(graphs.softmax(b, s, axis=2), v)

    g = graphs.build(fn, [(1, 2, 8, 4), (1, 2, 8, 4), (1, 2, 8, 4)])
    r = spec_of(g, _names(g))
    assert isinstance(r, Rejection) and "softmax not over the key axis" in r.reason
    assert attention_specs(g, _names(g)) == []
    assert any("not over the key axis" in d.reason for d in plan(g).plan.declined)


def test_scores_read_outside_the_kernel_are_rejected():
    def fn(b, q, k, v):
        s = b.mul(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), 0.5)
        return b.matmul(graphs.softmax(b, s), v), s

    g = graphs.build(fn, [(1, 2, 8, 4), (1, 2, 8, 4), (1, 2, 8, 4)])
    r = spec_of(g, _names(g))
    assert isinstance(r, Rejection) and "read outside the kernel" in r.reason
    assert attention_specs(g, _names(g)) == []


def test_probabilities_read_outside_are_rejected():
    def fn(b, q, k, v):
        p = graphs.softmax(b, b.matmul(q, b.transpose(k, (0, 1, 3, 2))))
        return b.matmul(p, v), b.mul(p, 2.0)

    g = graphs.build(fn, [(1, 2, 8, 4), (1, 2, 8, 4), (1, 2, 8, 4)])
    names = [n for n in _names(g) if g.producer[n].op is not Op.MUL]
    r = spec_of(g, names)
    assert isinstance(r, Rejection) and "probabilities" in r.reason


@pytest.mark.parametrize("value", ["scores", "probabilities"])
def test_values_computed_from_the_scores_are_rejected(value):
    def fn(b, q, k):
        s = b.matmul(q, b.transpose(k, (1, 0)))
        p = graphs.softmax(b, s)
        return b.matmul(p, s if value == "scores" else p)

    g = graphs.build(fn, [(8, 4), (8, 4)])
    r = spec_of(g, _names(g))
    want = "read outside the softmax (by g/matmul_2)" if value == "scores" else "reads V"
    assert isinstance(r, Rejection) and want in r.reason, r
    assert attention_specs(g, _names(g)) == []


def test_nan_guard_replacing_nan_by_another_value_is_declined():
    g = graphs.build(attention_fn(guard=1.0), [(1, 2, 8, 4)] * 3)
    r = spec_of(g, _names(g))
    assert isinstance(r, Rejection) and "replaces NaN probabilities by" in r.reason, r
    assert "not by 0" in r.reason and attention_specs(g, _names(g)) == []
    # the near miss is proposed and judged, so explain --rejected gives the reason
    declined = plan(g).plan.declined
    assert [d.rule for d in declined] == [ATTENTION] and "not by 0" in declined[0].reason


def test_where_on_the_probabilities_that_is_no_nan_guard_is_declined():
    def fn(b, q, k, v, c):
        p = graphs.softmax(b, b.matmul(q, b.transpose(k, (0, 1, 3, 2))))
        return b.matmul(b.where(b.unary(Op.ISNAN, c), 0.0, p), v)

    g = graphs.build(fn, [(1, 2, 8, 4)] * 3 + [(1, 2, 8, 8)])
    r = spec_of(g, _names(g))
    assert isinstance(r, Rejection) and "not WHERE(ISNAN(p), 0, p)" in r.reason, r
    assert attention_specs(g, _names(g)) == []


def test_two_matmuls_without_a_softmax_are_rejected():
    g = graphs.build(lambda b, x, y, z: b.matmul(b.matmul(x, y), z), [(4, 4)] * 3)
    r = spec_of(g, _names(g))
    assert isinstance(r, Rejection) and "not a softmax" in r.reason


def test_layout_on_the_scores_is_rejected():
    def fn(b, q, k, v):
        s = b.transpose(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), (0, 1, 3, 2))
        return b.matmul(graphs.softmax(b, s), v)

    g = graphs.build(fn, [(1, 2, 8, 4), (1, 2, 8, 4), (1, 2, 8, 4)])
    r = spec_of(g, _names(g))
    assert isinstance(r, Rejection) and "cannot run on the scores" in r.reason
    assert attention_specs(g, _names(g)) == []


def test_a_lone_matmul_pair_keeps_the_old_rules():
    g = graphs.build(lambda b, x, y: b.add(b.matmul(x, y), b.matmul(y, x)), [(4, 4)] * 2)
    r = spec_of(g, _names(g))
    assert isinstance(r, Rejection)
    r = spec_of(g, [n for n in _names(g) if graph_op(g, n) is Op.MATMUL][:1])
    assert isinstance(r, KernelSpec) and r.template == "matmul"


# -- cost ---------------------------------------------------------------------------------


def test_cost_by_hand():
    """Each term of the cost model (cost/roofline.py) worked out by hand for
    one small fp32 attention, from the figures in cost/figures.py."""
    b, h, lq, lk, d = 1, 2, 16, 16, 8
    g = graphs.build(attention_fn(scale=0.125), [(b, h, lq, d), (b, h, lk, d), (b, h, lk, d)])
    k = _kernel(g)
    device = get_device("h100")
    # the rules' first configuration that fits: 64 x 64 clamped to 16 x 16, 4 warps, 3 stages
    assert (k.config["BLOCK_M"], k.config["BLOCK_N"], k.config.num_stages) == (16, 16, 3)
    c = roofline.cost(g, k, device)
    tensor = b * h * lq * d * 4
    assert c.bytes == 3 * tensor + tensor + 4  # Q, K, V, the scale (a scalar), O
    sfu = figures.SFU_FLOPS
    scores, outputs, rows = b * h * lq * lk, b * h * lq * d, b * h * lq
    matmuls = 2 * scores * d + 2 * outputs * lk
    other = (
        scores  # scale
        + scores * (1 + 1 + sfu + 1)  # max, subtract, exp, sum
        + outputs * sfu  # the final division
        + (rows * sfu + outputs)  # one rescale (one key block)
        + b * h * lk * d  # K's transpose, once per query block
    )
    assert c.flops == matmuls + other
    # one block per batch entry and head: 2 blocks on 132 SMs, so the CUDA
    # cores (fp32 attention runs its dots in IEEE, at a flash kernel's share of
    # the peak) work at 2/132 of the peak
    assert c.blocks == 2
    dots_us = matmuls / (device.fp32_tflops * figures.ATTENTION_EFFICIENCY * 1e6)
    assert c.compute_us == pytest.approx((dots_us + other / (device.fp32_tflops * 1e6)) * 132 / 2)
    # each block has all its bytes in flight (one key step): two blocks draw
    # everything in one DRAM latency
    assert c.memory_us == pytest.approx(figures.DRAM_LATENCY_US)
    # one wave; the first loads, then one key step with 2 steps in flight
    assert c.latency_us == pytest.approx(figures.DRAM_LATENCY_US * (1 + 1 / 2))
    assert c.launch_us == figures.LAUNCH_US
    assert c.time_us == pytest.approx(max(c.memory_us, c.compute_us, c.latency_us) + c.launch_us)


def test_head_dims_that_do_not_fit_are_rejected():
    """The fit check is the rule's own: a head dim whose tiles fit the
    device's shared memory in no configuration gets no attention kernel."""
    from orchestrate.templates import working_set

    g = graphs.build(attention_fn(), [(1, 1, 64, 128)] * 3)
    names = _names(g)
    for device, kb in (("h100", 227), ("v100", 96)):
        k = spec_of(g, names, device)
        assert isinstance(k, KernelSpec) and working_set(g, k).shared_bytes <= kb * 1024
    g = graphs.build(attention_fn(), [(1, 1, 64, 1024)] * 3, dtype="float16")
    r = spec_of(g, _names(g), "v100")
    assert isinstance(r, Rejection) and "shared memory" in r.reason, r


def test_the_planner_picks_attention():
    g = graphs.build(attention_fn(scale=0.25), [(1, 4, 64, 16)] * 3)
    p = plan(g, PlanOptions(device="h100", reproducible=True)).plan
    assert [k.template for k in p.kernels] == [ATTENTION]
    assert p.summary.predicted_us < p.baselines["greedy"].predicted_us


# -- the generated kernel against the reference ----------------------------------------


def test_scaled_head_dim_24_seq_37(small_blocks):
    g = graphs.build(attention_fn(scale=1 / math.sqrt(24)), [(2, 3, 37, 24)] * 3)
    src = _check(g)
    assert "BLOCK_M = 16" in src and "BLOCK_D = 32" in src


def test_causal_mask(small_blocks):
    causal = np.tril(np.ones((37, 37), bool))[None, None]
    g = graphs.build(attention_fn(scale=0.2, mask=causal, where=True), [(1, 2, 37, 16)] * 3)
    _check(g)


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")
def test_padding_mask_minus_inf_with_fully_masked_rows(small_blocks):
    """Batch 0 hides keys 0..19 (the first key block is all -inf for every
    row), batch 1 hides every key: its rows are NaN, as in the reference."""
    fn = attention_fn(scale=0.3, mask=True)
    g = graphs.build(fn, [(2, 2, 21, 8), (2, 2, 37, 8), (2, 2, 37, 8), (2, 1, 1, 37)])
    inputs = graphs.random_inputs(g)
    mask = np.zeros((2, 1, 1, 37), np.float32)
    mask[0, ..., :20] = -np.inf
    mask[1] = -np.inf
    inputs["x3"] = mask
    _check(g, inputs)


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")
def test_nan_guard_gives_zero_for_fully_masked_rows(small_blocks):
    """transformers' SDPA export: WHERE(ISNAN(P), 0, P) after the softmax.
    Batch 1 hides every key: the reference's NaN rows become 0, and so do
    the kernel's (its running max ends at -inf there)."""
    fn = attention_fn(scale=0.3, mask=True, guard=0.0)
    g = graphs.build(fn, [(2, 2, 21, 8), (2, 2, 37, 8), (2, 2, 37, 8), (2, 1, 1, 37)])
    k = _kernel(g)
    assert k.roles.nan_guard
    assert {graph_op(g, n) for n in k.roles.softmax} >= {Op.WHERE, Op.ISNAN, Op.DIV, Op.RMAX}
    inputs = graphs.random_inputs(g)
    mask = np.zeros((2, 1, 1, 37), np.float32)
    mask[0, ..., :20] = -np.inf
    mask[1] = -np.inf
    inputs["x3"] = mask
    src = _check(g, inputs)
    assert 'm_i == float("-inf")' in src


def test_padding_mask_large_negative(small_blocks):
    fn = attention_fn(mask=True)
    g = graphs.build(fn, [(2, 2, 17, 8), (2, 2, 33, 8), (2, 2, 33, 8), (2, 1, 1, 33)])
    inputs = graphs.random_inputs(g)
    mask = np.zeros((2, 1, 1, 33), np.float32)
    mask[0, ..., 5:] = -1e9
    # every key hidden: the scores vanish next to the lowest float (in float64
    # too), so the output is the plain average of V
    mask[1] = np.finfo(np.float32).min
    inputs["x3"] = mask
    _check(g, inputs)


@pytest.mark.parametrize("mask_shape", [(33,), (17, 1), (1, 3, 17, 33), (2, 1, 1, 33)])
def test_additive_mask_broadcast_in_every_position(small_blocks, mask_shape):
    fn = attention_fn(scale=0.5, mask=True)
    _check(graphs.build(fn, [(2, 3, 17, 8), (2, 3, 33, 8), (2, 3, 33, 8), mask_shape]))


def test_no_batch_dims():
    def fn(b, q, k, v):
        return b.matmul(graphs.softmax(b, b.matmul(q, b.transpose(k, (1, 0)))), v)

    _check(graphs.build(fn, [(5, 8), (9, 8), (9, 4)]))


def test_grouped_query_heads_split_from_3d(small_blocks):
    fn = attention_fn(scale=0.25, kv_heads=True, split_heads=(4, 2, 2))
    g = graphs.build(fn, [(1, 19, 4 * 12), (1, 19, 2 * 12), (1, 19, 2 * 12)])
    k = _kernel(g)
    assert {Op.EXPAND, Op.RESHAPE, Op.TRANSPOSE} <= {graph_op(g, n) for n in k.nodes}
    _check(g)


def test_cross_attention_value_dim_and_decode_step():
    g = graphs.build(attention_fn(scale=0.5), [(2, 2, 1, 8), (2, 2, 37, 8), (2, 2, 37, 5)])
    _check(g)
    g = graphs.build(attention_fn(), [(1, 1, 1, 3), (1, 1, 1, 3), (1, 1, 1, 3)])
    _check(g)


def test_float16(small_blocks):
    causal = np.tril(np.ones((37, 37), bool))[None, None]
    fn = attention_fn(scale=0.25, mask=causal, where=True)
    g = graphs.build(fn, [(1, 2, 37, 24)] * 3, dtype="float16")
    _check(g, rtol=2e-3, atol=2e-3)


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")
def test_float16_grouped_query_nan_guard(small_blocks):
    """The SDPA decoder form in fp16: K and V expanded from 1 to 2 heads, an
    additive mask hiding every key of batch 1, the NaN guard giving 0 there."""
    fn = attention_fn(scale=0.25, mask=True, kv_heads=1, guard=0.0)
    g = graphs.build(
        fn, [(2, 2, 19, 16), (2, 1, 21, 16), (2, 1, 21, 16), (2, 1, 1, 21)], dtype="float16"
    )
    k = _kernel(g)
    assert k.roles.nan_guard and Op.EXPAND in {graph_op(g, n) for n, _ in k.roles.prologue}
    inputs = graphs.random_inputs(g)
    mask = np.zeros((2, 1, 1, 21), np.float16)
    mask[0, ..., 3:9] = -np.inf
    mask[1] = -np.inf
    inputs["x3"] = mask
    _check(g, inputs, rtol=2e-3, atol=2e-3)


# -- end to end ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_optimize_picks_attention_and_verifies(tmp_path, monkeypatch, name):
    import orchestrate
    from examples import export_example
    from orchestrate import templates as registry
    from orchestrate.plan import pipeline

    src = tmp_path / f"{name}.onnx"
    export_example(name, src, dynamo=False, opset=17, size="tiny")
    result = orchestrate.optimize(src, tmp_path / "out", trials=2, rtol=1e-4, reproducible=True)
    assert result.report.ok and max(c.rel for c in result.report.checks) <= 1e-4
    templates = [k.template for k in result.plan.kernels]
    assert templates.count(ATTENTION) == 2, templates  # one per layer
    # the same model planned without the rule: the optimum can only be worse
    monkeypatch.setattr(registry, "RULES", [r for r in registry.RULES if r.name != ATTENTION])
    without = plan(pipeline.fission_file(src), PlanOptions(reproducible=True)).plan
    assert ATTENTION not in {k.template for k in without.kernels}
    assert result.plan.summary.predicted_us < without.summary.predicted_us
