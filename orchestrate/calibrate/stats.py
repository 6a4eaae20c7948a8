"""How close predictions are to measurements: the four figures calibrate prints.

Each pair is (predicted, measured), both positive.  For a group of pairs:

* ``geomean``: the geometric mean of predicted / measured (1 is unbiased;
  0.5 the model predicts half the time on average);
* ``error``: exp(mean |log(predicted / measured)|), the typical factor by
  which a prediction misses either way (1 is exact; 2 a factor of two);
* ``spearman``: the rank correlation of predicted and measured times (ties
  ranked by their average rank): does the model order programs as the GPU
  does, which is what a planner choosing among kernels needs;
* ``within``: the share of pairs predicted within a factor of 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Fit:
    n: int
    geomean: float
    error: float
    spearman: float | None  # None: fewer than 3 pairs, or no spread
    within: float


def fit(pairs: Sequence[tuple[float, float]], factor: float = 2.0) -> Fit:
    """The figures of ``pairs`` (see the module doc)."""
    if not pairs:
        return Fit(0, math.nan, math.nan, None, math.nan)
    logs = [math.log(p / m) for p, m in pairs]
    n = len(pairs)
    return Fit(
        n,
        math.exp(sum(logs) / n),
        math.exp(sum(abs(x) for x in logs) / n),
        spearman([p for p, _ in pairs], [m for _, m in pairs]),
        sum(abs(x) <= math.log(factor) + 1e-12 for x in logs) / n,
    )


def ranks(xs: Sequence[float]) -> list[float]:
    """1-based ranks, ties given their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Pearson's correlation of the ranks; None below 3 pairs or without spread."""
    if len(a) < 3:
        return None
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    if va == 0 or vb == 0:
        return None
    return cov / math.sqrt(va * vb)
