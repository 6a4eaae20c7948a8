"""Measured costs (``optimize --tune``): measurements in place of the model, and
what they teach it about the kernels nobody timed.

A spec timed on the GPU costs what it measured: the fastest of the
configurations timed (the cost model's best few, ``orchestrate/tune/``), and
the plan runs that configuration.  Optional outputs it also writes are priced
by the model on top (their bytes at the achievable bandwidth), as they are
for every kernel.

A spec not timed (one only a baseline builds, one of a template with no
kernel to time, one whose every configuration failed to run) keeps the
model's predicted time, scaled:

    scale(template) = the geometric mean, over the measured specs of that
                      template, of  measured µs / predicted µs  of the
                      model's first-choice configuration;
                      for a template with no measured spec, the same mean
                      over every measured spec; 1 when nothing was measured.

The ratio is taken at the model's first choice because that is the
configuration an unmeasured spec runs.  A geometric mean because the
ratios are factors (a kernel 4x slower than predicted and one 4x faster
cancel out), and one spec whose prediction is far off moves it less than an
arithmetic mean would.  Every distinct spec counts once, however many
planned kernels share it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Measured:
    """Measured times by spec hash, and the scales for the rest."""

    times: Mapping[str, float]  # structural hash -> µs (the model's choice and the tuned spec)
    scales: Mapping[str, float] = field(default_factory=dict)  # template -> factor
    overall: float = 1.0  # for a template with no measured spec

    def scale(self, template: str) -> float:
        return self.scales.get(template, self.overall)


def calibrate(ratios: Iterable[tuple[str, float]]) -> tuple[dict[str, float], float]:
    """(scale per template, overall scale) from (template, measured /
    predicted) pairs, one per measured spec (see the module docstring)."""
    by_template: dict[str, list[float]] = {}
    every: list[float] = []
    for template, ratio in ratios:
        if ratio > 0 and math.isfinite(ratio):
            by_template.setdefault(template, []).append(ratio)
            every.append(ratio)
    scales = {t: _geometric_mean(r) for t, r in sorted(by_template.items())}
    return scales, (_geometric_mean(every) if every else 1.0)


def _geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))
