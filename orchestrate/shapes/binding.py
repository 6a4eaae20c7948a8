"""Bind each input dimension of an ONNX model to a constant or a symbol.

A number stays a constant.  A dimension given a range by ``--shape
NAME=1..8x2..64`` becomes the input's ``dim_param`` when it has one (so
``batch`` is the same symbol in every input) or a generated ``NAME_AXIS``;
``--dim SYMBOL=MIN..MAX`` gives a range to a ``dim_param`` wherever it
appears.  A range whose MIN equals its MAX is a constant.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from orchestrate.errors import InputError
from orchestrate.frontend import tensor_dims
from orchestrate.shapes.dims import DimRange, parse_range
from orchestrate.shapes.poly import Poly, expression_of, parse_dim_expression, plain_names

Shape = tuple[Poly, ...]


@dataclass(frozen=True)
class Flags:
    """How messages name what the user gave: the CLI's options
    (``--shape x=...``) or the API's arguments (``shapes['x']``)."""

    shape: str = "--shape"
    dim: str = "--dim"

    def _of(self, option: str, key: str, value: str = "...") -> str:
        if option.startswith("--"):
            return f"{option} {key}={value}"
        return f"{option}[{key!r}]" + (f"={value!r}" if value != "..." else "")

    def shape_of(self, name: str, value: str = "...") -> str:
        return self._of(self.shape, name, value)

    def dim_of(self, symbol: str, value: str = "...") -> str:
        return self._of(self.dim, symbol, value)


CLI = Flags()
API = Flags("shapes", "dims")


def bind_inputs(
    inputs: list[onnx.ValueInfoProto],
    shapes: Mapping[str, tuple[DimRange, ...]],
    dims: Mapping[str, DimRange],
    source: str = "<model>",
    flags: Flags = CLI,
) -> tuple[dict[str, Shape], dict[str, DimRange]]:
    """(input name -> symbolic shape, symbol -> range); InputError naming
    the flag for a rank or fixed dimension that disagrees, an unknown input or
    symbol, a symbol given two ranges, or a dynamic dimension left unbound."""
    by_name = {i.name: i for i in inputs}
    for name in shapes:
        if name not in by_name:
            known = ", ".join(by_name) or "none"
            raise InputError(
                f"{flags.shape_of(name)}: the model has no input {name!r} (inputs: {known})"
            )
    params = {d.dim_param for i in inputs for d in tensor_dims(i) if d.dim_param}
    names = plain_names(params) | set(dims)
    expressions = {p: e for p in params if (e := expression_of(p, names)) is not None}
    params |= {s for e in expressions.values() for s in e.symbols}
    for symbol in dims:
        if symbol not in params:
            known = ", ".join(sorted(params)) or "none"
            raise InputError(
                f"{flags.dim_of(symbol)}: the model has no dimension {symbol!r} (dimensions: {known})"
            )
    ranges: dict[str, DimRange] = {}
    origin: dict[str, str] = {}  # symbol -> the flag that gave its range
    later: list[tuple] = []  # expression axes, bound once the plain ones are
    out: dict[str, list] = {}

    # inputs given by --shape first, so that their dim_params bind the same
    # dim_param of the other inputs
    def bind_later() -> None:
        for name, k, e, text, r in later:
            out[name][k] = _bind_expression(
                name, k, e, text, r, dims, ranges, source, flags, origin
            )
        later.clear()

    for name, vi in sorted(by_name.items(), key=lambda item: item[0] not in shapes):
        if name not in shapes:
            bind_later()  # the given shapes' expressions may give their symbols' ranges
        if not vi.type.HasField("tensor_type"):
            raise InputError(f"{source}: input {name!r} is not a tensor")
        model_dims = tensor_dims(vi)
        given = shapes.get(name)
        if (
            given is not None
            and vi.type.tensor_type.HasField("shape")
            and len(model_dims) != len(given)
        ):
            raise InputError(
                f"{flags.shape_of(name)}: input {name!r} has rank {len(model_dims)}, not {len(given)}"
            )
        if given is None and not vi.type.tensor_type.HasField("shape"):
            raise InputError(
                f"{source}: input {name!r} has unknown rank; pass {flags.shape_of(name)}"
            )
        shape: list[Poly | None] = []
        for k in range(len(given) if given is not None else len(model_dims)):
            d = model_dims[k] if k < len(model_dims) else None
            r = given[k] if given is not None else None
            if d is not None and d.dim_param in expressions:
                later.append((name, k, expressions[d.dim_param], d.dim_param, r))
                shape.append(None)  # once every plain dimension is bound
            else:
                shape.append(_bind_one(name, k, d, r, dims, ranges, source, flags, origin))
        out[name] = shape
    bind_later()
    order = {name: tuple(out[name]) for name in by_name}
    return order, {s: r for s, r in ranges.items() if not r.fixed}


def _bind_expression(name, k, e: Poly, text, r, dims, ranges, source, flags, origin) -> Poly:
    """Axis ``k`` of ``name``, written ``text`` (the expression ``e``): its
    symbols bound by --dim or by the inputs' plain dimensions, or, for one
    symbol plus a constant, by the range the axis is given."""
    for s in sorted(e.symbols):
        if s not in ranges and s in dims:
            _declare(s, dims[s], ranges, flags.dim_of(s), origin)
    unbound = sorted(s for s in e.symbols if s not in ranges)
    if r is not None and len(unbound) == 1 and e - e.const == Poly.of(unbound[0]):
        shift = e.const
        if r.min - shift < 0:
            raise InputError(
                f"{flags.shape_of(name)}: axis {k} of input {name!r} is {text!r}, which is "
                f"at least {shift}, but is given {r}"
            )
        symbol_range = DimRange(r.min - shift, r.max - shift, r.opt - shift)
        _declare(unbound[0], symbol_range, ranges, flags.shape_of(name), origin)
        unbound = []
    if unbound:
        raise InputError(
            f"{source}: input {name!r} has dimension {text!r} at axis {k}; pass "
            f"{flags.dim_of(unbound[0], 'MIN..MAX')}"
        )
    lo, hi = e.bounds(ranges)
    opt = e.evaluate({s: ranges[s].opt for s in e.symbols})
    if r is not None and (lo, hi, opt) != (r.min, r.max, r.opt):
        via = " and ".join(sorted({origin[s] for s in e.symbols}))
        raise InputError(
            f"{flags.shape_of(name)}: axis {k} of input {name!r} is {text!r}, which {via} "
            f"make {DimRange(lo, hi, opt)}, not {r}"
        )
    if lo < 0:
        raise InputError(
            f"{source}: input {name!r} has dimension {text!r} at axis {k}, which is {lo} "
            f"at the ranges given; narrow {flags.dim}"
        )
    fixed = {s: ranges[s].min for s in e.symbols if ranges[s].fixed}
    return e.substitute(fixed)


def _bind_one(name, k, d, r, dims, ranges, source, flags: Flags, origin) -> Poly:
    fixed = d is not None and d.HasField("dim_value")
    if r is not None:
        if fixed and not (r.fixed and r.min == d.dim_value):
            raise InputError(
                f"{flags.shape_of(name)}: axis {k} of input {name!r} is fixed at {d.dim_value}"
            )
        symbol = d.dim_param if d is not None and d.dim_param else f"{name}_{k}"
        if symbol in dims and dims[symbol] != r:
            raise InputError(
                f"{flags.shape_of(name)}: axis {k} is {symbol!r}, given {dims[symbol]} by "
                f"{flags.dim} and {r} by {flags.shape}"
            )
        return _declare(symbol, r, ranges, flags.shape_of(name), origin)
    if fixed:
        return Poly.of(d.dim_value)
    if d is not None and d.dim_param in ranges:
        r = ranges[d.dim_param]
        return Poly.of(r.min) if r.fixed else Poly.of(d.dim_param)
    if d is not None and d.dim_param and d.dim_param in dims:
        return _declare(d.dim_param, dims[d.dim_param], ranges, flags.dim_of(d.dim_param), origin)
    what = f"dimension {d.dim_param!r}" if d is not None and d.dim_param else "a dynamic dimension"
    hint = ""
    if d is not None and d.dim_param:
        # ``past + 1`` whose ``past`` nothing names yet: ask for the symbol
        e = parse_dim_expression(d.dim_param) if any(c in d.dim_param for c in "+* ") else None
        names = sorted(e.symbols) if e is not None and e.symbols else [d.dim_param]
        hint = ", ".join(flags.dim_of(n, "MIN..MAX") for n in names) + " or "
    raise InputError(
        f"{source}: input {name!r} has {what} at axis {k}; pass {hint}{flags.shape_of(name)}"
    )


def _declare(
    symbol: str, r: DimRange, ranges: dict[str, DimRange], flag: str, origin: dict[str, str]
) -> Poly:
    """The symbol (a number when MIN == MAX); ``ranges`` keeps fixed ones too
    until binding ends, so that every use of a dim_param agrees; ``origin``
    the flag that gave each symbol its range."""
    if ranges.get(symbol, r) != r:
        raise InputError(
            f"{flag}: dimension {symbol!r} is given two ranges, {ranges[symbol]} and {r}"
        )
    ranges[symbol] = r
    origin.setdefault(symbol, flag)
    return Poly.of(r.min) if r.fixed else Poly.of(symbol)


@dataclass(frozen=True)
class Ranges:
    """What the user declared: input -> per-axis ranges (``--shape``) and
    symbol -> range (``--dim``)."""

    shapes: Mapping[str, tuple[DimRange, ...]]
    dims: Mapping[str, DimRange]
    flags: Flags = CLI  # how messages name them (the API's arguments: binding.API)


def _one_range(value, where: str) -> DimRange:
    if isinstance(value, DimRange):
        return value
    if isinstance(value, str):
        return parse_range(value, where)
    if (
        isinstance(value, tuple)
        and 2 <= len(value) <= 3
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return parse_range(
            "..".join(map(str, value[:2])) + (f"@{value[2]}" if len(value) == 3 else ""), where
        )
    if isinstance(value, int) and not isinstance(value, bool):
        return parse_range(str(value), where)
    raise InputError(
        f"{where}: {value!r} is not N, 'MIN..MAX[@OPT]', (MIN, MAX[, OPT]) or a DimRange"
    )


def parse_ranges(shapes, dims, option: str = "shapes") -> Ranges | None:
    """``shapes`` and ``dims`` as a :class:`Ranges`, or None when they
    declare no range (a static shape: ``frontend.check_shapes`` reads it)."""
    dims = dict(dims or {})
    if not isinstance(shapes, (Mapping, type(None))):
        return None  # check_shapes refuses it, naming the option
    shapes = dict(shapes or {})

    def ranged(v) -> bool:
        if isinstance(v, str):
            return ".." in v
        return isinstance(v, DimRange) or (
            isinstance(v, (tuple, list)) and any(isinstance(d, (str, DimRange, tuple)) for d in v)
        )

    if not dims and not any(ranged(v) for v in shapes.values()):
        return None
    out: dict[str, tuple[DimRange, ...]] = {}
    for name, value in shapes.items():
        where = f"{option}[{name!r}]" if option == "shapes" else f"{option} {name}"
        if isinstance(value, str):
            parts = value.replace(",", "x").split("x")
        elif isinstance(value, (tuple, list)):
            parts = list(value)
        else:
            raise InputError(f"{where}: expected dimensions, got {type(value).__name__}")
        out[str(name)] = tuple(_one_range(p, where) for p in parts)
    flags = API if option == "shapes" else CLI
    return Ranges(out, {str(k): _one_range(v, f"dims {k}") for k, v in dims.items()}, flags)
