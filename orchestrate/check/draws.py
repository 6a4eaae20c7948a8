"""What verification feeds a model: random inputs, bounded or given.

By default each input is drawn from what the graph needs (``random_inputs``
in ``verify.py``: normal floats, integers within the axes they index or the
constants they are compared with, nonzero divisors).  A user who knows
better says so:

``--input-range NAME=LO..HI``  floats uniform in [LO, HI), integers in
                               LO..HI (both ends included);
``--input NAME=FILE.npy``      this array in every trial (a static shape only:
                               a range bundle is verified at several shapes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from orchestrate import ir, text
from orchestrate.errors import InputError


@dataclass(frozen=True)
class Draws:
    """``ranges``: input -> (low, high); ``given``: input -> its array."""

    ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    given: Mapping[str, np.ndarray] = field(default_factory=dict)


def parse_range(text: str, option: str = "--input-range") -> tuple[str, tuple[float, float]]:
    """``NAME=LO..HI`` as (name, (lo, hi))."""
    name, sep, span = text.rpartition("=")
    lo, dots, hi = span.partition("..")
    try:
        if not sep or not name or not dots:
            raise ValueError
        bounds = float(lo), float(hi)
    except ValueError:
        raise InputError(f"{option} {text!r}: expected NAME=LO..HI, e.g. {option} x=0..1") from None
    if not all(map(math.isfinite, bounds)) or bounds[0] > bounds[1]:
        raise InputError(f"{option} {name}: {lo}..{hi} is not a finite range from low to high")
    return name, bounds


def check_draws(draws: Draws, graph: ir.Graph, source: str) -> None:
    """InputError naming the flag when a draw names no input of ``graph``,
    gives an array of another shape or dtype, or a range an input of its
    type cannot take."""
    types = {i.name: i.type for i in graph.inputs}
    for option, names in (("--input-range", draws.ranges), ("--input", draws.given)):
        for name in names:
            if name not in types:
                known = ", ".join(map(text.shown, sorted(types))) or "none"
                raise InputError(
                    f"{option} {name}: {source} has no input {name!r} (its inputs: {known})"
                )
    for name, (lo, hi) in draws.ranges.items():
        t = types[name]
        if t.dtype == "bool":
            raise InputError(f"--input-range {name}: input {name!r} is bool")
        if t.dtype in ir.INTS and (lo != int(lo) or hi != int(hi)):
            raise InputError(
                f"--input-range {name}: input {name!r} is {t.dtype}: give integer bounds"
            )
        if t.dtype in ir.INTS:
            info = np.iinfo(t.dtype)
            if lo < info.min or hi > info.max:
                raise InputError(f"--input-range {name}: {lo:g}..{hi:g} does not fit {t.dtype}")
    for name, arr in draws.given.items():
        t = types[name]
        if tuple(arr.shape) != tuple(t.shape) or arr.dtype.name != t.dtype:
            raise InputError(
                f"--input {name}: {arr.dtype.name}{list(arr.shape)} given, the model takes "
                f"{t.dtype}{list(t.shape)}"
            )


def drawn(t: ir.TensorType, bounds: tuple[float, float], rng: np.random.Generator) -> np.ndarray:
    lo, hi = bounds
    if t.dtype in ir.INTS:
        return rng.integers(int(lo), int(hi), size=t.shape, endpoint=True).astype(t.dtype)
    return rng.uniform(lo, hi, size=t.shape).astype(t.dtype)
