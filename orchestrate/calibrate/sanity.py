"""Figures that cannot be true of the program they are paired with.

A measured time below what the GPU's datasheet allows for the program (every
tensor of it moved once at the datasheet bandwidth, its dot products at the
tensor cores' dense peak) was not taken on that program: the benchmark's
problem sizes changed between the run that made a timing file and the
commit that holds it (KernelBench's H100_modal files, committed on
2025-07-15 at the 2025-07-02 sizes, time some programs at the older ones).
One such row makes a timing file's level suspect, since the sizes changed
for a whole level at once; ``SUSPECT_SHARE`` of them (and at least two)
set the level's rows of that file aside, with the reason.  The bound is the
datasheet's, not the model's, so the model cannot vouch for itself here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from orchestrate.calibrate.harness import nbytes, timing_file
from orchestrate.calibrate.predict import Prediction, Skipped
from orchestrate.cost.devices import get_device

SUSPECT_SHARE = 0.05


def lower_bound_us(p: Prediction) -> float:
    """The least time the datasheet allows for row ``p``'s program."""
    device = get_device(p.measurement.gpu)
    dots = sum(k.dots for k in p.kernels)
    peak = (
        device.fp16_tflops if p.measurement.dtype in ("float16", "bfloat16") else device.tf32_tflops
    )
    return max(nbytes(p.measurement) / (device.bandwidth_gbs * 1e3), dots / (peak * 1e6))


def set_aside(found: Sequence[Prediction]) -> tuple[list[Prediction], list[Skipped]]:
    """The predictions whose (timing file, level) is sound, and the rest skipped."""
    group = lambda p: (timing_file(p.measurement), p.measurement.level)
    rows, fast = Counter(), Counter()
    for p in found:
        rows[group(p)] += 1
        fast[group(p)] += p.measurement.time_us < lower_bound_us(p)
    bad = {g for g, n in fast.items() if n >= 2 and n >= SUSPECT_SHARE * rows[g]}
    kept = [p for p in found if group(p) not in bad]
    skipped = [
        Skipped(
            p.measurement,
            f"{fast[group(p)]} of its timing file's level-{p.measurement.level} rows are faster "
            "than the datasheet allows: timed at other sizes",
        )
        for p in found
        if group(p) in bad
    ]
    return kept, skipped
