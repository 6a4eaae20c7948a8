"""An ONNX model as the graph description a measurement row carries.

The description (data/measurements/README.md has the schema) holds what a
cost model reads: the ops, their attributes and wiring, every tensor's shape
and dtype, and the values of small tensors only (at most ``KEEP`` elements:
shape tensors, axes, scalars).  ``orchestrate.cost.measurements.model``
rebuilds an ONNX model from it with random weights.  Intermediate tensors are
renamed ``t0``, ``t1``, ... in node order (the exporter's names are long and
say nothing a row needs); inputs, outputs and initializers keep theirs.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from tools.measurements.export import KEEP

LISTS = {
    AttributeProto.INTS: "ints",
    AttributeProto.FLOATS: "floats",
    AttributeProto.STRINGS: "strings",
}


def dtype_name(elem_type: int) -> str:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name


def _number(x):
    """A JSON-safe number: non-finite floats as the strings inf, -inf, nan."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def tensor(t: onnx.TensorProto) -> dict:
    """A tensor's dtype and shape, and its values when it has at most ``KEEP``
    elements (and has them: a stripped export's large tensors have none)."""
    out = {"dtype": dtype_name(t.data_type), "shape": list(t.dims)}
    if math.prod(t.dims) <= KEEP:
        values = numpy_helper.to_array(t).reshape(-1)
        if values.dtype.kind == "f":  # float32's shortest text, not float64's
            out["values"] = [_number(float(str(x))) for x in values]
        else:
            out["values"] = values.tolist()
    return out


def attribute(a: AttributeProto):
    """An attribute's value as JSON: a number, string or list as such, and
    in the typed form ``{"float": "inf"}``, ``{"ints": []}`` where the plain one
    would be ambiguous (a non-finite float, an empty list); a tensor as
    ``{"tensor": {...}}``."""
    if a.type == AttributeProto.INT:
        return a.i
    if a.type == AttributeProto.FLOAT:
        return float(a.f) if math.isfinite(a.f) else {"float": _number(float(a.f))}
    if a.type == AttributeProto.STRING:
        return a.s.decode()
    if a.type == AttributeProto.TENSOR:
        return {"tensor": tensor(a.t)}
    if a.type in LISTS:
        values = list(helper.get_attribute_value(a))
        if a.type == AttributeProto.STRINGS:
            values = [v.decode() for v in values]
        elif a.type == AttributeProto.FLOATS:
            values = [_number(float(v)) for v in values]
            if not all(isinstance(v, float) for v in values):
                return {"floats": values}
        return values if values else {LISTS[a.type]: []}
    raise ValueError(f"attribute {a.name} of type {AttributeProto.AttributeType.Name(a.type)}")


def _value(v: onnx.ValueInfoProto, name: str) -> dict:
    t = v.type.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim]
    return {"name": name, "dtype": dtype_name(t.elem_type), "shape": shape}


def describe(model: onnx.ModelProto) -> dict:
    """``model``'s graph description (JSON-ready)."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    keep = {v.name for v in g.input} | {v.name for v in g.output} | inits | {""}
    names: dict[str, str] = {}

    def short(name: str) -> str:
        if name in keep:
            return name
        return names.setdefault(name, f"t{len(names)}")

    nodes = []
    for n in g.node:
        node = {"op": n.op_type, "inputs": [short(x) for x in n.input]}
        node["outputs"] = [short(x) for x in n.output]
        if n.domain not in ("", "ai.onnx"):
            node["domain"] = n.domain
        if n.attribute:
            node["attrs"] = {a.name: attribute(a) for a in n.attribute}
        nodes.append(node)
    return {
        "opsets": {(o.domain or ""): o.version for o in model.opset_import},
        "inputs": [_value(v, v.name) for v in g.input if v.name not in inits],
        "outputs": [_value(v, v.name) for v in g.output],
        "initializers": [{"name": t.name, **tensor(t)} for t in g.initializer],
        "nodes": nodes,
    }
