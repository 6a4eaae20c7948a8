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
from orchestrate.shapes.affine import Affine
from orchestrate.shapes.dims import DimRange, parse_range

Shape = tuple[Affine, ...]


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
    params = {d.dim_param for i in inputs for d in _dims(i) if d.dim_param}
    for symbol in dims:
        if symbol not in params:
            known = ", ".join(sorted(params)) or "none"
            raise InputError(
                f"{flags.dim_of(symbol)}: the model has no dimension {symbol!r} (dimensions: {known})"
            )
    ranges: dict[str, DimRange] = {}
    out: dict[str, Shape] = {}
    # inputs given by --shape first, so that their dim_params bind the same
    # dim_param of the other inputs
    for name, vi in sorted(by_name.items(), key=lambda item: item[0] not in shapes):
        if not vi.type.HasField("tensor_type"):
            raise InputError(f"{source}: input {name!r} is not a tensor")
        model_dims = _dims(vi)
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
        shape = []
        for k in range(len(given) if given is not None else len(model_dims)):
            d = model_dims[k] if k < len(model_dims) else None
            r = given[k] if given is not None else None
            shape.append(_bind_one(name, k, d, r, dims, ranges, source, flags))
        out[name] = tuple(shape)
    order = {name: out[name] for name in by_name}
    return order, {s: r for s, r in ranges.items() if not r.fixed}


def _bind_one(name, k, d, r, dims, ranges, source, flags: Flags) -> Affine:
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
        return _declare(symbol, r, ranges, flags.shape_of(name))
    if fixed:
        return Affine.of(d.dim_value)
    if d is not None and d.dim_param in ranges:
        r = ranges[d.dim_param]
        return Affine.of(r.min) if r.fixed else Affine.of(d.dim_param)
    if d is not None and d.dim_param and d.dim_param in dims:
        return _declare(d.dim_param, dims[d.dim_param], ranges, flags.dim_of(d.dim_param))
    what = f"dimension {d.dim_param!r}" if d is not None and d.dim_param else "a dynamic dimension"
    hint = f"{flags.dim_of(d.dim_param, 'MIN..MAX')} or " if d is not None and d.dim_param else ""
    raise InputError(
        f"{source}: input {name!r} has {what} at axis {k}; pass {hint}{flags.shape_of(name)}"
    )


def _declare(symbol: str, r: DimRange, ranges: dict[str, DimRange], flag: str) -> Affine:
    """The symbol (a number when MIN == MAX); ``ranges`` keeps fixed ones too
    until binding ends, so that every use of a dim_param agrees."""
    if ranges.get(symbol, r) != r:
        raise InputError(
            f"{flag}: dimension {symbol!r} is given two ranges, {ranges[symbol]} and {r}"
        )
    ranges[symbol] = r
    return Affine.of(r.min) if r.fixed else Affine.of(symbol)


def _dims(vi: onnx.ValueInfoProto):
    tt = vi.type.tensor_type
    return list(tt.shape.dim) if vi.type.HasField("tensor_type") and tt.HasField("shape") else []


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
