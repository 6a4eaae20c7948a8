"""The pointwise generator against the reference executor, in the interpreter."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrate import ir
from orchestrate.emit import emit
from orchestrate.ir import reference, type_rules
from tests import graphs
from tests.emit_util import assert_matches_reference, one_kernel, run_plan

dims = st.sampled_from([1, 2, 3, 5, 7, 8, 13])


@settings(max_examples=15, deadline=None)
@given(a=dims, b=dims, c=dims, seed=st.integers(0, 99))
def test_broadcasting_in_every_position(a, b, c, seed):
    def fn(bl, x, y, z):
        return bl.tanh(bl.add(bl.mul(x, y), bl.sub(z, 0.5)))

    g = graphs.build(fn, [(a, 1, c), (1, b, 1), (c,)])
    assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g, seed))


@settings(max_examples=10, deadline=None)
@given(m=dims, n=dims, seed=st.integers(0, 99))
def test_layout_folds_into_indexing(m, n, seed):
    """transpose, reshape, slice (negative step), expand, pad, concat: one kernel."""

    def fn(b, x):
        t = b.transpose(x, (1, 0))  # (n, m)
        r = b.reshape(t, (n * m,))
        s = b.slice(r, (n * m - 1,), (-1,), (n * m,))  # reversed
        e = b.expand(b.reshape(s, (1, n * m)), (3, n * m))
        p = b.pad(e, (1, 0, 0, 2), "constant", -1.5)
        c = b.concat([p, b.exp(p)], 0)
        return b.add(c, 1.0)

    g = graphs.build(fn, [(m, n)])
    assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g, seed))


def test_a_head_split_reads_its_input_without_dividing_the_flat_index():
    """Splitting heads ([2, 12] -> [2, 3, 4]) and moving them first reads x
    at (s, h * 4 + d): the flat index splits exactly, so no name is bound to
    it and re-divided (it was: ``r1 = ...; i2 = r1 // 12``)."""

    def fn(b, x):
        return b.exp(b.transpose(b.reshape(x, (2, 3, 4)), (1, 0, 2)))

    g = graphs.build(fn, [(2, 12)])
    source = emit(g, one_kernel(g))
    assert "r1 = " not in source and "// 12" not in source, source
    assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g, 0))


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_reflect_and_edge_padding(mode):
    g = graphs.build(lambda b, x: b.neg(b.pad(x, (2, 1, 1, 2), mode)), [(4, 5)])
    assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g))


def test_gather_with_negative_indices():
    import numpy as np

    from orchestrate import ir
    from orchestrate.decompose.builder import Builder, Value

    b = Builder()
    b.begin("g", "g")
    table = Value("table", ir.TensorType((10, 6), "float32"))
    ids = Value("ids", ir.TensorType((2, 3), "int64"))
    out = b.mul(b.gather(table, ids, 0), 3.0)
    g = ir.Graph(
        tuple(b.nodes),
        (ir.Input("table", table.type), ir.Input("ids", ids.type)),
        (out.name,),
        b.constants,
    )
    inputs = {
        "table": np.random.default_rng(0).standard_normal((10, 6)).astype(np.float32),
        "ids": np.array([[0, -1, 3], [9, -10, 2]], np.int64),
    }
    assert_matches_reference(g, one_kernel(g), inputs)


@pytest.mark.parametrize("index", [0, -1])
def test_constant_index_gather_of_a_broadcast_row(index):
    """ViT's class-token pick after its last layernorm: a constant scalar
    gather fixes the row, so the per-row scale is read at an offset that is
    the same for every lane and must still be loaded as a block."""

    def fn(b, x, r):
        return b.gather(b.mul(x, r), b.constant(np.array(index, np.int64)), 1)

    g = graphs.build(fn, [(1, 17, 64), (1, 17, 1)])
    src = assert_matches_reference(g, one_kernel(g), graphs.random_inputs(g))
    assert src.count("tl.load(") == 2


@pytest.mark.parametrize("dtype", ["float16", "int32"])
def test_dtypes(dtype):
    def fn(b, x, y):
        return b.max(b.add(x, y), b.mul(x, y))

    g = graphs.build(fn, [(4, 5), (5,)], dtype=dtype)
    rng = np.random.default_rng(1)
    ins = {
        k: (rng.standard_normal(v.type.shape) * 4).astype(dtype)
        for k, v in ((i.name, i) for i in g.inputs)
    }
    assert_matches_reference(g, one_kernel(g), ins, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize(
    "value, source, to",
    [
        (0.1, "float32", "float16"),  # rounds: the literal is fp16's 0.0999755859375
        (0.1, "float32", "bfloat16"),  # rounds: bf16's 0.10009765625
        (-2.7, "float32", "int32"),  # truncates toward zero
        (3, "int64", "float32"),  # an integer literal: `3.to(...)` is a syntax error
        (float("nan"), "float32", "float16"),  # float("nan") is no number literal either
        (0.5, "float32", "bool"),
    ],
)
def test_a_cast_of_a_scalar_constant_is_a_literal(value, source, to):
    """A one-element constant is inlined as a literal, which has no ``.to()``:
    its CAST is done at generation, as numpy casts it (the kernel used to
    read ``0.1.to(tl.float16)`` and fail to compile)."""
    c = ir.Node(ir.Op.CAST, "c", ("k",), ir.TensorType((), to), ir.Attrs(to=to))
    op = ir.Op.AND if to == "bool" else ir.Op.ADD
    y = ir.Node(op, "y", ("x", "c"), ir.TensorType((4,), to))
    g = type_rules.validate(
        ir.Graph(
            (c, y),
            (ir.Input("x", ir.TensorType((4,), to)),),
            ("y",),
            {"k": np.array(value, dtype=source)},
        )
    )
    x = np.array([0, 1, 0, 1]).astype(to)
    got, src = run_plan(g, one_kernel(g), {"x": x})
    # one rounding either way (the kernel's fp32 sum stored, numpy's sum in the
    # dtype); the interpreter stores bf16 truncated, a GPU rounds to nearest
    ulp = 2.0**-7 if to == "bfloat16" else 0.0
    want = reference.run(g, {"x": x})["y"]
    np.testing.assert_allclose(got["y"].astype(np.float64), want.astype(np.float64), rtol=ulp)
    assert not re.search(r'(\b\d+(\.\d+)?|float\("-?\w+"\))\.to\(', src), src
