"""One primitive graph for a range of shapes: the family, and what it is at a binding.

A range bundle's primitive graph is made once with its dimensions as
symbols (``shapes/symint.py``, ``plan/ranged.py``).  A :class:`Family` is
that graph's formulas, as data: the graph input shapes, the primitive shapes
and integer attributes that are formulas of the dimensions (``batch*seq``
rows, a reshape to ``[batch, seq, 4, 16]``), the constants whose shape is
one (position embeddings gathered for ``seq`` positions, a ``seq x seq``
causal mask: kept once, at MAX, and sliced) and the small constants whose
values are (``x.shape[1]`` folded to a number, as mean pooling divides by
it).  ``dims.json`` is its file.

``plan_at`` and ``constants_at`` make the concrete plan of one binding,
which the runner uses exactly as a static plan; ``symbolic`` makes the
graph whose dimensions are SymInts again, which the emitter prints.
``check_instance`` compares the family with a graph the frontend made at a
binding, so nothing is planned for a range the bundle could not serve.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from orchestrate import ir, text
from orchestrate.errors import InputError
from orchestrate.plan import Plan, Primitive
from orchestrate.shapes.dims import DimRange
from orchestrate.shapes.poly import Poly
from orchestrate.shapes.symint import Symbols, SymInt, sym

Binding = tuple[int, ...]


@dataclass(frozen=True)
class Dim:
    """One dynamic dimension: the model's name for it (text from the model:
    it reaches generated source only through ``orchestrate.text``), its code name
    in generated source (``dim0``) and its range."""

    name: str
    code: str
    range: DimRange

    @property
    def shown(self) -> str:
        """The name as messages print it: itself when printable, else
        escaped (a message stays one line whatever the model calls it)."""
        return text.shown(self.name)


def named(dims: Sequence[Dim], binding: Binding) -> str:
    """``batch=8, seq=64``: a binding as messages print it."""
    return ", ".join(f"{d.shown}={v}" for d, v in zip(dims, binding))


def ranged(dims: Sequence[Dim]) -> str:
    """``batch 1..8, seq 2..64``: the dimensions' ranges as messages print them."""
    return ", ".join(f"{d.shown} {d.range.min}..{d.range.max}" for d in dims)


COMPUTED_DTYPES = ("int32", "int64", "float16", "float32", "float64")
COMPUTED_MAX = 64  # elements: a shape vector or a scalar, not a tensor of data


@dataclass(frozen=True)
class Family:
    """``dims`` in binding order and what varies with them: graph input
    shapes, primitive shapes, primitive attributes (``attrs[node][attr]``:
    the value with :class:`Poly` leaves), the shapes of the constants kept
    at MAX and sliced (``sliced``), and the constants whose values are
    formulas (``computed``: name -> (shape, dtype, one formula per element
    in C order))."""

    dims: tuple[Dim, ...]
    inputs: Mapping[str, tuple[Poly, ...]]
    shapes: Mapping[str, tuple[Poly, ...]]
    attrs: Mapping[str, Mapping[str, Any]]
    sliced: Mapping[str, tuple[Poly, ...]]
    computed: Mapping[str, tuple[tuple[int, ...], str, tuple[Poly, ...]]] = field(
        default_factory=dict
    )

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(d.code for d in self.dims)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    def at(self, which: str) -> Binding:
        """``min``, ``opt`` or ``max`` of every dimension."""
        return tuple(getattr(d.range, which) for d in self.dims)

    def named(self, binding: Binding) -> str:
        return named(self.dims, binding)

    def contains(self, binding: Binding) -> bool:
        return all(v in d.range for d, v in zip(self.dims, binding))

    def by_name(self, binding: Binding) -> dict[str, int]:
        return dict(zip(self.names, binding))

    def symbols(self, hint: Binding) -> Symbols:
        """The symbols of the range, their SymInts valued at ``hint``."""
        return Symbols(self.names, {d.name: d.range for d in self.dims}, self.by_name(hint))

    def input_shape(self, name: str, binding: Binding) -> tuple[int, ...]:
        values = self.by_name(binding)
        return tuple(p.evaluate(values) for p in self.inputs[name])

    # -- at a binding --------------------------------------------------------------------

    def plan_at(self, plan: Plan, binding: Binding) -> Plan:
        """``plan`` (made at any binding of the family) with every shape and
        attribute at ``binding``."""
        values = self.by_name(binding)
        return self._plan_with(plan, lambda p: p.evaluate(values))

    def _plan_with(self, plan: Plan, leaf) -> Plan:
        prims = tuple(self._primitive(p, leaf) for p in plan.primitives)
        inputs = tuple(
            replace(i, shape=tuple(leaf(p) for p in self.inputs[i.name]))
            if i.name in self.inputs
            else i
            for i in plan.graph.inputs
        )
        return replace(plan, primitives=prims, graph=replace(plan.graph, inputs=inputs))

    def _primitive(self, p: Primitive, leaf) -> Primitive:
        shape = self.shapes.get(p.name)
        attrs = self.attrs.get(p.name)
        if shape is None and attrs is None:
            return p
        new = p
        if shape is not None:
            new = replace(new, shape=tuple(leaf(d) for d in shape))
        if attrs is not None:
            merged = dict(p.attrs)
            merged.update({k: _leaves(v, leaf) for k, v in attrs.items()})
            new = replace(new, attrs=ir.Attrs(merged))
        return new

    def stored_mismatch(self, constants: Mapping[str, np.ndarray]) -> str | None:
        """Why ``constants`` (a bundle's) were not stored for this range, or
        None: each sliced constant is kept at MAX, so its shape is its shape
        formula at MAX (a dims.json given a larger MAX would cut past the
        end of what was stored, and pad with zeros)."""
        top = self.by_name(self.at("max"))
        for name, shape in sorted(self.sliced.items()):
            want = tuple(d.evaluate(top) for d in shape)
            have = tuple(np.shape(constants[name])) if name in constants else None
            if have != want:
                return (
                    f"constant '{text.shown(name)}' is stored as {list(have or ())}, "
                    f"the range's MAX needs {list(want)}"
                )
        return None

    def constants_at(
        self, constants: Mapping[str, np.ndarray], binding: Binding
    ) -> dict[str, np.ndarray]:
        """The constants at ``binding``: the sliced ones cut from their MAX value."""
        values = self.by_name(binding)
        out = dict(constants)
        for name, shape in self.sliced.items():
            want = tuple(d.evaluate(values) for d in shape)
            cut = np.ascontiguousarray(constants[name][tuple(slice(0, d) for d in want)])
            if cut.shape != want:
                # a binding above MAX (a short range's hint, shapes/hints.py):
                # only the code printed there is used, never these values
                cut = np.pad(cut, [(0, w - c) for w, c in zip(want, cut.shape)])
            out[name] = cut
        for name in self.computed:
            out[name] = self.computed_at(name, binding)
        return out

    def computed_at(self, name: str, binding: Binding) -> np.ndarray:
        """A computed constant's value at ``binding``."""
        shape, dtype, polys = self.computed[name]
        values = self.by_name(binding)
        return np.array([p.evaluate(values) for p in polys], dtype=dtype).reshape(shape)

    # -- the graph with symbols -----------------------------------------------------------

    def symbolic(self, plan: Plan, graph: ir.Graph, hint: Binding) -> ir.Graph:
        """``graph`` (the plan's graph at ``hint``) with every dimension of
        the range a SymInt valued at ``hint``: what the emitter prints."""
        symbols = self.symbols(hint)

        def leaf(p: Poly) -> int:
            return sym(p, symbols)

        at = self._plan_with(plan, leaf)
        types = {p.name: ir.TensorType(p.shape, p.dtype) for p in at.primitives}
        nodes = tuple(
            replace(n, type=types[n.name], attrs=ir.Attrs(dict(p.attrs)))
            for n, p in zip(graph.nodes, at.primitives)
        )
        inputs = tuple(
            ir.Input(
                i.name, ir.TensorType(tuple(leaf(p) for p in self.inputs[i.name]), i.type.dtype)
            )
            if i.name in self.inputs
            else i
            for i in graph.inputs
        )
        shapes = {k: tuple(leaf(p) for p in v) for k, v in self.sliced.items()}
        values = {k: tuple(leaf(p) for p in polys) for k, (_, _, polys) in self.computed.items()}
        return ir.Graph(nodes, inputs, graph.outputs, graph.constants, graph.name, shapes, values)

    # -- the file ----------------------------------------------------------------------------

    def to_json(self) -> dict:
        order = self.names

        def polys(v) -> list:
            return [p.to_json(order) for p in v]

        return {
            "dims": [
                {
                    "name": d.name,
                    "code": d.code,
                    "min": d.range.min,
                    "max": d.range.max,
                    "opt": d.range.opt,
                }
                for d in self.dims
            ],
            "inputs": {k: polys(v) for k, v in sorted(self.inputs.items())},
            "shapes": {k: polys(v) for k, v in sorted(self.shapes.items())},
            "attrs": {
                k: {a: _value_json(x, order) for a, x in sorted(v.items())}
                for k, v in sorted(self.attrs.items())
            },
            "sliced": {k: polys(v) for k, v in sorted(self.sliced.items())},
            "computed": {
                k: {"shape": list(shape), "dtype": dtype, "values": polys(values)}
                for k, (shape, dtype, values) in sorted(self.computed.items())
            },
        }

    @staticmethod
    def from_json(data: Mapping, source: str) -> Family:
        try:
            dims = tuple(
                Dim(
                    str(d["name"]),
                    _code(d["code"], i),
                    DimRange(int(d["min"]), int(d["max"]), int(d["opt"])),
                )
                for i, d in enumerate(data["dims"])
            )
            order = tuple(d.name for d in dims)
            if len(set(order)) != len(order):
                raise ValueError("two dimensions share a name")
            for d in dims:
                if not 1 <= d.range.min <= d.range.opt <= d.range.max:
                    raise ValueError(f"dimension {d.code}: range {d.range} is not MIN..MAX@OPT")

            def shapes(d: Mapping) -> dict:
                return {
                    str(k): tuple(Poly.from_json(p, order, f"{k}") for p in v) for k, v in d.items()
                }

            attrs = {
                str(k): {str(a): _value_from_json(x, order, f"{k}.{a}") for a, x in v.items()}
                for k, v in data["attrs"].items()
            }
            computed = {}
            for k, v in data.get("computed", {}).items():
                shape = tuple(int(d) for d in v["shape"])
                dtype = str(v["dtype"])
                if dtype not in COMPUTED_DTYPES:
                    raise ValueError(f"{k}: computed constant of dtype {dtype!r}")
                polys = tuple(Poly.from_json(p, order, k) for p in v["values"])
                if len(polys) != int(np.prod(shape, dtype=np.int64)):
                    raise ValueError(f"{k}: {len(polys)} values for shape {list(shape)}")
                computed[str(k)] = (shape, dtype, polys)
            return Family(
                dims,
                shapes(data["inputs"]),
                shapes(data["shapes"]),
                attrs,
                shapes(data["sliced"]),
                computed,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InputError(f"{source}: malformed dimensions ({e})") from None


def _code(value, i: int) -> str:
    if value != f"dim{i}":
        raise ValueError(f"dimension {i} must have code name dim{i}")
    return value


def _leaves(value, leaf):
    if isinstance(value, Poly):
        return leaf(value)
    if isinstance(value, tuple):
        return tuple(_leaves(v, leaf) for v in value)
    return value


def _value_json(value, order):
    if isinstance(value, Poly):
        return {"poly": value.to_json(order)}
    if isinstance(value, tuple):
        return {"tuple": [_value_json(v, order) for v in value]}
    return {"value": value}


def _value_from_json(data, order, where: str):
    if "poly" in data:
        return Poly.from_json(data["poly"], order, where)
    if "tuple" in data:
        return tuple(_value_from_json(v, order, where) for v in data["tuple"])
    value = data["value"]
    if not isinstance(value, (int, float, str)) or isinstance(value, bool):
        raise ValueError(f"{where}: unexpected attribute value")
    return value


# -- the family of a graph whose dimensions are symbols ----------------------------------


def _formula(x) -> Poly | None:
    return x.poly if isinstance(x, SymInt) else None


def _formulas(value):
    """An attribute value with each SymInt as its Poly; None when it holds none."""
    if isinstance(value, SymInt):
        return value.poly
    if isinstance(value, tuple):
        inner = [_formulas(v) for v in value]
        if all(i is None for i in inner):
            return None
        return tuple(
            Poly.of(v) if i is None and type(v) is int else (v if i is None else i)
            for v, i in zip(value, inner)
        )
    return None


def _shape_formulas(shape) -> tuple[Poly, ...] | None:
    if not any(isinstance(d, SymInt) for d in shape):
        return None
    return tuple(Poly.of(d.poly if isinstance(d, SymInt) else int(d)) for d in shape)


def family_of(dims: Sequence[Dim], graph: ir.Graph, source: str) -> Family:
    """The family of ``graph``, a primitive graph whose dimensions are
    SymInts (made by fission at the hint binding)."""
    inputs = {}
    for i in graph.inputs:
        f = _shape_formulas(i.type.shape)
        if f is not None:
            inputs[i.name] = f
    shapes, attrs = {}, {}
    for n in graph.nodes:
        f = _shape_formulas(n.shape)
        if f is not None:
            shapes[n.name] = f
        changed = {a: p for a, v in n.attrs.items() if (p := _formulas(v)) is not None}
        if changed:
            attrs[n.name] = changed
    sliced = {k: _shape_formulas(v) for k, v in graph.constant_shapes.items()}
    computed = {}
    for k, values in graph.constant_values.items():
        arr = graph.constants[k]
        where = f"{source}: constant '{text.shown(k)}'"
        if k in sliced or arr.dtype.name not in COMPUTED_DTYPES or arr.size > COMPUTED_MAX:
            raise InputError(
                f"{where} holds dimensions of the range as data in a way orchestrate "
                "cannot follow; narrow the range with --shape or --dim"
            )
        computed[k] = (
            tuple(arr.shape),
            arr.dtype.name,
            tuple(Poly.of(v.poly if isinstance(v, SymInt) else int(v)) for v in values),
        )
    return Family(
        tuple(dims), inputs, shapes, attrs, {k: v for k, v in sliced.items() if v}, computed
    )


# -- checking a graph made at a binding ------------------------------------------------


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """The same dtype, shape and values (the same object, at once)."""
    return a is b or (a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b)))


def _same_constant(a: ir.Graph, i: str, b: ir.Graph, j: str) -> bool:
    """Two constants of the same value under different names (the frontend
    names a folded scalar after the node it came from, which can differ
    between bindings): the family keeps the symbolic graph's name."""
    x, y = a.constants.get(i), b.constants.get(j)
    return x is not None and y is not None and same_array(x, y)


def check_instance(
    family: Family,
    symbolic: ir.Graph,
    g: ir.Graph,
    binding: Binding,
    top: ir.Graph,
    source: str,
) -> None:
    """``g``, the graph the frontend made at ``binding``, is what the family
    (whose symbolic graph is ``symbolic``) gives there; ``top`` the graph at
    MAX, whose constants are the ones kept for slicing.  InputError naming
    the node where it is not: the range cannot be served as planned."""
    at = family.named(binding)
    a, b = symbolic, g
    if len(a.nodes) != len(b.nodes) or [n.name for n in a.nodes] != [n.name for n in b.nodes]:
        only = sorted({n.name for n in a.nodes} ^ {n.name for n in b.nodes})
        what = f"primitive {only[0]!r} exists at one binding only" if only else "the order differs"
        raise InputError(
            f"{source}: the model's primitives change at {at}: {what}; "
            "narrow the range with --shape or --dim"
        )
    for x, y in zip(a.nodes, b.nodes):
        same_inputs = len(x.inputs) == len(y.inputs) and all(
            i == j or _same_constant(a, i, b, j) for i, j in zip(x.inputs, y.inputs)
        )
        if x.op != y.op or not same_inputs or x.dtype != y.dtype or set(x.attrs) != set(y.attrs):
            raise InputError(
                f"{source}: node {x.name!r} ({x.op.value}) differs at {at} "
                f"({y.op.value}, inputs {list(y.inputs)}); narrow the range"
            )
    if [(i.name, i.type.dtype) for i in a.inputs] != [(i.name, i.type.dtype) for i in b.inputs]:
        raise InputError(f"{source}: the graph inputs differ at {at}")
    if a.outputs != b.outputs:
        raise InputError(f"{source}: the graph's outputs differ at {at}")
    values = family.by_name(binding)
    for i in b.inputs:
        want = family.input_shape(i.name, binding) if i.name in family.inputs else None
        if want is not None and want != i.type.shape:
            raise InputError(
                f"{source}: input {i.name!r} at {at} is {list(i.type.shape)}, not {list(want)}"
            )
    for x, n in zip(a.nodes, b.nodes):
        shape = family.shapes.get(n.name)
        want = tuple(d.evaluate(values) for d in shape) if shape is not None else tuple(x.shape)
        if want != n.shape:
            raise InputError(
                f"{source}: node {n.name!r} ({n.op.value}) at {at} has shape "
                f"{list(n.shape)}, not {list(want)}: its shape follows the range's "
                "dimensions in a way orchestrate cannot follow; narrow the range"
            )
        for k in n.attrs:
            f = family.attrs.get(n.name, {}).get(k)
            expected = _leaves(f, lambda p: p.evaluate(values)) if f is not None else x.attrs[k]
            if expected != n.attrs[k]:
                raise InputError(
                    f"{source}: node {n.name!r} ({n.op.value}) at {at}: attribute "
                    f"{k!r} is {n.attrs[k]!r}, not {expected!r}; narrow the range"
                )
    if not family.contains(binding):
        return
    cut = family.constants_at({k: top.constants[k] for k in family.sliced}, binding)
    for name, arr in cut.items():
        mine = g.constants[name]
        if mine.shape != arr.shape or not np.array_equal(mine, arr):
            raise InputError(
                f"{source}: constant {name!r} at {at} is not the first "
                f"{list(mine.shape)} of its value at MAX; narrow the range"
            )
    for name, arr in g.constants.items():
        if name in family.computed:
            want = family.computed_at(name, binding)
            if want.shape != arr.shape or not np.array_equal(want, arr):
                raise InputError(
                    f"{source}: constant {name!r} at {at} is {arr.tolist()}, not "
                    f"{want.tolist()}: the range's formula does not hold there"
                )
            continue
        kept = top.constants.get(name)  # (a name only here is a renamed scalar: _same_constant)
        if kept is not None and name not in family.sliced and not same_array(arr, kept):
            raise InputError(f"{source}: constant {name!r} changes at {at}; narrow the range")
