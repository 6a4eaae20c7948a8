"""Measured run times of whole programs on named GPUs, to check the cost model against.

A measurement file is JSON lines, one row per (GPU, runtime, program, sizes):
the program as a graph description (its ops, wiring, shapes and dtypes; the
values of small tensors only), where it ran (``gpu``, a row of
``orchestrate.cost.devices``; ``hardware``, the name the GPU gave), how
(``runtime``: "eager", "torch.compile:<mode>", "orchestrate", a library's
name) and how long (``time_ms``, the mean), with its ``source``.
data/measurements/README.md has the schema and the published rows.

``load(path)`` reads a file or a folder of ``*.jsonl`` (or ``*.jsonl.gz``: the
published rows repeat their graphs, which gzip shrinks many times over); a
malformed row is an ``InputError`` naming the file, the line and the field.
``model(m)`` rebuilds a row's program as an ONNX model with random weights for
the planner.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from orchestrate.cost.devices import DEVICES
from orchestrate.errors import InputError

KINDS = ("matmul", "conv", "elementwise", "reduction", "pooling", "attention", "fused", "model")

MATMULS = {"MatMul", "Gemm", "Einsum", "MatMulInteger", "QLinearMatMul"}
ANCHORS = MATMULS | {"Conv", "ConvTranspose", "QLinearConv", "LSTM", "GRU", "RNN"}
POOLING = {"MaxPool", "AveragePool", "LpPool", "GlobalMaxPool", "GlobalAveragePool"}
POOLING |= {"GlobalLpPool", "MaxUnpool"}
REDUCTIONS = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1"}
REDUCTIONS |= {"ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax"}
REDUCTIONS |= {"ArgMin", "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization"}
REDUCTIONS |= {"InstanceNormalization", "LpNormalization", "CumSum", "TopK", "Hardmax"}
# ops that move or describe data without computing on it
GLUE = {"Constant", "Identity", "Shape", "Size", "Reshape", "Flatten", "Squeeze", "Unsqueeze"}
GLUE |= {"Transpose", "Cast", "Expand", "ConstantOfShape", "Range", "Concat", "Slice", "Gather"}


def kind_of(graph: dict) -> str:
    """The kind of program a graph description is, from its ops alone.

    An anchor is a matmul, convolution or recurrent op.  Three or more anchors
    make a ``model``; two matmuls and a softmax an ``attention``; two anchors,
    or one with any op beyond data movement (reshape, transpose, ...), a
    ``fused`` program; one anchor alone is ``matmul`` or ``conv``.  Without an
    anchor: ``pooling`` if there is a pooling op, else ``reduction`` if a
    reduction or normalization, else ``elementwise``.  (BatchNormalization
    counts as a reduction only in training mode, where it computes statistics.)
    """
    ops = [n["op"] for n in graph["nodes"]]
    anchors = [op for op in ops if op in ANCHORS]
    matmuls = sum(op in MATMULS for op in ops)
    if len(anchors) >= 3:
        return "model"
    if matmuls >= 2 and "Softmax" in ops:
        return "attention"
    others = [op for op in ops if op not in ANCHORS and op not in GLUE]
    if len(anchors) == 2 or (anchors and others):
        return "fused"
    if anchors:
        return "matmul" if anchors[0] in MATMULS else "conv"
    training = any(n.get("attrs", {}).get("training_mode") == 1 for n in graph["nodes"])
    if any(op in POOLING for op in ops):
        return "pooling"
    if any(op in REDUCTIONS for op in ops) or ("BatchNormalization" in ops and training):
        return "reduction"
    return "elementwise"


@dataclass(frozen=True)
class Source:
    """Where a figure was published or recorded."""

    repo: str  # "ScalingIntelligence/KernelBench", or this project for its own runs
    commit: str = ""
    timing: str = ""  # the file holding the figure
    problem: str = ""  # the program's file
    problem_sha256: str = ""


@dataclass(frozen=True)
class Measurement:
    id: str
    program: str
    suite: str
    level: int | None
    kind: str  # one of KINDS, by ``kind_of``
    dtype: str
    gpu: str  # a key of orchestrate.cost.devices.DEVICES
    hardware: str  # the GPU's own name for itself
    runtime: str
    time_us: float  # the mean
    min_us: float | None
    trials: int | None
    source: Source
    graph: dict = field(compare=False, hash=False, repr=False)


class _Row:
    """One line's fields, read with its place for the refusals."""

    def __init__(self, data, where: str):
        if not isinstance(data, dict):
            raise InputError(f"{where}: a row is a JSON object")
        self.data, self.where = data, where

    def bad(self, name: str, problem: str) -> InputError:
        return InputError(f"{self.where}: {name}: {problem}")

    def get(self, name: str, kind, required: bool = True):
        value = self.data.get(name)
        if value is None and not required:
            return None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            what = "missing" if value is None else f"{type(value).__name__}, not {kind.__name__}"
            raise self.bad(name, what)
        return value


def _tensor_type(name) -> bool:
    try:
        return isinstance(name, str) and bool(helper.np_dtype_to_tensor_dtype(np.dtype(name)))
    except (TypeError, KeyError):
        return False


NONFINITE = ("inf", "-inf", "nan")  # a float value JSON cannot write, as a string
TAGS = {"int", "float", "string", "ints", "floats", "strings", "tensor"}


def _is_float(x) -> bool:
    return (isinstance(x, int | float) and not isinstance(x, bool)) or x in NONFINITE


def _check_tensor(t, name: str, bad) -> None:
    """A described tensor: a dtype, a shape and, if any, as many values."""
    if not isinstance(t.get("shape"), list) or not all(
        isinstance(d, int | str) and not isinstance(d, bool) for d in t["shape"]
    ):
        raise bad(f"{name}.shape", "not a list of sizes")
    if not _tensor_type(t.get("dtype")):
        raise bad(f"{name}.dtype", f"{t.get('dtype')!r} is not a tensor type")
    values = t.get("values")
    if values is None:
        return
    kind = np.dtype(t["dtype"]).kind
    fits = {"f": _is_float, "b": lambda x: isinstance(x, bool)}.get(
        kind, lambda x: isinstance(x, int) and not isinstance(x, bool)
    )
    if not isinstance(values, list) or not all(map(fits, values)):
        raise bad(f"{name}.values", f"not a list of {t['dtype']} values")
    if len(values) != math.prod(d if isinstance(d, int) else -1 for d in t["shape"]):
        raise bad(f"{name}.values", f"{len(values)} values for the shape {t['shape']}")


def _check_attribute(v, name: str, bad) -> None:
    if isinstance(v, dict):
        if len(v) != 1 or next(iter(v)) not in TAGS:
            raise bad(name, f"a typed value is one of {sorted(TAGS)}")
        ((tag, v),) = v.items()
        if tag == "tensor":
            if not isinstance(v, dict):
                raise bad(f"{name}.tensor", "not an object")
            return _check_tensor(v, f"{name}.tensor", bad)
        v = v if tag.endswith("s") else [v]
        if not isinstance(v, list):
            raise bad(f"{name}.{tag}", "not a list")
    elif not isinstance(v, list):
        v = [v]
    if not (
        all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        or all(map(_is_float, v))
        or all(isinstance(x, str) for x in v)
    ):
        raise bad(name, "not a number, a string or a list of one of them")


def _check_graph(g, bad) -> None:
    """Refuse a graph description that ``model`` could not rebuild."""
    if not isinstance(g, dict):
        raise bad("graph", "not an object")
    for part in ("inputs", "outputs", "initializers", "nodes"):
        if not isinstance(g.get(part), list):
            raise bad(f"graph.{part}", "missing or not a list")
    if not isinstance(g.get("opsets"), dict) or not g["opsets"]:
        raise bad("graph.opsets", "missing or empty")
    for part in ("inputs", "outputs", "initializers"):
        for i, v in enumerate(g[part]):
            if not isinstance(v, dict) or not isinstance(v.get("name"), str):
                raise bad(f"graph.{part}[{i}]", "no name")
            _check_tensor(v, f"graph.{part}[{i}]", bad)
    for i, n in enumerate(g["nodes"]):
        if not isinstance(n, dict) or not isinstance(n.get("op"), str):
            raise bad(f"graph.nodes[{i}].op", "missing")
        for part in ("inputs", "outputs"):
            if not isinstance(n.get(part), list) or not all(isinstance(x, str) for x in n[part]):
                raise bad(f"graph.nodes[{i}].{part}", "not a list of names")
        if not isinstance(n.get("attrs", {}), dict):
            raise bad(f"graph.nodes[{i}].attrs", "not an object")
        for key, v in n.get("attrs", {}).items():
            _check_attribute(v, f"graph.nodes[{i}].attrs.{key}", bad)


def _measurement(data, where: str) -> Measurement:
    r = _Row(data, where)
    gpu = r.get("gpu", str)
    if gpu not in DEVICES:
        raise r.bad("gpu", f"{gpu!r} is not a device orchestrate knows ({', '.join(DEVICES)})")
    time_ms = r.get("time_ms", float)
    if not math.isfinite(time_ms) or time_ms <= 0:
        raise r.bad("time_ms", f"{time_ms} is not a positive time")
    min_ms = r.get("min_ms", float, required=False)
    if min_ms is not None and not 0 <= min_ms <= time_ms:
        raise r.bad("min_ms", f"{min_ms} is not a time between 0 and time_ms")
    level = r.get("level", int, required=False)
    src = _Row(r.get("source", dict), f"{where}: source")
    source = Source(
        src.get("repo", str),
        *(src.get(k, str, required=False) or "" for k in ("commit", "timing", "problem")),
        src.get("problem_sha256", str, required=False) or "",
    )
    graph = r.get("graph", dict)
    _check_graph(graph, r.bad)
    return Measurement(
        r.get("id", str),
        r.get("program", str),
        r.get("suite", str),
        level,
        kind_of(graph),
        r.get("dtype", str),
        gpu,
        r.get("hardware", str),
        r.get("runtime", str),
        time_ms * 1000.0,
        None if min_ms is None else min_ms * 1000.0,
        r.get("trials", int, required=False),
        source,
        graph,
    )


def load(path: str | Path) -> tuple[Measurement, ...]:
    """The measurements in a ``.jsonl`` file (or ``.jsonl.gz``, gzipped), or
    in every such file of a folder."""
    path = Path(path)
    if path.is_dir():
        files = sorted([*path.glob("*.jsonl"), *path.glob("*.jsonl.gz")])
    elif path.is_file():
        files = [path]
    else:
        raise InputError(f"{path}: no such file or folder of measurements")
    out, seen = [], {}
    for file in files:
        opener = gzip.open if file.suffix == ".gz" else open
        with opener(file, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{file}:{number}"
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{where}: not JSON ({e.msg})") from None
                m = _measurement(data, where)
                if m.id in seen:
                    raise InputError(f"{where}: id: {m.id!r} is also the id on {seen[m.id]}")
                seen[m.id] = where
                out.append(m)
    return tuple(out)


def _number(x) -> float:
    return float(x)  # "inf", "-inf" and "nan" as float() reads them


def _array(t: dict, rng: np.random.Generator, positive: bool = False) -> np.ndarray:
    """A described tensor: its values, else random ones of its shape (floats
    uniform in [-1, 1), or [0.5, 1.5) where ``positive``; integers 0)."""
    dtype, shape = np.dtype(t["dtype"]), tuple(t["shape"])
    if "values" in t:
        values = [_number(v) for v in t["values"]] if dtype.kind == "f" else t["values"]
        return np.asarray(values, dtype=dtype).reshape(shape)
    if dtype.kind != "f":
        return np.zeros(shape, dtype)
    low = 0.5 if positive else -1.0
    return rng.uniform(low, low + (1.0 if positive else 2.0), shape).astype(dtype)


def _attribute(name: str, value, rng: np.random.Generator) -> onnx.AttributeProto:
    if isinstance(value, dict):  # the typed form
        ((tag, v),) = value.items()
        if tag == "tensor":
            return helper.make_attribute(name, numpy_helper.from_array(_array(v, rng)))
        types = {"int": onnx.AttributeProto.INT, "float": onnx.AttributeProto.FLOAT}
        types |= {"ints": onnx.AttributeProto.INTS, "floats": onnx.AttributeProto.FLOATS}
        types |= {"string": onnx.AttributeProto.STRING, "strings": onnx.AttributeProto.STRINGS}
        if tag in ("float", "floats"):
            v = _number(v) if tag == "float" else [_number(x) for x in v]
        return helper.make_attribute(name, v, attr_type=types[tag])
    return helper.make_attribute(name, value)


def model(m: Measurement, seed: int = 0) -> onnx.ModelProto:
    """``m``'s program as an ONNX model (checked), weights drawn from ``seed``:
    a BatchNormalization's variance positive, every other float in [-1, 1)."""
    g, rng = m.graph, np.random.default_rng(seed)
    norms = [n["inputs"] for n in g["nodes"] if n["op"] == "BatchNormalization"]
    variances = {inputs[4] for inputs in norms if len(inputs) == 5}

    def value(v: dict) -> onnx.ValueInfoProto:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(v["dtype"]))
        return helper.make_tensor_value_info(v["name"], elem, v["shape"])

    inits = [
        numpy_helper.from_array(_array(t, rng, t["name"] in variances), t["name"])
        for t in g["initializers"]
    ]
    nodes = []
    # each node named by its op and place (fission's label for an unnamed one), so
    # that the name survives the frontend folding the constants before it
    for i, n in enumerate(g["nodes"]):
        name = f"{n['op']}_{i}"
        node = helper.make_node(
            n["op"], n["inputs"], n["outputs"], name=name, domain=n.get("domain", "")
        )
        node.attribute.extend(_attribute(k, v, rng) for k, v in n.get("attrs", {}).items())
        nodes.append(node)
    graph = helper.make_graph(
        nodes, m.program, [value(v) for v in g["inputs"]], [value(v) for v in g["outputs"]], inits
    )
    opsets = [helper.make_opsetid(d, v) for d, v in g["opsets"].items()]
    out = helper.make_model(graph, opset_imports=opsets)
    out.ir_version = helper.find_min_ir_version_for(opsets)
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception as e:  # noqa: BLE001  (checker and shape-inference errors alike)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{m.id}: the graph does not make a valid ONNX model ({first})") from None
    return out
