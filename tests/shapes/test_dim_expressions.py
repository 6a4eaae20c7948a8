"""Dimensions written as expressions: ``past + 1``, ``2*s0``, as exporters write them.

A decode step's mask covers the cache and the new token, so its axis is
``past + 1`` where the cache's is ``past``.  Binding reads the expression as
affine in its symbols, takes the symbols' ranges from ``--dim`` or from the
inputs' plain dimensions (or, for one symbol plus a constant, from the range
the axis is given), and refuses inconsistent ranges naming both flags.  One
bundle then serves every past length.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import orchestrate
from orchestrate.errors import InputError
from orchestrate.shapes.binding import bind_inputs
from orchestrate.shapes.dims import DimRange
from orchestrate.shapes.poly import Poly, parse_dim_expression


def _decode(past: str = "past", total: str = "past + 1") -> onnx.ModelProto:
    """cache[1, past, 8] ++ new[1, 1, 8] along the sequence, times mask[1,
    past + 1], softmax over the sequence."""
    nodes = [
        helper.make_node("Concat", ["cache", "new"], ["kv"], axis=1, name="cat"),
        helper.make_node("Unsqueeze", ["mask", "last"], ["m3"], name="unsq"),
        helper.make_node("Mul", ["kv", "m3"], ["masked"], name="mul"),
        helper.make_node("Softmax", ["masked"], ["y"], axis=1, name="sm"),
    ]
    g = helper.make_graph(
        nodes,
        "decode",
        [
            helper.make_tensor_value_info("cache", TensorProto.FLOAT, [1, past, 8]),
            helper.make_tensor_value_info("new", TensorProto.FLOAT, [1, 1, 8]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, total]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, total, 8])],
        initializer=[numpy_helper.from_array(np.array([-1], np.int64), "last")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def _bind(model, shapes=None, dims=None):
    return bind_inputs(list(model.graph.input), shapes or {}, dims or {}, "m.onnx")


P, S0, S1 = Poly.of("past"), Poly.of("s0"), Poly.of("s1")


@pytest.mark.parametrize(
    "text, want",
    [
        ("past + 1", P + 1),
        ("2*s0", 2 * S0),
        ("s0 + s1 - 1", S0 + S1 - 1),
        ("(s0 + 1) * 2", 2 * S0 + 2),
        ("s0*s1", S0 * S1),
        ("s0 / 2", None),
        ("__import__('os')", None),
        ("", None),
    ],
)
def test_dimension_expression_text(text, want):
    assert parse_dim_expression(text) == want


@given(st.integers(-50, 50), st.integers(-5, 5), st.integers(-5, 5), st.integers(-3, 3))
def test_a_printed_expression_parses_back(const, a, b, c):
    e = const + a * S0 + b * S1 + c * S0 * S1
    assert parse_dim_expression(str(e)) == e


def test_the_mask_is_bound_from_the_caches_symbol():
    shapes, ranges = _bind(_decode(), dims={"past": DimRange(1, 9, 5)})
    assert shapes["mask"] == (Poly.of(1), Poly.of("past") + 1)
    assert ranges == {"past": DimRange(1, 9, 5)}


def test_the_symbol_is_read_off_the_range_the_expression_is_given():
    shapes, ranges = _bind(_decode(), shapes={"mask": (DimRange(1, 1), DimRange(2, 10, 6))})
    assert ranges == {"past": DimRange(1, 9, 5)}
    assert shapes["cache"][1] == Poly.of("past")


def test_a_point_makes_every_axis_a_number():
    shapes, ranges = _bind(_decode(), dims={"past": DimRange(4, 4)})
    assert ranges == {}
    assert shapes["mask"] == (Poly.of(1), Poly.of(5))


def test_inconsistent_ranges_name_both_flags():
    with pytest.raises(InputError) as e:
        _bind(
            _decode(),
            shapes={
                "cache": (DimRange(1, 1), DimRange(1, 9), DimRange(8, 8)),
                "mask": (DimRange(1, 1), DimRange(3, 10)),
            },
        )
    msg = str(e.value)
    assert "--shape mask=" in msg and "--shape cache=" in msg and "'past + 1'" in msg, msg
    assert "2..10" in msg and "3..10" in msg, msg


def test_an_unbound_symbol_asks_for_its_dimension():
    with pytest.raises(InputError, match=r"pass --dim past=MIN\.\.MAX"):
        _bind(_decode(past="past_len", total="past + 1"), dims={"past_len": DimRange(1, 4)})


def test_a_name_with_a_dash_is_a_name_not_a_difference():
    """``seq-len`` parses as ``seq - len``, but neither names a dimension:
    it is one name, bound by --dim as any other."""
    shapes, ranges = _bind(
        _decode(past="seq-len", total="seq-len"), dims={"seq-len": DimRange(1, 4)}
    )
    assert ranges == {"seq-len": DimRange(1, 4)}


def test_one_bundle_serves_every_past_length(tmp_path):
    """Optimized once for past = 1..9, the bundle matches onnxruntime at
    past lengths across the range, the mask's axis following the cache's."""
    model = _decode()
    src = tmp_path / "decode.onnx"
    onnx.save(model, src)
    out = tmp_path / "decode.orch"
    result = orchestrate.optimize(src, out, dims={"past": "1..9@5"}, trials=1)
    assert result.report.ok
    loaded = orchestrate.load(out)
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for past in (1, 4, 7, 9):
        feeds = {
            "cache": rng.standard_normal((1, past, 8)).astype(np.float32),
            "new": rng.standard_normal((1, 1, 8)).astype(np.float32),
            "mask": rng.standard_normal((1, past + 1)).astype(np.float32),
        }
        (want,) = session.run(None, feeds)
        got = np.asarray(loaded.run(feeds)["y"])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError):
        loaded.run(
            {
                "cache": np.zeros((1, 4, 8), np.float32),
                "new": np.zeros((1, 1, 8), np.float32),
                "mask": np.zeros((1, 4), np.float32),  # past + 1 would be 5
            }
        )


def test_a_static_shape_fills_in_the_expression_of_its_dimensions():
    """``--shape cache=1x4x8`` fixes ``past``; the mask ``[1, past + 1]`` is
    then 1x5, and a mask given alone gives ``past`` back."""
    from orchestrate.plan import pipeline

    for shapes in ({"cache": (1, 4, 8)}, {"mask": (1, 5)}):
        g = pipeline.fission_model(_decode(), shapes, "m.onnx")
        assert {i.name: i.type.shape for i in g.inputs} == {
            "cache": (1, 4, 8),
            "new": (1, 1, 8),
            "mask": (1, 5),
        }


def test_static_shapes_that_disagree_on_an_expression_name_both():
    from orchestrate.plan import pipeline

    with pytest.raises(InputError) as e:
        pipeline.fission_model(_decode(), {"cache": (1, 4, 8), "mask": (1, 6)}, "m.onnx")
    msg = str(e.value)
    assert "--shape mask=" in msg and "--shape cache=" in msg and "'past + 1'" in msg, msg
