"""Symbolic shapes: the range parser, affine
dimension expressions, and symbolic shape inference checked against the
concrete shapes the frontend infers when the model is prepared at one shape."""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from orchestrate import cli
from orchestrate.errors import InputError
from orchestrate.frontend import prepare, static_shapes
from orchestrate.shapes import DimRange, NotExact, Poly, parse_dim, parse_range_shape
from orchestrate.shapes.infer import infer_shapes

# -- the parser ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, want",
    [
        ("x=1..8x2..64@32", ("x", (DimRange(1, 8, 8), DimRange(2, 64, 32)))),
        ("x=4x1..3", ("x", (DimRange(4, 4), DimRange(1, 3, 3)))),
        ("ids=1..1", ("ids", (DimRange(1, 1),))),
        ("x=2..5@2,7", ("x", (DimRange(2, 5, 2), DimRange(7, 7)))),
    ],
)
def test_range_shapes_parse(text, want):
    assert parse_range_shape(text) == want


def test_dim_parses_with_opt_defaulting_to_max():
    assert parse_dim("seq=2..64") == ("seq", DimRange(2, 64, 64))
    assert parse_dim("batch=1..8@4") == ("batch", DimRange(1, 8, 4))
    assert str(DimRange(2, 64, 32)) == "2..64@32" and str(DimRange(2, 64)) == "2..64"


@pytest.mark.parametrize(
    "parse, text, needle",
    [
        (parse_range_shape, "x=8..1", "MIN 8 above MAX 1"),
        (parse_range_shape, "x=1..8@9", "OPT 9 outside 1..8"),
        (parse_range_shape, "x=0..4", "starts at 0"),
        (parse_range_shape, "x=-2x3", "is negative"),
        (parse_range_shape, "x=1..ax3", "'1..a' is not N, MIN..MAX or MIN..MAX@OPT"),
        (parse_range_shape, "x", "expected NAME=DIMS"),
        (parse_dim, "seq", "expected SYMBOL=MIN..MAX"),
        (parse_dim, "seq=5..2", "MIN 5 above MAX 2"),
    ],
)
def test_range_errors_name_the_flag_and_text(parse, text, needle):
    with pytest.raises(InputError) as e:
        parse(text)
    flag = "--shape" if parse is parse_range_shape else "--dim"
    assert str(e.value).startswith(f"{flag} ") and text in str(e.value) and needle in str(e.value)


# -- dimension expressions -------------------------------------------------------------------

B, S = Poly.of("batch"), Poly.of("seq")


def test_dimension_arithmetic_is_canonical():
    assert str(2 * S + B - 1) == "batch + 2*seq - 1"
    assert str(4 - S) == "-seq + 4"
    assert (S + B) - (B + S) == Poly.of(0) and str(Poly.of(0)) == "0"
    assert (S * 3 + 6).floordiv(3) == S + 2
    assert Poly.of(7).floordiv(2) == Poly.of(3)
    assert S * 4 == 4 * S and str(S * B * 64) == "64*batch*seq"
    assert (S * B * 64).floordiv(B * 64) == S and (S * S).floordiv(S) == S
    assert (2 * S - B).evaluate({"seq": 5, "batch": 3}) == 7
    assert (2 * S - 3 * B).bounds({"seq": DimRange(2, 64), "batch": DimRange(1, 8)}) == (-20, 125)
    assert (S * B - S).bounds({"seq": DimRange(2, 64), "batch": DimRange(1, 8)}) == (-62, 510)
    assert (S + 1).substitute({"seq": 4}) == Poly.of(5)


def test_an_inexact_quotient_is_refused_with_a_reason():
    inexact = (2 * S + 1).floordiv(2)
    assert isinstance(inexact, NotExact) and "not exact" in inexact.reason
    assert isinstance(S.floordiv(B), NotExact) and isinstance(S.floordiv(0), NotExact)
    assert isinstance((S * B).floordiv(S + 1), NotExact)


@given(
    st.dictionaries(
        st.tuples(st.integers(0, 2), st.integers(0, 2)), st.integers(-9, 9), max_size=5
    ),
    st.integers(1, 9),
    st.integers(1, 9),
)
def test_a_dimension_expression_evaluates_and_round_trips(coeffs, b, s):
    """Any polynomial in two symbols: its value is the sum of its terms, its
    bounds hold it, and its file form reads back as itself."""
    p = Poly()
    for (eb, es), c in coeffs.items():
        p = p + c * B**eb * S**es
    want = sum(c * b**eb * s**es for (eb, es), c in coeffs.items())
    assert p.evaluate({"batch": b, "seq": s}) == want
    lo, hi = p.bounds({"batch": DimRange(1, 9), "seq": DimRange(1, 9)})
    assert lo <= want <= hi
    assert Poly.from_json(p.to_json(["batch", "seq"]), ["batch", "seq"], "here") == p


# -- the CLI -----------------------------------------------------------------------------------


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for n in needles:
        assert n in result.output, result.output


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    """A model whose outputs (named in ``outputs``) have the types ONNX's
    shape inference gives them on the symbolic inputs (the checker wants one)."""
    g = helper.make_graph(nodes, "g", inputs, [], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    types = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(m).graph.value_info}
    m.graph.output.extend(types[o] for o in outputs)
    return m


def _heads_model() -> onnx.ModelProto:
    """x[batch, seq, 8] -> reshape to [batch, seq, 2, 4] through Shape/Gather/Concat
    -> transpose -> softmax; and a Reshape merging batch and seq (declined)."""
    i64 = lambda name, v: numpy_helper.from_array(__import__("numpy").array(v, "int64"), name)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "zero"], ["b"], axis=0),
        helper.make_node("Gather", ["sh", "one"], ["s"], axis=0),
        helper.make_node("Concat", ["b", "s", "heads"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["split"], name="split_heads"),
        helper.make_node("Transpose", ["split"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Softmax", ["t"], ["y"], axis=-1),
        helper.make_node("Reshape", ["x", "flat"], ["z"], name="merge_rows"),
    ]
    inits = [i64("zero", [0]), i64("one", [1]), i64("heads", [2, 4]), i64("flat", [-1, 8])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    return _model(nodes, [x], ["y", "z"], inits)


def test_inspect_prints_symbolic_output_shapes_and_names_declined_nodes(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_heads_model(), path)
    r = invoke("inspect", path, "--shape", "x=1..8x2..64@32x8")
    assert r.exit_code == 0, r.output
    assert "symbolic dimensions: batch 1..8, seq 2..64@32" in r.output
    assert "[batch, 2, seq, 4]" in r.output
    assert "z  [batch*seq, 8]" in r.output and "declined: none" in r.output
    r = invoke("inspect", path, "--dim", "batch=1..4", "--dim", "seq=3", "--json")
    info = json.loads(r.output)
    assert info["ranges"] == {"batch": {"min": 1, "max": 4, "opt": 4}}
    assert info["outputs"] == {"y": ["batch", 2, 3, 4], "z": ["3*batch", 8]}
    assert info["values"]["target"] == [4]
    assert info["declined"] == []


def test_cli_range_errors_are_one_line(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_heads_model(), path)
    one_line_error(invoke("inspect", path, "--shape", "x=8..1x2x8"), "--shape x=8..1x2x8", "MIN 8")
    one_line_error(invoke("inspect", path, "--dim", "seq=0..4"), "--dim seq=0..4", "starts at 0")
    one_line_error(invoke("inspect", path, "--dim", "len=2..4"), "--dim len=", "no dimension 'len'")
    one_line_error(invoke("inspect", path, "--dim", "seq=2..4"), "'batch'", "--dim batch=MIN..MAX")
    one_line_error(invoke("inspect", path, "--shape", "x=1..2x3x9"), "axis 2", "fixed at 8")
    one_line_error(
        invoke("inspect", path, "--shape", "x=1..2x3x8", "--dtype", "fp16"), "--dtype fp16"
    )
    r = invoke("inspect", path, "--shape", "x=1..2x3x8", "--shape", "x=1..3x3x8")
    one_line_error(r, "--shape x", "given twice")


def test_a_command_taking_one_shape_refuses_a_range(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_heads_model(), path)
    out = tmp_path / "p.onnx"
    r = invoke("decompose", path, "-o", out, "--shape", "x=1..8x16x8")
    one_line_error(r, "--shape x=1..8x16x8", "takes one shape, not a range")
    assert not out.exists()


# -- inference against the frontend at concrete shapes -------------------------------------------


def concrete(model, binding_shapes) -> dict[str, tuple[int, ...]]:
    prepared = prepare(model, binding_shapes)
    known = static_shapes(prepared)
    return {o.name: known[o.name][0] for o in prepared.graph.output}


def assert_matches_frontend(model, dims, bindings):
    result = infer_shapes(model, dims=dims)
    assert result.declined == (), [str(d) for d in result.declined]
    for binding in bindings:
        shapes = {
            name: tuple(d.evaluate(binding) for d in result.shape(name)) for name in result.inputs
        }
        want = concrete(model, shapes)
        got = {o: result.at(o, binding) for o in result.outputs}
        assert got == want, (binding, got, want)


F = TensorProto.FLOAT


@st.composite
def graphs(draw):
    """A chain of supported ops on x[b, s, 4] (and y[b, s, 4]); ops that keep
    shape arithmetic symbolic add a side output."""
    import numpy as np

    nodes, inits, outputs = [], [], []
    cur, shape = "x", ["b", "s", 4]  # shape: str symbol or int, for choosing the next op

    def const(values):
        name = f"c{len(inits)}"
        inits.append(numpy_helper.from_array(np.array(values, dtype=np.int64), name))
        return name

    def fresh():
        return f"v{len(nodes)}"

    for _ in range(draw(st.integers(1, 6))):
        rank = len(shape)
        op = draw(
            st.sampled_from(
                [
                    "relu",
                    "add_y",
                    "matmul",
                    "transpose",
                    "split_last",
                    "slice",
                    "reduce",
                    "concat",
                    "range",
                    "expand",
                    "softmax",
                    "flatten_last",
                    "merge_last",
                ]
            )
        )
        out = fresh()
        if op == "relu":
            nodes.append(helper.make_node("Relu", [cur], [out]))
        elif op == "softmax":
            nodes.append(
                helper.make_node("Softmax", [cur], [out], axis=draw(st.integers(-rank, rank - 1)))
            )
        elif op == "add_y" and shape == ["b", "s", 4]:
            nodes.append(helper.make_node("Add", [cur, "y"], [out]))
        elif op == "matmul" and isinstance(shape[-1], int):
            n = draw(st.integers(1, 5))
            w = f"w{len(inits)}"
            inits.append(numpy_helper.from_array(np.ones((shape[-1], n), np.float32), w))
            nodes.append(helper.make_node("MatMul", [cur, w], [out]))
            shape = shape[:-1] + [n]
        elif op == "transpose":
            perm = draw(st.permutations(range(rank)))
            nodes.append(helper.make_node("Transpose", [cur], [out], perm=list(perm)))
            shape = [shape[p] for p in perm]
        elif op == "split_last" and shape[-1] in (4, 6) and rank < 5:
            # Reshape to [dims..., 2, last/2] with a target built by Shape/Gather/Concat
            sh, parts = fresh() + "s", []
            nodes.append(helper.make_node("Shape", [cur], [sh]))
            for k in range(rank - 1):
                g = f"{out}g{k}"
                nodes.append(helper.make_node("Gather", [sh, const([k])], [g], axis=0))
                parts.append(g)
            tgt = f"{out}t"
            nodes.append(helper.make_node("Concat", [*parts, const([2, -1])], [tgt], axis=0))
            nodes.append(helper.make_node("Reshape", [cur, tgt], [out]))
            shape = shape[:-1] + [2, shape[-1] // 2]
        elif (
            op == "flatten_last"
            and rank >= 3
            and isinstance(shape[-1], int)
            and isinstance(shape[-2], int)
        ):
            tgt = const([0] * (rank - 2) + [-1])
            nodes.append(helper.make_node("Reshape", [cur, tgt], [out]))
            shape = shape[:-2] + [shape[-2] * shape[-1]]
        elif op == "merge_last" and rank >= 3 and any(isinstance(d, int) for d in shape[-2:]):
            # Reshape to [dims..., d(-2) * d(-1)] with the product computed by Mul
            sh, parts = f"{out}s", []
            nodes.append(helper.make_node("Shape", [cur], [sh]))
            for k in range(rank):
                g = f"{out}g{k}"
                nodes.append(helper.make_node("Gather", [sh, const([k])], [g], axis=0))
                parts.append(g)
            prod, tgt = f"{out}p", f"{out}t"
            nodes.append(helper.make_node("Mul", parts[-2:], [prod]))
            nodes.append(helper.make_node("Concat", [*parts[:-2], prod], [tgt], axis=0))
            nodes.append(helper.make_node("Reshape", [cur, tgt], [out]))
            a, b = shape[-2:]
            shape = shape[:-2] + [a * b if isinstance(a, int) and isinstance(b, int) else "merged"]
        elif op == "slice":
            ax = draw(st.integers(0, rank - 1))
            sh, e = f"{out}s", f"{out}e"
            nodes.append(helper.make_node("Shape", [cur], [sh], start=ax, end=ax + 1))
            # every dim is at least 1, so dropping one element in all keeps the length >= 0
            cut = draw(st.integers(0, 1))
            nodes.append(helper.make_node("Sub", [sh, const([cut])], [e]))
            first = draw(st.integers(0, 1 - cut)) if isinstance(shape[ax], str) else 0
            nodes.append(helper.make_node("Slice", [cur, const([first]), e, const([ax])], [out]))
            if isinstance(shape[ax], int):
                shape = None  # a number: the exact size is not tracked here
            elif cut or first:
                shape = [d + "-1" if k == ax else d for k, d in enumerate(shape)]
        elif op == "reduce":
            ax = draw(st.integers(0, rank - 1))
            keep = draw(st.integers(0, 1)) if rank > 1 else 1
            nodes.append(helper.make_node("ReduceSum", [cur, const([ax])], [out], keepdims=keep))
            shape = [1 if k == ax else d for k, d in enumerate(shape) if keep or k != ax]
        elif op == "concat":
            ax = draw(st.integers(0, rank - 1))
            nodes.append(helper.make_node("Concat", [cur, cur], [out], axis=ax))
            shape = [
                d if k != ax else (d * 2 if isinstance(d, int) else "2" + d)
                for k, d in enumerate(shape)
            ]
        elif op == "range":
            ax = draw(st.integers(0, rank - 1))
            sh, lim = f"{out}s", f"{out}l"
            nodes.append(helper.make_node("Shape", [cur], [sh], start=ax, end=ax + 1))
            nodes.append(helper.make_node("Squeeze", [sh, const([0])], [lim]))
            nodes.append(helper.make_node("Range", [const(1), lim, const(1)], [out]))
            outputs.append(out)
            continue
        elif op == "expand" and rank >= 1:
            # a [1, last] tensor expanded to the current shape (read by Shape)
            sh, ones = f"{out}s", f"{out}o"
            nodes.append(helper.make_node("Shape", [cur], [sh]))
            nodes.append(
                helper.make_node(
                    "ConstantOfShape",
                    [const([1])],
                    [ones],
                    value=helper.make_tensor("v", F, [1], [1.0]),
                )
            )
            nodes.append(helper.make_node("Expand", [ones, sh], [out]))
            outputs.append(out)
            continue
        else:
            continue
        cur = out
        if shape is None:
            break
    if cur == "x":  # no op applied: a graph output must be made by a node
        nodes.append(helper.make_node("Identity", ["x"], ["copy"]))
        cur = "copy"
    outputs.append(cur)
    x = helper.make_tensor_value_info("x", F, ["b", "s", 4])
    y = helper.make_tensor_value_info("y", F, ["b", "s", 4])
    return _model(nodes, [x, y], list(dict.fromkeys(outputs)), inits)


RANGES = {"b": DimRange(1, 3), "s": DimRange(2, 6)}


@settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(graphs(), st.lists(st.tuples(st.integers(1, 3), st.integers(2, 6)), min_size=1, max_size=2))
def test_symbolic_shapes_of_random_graphs_evaluate_to_the_frontends(model, bindings):
    assert_matches_frontend(model, RANGES, [{"b": b, "s": s} for b, s in bindings])


@settings(
    max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(graphs(), st.lists(st.tuples(st.integers(1, 3), st.integers(2, 6)), min_size=2, max_size=3))
def test_the_family_of_random_graphs_gives_the_frontends_primitive_graphs(model, bindings):
    """What a dynamic plan is made of: the graph made once with symbols
    gives, at any binding of the range, the primitive graph fission makes
    there (every shape and attribute), or the range is refused by node."""
    from orchestrate.plan import pipeline, ranged
    from orchestrate.shapes.binding import Ranges
    from orchestrate.shapes.family import check_instance, family_of

    ranges = Ranges({}, RANGES)
    symbolic = ranged.bind(model, ranges, "m")

    def at(b):
        return pipeline.fission_model(model, symbolic.shapes_at(b), "m")

    top = tuple(d.range.max for d in symbolic.dims)
    g_top = at(top)
    hint = ranged.range_hint(symbolic.dims, g_top)
    try:
        traced = ranged.trace(model, ranges, symbolic, hint, None, "m")
        family = family_of(symbolic.dims, traced, "m")
        check_instance(family, traced, g_top, top, g_top, "m")
    except InputError as e:
        assert "\n" not in str(e) and ("cannot serve the range" in str(e) or "narrow" in str(e))
        return
    for b, s in bindings:
        binding = tuple({"b": b, "s": s}[d.name] for d in symbolic.dims)
        values = family.by_name(binding)
        g = at(binding)
        assert [n.name for n in g.nodes] == [n.name for n in traced.nodes]
        for n in g.nodes:
            want = family.shapes.get(n.name)
            shape = traced.producer[n.name].shape
            if want:
                shape = tuple(d.evaluate(values) for d in want)
            assert shape == n.shape, (n.name, binding)
            for a, v in family.attrs.get(n.name, {}).items():
                assert dynamic_value(v, values) == n.attrs[a], (n.name, a, binding)


def dynamic_value(v, values):
    if isinstance(v, Poly):
        return v.evaluate(values)
    if isinstance(v, tuple):
        return tuple(dynamic_value(x, values) for x in v)
    return v


# -- the examples, exported with dynamic batch and sequence axes -------------------------------------


@pytest.fixture(scope="module")
def dynamic_bert(tmp_path_factory):
    from examples import export_example

    def get(dynamo: bool):
        path = tmp_path_factory.mktemp("bert") / f"bert_{dynamo}.onnx"
        export_example("bert", path, dynamo=dynamo, opset=18 if dynamo else 14, dynamic=True)
        return onnx.load(path)

    return get


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_exported_bert_has_symbolic_output_shapes(dynamic_bert, dynamo):
    model = dynamic_bert(dynamo)
    dims = {"batch": DimRange(1, 4), "sequence": DimRange(2, 16, 8)}
    result = infer_shapes(model, dims=dims)
    assert result.declined == ()
    assert [str(d) for d in result.shape("last_hidden_state")] == ["batch", "sequence", "64"]
    assert [str(d) for d in result.shape("pooler_output")] == ["batch", "64"]
    assert_matches_frontend(
        model, dims, [{"batch": 1, "sequence": 2}, {"batch": 3, "sequence": 11}]
    )
    # past the position table (64 rows) the slices of the position ids are declined, by name
    longer = infer_shapes(model, dims={**dims, "sequence": DimRange(2, 100)})
    assert len(longer.declined) == 2 and all(d.op == "Slice" for d in longer.declined)
    assert "may exceed the dim 64" in longer.declined[0].reason
    assert longer.shape("last_hidden_state") is None


@pytest.mark.parametrize(
    "name, dynamo, opset, output, want",
    [
        ("gpt2", False, 15, "logits", ["batch", "sequence", "1000"]),
        ("llama", True, 18, "logits", ["batch", "sequence", "1000"]),
        ("mistral", False, 14, "logits", ["batch", "sequence", "1000"]),
        ("t5", False, 17, "last_hidden_state", ["batch", "sequence", "64"]),
        ("resnet", True, 18, "logits", ["batch", "10"]),  # a CNN with a dynamic batch
    ],
)
def test_exported_examples_have_symbolic_output_shapes(tmp_path, name, dynamo, opset, output, want):
    from examples import export_example

    path = tmp_path / f"{name}.onnx"
    export_example(name, path, dynamo=dynamo, opset=opset, dynamic=True)
    model = onnx.load(path)
    params = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim}
    dims = {"batch": DimRange(2, 3), "sequence": DimRange(2, 12)}
    dims = {s: r for s, r in dims.items() if s in params}
    result = infer_shapes(model, dims=dims)
    assert result.declined == () and [str(d) for d in result.shape(output)] == want
    bindings = [{"batch": 2, "sequence": 5}, {"batch": 3, "sequence": 12}]
    assert_matches_frontend(
        model, dims, [{s: v for s, v in b.items() if s in dims} for b in bindings]
    )


def test_a_reshape_merging_batch_and_sequence_is_a_product_of_symbols(tmp_path):
    """nn.MultiheadAttention folds the batch into the heads axis: (seq, batch * heads, ...)."""
    from examples import export_example

    path = tmp_path / "enc.onnx"
    export_example("torch_encoder", path, dynamo=True, opset=18, dynamic=True)
    model = onnx.load(path)
    result = infer_shapes(model, dims={"batch": DimRange(1, 4), "sequence": DimRange(2, 8)})
    assert result.declined == ()
    b, s = Poly.of("batch"), Poly.of("sequence")
    shapes = {result.shape(n.output[0]) for n in model.graph.node if n.op_type == "Reshape"}
    assert any(b * s in shape or 4 * b * s in shape for shape in shapes if shape), shapes
    assert result.shape(model.graph.output[0].name) == (b, s, Poly.of(64))


def _i64(name, values):
    import numpy as np

    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def test_expand_through_where_equal_and_conv_with_a_symbolic_batch():
    """TorchScript's expand pattern (Where(Equal(shape, -1), 1, shape)) and a
    conv: the batch may be symbolic; the dims come out as the frontend's."""
    import numpy as np

    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Shape", ["p"], ["sh"]),
        helper.make_node("Equal", ["sh", "minus"], ["eq"]),
        helper.make_node("Where", ["eq", "ones", "sh"], ["target"]),
        helper.make_node("Expand", ["bias", "target"], ["y"]),
    ]
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    bias = numpy_helper.from_array(np.ones((1, 4, 1, 1), np.float32), "bias")
    inits = [w, bias, _i64("minus", [-1, -1, -1, -1]), _i64("ones", [1, 1, 1, 1])]
    x = helper.make_tensor_value_info("x", F, [None, 3, None, None])
    model = _model(nodes, [x], ["y"], inits)
    result = infer_shapes(model, {"x": parse_range_shape("x=1..5x3x9x9")[1]})
    assert result.ranges == {"x_0": DimRange(1, 5)}
    assert [str(d) for d in result.shape("y")] == ["x_0", "4", "2", "2"]
    for b in (1, 4):
        assert result.at("y", {"x_0": b}) == concrete(model, {"x": (b, 3, 9, 9)})["y"]
    spatial = infer_shapes(model, {"x": parse_range_shape("x=2x3x8..12x9")[1]})
    assert [d.node for d in spatial.declined] == ["Conv_0"]
    assert "spatial axis 2 is x_2" in spatial.declined[0].reason


def test_a_reshape_by_half_a_symbol_is_declined_with_the_division():
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Div", ["sh", "two"], ["half"], name="halve"),
        helper.make_node("Reshape", ["x", "half"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", F, ["n"])
    model = _model(nodes, [x], ["y"], [_i64("two", [2])])
    result = infer_shapes(model, dims={"n": DimRange(2, 8)})
    assert [str(d) for d in result.declined] == [
        "node 'halve' (Div): (n) / 2 is not exact for every value of its symbols"
    ]


def _one_op(op, inputs, inits=(), outputs=("y",), **attrs):
    x = [helper.make_tensor_value_info(n, t, dims) for n, t, dims in inputs]
    ins = [n for n, _, _ in inputs] + [t.name for t in inits]
    return _model([helper.make_node(op, ins, list(outputs), **attrs)], x, list(outputs), inits)


def _ones(name, shape, dtype="float32"):
    import numpy as np

    return numpy_helper.from_array(np.ones(shape, dtype), name)


ONE_OP_MODELS = {
    "einsum": lambda: _one_op(
        "Einsum", [("a", F, ["n", 2, 3]), ("b", F, ["n", 3, "m"])], equation="bij,bjk->bik"
    ),
    "depth_to_space": lambda: _one_op("DepthToSpace", [("x", F, ["n", 8, "m", 3])], blocksize=2),
    "space_to_depth": lambda: _one_op("SpaceToDepth", [("x", F, ["n", 2, 4, 6])], blocksize=2),
    "one_hot": lambda: _one_op(
        "OneHot",
        [("i", TensorProto.INT64, ["n", "m"])],
        [_i64("depth", 5), _ones("v", (2,))],
        axis=1,
    ),
    "split": lambda: _one_op(
        "Split", [("x", F, ["n", 6])], [_i64("s", [2, 4])], ("y", "z"), axis=1
    ),
    "pad": lambda: _one_op("Pad", [("x", F, ["n", "m"])], [_i64("p", [0, 1, 2, 3])]),
    "tile": lambda: _one_op("Tile", [("x", F, ["n", "m"])], [_i64("r", [3, 1])]),
    "flatten": lambda: _one_op("Flatten", [("x", F, ["n", 2, 3])], axis=1),
    "gemm": lambda: _one_op("Gemm", [("x", F, [3, "n"])], [_ones("w", (5, 3))], transA=1, transB=1),
    "reduce_max": lambda: _one_op(
        "ReduceMax", [("x", F, ["n", "m", 2])], [_i64("ax", [1])], keepdims=0
    ),
    "global_pool": lambda: _one_op("GlobalAveragePool", [("x", F, ["n", 2, 5, 5])]),
    "gather_nd": lambda: _one_op("GatherND", [("x", F, ["n", 4, 3])], [_i64("ix", [[1], [2]])]),
}


@pytest.mark.parametrize("name", sorted(ONE_OP_MODELS))
def test_one_op_models_match_the_frontend(name):
    ranges = {"n": DimRange(1, 4), "m": DimRange(2, 5)}
    model = ONE_OP_MODELS[name]()
    used = {
        d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param
    }
    assert_matches_frontend(
        model,
        {s: r for s, r in ranges.items() if s in used},
        [{"n": 1, "m": 2}, {"n": 4, "m": 5}, {"n": 3, "m": 3}],
    )
