"""Convolution and pooling fission against onnxruntime (and the ONNX reference
where onnxruntime departs from the spec)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchestrate.decompose import fission
from orchestrate.errors import UnsupportedError
from orchestrate.frontend import onnxrt, prepare
from orchestrate.ir import Op, reference
from tests.util import check_decomposition, node_model

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SEEDS = st.integers(0, 2**31 - 1)
TOL = {"float16": (1e-2, 1e-2), "float32": (1e-4, 1e-5)}
# onnxruntime has no float64 Conv / AveragePool kernels, so float32 and float16
DTYPES = st.sampled_from(["float32", "float32", "float16"])


def rand(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def primitive_ops(model, feeds) -> Counter:
    graph = fission(prepare(model, {k: v.shape for k, v in feeds.items()}))
    return Counter(n.op for n in graph.nodes)


def same_total(size, k, s, d):
    return (-(-size // s) - 1) * s + (k - 1) * d + 1 - size


def explicit_pads(attrs, sizes):
    """``attrs`` with SAME auto_pad replaced by the pads the spec gives it
    (``(out - 1) * stride + dilated kernel - size``, none when negative)."""
    n = len(sizes)
    kernel = attrs.get("kernel_shape") or attrs["_kernel"]
    dil = attrs.get("dilations", [1] * n)
    totals = [max(0, same_total(*g)) for g in zip(sizes, kernel, attrs["strides"], dil)]
    if attrs["auto_pad"] == "SAME_UPPER":
        begins = [t // 2 for t in totals]
    else:
        begins = [t - t // 2 for t in totals]
    out = {k: v for k, v in attrs.items() if k not in ("auto_pad", "_kernel")}
    return {**out, "pads": begins + [t - b for t, b in zip(totals, begins)]}


def needs_explicit(attrs, sizes, kernel, lowest):
    """Whether onnxruntime departs from the spec for this SAME geometry: it
    pads for the undilated kernel (pools) or refuses dilation (Conv), and a
    stride past the kernel (total pad below ``lowest``) is refused or erratic."""
    if not attrs.get("auto_pad", "").startswith("SAME"):
        return False
    dil = attrs.get("dilations", [1] * len(sizes))
    geometry = zip(sizes, kernel, attrs["strides"], dil)
    return max(dil) > 1 or min(same_total(*g) for g in geometry) < lowest


# -- Conv -------------------------------------------------------------------------------


@st.composite
def conv_cases(draw):
    n = draw(st.integers(1, 3))
    kernel = draw(st.lists(st.sampled_from([1, 2, 3]), min_size=n, max_size=n))
    strides = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    dil = draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    pads = draw(st.lists(st.integers(0, 2), min_size=2 * n, max_size=2 * n))
    # every spatial size at least the dilated kernel
    sizes = [draw(st.integers((k - 1) * d + 1, 7)) for k, d in zip(kernel, dil)]
    group, cin_g, cout_g = draw(st.sampled_from([(1, 3, 2), (2, 1, 3), (3, 1, 1), (2, 2, 1)]))
    batch = draw(st.sampled_from([1, 2]))
    return dict(
        n=n,
        kernel=kernel,
        strides=strides,
        dil=dil,
        auto_pad=auto_pad,
        pads=pads,
        sizes=sizes,
        group=group,
        cin_g=cin_g,
        cout_g=cout_g,
        batch=batch,
        bias=draw(st.booleans()),
        const_w=draw(st.booleans()),
        dtype=draw(DTYPES),
        seed=draw(SEEDS),
    )


@SETTINGS
@given(conv_cases())
def test_conv(c):
    dtype, seed = c["dtype"], c["seed"]
    x = rand([c["batch"], c["group"] * c["cin_g"]] + c["sizes"], dtype, seed)
    w = rand([c["group"] * c["cout_g"], c["cin_g"]] + c["kernel"], dtype, seed + 1)
    attrs = dict(strides=c["strides"], dilations=c["dil"], group=c["group"])
    if c["auto_pad"] == "NOTSET":
        attrs["pads"] = c["pads"]
    else:
        attrs["auto_pad"] = c["auto_pad"]
    inputs, consts = {"x": x}, {}
    (consts if c["const_w"] else inputs)["w"] = w
    if c["bias"]:
        consts["B"] = rand([w.shape[0]], dtype, seed + 2)
    model = node_model(
        "Conv", inputs, constants=consts, input_order=list(inputs) + list(consts), **attrs
    )
    expected = None
    if needs_explicit(attrs, c["sizes"], c["kernel"], lowest=-1):
        explicit = explicit_pads({**attrs, "_kernel": c["kernel"]}, c["sizes"])
        model2 = node_model(
            "Conv", inputs, constants=consts, input_order=list(inputs) + list(consts), **explicit
        )
        expected = onnxrt.run(model2, inputs)
    rtol, atol = TOL[dtype]
    check_decomposition(model, inputs, rtol=rtol, atol=atol * 10, expected=expected)


def test_conv_bias_is_a_reshaped_add():
    x = rand((1, 4, 6, 6), "float32", 0)
    consts = {"w": rand((8, 4, 3, 3), "float32", 1), "B": rand((8,), "float32", 2)}
    model = node_model("Conv", {"x": x}, constants=consts, pads=[1, 1, 1, 1])
    check_decomposition(model, {"x": x}, rtol=1e-4, atol=1e-5)
    assert primitive_ops(model, {"x": x}) == Counter({Op.CONV: 1, Op.ADD: 1})


def test_depthwise_conv():
    x = rand((2, 6, 7, 5), "float32", 3)
    w = rand((12, 1, 3, 3), "float32", 4)
    model = node_model(
        "Conv", {"x": x}, constants={"w": w}, group=6, strides=[2, 1], auto_pad="SAME_UPPER"
    )
    check_decomposition(model, {"x": x}, rtol=1e-4, atol=1e-5)


def test_conv_kernel_shape_must_match_the_weight():
    x = rand((1, 2, 5, 5), "float32", 0)
    w = rand((2, 2, 3, 3), "float32", 1)
    model = node_model("Conv", {"x": x}, constants={"w": w}, kernel_shape=[3, 3])
    check_decomposition(model, {"x": x}, rtol=1e-4, atol=1e-5)
    model.graph.node[0].attribute[0].ints[:] = [2, 2]
    with pytest.raises(UnsupportedError, match="kernel_shape"):
        fission(model)


# -- ConvTranspose ---------------------------------------------------------------------------


@st.composite
def conv_transpose_cases(draw):
    n = draw(st.integers(1, 3))
    kernel = draw(st.lists(st.sampled_from([1, 2, 3]), min_size=n, max_size=n))
    strides = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    dil = draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    # onnxruntime wants output_padding below the stride
    adj = [draw(st.integers(0, s - 1)) for s in strides]
    sizes = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    form = draw(st.sampled_from(["pads", "pads", "SAME_UPPER", "SAME_LOWER", "VALID", "shape"]))
    pads = []
    for k, d in zip(kernel, dil):  # pads must leave at least one output
        pads.append(draw(st.integers(0, ((k - 1) * d) // 2)))
    pads += [draw(st.integers(0, p)) for p in pads]
    full = [
        (i - 1) * s + a + (k - 1) * d + 1 for i, s, a, k, d in zip(sizes, strides, adj, kernel, dil)
    ]
    out_shape = [draw(st.integers(max(1, f - 2), f)) for f in full]
    group, cin_g, cout_g = draw(st.sampled_from([(1, 2, 3), (2, 1, 2), (3, 1, 1)]))
    return dict(
        n=n,
        kernel=kernel,
        strides=strides,
        dil=dil,
        adj=adj,
        sizes=sizes,
        form=form,
        pads=pads,
        out_shape=out_shape,
        group=group,
        cin_g=cin_g,
        cout_g=cout_g,
        bias=draw(st.booleans()),
        const_w=draw(st.booleans()),
        dtype=draw(DTYPES),
        seed=draw(SEEDS),
    )


@SETTINGS
@given(conv_transpose_cases())
def test_conv_transpose(c):
    dtype, seed = c["dtype"], c["seed"]
    x = rand([2, c["group"] * c["cin_g"]] + c["sizes"], dtype, seed)
    w = rand([c["group"] * c["cin_g"], c["cout_g"]] + c["kernel"], dtype, seed + 1)
    attrs = dict(strides=c["strides"], dilations=c["dil"], group=c["group"])
    if any(c["adj"]):
        attrs["output_padding"] = c["adj"]
    if c["form"] == "pads":
        attrs["pads"] = c["pads"]
    elif c["form"] == "shape":
        attrs["output_shape"] = c["out_shape"]
    else:
        attrs["auto_pad"] = c["form"]
    inputs, consts = {"x": x}, {}
    (consts if c["const_w"] else inputs)["w"] = w
    if c["bias"]:
        consts["B"] = rand([w.shape[1] * c["group"]], dtype, seed + 2)
    model = node_model(
        "ConvTranspose", inputs, constants=consts, input_order=list(inputs) + list(consts), **attrs
    )
    rtol, atol = TOL[dtype]
    check_decomposition(model, inputs, rtol=rtol, atol=atol * 10)


def test_conv_transpose_is_one_conv_per_output_phase_without_inserted_zeros():
    """Strides 2 x 3: six phases, each a conv of the input itself (nothing
    pads or reshapes it) with the taps that reach that phase, so the
    multiply-adds are those of the transposed conv, not of a conv over an
    input six times larger and mostly zero."""
    x = rand((1, 2, 4, 3), "float32", 0)
    w = rand((2, 3, 3, 3), "float32", 1)
    model = node_model(
        "ConvTranspose",
        {"x": x},
        constants={"w": w},
        strides=[2, 3],
        pads=[1, 0, 1, 1],
        output_padding=[1, 2],
    )
    check_decomposition(model, {"x": x}, rtol=1e-4, atol=1e-5)
    g = fission(prepare(model, {"x": x.shape}))
    convs = [n for n in g.nodes if n.op is Op.CONV]
    assert len(convs) == 6 and all(n.inputs[0] == "x" for n in convs)
    macs = sum(n.type.size * math.prod(g.types[n.inputs[1]].shape[1:]) for n in convs)
    # every (output, tap, input channel) a zero-inserted conv would multiply
    out = g.types[g.outputs[0]].shape
    assert macs <= math.prod(out) * 2 * 9 / 4


# -- pooling -------------------------------------------------------------------------------


@st.composite
def pool_cases(draw, op):
    n = draw(st.integers(1, 3))
    kernel = draw(st.lists(st.sampled_from([1, 2, 3]), min_size=n, max_size=n))
    strides = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    dil = draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    pads = [draw(st.integers(0, k - 1)) for k in kernel * 2]  # onnxruntime: pads < kernel
    sizes = [draw(st.integers((k - 1) * d + 1, 7)) for k, d in zip(kernel, dil)]
    ceil = draw(st.booleans()) if auto_pad in ("NOTSET", "VALID") else False
    attrs = dict(kernel_shape=kernel, strides=strides)
    if max(dil) > 1:
        attrs["dilations"] = dil
    if auto_pad == "NOTSET":
        attrs["pads"] = pads
    else:
        attrs["auto_pad"] = auto_pad
    if ceil:
        attrs["ceil_mode"] = 1
    if op == "AveragePool":
        attrs["count_include_pad"] = draw(st.sampled_from([0, 1]))
    if op == "LpPool":
        attrs["p"] = draw(st.sampled_from([1, 2, 3]))
    shape = [draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 3]))] + sizes
    return shape, attrs, draw(DTYPES), draw(SEEDS)


def check_pool(op, shape, attrs, dtype, seed):
    x = rand(shape, dtype, seed)
    model = node_model(op, {"x": x}, **attrs)
    expected = None
    if needs_explicit(attrs, shape[2:], attrs["kernel_shape"], lowest=0):
        explicit = explicit_pads(attrs, shape[2:])
        # onnxruntime refuses pads that are not below the kernel
        assume(all(p < k for p, k in zip(explicit["pads"], attrs["kernel_shape"] * 2)))
        expected = onnxrt.run(node_model(op, {"x": x}, **explicit), {"x": x})
    graph = fission(prepare(model, {"x": x.shape}))
    pre_padded = any(n.op is Op.PAD for n in graph.nodes)
    rtol, atol = TOL[dtype]
    if pre_padded and op != "MaxPool":
        # onnxruntime fuses a zero Pad into the following AveragePool and then
        # refuses the pads it made; compare the reference executor alone
        want = expected or onnxrt.run(model, {"x": x})
        got = reference.run(graph, {"x": x})
        np.testing.assert_allclose(got["y0"], want["y0"], rtol=rtol, atol=atol)
        return
    check_decomposition(model, {"x": x}, rtol=rtol, atol=atol, expected=expected)


@SETTINGS
@given(pool_cases("MaxPool"))
def test_max_pool(case):
    check_pool("MaxPool", *case)


@SETTINGS
@given(pool_cases("AveragePool"))
def test_average_pool(case):
    check_pool("AveragePool", *case)


@SETTINGS
@given(pool_cases("LpPool"))
def test_lp_pool(case):
    check_pool("LpPool", *case)


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_ceil_mode_corrects_the_divisor(count_include_pad):
    # the torch nn.AvgPool2d(3, 2, padding=1, ceil_mode=True) pattern
    attrs = dict(
        kernel_shape=[3, 3],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
        ceil_mode=1,
        count_include_pad=count_include_pad,
    )
    x = rand((1, 2, 6, 7), "float32", 5)
    model = node_model("AveragePool", {"x": x}, **attrs)
    check_decomposition(model, {"x": x}, rtol=1e-5, atol=1e-6)
    assert primitive_ops(model, {"x": x}) == Counter({Op.POOL: 1, Op.MUL: 1})


def test_dilated_ceil_mode_pool_pads_beyond_the_kernel():
    # the ceil_mode window runs 2 past the end: more than the kernel of 2
    x = rand((1, 2, 5, 8), "float32", 6)
    for op, extra in (
        ("MaxPool", {}),
        ("AveragePool", {"count_include_pad": 1}),
        ("AveragePool", {}),
        ("LpPool", {"p": 2}),
    ):
        attrs = dict(kernel_shape=[2, 2], strides=[3, 3], dilations=[3, 2], ceil_mode=1)
        check_pool(op, x.shape, {**attrs, **extra}, "float32", 6)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_max_pool_8_bit_integers(dtype):
    x = np.random.default_rng(0).integers(0, 100, (1, 2, 5, 5)).astype(dtype)
    model = node_model("MaxPool", {"x": x}, kernel_shape=[2, 2], pads=[1, 1, 0, 0], opset=12)
    check_decomposition(model, {"x": x})


def test_max_pool_indices_are_declined():
    x = rand((1, 1, 4, 4), "float32", 0)
    model = node_model("MaxPool", {"x": x}, n_outputs=2, kernel_shape=[2, 2])
    with pytest.raises(UnsupportedError, match="output 1"):
        fission(prepare(model))


@SETTINGS
@given(
    op=st.sampled_from(["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"]),
    shape=st.lists(st.sampled_from([1, 2, 3, 5, 7]), min_size=3, max_size=5),
    p=st.sampled_from([1, 2, 3]),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_global_pools(op, shape, p, dtype, seed):
    x = rand(shape, dtype, seed)
    attrs = {"p": p} if op == "GlobalLpPool" else {}
    model = node_model(op, {"x": x}, **attrs)
    rtol, atol = TOL[dtype]
    check_decomposition(model, {"x": x}, rtol=rtol, atol=atol)
    ops = set(primitive_ops(model, {"x": x}))
    assert Op.POOL not in ops  # global pools are plain reductions


# -- what torch exports ---------------------------------------------------------------------


def test_torch_cnn_export():
    torch = pytest.importorskip("torch")
    import io

    import onnx

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
            self.dw = torch.nn.Conv2d(6, 6, 3, stride=2, groups=6, bias=False)
            self.max = torch.nn.MaxPool2d(3, 2, ceil_mode=True)
            self.avg = torch.nn.AvgPool2d(2, 2, padding=1, ceil_mode=True, count_include_pad=False)
            self.up = torch.nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1)
            self.gap = torch.nn.AdaptiveAvgPool2d(1)

        def forward(self, x):
            y = self.avg(self.max(self.dw(self.conv(x))))
            return self.gap(self.up(y))

    torch.manual_seed(0)
    x = torch.randn(2, 3, 21, 19)
    buf = io.BytesIO()
    torch.onnx.export(
        Net().eval(),
        (x,),
        buf,
        opset_version=17,
        dynamo=False,
        input_names=["x"],
        output_names=["y"],
    )
    model = onnx.load_from_string(buf.getvalue())
    ops = {n.op_type for n in model.graph.node}
    assert {"Conv", "MaxPool", "AveragePool", "ConvTranspose", "GlobalAveragePool"} <= ops
    check_decomposition(model, {"x": x.numpy()}, rtol=1e-4, atol=1e-5)
