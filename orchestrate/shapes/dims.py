"""A dimension range ``MIN..MAX@OPT`` and the parsers of ``--shape`` / ``--dim``.

In ``--shape NAME=DIMS`` each dimension is ``N``, ``MIN..MAX`` or
``MIN..MAX@OPT``, separated by ``x`` (``x=1..8x2..64@32``).  ``--dim
SYMBOL=MIN..MAX[@OPT]`` gives a range to a symbolic dimension of the model
(an input's ``dim_param`` such as ``batch`` or ``seq``).  OPT, the shape a
plan would be tuned for, defaults to MAX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrate.errors import InputError


@dataclass(frozen=True)
class DimRange:
    """Every integer from ``min`` to ``max``, both included; ``opt`` the one that matters most."""

    min: int
    max: int
    opt: int | None = None

    def __post_init__(self):
        if self.opt is None:
            object.__setattr__(self, "opt", self.max)

    @property
    def fixed(self) -> bool:
        return self.min == self.max

    def __contains__(self, value: int) -> bool:
        return self.min <= value <= self.max

    def __str__(self) -> str:
        if self.fixed:
            return str(self.min)
        return f"{self.min}..{self.max}" + (f"@{self.opt}" if self.opt != self.max else "")


_NUMBER = r"\s*(\d+)\s*"
_RANGE = re.compile(rf"{_NUMBER}(?:\.\.{_NUMBER}(?:@{_NUMBER})?)?")


def parse_range(text: str, where: str) -> DimRange:
    """``N``, ``MIN..MAX`` or ``MIN..MAX@OPT`` -> DimRange; InputError naming ``where``."""
    m = _RANGE.fullmatch(text)
    if m is None:
        if re.fullmatch(r"\s*-\s*\d+.*", text):
            raise InputError(f"{where}: dimension {text!r} is negative; dimensions must be >= 1")
        raise InputError(f"{where}: dimension {text!r} is not N, MIN..MAX or MIN..MAX@OPT")
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) is not None else lo
    opt = int(m.group(3)) if m.group(3) is not None else hi
    if lo < 1:
        raise InputError(f"{where}: dimension {text!r} starts at {lo}; dimensions must be >= 1")
    if lo > hi:
        raise InputError(f"{where}: dimension {text!r} has MIN {lo} above MAX {hi}")
    if not lo <= opt <= hi:
        raise InputError(f"{where}: dimension {text!r} has OPT {opt} outside {lo}..{hi}")
    return DimRange(lo, hi, opt)


def is_range_text(text: str) -> bool:
    """Whether a ``--shape`` value uses the range syntax (``..`` in its dims)."""
    return ".." in text.partition("=")[2]


def parse_range_shape(text: str) -> tuple[str, tuple[DimRange, ...]]:
    """``--shape NAME=1..8x2..64@32`` -> ("NAME", (DimRange(1, 8), DimRange(2, 64, 32)))."""
    name, sep, dims = text.partition("=")
    if not sep or not name.strip() or not dims.strip():
        raise InputError(f"--shape {text!r}: expected NAME=DIMS such as x=1..8x2..64@32")
    where = f"--shape {text}"
    return name, tuple(parse_range(d, where) for d in dims.replace(",", "x").split("x"))


def parse_dim(text: str) -> tuple[str, DimRange]:
    """``--dim seq=2..64@32`` -> ("seq", DimRange(2, 64, 32))."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise InputError(f"--dim {text!r}: expected SYMBOL=MIN..MAX[@OPT] such as seq=2..64")
    return name.strip(), parse_range(value, f"--dim {text}")
