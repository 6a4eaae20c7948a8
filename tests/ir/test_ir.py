"""The primitive IR: type rules, validity checks and the reference executor."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrate.errors import GraphError, UnsupportedError
from orchestrate.ir import Attrs, Graph, Input, Node, Op, TensorType, reference, type_rules

F32 = "float32"


def t(*shape, dtype=F32):
    return TensorType(tuple(shape), dtype)


def test_broadcasting_follows_numpy():
    assert type_rules.broadcast_shapes((4, 1, 3), (5, 1)) == (4, 5, 3)
    assert type_rules.broadcast_shapes((), (2, 3)) == (2, 3)
    with pytest.raises(GraphError, match="do not broadcast"):
        type_rules.broadcast_shapes((2, 3), (4, 3))


@pytest.mark.parametrize(
    "op, ins, attrs, want",
    [
        (Op.ADD, (t(4, 1), t(3)), {}, t(4, 3)),
        (Op.LT, (t(2), t(2)), {}, t(2, dtype="bool")),
        (Op.SUM, (t(2, 3, 4),), {"axes": (1, 2), "keepdims": True}, t(2, 1, 1)),
        (Op.RMAX, (t(2, 3, 4),), {"axes": (0,), "keepdims": False}, t(3, 4)),
        (
            Op.ARGMAX,
            (t(2, 3),),
            {"axis": 1, "keepdims": False, "select_last_index": False},
            t(2, dtype="int64"),
        ),
        (Op.TRANSPOSE, (t(2, 3, 4),), {"perm": (2, 0, 1)}, t(4, 2, 3)),
        (
            Op.SLICE,
            (
                t(
                    10,
                ),
            ),
            {"starts": (9,), "steps": (-3,), "shape": (4,)},
            t(4),
        ),
        (Op.PAD, (t(2, 3),), {"pads": (1, 0, 0, 2), "mode": "constant", "value": 0.0}, t(3, 5)),
        (Op.GATHER, (t(5, 6), t(2, 3, dtype="int64")), {"axis": 1}, t(5, 2, 3)),
        (Op.MATMUL, (t(7, 1, 2, 3), t(5, 3, 4)), {}, t(7, 5, 2, 4)),
        (
            Op.CONV,
            (t(1, 4, 9, 9), t(6, 2, 3, 3)),
            {"strides": (2, 2), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 2},
            t(1, 6, 5, 5),
        ),
        (
            Op.POOL,
            (t(1, 2, 7),),
            {"kind": "max", "kernel": (3,), "strides": (2,), "pads": (0, 0), "dilations": (1,)},
            t(1, 2, 3),
        ),
    ],
)
def test_infer(op, ins, attrs, want):
    assert type_rules.infer(op, ins, Attrs(attrs)) == want


@pytest.mark.parametrize(
    "op, ins, attrs, error",
    [
        (Op.ADD, (t(2), t(2, dtype="float64")), {}, GraphError),
        (
            Op.SLICE,
            (
                t(
                    10,
                ),
            ),
            {"starts": (8,), "steps": (1,), "shape": (3,)},
            GraphError,
        ),
        (Op.MATMUL, (t(2, 3), t(4, 5)), {}, GraphError),
        (Op.RESHAPE, (t(2, 3),), {"shape": (4, 2)}, GraphError),
        (Op.EXP, (t(2, dtype="int32"),), {}, UnsupportedError),
        (Op.SUM, (t(2, 3),), {"axes": (), "keepdims": True}, GraphError),
    ],
)
def test_infer_rejects(op, ins, attrs, error):
    with pytest.raises(error):
        type_rules.infer(op, ins, Attrs(attrs))


X23 = (("x", TensorType((2, 3), F32)),)


def _graph(nodes, inputs=X23, outputs=("y",), constants=None):
    return Graph(
        tuple(nodes), tuple(Input(n, ty) for n, ty in inputs), tuple(outputs), constants or {}
    )


def test_validate_accepts_a_good_graph_and_rejects_each_kind_of_bad_one():
    good = _graph([Node(Op.EXP, "e", ("x",), t(2, 3)), Node(Op.NEG, "y", ("e",), t(2, 3))])
    assert type_rules.validate(good) is good
    with pytest.raises(GraphError, match="before they are defined"):
        type_rules.validate(
            _graph([Node(Op.NEG, "y", ("e",), t(2, 3)), Node(Op.EXP, "e", ("x",), t(2, 3))])
        )
    with pytest.raises(GraphError, match="defined twice"):
        type_rules.validate(_graph([Node(Op.EXP, "x", ("x",), t(2, 3))], outputs=("x",)))
    with pytest.raises(GraphError, match="expected"):
        type_rules.validate(_graph([Node(Op.EXP, "y", ("x",), t(3, 2))]))
    with pytest.raises(GraphError, match="never defined"):
        type_rules.validate(_graph([Node(Op.EXP, "e", ("x",), t(2, 3))]))


def test_nodes_and_attrs_are_immutable_and_hashable():
    n = Node(Op.SUM, "s", ("x",), t(2, 1), Attrs(axes=[1], keepdims=True))
    assert n.attrs["axes"] == (1,)
    assert hash(n) == hash(Node(Op.SUM, "s", ("x",), t(2, 1), Attrs(keepdims=True, axes=(1,))))
    with pytest.raises(AttributeError):
        n.op = Op.RMAX  # type: ignore[misc]


def test_constants_are_read_only():
    g = _graph([Node(Op.ADD, "y", ("x", "c"), t(2, 3))], constants={"c": np.ones(3, np.float32)})
    with pytest.raises(ValueError):
        g.constants["c"][0] = 5


def _run1(op, *arrays, **attrs):
    a = Attrs(attrs)
    ty = type_rules.infer(op, tuple(TensorType(x.shape, x.dtype.name) for x in arrays), a)
    return reference.evaluate(Node(op, "y", (), ty, a), list(arrays))


def test_integer_division_truncates_and_mod_follows_the_divisor():
    x = np.array([7, -7, 7, -7], np.int32)
    y = np.array([2, 2, -2, -2], np.int32)
    assert _run1(Op.DIV, x, y).tolist() == [3, -3, -3, 3]
    assert _run1(Op.MOD, x, y, fmod=False).tolist() == [1, 1, -1, -1]
    assert _run1(Op.MOD, x, y, fmod=True).tolist() == [1, -1, 1, -1]


def test_reference_slice_with_negative_step_and_float64_mode():
    x = np.arange(10, dtype=np.float32)
    assert _run1(Op.SLICE, x, starts=(9,), steps=(-3,), shape=(4,)).tolist() == [9, 6, 3, 0]
    g = _graph([Node(Op.DIV, "y", ("x", "c"), t(2, 3))], constants={"c": np.float32(3.0)})
    x = np.ones((2, 3), np.float32)
    assert reference.run(g, {"x": x})["y"].dtype == np.float32
    y64 = reference.run(g, {"x": x}, float64=True)["y"]
    assert y64.dtype == np.float64 and y64[0, 0] == 1 / 3


def test_reference_pool_and_conv_match_direct_loops():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    w = rng.standard_normal((4, 1, 2, 3)).astype(np.float32)
    got = _run1(Op.CONV, x, w, strides=(2, 1), pads=(1, 0, 0, 1), dilations=(1, 2), group=2)
    xp = np.pad(x, [(0, 0), (0, 0), (1, 0), (0, 1)])
    want = np.zeros(got.shape, np.float64)
    for m in range(4):
        for i in range(got.shape[2]):
            for j in range(got.shape[3]):
                patch = xp[0, m // 2, 2 * i : 2 * i + 2, j : j + 5 : 2]
                want[0, m, i, j] = (patch * w[m, 0]).sum()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    got = _run1(
        Op.POOL, x, kind="avg", kernel=(2, 2), strides=(2, 2), pads=(0, 0, 1, 0), dilations=(1, 1)
    )
    xp = np.pad(x, [(0, 0), (0, 0), (0, 1), (0, 0)])
    want = xp[:, :, :6].reshape(1, 2, 3, 2, 2, 2).mean(axis=(3, 5))
    np.testing.assert_allclose(got, want, rtol=1e-6)
