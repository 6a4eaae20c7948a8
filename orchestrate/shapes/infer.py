"""Symbolic shape inference over an ONNX model.

``infer_shapes(model, shapes, dims)`` binds the inputs' dimensions to
constants and symbols (binding.py), then walks the nodes in order applying
each op's rule (ops.py).  A node it cannot express symbolically is declined:
the result lists every declined node with a one-line reason, and the values
that depend on it have no shape, instead of one exception stopping at the
first.  Nothing in planning reads this yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from orchestrate.errors import InputError
from orchestrate.frontend import DEFAULT_DOMAINS, graph_inputs
from orchestrate.frontend.weights import array as initializer_array
from orchestrate.shapes.binding import bind_inputs
from orchestrate.shapes.dims import DimRange
from orchestrate.shapes.ops import RULES
from orchestrate.shapes.poly import Poly
from orchestrate.shapes.rules import DATA_LIMIT, INT_TYPES, Decline, Rules, Value

Shape = tuple[Poly, ...]


@dataclass(frozen=True)
class Declined:
    """A node with no symbolic shape rule, or whose result is not affine."""

    node: str
    op: str
    reason: str

    def __str__(self) -> str:
        return f"node {self.node!r} ({self.op}): {self.reason}"


@dataclass(frozen=True)
class SymbolicShapes:
    """The result: ``ranges`` of the declared symbols, ``values`` every
    tensor whose shape was inferred, ``outputs`` the graph outputs in order,
    ``declined`` the nodes it could not express (empty when all went through)."""

    ranges: Mapping[str, DimRange]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    values: Mapping[str, Value]
    declined: tuple[Declined, ...]

    def shape(self, name: str) -> Shape | None:
        v = self.values.get(name)
        return v.shape if v is not None else None

    def at(self, name: str, binding: Mapping[str, int]) -> tuple[int, ...] | None:
        """The concrete shape of ``name`` when each symbol takes ``binding``'s value."""
        s = self.shape(name)
        return None if s is None else tuple(d.evaluate(binding) for d in s)


def infer_shapes(
    model: onnx.ModelProto,
    shapes: Mapping[str, tuple[DimRange, ...]] | None = None,
    dims: Mapping[str, DimRange] | None = None,
    source: str = "<model>",
) -> SymbolicShapes:
    """Symbolic shapes of every value of ``model`` (see the module doc).
    InputError (naming the flag) for a binding that does not fit the model."""
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as e:  # noqa: BLE001 - as the frontend: a bad model
            raise InputError(f"{source}: cannot inline local functions ({e})") from None
    g = model.graph
    inputs = graph_inputs(model)
    bound, ranges = bind_inputs(inputs, shapes or {}, dims or {}, source)
    values: dict[str, Value] = {}
    for vi in inputs:
        values[vi.name] = Value(bound[vi.name], vi.type.tensor_type.elem_type)
    for t in g.initializer:
        values[t.name] = _tensor_value(t)
    rules = Rules(ranges)
    declined = []
    for k, node in enumerate(g.node):
        label = node.name or f"{node.op_type}_{k}"
        ins = [values.get(i) if i else None for i in node.input]
        if any(i and values.get(i) is None for i in node.input):
            continue  # downstream of a declined node: its cause is listed already
        try:
            outs = _apply(rules, node, ins)
        except Decline as e:
            declined.append(Declined(label, node.op_type, str(e)))
            continue
        for name, v in zip(node.output, outs):
            if name:
                values[name] = v
    return SymbolicShapes(
        ranges=dict(ranges),
        inputs=tuple(vi.name for vi in inputs),
        outputs=tuple(o.name for o in g.output),
        values=values,
        declined=tuple(declined),
    )


class _Node:
    """A NodeProto's op, inputs, outputs and attributes as Python values."""

    def __init__(self, node: onnx.NodeProto):
        self.op_type = node.op_type
        self.input = list(node.input)
        self.output = list(node.output)
        self.attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _apply(rules: Rules, node: onnx.NodeProto, ins: list[Value | None]) -> list[Value]:
    if node.domain not in DEFAULT_DOMAINS:
        raise Decline(f"domain {node.domain!r} has no symbolic shape rules")
    if node.op_type == "Constant":
        return [_constant(node)]
    rule = RULES.get(node.op_type)
    if rule is None:
        raise Decline(f"no symbolic shape rule for {node.op_type}")
    n = _Node(node)
    try:
        return rule(rules, n, ins)
    except (IndexError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise Decline(
            f"inputs or attributes the rule does not read ({type(e).__name__}: {e})"
        ) from None


def _constant(node: onnx.NodeProto) -> Value:
    a = node.attribute[0]
    if a.name == "value":
        return _tensor_value(a.t)
    value = onnx.helper.get_attribute_value(a)
    if a.name in ("value_int", "value_ints"):
        vals = [value] if a.name == "value_int" else list(value)
        shape = () if a.name == "value_int" else (Poly.of(len(vals)),)
        return Value(shape, onnx.TensorProto.INT64, tuple(map(Poly.of, vals)))
    shape = () if a.name in ("value_float", "value_string") else (Poly.of(len(value)),)
    return Value(shape, onnx.TensorProto.FLOAT)


def _tensor_value(t: onnx.TensorProto) -> Value:
    shape = tuple(Poly.of(int(d)) for d in t.dims)
    data = None
    count = 1
    for d in t.dims:
        count *= d
    if t.data_type in INT_TYPES and len(t.dims) <= 1 and count <= DATA_LIMIT:
        data = tuple(Poly.of(int(x)) for x in initializer_array(t).reshape(-1))
    return Value(shape, t.data_type, data)


def shape_text(shape: Shape | None) -> str:
    """``[batch, seq, 64]``, or ``unknown``."""
    return "unknown" if shape is None else "[" + ", ".join(map(str, shape)) + "]"
