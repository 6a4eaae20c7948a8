"""The decode step over caches kept in place (``frontend/decode.py``),
checked by onnxruntime on both graphs: the rewritten step over a buffer
whose rows past ``past`` hold noise gives the original step's logits and
the last row of its ``present*``."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from examples import decode
from orchestrate.frontend.decode import decode_io, growing_axis, in_place, padding_changes


def _io(model):
    return decode_io([i.name for i in model.graph.input], [o.name for o in model.graph.output], "m")


def _run(model, feed):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feed)))


@pytest.mark.parametrize("style, dynamo", [("gpt2", False), ("llama", True)])
def test_the_rewritten_step_reads_the_buffer_and_returns_the_new_row(tmp_path, style, dynamo):
    src = tmp_path / "step.onnx"
    decode.export_decode(style, src, dynamo=dynamo)
    model = onnx.load(str(src))
    made = in_place(model, _io(model), 40)
    assert not isinstance(made, str), made
    assert dict(made.axis) == {"past_k": 3, "past_v": 3} and made.capacity == 40
    rng = np.random.default_rng(0)
    for past in (1, 9, 39):
        feed = {
            k: v.numpy()
            for k, v in zip(decode.INPUTS, decode.example_inputs(decode.config(style), past))
        }
        want = _run(model, feed)
        buffers = dict(feed)
        for name in ("past_k", "past_v"):
            shape = list(feed[name].shape)
            shape[3] = 40
            noise = rng.standard_normal(shape).astype(np.float32) * 100
            noise[:, :, :, :past] = feed[name]
            buffers[name] = noise
        got = _run(made.model, buffers)
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-6)
        for present in ("present_k", "present_v"):
            assert got[present].shape[3] == 1
            np.testing.assert_allclose(
                got[present], want[present][:, :, :, past:], rtol=1e-5, atol=1e-6
            )


def _value(name, dims):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _inputs(mask: str, *more) -> list:
    """A toy step's inputs: the token, a mask of ``mask`` slots, a cache."""
    return [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 1]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, mask]),
        _value("past_k", [1, "past", 2]),
        *more,
    ]


def test_what_cannot_be_kept_in_place_says_why():
    assert growing_axis(_value("past", [2, "p", 4]), _value("present", [2, "p + 1", 4])) == (
        1,
        "p",
    )
    assert "on 2 axes" in growing_axis(
        _value("past", [2, "p", 4]), _value("present", [3, "p + 1", 4])
    )
    assert "plus one row" in growing_axis(_value("past", [2, "p"]), _value("present", [2, "p + 2"]))
    assert "one rank" in growing_axis(_value("past", [2, "p"]), _value("present", [2, "p + 1", 1]))
    # no input but the cache holds the past length: nowhere to read it from
    nodes = [
        helper.make_node("Concat", ["past_k", "new"], ["present_k"], axis=1),
        helper.make_node("ReduceSum", ["present_k"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        _inputs("n", _value("new", [1, 1, 2])),
        [_value("logits", [1, 1, 1]), _value("present_k", [1, "past + 1", 2])],
    )
    model = helper.make_model(graph)
    why = in_place(model, _io(model), 8)
    assert isinstance(why, str) and "no input other than the caches" in why


def _toy(logits_from_length: bool):
    """A step whose logits count the mask's ones (not moved by masked
    slots) or its length (moved): the new row is the token, repeated."""
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["idf"], to=TensorProto.FLOAT),
        helper.make_node("Expand", ["idf", "row_shape"], ["row"]),
        helper.make_node("Concat", ["past_k", "row"], ["present_k"], axis=1),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
    ]
    if logits_from_length:
        nodes += [
            helper.make_node("Shape", ["attention_mask"], ["n"], start=1),
            helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
            helper.make_node("Reshape", ["nf", "logit_shape"], ["logits"]),
        ]
    else:
        nodes += [helper.make_node("ReduceSum", ["maskf"], ["logits"], keepdims=1)]
    graph = helper.make_graph(
        nodes,
        "toy",
        _inputs("past + 1"),
        [_value("logits", [1, 1]), _value("present_k", [1, "past + 1", 2])],
        [
            helper.make_tensor("row_shape", TensorProto.INT64, [3], [1, 1, 2]),
            helper.make_tensor("logit_shape", TensorProto.INT64, [2], [1, 1]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def test_masked_slots_are_checked_not_to_move_the_step():
    """A step that reads the past length from the mask's ones may be rounded
    up to a bucket; one that reads it from the mask's length may not."""
    for from_length in (False, True):
        model = _toy(from_length)
        made = in_place(model, _io(model), 16)
        assert not isinstance(made, str), made
        run = lambda feed, m=made.model: _run(m, feed)  # noqa: E731
        moved = padding_changes(made, run, 4, 9)
        if from_length:
            assert "logits at past 4 changes with 5 masked slots" in moved
        else:
            assert moved is None


def test_per_layer_caches_named_as_hugging_face_names_them():
    """Caches ``past_key_values.0.key`` / ``.value`` returned as ``present.0.key``
    / ``.value``, growing along axis 2: each rewritten, each new row returned."""
    caches = [
        ("past_key_values.0.key", "present.0.key"),
        ("past_key_values.0.value", "present.0.value"),
    ]
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["idf"], to=TensorProto.FLOAT),
        helper.make_node("Expand", ["idf", "row_shape"], ["row"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["maskf"], ["logits"], keepdims=1),
    ]
    nodes += [helper.make_node("Concat", [p, "row"], [q], axis=2) for p, q in caches]
    graph = helper.make_graph(
        nodes,
        "hf",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 1]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "past + 1"]),
            *[_value(p, [1, 2, "past", 4]) for p, _ in caches],
        ],
        [_value("logits", [1, 1]), *[_value(q, [1, 2, "past + 1", 4]) for _, q in caches]],
        [helper.make_tensor("row_shape", TensorProto.INT64, [4], [1, 2, 1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    made = in_place(model, _io(model), 12)
    assert not isinstance(made, str), made
    assert dict(made.axis) == {p: 2 for p, _ in caches}
    buffers = {p: np.full((1, 2, 12, 4), 7.0, np.float32) for p, _ in caches}
    got = _run(
        made.model,
        {"input_ids": np.array([[3]]), "attention_mask": np.ones((1, 6), np.int64), **buffers},
    )
    for _, q in caches:
        assert got[q].shape == (1, 2, 1, 4) and (got[q] == 3.0).all()
