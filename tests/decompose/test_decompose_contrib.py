"""onnxruntime's fused operators against onnxruntime's own kernels, and a
model its transformer optimizer rewrote (tiny BERT with com.microsoft
Attention, SkipLayerNormalization and BiasGelu) through optimize."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import orchestrate
from orchestrate.decompose import SUPPORTED_OPS
from orchestrate.errors import UnsupportedError
from tests.util import check_decomposition, node_model

MS = "com.microsoft"
RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def ms_model(op, inputs, constants=None, order=None, n_outputs=1, domain=MS, **attrs):
    """One ``op`` node of ``domain``; ``order`` the node's arguments ("" for
    an omitted one)."""
    return node_model(
        op,
        inputs,
        constants=constants,
        input_order=order,
        n_outputs=n_outputs,
        opset=17,
        domain=domain,
        **attrs,
    )


def check(model, feeds, rtol=1e-4, atol=1e-5):
    return check_decomposition(model, feeds, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "op, attrs",
    [("Gelu", {}), ("FastGelu", {}), ("QuickGelu", {}), ("QuickGelu", {"alpha": 1.3})],
)
def test_gelus(op, attrs):
    x = {"x": rand(2, 3, 8)}
    check(ms_model(op, x, **attrs), x)


def test_gelus_with_bias():
    x = {"x": rand(2, 3, 8)}
    bias = {"b": rand(8)}
    check(ms_model("BiasGelu", x, bias), x)
    check(ms_model("FastGelu", x, bias), x)


def test_bias_add():
    """Against its formula: onnxruntime has BiasAdd on CUDA only."""
    feeds = {"x": rand(2, 3, 8), "skip": rand(2, 3, 8)}
    bias = rand(8)
    model = ms_model("BiasAdd", feeds, {"b": bias}, order=["x", "b", "skip"])
    want = {"y0": feeds["x"] + bias + feeds["skip"]}
    check_decomposition(model, feeds, rtol=1e-6, atol=1e-6, expected=want)


@pytest.mark.parametrize(
    "trans_a, trans_b, alpha", [(0, 0, 1.0), (1, 0, 0.5), (0, 1, 2.0), (1, 1, -1.0)]
)
def test_fused_matmul(trans_a, trans_b, alpha):
    a = rand(2, 5, 4) if trans_a else rand(2, 4, 5)
    c = rand(6, 5) if trans_b else rand(5, 6)
    feeds = {"a": a, "c": c}
    model = ms_model("FusedMatMul", feeds, transA=trans_a, transB=trans_b, alpha=alpha)
    check(model, feeds)


@pytest.mark.parametrize("with_beta, with_bias", [(True, True), (False, False), (True, False)])
def test_skip_layer_normalization_and_its_sum(with_beta, with_bias):
    feeds = {"x": rand(2, 3, 8), "skip": rand(2, 3, 8)}
    consts = {"gamma": rand(8)}
    order = ["x", "skip", "gamma", "beta" if with_beta else "", "bias" if with_bias else ""]
    if with_beta:
        consts["beta"] = rand(8)
    if with_bias:
        consts["bias"] = rand(8)
    while order[-1] == "":
        order.pop()
    model = ms_model("SkipLayerNormalization", feeds, consts, order, n_outputs=4, epsilon=1e-5)
    del model.graph.output[1:3]  # mean and inverse std: not written by onnxruntime's CPU kernel
    check(model, feeds)


def test_skip_simplified_layer_normalization():
    feeds = {"x": rand(2, 3, 8), "skip": rand(2, 3, 8)}
    consts = {"gamma": rand(8), "bias": rand(8)}
    model = ms_model("SkipSimplifiedLayerNormalization", feeds, consts, n_outputs=4, epsilon=1e-6)
    del model.graph.output[1:3]
    check(model, feeds)


def test_simplified_layer_normalization_in_the_onnx_domain():
    """onnxruntime's optimizer writes it in the ONNX domain, which onnx's
    checker does not know."""
    feeds = {"x": rand(2, 3, 8)}
    model = ms_model("SimplifiedLayerNormalization", feeds, {"s": rand(8)}, domain="", epsilon=1e-6)
    check(model, feeds)
    assert "SimplifiedLayerNormalization" in SUPPORTED_OPS


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rank, rotary", [(3, 0), (4, 0), (4, 4)])
def test_rotary_embedding(interleaved, rank, rotary):
    batch, seq, heads, head = 2, 3, 2, 8
    x = rand(batch, seq, heads * head) if rank == 3 else rand(batch, heads, seq, head)
    half = (rotary or head) // 2
    angles = RNG.uniform(0, 3, size=(16, half))
    consts = {
        "cos": np.cos(angles).astype(np.float32),
        "sin": np.sin(angles).astype(np.float32),
    }
    feeds = {"x": x, "pos": RNG.integers(0, 16, size=(batch, seq)).astype(np.int64)}
    # onnxruntime wants num_heads with a 3-D input or a partial rotary dim
    attrs = {"interleaved": interleaved, "num_heads": heads if rank == 3 or rotary else 0}
    if rotary:
        attrs["rotary_embedding_dim"] = rotary
    model = ms_model("RotaryEmbedding", feeds, consts, ["x", "pos", "cos", "sin"], **attrs)
    check(model, feeds)


def test_rotary_embedding_from_a_start_position():
    x = rand(1, 4, 16)
    angles = RNG.uniform(0, 3, size=(16, 4))
    consts = {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    consts = {"pos": np.array([5], np.int64), **consts}
    model = ms_model("RotaryEmbedding", {"x": x}, consts, ["x", "pos", "cos", "sin"], num_heads=2)
    check(model, {"x": x})


@pytest.mark.parametrize("with_bias, causal", [(False, 0), (True, 0), (True, 1)])
def test_multi_head_attention(with_bias, causal):
    feeds = {"q": rand(2, 3, 8), "k": rand(2, 5 - 2 * causal, 8), "v": rand(2, 5 - 2 * causal, 8)}
    consts = {"bias": rand(24)} if with_bias else {}
    model = ms_model("MultiHeadAttention", feeds, consts, num_heads=2, unidirectional=causal)
    check(model, feeds)


@pytest.mark.parametrize("mask", [None, "lengths", "raw", "raw3"])
@pytest.mark.parametrize("causal", [0, 1])
def test_packed_attention(mask, causal):
    batch, seq, hidden = 2, 4, 8
    feeds = {"x": rand(batch, seq, hidden)}
    consts = {"w": rand(hidden, 3 * hidden) * 0.5, "b": rand(3 * hidden)}
    order = ["x", "w", "b"]
    if mask == "lengths":
        feeds["m"] = np.array([4, 2], dtype=np.int32)
    elif mask == "raw":
        feeds["m"] = np.array([[1, 1, 0, 1], [1, 0, 0, 0]], dtype=np.int32)
    elif mask == "raw3":
        feeds["m"] = RNG.integers(0, 2, size=(batch, seq, seq)).astype(np.int32)
        feeds["m"][:, :, 0] = 1
    if mask:
        order.append("m")
    model = ms_model("Attention", feeds, consts, order, num_heads=2, unidirectional=causal)
    check(model, feeds)


def test_forms_left_out_are_declined_naming_them():
    feeds = {"a": rand(2, 4, 5), "c": rand(2, 5, 6)}
    model = ms_model("FusedMatMul", feeds, transBatchA=1)
    with pytest.raises(UnsupportedError, match="transBatchA"):
        check(model, feeds)


def test_a_model_onnxruntime_optimized_optimizes_and_verifies(tmp_path):
    """tiny BERT as onnxruntime's transformer optimizer writes it."""
    from onnxruntime.transformers import optimizer

    fused = optimizer.optimize_model(
        "examples/models/tiny_bert.onnx",
        model_type="bert",
        num_heads=4,
        hidden_size=64,
        opt_level=0,
    )
    src = tmp_path / "bert_fused.onnx"
    fused.save_model_to_file(str(src))
    ops = {(n.domain, n.op_type) for n in onnx.load(src).graph.node}
    assert {(MS, "Attention"), (MS, "SkipLayerNormalization"), (MS, "BiasGelu")} <= ops
    result = orchestrate.optimize(src, tmp_path / "bert.orch", trials=2, reproducible=True)
    assert result.report.ok
    assert any(k.template == "attention" for k in result.plan.kernels)
