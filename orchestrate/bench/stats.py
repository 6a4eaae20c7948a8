"""The statistics a benchmark reports from its per-call times: median, p10, p90.

Percentiles interpolate linearly between the two nearest ordered samples
(numpy's default, ``method="linear"``), so p50 is the median and a single
sample is every percentile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(times: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``times``, interpolated linearly."""
    if not times:
        raise ValueError("no times to summarise")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0..100")
    ordered = sorted(times)
    at = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(at), math.ceil(at)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


@dataclass(frozen=True)
class Stats:
    """Per-call milliseconds of one runtime: the summary and the samples."""

    median: float
    p10: float
    p90: float
    runs: int

    @staticmethod
    def of(times_ms: Sequence[float]) -> Stats:
        return Stats(
            percentile(times_ms, 50),
            percentile(times_ms, 10),
            percentile(times_ms, 90),
            len(times_ms),
        )
