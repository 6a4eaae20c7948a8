"""Reductions and the softmax family against onnxruntime, every opset form."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrate.decompose import fission
from orchestrate.errors import UnsupportedError
from orchestrate.frontend import onnxrt, prepare
from orchestrate.ir import reference
from tests.util import check_decomposition, node_model

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# size-1 and non-power-of-two dims
SHAPES = st.lists(st.sampled_from([1, 2, 3, 5, 7]), min_size=1, max_size=4).map(tuple)
SEEDS = st.integers(0, 2**31 - 1)
TOL = {"float16": (4e-3, 4e-3), "float32": (1e-5, 1e-5), "float64": (1e-10, 1e-12)}

REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]
# integer dtypes onnxruntime runs for each op (the others are float only)
INT_DTYPES = {
    "ReduceSum": ["int32", "int64"],
    "ReduceMean": ["int32", "int64"],
    "ReduceMax": ["int32", "int64", "int8", "uint8"],
    "ReduceMin": ["int32", "int64", "uint8"],
    "ReduceProd": ["int32", "int64"],
    "ReduceL1": ["int32", "int64"],
    "ReduceL2": ["int32", "int64"],
    "ReduceSumSquare": ["int32", "int64"],
}


def data(shape, dtype, seed, op=""):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        lo = 0 if np.dtype(dtype).kind == "u" else -4
        return rng.integers(lo, 5, size=shape).astype(dtype)
    if op == "ReduceProd":  # keep products of up to 7**4 factors finite
        x = rng.uniform(0.7, 1.3, size=shape) * rng.choice([-1, 1], size=shape)
    elif op == "ReduceLogSum":
        x = rng.uniform(0.1, 2.0, size=shape)
    else:
        x = rng.standard_normal(shape) * 2
    return x.astype(dtype)


def axes_form(op: str, opset: int) -> str:
    """'attr' when this opset gives axes as an attribute, else 'input'."""
    return "attr" if opset < (13 if op == "ReduceSum" else 18) else "input"


@st.composite
def reduce_cases(draw, op):
    shape = draw(SHAPES)
    rank = len(shape)
    dtypes = ["float32", "float16", "float64"] + INT_DTYPES.get(op, [])
    dtype = draw(st.sampled_from(dtypes))
    opset = draw(st.sampled_from([11, 13, 18, 20] if op == "ReduceSum" else [13, 18, 20]))
    if op in ("ReduceMax", "ReduceMin") and opset < 18 and dtype in ("int8", "uint8"):
        opset = 18
    # None: axes omitted; a list (maybe empty, with negative axes) otherwise
    axes = draw(
        st.none()
        | st.lists(st.integers(-rank, rank - 1), max_size=rank, unique_by=lambda a: a % rank)
    )
    keepdims = draw(st.sampled_from([0, 1]))
    noop = draw(st.sampled_from([0, 1])) if axes_form(op, opset) == "input" else 0
    return shape, dtype, opset, axes, keepdims, noop, draw(SEEDS)


def reduce_model(op, x, opset, axes, keepdims, noop):
    attrs = {"keepdims": keepdims}
    consts = {}
    if axes_form(op, opset) == "attr":
        if axes:
            attrs["axes"] = axes
    else:
        if noop:
            attrs["noop_with_empty_axes"] = noop
        if axes is not None:
            consts["axes"] = np.array(axes, dtype=np.int64)
    return node_model(op, {"x": x}, constants=consts, opset=opset, **attrs)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_matches_onnxruntime(op):
    @SETTINGS
    @given(reduce_cases(op))
    def check(case):
        shape, dtype, opset, axes, keepdims, noop, seed = case
        if op in ("ReduceLogSum", "ReduceLogSumExp") and dtype not in TOL:
            dtype = "float32"
        x = data(shape, dtype, seed, op)
        rtol, atol = TOL.get(dtype, (0, 0))
        if dtype == "float16" and op in ("ReduceProd", "ReduceSumSquare", "ReduceSum"):
            atol = 2e-2  # float16 output rounding of sums up to ~100
        check_decomposition(
            reduce_model(op, x, opset, axes, keepdims, noop), {"x": x}, rtol=rtol, atol=atol
        )

    check()


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_bool(op):
    x = np.array([[True, False, False], [False, False, False]])
    for keepdims in (0, 1):
        model = node_model(op, {"x": x}, constants={"axes": np.array([1])}, keepdims=keepdims)
        check_decomposition(model, {"x": x})


def test_reduce_noop_with_empty_axes_applies_the_elementwise_part():
    x = np.array([[-1.5, 2.0], [3.0, -4.0]], np.float32)
    empty = {"axes": np.zeros((0,), np.int64)}
    for op in REDUCE_OPS:
        model = node_model(op, {"x": x}, constants=empty, noop_with_empty_axes=1)
        check_decomposition(model, {"x": x}, rtol=1e-6)
    square = node_model("ReduceSumSquare", {"x": x}, constants=empty, noop_with_empty_axes=1)
    graph = fission(prepare(square, {"x": (2, 2)}))
    assert [n.op.value for n in graph.nodes] == ["mul"]


def test_reduce_empty_set():
    x = np.zeros((2, 0, 3), np.float32)
    for op in REDUCE_OPS:
        model = node_model(op, {"x": x}, constants={"axes": np.array([1])})
        check_decomposition(model, {"x": x})


def test_reduce_log_sum_exp_is_stable():
    x = np.array([[1000.0, 999.0, -1000.0], [-1e3, -1e3, -1e3], [np.inf, 1.0, 2.0]], np.float32)
    x = np.concatenate([x, np.full((1, 3), -np.inf, np.float32)])
    model = node_model("ReduceLogSumExp", {"x": x}, constants={"axes": np.array([1])})
    want = np.array([[1000.0 + np.log1p(np.exp(-1.0))], [-1e3 + np.log(3.0)], [np.inf], [-np.inf]])
    check_decomposition(model, {"x": x}, expected={"y0": want.astype(np.float32)})


def test_reduce_axes_must_be_constant():
    x = np.ones((2, 3), np.float32)
    model = node_model("ReduceSum", {"x": x, "axes": np.array([1])}, opset=13)
    with pytest.raises(UnsupportedError, match="'axes' must be a constant"):
        fission(prepare(model, {"x": (2, 3), "axes": (1,)}))


def test_reduce_log_sum_exp_declines_integers():
    x = np.ones((2, 3), np.int32)
    model = node_model("ReduceLogSumExp", {"x": x}, constants={"axes": np.array([1])})
    with pytest.raises(UnsupportedError, match="int32"):
        fission(prepare(model, {"x": (2, 3)}))


# -- ArgMax / ArgMin -----------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@SETTINGS
@given(
    shape=SHAPES,
    seed=SEEDS,
    data_=st.data(),
    dtype=st.sampled_from(["float32", "float16", "float64", "int32", "int64", "uint8", "int8"]),
    keepdims=st.sampled_from([0, 1]),
    last=st.sampled_from([0, 1]),
)
def test_arg_matches_onnxruntime(op, shape, seed, data_, dtype, keepdims, last):
    axis = data_.draw(st.integers(-len(shape), len(shape) - 1))
    # few distinct values: ties decide between first and last index
    x = np.random.default_rng(seed).integers(0, 3, size=shape).astype(dtype)
    model = node_model(op, {"x": x}, axis=axis, keepdims=keepdims, select_last_index=last)
    check_decomposition(model, {"x": x})


def test_arg_opset11_default_axis():
    x = data((3, 5), "float32", 1)
    check_decomposition(node_model("ArgMax", {"x": x}, opset=11, keepdims=0), {"x": x})


# -- Softmax / LogSoftmax / Hardmax -----------------------------------------------


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@SETTINGS
@given(
    shape=SHAPES,
    seed=SEEDS,
    data_=st.data(),
    opset=st.sampled_from([11, 13, 20]),
    dtype=st.sampled_from(["float32", "float32", "float16", "float64"]),
    scale=st.sampled_from([1.0, 1e3]),
    default_axis=st.booleans(),
)
def test_softmax_family_matches_onnxruntime(
    op, shape, seed, data_, opset, dtype, scale, default_axis
):
    rank = len(shape)
    attrs = {} if default_axis else {"axis": data_.draw(st.integers(-rank, rank - 1))}
    if default_axis and opset < 13 and rank < 2:
        attrs = {"axis": 0}  # the default axis 1 does not exist
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * scale
    if op == "Hardmax":  # ties: the first maximum wins; onnxruntime runs float32 only
        x, dtype = np.round(x / scale), "float32"
    x = x.astype(dtype)
    rtol, atol = TOL[dtype]
    model = node_model(op, {"x": x}, opset=opset, **attrs)
    check_decomposition(model, {"x": x}, rtol=rtol, atol=atol)


def test_softmax_primitives():
    x = data((2, 3, 5), "float32", 0)
    graph = check_decomposition(node_model("Softmax", {"x": x}, axis=1), {"x": x})
    assert Counter(n.op.value for n in graph.nodes) == Counter(
        {"reduce_max": 1, "sub": 1, "exp": 1, "sum": 1, "div": 1}
    )
    (rmax,) = [n for n in graph.nodes if n.op.value == "reduce_max"]
    assert rmax.attrs["axes"] == (1,)


def test_softmax_opset11_flattens_trailing_axes():
    x = data((2, 3, 5), "float32", 0)
    graph = check_decomposition(node_model("Softmax", {"x": x}, opset=11, axis=1), {"x": x})
    sums = [n for n in graph.nodes if n.op.value == "sum"]
    assert [n.attrs["axes"] for n in sums] == [(1, 2)]
    assert not any(n.op.value == "reshape" for n in graph.nodes)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_does_not_overflow(op):
    x = np.array([[1000.0, 999.0, -1000.0], [3e4, 3e4, 3e4], [-3e4, 0.0, -1e3]], np.float32)
    z = x.astype(np.float64) - x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1, keepdims=True))
    want = np.exp(z - lse) if op == "Softmax" else z - lse
    model = node_model(op, {"x": x})
    graph = check_decomposition(model, {"x": x}, expected={"y0": want.astype(np.float32)})
    got = reference.run(graph, {"x": x})["y0"]
    assert np.isfinite(got).all()


def test_hardmax_is_one_hot_of_first_maximum():
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, 0, 0, 5]], np.float32)
    want = np.array([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]], np.float32)
    graph = check_decomposition(node_model("Hardmax", {"x": x}), {"x": x}, expected={"y0": want})
    assert {n.op.value for n in graph.nodes} == {"argmax", "eq", "cast"}


def test_softmax_agrees_with_onnxruntime_on_float16_exactly_enough():
    x = (np.random.default_rng(3).standard_normal((4, 33)) * 4).astype(np.float16)
    model = node_model("Softmax", {"x": x})
    graph = fission(prepare(model, {"x": x.shape}))
    got = reference.run(graph, {"x": x})["y0"].astype(np.float64)
    want = onnxrt.run(model, {"x": x})["y0"].astype(np.float64)
    assert np.max(np.abs(got - want)) < 2e-3


@pytest.mark.parametrize("dtype", ["float32", "int64"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(dtype, axis, exclusive, reverse):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 5, 4)) * 5).astype(dtype)
    m = node_model(
        "CumSum",
        {"x": x},
        constants={"axis": np.array(axis, np.int64)},
        exclusive=exclusive,
        reverse=reverse,
    )
    check_decomposition(m, {"x": x})
