"""The window (pooling) generator against the reference executor, in the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrate.decompose import fission
from orchestrate.frontend import prepare
from orchestrate.ir import Op
from orchestrate.kernels.spec import WINDOW, Rejection
from orchestrate.plan.planner import PlanOptions, plan
from orchestrate.templates.window import emit as window_module
from tests import graphs
from tests.emit_util import assert_matches_reference, one_kernel, plan_from_sets, spec_of
from tests.util import node_model

# the interpreter evaluates the prologue at padding taps too (masked loads
# give 0, e.g. log(|0|) in a power) before those taps are replaced
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


def pool(b, x, kind, kernel, strides=None, pads=None, dilations=None):
    n = len(kernel)
    return b.pool(
        x,
        kind,
        kernel=kernel,
        strides=strides or (1,) * n,
        pads=pads or (0,) * (2 * n),
        dilations=dilations or (1,) * n,
    )


def check(g, inputs=None, rtol=1e-5, atol=1e-6) -> str:
    p = one_kernel(g)
    assert [k.template for k in p.plan.kernels] == [WINDOW]
    return assert_matches_reference(g, p, inputs or graphs.random_inputs(g, 3), rtol, atol)


# -- geometry ------------------------------------------------------------------------------


@st.composite
def geometry(draw, spatial):
    kernel = draw(st.lists(st.sampled_from([1, 2, 3, 5]), min_size=spatial, max_size=spatial))
    strides = draw(st.lists(st.sampled_from([1, 2, 3]), min_size=spatial, max_size=spatial))
    dil = draw(st.lists(st.sampled_from([1, 2]), min_size=spatial, max_size=spatial))
    pads = [draw(st.integers(0, k - 1)) for k in kernel * 2]  # asymmetric in general
    sizes = [
        draw(st.integers(max(1, (k - 1) * d + 1 - p - q), 11))
        for k, d, p, q in zip(kernel, dil, pads[:spatial], pads[spatial:])
    ]
    channels = draw(st.sampled_from([1, 3, 5]))
    return (draw(st.sampled_from([1, 2])), channels, *sizes), kernel, strides, pads, dil


@settings(max_examples=10, deadline=None)
@given(kind=st.sampled_from(["max", "avg"]), geo=geometry(2), seed=st.integers(0, 99))
def test_2d_pools(kind, geo, seed):
    shape, kernel, strides, pads, dil = geo
    g = graphs.build(lambda b, x: pool(b, x, kind, kernel, strides, pads, dil), [shape])
    check(g, graphs.random_inputs(g, seed))


@settings(max_examples=8, deadline=None)
@given(kind=st.sampled_from(["max", "avg"]), geo=geometry(1), seed=st.integers(0, 99))
def test_1d_pools(kind, geo, seed):
    shape, kernel, strides, pads, dil = geo
    g = graphs.build(lambda b, x: pool(b, x, kind, kernel, strides, pads, dil), [shape])
    check(g, graphs.random_inputs(g, seed))


@pytest.mark.parametrize(
    "kind, kernel, strides, pads, dil",
    [
        ("max", (1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),  # a copy
        ("avg", (2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),
        ("max", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
        ("avg", (3, 2), (3, 1), (2, 0, 0, 1), (1, 2)),  # asymmetric pads, dilation on one axis
        ("max", (5, 5), (1, 2), (4, 0, 1, 3), (2, 1)),
        ("avg", (5, 3), (2, 3), (1, 2, 3, 0), (2, 2)),
    ],
)
def test_2d_cases(kind, kernel, strides, pads, dil):
    g = graphs.build(lambda b, x: pool(b, x, kind, kernel, strides, pads, dil), [(2, 3, 11, 7)])
    check(g)


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_3d_pool(kind):
    def fn(b, x):
        return pool(b, x, kind, (3, 2, 3), (2, 1, 2), (1, 0, 1, 1, 1, 0), (1, 2, 1))

    check(graphs.build(fn, [(1, 3, 5, 6, 7)]))


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_large_window_loops_at_runtime(kind, monkeypatch):
    # 9x9 = 81 taps is above UNROLL_LIMIT: runtime loops
    g = graphs.build(lambda b, x: pool(b, x, kind, (9, 9), (2, 3), (4, 4, 0, 4)), [(1, 2, 13, 10)])
    src = check(g)
    assert "in range(9)" in src and "static_range" not in src
    # and any window through the runtime path
    monkeypatch.setattr(window_module, "UNROLL_LIMIT", 0)
    g = graphs.build(
        lambda b, x: pool(b, x, kind, (3, 1, 2), (1, 2, 1), (1, 0, 0, 1, 0, 1), (2, 1, 1)),
        [(2, 3, 6, 5, 4)],
    )
    assert "in range(3)" in check(g)


def test_size_one_everything():
    g = graphs.build(lambda b, x: pool(b, x, "avg", (1, 1)), [(1, 1, 1, 1)])
    check(g)
    g = graphs.build(lambda b, x: pool(b, x, "max", (3,), (1,), (1, 1)), [(1, 1, 1)])
    check(g)


# -- NaN ---------------------------------------------------------------------------------


def test_max_propagates_nan_as_numpy():
    g = graphs.build(lambda b, x: pool(b, x, "max", (3, 3), (2, 2), (1, 1, 1, 1)), [(1, 2, 7, 7)])
    x = graphs.random_inputs(g, 5)["x0"]
    x[0, 0, 0, 0] = np.nan  # a corner: windows that also cover padding
    x[0, 0, 4, 3] = np.nan  # inside: read by several overlapping windows
    x[0, 1, 6, 6] = np.nan
    x[0, 1, 2, :] = -np.inf
    check(g, {"x0": x})


def test_avg_propagates_nan_and_inf():
    g = graphs.build(lambda b, x: pool(b, x, "avg", (2, 2), (1, 1), (1, 0, 0, 1)), [(1, 1, 5, 5)])
    x = graphs.random_inputs(g, 5)["x0"]
    x[0, 0, 1, 1] = np.nan
    x[0, 0, 3, 3] = np.inf
    check(g, {"x0": x})


# -- prologue and epilogue -----------------------------------------------------------------


def test_relu_prologue_with_padding_neutral_after_it():
    # relu(0) = 0 would beat an all-negative window if the prologue were
    # applied to the padding value: padding must stay -inf
    def fn(b, x):
        return pool(b, b.relu(b.sub(x, 10.0)), "max", (3, 3), (1, 1), (2, 2, 2, 2))

    check(graphs.build(fn, [(2, 3, 5, 6)]))


def test_prologue_that_changes_the_padding_value():
    # exp(0) = 1 != 0: padded taps of an average must add 0, not exp(0)
    def fn(b, x):
        return pool(b, b.exp(x), "avg", (3, 3), (2, 2), (1, 2, 2, 1))

    check(graphs.build(fn, [(1, 3, 6, 7)]))


def test_lp_pool_shape():
    # |x|^3 prologue, avg pool, * volume and ^(1/3) epilogue (LpPool, p=3)
    def fn(b, x):
        s = pool(b, b.pow(b.abs(x), 3.0), "avg", (2, 3), (2, 1), (0, 1, 1, 1))
        return b.pow(b.mul(s, 6.0), 1.0 / 3.0)

    check(graphs.build(fn, [(2, 5, 7, 6)]), rtol=1e-4, atol=1e-5)


def test_correction_tensor_and_sqrt_epilogue():
    # the AveragePool count_include_pad=0 pattern: * constant (1, 1, OH, OW)
    fix = (1.0 + np.arange(12, dtype=np.float32) / 7).reshape(1, 1, 3, 4)

    def fn(b, x):
        y = b.mul(pool(b, b.mul(x, x), "avg", (3, 3), (2, 2), (1, 1, 1, 1)), b.constant(fix))
        return b.sqrt(y)

    check(graphs.build(fn, [(2, 3, 6, 7)]))


@pytest.mark.parametrize(
    "shape", [(4, 1, 1), (1, 1, 3, 1), (1, 1, 1, 4), (2, 1, 1, 1), (2, 4, 3, 4), (1,), ()]
)
def test_epilogue_broadcasts_in_every_position(shape):
    def fn(b, x, y):
        return b.add(b.tanh(pool(b, x, "max", (2, 3), (2, 2), (0, 1, 1, 1))), y)

    check(graphs.build(fn, [(2, 4, 6, 7), shape]))


def test_layout_prologue_and_constant_pad():
    # NHWC input transposed to NCHW, padded with -inf beyond the kernel (the
    # ceil_mode decomposition), then a max pool
    def fn(b, x):
        t = b.transpose(x, (0, 3, 1, 2))
        p = b.pad(t, (0, 0, 0, 0, 0, 0, 3, 2), value=float("-inf"))
        return pool(b, p, "max", (2, 2), (2, 3))

    check(graphs.build(fn, [(2, 5, 4, 3)]))


def test_reshaped_input_and_a_prologue_dag():
    # (N, C*H*W) viewed as (N, C, H, W); two branches of the prologue meet
    def fn(b, x):
        r = b.reshape(x, (2, 3, 5, 6))
        return pool(b, b.add(b.exp(r), b.relu(r)), "avg", (3, 2), (2, 2), (1, 1, 1, 0))

    check(graphs.build(fn, [(2, 90)]))


def test_two_epilogue_outputs():
    def fn(b, x):
        p = pool(b, x, "max", (2, 3), (1, 2), (1, 0, 0, 2))
        return b.relu(p), b.mul(b.neg(p), 2.0)

    check(graphs.build(fn, [(2, 3, 5, 6)]))


def test_prologue_reads_a_broadcast_tensor():
    def fn(b, x, scale):
        return pool(b, b.mul(x, scale), "avg", (2, 2), (1, 2), (1, 0, 1, 1))

    check(graphs.build(fn, [(2, 3, 5, 5), (3, 1, 1)]))


def test_writes_the_pool_and_its_epilogue():
    # the pool value is also read by a second kernel: it is an optional output
    def fn(b, x):
        p = pool(b, x, "max", (2, 2), (2, 2))
        return b.sigmoid(p), b.neg(p)

    g = graphs.build(fn, [(1, 3, 6, 6)])
    pool_node = next(n.name for n in g.nodes if n.op is Op.POOL)
    sig = next(n.name for n in g.nodes if n.op is Op.SIGMOID)
    neg = next(n.name for n in g.nodes if n.op is Op.NEG)
    p = plan_from_sets(g, [[pool_node, sig], [neg]])
    assert p.plan.kernels[0].outputs == (sig, pool_node)
    assert_matches_reference(g, p, graphs.random_inputs(g))


def test_float16():
    def fn(b, x):
        return b.mul(pool(b, x, "avg", (3, 3), (2, 2), (1, 1, 1, 1)), 2.0)

    g = graphs.build(fn, [(1, 3, 7, 6)], dtype="float16")
    check(g, rtol=2e-3, atol=2e-3)
    g = graphs.build(lambda b, x: pool(b, x, "max", (2, 2)), [(1, 3, 5, 5)], dtype="float16")
    check(g, rtol=0, atol=0)


def test_the_rule_refuses_pools_of_four_spatial_dims():
    g = graphs.build(lambda b, x: pool(b, x, "max", (2, 2, 2, 2)), [(1, 1, 3, 3, 3, 3)])
    r = spec_of(g, [g.nodes[0].name])
    assert isinstance(r, Rejection) and "4-D pooling" in r.reason, r


# -- ONNX pools end to end: prepare, fission, plan, emit --------------------------------------


@pytest.mark.parametrize(
    "op, attrs",
    [
        ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
        ("MaxPool", dict(kernel_shape=[2, 2], strides=[3, 3], dilations=[3, 2], ceil_mode=1)),
        (
            "AveragePool",
            dict(
                kernel_shape=[3, 3],
                strides=[2, 2],
                pads=[1, 1, 1, 1],
                ceil_mode=1,
                count_include_pad=0,
            ),
        ),
        ("AveragePool", dict(kernel_shape=[2, 3], strides=[1, 2], pads=[1, 0, 0, 2])),
        ("LpPool", dict(kernel_shape=[2, 2], strides=[2, 1], pads=[1, 1, 0, 1], p=2)),
        ("LpPool", dict(kernel_shape=[3], strides=[2], p=3)),
    ],
)
def test_onnx_pools(op, attrs):
    n = len(attrs["kernel_shape"])
    shape = (2, 3, 7, 6)[: 2 + n]
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    g = fission(prepare(node_model(op, {"x": x}, **attrs), {"x": shape}))
    p = plan(g, PlanOptions(reproducible=True))
    assert WINDOW in [k.template for k in p.plan.kernels]
    src = assert_matches_reference(g, p, {"x": x}, rtol=1e-4, atol=1e-5)
    assert "static_range" in src
    if op == "LpPool":  # |x|^p before the pool, root after it: one kernel
        windows = [k for k in p.plan.kernels if k.template == WINDOW]
        ops = {g.producer[t].op for k in windows for t in k.primitives}
        assert Op.POOL in ops and len(ops) > 1


def test_onnx_int8_max_pool():
    # cast to float32 as the prologue, cast back as the epilogue
    x = np.random.default_rng(9).integers(-100, 100, (1, 3, 5, 6)).astype(np.int8)
    model = node_model("MaxPool", {"x": x}, kernel_shape=[2, 3], pads=[1, 1, 0, 1], opset=12)
    g = fission(prepare(model, {"x": x.shape}))
    p = plan(g, PlanOptions(reproducible=True))
    assert [k.template for k in p.plan.kernels] == [WINDOW]
    assert_matches_reference(g, p, {"x": x})


def test_onnx_pool_feeds_the_next_layer():
    # relu -> maxpool -> averagepool: the planner decides what fuses where
    x = np.random.default_rng(8).standard_normal((1, 4, 9, 9)).astype(np.float32)
    import onnx
    from onnx import helper

    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node(
            "MaxPool", ["r"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        ),
        helper.make_node("AveragePool", ["m"], ["y"], kernel_shape=[2, 2], ceil_mode=1),
    ]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "pools",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        ),
        opset_imports=[helper.make_opsetid("", 20)],
    )
    model.ir_version = 9
    g = fission(prepare(model, {"x": x.shape}))
    p = plan(g, PlanOptions(reproducible=True))
    assert [k.template for k in p.plan.kernels].count(WINDOW) == 2
    assert_matches_reference(g, p, {"x": x}, rtol=1e-5, atol=1e-6)
