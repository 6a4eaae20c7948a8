"""Where a dynamic plan is made at: the grid of bindings the family is lifted on.

Each dimension gets up to three values of its range (three determine a
polynomial of degree two in it, and ``seq * seq`` scores need two).  They
are chosen to be generic, so that the source printed there is the source
for the whole range: odd (a power-of-two block never divides them, so every
mask stays), at least 3 (a 1 or a 2 makes size-1 broadcasts and special
cases), different from every fixed dimension of the model (so no two
tensors' shapes coincide by accident and share a kernel they would not
share elsewhere), and spread over the range.  A range with three values or
fewer is taken whole: then the polynomials are exact on all of it.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrate.shapes.dims import DimRange


def grid_values(r: DimRange, avoid: Iterable[int] = ()) -> tuple[int, ...]:
    """Up to three values of ``r`` for the grid (see the module doc)."""
    everything = list(range(r.min, r.max + 1))
    if len(everything) <= 3:
        return tuple(everything)
    avoid = set(avoid)
    for keep in (
        lambda v: v % 2 == 1 and v >= 3 and v not in avoid,
        lambda v: v % 2 == 1 and v >= 3,
        lambda v: v >= 3,
        lambda v: True,
    ):
        pool = [v for v in everything if keep(v)]
        if len(pool) >= 3:
            return _spread(pool)
    return _spread(everything)  # pragma: no cover - a range of more than 3 always has 3


def _spread(pool: list[int]) -> tuple[int, ...]:
    """Three values of ``pool`` near its quarter, middle and top."""
    n = len(pool)
    picks = sorted({pool[n // 4], pool[n // 2], pool[-1]})
    k = n - 1
    while len(picks) < 3:  # a small pool: fill from the top
        if pool[k] not in picks:
            picks.append(pool[k])
        k -= 1
    return tuple(sorted(picks))
