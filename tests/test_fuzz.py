"""The fuzz suite: hostile and malformed models, bundles and command lines.

Every property here is the one of issue 9: a command exits 0 with the right
answer (onnxruntime's, for a model; the unedited bundle's, for a bundle edit
that changes nothing it computes), or exits 2 with exactly one line on stderr
that starts with ``orchestrate: error:``.  Never a traceback, never exit 3,
nothing half-written (no ``.NAME.*`` left next to an output), no file outside
the output touched, and no code from a model or a bundle ever runs.

The ``ci`` profile (the default, in ``make test``) runs a few derandomized
examples per property; ``make fuzz`` (ORCHESTRATE_FUZZ=1) runs many random
ones.  See tests/fuzz_util.py.  Commands run in-process through click's
CliRunner; only ``run`` on out-of-range gather indices uses a subprocess,
since a kernel that reads out of bounds can crash its process.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import assume, example, given, note
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import orchestrate
from orchestrate.frontend import onnxrt
from tests import fuzz_util as fu
from tests.fuzz_util import check_outcome, examples, invoke

# edited weights may hold NaNs: the interpreter's numpy warns about them
pytestmark = [pytest.mark.fuzz, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

# -- workspaces ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@contextlib.contextmanager
def workspace(root: Path):
    """A fresh folder for one example; removed when the example passes."""
    ws = Path(tempfile.mkdtemp(dir=root))
    yield ws
    shutil.rmtree(ws, ignore_errors=True)


def run_model_api(bundle: Path, feeds: dict) -> dict:
    return orchestrate.load(bundle).run(feeds)


def too_big_to_test(model: onnx.ModelProto) -> bool:
    """A model whose tensors are big enough that checking it here would take
    minutes (the Triton interpreter) but small enough to be legitimate."""
    g = model.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        n = 1
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                n *= max(d.dim_value, 1)
        if 1 << 14 < n < 1 << 40:
            return True
    return any(1 << 14 < int(np.prod(t.dims, dtype=object) or 0) < 1 << 40 for t in g.initializer)


def check_bundle_against_onnxruntime(bundle: Path, model: onnx.ModelProto, feeds: dict, what):
    """An exit-0 optimize: the bundle computes what onnxruntime computes."""
    try:
        want = onnxrt.run(model, feeds)
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{what}: optimize accepted a model onnxruntime refuses: {e}") from e
    fu.assert_close(run_model_api(bundle, feeds), want, what=what)


# -- models: mutated bytes -----------------------------------------------------------

BASE_MODELS = {
    "named": lambda: fu.named_model(),
    "gather": fu.gather_model,
}


MUTATIONS = {
    "truncate": st.tuples(st.just("truncate"), st.integers(0, 4000)),
    "flip": st.tuples(
        st.just("flip"),
        st.lists(st.tuples(st.integers(0, 4000), st.integers(1, 255)), min_size=1, max_size=4),
    ),
    "splice": st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 4000), st.binary(min_size=1, max_size=8)),
        st.tuples(st.just("delete"), st.integers(0, 4000), st.integers(1, 16)),
    ),
}


@pytest.mark.parametrize("family", sorted(MUTATIONS))
@examples(ci=10, fuzz=300)
@given(data=st.data(), base=st.sampled_from(sorted(BASE_MODELS)))
def test_mutated_model_bytes(root, family, data, base):
    """Truncated, flipped, spliced protobuf bytes: a one-line refusal, or a
    model onnxruntime agrees with."""
    check_mutated_model_bytes(root, base, data.draw(MUTATIONS[family], label="mutation"))


def check_mutated_model_bytes(root, base, mutation):
    data = BASE_MODELS[base]().SerializeToString()
    kind, *args = mutation
    if kind == "truncate":
        data = data[: args[0] % len(data)]
    elif kind == "flip":
        data = fu.flip(data, args[0])
    elif kind == "insert":
        p = args[0] % len(data)
        data = data[:p] + args[1] + data[p:]
    else:
        p = args[0] % len(data)
        data = data[:p] + data[p + args[1] :]
    try:
        parsed = onnx.load_from_string(data)
    except Exception:  # noqa: BLE001 - not a model at all: fine, orchestrate must say so
        parsed = None
    assume(parsed is None or not too_big_to_test(parsed))
    with workspace(root) as ws, fu.known_failures():
        src = ws / "model.onnx"
        src.write_bytes(data)
        before = fu.snapshot(ws)
        out = invoke("optimize", src, "-o", ws / "out.orch", "--trials", "1")
        check_outcome(out)
        prim = invoke("decompose", src, "-o", ws / "prim.onnx")
        check_outcome(prim)
        after = fu.snapshot(ws)
        stray = fu.outside(fu.changes(before, after), ["out.orch", "prim.onnx"])
        assert not stray, f"touched outside the outputs: {stray}\n{out}"
        if out.code == 0:
            note(f"accepted: {kind} {args}")
            check_bundle_against_onnxruntime(ws / "out.orch", parsed, fu.feeds_for(parsed), out)
        else:
            assert not (ws / "out.orch").exists()
        if prim.code != 0:
            assert not (ws / "prim.onnx").exists()


# -- models: names -------------------------------------------------------------------

PAYLOAD = "\ue000PAYLOAD\ue000"  # replaced by code that creates a marker file
name_pieces = st.one_of(
    st.sampled_from(fu.LINE_TERMINATORS + fu.SOURCE_BREAKERS),
    st.text(max_size=4),
    st.sampled_from(["x", "y", "t", "w", "k000_pointwise", "in0", "KERNELS", "__init__"]),
    st.tuples(
        st.sampled_from(fu.LINE_TERMINATORS),
        st.just(PAYLOAD),
        st.sampled_from(fu.LINE_TERMINATORS + ("#",)),
    ).map("".join),
)
fuzz_names = st.lists(name_pieces, min_size=1, max_size=5).map("".join).filter(bool)


def distinct_node_names(names: dict) -> bool:
    """Two nodes of one name are F2's (test_model_onnxruntime_refuses), not
    this property's."""
    nodes = [names.get(f, getattr(fu.Names(), f)) for f in ("mul", "relu", "softmax")]
    return len(set(nodes)) == len(nodes)


def with_payload(text: str, marker: Path) -> str:
    return text.replace(PAYLOAD, fu.payload(marker))


def assert_safe_source(bundle: Path) -> None:
    """kernels.py is printable ASCII with plain newlines, and parses."""
    src = (bundle / "kernels.py").read_text()
    bad = sorted({c for c in src if not (" " <= c <= "~" or c == "\n")})
    assert not bad, f"kernels.py holds raw characters {bad}"
    ast.parse(src)


@examples(ci=20, fuzz=600)
@given(
    names=st.fixed_dictionaries(
        {}, optional={f: fuzz_names for f in fu.Names.__dataclass_fields__}
    ).filter(distinct_node_names),
    value_info=st.booleans(),
)
def test_hostile_names(root, names, value_info):
    """Names of inputs, outputs, initializers, intermediates (value_info),
    nodes and the graph with every line terminator, quotes, backslashes and
    Python code: never run, never pasted into kernels.py, never a broken line."""
    with workspace(root) as ws, fu.known_failures():
        marker = ws / "PWNED"
        n = fu.Names(**{k: with_payload(v, marker) for k, v in names.items()})
        model = fu.named_model(n, value_info=value_info)
        src = ws / "model.onnx"
        onnx.save(model, src)
        before = fu.snapshot(ws)
        out = invoke("optimize", src, "-o", ws / "out.orch", "--trials", "1")
        check_outcome(out)
        assert not marker.exists(), f"a name's code ran\n{out}"
        stray = fu.outside(fu.changes(before, fu.snapshot(ws)), ["out.orch"])
        assert not stray, f"touched outside the output: {stray}\n{out}"
        if out.code != 0:
            assert not (ws / "out.orch").exists()
            return
        assert_safe_source(ws / "out.orch")
        feeds = fu.feeds_for(model)
        check_bundle_against_onnxruntime(ws / "out.orch", model, feeds, out)
        again = invoke("verify", ws / "out.orch", "--model", src, "--trials", "1")
        check_outcome(again, codes=(0,))
        assert not marker.exists(), f"a name's code ran\n{again}"


@examples(ci=8, fuzz=300)
@given(
    stem=st.text(min_size=1, max_size=12).filter(lambda s: "/" not in s and "\x00" not in s),
    suffix=st.sampled_from([".onnx", "", ".ONNX", ".onnx\n"]),
)
def test_hostile_model_file_name(root, stem, suffix):
    """The model's file name reaches the bundle (manifest, kernels.py's title,
    the report): a name with line breaks or quotes is escaped there too."""
    name = stem + suffix
    assume(name not in (".", ".."))
    with workspace(root) as ws, fu.known_failures():
        src = ws / name
        try:
            onnx.save(fu.named_model(), src)
        except (OSError, UnicodeEncodeError):
            assume(False)
        before = fu.snapshot(ws)
        out = invoke("optimize", src, "-o", ws / "out.orch", "--trials", "1")
        check_outcome(out)
        stray = fu.outside(fu.changes(before, fu.snapshot(ws)), ["out.orch"])
        assert not stray, f"touched outside the output: {stray}\n{out}"
        if out.code == 0:
            assert_safe_source(ws / "out.orch")


# -- models: shapes ------------------------------------------------------------------

dims = st.one_of(
    st.integers(-3, 5),
    st.sampled_from([2**31 - 1, 2**31, 2**40, 2**62, 2**63 - 1, 100_000_000_000_000]),
    st.sampled_from(["N", "batch", "", "x\ny", "N"]),
)
shape_texts = st.one_of(
    st.lists(
        st.one_of(st.integers(-2, 6), st.sampled_from([2**40, 2**63, 2**64 + 1])), max_size=4
    ).map(lambda ds: "x".join(map(str, ds))),
    st.text(alphabet="0123456789x,-+ _e.", max_size=8),
    st.sampled_from(["1x8", "0x8", "2x0", "nan", "inf", "1e3", "٣x8", "0x10", "2x8x"]),
)


def bound_elements(model_dims: list, shape: list | None) -> int | None:
    ds = shape if shape is not None else model_dims
    if any(isinstance(d, str) for d in ds):
        return None
    return int(np.prod([max(d, 0) for d in ds], dtype=object)) if ds else 1


@examples(ci=15, fuzz=500)
@given(
    model_dims=st.lists(dims, min_size=0, max_size=4),
    shape=st.none() | st.tuples(st.sampled_from(["x", "X", "y", "x=", ""]), shape_texts),
)
def test_fuzzed_shapes(root, model_dims, shape):
    """Input dimensions of 0, negative, huge or symbolic, bound (or not) with
    --shape: a right answer, or one line (never petabytes allocated, never an
    overflow)."""
    option = [] if shape is None else ["--shape", f"{shape[0]}={shape[1]}"]
    parsed = None
    if shape is not None and shape[0] == "x":
        try:
            parsed = [int(d) for d in shape[1].replace(",", "x").split("x")] if shape[1] else []
        except ValueError:
            parsed = None
    n = bound_elements(model_dims, parsed)
    assume(n is None or not (1 << 14 < n < 1 << 40))
    with workspace(root) as ws, fu.known_failures():
        model = fu.shaped_model(model_dims)
        src = ws / "model.onnx"
        onnx.save(model, src)
        before = fu.snapshot(ws)
        inspected = invoke("inspect", src, *option)
        check_outcome(inspected)
        assert not re.search(r"\[[0-9x]*-\d|-\d+(\.\d+)? KB", inspected.stdout), (
            f"inspect shows a negative size\n{inspected}"
        )
        check_outcome(invoke("decompose", src, "-o", ws / "prim.onnx", *option))
        out = invoke("optimize", src, "-o", ws / "out.orch", "--trials", "1", *option)
        check_outcome(out)
        stray = fu.outside(fu.changes(before, fu.snapshot(ws)), ["out.orch", "prim.onnx"])
        assert not stray, f"touched outside the outputs: {stray}\n{out}"
        if out.code == 0:
            loaded = orchestrate.load(ws / "out.orch")
            x_shape = loaded.inputs["x"][0]
            feeds = {"x": np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)}
            try:
                want = onnxrt.run(model, feeds)
            except Exception as e:  # noqa: BLE001
                raise AssertionError(f"accepted what onnxruntime refuses: {e}\n{out}") from e
            fu.assert_close(loaded.run(feeds), want, what=str(out))


# -- models: attribute values --------------------------------------------------------


def _attr_model(op: str, attr: str, value, opset: int) -> onnx.ModelProto:
    """One ``op`` node over x float32[2, 3, 4] with ``attr`` set to ``value``
    (of whatever type), other inputs as constants."""
    x = helper.make_tensor_value_info("x", fu.F32, [2, 3, 4])
    extra_inputs, inits, n_out = [], [], 1
    if op == "Gather":
        inits = [numpy_helper.from_array(np.array([1, 0], np.int64), "idx")]
        extra_inputs = ["idx"]
    if op == "Concat":
        extra_inputs = ["x"]
    if op == "CumSum":
        inits = [numpy_helper.from_array(np.array(1, np.int64), "axis")]
        extra_inputs = ["axis"]
    if op == "Split":
        n_out = 2
    if isinstance(value, list) and not value:
        a = helper.make_attribute(attr, [], attr_type=onnx.AttributeProto.INTS)
    else:
        a = helper.make_attribute(attr, value)
    node = helper.make_node(op, ["x", *extra_inputs], [f"y{k}" for k in range(n_out)], name="n")
    node.attribute.append(a)
    if op == "Split" and attr != "num_outputs":
        node.attribute.append(helper.make_attribute("num_outputs", 2))
    g = helper.make_graph(
        [node],
        "attr",
        [x],
        [onnx.ValueInfoProto(name=f"y{k}") for k in range(n_out)],
        initializer=inits,
    )
    return fu.finish(g, opset=opset)


ATTRS = [
    ("Softmax", "axis", 17),
    ("LogSoftmax", "axis", 17),
    ("Concat", "axis", 17),
    ("Gather", "axis", 17),
    ("Flatten", "axis", 17),
    ("Transpose", "perm", 17),
    ("ReduceMax", "axes", 17),
    ("ReduceSum", "keepdims", 17),
    ("Cast", "to", 17),
    ("LeakyRelu", "alpha", 17),
    ("Gelu", "approximate", 20),
    ("Split", "axis", 18),
    ("Split", "num_outputs", 18),
    ("ArgMax", "axis", 17),
    ("CumSum", "reverse", 17),
    ("Elu", "alpha", 17),
    ("HardSigmoid", "beta", 17),
    ("Hardmax", "axis", 17),
    ("ReduceMean", "keepdims", 17),
]
attr_values = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([2**31, -(2**31) - 1, 2**62, 16, 1, 0]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.text(max_size=6) | st.sampled_from(["tanh", "none", "x\ny", "\u2028"]),
    st.lists(st.integers(-4, 4), max_size=5),
    st.sampled_from([[0, 1, 2], [2, 1, 0], [0, 0, 1], [1, 2, 0, 3], [-1, 0, 1]]),
    st.lists(st.floats(-2, 2, width=32), min_size=1, max_size=3),
)


@examples(ci=25, fuzz=800)
@given(case=st.sampled_from(ATTRS), value=attr_values)
def test_fuzzed_attributes(root, case, value):
    """Axis out of range, wrong attribute types, odd strings and lists: a
    right answer, or one line naming the problem."""
    op, attr, opset = case
    # F11: this one aborts the process in onnx's shape inference (which the
    # test's model builder and orchestrate's frontend both run): it has a
    # subprocess test of its own, test_split_with_fewer_outputs_than_nodes
    assume(not (op == "Split" and attr == "num_outputs" and value == 1 and type(value) is int))
    model = _attr_model(op, attr, value, opset)
    with workspace(root) as ws, fu.known_failures():
        src = ws / "model.onnx"
        onnx.save(model, src)
        out = invoke("optimize", src, "-o", ws / "out.orch", "--trials", "1")
        check_outcome(out)
        if out.code == 0:
            feeds = fu.feeds_for(model)
            check_bundle_against_onnxruntime(ws / "out.orch", model, feeds, out)


# -- bundles: each file edited, then re-hashed ---------------------------------------


@dataclass(frozen=True)
class Good:
    dir: Path
    bundle: Path
    model: onnx.ModelProto = field(repr=False)
    feeds: dict = field(repr=False)
    bundle_out: dict = field(repr=False)
    ort_out: dict = field(repr=False)

    def _repr_pretty_(self, p, cycle):  # what hypothesis prints of a failing example
        p.text(f"Good({self.bundle})")


@pytest.fixture(scope="module")
def good(root):
    """One good bundle of fu.gather_model, its inputs as .npy files, and the
    outputs the unedited bundle and onnxruntime give on them."""
    folder = root / "good"
    folder.mkdir()
    model = fu.gather_model()
    onnx.save(model, folder / "model.onnx")
    out = invoke(
        "optimize",
        folder / "model.onnx",
        "-o",
        folder / "b.orch",
        "--reproducible",
        "--trials",
        "1",
    )
    assert out.code == 0, str(out)
    feeds = fu.gather_inputs()
    for k, v in feeds.items():
        np.save(folder / f"{k}.npy", v)
    bundle_out = orchestrate.load(folder / "b.orch").run(feeds)
    ort_out = onnxrt.run(model, feeds)
    fu.assert_close(bundle_out, ort_out, what="the good bundle")
    return Good(folder, folder / "b.orch", model, feeds, bundle_out, ort_out)


json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-3, 20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-2, 12), max_size=4),
    st.just({"a": 1}),
    st.just([[]]),
)


def edit_json(data, text: str, strings: list[str], marker: Path) -> tuple[str, bool]:
    """A hypothesis-chosen edit of a JSON document: (new text, neutral)."""
    doc = json.loads(text)
    kind = data.draw(
        st.sampled_from(["delete", "retype", "change", "reformat", "flip", "append", "truncate"]),
        label="json edit",
    )
    if kind == "reformat":  # the same document, written differently
        return json.dumps(
            doc,
            indent=data.draw(st.sampled_from([None, 0, 2, "\t"])),
            sort_keys=data.draw(st.booleans()),
        ), True
    raw = text.encode()
    if kind == "flip":
        flips = data.draw(
            st.lists(
                st.tuples(st.integers(0, len(raw)), st.integers(1, 255)), min_size=1, max_size=3
            )
        )
        return fu.flip(raw, flips).decode("utf-8", "surrogateescape"), False
    if kind == "append":
        return text + data.draw(st.sampled_from(["x", "{}", "\n[1]", "\x00", "\n" * 3])), False
    if kind == "truncate":
        return text[: data.draw(st.integers(0, len(text) - 1))], False
    path = data.draw(st.sampled_from(fu.json_paths(doc)), label="path")
    if kind == "delete":
        doc = fu.json_delete(doc, path)
    elif kind == "retype":
        doc = fu.json_set(doc, path, data.draw(json_values, label="value"))
    else:
        old = fu.json_get(doc, path)
        if isinstance(old, bool) or old is None:
            new = not old
        elif isinstance(old, int):
            new = old + data.draw(st.sampled_from([1, -1, -old - 1, 2**40, -(2**63)]))
        elif isinstance(old, float):
            new = data.draw(st.sampled_from([0.0, -1.0, 1e308, float("nan"), float("inf")]))
        elif isinstance(old, str):
            new = data.draw(st.sampled_from(strings) | fuzz_names, label="string")
            new = with_payload(new, marker)
        elif isinstance(old, list):
            new = data.draw(st.sampled_from([old[::-1], old + old, old[:1], []]))
        else:
            new = dict(old)
            if new and data.draw(st.booleans()):
                new.pop(data.draw(st.sampled_from(sorted(new))))
            else:
                new["extra"] = 1
        doc = fu.json_set(doc, path, new)
    return json.dumps(doc, indent=1), False


def json_strings(doc) -> list[str]:
    return sorted(
        {fu.json_get(doc, p) for p in fu.json_paths(doc) if isinstance(fu.json_get(doc, p), str)}
    )


def edit_weights(data, path: Path) -> bool:
    """A hypothesis-chosen edit of weights.npz; returns whether it is neutral."""
    kind = data.draw(
        st.sampled_from(
            [
                "flip",
                "truncate",
                "dtype",
                "shape",
                "drop",
                "rename",
                "add",
                "object",
                "fortran",
                "big-endian",
                "nan",
                "scalar",
                "not-npz",
            ]
        ),
        label="weights edit",
    )
    raw = path.read_bytes()
    if kind == "flip":
        flips = data.draw(
            st.lists(
                st.tuples(st.integers(0, len(raw)), st.integers(1, 255)), min_size=1, max_size=3
            )
        )
        path.write_bytes(fu.flip(raw, flips))
        return False
    if kind == "truncate":
        path.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])
        return False
    if kind == "not-npz":
        path.write_bytes(b"\x93NUMPY" + raw[:20] if data.draw(st.booleans()) else b"")
        return False
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    key = data.draw(st.sampled_from(sorted(arrays)), label="key")
    a = arrays[key]
    neutral = False
    if kind == "dtype":
        arrays[key] = a.astype(
            data.draw(
                st.sampled_from(["float64", "float16", "int64", "int32", "bool", "complex64", "U3"])
            )
        )
    elif kind == "shape":
        arrays[key] = data.draw(
            st.sampled_from(
                [
                    a.reshape(-1),
                    a.reshape(-1)[:1],
                    np.concatenate([a.reshape(-1)] * 3),
                    a.reshape(1, *a.shape),
                    np.zeros((0,), a.dtype),
                    np.zeros((1000, 1000), a.dtype),
                ]
            )
        )
    elif kind == "drop":
        del arrays[key]
    elif kind == "rename":
        arrays[data.draw(st.sampled_from(["c99", "x", "../c0", key + "_"]))] = arrays.pop(key)
    elif kind == "add":
        arrays[data.draw(st.sampled_from(["c99", "extra"]))] = np.ones(3, np.float32)
    elif kind == "object":
        arrays[key] = np.array([{"a": 1}, None], dtype=object)
    elif kind == "fortran":
        arrays[key] = np.asfortranarray(a)
        neutral = True
    elif kind == "big-endian":
        arrays[key] = a.astype(a.dtype.newbyteorder(">"))
        neutral = True
    elif kind == "nan":
        arrays[key] = np.full_like(a, np.nan) if a.dtype.kind == "f" else a + 1
    elif kind == "scalar":
        arrays[key] = np.array(a.reshape(-1)[0] if a.size else 0, a.dtype)
    with open(path, "wb") as f:
        np.savez(f, **arrays)  # object arrays go in pickled: load must refuse them
    return neutral


def edit_kernels(data, path: Path, marker: Path) -> bool:
    src = path.read_text()
    code = fu.payload(marker)
    kind = data.draw(
        st.sampled_from(
            ["append", "prepend", "insert", "flip", "truncate", "empty", "KERNELS", "not-utf8"]
        ),
        label="kernels edit",
    )
    if kind == "append":
        src += "\n" + code + "\n"
    elif kind == "prepend":
        src = code + "\n" + src
    elif kind == "insert":
        lines = src.split("\n")
        k = data.draw(st.integers(0, len(lines)))
        indent = data.draw(st.sampled_from(["", "    "]))
        src = "\n".join(lines[:k] + [indent + code] + lines[k:])
    elif kind == "flip":
        flips = data.draw(
            st.lists(
                st.tuples(st.integers(0, len(src)), st.integers(1, 255)), min_size=1, max_size=3
            )
        )
        path.write_bytes(fu.flip(src.encode(), flips))
        return False
    elif kind == "truncate":
        src = src[: data.draw(st.integers(0, len(src) - 1))]
    elif kind == "empty":
        src = ""
    elif kind == "KERNELS":
        src += "\nKERNELS = {}\n"
    else:
        path.write_bytes(src.encode() + b"\n# \xff\xfe\n")
        return False
    path.write_text(src)
    return False


def edit_report(data, path: Path, marker: Path) -> bool:
    kind = data.draw(st.sampled_from(["flip", "append", "truncate", "binary"]))
    raw = path.read_bytes()
    if kind == "flip":
        path.write_bytes(
            fu.flip(
                raw,
                data.draw(
                    st.lists(
                        st.tuples(st.integers(0, len(raw)), st.integers(1, 255)),
                        min_size=1,
                        max_size=3,
                    )
                ),
            )
        )
    elif kind == "append":
        path.write_bytes(raw + with_payload(data.draw(fuzz_names), marker).encode())
    elif kind == "truncate":
        path.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])
    else:
        path.write_bytes(bytes(range(256)))
    return True  # the report is for people: nothing the bundle computes changes


def edit_bundle(data, bundle: Path, victim: str, marker: Path) -> bool:
    """Edit ``victim`` in ``bundle`` and re-hash it in the manifest, as an
    attacker who edits a bundle would; returns whether the edit is neutral
    (changes nothing the bundle computes)."""
    path = bundle / victim
    if victim in ("plan.json", "manifest.json"):
        text = path.read_text()
        text, neutral = edit_json(data, text, json_strings(json.loads(text)), marker)
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
    elif victim == "weights.npz":
        neutral = edit_weights(data, path)
    elif victim == "kernels.py":
        neutral = edit_kernels(data, path, marker)
    else:
        neutral = edit_report(data, path, marker)
    if victim != "manifest.json":
        fu.rehash(bundle)
    return neutral


def same_outputs(got: dict, want: dict) -> bool:
    try:
        fu.assert_close(got, want)
        return True
    except AssertionError:
        return False


def check_edited_bundle(data, root, good, victim):
    with workspace(root) as ws, fu.known_failures():
        marker = ws / "PWNED"
        bundle = ws / "b.orch"
        shutil.copytree(good.bundle, bundle)
        neutral = edit_bundle(data, bundle, victim, marker)
        note(f"neutral edit: {neutral}")
        for k, v in good.feeds.items():
            np.save(ws / f"{k}.npy", v)
        onnx.save(good.model, ws / "model.onnx")
        before = fu.snapshot(ws)

        ran = invoke(
            "run",
            bundle,
            "--input",
            f"x={ws / 'x.npy'}",
            "--input",
            f"ids={ws / 'ids.npy'}",
            "--output-dir",
            ws / "outs",
        )
        check_outcome(ran)
        assert not marker.exists(), f"code from the bundle ran\n{ran}"
        verified = invoke("verify", bundle, "--model", ws / "model.onnx")
        check_outcome(verified, codes=(0, 1, 2))
        assert not marker.exists(), f"code from the bundle ran\n{verified}"
        explained = invoke("explain", bundle / "plan.json")
        check_outcome(explained)

        stray = fu.outside(fu.changes(before, fu.snapshot(ws)), ["outs"])
        assert not stray, f"touched outside the output: {stray}\n{ran}"
        if ran.code != 0:
            assert not (ws / "outs").exists(), f"outputs written by a failed run\n{ran}"
            return
        got = {p.stem: np.load(p) for p in (ws / "outs").iterdir()}
        if neutral:
            fu.assert_close(got, good.bundle_out, rtol=0, what=f"neutral edit\n{ran}")
        if not same_outputs(got, good.ort_out):
            assert verified.code != 0, (
                f"verify passed a bundle that computes something else\n{ran}\n{verified}"
            )


@pytest.mark.parametrize(
    "victim",
    [
        "plan.json",
        "manifest.json",
        "weights.npz",
        "kernels.py",
        "report.md",
    ],
)
@examples(ci=12, fuzz=400)
@given(data=st.data())
def test_edited_bundle(root, good, victim, data):
    """Each file of a bundle edited (fields deleted, retyped, changed; bytes
    flipped; code appended) and re-hashed in the manifest: run, verify and
    explain refuse it in one line, or compute what they computed before (an
    edit that changes nothing), or verify tells the difference; code in the
    bundle never runs."""
    check_edited_bundle(data, root, good, victim)


# -- command lines: option values ----------------------------------------------------

DEVICES = [
    "h200",
    "h100",
    "h100-pcie",
    "a100",
    "a100-40gb",
    "v100",
    "l4",
    "l40s",
    "a10",
    "rtx4090",
    "rtx3090",
]
plan_options = st.fixed_dictionaries(
    {},
    optional={
        "--device": st.sampled_from(DEVICES + ["H100", "", "cpu", "h100\n", "h 100", "../h100"])
        | st.text(max_size=6),
        "--memory-budget": st.sampled_from(
            ["0", "1", "-1", "1000", "1000000", "99999999999999999999999", "1e6", "nan", "", "0x10"]
        )
        | st.integers(-10, 10**6).map(str),
        "--time-limit": st.sampled_from(
            ["0", "-1", "nan", "inf", "-inf", "1e-9", "1e308", "60", "0.001", "", "NaN", "1_0"]
        ),
        "--max-kernel-nodes": st.sampled_from(["1", "2", "0", "64", "65", "-1", "x"]),
        "--shape": st.sampled_from(["x=2x8", "x=3x8", "x=2x8x1", "y=2x8", "x=", "=2x8", "x=2x-8"]),
    },
)


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def assert_refused(out, option: str, value: str) -> None:
    """An invalid option value is refused (exit 2) by a message that names it,
    or names another option of the same command line that is wrong too."""
    assert out.code == 2, f"{option} {value!r} accepted\n{out}"
    assert option in out.error or re.search(r"--[a-z]|'-o'", out.error), (
        f"{option} {value!r} refused with a message that does not name it\n{out}"
    )


def invalid_plan_option(opts: dict) -> str | None:
    """The option a correct CLI must refuse by name (issue 9: NaN or negative
    limits are user errors), or None."""
    t = _float(opts.get("--time-limit", "60"))
    if t is not None and (t != t or t < 0):
        return "--time-limit"
    m = opts.get("--memory-budget")
    if m is not None and m.lstrip("-").isdigit() and int(m) < 0:
        return "--memory-budget"
    return None


OUTPUT_FILES = [
    "new.json",
    "model",
    "folder",
    "no/such/dir.json",
    "existing.json",
    "link-to-model",
    "",
    "dot/",
    ".hidden.json",
    "new\nline.json",
]


def output_file_target(ws: Path, src: Path, kind: str) -> Path:
    """Make the situation an -o FILE argument of ``kind`` names in ``ws``."""
    if kind == "model":
        return src
    if kind == "folder":
        (ws / "folder").mkdir()
        return ws / "folder"
    if kind == "existing.json":
        (ws / kind).write_text("my notes\n")
    if kind == "link-to-model":
        (ws / kind).symlink_to(src)
    if kind == "dot/":
        (ws / "dot").mkdir()
        return Path(os.fspath(ws / "dot") + "/")
    return ws / kind


@examples(ci=15, fuzz=500)
@given(opts=plan_options, target=st.sampled_from(OUTPUT_FILES), reproducible=st.booleans())
def test_plan_options(root, opts, target, reproducible):
    """`plan` with random --device, --memory-budget, --time-limit,
    --max-kernel-nodes, --shape and -o: a plan that explain reads, or one line;
    the model and everything but -o untouched."""
    with workspace(root) as ws, fu.known_failures():
        src = ws / "model.onnx"
        onnx.save(fu.named_model(), src)
        out_path = output_file_target(ws, src, target)
        args = [x for k, v in opts.items() for x in (k, v)]
        before = fu.snapshot(ws)
        out = invoke("plan", src, "-o", out_path, *args, *(["--reproducible"] * reproducible))
        check_outcome(out)
        after = fu.snapshot(ws)
        assert before["model.onnx"] == after.get("model.onnx"), f"the model changed\n{out}"
        bad = invalid_plan_option(opts)
        if bad:
            assert_refused(out, bad, opts[bad])
        if out.code != 0:
            assert not fu.changes(before, after), f"a failed plan changed files\n{out}"
            return
        written = os.path.relpath(os.path.realpath(out_path), os.path.realpath(ws))
        allowed = [written, os.path.relpath(out_path, ws)]
        stray = fu.outside(fu.changes(before, after), allowed)
        assert not stray, f"touched outside the output: {stray}\n{out}"
        explained = invoke("explain", out_path)
        check_outcome(explained, codes=(0,))


@examples(ci=12, fuzz=400)
@given(
    command=st.sampled_from(["decompose", "explain"]),
    target=st.sampled_from(OUTPUT_FILES + ["plan"]),
    extra=st.sampled_from(
        [
            [],
            ["--shape", "x=2x8"],
            ["--shape", "x=9x9"],
            ["--rejected"],
            ["--limit", "0"],
            ["--limit", "-1"],
            ["--limit", "x"],
        ]
    ),
)
def test_output_file_commands(root, good, command, target, extra):
    """`decompose -o` and `explain --picture` at new, existing, linked and
    model paths: the file written, or one line; the model, the plan and
    everything else untouched."""
    with workspace(root) as ws, fu.known_failures():
        src = ws / "model.onnx"
        onnx.save(fu.named_model(), src)
        plan = ws / "plan.json"
        shutil.copy(good.bundle / "plan.json", plan)
        out_path = plan if target == "plan" else output_file_target(ws, src, target)
        before = fu.snapshot(ws)
        if command == "decompose":
            out = invoke("decompose", src, "-o", out_path, *extra)
        else:
            out = invoke("explain", plan, "--picture", out_path, *extra)
        check_outcome(out)
        after = fu.snapshot(ws)
        for kept in ("model.onnx", "plan.json"):
            assert before[kept] == after.get(kept), f"{kept} changed\n{out}"
        if out.code != 0:
            assert not fu.changes(before, after), f"a failed {command} changed files\n{out}"
            return
        written = os.path.relpath(os.path.realpath(out_path), os.path.realpath(ws))
        stray = fu.outside(fu.changes(before, after), [written, os.path.relpath(out_path, ws)])
        assert not stray, f"touched outside the output: {stray}\n{out}"
        if command == "decompose":
            prim = onnx.load_from_string(Path(out_path).read_bytes())
            feeds = fu.feeds_for(fu.named_model())
            fu.assert_close(onnxrt.run(prim, feeds), onnxrt.run(fu.named_model(), feeds))
        else:
            assert Path(out_path).read_text().startswith("digraph plan {")


tolerances = st.sampled_from(
    ["0", "1e-30", "1e-4", "1", "inf", "nan", "-1", "-0", "1e308", "-inf", "x", "1e-4\n"]
)


def invalid_tolerance(opts: dict) -> str | None:
    for k in ("--rtol", "--atol"):
        v = _float(opts.get(k, "0"))
        if v is not None and (v != v or v < 0):
            return k
    return None


@examples(ci=15, fuzz=400)
@given(
    opts=st.fixed_dictionaries(
        {},
        optional={
            "--rtol": tolerances,
            "--atol": tolerances,
            "--trials": st.sampled_from(["1", "3", "0", "-1", "1001", "2.5"]),
        },
    )
)
def test_verify_options(root, good, opts):
    """`verify` with random --rtol, --atol, --trials: OK, a mismatch (exit 1),
    or one line; a NaN or negative tolerance is refused by name."""
    with workspace(root) as ws, fu.known_failures():
        onnx.save(good.model, ws / "model.onnx")
        args = [x for k, v in opts.items() for x in (k, v)]
        before = fu.snapshot(ws)
        out = invoke("verify", good.bundle, "--model", ws / "model.onnx", *args)
        check_outcome(out, codes=(0, 1, 2))
        assert not fu.changes(before, fu.snapshot(ws)), f"verify changed files\n{out}"
        bad = invalid_tolerance(opts)
        if bad:
            assert_refused(out, bad, opts[bad])


@examples(ci=6, fuzz=150)
@given(
    opts=st.fixed_dictionaries(
        {},
        optional={
            "--rtol": tolerances,
            "--atol": tolerances,
            "--trials": st.sampled_from(["1", "0", "-3", "101"]),
        },
    )
)
def test_optimize_tolerances(root, opts):
    """`optimize` with random --rtol, --atol, --trials: a bundle that computes
    the model, or one line and nothing written."""
    with workspace(root) as ws, fu.known_failures():
        model = fu.named_model()
        onnx.save(model, ws / "model.onnx")
        args = [x for k, v in opts.items() for x in (k, v)]
        before = fu.snapshot(ws)
        out = invoke("optimize", ws / "model.onnx", "-o", ws / "out.orch", *args)
        check_outcome(out)
        bad = invalid_tolerance(opts)
        if bad:
            assert_refused(out, bad, opts[bad])
        stray = fu.outside(fu.changes(before, fu.snapshot(ws)), ["out.orch"])
        assert not stray, f"touched outside the output: {stray}\n{out}"
        if out.code == 0:
            check_bundle_against_onnxruntime(ws / "out.orch", model, fu.feeds_for(model), out)
        else:
            assert not (ws / "out.orch").exists()


# -- command lines: run --input and --output-dir -------------------------------------


def make_input_files(ws: Path, feeds: dict) -> dict[str, Path]:
    """Input files of every kind `run --input` may be handed."""
    x, ids = feeds["x"], feeds["ids"]
    files = {
        "x.npy": x,
        "ids.npy": ids,
        "x64.npy": x.astype(np.float64),
        "xbig.npy": x.astype(">f4"),
        "xf.npy": np.asfortranarray(x),
        "xT.npy": x.T.copy(),
        "x0d.npy": np.float32(1.0),
        "ids32.npy": ids.astype(np.int32),
        "idsf.npy": ids * 1.0,
    }
    for name, arr in files.items():
        np.save(ws / name, arr)
    np.savez(ws / "arch.npz", x=x)
    (ws / "text.npy").write_text("1 2 3\n")
    (ws / "empty.npy").write_bytes(b"")
    np.save(ws / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (ws / "trunc.npy").write_bytes((ws / "x.npy").read_bytes()[:90])
    (ws / "dir.npy").mkdir()
    return {p.name: p for p in ws.iterdir()} | {"nope.npy": ws / "nope.npy"}


INPUT_FILES = [
    "x.npy",
    "ids.npy",
    "x64.npy",
    "xbig.npy",
    "xf.npy",
    "xT.npy",
    "x0d.npy",
    "ids32.npy",
    "idsf.npy",
    "arch.npz",
    "text.npy",
    "empty.npy",
    "obj.npy",
    "trunc.npy",
    "dir.npy",
    "nope.npy",
]
# arrays that hold the same values, in the dtype and shape the bundle declares
SAME_VALUES = {"x": {"x.npy", "xbig.npy", "xf.npy"}, "ids": {"ids.npy"}}
input_specs = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["x", "ids"]), st.sampled_from(INPUT_FILES)),
        st.tuples(
            st.sampled_from(["x", "ids", "X", "", "y", "x=1", " x"]), st.sampled_from(INPUT_FILES)
        ),
        st.sampled_from(["x", "=x.npy", "x=", "ids=="]).map(lambda s: (None, s)),
    ),
    max_size=4,
)
good_specs = st.permutations([("x", "x.npy"), ("ids", "ids.npy")])
OUTPUT_DIRS = [None, "outs", "existing", "file", "a/b", "blocked", "has-z", "bundle", "."]


def output_dir_target(ws: Path, bundle: Path, kind: str | None) -> Path | None:
    if kind is None:
        return None
    if kind == "existing":
        (ws / kind).mkdir()
    elif kind == "file":
        (ws / kind).write_text("not a folder\n")
    elif kind == "blocked":  # a folder stands where one output would go
        (ws / kind / "y.npy").mkdir(parents=True)
    elif kind == "has-z":
        (ws / kind).mkdir()
        (ws / kind / "z.npy").write_text("old\n")
        (ws / kind / "notes.txt").write_text("mine\n")
    elif kind == "bundle":
        return bundle
    elif kind == ".":
        return Path(".")
    return ws / kind


@examples(ci=20, fuzz=600)
@given(specs=good_specs | input_specs, out_kind=st.sampled_from(OUTPUT_DIRS))
def test_run_inputs_and_output_dir(root, good, specs, out_kind):
    """`run` with random --input NAME=FILE (wrong dtype, shape, byte order,
    archives, pickles, text, folders, missing, repeated) and --output-dir:
    the right outputs, all written; or one line and nothing written."""
    with workspace(root) as ws, fu.known_failures():
        bundle = ws / "b.orch"
        shutil.copytree(good.bundle, bundle)
        files = make_input_files(ws / "in", good.feeds) if (ws / "in").mkdir() is None else {}
        outdir = output_dir_target(ws, bundle, out_kind)
        args = []
        for name, f in specs:
            args += ["--input", f if name is None else f"{name}={files[f]}"]
        if outdir is not None:
            args += ["--output-dir", outdir]
        before = fu.snapshot(ws)
        out = invoke("run", bundle, *args, cwd=ws)
        check_outcome(out)
        after = fu.snapshot(ws)
        if out.code != 0:
            assert not fu.changes(before, after), f"a failed run changed files\n{out}"
            return
        names = [n for n, _ in specs]
        assert sorted(names) == ["ids", "x"], f"run accepted inputs {names}\n{out}"
        given_files = dict(specs)
        for name in ("x", "ids"):
            assert given_files[name] in SAME_VALUES[name], (
                f"run accepted {given_files[name]} for {name!r}\n{out}"
            )
        if outdir is None:
            assert not fu.changes(before, after), f"run without --output-dir wrote\n{out}"
            return
        rel = os.path.relpath(os.path.realpath(ws / outdir), os.path.realpath(ws))
        rel = "" if rel == "." else rel
        written = {os.path.join(rel, f"{k}.npy") for k in good.bundle_out}
        stray = fu.changes(before, after) - written - ({rel} if rel else set())
        assert not stray, f"run touched more than its outputs: {sorted(stray)}\n{out}"
        got = {k: np.load(ws / rel / f"{k}.npy") for k in good.bundle_out}
        fu.assert_close(got, good.ort_out, what=str(out))


# -- command lines: optimize -o ------------------------------------------------------

DESTINATIONS = [
    "new.orch",
    "earlier-bundle",
    "bundle-with-notes",
    "foreign-with-manifest",
    "empty-folder",
    "model-folder",
    "bundle-holding-model",
    "model-file",
    "regular-file",
    "link-to-foreign",
    "link-to-bundle",
    "missing-parent",
    "cwd",
    "weird\nname.orch",
    "trailing/",
]


def destination(ws: Path, good, kind: str) -> tuple[Path, Path, Path]:
    """(model path, -o path, cwd) for an -o of ``kind``."""
    models = ws / "models"
    models.mkdir()
    src = models / "model.onnx"
    cwd = ws / "cwd"
    cwd.mkdir()
    (cwd / "keep.txt").write_text("mine\n")
    if kind == "earlier-bundle":
        shutil.copytree(good.bundle, ws / "B")
        out = ws / "B"
    elif kind == "bundle-with-notes":
        shutil.copytree(good.bundle, ws / "B")
        (ws / "B" / "notes.txt").write_text("mine\n")
        out = ws / "B"
    elif kind == "foreign-with-manifest":
        (ws / "webapp").mkdir()
        (ws / "webapp" / "manifest.json").write_text('{"name": "my app"}\n')
        (ws / "webapp" / "index.html").write_text("<html></html>\n")
        out = ws / "webapp"
    elif kind == "empty-folder":
        (ws / "empty").mkdir()
        out = ws / "empty"
    elif kind == "model-folder":
        out = models
    elif kind == "bundle-holding-model":
        shutil.copytree(good.bundle, ws / "B")
        src = ws / "B" / "model.onnx"
        out = ws / "B"
    elif kind == "model-file":
        out = src
    elif kind == "regular-file":
        (ws / "file").write_text("mine\n")
        out = ws / "file"
    elif kind == "link-to-foreign":
        (ws / "webapp").mkdir()
        (ws / "webapp" / "manifest.json").write_text("{}\n")
        (ws / "link").symlink_to(ws / "webapp")
        out = ws / "link"
    elif kind == "link-to-bundle":
        shutil.copytree(good.bundle, ws / "B")
        (ws / "link").symlink_to(ws / "B")
        out = ws / "link"
    elif kind == "missing-parent":
        out = ws / "no" / "where.orch"
    elif kind == "cwd":
        out = Path(".")
    elif kind == "trailing/":
        out = Path(os.fspath(ws / "t.orch") + "/")
    else:
        out = ws / kind
    onnx.save(good.model, src)
    return src, out, cwd


def is_bundle(folder: Path) -> bool:
    return folder.is_dir() and sorted(p.name for p in folder.iterdir()) == sorted(fu.BUNDLE_FILES)


@examples(ci=15, fuzz=300)
@given(kind=st.sampled_from(DESTINATIONS))
def test_optimize_destinations(root, good, kind):
    """`optimize -o` at new, earlier-bundle, foreign, linked, model-holding
    places: an existing output is replaced only if it is a bundle; the model
    and every file of the user's survive; nothing is left half-written."""
    with workspace(root) as ws, fu.known_failures():
        src, out_path, cwd = destination(ws, good, kind)
        before = fu.snapshot(ws)
        model_rel = os.fspath(src.relative_to(ws))
        out = invoke("optimize", src, "-o", out_path, "--trials", "1", cwd=cwd)
        check_outcome(out)
        after = fu.snapshot(ws)
        assert before[model_rel] == after.get(model_rel), f"the model changed\n{out}"
        if out.code != 0:
            assert not fu.changes(before, after), f"a failed optimize changed files\n{out}"
            return
        target = Path(os.path.realpath(cwd / out_path))
        rel = os.path.relpath(target, os.path.realpath(ws))
        assert not rel.startswith(".."), f"wrote outside the workspace: {target}\n{out}"
        assert is_bundle(target), f"{target} is not a bundle\n{out}"
        allowed = {rel, os.path.relpath(cwd / out_path, ws)}
        stray = fu.outside(fu.changes(before, after), allowed)
        assert not stray, f"touched outside the output: {stray}\n{out}"
        lost = [
            k
            for k in before
            if k.startswith(rel + os.sep) and k not in after and Path(k).name not in fu.BUNDLE_FILES
        ]
        assert not lost, f"optimize deleted the user's files {lost}\n{out}"
        check_bundle_against_onnxruntime(target, good.model, good.feeds, out)


# -- run: gather indices out of range (a subprocess: a bad read can crash) -------------

REPO = Path(__file__).resolve().parent.parent
# runs each command line of argv[1] (JSON) in one process, one JSON line each
_BATCH = """
import json, sys
sys.path.insert(0, sys.argv[2])
from click.testing import CliRunner
from orchestrate import cli
for args in json.loads(sys.argv[1]):
    r = CliRunner().invoke(cli.main, args)
    exc = r.exception if not isinstance(r.exception, SystemExit) else None
    print(json.dumps([r.exit_code, r.stdout, r.stderr, repr(exc) if exc else None]), flush=True)
"""


def invoke_batch(commands: list[list], cwd: Path, timeout: float = 300) -> list[fu.Outcome]:
    """Command lines run in one child process (a crash kills the child, not
    the test run); a crash shows as exit -SIGNAL of the command it hit."""
    argv = [[os.fspath(a) for a in c] for c in commands]
    env = dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    p = subprocess.run(
        [sys.executable, "-c", _BATCH, json.dumps(argv), os.fspath(REPO)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    outs = []
    for args, line in zip(argv, p.stdout.splitlines()):
        code, stdout, stderr, exc = json.loads(line)
        outs.append(fu.Outcome(args, code, stdout, stderr, RuntimeError(exc) if exc else None))
    if len(outs) < len(argv):
        outs.append(fu.Outcome(argv[len(outs)], p.returncode, "", p.stderr, None))
    return outs


index_values = st.one_of(
    st.integers(-10, 9),
    st.sampled_from([10, 11, -11, -5000, 2**31, 2**40, 10**12, -(10**12), 2**63 - 1, -(2**63)]),
)


@examples(ci=0, fuzz=40)
@given(cases=st.lists(st.lists(index_values, min_size=4, max_size=4), min_size=1, max_size=6))
@example(
    cases=[
        [0, 9, -1, -10],
        [10, 0, 0, 0],
        [0, -11, 0, 0],
        [-5000, 0, 0, 0],
        [10**12, 0, 0, 0],
        [0, 0, 0, -(2**63)],
    ]
)
def test_run_gather_indices(root, good, cases):
    """`run` with ids in and out of [-10, 10) (the table has 10 rows): the
    onnxruntime answer, or one line naming the input; never a wrong answer,
    never a crash."""
    with workspace(root) as ws, fu.known_failures():
        np.save(ws / "x.npy", good.feeds["x"])
        commands = []
        for k, ids in enumerate(cases):
            np.save(ws / f"ids{k}.npy", np.array(ids, np.int64))
            commands.append(
                [
                    "run",
                    good.bundle,
                    "--input",
                    f"x={ws / 'x.npy'}",
                    "--input",
                    f"ids={ws / f'ids{k}.npy'}",
                    "--output-dir",
                    ws / f"outs{k}",
                ]
            )
        outs = invoke_batch(commands, cwd=ws)
        for k, (ids, out) in enumerate(zip(cases, outs)):
            check_outcome(out)
            if all(-10 <= i < 10 for i in ids):
                assert out.code == 0, f"in-range indices refused\n{out}"
                feeds = {"x": good.feeds["x"], "ids": np.array(ids, np.int64)}
                want = onnxrt.run(good.model, feeds)
                got = {n: np.load(ws / f"outs{k}" / f"{n}.npy") for n in want}
                fu.assert_close(got, want, what=str(out))
            else:
                assert out.code == 2, f"indices {ids} out of range accepted\n{out}"
                assert "ids" in out.error, f"the error does not name the input\n{out}"
                assert not (ws / f"outs{k}").exists()
        assert len(outs) == len(cases)


# -- regressions: the failures the properties found, minimised -----------------------
#
# Each was xfail(strict=True) while it was open: the fix made it pass, the
# strict mark then failed the suite, and the mark (with the matching entry of
# fu.KNOWN) came off.  All of F1-F11 are fixed; they stay as regressions.


def _user_error(out: fu.Outcome, *needles: str) -> None:
    check_outcome(out, codes=(2,))
    for n in needles:
        assert n in out.error, f"{n!r} not in the error\n{out}"


def _not_utf8(tmp_path: Path, old: bytes, new: bytes, names: fu.Names | None = None) -> Path:
    data = fu.named_model(names or fu.Names()).SerializeToString()
    assert old in data
    src = tmp_path / "m.onnx"
    src.write_bytes(data.replace(old, new))
    return src


# F1: fixed in issue 9
def test_node_name_not_utf8(tmp_path):
    src = _not_utf8(tmp_path, b"relu", b"\xe7elu")
    _user_error(invoke("optimize", src, "-o", tmp_path / "o.orch"), "m.onnx")
    assert not (tmp_path / "o.orch").exists()


# F1: fixed in issue 9
@pytest.mark.parametrize("command", ["inspect", "optimize"])
def test_tensor_name_not_utf8(tmp_path, command):
    src = _not_utf8(tmp_path, b"input_x", b"input_\xff", fu.Names(x="input_x"))
    args = ["-o", tmp_path / "o.orch"] if command == "optimize" else []
    _user_error(invoke(command, src, *args), "m.onnx")


def _unknown_output_dtype():
    m = fu.named_model()
    m.graph.output[0].type.tensor_type.elem_type = 67
    return m


# F2: fixed in issue 9
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_unknown_output_dtype, id="output-elem-type-67"),
        pytest.param(lambda: fu.named_model(fu.Names(mul="n", relu="n")), id="same-node-names"),
        pytest.param(lambda: _attr_model("CumSum", "reverse", -1, 17), id="cumsum-reverse-1"),
    ],
)
def test_model_onnxruntime_refuses(tmp_path, make):
    onnx.save(make(), tmp_path / "m.onnx")
    _user_error(invoke("optimize", tmp_path / "m.onnx", "-o", tmp_path / "o.orch"), "m.onnx")
    assert not (tmp_path / "o.orch").exists()


# F3 (fixed while this suite was written): a name outside the Basic
# Multilingual Plane was escaped as a surrogate pair in KERNELS -> exit 3
@pytest.mark.parametrize("field_name, name", [("x", "\U00010000"), ("y", "\U0001f600")])
def test_astral_plane_names(tmp_path, field_name, name):
    model = fu.named_model(fu.Names(**{field_name: name}))
    onnx.save(model, tmp_path / "m.onnx")
    out = invoke("optimize", tmp_path / "m.onnx", "-o", tmp_path / "o.orch", "--trials", "1")
    check_outcome(out, codes=(0,))
    check_bundle_against_onnxruntime(tmp_path / "o.orch", model, fu.feeds_for(model), out)


# F4: fixed in issue 9
def test_explain_plan_with_a_renamed_primitive(tmp_path):
    onnx.save(fu.named_model(), tmp_path / "m.onnx")
    assert invoke("plan", tmp_path / "m.onnx", "-o", tmp_path / "p.json").code == 0
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["primitives"][0]["name"] += "_renamed"
    (tmp_path / "p.json").write_text(json.dumps(doc))
    _user_error(invoke("explain", tmp_path / "p.json"), "p.json")


# F5 (fixed while this suite was written): a tensor with no elements ->
# ValueError in emission, exit 3
def test_empty_tensor(tmp_path):
    x = helper.make_tensor_value_info("x", fu.F32, [0])
    y = helper.make_tensor_value_info("y", fu.F32, [0])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "empty", [x], [y])
    onnx.save(fu.finish(g), tmp_path / "m.onnx")
    out = invoke("optimize", tmp_path / "m.onnx", "-o", tmp_path / "o.orch", "--trials", "1")
    check_outcome(out)
    assert not (tmp_path / "o.orch").exists() or out.code == 0


# F6: fixed in issue 9
@pytest.mark.parametrize(
    "args",
    [
        ["plan", "M", "-o", "P", "--max-kernel-nodes", "0"],
        ["verify", "B", "--model", "M", "--trials", "0"],
        ["plan", "M", "-o", "P", "--memory-budget", ""],
        ["run", "B", "--output-dir", "M"],
    ],
)
def test_click_usage_error_is_one_line(tmp_path, args):
    onnx.save(fu.named_model(), tmp_path / "m.onnx")
    (tmp_path / "b").mkdir()
    paths = {"M": tmp_path / "m.onnx", "P": tmp_path / "p.json", "B": tmp_path / "b"}
    _user_error(invoke(*[paths.get(a, a) for a in args]))


# F7: fixed in issue 9
@pytest.mark.parametrize("edit", ["data_type", "dims"])
def test_initializer_data_that_does_not_fit(tmp_path, edit):
    m = fu.named_model()
    if edit == "data_type":
        m.graph.initializer[0].data_type = onnx.TensorProto.INT8  # 32 bytes: 32 int8s, dims [8]
    else:
        m.graph.initializer[0].dims[0] = 4  # 8 floats of data
    onnx.save(m, tmp_path / "m.onnx")
    _user_error(invoke("inspect", tmp_path / "m.onnx"), "m.onnx", "'w'")


# F8: fixed in issue 9
@pytest.mark.parametrize("command", ["inspect", "optimize"])
def test_negative_dimension(tmp_path, command):
    x = helper.make_tensor_value_info("x", fu.F32, [2, -3])
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "neg",
        [x],
        [helper.make_tensor_value_info("y", fu.F32, None)],
    )
    onnx.save(fu.finish(g), tmp_path / "m.onnx")
    args = ["-o", tmp_path / "o.orch"] if command == "optimize" else []
    _user_error(invoke(command, tmp_path / "m.onnx", *args), "m.onnx", "'x'")


# F9: fixed in issue 9
@pytest.mark.parametrize("victim", ["manifest.json", "plan.json"])
def test_format_field_not_a_string(root, good, tmp_path, victim):
    bundle = tmp_path / "b.orch"
    shutil.copytree(good.bundle, bundle)
    doc = json.loads((bundle / victim).read_text())
    doc["format"] = {"a": 1}
    (bundle / victim).write_text(json.dumps(doc))
    fu.rehash(bundle)
    _user_error(invoke("run", bundle, "--input", "x=x.npy"), victim)
    if victim == "plan.json":
        _user_error(invoke("explain", bundle / victim), victim)


# F10: fixed in issue 9
def test_option_value_with_a_line_break(tmp_path):
    onnx.save(fu.named_model(), tmp_path / "m.onnx")
    out = invoke("plan", tmp_path / "m.onnx", "-o", tmp_path / "p.json", "--device", "h100\n")
    _user_error(out, "--device")


# F11: fixed in issue 9
def test_split_with_fewer_outputs_than_nodes(tmp_path):
    x = helper.make_tensor_value_info("x", fu.F32, [2, 3, 4])
    ys = [helper.make_tensor_value_info(f"y{k}", fu.F32, [1, 3, 4]) for k in range(2)]
    node = helper.make_node("Split", ["x"], ["y0", "y1"], axis=0, num_outputs=1)
    g = helper.make_graph([node], "split", [x], ys)
    onnx.save(fu.finish(g, opset=18, infer=False), tmp_path / "m.onnx")
    (out,) = invoke_batch([["inspect", tmp_path / "m.onnx"]], cwd=tmp_path)
    _user_error(out, "m.onnx")


# -- outputs that are inputs ----------------------------------------------------------

# Each command with the files it reads (by name in the workspace) and where
# its output goes; the output is aimed at one of the files it reads, a file
# of a bundle, or the measurement cache.
READS = {
    "plan": lambda t: ("plan", "model.onnx", "-o", t),
    "decompose": lambda t: ("decompose", "model.onnx", "-o", t),
    "explain": lambda t: ("explain", "b.orch/plan.json", "--picture", t),
    "bench": lambda t: ("bench", "b.orch", "--model", "model.onnx", "--runs", "1", "--json", t),
    "records": lambda t: ("records", "export", t, "--cache", "m.sqlite"),
    # x is read from y.npy, where --output-dir . would write the output y
    "run": lambda t: (
        "run",
        "b.orch",
        "--input",
        "x=y.npy",
        "--input",
        "ids=ids.npy",
        "--output-dir",
        t,
    ),
}
COLLIDING = {
    "plan": ["model.onnx", "b.orch/plan.json", "b.orch/manifest.json"],
    "decompose": ["model.onnx", "b.orch/weights.npz"],
    "explain": ["b.orch/plan.json", "b.orch/manifest.json", "b.orch/report.md"],
    "bench": ["model.onnx", "b.orch/plan.json", "b.orch/kernels.py", "m.sqlite"],
    "records": ["m.sqlite", "b.orch/manifest.json"],
    "run": ["b.orch", "."],
}


@examples(ci=10, fuzz=200)
@given(
    case=st.sampled_from([(c, t) for c, ts in sorted(COLLIDING.items()) for t in ts]),
    link=st.booleans(),
)
def test_no_output_is_a_file_the_command_reads(root, good, case, link):
    """An output aimed at a file the command reads, a bundle's file or the
    cache (directly, or through a symlink) is refused before any work, in
    one line, and nothing in the workspace changes."""
    from orchestrate.tune.cache import Cache

    command, target = case
    with workspace(root) as ws, fu.known_failures():
        shutil.copy(good.dir / "model.onnx", ws / "model.onnx")
        shutil.copytree(good.bundle, ws / "b.orch")
        np.save(ws / "ids.npy", good.feeds["ids"])
        np.save(ws / "y.npy", good.feeds["x"])
        Cache(ws / "m.sqlite").close()
        aimed = ws / target
        if link and target != ".":
            (ws / "alias").symlink_to(aimed)
            aimed = ws / "alias"
        before = fu.snapshot(ws)
        old = os.getcwd()
        os.chdir(ws)  # the commands name the workspace's files relatively
        try:
            out = invoke(*READS[command](os.fspath(aimed)))
        finally:
            os.chdir(old)
        check_outcome(out, codes=(2,))
        assert not fu.changes(before, fu.snapshot(ws)), f"a refused {command} changed files\n{out}"


# -- threads ----------------------------------------------------------------------------


@examples(ci=3, fuzz=50)
@given(
    threads=st.integers(2, 16),
    seeds=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=4),
)
def test_concurrent_runs_each_get_their_own_answer(good, threads, seeds):
    """Threads sharing one loaded bundle, each with inputs of its own (some
    sharing a seed, so equal inputs): every answer the reference's."""
    from concurrent.futures import ThreadPoolExecutor

    bundle = orchestrate.load(good.bundle)
    feeds = [fu.gather_inputs(seed) for seed in seeds]
    want = [onnxrt.run(good.model, f) for f in feeds]

    def runs(k: int) -> int:
        i = k % len(feeds)
        wrong = 0
        for _ in range(3):
            got = bundle.run(feeds[i])
            wrong += any(not np.allclose(got[n], want[i][n], rtol=1e-5, atol=1e-6) for n in want[i])
        return wrong

    with ThreadPoolExecutor(threads) as pool:
        assert sum(pool.map(runs, range(threads))) == 0
