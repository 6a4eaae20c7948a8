"""Where a dynamic plan is made at: the grid of bindings the family is lifted on.

Each dimension gets up to three values of its range (three determine a
polynomial of degree two in it, and ``seq * seq`` scores need two).  They
are chosen to be generic, so that the source printed there is the source
for the whole range: odd (a power-of-two block never divides them, so every
mask stays), at least 3 (a 1 or a 2 makes size-1 broadcasts and special
cases), different from every fixed dimension of the model (so no two
tensors' shapes coincide by accident and share a kernel they would not
share elsewhere), and spread over the range.  A range too short to hold
three such values (``batch=1..2``) takes them just above MAX: the grid only
prints code, and the graphs at MIN, OPT and MAX are checked against what
is lifted there.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrate.shapes.dims import DimRange


def grid_values(r: DimRange, avoid: Iterable[int] = ()) -> tuple[int, ...]:
    """Three values for the grid (see the module doc): generic ones of the
    range, else generic ones above MAX, else the range whole."""
    avoid = set(avoid)
    if r.max - r.min > EXACT_SPAN:  # never a list as long as the range
        return _spread_far(r, avoid)
    everything = list(range(r.min, r.max + 1))
    for keep in (
        lambda v: v % 2 == 1 and v >= 3 and v not in avoid,
        lambda v: v % 2 == 1 and v >= 3,
    ):
        pool = [v for v in everything if keep(v)]
        if len(pool) >= 3:
            return _spread(pool)
    # a short range (batch 1..2): 1 and 2 make special cases, so the grid
    # takes generic values above it; MIN, OPT and MAX are checked against
    # the polynomials found there
    above = [v for v in everything if v >= 3 and v % 2 == 1]
    v = max(r.max + 1, 3)
    while len(above) < 3:
        if v % 2 == 1 and v not in avoid:
            above.append(v)
        v += 1
    return tuple(sorted(above))


# a range longer than this takes its three values by search, not from a list
EXACT_SPAN = 1 << 16


def _spread_far(r: DimRange, avoid: set[int]) -> tuple[int, ...]:
    """Three generic values of a long range near its quarter, middle and top
    (``_spread``'s choice, found by stepping from each point past the values
    that are even, below 3 or avoided: at most ``len(avoid) + 2`` steps)."""
    span = r.max - r.min
    picks: list[int] = []
    for start, step in ((r.min + span // 4, 1), (r.min + span // 2, 1), (r.max, -1)):
        v = start
        while v % 2 == 0 or v < 3 or v in avoid or v in picks:
            v += step
        picks.append(v)
    return tuple(sorted(picks))


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
