"""Normalizations against onnxruntime (or the spec's formula where onnxruntime
has no kernel), plus the shape of their primitive graphs."""

from __future__ import annotations

import io
import math
import warnings
from collections import Counter

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrate.decompose import SUPPORTED_OPS, fission
from orchestrate.errors import UnsupportedError
from orchestrate.frontend import onnxrt, prepare
from orchestrate.ir.export import PRIMITIVE_ONNX_OPS, to_onnx
from tests.util import check_decomposition, node_model, op_counts

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIM = st.sampled_from([1, 2, 3, 5, 7])  # size-1 and non-power-of-two
SEEDS = st.integers(0, 2**31 - 1)
FLOAT = st.sampled_from(["float32", "float32", "float16", "float64"])
TOL = {"float16": (5e-3, 5e-3), "float32": (1e-4, 1e-4), "float64": (1e-9, 1e-9)}


def rand(rng, shape, dtype="float32", lo=None):
    x = rng.uniform(lo, 2.0, size=shape) if lo is not None else rng.standard_normal(shape) * 2
    return x.astype(dtype)


def split(inputs: dict, as_constants: bool):
    """(graph inputs, initializers): every entry but 'x' becomes a constant if asked."""
    if not as_constants:
        return inputs, {}
    return {"x": inputs["x"]}, {k: v for k, v in inputs.items() if k != "x"}


def check(op, inputs, *, constants=False, n_outputs=1, opset=20, tol=None, **attrs):
    feeds, consts = split(inputs, constants)
    model = node_model(
        op,
        feeds,
        constants=consts,
        input_order=list(inputs),
        n_outputs=n_outputs,
        opset=opset,
        **attrs,
    )
    rtol, atol = tol or TOL[inputs["x"].dtype.name]
    return check_decomposition(model, feeds, rtol=rtol, atol=atol)


def check_expected(op, inputs, want, *, opset=20, tol=None, **attrs):
    """Against the spec's formula, for dtypes / attributes onnxruntime does not run."""
    model = node_model(op, inputs, opset=opset, **attrs)
    rtol, atol = tol or TOL[inputs["x"].dtype.name]
    want = {"y0": want.astype(inputs["x"].dtype)}
    return check_decomposition(model, inputs, rtol=rtol, atol=atol, expected=want)


# -- LayerNormalization / RMSNormalization --------------------------------------


@st.composite
def trailing_norm_cases(draw):
    shape = tuple(draw(st.lists(DIM, min_size=1, max_size=4)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    return shape, axis, draw(FLOAT), draw(SEEDS)


@SETTINGS
@given(
    case=trailing_norm_cases(),
    with_bias=st.booleans(),
    all_outputs=st.booleans(),
    constants=st.booleans(),
    epsilon=st.sampled_from([1e-5, 1e-2]),
)
def test_layer_normalization(case, with_bias, all_outputs, constants, epsilon):
    shape, axis, dtype, seed = case
    rng = np.random.default_rng(seed)
    inputs = {"x": rand(rng, shape, dtype), "scale": rand(rng, shape[axis:], dtype)}
    if with_bias:
        inputs["bias"] = rand(rng, shape[axis:], dtype)
    graph = check(
        "LayerNormalization",
        inputs,
        constants=constants,
        n_outputs=3 if all_outputs else 1,
        opset=17,
        axis=axis,
        epsilon=epsilon,
    )
    # mean and variance: two sums over the same normalised axes
    axes = tuple(range(axis % len(shape), len(shape)))
    sums = [n for n in graph.nodes if n.op.value == "sum"]
    assert [n.attrs["axes"] for n in sums] == [axes, axes]


def test_layer_normalization_is_primitive_only():
    rng = np.random.default_rng(0)
    inputs = {"x": rand(rng, (2, 3, 6)), "s": rand(rng, (6,)), "b": rand(rng, (6,))}
    graph = check("LayerNormalization", inputs, n_outputs=3, opset=17)
    prim = to_onnx(graph)
    assert set(op_counts(prim)) <= PRIMITIVE_ONNX_OPS
    assert "LayerNormalization" not in op_counts(prim)
    assert Counter(n.op.value for n in graph.nodes) == Counter(
        {"sum": 2, "div": 2, "sub": 1, "mul": 3, "add": 2, "sqrt": 1, "recip": 1}
    )


def test_layer_normalization_float16_statistics_in_stash_type():
    rng = np.random.default_rng(1)
    inputs = {"x": rand(rng, (3, 64), "float16"), "s": rand(rng, (64,), "float16")}
    graph = check("LayerNormalization", inputs, n_outputs=3, opset=17)
    assert {n.dtype for n in graph.nodes if n.op.value == "sum"} == {"float32"}
    assert graph.types["y1"].dtype == "float32"  # Mean is in stash_type


@SETTINGS
@given(case=trailing_norm_cases(), constants=st.booleans(), epsilon=st.sampled_from([1e-5, 0.1]))
def test_rms_normalization(case, constants, epsilon):
    shape, axis, dtype, seed = case
    rng = np.random.default_rng(seed)
    inputs = {"x": rand(rng, shape, dtype), "scale": rand(rng, shape[axis:], dtype)}
    check("RMSNormalization", inputs, constants=constants, opset=23, axis=axis, epsilon=epsilon)


def test_rms_normalization_output_takes_the_scale_type():
    rng = np.random.default_rng(2)
    x, s = rand(rng, (2, 8), "float16"), rand(rng, (8,), "float32")
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-5) * s
    model = node_model("RMSNormalization", {"x": x, "s": s}, opset=23)
    check_decomposition(
        model, {"x": x, "s": s}, rtol=5e-3, atol=5e-3, expected={"y0": want.astype(np.float32)}
    )


@pytest.mark.parametrize("op", ["LayerNormalization", "RMSNormalization"])
def test_stash_type_outside_the_ir_is_declined(op):
    x = np.ones((2, 4), np.float32)
    model = node_model(op, {"x": x, "s": x[0]}, opset=23, stash_type=17)  # float8e4m3fn
    with pytest.raises(UnsupportedError, match="stash_type"):
        fission(prepare(model, {"x": (2, 4), "s": (4,)}))


@pytest.mark.parametrize("op", ["LayerNormalization", "RMSNormalization"])
def test_a_bfloat16_stash_type_keeps_float32_statistics(op):
    """bfloat16 is an IR dtype: a bf16 stash_type is taken, and float32 input
    keeps float32 statistics (the wider of the two)."""
    x = np.ones((2, 4), np.float32)
    model = node_model(op, {"x": x, "s": x[0]}, opset=23, stash_type=16)  # bfloat16
    graph = fission(prepare(model, {"x": (2, 4), "s": (4,)}))
    assert {n.dtype for n in graph.nodes if n.op.value == "sum"} == {"float32"}
    assert "bfloat16" not in {n.dtype for n in graph.nodes}


# -- BatchNormalization -----------------------------------------------------------


@SETTINGS
@given(
    n=DIM,
    c=DIM,
    spatial=st.lists(DIM, max_size=2),
    seed=SEEDS,
    opset=st.sampled_from([9, 14, 15]),
    dtype=st.sampled_from(["float32", "float16"]),
    constants=st.booleans(),
    epsilon=st.sampled_from([1e-5, 1e-2]),
)
def test_batch_normalization(n, c, spatial, seed, opset, dtype, constants, epsilon):
    rng = np.random.default_rng(seed)
    pdtype = "float32" if opset == 15 else dtype  # opset 15 lets parameters differ
    inputs = {
        "x": rand(rng, (n, c, *spatial), dtype),
        "scale": rand(rng, (c,), pdtype),
        "bias": rand(rng, (c,), pdtype),
        "mean": rand(rng, (c,), pdtype),
        "var": rand(rng, (c,), pdtype, lo=0.1),
    }
    graph = check("BatchNormalization", inputs, constants=constants, opset=opset, epsilon=epsilon)
    if constants:  # scale / sqrt(var + eps) and the shift are folded into two constants
        ops = [n.op.value for n in graph.nodes]
        assert ops == (["mul", "add"] if dtype == "float32" else ["cast", "mul", "add", "cast"])


def test_batch_normalization_spatial0_per_activation():
    rng = np.random.default_rng(3)
    p = {k: rand(rng, (3, 4), lo=0.1 if k == "var" else None) for k in ("s", "b", "m", "var")}
    inputs = {"x": rand(rng, (2, 3, 4)), **p}
    check("BatchNormalization", inputs, constants=True, opset=7, spatial=0)


def test_batch_normalization_opset6_is_test():
    rng = np.random.default_rng(4)
    x, s, b, m = (rand(rng, sh) for sh in ((2, 3, 5), (3,), (3,), (3,)))
    v = rand(rng, (3,), lo=0.1)
    want = (x - m[:, None]) / np.sqrt(v[:, None] + 1e-5) * s[:, None] + b[:, None]
    model = node_model(
        "BatchNormalization",
        {"x": x},
        constants={"s": s, "b": b, "m": m, "v": v},
        opset=6,
        is_test=1,
    )
    check_decomposition(model, {"x": x}, expected={"y0": want}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("outputs", [1, 3])
@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (2, 3), (1, 2, 7)])
def test_batch_normalization_training_uses_the_batch_statistics(outputs, shape):
    """training_mode=1 (what torch exports for a module left in train mode):
    Y by the batch's mean and population variance over every axis but the
    channels; the running statistics mixed by momentum, against the formula
    of the ONNX reference."""
    rng = np.random.default_rng(len(shape) + outputs)
    x = rand(rng, shape)
    c = shape[1]
    s, b, m = (rand(rng, (c,)) for _ in range(3))
    v = rand(rng, (c,), lo=0.1)
    axes = (0,) + tuple(range(2, x.ndim))
    x64 = x.astype(np.float64)
    mu, var = x64.mean(axis=axes), x64.var(axis=axes)
    bc = (slice(None),) + (None,) * (x.ndim - 2)
    want = {"y0": (x64 - mu[bc]) / np.sqrt(var[bc] + 1e-3) * s[bc] + b[bc]}
    if outputs == 3:
        want["y1"] = m * 0.8 + mu * 0.2
        want["y2"] = v * 0.8 + var * 0.2
    model = node_model(
        "BatchNormalization",
        {"x": x},
        constants={"s": s, "b": b, "m": m, "v": v},
        n_outputs=outputs,
        opset=15,
        training_mode=1,
        momentum=0.8,
        epsilon=1e-3,
    )
    want = {k: w.astype(np.float32) for k, w in want.items()}
    check_decomposition(model, {"x": x}, expected=want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opset, attrs", [(6, {"is_test": 0}), (6, {})])
def test_batch_normalization_training_is_declined(opset, attrs):
    x, p = np.ones((2, 3, 4), np.float32), np.ones(3, np.float32)
    consts = {"s": p, "b": p, "m": p, "v": p}
    model = node_model("BatchNormalization", {"x": x}, constants=consts, opset=opset, **attrs)
    with pytest.raises(UnsupportedError, match="training"):
        fission(prepare(model, {"x": x.shape}))


def test_batch_normalization_training_outputs_are_declined():
    x, p = np.ones((2, 3, 4), np.float32), np.ones(3, np.float32)
    consts = {"s": p, "b": p, "m": p, "v": p}
    model = node_model("BatchNormalization", {"x": x}, constants=consts, opset=9, n_outputs=5)
    with pytest.raises(UnsupportedError):
        fission(prepare(model, {"x": x.shape}))


# -- InstanceNormalization / GroupNormalization -------------------------------------


@SETTINGS
@given(
    n=DIM,
    c=DIM,
    spatial=st.lists(DIM, min_size=1, max_size=2),
    seed=SEEDS,
    dtype=st.sampled_from(["float32", "float16"]),
    constants=st.booleans(),
    epsilon=st.sampled_from([1e-5, 1e-2]),
)
def test_instance_normalization(n, c, spatial, seed, dtype, constants, epsilon):
    rng = np.random.default_rng(seed)
    inputs = {
        "x": rand(rng, (n, c, *spatial), dtype),
        "scale": rand(rng, (c,), dtype),
        "bias": rand(rng, (c,), dtype),
    }
    tol = (3e-4, 3e-4) if dtype == "float32" else None  # onnxruntime's own float32 error
    check("InstanceNormalization", inputs, constants=constants, opset=6, epsilon=epsilon, tol=tol)


def group_norm_formula(x, scale, bias, groups, per_channel, epsilon):
    epsilon = float(np.float32(epsilon))  # an ONNX float attribute
    n, c = x.shape[:2]
    g = x.astype(np.float64).reshape(n, groups, -1)
    m = g.mean(-1, keepdims=True)
    y = ((g - m) / np.sqrt(((g - m) ** 2).mean(-1, keepdims=True) + epsilon)).reshape(n, c, -1)
    if not per_channel:
        scale, bias = np.repeat(scale, c // groups), np.repeat(bias, c // groups)
    return (y * scale[:, None] + bias[:, None]).reshape(x.shape)


@SETTINGS
@given(
    n=DIM,
    groups=st.sampled_from([1, 2, 3]),
    per_group=st.sampled_from([1, 2, 3]),
    spatial=st.lists(DIM, max_size=2),
    seed=SEEDS,
    opset=st.sampled_from([18, 21]),
    dtype=FLOAT,
    constants=st.booleans(),
    epsilon=st.sampled_from([1e-5, 1e-2]),
)
def test_group_normalization(n, groups, per_group, spatial, seed, opset, dtype, constants, epsilon):
    rng = np.random.default_rng(seed)
    c = groups * per_group
    p = c if opset >= 21 else groups  # opset 18: per group, 21: per channel
    inputs = {
        "x": rand(rng, (n, c, *spatial), dtype),
        "scale": rand(rng, (p,), dtype),
        "bias": rand(rng, (p,), dtype),
    }
    attrs = dict(opset=opset, num_groups=groups, epsilon=epsilon)
    if epsilon < 1e-3 or dtype == "float64":
        # onnxruntime runs the function body: variance as E[x^2] - E[x]^2 in
        # float32, which cancels badly for groups of nearly equal values
        want = group_norm_formula(*inputs.values(), groups, opset >= 21, epsilon)
        check_expected("GroupNormalization", inputs, want, **attrs)
    else:
        check("GroupNormalization", inputs, constants=constants, **attrs)


def test_group_normalization_uneven_groups_are_declined():
    x, p = np.ones((1, 4, 3), np.float32), np.ones(4, np.float32)
    model = node_model("GroupNormalization", {"x": x, "s": p, "b": p}, opset=21, num_groups=3)
    with pytest.raises(UnsupportedError, match="groups"):
        fission(prepare(model, {"x": x.shape, "s": p.shape, "b": p.shape}))


# -- LRN, MeanVarianceNormalization, LpNormalization -------------------------------------


def lrn_formula(x, size, alpha, beta, bias):
    x64 = x.astype(np.float64)
    c = x.shape[1]
    sq = np.zeros_like(x64)
    for i in range(c):
        lo, hi = max(0, i - (size - 1) // 2), min(c - 1, i + math.ceil((size - 1) / 2))
        sq[:, i] = (x64[:, lo : hi + 1] ** 2).sum(axis=1)
    return x64 / (bias + alpha / size * sq) ** beta


@SETTINGS
@given(
    n=DIM,
    c=DIM,
    h=DIM,
    w=DIM,
    size=st.integers(1, 8),
    seed=SEEDS,
    alpha=st.sampled_from([1e-4, 0.5]),
    beta=st.sampled_from([0.75, 1.5]),
    bias=st.sampled_from([1.0, 2.5]),
    dtype=st.sampled_from(["float32", "float16"]),
)
def test_lrn(n, c, h, w, size, seed, alpha, beta, bias, dtype):
    x = rand(np.random.default_rng(seed), (n, c, h, w), dtype)
    attrs = dict(size=size, alpha=alpha, beta=beta, bias=bias)
    if size % 2:
        check("LRN", {"x": x}, opset=13, **attrs)
    else:  # onnxruntime runs odd sizes only
        check_expected("LRN", {"x": x}, lrn_formula(x, **attrs), opset=13, **attrs)


def test_lrn_other_ranks():
    x = rand(np.random.default_rng(5), (2, 5, 3))
    graph = check_expected("LRN", {"x": x}, lrn_formula(x, 3, 1e-4, 0.75, 1.0), size=3)
    assert Counter(n.op.value for n in graph.nodes)["pool"] == 1


def mvn_formula(x, axes):
    x64 = x.astype(np.float64)
    m = x64.mean(axis=tuple(axes), keepdims=True)
    return (x64 - m) / (np.sqrt(((x64 - m) ** 2).mean(axis=tuple(axes), keepdims=True)) + 1e-9)


@SETTINGS
@given(shape=st.lists(DIM, min_size=4, max_size=4), seed=SEEDS, data_=st.data(), dtype=FLOAT)
def test_mean_variance_normalization(shape, seed, data_, dtype):
    x = rand(np.random.default_rng(seed), shape, dtype)
    axes = data_.draw(
        st.none() | st.lists(st.integers(-4, 3), min_size=1, max_size=4, unique_by=lambda a: a % 4)
    )
    attrs = {} if axes is None else {"axes": axes}
    want = mvn_formula(x, [a % 4 for a in axes or (0, 2, 3)])
    if dtype == "float32":  # onnxruntime's function body runs float32 only
        got = onnxrt.run(
            node_model("MeanVarianceNormalization", {"x": x}, opset=13, **attrs), {"x": x}
        )["y0"]
        # its variance E[x^2] - E[x]^2 can come out negative (NaN); keep the formula there
        want = np.where(np.isfinite(got), got, want)
    tol = (1e-4, 1e-3) if dtype == "float32" else None
    check_expected("MeanVarianceNormalization", {"x": x}, want, opset=13, tol=tol, **attrs)


@SETTINGS
@given(
    shape=st.lists(DIM, min_size=1, max_size=3),
    seed=SEEDS,
    data_=st.data(),
    p=st.sampled_from([1, 2]),
    dtype=FLOAT,
    opset=st.sampled_from([13, 22]),
)
def test_lp_normalization(shape, seed, data_, p, dtype, opset):
    axis = data_.draw(st.integers(-len(shape), len(shape) - 1))
    x = rand(np.random.default_rng(seed), shape, dtype)
    x[(0,) * len(shape)] = 0
    if len(shape) > 1:
        x[0] = 0  # an all-zero row: onnxruntime gives zeros, not NaN
    check("LpNormalization", {"x": x}, opset=opset, axis=axis, p=p)


def test_lp_normalization_other_p_is_declined():
    model = node_model("LpNormalization", {"x": np.ones((2, 3), np.float32)}, p=3)
    with pytest.raises(UnsupportedError, match="p=3"):
        fission(prepare(model, {"x": (2, 3)}))


# -- what torch exporters emit --------------------------------------------------------


def export(module, args, **kw) -> onnx.ModelProto:
    torch = pytest.importorskip("torch")
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, f, **kw)
    return onnx.load_from_string(f.getvalue())


class _Norms:
    """LayerNorm, a hand-written RMSNorm (Pow / ReduceMean / Add / Sqrt / ...), softmax."""

    @staticmethod
    def module():
        import torch

        class Norms(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.ln = torch.nn.LayerNorm(12)
                self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 12))

            def forward(self, x):
                rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
                return self.ln(x), rms, torch.softmax(x, -1), torch.log_softmax(x, 1)

        return Norms()


@pytest.mark.parametrize("dynamo, opset", [(False, 14), (False, 16), (True, 18)])
def test_torch_exported_norms(dynamo, opset):
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(0))
    model = export(_Norms.module(), (x,), dynamo=dynamo, opset_version=opset)
    ops = op_counts(model)
    if opset < 17:  # LayerNormalization spelled out, ReduceMean with an axes attribute
        assert ops["ReduceMean"] >= 2 and "LayerNormalization" not in ops
        assert any(a.name == "axes" for n in model.graph.node for a in n.attribute)
    else:
        assert ops["LayerNormalization"] == 1
    check_decomposition(model, {model.graph.input[0].name: x.numpy()}, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif("Reshape" not in SUPPORTED_OPS, reason="needs the layout family")
def test_torch_exported_group_norm():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 6, 3, 5, generator=torch.Generator().manual_seed(0))
    model = export(torch.nn.GroupNorm(3, 6), (x,), dynamo=True, opset_version=18)
    check_decomposition(model, {model.graph.input[0].name: x.numpy()}, rtol=1e-4, atol=1e-5)
