"""ONNX in: load, check, bind shapes, infer shapes, fold constants.

``load`` turns a path into a checked ``ModelProto`` (external data included,
but never from outside the model's folder).  ``prepare`` makes every shape
static (``--shape NAME=1x128`` binds dynamic dimensions), runs ONNX shape
inference and folds every computation on constants: the shape arithmetic of
exported transformers (Shape, Gather, Concat, Range, ConstantOfShape, Cast, ...)
disappears here, so fission only ever sees tensors of known shape.
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper
from onnx.external_data_helper import uses_external_data

from orchestrate import text
from orchestrate.errors import InputError, UnsupportedError
from orchestrate.frontend.weights import array as initializer_array
from orchestrate.frontend.weights import bind as bind_external
from orchestrate.ir import MAX_ELEMENTS
from orchestrate.shapes.poly import expression_of, plain_names

# Folding a constant computation is skipped when its result is larger than
# this many elements and larger than its inputs (it stays a node to fuse).
FOLD_LIMIT = 1 << 20
NONDETERMINISTIC = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)
DEFAULT_DOMAINS = ("", "ai.onnx")


def load(path: str | os.PathLike) -> onnx.ModelProto:
    """Read and check an ONNX file; raise InputError naming the file on any problem."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError, OSError) as e:
        raise InputError(f"{path}: not a valid ONNX file ({_short(e)})") from None
    if not model.graph.node and not model.graph.output:
        raise InputError(f"{path}: not a valid ONNX file (empty graph)")
    _load_external(model, path)
    model = unknown_dims_dynamic(model, copy=False)
    model = opset_onnxruntime_runs(model, str(path))
    check(model, str(path))
    return model


def _graphs(graph: onnx.GraphProto):
    """``graph`` and every subgraph in it (If branches, Loop bodies)."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            for g in (*([a.g] if a.HasField("g") else []), *a.graphs):
                yield from _graphs(g)


def _unknown_dims(model: onnx.ModelProto):
    for graph in _graphs(model.graph):
        for vi in (*graph.input, *graph.output, *graph.value_info):
            if vi.type.HasField("tensor_type"):
                for d in vi.type.tensor_type.shape.dim:
                    if d.HasField("dim_value") and d.dim_value <= 0:
                        yield d


def unknown_dims_dynamic(model: onnx.ModelProto, copy: bool = True) -> onnx.ModelProto:
    """``model`` with every negative or zero dimension of a tensor's
    declared shape made a dynamic one, which ``--shape`` binds like any
    other.  paddle2onnx writes ``dim_value: -1`` for a dynamic batch (and
    onnxruntime reads it so); other exporters write 0 for "unknown", which
    onnxruntime takes as an empty axis, a tensor orchestrate could not run
    anyway.  The model itself when it has none; else a copy, unless
    ``copy`` is false."""
    if next(_unknown_dims(model), None) is None:
        return model
    if copy:
        model, original = onnx.ModelProto(), model
        model.CopyFrom(original)
    for d in list(_unknown_dims(model)):
        d.ClearField("dim_value")
    return model


def _load_external(model: onnx.ModelProto, path: Path) -> None:
    """Bind the external tensors to their files, read in place (``frontend.weights``)."""
    bind_external(_all_tensors(model.graph), path)


def _all_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _all_tensors(a.g)
            for g in a.graphs:
                yield from _all_tensors(g)


def check(model: onnx.ModelProto, source: str = "<model>") -> None:
    check_opset(model, source)
    _check_text(model, source)
    try:  # on the skeleton: the checker serializes what it checks, and a model
        # with weights beyond protobuf's 2 GiB cannot be serialized
        onnx.checker.check_model(_checkable(_skeleton(model)[0]))
    except (onnx.checker.ValidationError, ValueError) as e:
        raise InputError(f"{source}: invalid ONNX model ({_short(e)})") from None
    _check_graph(model.graph, source)


# onnxruntime's own operators that its optimizer writes in the ONNX domain,
# which onnx's checker does not know
ONNXRUNTIME_IN_ONNX_DOMAIN = frozenset({"SimplifiedLayerNormalization"})
_CHECKED_AS = "ai.onnx.onnxruntime"  # their domain while the checker reads them


def _checkable(m: onnx.ModelProto) -> onnx.ModelProto:
    """``m`` (a skeleton, changed in place) with onnxruntime's ONNX-domain
    operators in a domain of their own, which the checker does not verify."""
    moved = False
    for node in m.graph.node:
        if node.domain in DEFAULT_DOMAINS and node.op_type in ONNXRUNTIME_IN_ONNX_DOMAIN:
            node.domain = _CHECKED_AS
            moved = True
    if moved:
        m.opset_import.append(onnx.helper.make_opsetid(_CHECKED_AS, 1))
    return m


def _check_text(message, source: str) -> None:
    """Every string field of the model is text: protobuf hands back bytes
    for a name that is not valid UTF-8, which nothing downstream expects."""
    for field, value in message.ListFields():
        if field.type == field.TYPE_MESSAGE:
            for sub in value if _repeated(field) else (value,):
                _check_text(sub, source)
        elif field.type == field.TYPE_STRING:
            for text in value if _repeated(field) else (value,):
                if not isinstance(text, str):
                    raise InputError(
                        f"{source}: {type(message).__name__}.{field.name} "
                        f"{text[:40]!r} is not valid UTF-8"
                    )


def _repeated(field) -> bool:
    # protobuf 6+ has is_repeated; older ones only the label
    flag = getattr(field, "is_repeated", None)
    return flag if flag is not None else field.label == field.LABEL_REPEATED


def _check_graph(graph: onnx.GraphProto, source: str) -> None:
    """What onnx's checker lets through and then breaks shape inference or
    numpy: negative dimensions, initializers whose data does not fill their
    dims, and a Split whose ``num_outputs`` is not its number of outputs
    (onnx's shape inference aborts the process on that one)."""
    for vi in (*graph.input, *graph.output, *graph.value_info):
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else ()
        for k, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value < 0:
                raise InputError(
                    f"{source}: tensor '{text.shown(vi.name)}' has dimension {d.dim_value} at axis {k}"
                )
    for t in graph.initializer:
        _check_tensor_data(t, source)
    for node in graph.node:
        if node.op_type == "Split" and node.domain in DEFAULT_DOMAINS:
            n = next((a.i for a in node.attribute if a.name == "num_outputs"), None)
            if n is not None and n != len(node.output):
                raise InputError(
                    f"{source}: node '{text.shown(node.name or node.output[0])}' (Split) "
                    f"has num_outputs={n} but {len(node.output)} outputs"
                )
        for a in node.attribute:
            for g in (*([a.g] if a.HasField("g") else []), *a.graphs):
                _check_graph(g, source)


def _check_tensor_data(t: onnx.TensorProto, source: str) -> None:
    if uses_external_data(t) or t.data_type in (
        onnx.TensorProto.STRING,
        onnx.TensorProto.UNDEFINED,
    ):
        return
    if any(d < 0 for d in t.dims):
        raise InputError(f"{source}: initializer '{text.shown(t.name)}' has dims {list(t.dims)}")
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
    except (KeyError, ValueError, TypeError):
        return  # an element type the decompositions name when they meet it
    count = math.prod(t.dims)
    if t.HasField("raw_data"):
        bits = dtype.itemsize * 8
        if t.data_type in _PACKED_4BIT:
            bits = 4
        want = (count * bits + 7) // 8
        if len(t.raw_data) != want:
            raise InputError(
                f"{source}: initializer '{text.shown(t.name)}' holds {len(t.raw_data)} "
                f"bytes, but {dtype} dims {list(t.dims)} need {want}"
            )
    elif t.data_type not in _PACKED_4BIT and dtype.kind != "c":
        held = sum(
            len(f) for f in (t.float_data, t.int32_data, t.int64_data, t.double_data, t.uint64_data)
        )
        if held != count:
            raise InputError(
                f"{source}: initializer '{text.shown(t.name)}' holds {held} values, "
                f"but dims {list(t.dims)} need {count}"
            )


def opset_onnxruntime_runs(model: onnx.ModelProto, source: str = "<model>") -> onnx.ModelProto:
    """``model`` at an ai.onnx opset the installed onnxruntime runs (it
    verifies every bundle): itself when it is one, else converted down to
    the newest such by onnx's version converter (onnx 1.23 stamps opset 28,
    newer than onnxruntime 1.31 runs), weights left where they are.  A
    model the converter cannot bring down is refused, naming why; one
    newer than the installed onnx is left to ``check_opset``."""
    from onnx import version_converter

    from orchestrate.frontend import onnxrt

    version = opset_of(model)
    if version is None or version > onnx.defs.onnx_opset_version():
        return model
    if onnxrt.supports_opset(version):
        return model
    skeleton, weights = _skeleton(model)
    try:
        out = version_converter.convert_version(skeleton, onnxrt.max_opset())
    except Exception as e:  # noqa: BLE001 - the converter raises what its C++ side does
        raise InputError(
            f"{_newer_than_onnxruntime(version, source)}, and onnx's version converter "
            f"cannot bring it down ({_short(e)})"
        ) from None
    inputs = [i for i in out.graph.input if i.name not in weights]
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    out.graph.initializer.extend(weights.values())
    return out


def check_opset(model: onnx.ModelProto, source: str = "<model>") -> None:
    """Refuse, before any work, a model whose ai.onnx opset is newer than the
    installed onnx (shape inference, folding) or onnxruntime (verification)
    supports."""
    from orchestrate.frontend import onnxrt

    version = opset_of(model)
    if version is None:
        return
    newest = onnx.defs.onnx_opset_version()
    if version > newest:
        raise InputError(
            f"{source}: opset {version} is newer than the installed onnx {onnx.__version__} "
            f"supports (opset {newest})"
        )
    if not onnxrt.supports_opset(version):
        raise InputError(_newer_than_onnxruntime(version, source))


def opset_of(model: onnx.ModelProto) -> int | None:
    """The model's ai.onnx opset (None: it imports none)."""
    return next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), None)


def _newer_than_onnxruntime(version: int, source: str) -> str:
    import onnxruntime

    from orchestrate.frontend import onnxrt

    return (
        f"{source}: opset {version} is newer than the installed onnxruntime "
        f"{onnxruntime.__version__} supports (opset {onnxrt.max_opset()})"
    )


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:200] + ("..." if len(text) > 200 else "") if text else type(e).__name__


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=1x128`` (or ``1,128``) -> ("NAME", (1, 128)); raise InputError otherwise."""
    name, sep, dims = text.partition("=")
    if not sep or not name:
        raise InputError(f"--shape {text!r}: expected NAME=DIMS such as x=1x128")
    try:
        shape = _dims_text(dims, "")
    except InputError:
        raise InputError(f"--shape {text!r}: expected NAME=DIMS such as x=1x128") from None
    return name, check_shapes({name: shape}, "--shape")[name]


def _dims_text(text: str, where: str) -> tuple[int, ...]:
    """``1x128`` or ``1,128`` as (1, 128); the empty text a scalar's ()."""
    try:
        return tuple(int(d) for d in text.replace(",", "x").split("x")) if text else ()
    except ValueError:
        raise InputError(
            f"{where}: {text!r} is not dimensions such as '1x128' or (1, 128)"
        ) from None


def check_shapes(shapes, option: str = "shapes") -> dict[str, tuple[int, ...]]:
    """``shapes`` as ``{input name: tuple of int}``.  InputError naming
    ``option`` (``--shape``, or the API's ``shapes``) for anything else: no
    mapping, a name that is no string, a dimension that is no integer (numpy
    integers are integers) or negative, more than MAX_ELEMENTS elements."""
    if shapes is None:
        return {}
    if not isinstance(shapes, Mapping):
        raise InputError(
            f"{option}: expected a mapping of input names to dimensions such as "
            f"{{'x': (1, 128)}}, got {type(shapes).__name__}"
        )
    out: dict[str, tuple[int, ...]] = {}
    for name, dims in shapes.items():
        if not isinstance(name, str):
            raise InputError(f"{option}: input names must be strings, got {name!r}")
        where = f"{option}[{name!r}]"
        if isinstance(dims, np.ndarray) and dims.ndim == 1:
            dims = list(dims)
        if isinstance(dims, str):  # the CLI's form, '1x128' or '1,128' ('' a scalar)
            dims = _dims_text(dims, where)
        if isinstance(dims, bytes) or not isinstance(dims, Sequence):
            raise InputError(
                f"{where}: expected a tuple of dimensions such as (1, 128) or '1x128', "
                f"got {type(dims).__name__}"
            )
        if option.startswith("--"):
            where = f"{option} {name}={_dims(dims)}"
        shape = []
        for k, d in enumerate(dims):
            try:
                if isinstance(d, (bool, np.bool_)):
                    raise TypeError
                d = operator.index(d)
            except TypeError:
                raise InputError(f"{where}: dimension {k} is {d!r}, not an integer") from None
            if d < 0:
                raise InputError(f"{where}: dimension {k} is {d}; dimensions must be >= 0")
            shape.append(d)
        out[name] = tuple(shape)
        _check_size(shape, where if option.startswith("--") else f"{where}: shape {_dims(shape)}")
    return out


def _check_size(shape: Sequence[int], what: str) -> None:
    size = math.prod(shape)
    if size > MAX_ELEMENTS:
        raise InputError(
            f"{what}: {size:,} elements, more than the {MAX_ELEMENTS:,} (2**36) one tensor may have"
        )


_PACKED_4BIT = {
    getattr(onnx.TensorProto, n)
    for n in ("INT4", "UINT4", "FLOAT4E2M1")
    if hasattr(onnx.TensorProto, n)
}


def _dims(shape) -> str:
    return "x".join(map(str, shape)) if shape else "()"


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The real inputs: graph inputs that are not initializers."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def prepare(
    model: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    source: str = "<model>",
    *,
    option: str = "--shape",
) -> onnx.ModelProto:
    """A static-shaped, shape-inferred, constant-folded copy of ``model``.

    ``shapes`` is checked first (errors name ``option``: ``--shape``, or the
    API's ``shapes``); a tensor of more than MAX_ELEMENTS elements is refused,
    naming the input or the node that makes it.

    The work happens on a skeleton of the model whose large initializers
    (weights) are stand-in graph inputs of the same type, so shape inference
    and folding never copy the weights; they are put back once, at the end."""
    shapes = check_shapes(shapes, option)
    m, weights = _skeleton(model)
    if m.functions:
        try:
            m = onnx.inliner.inline_local_functions(m)
        except Exception as e:  # noqa: BLE001
            raise InputError(f"{source}: cannot inline local functions ({_short(e)})") from None
    _bind_shapes(m, shapes, source, exempt=set(weights), option=option)
    for _ in range(8):
        m = _infer(m, source)
        _check_sizes(m, source)
        folded, changed = fold_constants(m, weights)
        m = folded
        if not changed:
            break
    return _prune(m, weights)


def _check_sizes(m: onnx.ModelProto, source: str) -> None:
    """Refuse a graph input or output of known shape with more than
    MAX_ELEMENTS elements (they are held in memory; an intermediate may be
    larger where the plan never writes it, ``ir.MAX_ELEMENTS``)."""
    made_by = {o: n for n in m.graph.node for o in n.output if o}
    index = {id(n): k for k, n in enumerate(m.graph.node)}
    held = {i.name for i in m.graph.input} | {o.name for o in m.graph.output}
    for name, (shape, _) in static_shapes(m).items():
        if name not in held or math.prod(shape) <= MAX_ELEMENTS:
            continue
        node = made_by.get(name)
        if node is None:
            _check_size(shape, f"{source}: input {name!r} of shape {_dims(shape)}")
        label = node.name or f"{node.op_type}_{index[id(node)]}"
        _check_size(
            shape,
            f"{source}: node {label!r} ({node.op_type}) makes {name!r} of shape {_dims(shape)}",
        )


# initializers larger than this stay out of the skeleton
SKELETON_LIMIT = 4096


def _skeleton(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """``model`` with its large or external initializers as graph inputs of
    their types, and those initializers by name."""
    weights = {
        t.name: t
        for t in model.graph.initializer
        if numel(t) > SKELETON_LIMIT or uses_external_data(t)
    }
    m = onnx.ModelProto()
    graph = model.graph
    m.CopyFrom(
        onnx.ModelProto(
            ir_version=model.ir_version,
            opset_import=model.opset_import,
            producer_name=model.producer_name,
            functions=model.functions,
            metadata_props=model.metadata_props,
        )
    )
    g = m.graph
    g.name = graph.name
    g.node.extend(graph.node)
    g.output.extend(graph.output)
    g.value_info.extend(graph.value_info)
    g.initializer.extend(t for t in graph.initializer if t.name not in weights)
    g.input.extend(i for i in graph.input if i.name not in weights)
    for name, t in weights.items():
        g.input.append(onnx.helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
    return m, weights


def numel(t: onnx.TensorProto) -> int:
    """The number of elements of an initializer, read off its dims."""
    return int(np.prod(t.dims)) if len(t.dims) else 1


def _bind_shapes(
    m: onnx.ModelProto,
    shapes: dict[str, tuple[int, ...]],
    source: str,
    exempt: set[str],
    option: str = "--shape",
) -> None:
    inputs = {i.name: i for i in graph_inputs(m) if i.name not in exempt}
    cli = option.startswith("--")
    for name in shapes:
        if name not in inputs:
            known = ", ".join(map(text.shown, inputs)) or "none"
            where = f"{option} {name}=..." if cli else f"{option}[{name!r}]"
            raise InputError(f"{where}: the model has no input {name!r} (inputs: {known})")
    shapes = {**shapes, **_shared_dims(inputs, shapes, option)}
    for name, vi in inputs.items():
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            kind = vi.type.WhichOneof("value") or "untyped"
            raise UnsupportedError(f"{source}: input {name!r} is a {kind}, not a tensor", {kind: 1})
        if name in shapes:
            want = shapes[name]
            where = f"{option} {name}={_dims(want)}" if cli else f"{option}[{name!r}]"
            if tt.HasField("shape") and len(tt.shape.dim) != len(want):
                raise InputError(
                    f"{where}: input {name!r} has rank {len(tt.shape.dim)}, not {len(want)}"
                )
            for k, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value != want[k]:
                    raise InputError(
                        f"{where}: axis {k} of input {name!r} is fixed at {d.dim_value}"
                    )
            tt.ClearField("shape")
            tt.shape.SetInParent()  # a scalar has a shape with no dims
            for d in want:
                tt.shape.dim.add().dim_value = d
            continue
        shown = text.shown(name)
        if not tt.HasField("shape"):
            hint = f"--shape {shown}=..." if cli else f"{option}={{{name!r}: (...)}}"
            raise InputError(f"{source}: input {name!r} has unknown rank; pass {hint}")
        for k, d in enumerate(tt.shape.dim):
            if not d.HasField("dim_value"):
                what = f"dimension {d.dim_param!r}" if d.dim_param else "a dynamic dimension"
                dims = [str(x.dim_value) if x.HasField("dim_value") else "N" for x in tt.shape.dim]
                hint = (
                    f"--shape {shown}={'x'.join(dims)}"
                    if cli
                    else f"{option}={{{name!r}: ({', '.join(dims)}{',' * (len(dims) == 1)})}}"
                )
                raise InputError(f"{source}: input {name!r} has {what} at axis {k}; pass {hint}")


def _shared_dims(inputs: dict, shapes: dict, option: str) -> dict[str, tuple[int, ...]]:
    """The shapes of the inputs not given whose every dynamic dimension is a
    named one a given shape fixes (``mask[batch, seq]`` from ``--shape
    x=3x7x16`` for ``x[batch, seq, 16]``), or an expression of such names
    (``mask[1, past + 1]`` from ``cache[1, past, 8]``), as a range of one point
    binds them; an InputError when two given shapes fix one name differently."""
    cli = option.startswith("--")
    where = lambda n: f"{option} {n}=..." if cli else f"{option}[{n!r}]"
    given = {
        name: list(zip(inputs[name].type.tensor_type.shape.dim, want))
        for name, want in shapes.items()
        if inputs[name].type.tensor_type.HasField("shape")
        and len(inputs[name].type.tensor_type.shape.dim) == len(want)
    }  # a rank that disagrees is refused below, naming the option
    params = {d.dim_param for vi in inputs.values() for d in tensor_dims(vi) if d.dim_param}
    names = plain_names(params)
    expressions = {p: e for p in params if (e := expression_of(p, names)) is not None}
    fixed: dict[str, tuple[int, str]] = {}

    def fix(symbol: str, v: int, name: str, shown: str) -> None:
        seen = fixed.setdefault(symbol, (v, name))
        if seen[0] != v:
            through = f" (its axis {shown!r})" if shown != symbol else ""
            raise InputError(
                f"{where(name)}: dimension {symbol!r} is {v} here{through} but {seen[0]} "
                f"in {where(seen[1])}"
            )

    for name, axes in given.items():
        for d, v in axes:
            if not d.HasField("dim_value") and d.dim_param and d.dim_param not in expressions:
                fix(d.dim_param, v, name, d.dim_param)
    for name, axes in given.items():  # an expression of one symbol plus a constant gives it
        for d, v in axes:
            e = expressions.get(d.dim_param) if not d.HasField("dim_value") else None
            linear = e.linear if e is not None else None
            if linear is not None and len(linear) == 1 and linear[0][1] == 1:
                fix(linear[0][0], v - e.const, name, d.dim_param)
    values = {s: v for s, (v, _) in fixed.items()}
    for name, axes in given.items():
        for d, v in axes:
            e = expressions.get(d.dim_param) if not d.HasField("dim_value") else None
            if e is not None and e.symbols <= values.keys() and e.evaluate(values) != v:
                via = " and ".join(sorted({where(fixed[s][1]) for s in e.symbols}))
                raise InputError(
                    f"{where(name)}: axis of dimension {d.dim_param!r} is {v}, but {via} "
                    f"make it {e.evaluate(values)}"
                )

    def value(d) -> int | None:
        if d.HasField("dim_value"):
            return d.dim_value
        e = expressions.get(d.dim_param)
        if e is not None:
            return e.evaluate(values) if e.symbols <= values.keys() else None
        return values.get(d.dim_param)

    out = {}
    for name, vi in inputs.items():
        dims = tensor_dims(vi)
        if name in shapes or not dims:
            continue
        got = [value(d) for d in dims]
        if None not in got and any(not d.HasField("dim_value") for d in dims):
            out[name] = tuple(got)
    return out


def tensor_dims(vi: onnx.ValueInfoProto) -> list:
    """The dimensions of a tensor input with a shape ([] for none)."""
    tt = vi.type.tensor_type
    return list(tt.shape.dim) if vi.type.HasField("tensor_type") and tt.HasField("shape") else []


def _infer(m: onnx.ModelProto, source: str) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(
            m, check_type=False, strict_mode=False, data_prop=True
        )
    except Exception as e:  # noqa: BLE001 - a model ONNX cannot type is a bad model
        raise InputError(f"{source}: shape inference failed ({_short(e)})") from None


def static_shapes(m: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], int]]:
    """Every tensor whose shape is fully known: name -> (shape, elem_type)."""
    out = {}
    for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if None not in dims:
                out[vi.name] = (tuple(dims), tt.elem_type)
    for t in m.graph.initializer:
        out[t.name] = (tuple(t.dims), t.data_type)
    return out


def fold_constants(
    m: onnx.ModelProto, weights: Mapping[str, onnx.TensorProto] | None = None
) -> tuple[onnx.ModelProto, bool]:
    """Replace every node computed from constants alone (and every Shape / Size
    of a static tensor) by an initializer.  ``weights`` are initializers kept
    outside the model (see ``prepare``).  Returns (model, whether anything
    changed)."""
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415 - slow import

    g = m.graph
    consts = _LazyArrays({**(weights or {}), **{t.name: t for t in g.initializer}})
    known = static_shapes(m)
    opsets = list(m.opset_import)
    kept: list[onnx.NodeProto] = []
    new: dict[str, np.ndarray] = {}
    inlined = False
    opset = next((o.version for o in opsets if o.domain in DEFAULT_DOMAINS), 1)
    for node in g.node:
        branch = _taken_branch(node, consts)
        if branch is None:
            branch = _unrolled_loop(node, consts, opset)
        if branch is not None:
            kept.extend(branch)
            inlined = True
            continue
        value = _fold_one(node, consts, known, opsets, ReferenceEvaluator)
        if value is None:
            kept.append(node)
            continue
        for name, arr in zip(node.output, value):
            if name:
                consts[name] = new[name] = np.asarray(arr)
    if not new and not inlined:
        return m, False
    out = onnx.ModelProto()
    out.CopyFrom(m)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    out.graph.initializer.extend(numpy_helper.from_array(a, k) for k, a in new.items())
    del out.graph.value_info[:]
    return out, True


# the most iterations of a Loop unrolled (each copies the body)
MAX_LOOP_UNROLL = 64


def loop_unrollable(node: onnx.NodeProto, consts) -> str | None:
    """Why the Loop ``node`` cannot be unrolled, or None when it can: its
    trip count is a constant of at most MAX_LOOP_UNROLL, its condition is
    absent or constant true and stays true (the body passes it through or
    makes it a constant true), and its body holds no subgraph."""
    if node.op_type != "Loop" or node.domain not in DEFAULT_DOMAINS:
        return "not a Loop"
    inputs = list(node.input) + ["", ""]
    if not inputs[0] or inputs[0] not in consts:
        return "its trip count is not a constant"
    trips = int(np.asarray(consts[inputs[0]]).reshape(-1)[0])
    if not 0 < trips <= MAX_LOOP_UNROLL:
        return f"its trip count {trips} is not 1 to {MAX_LOOP_UNROLL}"
    if inputs[1] and (inputs[1] not in consts or not bool(np.asarray(consts[inputs[1]]).all())):
        return "its condition is not a constant true"
    body = next(a.g for a in node.attribute if a.name == "body")
    cond_in, cond_out = body.input[1].name, body.output[0].name
    made = {o: n for n in body.node for o in n.output}
    inits = {t.name: t for t in body.initializer}
    keeps = cond_out == cond_in or (
        cond_out in made
        and made[cond_out].op_type == "Identity"
        and made[cond_out].input[0] == cond_in
    )
    constant = cond_out in inits and bool(numpy_helper.to_array(inits[cond_out]).all())
    if cond_out in made and made[cond_out].op_type == "Constant":
        value = next((a.t for a in made[cond_out].attribute if a.name == "value"), None)
        constant = value is not None and bool(numpy_helper.to_array(value).all())
    if not (keeps or constant):
        return "its body may end the loop early"
    if any(a.HasField("g") or a.graphs for n in body.node for a in n.attribute):
        return "its body holds a subgraph"
    return None


def _unrolled_loop(node: onnx.NodeProto, consts, opset: int) -> list[onnx.NodeProto] | None:
    """A Loop ``loop_unrollable`` accepts, as its body repeated: each copy's
    names prefixed with the Loop's name and the iteration, its iteration
    number and condition constants, its carried values the previous copy's;
    the final carried values and the scan outputs (each iteration's stacked
    along a new first axis) under the Loop's output names."""
    if loop_unrollable(node, consts) is not None:
        return None
    helper = onnx.helper
    trips = int(np.asarray(consts[node.input[0]]).reshape(-1)[0])
    body = next(a.g for a in node.attribute if a.name == "body")
    carried = list(node.input[2:])
    n_carried = len(carried)
    local = {o for n in body.node for o in n.output if o} | {t.name for t in body.initializer}
    stem = f"{node.name or node.output[0]}/"
    nodes: list[onnx.NodeProto] = []
    scans: list[list[str]] = [[] for _ in body.output[1 + n_carried :]]
    for i in range(trips):
        prefix = f"{stem}iter{i}/"
        rename = {name: prefix + name for name in local}
        rename[body.input[0].name] = prefix + "iteration"
        rename[body.input[1].name] = prefix + "condition"
        nodes.append(
            helper.make_node(
                "Constant",
                [],
                [prefix + "iteration"],
                value=helper.make_tensor("", onnx.TensorProto.INT64, [], [i]),
            )
        )
        nodes.append(
            helper.make_node(
                "Constant",
                [],
                [prefix + "condition"],
                value=helper.make_tensor("", onnx.TensorProto.BOOL, [], [True]),
            )
        )
        for vi, outer in zip(body.input[2:], carried):
            rename[vi.name] = outer
        for t in body.initializer:
            nodes.append(helper.make_node("Constant", [], [rename[t.name]], value=t))
        for n in body.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = prefix + (n.name or n.op_type)
            copy.input[:] = [rename.get(x, x) if x else x for x in n.input]
            copy.output[:] = [rename.get(x, x) if x else x for x in n.output]
            nodes.append(copy)
        outs = [rename.get(o.name, o.name) for o in body.output]
        carried = outs[1 : 1 + n_carried]
        for k, name in enumerate(outs[1 + n_carried :]):
            scans[k].append(name)
    for final, target in zip(carried, node.output[:n_carried]):
        if target:
            nodes.append(helper.make_node("Identity", [final], [target], name=stem + "out"))
    for k, (names, target) in enumerate(zip(scans, node.output[n_carried:])):
        if not target:
            continue
        stacked = []
        for i, name in enumerate(names):
            out = f"{stem}scan{k}/{i}"
            if opset >= 13:
                axes = f"{stem}scan{k}/axes"
                if i == 0:
                    nodes.append(
                        helper.make_node(
                            "Constant",
                            [],
                            [axes],
                            value=helper.make_tensor("", onnx.TensorProto.INT64, [1], [0]),
                        )
                    )
                nodes.append(helper.make_node("Unsqueeze", [name, axes], [out]))
            else:
                nodes.append(helper.make_node("Unsqueeze", [name], [out], axes=[0]))
            stacked.append(out)
        nodes.append(helper.make_node("Concat", stacked, [target], axis=0, name=f"{stem}scan{k}"))
    return nodes


def _taken_branch(node: onnx.NodeProto, consts) -> list[onnx.NodeProto] | None:
    """An ``If`` whose condition is a constant becomes the nodes of the branch
    it takes (exporters write such Ifs around shape checks).  Names made inside
    the branch get the If's name as prefix; its outputs are renamed to the
    If's outputs."""
    if node.op_type != "If" or node.domain not in DEFAULT_DOMAINS or node.input[0] not in consts:
        return None
    taken = (
        "then_branch" if bool(np.asarray(consts[node.input[0]]).reshape(-1)[0]) else "else_branch"
    )
    graph = next(a.g for a in node.attribute if a.name == taken)
    prefix = f"{node.name or node.output[0]}/{taken}/"
    local = {o for n in graph.node for o in n.output if o} | {t.name for t in graph.initializer}
    outputs = {o.name: target for o, target in zip(graph.output, node.output)}
    rename = {name: outputs.get(name, prefix + name) for name in local}
    nodes = []
    for t in graph.initializer:
        nodes.append(onnx.helper.make_node("Constant", [], [rename[t.name]], value=t))
    for n in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        copy.name = prefix + (n.name or n.op_type)
        copy.input[:] = [rename.get(i, i) for i in n.input]
        copy.output[:] = [rename.get(o, o) for o in n.output]
        nodes.append(copy)
    for o, target in outputs.items():
        if o not in local:  # the branch passes an outer value straight through
            nodes.append(onnx.helper.make_node("Identity", [o], [target], name=prefix + "out"))
    return nodes


class _LazyArrays(dict):
    """name -> array, converting initializers from protobuf only when read."""

    def __init__(self, protos: dict[str, onnx.TensorProto]):
        super().__init__()
        self._protos = protos

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self._protos

    def __getitem__(self, key: str) -> np.ndarray:
        if not dict.__contains__(self, key):
            self[key] = initializer_array(self._protos[key])
        return dict.__getitem__(self, key)


def _fold_one(node, consts, known, opsets, evaluator_cls):
    if node.domain not in DEFAULT_DOMAINS or node.op_type in NONDETERMINISTIC:
        return None
    if any(a.HasField("g") or a.graphs for a in node.attribute):
        return None
    if node.op_type == "Constant":
        try:
            return [_run_node(node, {}, opsets, evaluator_cls)[0]]
        except Exception:  # noqa: BLE001 - leave it to fission to report
            return None
    if node.op_type in ("Shape", "Size") and node.input[0] in known:
        shape = known[node.input[0]][0]
        if node.op_type == "Size":
            return [np.array(int(np.prod(shape)), dtype=np.int64)]
        attrs = {a.name: a.i for a in node.attribute}
        r = len(shape)
        start, end = attrs.get("start", 0), attrs.get("end", r)
        start, end = (max(0, min(r, v + r if v < 0 else v)) for v in (start, end))
        return [np.array(shape[start:end], dtype=np.int64)]
    ins = [i for i in node.input if i]
    if not ins or any(i not in consts for i in ins):
        return None
    biggest = max([consts[i].size for i in ins] + [0])
    # a result known to be too large is not computed at all (it may not fit in memory)
    if any(o in known and math.prod(known[o][0]) > max(FOLD_LIMIT, biggest) for o in node.output):
        return None
    try:
        results = _run_node(node, consts, opsets, evaluator_cls)
    except Exception:  # noqa: BLE001 - an op the evaluator cannot fold stays a node
        return None
    if any(r.size > FOLD_LIMIT and r.size > biggest for r in results):
        return None
    return results


def _run_node(node, consts, opsets, evaluator_cls) -> list[np.ndarray]:
    feeds = {i: consts[i] for i in node.input if i}
    inputs = [
        onnx.helper.make_tensor_value_info(
            i, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape
        )
        for i, a in feeds.items()
    ]
    outs = [onnx.helper.make_tensor_value_info(o, 0, None) for o in node.output if o]
    graph = onnx.helper.make_graph([node], "fold", inputs, outs)
    model = onnx.helper.make_model(graph, opset_imports=opsets)
    with np.errstate(all="ignore"):
        results = evaluator_cls(model).run(None, feeds)
    return [np.asarray(r) for r in results]


def _prune(m: onnx.ModelProto, weights: Mapping[str, onnx.TensorProto]) -> onnx.ModelProto:
    """Drop nodes and initializers nothing needs; put the needed weights back."""
    g = m.graph
    needed = {o.name for o in g.output}
    kept = []
    for node in reversed(g.node):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    kept.reverse()
    constant_names = {t.name for t in g.initializer} | set(weights)
    inits = [t for t in g.initializer if t.name in needed]
    del g.node[:]
    g.node.extend(kept)
    del g.initializer[:]
    g.initializer.extend(inits)
    for name, t in weights.items():  # (extend would serialize each: none may pass 2 GiB)
        if name in needed:
            g.initializer.add().CopyFrom(t)
    # old models (IR < 4) list initializers among the inputs too
    real = [i for i in g.input if i.name not in constant_names]
    del g.input[:]
    g.input.extend(real)
    return m
