"""Text from a model reaches generated source only escaped.

Every name a model carries (inputs, outputs, initializers, nodes,
value_info, the graph, doc strings, metadata, even the file name) is made
hostile: a line break of every kind, quotes, a comment marker and Python
that would run if pasted.  The bundle must still compute the model, and the
source must hold those names only inside string literals and comments.
"""

from __future__ import annotations

import ast
import io
import tokenize

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import orchestrate
from orchestrate.frontend import onnxrt
from tests.util import elem

TERMINATORS = [
    "\n",
    "\r",
    "\r\n",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1d",
    "\x1e",
    "\x85",
    "\u2028",
    "\u2029",
]
PAYLOAD = "import os; os.system('touch PWNED')"


def hostile(tag: str, i: int) -> str:
    """A name that breaks out of a comment, a docstring or a string literal
    if pasted: a line terminator, then code, quotes and a backslash."""
    t = TERMINATORS[i % len(TERMINATORS)]
    return f'{tag}{t}{PAYLOAD}{t}#"""\'\\ é\x1b[31m{t}MARK'


def _model() -> onnx.ModelProto:
    """out = tanh(x * w) + b, a second output LayerNorm(x), and two sibling
    projections x @ wq and x @ wk + bk (a merged matmul, or library calls)."""
    x, w, b, m, t, y, ln = (
        hostile(tag, i) for i, tag in enumerate(["x", "w", "b", "m", "t", "y", "ln"])
    )
    scale, bias = hostile("scale", 7), hostile("bias", 8)
    wq, wk, bk, q, kp, k = (
        hostile(tag, 19 + i) for i, tag in enumerate(["wq", "wk", "bk", "q", "kp", "k"])
    )
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), wq),
        numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), wk),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), bk),
        numpy_helper.from_array(np.linspace(-1, 1, 16, dtype=np.float32), w),
        numpy_helper.from_array(np.full((16,), 0.25, np.float32), b),
        numpy_helper.from_array(np.ones(16, np.float32), scale),
        numpy_helper.from_array(np.zeros(16, np.float32), bias),
    ]
    nodes = [
        helper.make_node("Mul", [x, w], [m], name=hostile("mul", 9), doc_string=hostile("doc", 10)),
        helper.make_node("Tanh", [m], [t], name=hostile("tanh", 11)),
        helper.make_node("Add", [t, b], [y], name=hostile("add", 12)),
        helper.make_node(
            "LayerNormalization",
            [x, scale, bias],
            [ln],
            name=hostile("norm", 13),
            axis=-1,
            epsilon=1e-5,
        ),
        helper.make_node("MatMul", [x, wq], [q], name=hostile("mmq", 25)),
        helper.make_node("MatMul", [x, wk], [kp], name=hostile("mmk", 26)),
        helper.make_node("Add", [kp, bk], [k], name=hostile("addk", 27)),
    ]
    graph = helper.make_graph(
        nodes,
        hostile("graph", 14),
        [helper.make_tensor_value_info(x, elem("float32"), [4, 16])],
        [
            helper.make_tensor_value_info(y, elem("float32"), [4, 16]),
            helper.make_tensor_value_info(ln, elem("float32"), [4, 16]),
            helper.make_tensor_value_info(q, elem("float32"), [4, 8]),
            helper.make_tensor_value_info(k, elem("float32"), [4, 8]),
        ],
        initializer=inits,
        value_info=[helper.make_tensor_value_info(m, elem("float32"), [4, 16])],
        doc_string=hostile("graphdoc", 15),
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
        doc_string=hostile("modeldoc", 16),
    )
    helper.set_model_props(model, {hostile("key", 17): hostile("value", 18)})
    onnx.checker.check_model(model)
    return model


# generated kernels (the projections merged) and library launchers calling torch
BACKENDS = {"triton": ("triton",), "library": ("library",)}
TEMPLATES = {"triton": "merged_matmul", "library": "library_matmul"}


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def bundle(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    src = root / "m\nimport os\n#.onnx"  # the file name is text from outside too
    onnx.save(_model(), src)
    result = orchestrate.optimize(
        src, root / "out.orch", trials=1, reproducible=True, gemm_backends=BACKENDS[request.param]
    )
    templates = {k.template for k in result.plan.kernels}
    assert TEMPLATES[request.param] in templates, templates
    return src, result.path


def test_hostile_names_run_and_match_onnxruntime(bundle):
    src, out = bundle
    model = onnx.load(src)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    name = model.graph.input[0].name
    got = orchestrate.load(out).run({name: x})
    want = onnxrt.run(model, {name: x})
    assert set(got) == set(want) == {o.name for o in model.graph.output}
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)
    assert not (out.parent / "PWNED").exists() and not (out / "PWNED").exists()


def test_generated_source_holds_names_only_in_strings_and_comments(bundle):
    src, out = bundle
    raw = (out / "kernels.py").read_bytes()
    text = raw.decode("ascii")  # every byte ASCII
    assert all(c == "\n" or " " <= c <= "~" for c in text)
    assert "MARK" in text  # the names are there ...
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if "MARK" in tok.string or "PWNED" in tok.string:  # ... only as data
            assert tok.type in (tokenize.STRING, tokenize.COMMENT), tok
    # and the module is what emission makes: a docstring, imports, functions, the table
    tree = ast.parse(text)
    kinds = {type(node).__name__ for node in tree.body}
    assert kinds <= {"Expr", "Import", "FunctionDef", "Assign"}, kinds
    assert isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant)
    (table,) = [n for n in tree.body if isinstance(n, ast.Assign)]
    assert [t.id for t in table.targets] == ["KERNELS"]
    keys = {k.value for k in table.value.keys}
    tensors = {e.value for v in table.value.values for e in v.elts[1].elts}
    model = onnx.load(src)
    names = {i.name for i in model.graph.input} | {o.name for o in model.graph.output}
    assert names <= tensors  # the names round-trip through the escaping exactly
    assert all(k.startswith("k") and k.isidentifier() for k in keys)


def _readable(text: str) -> None:
    """What people read: every character printable but the line breaks
    between lines, and each name whole on its line."""
    for line in text.split("\n"):
        assert line.isprintable(), repr(line)
        if "PWNED" in line:  # a name's payload: the rest of the name is beside it
            assert "MARK" in line, line


def test_what_people_read_shows_each_name_on_one_line(bundle, tmp_path):
    from click.testing import CliRunner

    from orchestrate import cli

    src, out = bundle
    runner = CliRunner()
    plan = tmp_path / "p.json"
    for args in (
        ["inspect", str(src)],
        ["plan", str(src), "-o", str(plan)],
        ["explain", str(plan), "--rejected", "--limit", "0"],
        ["verify", str(out), "--model", str(src)],
        ["run", str(out), "--input", "nope=missing.npy"],  # an error naming the inputs
    ):
        r = runner.invoke(cli.main, args)
        assert r.exit_code in (0, 2), (args, r.output)
        assert "MARK" in r.output or args[0] != "inspect", args
        _readable(r.output)
    report = (out / "report.md").read_text()
    assert "MARK" in report
    _readable(report)


@given(st.text(alphabet=st.characters(exclude_categories=()), max_size=40))
@settings(max_examples=300, deadline=None, derandomize=True)
def test_escaped_text_is_one_ascii_line_that_reads_back_exactly(text):
    """Any text, line terminators, surrogates and characters beyond U+FFFF
    included, comes out as one line of printable ASCII that Python reads back
    as exactly that text (a comment: as nothing)."""
    from orchestrate.text import comment, docstring, string

    for made in (string(text), comment(text), docstring(text)):
        assert all(" " <= c <= "~" for c in made), made
    assert ast.literal_eval(string(text)) == text
    assert ast.literal_eval(f'"""{docstring(text)}"""') == text
    assert ast.parse(f"x = 1 {comment(text)}\ny = 2").body[1].lineno == 2
