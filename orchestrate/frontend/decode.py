"""A decode step's interface, and the same step over a cache kept in place.

A decode step (``examples/decode.py`` exports three) takes one new token and
the key/value cache of the earlier ones and returns the next token's logits
and the cache grown by one row. Its interface is found by name
(``decode_io``): ``input_ids`` [1, 1]; ``attention_mask`` [1, past + 1];
one or more ``past*`` inputs, each returned grown as the ``present*`` output
of the same suffix (``past_k`` -> ``present_k``, ``past_key_values.0.key`` ->
``present.0.key``); and ``logits`` (or the one other output).

Such a step copies its whole cache every token: ``present = Concat(past,
new)`` reads and writes every row. ``in_place`` rewrites the step into the
form onnxruntime GenAI calls past_present_share_buffer: each ``past*``
input becomes a buffer of ``capacity`` rows along the axis that grows, of
which a step reads the first ``past`` (a Slice for each reader, so each
reader reads it where it is: the attention reads its keys from the buffer);
each ``present*`` output becomes the new row only (``present[..., past:past
+ 1, ...]``, which fission takes from the concatenated row itself, not from
the concatenation). The caller writes that row into the buffer at ``past``:
one row per cache per step, whatever the past length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from orchestrate.errors import InputError
from orchestrate.frontend import graph_inputs
from orchestrate.shapes.poly import Poly, parse_dim_expression
from orchestrate.text import shown


@dataclass(frozen=True)
class DecodeIO:
    """Which inputs and outputs of a step are which."""

    ids: str
    mask: str
    caches: tuple[tuple[str, str], ...]  # (past input, present output)
    logits: str


def _suffix(name: str, prefixes: Sequence[str]) -> str | None:
    for p in prefixes:
        if name.startswith(p):
            return name[len(p) :]
    return None


def decode_io(inputs: Sequence[str], outputs: Sequence[str], where: str) -> DecodeIO:
    """The decode interface of a step with these inputs and outputs, or an
    InputError naming what is missing (``where``: the bundle or model)."""
    missing = [n for n in ("input_ids", "attention_mask") if n not in inputs]
    presents = {_suffix(o, ("present",)): o for o in outputs if o.startswith("present")}
    caches = []
    for name in inputs:
        suffix = _suffix(name, ("past_key_values", "past"))
        if suffix is None:
            continue
        if suffix not in presents:
            raise InputError(
                f"{where}: cache input {shown(name)} has no present{shown(suffix)} output "
                "to feed back"
            )
        caches.append((name, presents[suffix]))
    others = [o for o in outputs if o not in presents.values()]
    logits = "logits" if "logits" in others else (others[0] if len(others) == 1 else None)
    if missing or not caches or logits is None:
        lacks = missing + (["a past* cache input"] if not caches else [])
        lacks += ["a logits output"] if logits is None else []
        raise InputError(
            f"{where}: not a decode step: it has no {', no '.join(lacks)} "
            "(see examples/decode.py for the interface)"
        )
    return DecodeIO("input_ids", "attention_mask", tuple(caches), logits)


@dataclass(frozen=True)
class InPlace:
    """The step rewritten over caches kept in place: ``model``; ``axis``, per
    cache input, the axis that grows; ``past``, the symbol of the past length;
    ``capacity``, the rows each buffer holds along that axis."""

    model: onnx.ModelProto
    io: DecodeIO
    axis: tuple[tuple[str, int], ...]
    past: str
    capacity: int
    length: tuple[str, int, int]  # (the input, its axis, c) whose axis is past + c


def _dims(vi: onnx.ValueInfoProto) -> list[Poly | None]:
    """Each axis of a declared tensor as a formula: a number, a name, an
    expression of names (``past + 1``); None where it has neither."""
    out = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            out.append(Poly.of(d.dim_value))
        elif d.dim_param:
            out.append(parse_dim_expression(d.dim_param) or Poly.of(d.dim_param))
        else:
            out.append(None)
    return out


def growing_axis(past: onnx.ValueInfoProto, present: onnx.ValueInfoProto) -> tuple[int, str] | str:
    """(the axis, the symbol of the past length) along which ``present`` is
    ``past`` grown by one row, or why there is none."""
    a, b = _dims(past), _dims(present)
    if len(a) != len(b) or any(x is None for x in a + b):
        return f"{shown(past.name)} and {shown(present.name)} do not declare shapes of one rank"
    grows = [k for k, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(grows) != 1:
        return (
            f"{shown(present.name)} differs from {shown(past.name)} on {len(grows)} axes, "
            "not on one"
        )
    (k,) = grows
    x = a[k]
    terms = x.linear
    if terms is None or len(terms) != 1 or terms[0][1] != 1 or x.const != 0 or b[k] != x + 1:
        return (
            f"{shown(present.name)} axis {k} is not {shown(past.name)}'s axis {k} "
            f"plus one row ({b[k]} against {x})"
        )
    return k, terms[0][0]


def _length_source(model: onnx.ModelProto, caches: set[str], past: str):
    """(an input, its axis, c) whose axis is ``past + c``, outside the caches:
    where the rewritten step reads its past length."""
    for vi in graph_inputs(model):
        if vi.name in caches:
            continue
        for k, p in enumerate(_dims(vi)):
            if p is not None and p.linear == ((past, 1),):
                return vi.name, k, p.const
    return None


def in_place(model: onnx.ModelProto, io: DecodeIO, capacity: int) -> InPlace | str:
    """The step over caches kept in buffers of ``capacity`` rows (see the
    module doc), or why this step cannot be rewritten so."""
    g = model.graph
    inputs = {vi.name: vi for vi in graph_inputs(model)}
    outputs = {vi.name: vi for vi in g.output}
    axes, symbols = {}, set()
    for past, present in io.caches:
        found = growing_axis(inputs[past], outputs[present])
        if isinstance(found, str):
            return found
        axes[past], symbol = found
        symbols.add(symbol)
    if len(symbols) != 1:
        return (
            f"the caches grow along {len(symbols)} different lengths ({', '.join(sorted(symbols))})"
        )
    (symbol,) = symbols
    length = _length_source(model, set(axes), symbol)
    if length is None:
        return (
            f"no input other than the caches has an axis {shown(symbol)} + c to read the "
            "past length from (the attention mask's [1, past + 1] is one)"
        )
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    taken = {v for n in g.node for v in (*n.input, *n.output)} | {i.name for i in g.initializer}
    taken |= {vi.name for vi in (*g.input, *g.output)}

    def fresh(stem: str) -> str:
        name, k = f"in_place/{stem}", 2
        while name in taken:
            name, k = f"in_place/{stem}_{k}", k + 1
        taken.add(name)
        return name

    def const(stem: str, values) -> str:
        name = fresh(stem)
        g.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    holder, axis, c = length
    shape, at, upto = fresh("shape"), const("at", [axis]), const("upto", [axis + 1])
    span, one, zero = fresh("span"), const("one", [1]), const("zero", [0])
    rows, next_rows = fresh("past"), fresh("past_plus_one")
    head = [
        helper.make_node("Shape", [holder], [shape]),
        helper.make_node("Slice", [shape, at, upto], [span]),
        helper.make_node("Sub", [span, const("c", [c])], [rows]),
        helper.make_node("Add", [rows, one], [next_rows]),
    ]
    before: dict[int, list[onnx.NodeProto]] = {}  # each reader's slice goes just before it
    tail = []
    for past, present in io.caches:
        a = const("axis", [axes[past]])
        readers, whole = 0, None
        for i, n in enumerate(g.node):
            for k, x in enumerate(n.input):
                if x == past:
                    view = fresh(f"{past}_rows")
                    before.setdefault(i, []).append(
                        helper.make_node("Slice", [past, zero, rows, a], [view])
                    )
                    n.input[k] = view
                    readers += 1
            for k, x in enumerate(n.output):
                if x == present:
                    n.output[k] = whole = fresh(f"{present}_whole")
        if not readers or whole is None:
            return f"{shown(present)} is not computed from the cache input {shown(past)}"
        tail.append(helper.make_node("Slice", [whole, rows, next_rows, a], [present]))
        dim = next(vi for vi in g.input if vi.name == past).type.tensor_type.shape.dim[axes[past]]
        dim.Clear()
        dim.dim_value = capacity
        out = outputs[present].name
        dim = next(vi for vi in g.output if vi.name == out).type.tensor_type.shape.dim[axes[past]]
        dim.Clear()
        dim.dim_value = 1
    body = [m for i, n in enumerate(g.node) for m in (*before.get(i, ()), n)]
    nodes = head + body + tail
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]  # the shapes of the rewritten values are inferred again
    return InPlace(m, io, tuple(axes.items()), symbol, capacity, length)


def padding_changes(made: InPlace, run, at: int, padded: int) -> str | None:
    """Why the step's outputs at past ``at`` change when it runs at past
    ``padded`` instead, the slots from ``at`` on masked (None when they do
    not): a step that reads positions from the mask, as the examples and
    Hugging Face's decoders do, is not moved by masked slots, so a decoding
    loop may round each past length up to a bucket and replay one CUDA graph
    for all of it. ``run``: the step on inputs by name (onnxruntime)."""
    inputs = {vi.name: vi for vi in graph_inputs(made.model)}
    caches = dict(made.axis)
    holder, axis, c = made.length
    others = set(inputs) - {made.io.ids, holder, *caches}
    if others:
        return (
            f"the step has inputs besides the token, the mask and the caches ({sorted(others)[0]})"
        )
    rng = np.random.default_rng(0)

    def array(name: str, shape) -> np.ndarray:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(inputs[name].type.tensor_type.elem_type)
        return rng.standard_normal(shape).astype(dtype)

    feed = {}
    for name, vi in inputs.items():
        if name in caches:
            feed[name] = array(name, [d.dim_value for d in vi.type.tensor_type.shape.dim])
    ids = inputs[made.io.ids].type.tensor_type.elem_type
    feed[made.io.ids] = np.ones((1, 1), onnx.helper.tensor_dtype_to_np_dtype(ids))
    kind = onnx.helper.tensor_dtype_to_np_dtype(inputs[holder].type.tensor_type.elem_type)

    def mask(past: int) -> np.ndarray:
        shape = [d.dim_value or 1 for d in inputs[holder].type.tensor_type.shape.dim]
        shape[axis] = past + c
        out = np.zeros(shape, kind)
        index = [slice(None)] * len(shape)
        index[axis] = slice(0, at)
        out[tuple(index)] = 1
        index[axis] = slice(past + c - 1, past + c)
        out[tuple(index)] = 1
        return out

    exact = run({**feed, holder: mask(at)})
    moved = run({**feed, holder: mask(padded)})
    for name, want in exact.items():
        got = moved[name]
        scale = float(np.max(np.abs(want))) or 1.0
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-5 * scale):
            return (
                f"its output {shown(name)} at past {at} changes with {padded - at} masked "
                "slots (the step reads positions from the past length, not the mask)"
            )
    return None
