"""The conv generator (implicit GEMM) against the reference executor, in the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchestrate.ir import type_rules
from orchestrate.kernels import config
from orchestrate.kernels.spec import CONV, KernelSpec
from tests import graphs
from tests.emit_util import (
    assert_matches_reference,
    one_kernel,
    one_source,
    plan_from_sets,
    spec_of,
)


@pytest.fixture
def small_tiles(monkeypatch):
    """Interpreter tiles of 16: several row and column tiles and K steps."""
    monkeypatch.setattr(config, "CONV_INTERPRET_BLOCK_M", 16)
    monkeypatch.setattr(config, "CONV_INTERPRET_BLOCK", 16)


def out_shape(x, w, strides, pads, dilations):
    n = len(x) - 2
    spatial = tuple(
        type_rules.window_out(x[2 + i], w[2 + i], strides[i], pads[i] + pads[i + n], dilations[i])
        for i in range(n)
    )
    return (x[0], w[0]) + spatial


def conv_graph(
    x, w, *, strides=None, pads=None, dilations=None, group=1, epilogue="none", dtype="float32"
):
    """conv(x, w) followed by an epilogue: none, bias+relu+residual (two outputs)
    or a folded batch norm (constant scale and shift per channel)."""
    n = len(x) - 2
    strides = strides or (1,) * n
    pads = pads or (0,) * (2 * n)
    dilations = dilations or (1,) * n
    y_shape = out_shape(x, w, strides, pads, dilations)
    channels = (w[0],) + (1,) * n

    def fn(b, xv, wv, *rest):
        y = b.conv(xv, wv, strides=strides, pads=pads, dilations=dilations, group=group)
        if epilogue == "none":
            return y
        if epilogue == "bias_relu_residual":
            bias, res = rest
            h = b.add(y, bias)
            return h, b.add(b.relu(h), res)
        rng = np.random.default_rng(7)
        scale = b.constant(rng.uniform(0.5, 1.5, channels).astype(dtype))
        shift = b.constant(rng.standard_normal(channels).astype(dtype))
        return b.max(b.add(b.mul(y, scale), shift), 0.0)

    shapes = [x, w]
    if epilogue == "bias_relu_residual":
        shapes += [channels, y_shape]
    return graphs.build(fn, shapes, dtype=dtype)


def check(g, rtol=1e-5, atol=1e-5, seed=0):
    k = spec_of(g, [n.name for n in g.nodes])
    assert isinstance(k, KernelSpec) and k.template == CONV, k
    return assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g, seed), rtol, atol)


@pytest.mark.parametrize("ksize", [1, 3, 5])
@pytest.mark.parametrize("group", [1, 2, 6])  # 6: depthwise
def test_2d_kernel_sizes_and_groups(ksize, group):
    g = conv_graph((2, 6, 9, 8), (6, 6 // group, ksize, ksize), pads=(ksize // 2,) * 4, group=group)
    check(g)


def test_depthwise_channel_multiplier():
    """group = C with two output channels per input channel."""
    check(conv_graph((1, 3, 7, 7), (6, 1, 3, 3), pads=(1, 1, 1, 1), group=3))


def test_strides_asymmetric_pads_dilation_epilogue():
    g = conv_graph(
        (2, 4, 11, 10),
        (6, 2, 3, 3),
        strides=(2, 1),
        pads=(1, 0, 2, 1),
        dilations=(1, 2),
        group=2,
        epilogue="bias_relu_residual",
    )
    src = check(g)
    assert src.count("tl.store(") == 2


def test_many_tiles_and_k_steps(small_tiles):
    """GEMM [2*9*9 = 162, 4*9 = 36] @ [36, 20]: 11 x 2 tiles, 3 K steps."""
    g = conv_graph((2, 4, 9, 9), (20, 4, 3, 3), pads=(1, 1, 1, 1), epilogue="folded_bn")
    src = check(g)
    assert "BLOCK_M = 16" in src


@pytest.mark.parametrize(
    "x, w, strides, pads, dilations, group",
    [
        ((2, 3, 17), (4, 3, 3), (1,), (1, 1), (1,), 1),
        ((1, 4, 20), (4, 1, 5), (3,), (0, 2), (2,), 4),  # depthwise, strided, dilated
        ((3, 2, 6), (5, 2, 1), (2,), (0, 0), (1,), 1),  # pointwise
    ],
)
def test_1d(x, w, strides, pads, dilations, group):
    check(
        conv_graph(
            x,
            w,
            strides=strides,
            pads=pads,
            dilations=dilations,
            group=group,
            epilogue="bias_relu_residual",
        )
    )


def test_3d():
    check(
        conv_graph(
            (1, 2, 5, 6, 4),
            (3, 2, 3, 2, 3),
            strides=(1, 2, 1),
            pads=(1, 0, 1, 1, 1, 0),
            dilations=(2, 1, 1),
        )
    )


def test_axis_of_only_padding():
    """A 1-pixel axis with a begin pad and stride 2: every tap is padding, y = 0."""
    check(conv_graph((1, 2, 1, 5), (3, 2, 1, 3), strides=(2, 1), pads=(1, 1, 0, 1)))


@settings(max_examples=8, deadline=None)
@given(
    size=st.integers(1, 9),
    ksize=st.sampled_from([1, 2, 3]),
    stride=st.integers(1, 3),
    pad0=st.integers(0, 2),
    pad1=st.integers(0, 2),
    dilation=st.integers(1, 2),
    batch=st.integers(1, 3),
    seed=st.integers(0, 99),
)
def test_random_geometry(size, ksize, stride, pad0, pad1, dilation, batch, seed):
    assume(size + pad0 + pad1 >= (ksize - 1) * dilation + 1)
    g = conv_graph(
        (batch, 3, size, size + 1),
        (4, 3, ksize, ksize),
        strides=(stride, 1),
        pads=(pad0, pad1, pad1, pad0),
        dilations=(dilation, 1),
    )
    check(g, seed=seed)


def test_fp16():
    g = conv_graph(
        (2, 4, 8, 8),
        (8, 2, 3, 3),
        pads=(1, 1, 1, 1),
        group=2,
        epilogue="bias_relu_residual",
        dtype="float16",
    )
    check(g, rtol=5e-3, atol=5e-3)


def test_epilogue_in_its_own_kernel():
    """conv alone, then the bias and relu as a pointwise kernel."""
    g = conv_graph((1, 3, 6, 6), (4, 3, 3, 3), pads=(1, 1, 1, 1), epilogue="bias_relu_residual")
    conv_node, *rest = (n.name for n in g.nodes)
    plan = plan_from_sets(g, [[conv_node], rest])
    assert_matches_reference(g, plan, graphs.random_inputs(g), atol=1e-5)


def test_no_padding_masks_without_padding():
    """Windows that never leave the input get no bounds checks."""
    g = conv_graph((1, 2, 6, 6), (2, 2, 3, 3), strides=(1, 1), pads=(0, 0, 0, 0))
    src = check(g)
    assert ">= 0)" not in src and "< 6)" not in src


def test_large_tensors_use_64_bit_offsets():
    """Emission only: an input of 2**31 elements switches offsets to int64."""
    g = conv_graph((1, 2, 2**15, 2**15), (1, 2, 1, 1))
    src = one_source(g)
    assert "rm = pid_m.to(tl.int64) * BLOCK_M" in src
