"""Frontend: shape binding, shape inference and constant folding."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from orchestrate import frontend
from orchestrate.decompose import fission
from orchestrate.errors import InputError
from orchestrate.frontend import onnxrt
from orchestrate.ir import reference
from tests.util import elem, op_counts


def _shape_arith_model() -> onnx.ModelProto:
    """y = reshape(x, [shape(x)[0], -1]) + range(0, 32) cast to float, the way
    exporters write dynamic shapes."""
    x = helper.make_tensor_value_info("x", elem("float32"), ["N", 4, 8])
    c = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Range", ["zero", "k32", "one"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Add", ["flat", "rf"], ["y"]),
    ]
    inits = [c("zero", 0), c("one", 1), c("k32", 32), c("ax0", [0]), c("minus1", [-1])]
    g = helper.make_graph(nodes, "dyn", [x], [onnx.ValueInfoProto(name="y")], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def test_shape_arithmetic_folds_away_once_shapes_are_bound():
    m = frontend.prepare(_shape_arith_model(), {"x": (3, 4, 8)})
    assert sorted(op_counts(m)) == ["Add", "Reshape"]
    target = next(t for t in m.graph.initializer if t.name == "target")
    assert numpy_helper.to_array(target).tolist() == [3, -1]
    graph = fission(m)
    x = np.random.default_rng(0).standard_normal((3, 4, 8)).astype(np.float32)
    want = onnxrt.run(_shape_arith_model(), {"x": x})["y"]
    np.testing.assert_allclose(reference.run(graph, {"x": x})["y"], want)


def test_dynamic_dimension_without_shape_is_named():
    with pytest.raises(
        InputError, match=r"input 'x' has dimension 'N' at axis 0; pass --shape x=Nx4x8"
    ):
        frontend.prepare(_shape_arith_model(), None, "dyn.onnx")


def _two_inputs_model() -> onnx.ModelProto:
    """y = x + mask (unsqueezed): x[batch, seq, 4], mask[batch, seq]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [
        helper.make_node("Unsqueeze", ["mask", "axes"], ["m3"], name="unsqueeze"),
        helper.make_node("Add", ["x", "m3"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "two", [x, mask], [y], [axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_input_sharing_named_dimensions_with_a_given_shape_is_bound_by_it():
    """--shape x=3x7x4 fixes batch and seq, so mask[batch, seq] needs no shape
    of its own (a range of one point binds it so too); the graph computes
    what onnxruntime does."""
    m = frontend.prepare(_two_inputs_model(), {"x": (3, 7, 4)}, "two.onnx")
    mask = next(i for i in m.graph.input if i.name == "mask")
    assert [d.dim_value for d in mask.type.tensor_type.shape.dim] == [3, 7]
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((3, 7, 4)).astype(np.float32),
        "mask": rng.standard_normal((3, 7)).astype(np.float32),
    }
    want = onnxrt.run(_two_inputs_model(), feeds)["y"]
    np.testing.assert_allclose(reference.run(fission(m), feeds)["y"], want)


def test_two_shapes_fixing_one_named_dimension_differently_are_refused():
    with pytest.raises(
        InputError, match=r"--shape mask=\.\.\.: dimension 'seq' is 8 here but 7 in --shape x="
    ):
        frontend.prepare(_two_inputs_model(), {"x": (3, 7, 4), "mask": (3, 8)}, "two.onnx")


def _paddle_model() -> onnx.ModelProto:
    """y = relu(x) + 1 with x declared [-1, 3, 4]: paddle2onnx writes -1 for
    a dynamic batch (and onnx's checker lets it through)."""
    x = helper.make_tensor_value_info("x", elem("float32"), [-1, 3, 4])
    y = helper.make_tensor_value_info("y", elem("float32"), [-1, 3, 4])
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "one"], ["y"])]
    g = helper.make_graph(nodes, "paddle", [x], [y], initializer=[one])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("declared", [-1, 0])
def test_a_negative_or_zero_dimension_is_dynamic_and_shape_binds_it(tmp_path, declared):
    """-1 (paddle2onnx) and 0 (exporters that mean "unknown") on the batch."""
    import orchestrate

    def model():
        m = _paddle_model()
        for vi in (m.graph.input[0], m.graph.output[0]):
            vi.type.tensor_type.shape.dim[0].dim_value = declared
        return m

    path = tmp_path / "paddle.onnx"
    onnx.save(model(), path)
    made = orchestrate.optimize(path, tmp_path / "p.orch", shapes={"x": (2, 3, 4)}, trials=1)
    assert made.report.ok
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    got = orchestrate.load(tmp_path / "p.orch").run({"x": x})["y"]
    np.testing.assert_allclose(got, np.maximum(x, 0) + 1, rtol=1e-6)
    # unbound, it is named like any dynamic dimension
    with pytest.raises(InputError, match=r"input 'x' has a dynamic dimension at axis 0"):
        orchestrate.optimize(path, tmp_path / "q.orch", trials=0)
    # the API's decompose reads it too, leaving the caller's model as it was
    original = model()
    prim = orchestrate.decompose(original, shapes={"x": (5, 3, 4)})
    assert [d.dim_value for d in prim.graph.input[0].type.tensor_type.shape.dim] == [5, 3, 4]
    assert original.graph.input[0].type.tensor_type.shape.dim[0].dim_value == declared


def test_shape_for_unknown_input_lists_the_real_ones():
    with pytest.raises(InputError, match=r"no input 'q' \(inputs: x\)"):
        frontend.prepare(_shape_arith_model(), {"q": (1,)})


def test_parse_shape():
    assert frontend.parse_shape("ids=1x128") == ("ids", (1, 128))
    assert frontend.parse_shape("ids=1,128") == ("ids", (1, 128))
    assert frontend.parse_shape("scalar=") == ("scalar", ())
    for bad in ("ids", "=1x2", "ids=1xa", "ids=-1"):
        with pytest.raises(InputError):
            frontend.parse_shape(bad)


def test_random_ops_are_never_folded():
    g = helper.make_graph(
        [
            helper.make_node("RandomNormal", [], ["r"], shape=[2], dtype=1),
            helper.make_node("Relu", ["r"], ["y"]),
        ],
        "rand",
        [],
        [onnx.ValueInfoProto(name="y")],
    )
    m = onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    )
    assert sorted(op_counts(frontend.prepare(m))) == ["RandomNormal", "Relu"]


def test_large_constant_results_stay_nodes():
    """Folding a ConstantOfShape of 4M elements would bloat the model: it stays."""
    shape = numpy_helper.from_array(np.array([2048, 2048], np.int64), "shape")
    g = helper.make_graph(
        [
            helper.make_node(
                "ConstantOfShape",
                ["shape"],
                ["big"],
                value=numpy_helper.from_array(np.array([1.0], np.float32)),
            ),
            helper.make_node("Relu", ["big"], ["y"]),
        ],
        "big",
        [],
        [onnx.ValueInfoProto(name="y")],
        initializer=[shape],
    )
    m = onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    )
    assert op_counts(frontend.prepare(m))["ConstantOfShape"] == 1
