"""One primitive graph for a range of shapes: the family, lifted from instances.

The frontend folds shape arithmetic to constants, so it makes one primitive
graph per binding of the dimensions.  A :class:`Family` is what those graphs
share and how they differ: the same primitives, ops, inputs and dtypes at
every binding, and shapes and integer attributes that are polynomials of the
binding (``shapes/poly.py``).  Constants that depend on the binding (position
embeddings gathered for ``seq`` positions, a causal mask of ``seq x seq``) are
kept once, at MAX, and sliced: the family checks that each is a prefix of
the MAX one.

``lift_family`` builds it from the graphs at a grid of bindings and checks it
against the graphs at other bindings (MIN, OPT, MAX).  What does not hold
(a node that exists at one binding only, a shape that no polynomial gives, a
constant that is not a prefix) is an InputError naming the node, so nothing
is planned for a range the bundle could not serve.  ``plan_at`` and
``constants_at`` make the concrete plan of one binding, which the runner and
the emitter use exactly as a static plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from orchestrate import ir, text
from orchestrate.errors import InputError
from orchestrate.plan import Plan, Primitive
from orchestrate.shapes.dims import DimRange
from orchestrate.shapes.poly import Grid, NotLifted, Poly

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


@dataclass(frozen=True)
class Family:
    """``dims`` in binding order, the ``grid`` the family was lifted on, and
    what varies: graph input shapes, primitive shapes, primitive attributes
    (``attrs[node][attr]``: the value with :class:`Poly` leaves) and the
    shapes of the constants kept at MAX and sliced (``sliced``)."""

    dims: tuple[Dim, ...]
    grid: Grid
    inputs: Mapping[str, tuple[Poly, ...]]
    shapes: Mapping[str, tuple[Poly, ...]]
    attrs: Mapping[str, Mapping[str, Any]]
    sliced: Mapping[str, tuple[Poly, ...]]
    # constants whose values are polynomials of the binding (a sequence length
    # folded from Shape and used as data, as mean pooling divides by it):
    # name -> (shape, dtype, one polynomial per element in C order)
    computed: Mapping[str, tuple[tuple[int, ...], str, tuple[Poly, ...]]] = None  # type: ignore[assignment]

    def __post_init__(self):
        if self.computed is None:
            object.__setattr__(self, "computed", {})

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(d.code for d in self.dims)

    def at(self, which: str) -> Binding:
        """``min``, ``opt`` or ``max`` of every dimension."""
        return tuple(getattr(d.range, which) for d in self.dims)

    def named(self, binding: Binding) -> str:
        return named(self.dims, binding)

    def contains(self, binding: Binding) -> bool:
        return all(v in d.range for d, v in zip(self.dims, binding))

    def input_shape(self, name: str, binding: Binding) -> tuple[int, ...]:
        return tuple(p(binding) for p in self.inputs[name])

    def plan_at(self, plan: Plan, binding: Binding) -> Plan:
        """``plan`` (made at any binding of the family) with every shape and
        attribute at ``binding``."""
        prims = tuple(self._primitive(p, binding) for p in plan.primitives)
        inputs = tuple(
            replace(i, shape=self.input_shape(i.name, binding)) if i.name in self.inputs else i
            for i in plan.graph.inputs
        )
        return replace(plan, primitives=prims, graph=replace(plan.graph, inputs=inputs))

    def _primitive(self, p: Primitive, binding: Binding) -> Primitive:
        shape = self.shapes.get(p.name)
        attrs = self.attrs.get(p.name)
        if shape is None and attrs is None:
            return p
        new = p
        if shape is not None:
            new = replace(new, shape=tuple(d(binding) for d in shape))
        if attrs is not None:
            merged = dict(p.attrs)
            merged.update({k: _evaluate(v, binding) for k, v in attrs.items()})
            new = replace(new, attrs=ir.Attrs(merged))
        return new

    def stored_mismatch(self, constants: Mapping[str, np.ndarray]) -> str | None:
        """Why ``constants`` (a bundle's) were not stored for this range, or
        None: each sliced constant is kept at MAX, so its shape is its shape
        formula at MAX (a dims.json given a larger MAX would cut past the
        end of what was stored, and pad with zeros)."""
        top = self.at("max")
        for name, shape in sorted(self.sliced.items()):
            want = tuple(d(top) for d in shape)
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
        out = dict(constants)
        for name, shape in self.sliced.items():
            want = tuple(d(binding) for d in shape)
            cut = np.ascontiguousarray(constants[name][tuple(slice(0, d) for d in want)])
            if cut.shape != want:
                # a grid point above MAX (a short range's, shapes/probes.py):
                # only the code printed there is used, never these values
                cut = np.pad(cut, [(0, w - c) for w, c in zip(want, cut.shape)])
            out[name] = cut
        for name in self.computed:
            out[name] = self.computed_at(name, binding)
        return out

    def computed_at(self, name: str, binding: Binding) -> np.ndarray:
        """A computed constant's value at ``binding``."""
        shape, dtype, polys = self.computed[name]
        return np.array([p(binding) for p in polys], dtype=dtype).reshape(shape)

    # -- the file --------------------------------------------------------------

    def to_json(self) -> dict:
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
            "grid": [list(v) for v in self.grid.values],
            "inputs": {k: [p.to_json() for p in v] for k, v in sorted(self.inputs.items())},
            "shapes": {k: [p.to_json() for p in v] for k, v in sorted(self.shapes.items())},
            "attrs": {
                k: {a: _value_json(x) for a, x in sorted(v.items())}
                for k, v in sorted(self.attrs.items())
            },
            "sliced": {k: [p.to_json() for p in v] for k, v in sorted(self.sliced.items())},
            "computed": {
                k: {"shape": list(shape), "dtype": dtype, "values": [p.to_json() for p in polys]}
                for k, (shape, dtype, polys) in sorted(self.computed.items())
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
            grid = Grid(tuple(tuple(int(x) for x in v) for v in data["grid"]))
            n = len(dims)
            if grid.rank != n:
                raise ValueError("grid and dims disagree")

            def shapes(d: Mapping) -> dict:
                return {
                    str(k): tuple(Poly.from_json(p, n, f"{k}") for p in v) for k, v in d.items()
                }

            attrs = {
                str(k): {str(a): _value_from_json(x, n, f"{k}.{a}") for a, x in v.items()}
                for k, v in data["attrs"].items()
            }
            computed = {}
            for k, v in data.get("computed", {}).items():
                shape = tuple(int(d) for d in v["shape"])
                dtype = str(v["dtype"])
                if dtype not in COMPUTED_DTYPES:
                    raise ValueError(f"{k}: computed constant of dtype {dtype!r}")
                polys = tuple(Poly.from_json(p, n, k) for p in v["values"])
                if len(polys) != int(np.prod(shape, dtype=np.int64)):
                    raise ValueError(f"{k}: {len(polys)} values for shape {list(shape)}")
                computed[str(k)] = (shape, dtype, polys)
            return Family(
                dims,
                grid,
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


def _evaluate(value, binding: Binding):
    if isinstance(value, Poly):
        return value(binding)
    if isinstance(value, tuple):
        return tuple(_evaluate(v, binding) for v in value)
    return value


def _value_json(value):
    if isinstance(value, Poly):
        return {"poly": value.to_json()}
    if isinstance(value, tuple):
        return {"tuple": [_value_json(v) for v in value]}
    return {"value": value}


def _value_from_json(data, rank: int, where: str):
    if "poly" in data:
        return Poly.from_json(data["poly"], rank, where)
    if "tuple" in data:
        return tuple(_value_from_json(v, rank, where) for v in data["tuple"])
    value = data["value"]
    if not isinstance(value, (int, float, str)) or isinstance(value, bool):
        raise ValueError(f"{where}: unexpected attribute value")
    return value


# -- lifting ---------------------------------------------------------------------


def lift_family(
    dims: Sequence[Dim],
    grid: Grid,
    graphs: Mapping[Binding, ir.Graph],
    checks: Mapping[Binding, ir.Graph],
    top: Binding,
    source: str,
) -> Family:
    """The family of ``graphs`` (one per grid point), checked against
    ``checks`` (other bindings: MIN, OPT, MAX); ``top`` is the binding whose
    constants are kept for slicing (MAX, which must be in ``checks``)."""
    points = grid.points
    first = graphs[points[0]]
    every = {**graphs, **checks}
    for b, g in every.items():
        _same_structure(first, g, dims, b, source)
    where = _Where(dims, source)
    inputs = {}
    for i, inp in enumerate(first.inputs):
        lifted = _lift_shape(
            [graphs[p].inputs[i].type.shape for p in points], grid, where.of(f"input {inp.name!r}")
        )
        if lifted is not None:
            inputs[inp.name] = lifted
    shapes, attrs = {}, {}
    for k, node in enumerate(first.nodes):
        at = where.of(f"node {node.name!r} ({node.op.value})")
        lifted = _lift_shape([graphs[p].nodes[k].shape for p in points], grid, at)
        if lifted is not None:
            shapes[node.name] = lifted
        changed = {}
        for a in node.attrs:
            values = [graphs[p].nodes[k].attrs[a] for p in points]
            if any(v != values[0] for v in values):
                changed[a] = _lift_value(values, grid, at + f", attribute {a!r}")
        if changed:
            attrs[node.name] = changed
    sliced, computed = {}, {}
    for name in first.constants:
        if any(name not in graphs[p].constants for p in points):
            continue  # renamed elsewhere: equal there by value (_same_constant)
        arrays = [graphs[p].constants[name] for p in points]
        if all(a.shape == arrays[0].shape and np.array_equal(a, arrays[0]) for a in arrays):
            continue
        at = where.of(f"constant {name!r}")
        lifted = _lift_shape([a.shape for a in arrays], grid, at)
        if lifted is None:
            computed[name] = _lift_values(arrays, grid, at)
        else:
            sliced[name] = lifted
    family = Family(tuple(dims), grid, inputs, shapes, attrs, sliced, computed)
    for b, g in every.items():
        _check_instance(family, g, b, checks.get(top) or graphs[top], source)
    return family


class _Where:
    def __init__(self, dims: Sequence[Dim], source: str):
        self.names = ", ".join(d.shown for d in dims)
        self.source = source

    def of(self, what: str) -> str:
        return f"{self.source}: {what} cannot serve the range of {self.names}"


def _lift_shape(shapes: Sequence[tuple[int, ...]], grid: Grid, at: str) -> tuple[Poly, ...] | None:
    """The shape as polynomials, or None when it is the same at every point."""
    if all(s == shapes[0] for s in shapes):
        return None
    if any(len(s) != len(shapes[0]) for s in shapes):
        raise InputError(f"{at}: its rank changes with the shape")
    out = []
    for axis in range(len(shapes[0])):
        p = grid.lift([s[axis] for s in shapes])
        if isinstance(p, NotLifted):
            raise InputError(f"{at}: axis {axis}: {p.reason}")
        out.append(p)
    return tuple(out)


COMPUTED_DTYPES = ("int32", "int64", "float16", "float32", "float64")
COMPUTED_MAX = 64  # elements: a shape vector or a scalar, not a tensor of data


def _lift_values(arrays: Sequence[np.ndarray], grid: Grid, at: str):
    """A small constant whose elements are whole numbers that are
    polynomials of the binding: (shape, dtype, polynomials)."""
    first = arrays[0]
    if first.dtype.name not in COMPUTED_DTYPES or first.size > COMPUTED_MAX:
        raise InputError(f"{at}: its values change with the shape")
    flat = [a.reshape(-1) for a in arrays]
    if any(not np.array_equal(np.round(f), f) for f in flat):
        raise InputError(f"{at}: its values change with the shape, and not as whole numbers")
    polys = []
    for k in range(first.size):
        p = grid.lift([int(f[k]) for f in flat])
        if isinstance(p, NotLifted):
            raise InputError(f"{at}: its values change with the shape ({p.reason})")
        polys.append(p)
    return tuple(first.shape), first.dtype.name, tuple(polys)


def _lift_value(values: Sequence[Any], grid: Grid, at: str):
    first = values[0]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        p = grid.lift(list(values))
        if isinstance(p, NotLifted):
            raise InputError(f"{at}: {p.reason}")
        return p
    if all(isinstance(v, tuple) and len(v) == len(first) for v in values):
        return tuple(_lift_value([v[i] for v in values], grid, at) for i in range(len(first)))
    if all(v == first for v in values):
        return first
    raise InputError(f"{at}: it changes with the shape ({first!r}, {values[-1]!r})")


def _same_structure(
    a: ir.Graph, b: ir.Graph, dims: Sequence[Dim], binding: Binding, source: str
) -> None:
    at = named(dims, binding)
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


def _same_constant(a: ir.Graph, i: str, b: ir.Graph, j: str) -> bool:
    """Two constants of the same value under different names (the frontend
    names a folded scalar after the node it came from, which can differ
    between bindings): the family keeps the first graph's name."""
    x, y = a.constants.get(i), b.constants.get(j)
    return x is not None and y is not None and same_array(x, y)


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """The same dtype, shape and values (the same object, at once)."""
    return a is b or (a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b)))


def _check_instance(
    family: Family, g: ir.Graph, binding: Binding, top: ir.Graph, source: str
) -> None:
    """``g`` (the graph made at ``binding``) is what the family gives there."""
    at = family.named(binding)
    for i in g.inputs:
        if i.name in family.inputs and family.input_shape(i.name, binding) != i.type.shape:
            raise InputError(
                f"{source}: input {i.name!r} at {at} is {list(i.type.shape)}, not "
                f"{list(family.input_shape(i.name, binding))}"
            )
    for n in g.nodes:
        shape = family.shapes.get(n.name)
        want = tuple(d(binding) for d in shape) if shape is not None else None
        if want is not None and want != n.shape:
            raise InputError(
                f"{source}: node {n.name!r} ({n.op.value}) at {at} has shape "
                f"{list(n.shape)}, not {list(want)}: the range's formula does not "
                "hold there; narrow the range"
            )
        for a, v in family.attrs.get(n.name, {}).items():
            if _evaluate(v, binding) != n.attrs[a]:
                raise InputError(
                    f"{source}: node {n.name!r} ({n.op.value}) at {at}: attribute "
                    f"{a!r} is {n.attrs[a]!r}, not {_evaluate(v, binding)!r}; "
                    "narrow the range"
                )
    if not family.contains(binding):
        return  # a grid point above MAX: its graph only prints code (shapes/probes.py)
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
        if kept is not None and name not in family.sliced and not np.array_equal(arr, kept):
            raise InputError(f"{source}: constant {name!r} changes at {at}; narrow the range")
