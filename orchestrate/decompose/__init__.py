"""Operator fission: every ONNX operator becomes primitives.

One function per ONNX op type, named after the op, grouped by family in the
modules of this package and collected in :data:`TABLE` (keyed by op type, or
``domain::op type`` outside the ONNX domain: onnxruntime's ``com.microsoft``
fused ops, ``contrib.py``).  A function takes the
:class:`~orchestrate.decompose.builder.Builder`, the node's inputs as
:class:`Value` handles (``None`` for an omitted optional input) and the
node's attributes as keyword arguments whose defaults are the spec's.  It
returns the output Value, or a tuple of them for several outputs.

The package is also callable: ``orchestrate.decompose(model, shapes)`` is
:func:`decompose`, whether the name is the function ``orchestrate/__init__.py``
defines or this package (importing it rebinds the attribute).
"""

from __future__ import annotations

import inspect
import sys
import types
from collections import Counter
from collections.abc import Callable, Mapping

import onnx
from onnx import helper, numpy_helper

from orchestrate import ir
from orchestrate.decompose import (
    contrib,
    conv,
    elementwise,
    gather,
    layout,
    linalg,
    loss,
    normalization,
    quantize,
    recurrent,
    reduce,
    resize,
)
from orchestrate.decompose.builder import Builder, Value, onnx_dtype_name
from orchestrate.errors import GraphError, InputError, UnsupportedError
from orchestrate.frontend import DEFAULT_DOMAINS, loop_unrollable, numel, opset_of
from orchestrate.frontend.weights import array as initializer_array
from orchestrate.ir import type_rules
from orchestrate.ir.bounds import INDEX_ERROR, check_constants
from orchestrate.kernels.spec import SCRATCH_DTYPES

Decomposition = Callable[..., Value | tuple[Value | None, ...]]


def _merge(*tables: Mapping[str, Decomposition]) -> dict[str, Decomposition]:
    merged: dict[str, Decomposition] = {}
    for t in tables:
        dup = merged.keys() & t.keys()
        assert not dup, f"ops decomposed twice: {sorted(dup)}"
        merged.update(t)
    return dict(sorted(merged.items()))


TABLE: dict[str, Decomposition] = _merge(
    elementwise.OPS,
    reduce.OPS,
    normalization.OPS,
    layout.OPS,
    gather.OPS,
    resize.OPS,
    linalg.OPS,
    conv.OPS,
    recurrent.OPS,
    contrib.OPS,
    quantize.OPS,
    loss.OPS,
)
SUPPORTED_OPS = tuple(TABLE)


def fission(
    model: onnx.ModelProto, source: str = "<model>", *, consume: bool = False, symbols=None
) -> ir.Graph:
    """The primitive graph of a prepared (static-shaped, folded) ONNX model.

    With ``consume`` each initializer's bytes are released from ``model`` as
    soon as they are copied into the graph, so a large model is never held
    twice (the model is unusable afterwards).

    ``symbols`` (``orchestrate.shapes.trace.Formulas``), for a range: the
    model was prepared at the hint binding of its dimensions, and the
    inputs' dimensions, and the folded tensors' shapes and values that are
    formulas of them, enter fission as SymInts (``shape(name, dims)``,
    ``values(name, array)``), so the graph's shapes are the formulas."""
    g = model.graph
    opset = opset_of(model) or 1
    _check_supported(g, source)
    reserved = {i.name for i in g.input} | {t.name for t in g.initializer}
    reserved |= {o for n in g.node for o in n.output} | {o.name for o in g.output}
    for name in (INDEX_ERROR, *SCRATCH_DTYPES):
        if name in reserved:
            raise InputError(f"{source}: the tensor name {name!r} is reserved")
    b = Builder(reserved, opset)
    env: dict[str, Value] = {}
    inits = {t.name for t in g.initializer}
    inputs: list[ir.Input] = []
    for vi in g.input:
        if vi.name in inits:
            continue
        t = _value_type(vi, source)
        if symbols is not None:
            t = ir.TensorType(symbols.shape(vi.name, t.shape), t.dtype)
        inputs.append(ir.Input(vi.name, t))
        env[vi.name] = Value(vi.name, t)
    outputs = {o.name for o in g.output}
    for vi in inputs:
        if vi.name in outputs:
            raise UnsupportedError(f"{source}: input {vi.name!r} is also an output", {"io": 1})
    for t in g.initializer:
        arr = initializer_array(t)
        if consume:
            t.ClearField("raw_data")
        _check_dtype(arr.dtype.name, f"{source}: initializer {t.name!r}")
        shape = sym = None
        if symbols is not None:
            shape, sym = symbols.shape(t.name, arr.shape), symbols.values(t.name, arr)
        # a constant that is a graph output keeps its name free for the output node
        env[t.name] = b.constant(
            arr, name=None if t.name in outputs else t.name, shape=shape, sym=sym
        )
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    for index, node in enumerate(g.node):
        _decompose_node(b, node, index, env, source, used)
    nodes, constants = _finish(b, env, [o.name for o in g.output])
    graph = ir.Graph(
        tuple(nodes),
        tuple(inputs),
        tuple(o.name for o in g.output),
        constants,
        name=g.name or "graph",
        constant_shapes=b.constant_shapes,
        constant_values=b.constant_values,
    )
    graph = type_rules.validate(eliminate_dead_code(graph))
    _check_sizes(graph, source)
    check_constants(graph, source)
    return graph


def _check_sizes(graph: ir.Graph, source: str) -> None:
    """Refuse a graph output of more than ir.MAX_ELEMENTS elements, naming
    the ONNX node it comes from (an intermediate may be larger: the planner
    refuses any kernel that would write one, ``templates._region``)."""
    outputs = set(graph.outputs)
    for n in graph.nodes:
        if n.name in outputs and n.type.size > ir.MAX_ELEMENTS:
            raise InputError(
                f"{source}: node {n.origin!r} makes a {n.op.value} of shape "
                f"{'x'.join(map(str, n.type.shape))}: {n.type.size:,} elements, more than the "
                f"{ir.MAX_ELEMENTS:,} (2**36) one tensor may have"
            )


def _check_supported(g: onnx.GraphProto, source: str) -> None:
    for index, node in enumerate(g.node):
        if node.op_type == "If" and node.domain in DEFAULT_DOMAINS:
            _refuse_if(g, node, index, source)
        if node.op_type == "Loop" and node.domain in DEFAULT_DOMAINS:
            consts = {t.name: initializer_array(t) for t in g.initializer if numel(t) <= 16}
            reason = loop_unrollable(node, consts)
            raise UnsupportedError(
                f"{source}: node {node_label(node, index)!r} (Loop) is not unrolled: {reason}",
                {"Loop": 1},
            )
    missing = Counter(table_key(n) for n in g.node if table_key(n) not in TABLE)
    if missing:
        listing = ", ".join(f"{op} (x{k})" for op, k in sorted(missing.items()))
        raise UnsupportedError(f"{source}: no decomposition for {listing}", dict(missing))


def table_key(node: onnx.NodeProto) -> str:
    """The node's entry in TABLE: its op type, ``domain::op type`` outside
    the ONNX domain (``com.microsoft::FastGelu``)."""
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}::{node.op_type}"


def _refuse_if(g: onnx.GraphProto, node: onnx.NodeProto, index: int, source: str) -> None:
    """An ``If`` the frontend could not take a branch of: its condition
    depends on these graph inputs, which ``--const`` can bind."""
    made_by = {o: n for n in g.node for o in n.output if o}
    inputs = {i.name for i in g.input} - {t.name for t in g.initializer}
    found, frontier, seen = set(), [node.input[0]], set()
    while frontier:
        t = frontier.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in inputs:
            found.add(t)
        elif t in made_by:
            frontier.extend(i for i in made_by[t].input if i)
    where = f"{source}: node {node_label(node, index)!r} (If)"
    if found:
        flags = " ".join(f"--const {n}=VALUE" for n in sorted(found))
        raise UnsupportedError(
            f"{where}: its condition depends on input{'s' if len(found) > 1 else ''} "
            f"{', '.join(map(repr, sorted(found)))}; bind {'them' if len(found) > 1 else 'it'} "
            f"with {flags} to take one branch",
            {"If": 1},
        )
    raise UnsupportedError(f"{where}: its condition is not a constant", {"If": 1})


def _check_dtype(dtype: str, where: str) -> None:
    if dtype not in ir.ALL_DTYPES:
        raise UnsupportedError(f"{where}: dtype {dtype} is not supported", {dtype: 1})


def _value_type(vi: onnx.ValueInfoProto, source: str) -> ir.TensorType:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedError(f"{source}: input {vi.name!r} is not a tensor", {"non-tensor": 1})
    dtype = onnx_dtype_name(tt.elem_type) if tt.elem_type else "?"
    _check_dtype(dtype, f"{source}: input {vi.name!r}")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if not tt.HasField("shape") or None in dims:
        raise GraphError(f"{source}: input {vi.name!r} has no static shape")
    return ir.TensorType(tuple(dims), dtype)


def node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def onnx_attrs(node: onnx.NodeProto) -> dict:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        out[a.name] = v
    return out


def _decompose_node(
    b: Builder, node, index: int, env: dict[str, Value], source: str, used: set[str]
) -> None:
    label = node_label(node, index)
    where = f"{source}: node {label!r} ({node.op_type})"
    fn = TABLE[table_key(node)]
    attrs = onnx_attrs(node)
    params = inspect.signature(fn).parameters
    unknown = [k for k in attrs if k not in params]
    if unknown:
        item = f"{node.op_type}.{unknown[0]}"
        raise UnsupportedError(f"{where}: attribute {unknown[0]!r} is not supported", {item: 1})
    args = []
    for name in node.input:
        if not name:
            args.append(None)
            continue
        v = env[name]
        args.append(v)
    while args and args[-1] is None:
        args.pop()
    b.begin(label, next((o for o in node.output if o), label), len(node.output))
    try:
        result = fn(b, *args, **attrs)
    except UnsupportedError as e:
        raise UnsupportedError(
            f"{where}: {_strip(e, label)}", e.items or {node.op_type: 1}
        ) from None
    except GraphError as e:
        raise GraphError(f"{where}: {_strip(e, label)}") from None
    except InputError as e:
        raise InputError(f"{where}: {_strip(e, label)}") from None
    results = result if isinstance(result, tuple) else (result,)
    renamed: dict[str, Value] = {}
    for k, out in enumerate(node.output):
        if not out:
            continue
        if k >= len(results) or results[k] is None:
            if out not in used:  # an optional output nothing reads (Dropout's mask)
                continue
            raise UnsupportedError(f"{where}: output {k} is not supported", {node.op_type: 1})
        v = results[k]
        if v.name in renamed:
            v = renamed[v.name]
        elif b.made_here(v):
            renamed[v.name] = v = b.rename(v, out)
        env[out] = v


def _strip(e: Exception, label: str) -> str:
    text = str(e)
    return text[len(label) + 2 :] if text.startswith(label + ": ") else text


def _finish(b: Builder, env: dict[str, Value], outputs: list[str]):
    """Make sure each graph output is a node of that exact name."""
    produced = {n.name for n in b.nodes}
    seen: set[str] = set()
    for o in outputs:
        v = env[o]
        if v.name == o and o in produced and o not in seen:
            seen.add(o)
            continue
        if o in produced:  # the name is taken by a different value
            raise GraphError(f"output {o!r} is ambiguous")
        b.begin("output", o)
        b.nodes.append(ir.Node(ir.Op.IDENTITY, o, (v.name,), v.type, ir.Attrs(), f"output:{o}"))
        produced.add(o)
        seen.add(o)
    return b.nodes, b.constants


def eliminate_dead_code(graph: ir.Graph) -> ir.Graph:
    needed = set(graph.outputs)
    kept = []
    for n in reversed(graph.nodes):
        if n.name in needed:
            kept.append(n)
            needed.update(n.inputs)
    kept.reverse()
    constants = {k: v for k, v in graph.constants.items() if k in needed}
    return graph.with_nodes(kept, constants)


def decompose(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]] | None = None):
    """The primitive-level ONNX model of ``model``: every composite operator
    split into primitives, graph input and output names kept.

    ``shapes`` binds dynamic input dimensions: ``{"input_ids": (1, 128)}``.
    Raises :class:`InputError` naming a bad argument or model and
    :class:`UnsupportedError` naming any op type, attribute or dtype without a
    decomposition.
    """
    from orchestrate.frontend import (
        check,
        opset_onnxruntime_runs,
        prepare,
        unknown_dims_dynamic,
    )
    from orchestrate.ir.export import to_onnx

    if not isinstance(model, onnx.ModelProto):
        raise InputError(
            f"model: expected an onnx.ModelProto, got {type(model).__name__} "
            "(read a file with onnx.load)"
        )
    model = opset_onnxruntime_runs(unknown_dims_dynamic(model), "model")
    check(model, "model")
    prepared = prepare(model, shapes, "model", option="shapes")
    return to_onnx(fission(prepared, "model"), name=model.graph.name or "graph")


class _CallablePackage(types.ModuleType):
    """This package, callable as :func:`decompose`.

    Importing ``orchestrate.decompose`` binds the package as an attribute of
    ``orchestrate``, over the function of the same name; so the package must
    be that function too, or ``orchestrate.decompose(model)`` would work only
    until the first import."""

    def __call__(self, model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]] | None = None):
        return decompose(model, shapes)

    __call__.__doc__ = decompose.__doc__


sys.modules[__name__].__class__ = _CallablePackage


__all__ = ["TABLE", "SUPPORTED_OPS", "fission", "decompose", "Builder", "Value"]
