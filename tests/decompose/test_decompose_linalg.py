"""MatMul, Gemm, Einsum and Attention fission against onnxruntime (and the
ONNX reference where onnxruntime has no kernel)."""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx.reference import ReferenceEvaluator

from orchestrate.decompose import fission
from orchestrate.errors import UnsupportedError
from orchestrate.frontend import prepare
from orchestrate.ir import Op, reference
from tests.util import check_decomposition, node_model

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SEEDS = st.integers(0, 2**31 - 1)
DIMS = st.sampled_from([1, 2, 3, 5, 7])
TOL = {
    "float16": (1e-2, 1e-2),
    "float32": (1e-4, 1e-5),
    "float64": (1e-10, 1e-12),
    "int32": (0, 0),
    "int64": (0, 0),
}
SOFTMAX_OPS = {Op.RMAX, Op.SUB, Op.EXP, Op.SUM, Op.DIV}


def rand(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-4, 5, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def primitive_ops(model, feeds) -> Counter:
    graph = fission(prepare(model, {k: v.shape for k, v in feeds.items()}))
    return Counter(n.op for n in graph.nodes)


def onnx_reference(model, feeds):
    outs = ReferenceEvaluator(model).run(None, feeds)
    return {f"y{k}": np.asarray(o) for k, o in enumerate(outs)}


# -- MatMul -------------------------------------------------------------------------------


@st.composite
def matmul_cases(draw):
    ra, rb = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    m, k, n = draw(DIMS), draw(DIMS), draw(DIMS)
    batch = draw(st.lists(DIMS, min_size=2, max_size=2))
    # batch axes broadcast: each operand keeps a suffix, some axes set to 1
    ba = [d if draw(st.booleans()) else 1 for d in batch][4 - max(ra, 2) :]
    bb = [d if draw(st.booleans()) else 1 for d in batch][4 - max(rb, 2) :]
    a = (k,) if ra == 1 else tuple(ba) + (m, k)
    b = (k,) if rb == 1 else tuple(bb) + (k, n)
    dtype = draw(st.sampled_from(["float32", "float32", "float64", "float16", "int32", "int64"]))
    return a, b, dtype, draw(st.booleans()), draw(SEEDS)


@SETTINGS
@given(matmul_cases())
def test_matmul(case):
    a_shape, b_shape, dtype, const_b, seed = case
    a, b = rand(a_shape, dtype, seed), rand(b_shape, dtype, seed + 1)
    if const_b:  # a weight, as exporters write it
        model = node_model("MatMul", {"a": a}, constants={"b": b})
        feeds = {"a": a}
    else:
        feeds = {"a": a, "b": b}
        model = node_model("MatMul", feeds)
    rtol, atol = TOL[dtype]
    check_decomposition(model, feeds, rtol=rtol, atol=atol)


def test_matmul_of_vectors_is_reshaped_around_one_matmul():
    feeds = {"a": rand((5,), "float32", 0), "b": rand((2, 5, 3), "float32", 1)}
    model = node_model("MatMul", feeds)
    check_decomposition(model, feeds)
    assert primitive_ops(model, feeds) == Counter({Op.RESHAPE: 2, Op.MATMUL: 1})


def test_matmul_declines_8_bit_integers():
    feeds = {"a": rand((2, 3), "int8", 0), "b": rand((3, 2), "int8", 1)}
    with pytest.raises(UnsupportedError, match="int8"):
        fission(prepare(node_model("MatMul", feeds)))


# -- Gemm ---------------------------------------------------------------------------------------


@SETTINGS
@given(
    m=DIMS,
    k=DIMS,
    n=DIMS,
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    alpha=st.sampled_from([1.0, 0.5, -2.0]),
    beta=st.sampled_from([1.0, 0.0, 0.25]),
    c_form=st.sampled_from(["none", "n", "1n", "m1", "mn", "scalar"]),
    const=st.booleans(),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=SEEDS,
)
def test_gemm(m, k, n, trans_a, trans_b, alpha, beta, c_form, const, dtype, seed):
    a = rand((k, m) if trans_a else (m, k), dtype, seed)
    b = rand((n, k) if trans_b else (k, n), dtype, seed + 1)
    c_shape = {"n": (n,), "1n": (1, n), "m1": (m, 1), "mn": (m, n), "scalar": ()}.get(c_form)
    feeds, consts = {"a": a}, {}
    (consts if const else feeds)["b"] = b
    if c_shape is not None:
        (consts if const else feeds)["c"] = rand(c_shape, dtype, seed + 2)
    model = node_model(
        "Gemm",
        feeds,
        constants=consts,
        input_order=["a", "b", "c"][: 2 + bool(c_shape is not None)],
        alpha=alpha,
        beta=beta,
        transA=int(trans_a),
        transB=int(trans_b),
    )
    rtol, atol = TOL[dtype]
    check_decomposition(model, feeds, rtol=rtol, atol=atol)


def test_gemm_is_matmul_mul_add():
    x = rand((4, 6), "float32", 0)
    consts = {"w": rand((3, 6), "float32", 1), "c": rand((3,), "float32", 2)}
    model = node_model("Gemm", {"x": x}, constants=consts, transB=1, alpha=0.5, beta=2.0)
    check_decomposition(model, {"x": x})
    # the constant weight is transposed and C scaled at compile time
    assert primitive_ops(model, {"x": x}) == Counter({Op.MATMUL: 1, Op.MUL: 1, Op.ADD: 1})


@pytest.mark.parametrize("shape", [(2, 5), (2, 7, 5)])
def test_torch_linear_export(shape):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layer = torch.nn.Linear(5, 3).eval()
    x = torch.randn(*shape)
    buf = io.BytesIO()
    torch.onnx.export(
        layer, (x,), buf, opset_version=14, dynamo=False, input_names=["x"], output_names=["y"]
    )
    model = onnx.load_from_string(buf.getvalue())
    expected_op = "Gemm" if len(shape) == 2 else "MatMul"
    assert expected_op in {n.op_type for n in model.graph.node}
    check_decomposition(model, {"x": x.numpy()})


# -- Einsum -----------------------------------------------------------------------------------

EQUATIONS = [
    "ij,jk->ik",
    "ij,jk",
    "bij,bjk->bik",
    "i,i",
    "i,i->",
    "i,j->ij",
    "ij->ji",
    "ij->",
    "ij->i",
    "ii->i",
    "ii",
    "...ii->...i",
    "...ij,...jk->...ik",
    "...ij,jk->...ik",
    "bhqd,bhkd->bhqk",
    "bhqk,bhkd->bhqd",
    "ij,ij->ij",
    "ij,ij->i",
    "abc,cd->abd",
    "ijk,jil->kl",
    "i,jk->ijk",
    "ij,kj->ikj",
    "iij,jk->ik",
    "ijk",
    "Ab,bc->Ac",
    "bij,bjk",
    "iii->i",
    "iij,kjj->ik",
]


@SETTINGS
@given(
    equation=st.sampled_from(EQUATIONS),
    sizes=st.dictionaries(st.sampled_from("abcdhijklqABZ"), DIMS),
    ellipsis=st.lists(DIMS, max_size=2),
    unit=st.integers(0, 3),
    dtype=st.sampled_from(["float32", "float64", "int64"]),
    seed=SEEDS,
)
def test_einsum(equation, sizes, ellipsis, unit, dtype, seed):
    terms = equation.split("->")[0].split(",")
    feeds = {}
    for t, term in enumerate(terms):
        dims = list(ellipsis) if "..." in term else []
        if t == 1 and dims and unit < len(dims):  # a broadcast ellipsis axis
            dims[unit] = 1
        head, _, tail = term.partition("...")
        shape = [sizes.get(c, 3) for c in head] + dims + [sizes.get(c, 3) for c in tail]
        if "..." not in term:
            shape = [sizes.get(c, 3) for c in term]
        feeds[f"x{t}"] = rand(shape, dtype, seed + t)
    model = node_model("Einsum", feeds, equation=equation, opset=12)
    rtol, atol = TOL[dtype]
    check_decomposition(model, feeds, rtol=rtol, atol=atol)


def test_einsum_is_transpose_reshape_matmul():
    feeds = {"a": rand((2, 3, 4, 5), "float32", 0), "b": rand((2, 3, 6, 5), "float32", 1)}
    model = node_model("Einsum", feeds, equation="bhqd,bhkd->bhqk")
    check_decomposition(model, feeds)
    assert set(primitive_ops(model, feeds)) <= {Op.TRANSPOSE, Op.RESHAPE, Op.MATMUL}


def test_einsum_declines_three_operands():
    feeds = {k: rand((3, 3), "float32", 0) for k in "abc"}
    with pytest.raises(UnsupportedError, match="3 operands"):
        fission(prepare(node_model("Einsum", feeds, equation="ij,jk,kl->il")))


# -- Attention --------------------------------------------------------------------------------


@st.composite
def attention_cases(draw):
    batch, q_len, kv_len = draw(st.sampled_from([1, 2])), draw(DIMS), draw(DIMS)
    hkv = draw(st.sampled_from([1, 2]))
    hq = hkv * draw(st.sampled_from([1, 2, 3]))  # grouped-query when > 1
    head, v_head = draw(st.sampled_from([2, 4, 8])), draw(st.sampled_from([1, 3, 4]))
    past = draw(st.sampled_from([0, 0, 1, 3]))
    total = past + kv_len
    mask = draw(st.sampled_from(["none", "bool", "float"]))
    mask_shape = draw(
        st.sampled_from([(q_len, total), (batch, 1, q_len, total), (hq, q_len, total)])
    )
    return dict(
        batch=batch,
        q_len=q_len,
        kv_len=kv_len,
        hq=hq,
        hkv=hkv,
        head=head,
        v_head=v_head,
        past=past,
        mask=mask,
        mask_shape=mask_shape,
        three_d=draw(st.booleans()),
        causal=draw(st.booleans()),
        scale=draw(st.sampled_from([None, 0.3])),
        softcap=draw(st.sampled_from([0.0, 0.0, 2.5])),
        mode=draw(st.integers(0, 3)),
        # onnxruntime wants present_key / present_value whenever past_key is given
        n_outputs=draw(st.sampled_from([3, 4] if past else [1, 4])),
        opset=draw(st.sampled_from([23, 24])),
        dtype=draw(st.sampled_from(["float32", "float32", "float16"])),
        seed=draw(SEEDS),
    )


@SETTINGS
@given(attention_cases())
def test_attention(c):
    dtype, seed = c["dtype"], c["seed"]
    b, hq, hkv, d, dv = c["batch"], c["hq"], c["hkv"], c["head"], c["v_head"]
    if c["three_d"]:
        q = rand((b, c["q_len"], hq * d), dtype, seed)
        k = rand((b, c["kv_len"], hkv * d), dtype, seed + 1)
        v = rand((b, c["kv_len"], hkv * dv), dtype, seed + 2)
    else:
        q = rand((b, hq, c["q_len"], d), dtype, seed)
        k = rand((b, hkv, c["kv_len"], d), dtype, seed + 1)
        v = rand((b, hkv, c["kv_len"], dv), dtype, seed + 2)
    feeds = {"q": q, "k": k, "v": v}
    order = ["q", "k", "v"]
    if c["mask"] == "bool":
        feeds["mask"] = np.random.default_rng(seed + 3).random(c["mask_shape"]) > 0.3
    elif c["mask"] == "float":
        feeds["mask"] = rand(c["mask_shape"], dtype, seed + 3)
    order.append("mask" if c["mask"] != "none" else "")
    if c["past"]:
        feeds["pk"] = rand((b, hkv, c["past"], d), dtype, seed + 4)
        feeds["pv"] = rand((b, hkv, c["past"], dv), dtype, seed + 5)
        order += ["pk", "pv"]
    attrs = dict(is_causal=int(c["causal"]), softcap=c["softcap"])
    if c["three_d"]:
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
    if c["scale"] is not None:
        attrs["scale"] = c["scale"]
    if c["n_outputs"] == 4:
        attrs["qk_matmul_output_mode"] = c["mode"]
    n_outputs = c["n_outputs"]
    while order[-1] == "":
        order.pop()
    model = node_model(
        "Attention", feeds, input_order=order, n_outputs=n_outputs, opset=c["opset"], **attrs
    )
    expected = None
    if n_outputs == 4 and c["mode"] == 2 and (c["causal"] or c["mask"] == "bool"):
        # onnxruntime writes masked scores as the lowest float; the spec says -inf
        expected = onnx_reference(model, feeds)
    if c["causal"] and c["past"] and c["q_len"] == 1 < c["kv_len"]:
        # onnxruntime lets a single query see every key; the spec (query i sees
        # key j <= i + past length) does not
        expected = onnx_reference(model, feeds)
        if n_outputs == 4 and c["mode"] == 0 and c["softcap"]:
            del expected["y3"]  # the reference softcaps mode 0; spec and onnxruntime do not
    rtol, atol = (2e-2, 2e-2) if dtype == "float16" else (1e-4, 1e-5)
    check_decomposition(model, feeds, rtol=rtol, atol=atol, expected=expected)


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("lens", [(7, 4), (3, 6)])
def test_attention_nonpad_kv_seqlen(causal, lens):
    feeds = {
        "q": rand((2, 4, 5, 8), "float32", 0),
        "k": rand((2, 2, 7, 8), "float32", 1),
        "v": rand((2, 2, 7, 3), "float32", 2),
        "lens": np.array(lens, np.int64),
    }
    model = node_model(
        "Attention",
        feeds,
        input_order=["q", "k", "v", "", "", "", "lens"],
        is_causal=causal,
        opset=24,
    )
    check_decomposition(model, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("window", [(2, 0), (2, 1), (-1, 1), (0, -1)])
@pytest.mark.parametrize("cache", ["none", "past", "nonpad"])
def test_attention_sliding_window(window, cache):
    # opset 25: onnxruntime has no kernel yet, so the ONNX reference decides
    feeds = {
        "q": rand((2, 2, 5, 4), "float32", 0),
        "k": rand((2, 2, 6, 4), "float32", 1),
        "v": rand((2, 2, 6, 3), "float32", 2),
    }
    order = ["q", "k", "v"]
    if cache == "past":
        feeds.update(pk=rand((2, 2, 2, 4), "float32", 3), pv=rand((2, 2, 2, 3), "float32", 4))
        order += ["", "pk", "pv"]
    elif cache == "nonpad":
        feeds["lens"] = np.array([3, 6], np.int64)
        order += ["", "", "", "lens"]
    model = node_model(
        "Attention",
        feeds,
        input_order=order,
        opset=25,
        left_window_size=window[0],
        right_window_size=window[1],
    )
    expected = onnx_reference(model, feeds)
    # the composed graph stays inside the primitives onnxruntime runs
    check_decomposition(model, feeds, rtol=1e-4, atol=1e-5, expected=expected)


def test_attention_fully_masked_rows_are_zero():
    feeds = {
        "q": rand((1, 2, 3, 4), "float32", 0),
        "k": rand((1, 2, 5, 4), "float32", 1),
        "v": rand((1, 2, 5, 4), "float32", 2),
        "mask": np.zeros((3, 5), bool),
    }
    feeds["mask"][1] = True
    model = node_model("Attention", feeds, opset=23)
    graph = check_decomposition(model, feeds)
    y = reference.run(graph, feeds)["y0"]
    assert not np.isnan(y).any()
    assert (y[:, :, [0, 2]] == 0).all() and (y[:, :, 1] != 0).all()


def test_attention_is_only_primitives():
    feeds = {
        "q": rand((2, 3, 16), "float32", 0),
        "k": rand((2, 5, 8), "float32", 1),
        "v": rand((2, 5, 8), "float32", 2),
    }
    model = node_model("Attention", feeds, opset=23, q_num_heads=4, kv_num_heads=2, is_causal=1)
    check_decomposition(model, feeds)
    ops = primitive_ops(model, feeds)
    assert ops[Op.MATMUL] == 2 and ops[Op.EXP] == 1 and ops[Op.WHERE] == 1
    assert SOFTMAX_OPS <= set(ops)
    layout = {Op.RESHAPE, Op.TRANSPOSE, Op.EXPAND}
    assert set(ops) <= SOFTMAX_OPS | layout | {Op.MATMUL, Op.MUL, Op.WHERE, Op.MAX}


def test_attention_declines_bad_heads():
    feeds = {
        "q": rand((1, 3, 8), "float32", 0),
        "k": rand((1, 5, 8), "float32", 1),
        "v": rand((1, 5, 8), "float32", 2),
    }
    model = node_model("Attention", feeds, opset=23, q_num_heads=2, kv_num_heads=2)
    del model.graph.node[0].attribute[:]  # 3-D without head counts
    with pytest.raises(UnsupportedError, match="heads"):
        fission(model)


def test_torch_sdpa_export():
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8) for _ in range(3))
    model = torch.onnx.export(
        Sdpa().eval(), (q, k, v), dynamo=True, opset_version=23, verbose=False
    ).model_proto
    assert "Attention" in {n.op_type for n in model.graph.node}
    names = [i.name for i in model.graph.input]
    check_decomposition(model, dict(zip(names, (q.numpy(), k.numpy(), v.numpy()))))
