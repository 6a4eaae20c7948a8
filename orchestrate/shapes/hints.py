"""Where a range's symbolic graph is made: the hint binding.

Fission runs once for a range, at one binding of its dimensions, each
dimension a SymInt valued there (``shapes/symint.py``).  Whatever the
formulas decide does not depend on that value; what they do not decide
(a number that left the symbols, a comparison no bound settles) falls back
to it, and is then caught where the graphs made at MIN, OPT and MAX differ
from the symbolic graph.  So the value is chosen to be generic: odd (no
power-of-two block divides it), at least 3 (a 1 or a 2 makes size-1
broadcasts and special cases), unlike every fixed dimension of the model
(no two tensors' shapes coincide by accident), inside the range, near its
middle.  A range with no such value (``batch=1..2``) takes one just above
MAX: only the symbolic graph is made there, never data.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrate.shapes.dims import DimRange

# a range longer than this is searched from its middle, not listed
EXACT_SPAN = 1 << 16


def hint_value(r: DimRange, avoid: Iterable[int] = ()) -> int:
    """The hint of one dimension (see the module doc)."""
    avoid = set(avoid)

    def generic(v: int) -> bool:
        return v % 2 == 1 and v >= 3 and v not in avoid

    middle = r.min + (r.max - r.min) // 2
    if r.max - r.min <= EXACT_SPAN:
        inside = sorted(
            (v for v in range(r.min, r.max + 1) if generic(v)), key=lambda v: (abs(v - middle), v)
        )
        if inside:
            return inside[0]
    else:
        for step in range(0, r.max - r.min + 1):
            for v in (middle + step, middle - step):
                if r.min <= v <= r.max and generic(v):
                    return v
    v = max(r.max + 1, 3)
    while not generic(v):
        v += 1
    return v


def hint_binding(ranges: Iterable[DimRange], avoid: Iterable[int] = ()) -> tuple[int, ...]:
    """The hint of every dimension, each unlike the others' too."""
    avoid = set(avoid)
    out = []
    for r in ranges:
        v = hint_value(r, avoid)
        out.append(v)
        avoid.add(v)
    return tuple(out)
