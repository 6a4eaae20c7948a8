"""Figures that cannot be true of the program they are paired with.

KernelBench changed its problem sizes between the runs that made some timing
files and the commits that hold them (its H100_modal files, committed on
2025-07-15, time many programs at other sizes than that commit's problem
files).  Since the sizes changed for a whole level at once, a few impossible
rows make a timing file's level suspect: ``SUSPECT_SHARE`` of them (and at
least two) set the level's rows of that file aside, with the reason.  A row
is impossible when

* it is faster than the GPU's datasheet allows for the program (every tensor
  moved once at the datasheet bandwidth, its dot products at the dense
  tensor-core peak), or
* it disagrees with the same program at the same sizes in most other timing
  files: their ratio lies outside what the two GPUs' datasheets allow, their
  ratios of bandwidth and of peaks, widened by ``PEER_FACTOR`` either way
  (the harnesses' host times and the libraries' efficiencies differ too).
  An H200 row 500 times slower than an H100's of the same program was not
  timed at those sizes.  Small programs (``harness.small``) take no part:
  what was measured of them is their host's time, and hosts differ more
  than GPUs (a ReLU of 16 x 16,384 fp32, eager: 5.2 µs on the RTX 3090 Ti's
  desktop, 13-60 µs on the cloud hosts, 32-250 µs under torch.compile's
  guards), so their ratios say nothing of the sizes.

A timing file's level is also set aside when its trials were unsteady: its
median row's published mean is more than ``UNSTEADY`` times its fastest
trial.  Such a mean holds outlier trials (the RTX 3090 Ti's torch.compile
files: trials 5-18x apart in the median row, a standard deviation as large
as the mean), not the time of the program; in every other file the median
row's mean is within 1.19x of its fastest trial (1.13x with more than three
rows).

Both bounds are the datasheets' and other measurements', not the model's,
so the model cannot vouch for itself here.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from orchestrate.calibrate.harness import nbytes, small, timing_file
from orchestrate.calibrate.predict import Prediction, Skipped, program_key
from orchestrate.cost.devices import get_device
from orchestrate.cost.measurements import Measurement

SUSPECT_SHARE = 0.05
PEER_FACTOR = 10.0
UNSTEADY = 1.25


def lower_bound_us(p: Prediction) -> float:
    """The least time the datasheet allows for row ``p``'s program."""
    device = get_device(p.measurement.gpu)
    dots = sum(k.dots for k in p.kernels)
    peak = (
        device.fp16_tflops if p.measurement.dtype in ("float16", "bfloat16") else device.tf32_tflops
    )
    return max(nbytes(p.measurement) / (device.bandwidth_gbs * 1e3), dots / (peak * 1e6))


def _allowed(m: Measurement, peer: Measurement) -> tuple[float, float]:
    """The least and most ``m.time / peer.time`` the GPUs' datasheets allow."""
    a, b = get_device(m.gpu), get_device(peer.gpu)
    ratios = [
        b.bandwidth_gbs / a.bandwidth_gbs,
        b.fp32_tflops / a.fp32_tflops,
        b.fp16_tflops / a.fp16_tflops,
    ]
    return min(ratios) / PEER_FACTOR, max(ratios) * PEER_FACTOR


def disagreeing(rows: Sequence[Measurement]) -> set[str]:
    """The ids of the rows outside the datasheets' span (``_allowed``) of more
    than half of their peers: the same program at the same sizes in other
    timing files.  Small programs are not compared (the module doc)."""
    by_program: dict[str, list[Measurement]] = defaultdict(list)
    for m in rows:
        if not small(m):
            by_program[program_key(m)].append(m)
    out = set()
    for ms in by_program.values():
        for m in ms:
            peers = [p for p in ms if timing_file(p) != timing_file(m)]
            off = 0
            for p in peers:
                low, high = _allowed(m, p)
                off += not low <= m.time_us / p.time_us <= high
            if off * 2 > len(peers):
                out.add(m.id)
    return out


def unsteady(rows: Sequence[Measurement]) -> bool:
    """Whether the median of ``rows``' mean / fastest trial exceeds
    ``UNSTEADY`` (rows without a fastest trial count as steady)."""
    spreads = sorted(m.time_us / m.min_us if m.min_us else 1.0 for m in rows)
    return bool(spreads) and spreads[len(spreads) // 2] > UNSTEADY


def set_aside(
    found: Sequence[Prediction], rows: Sequence[Measurement] = ()
) -> tuple[list[Prediction], list[Skipped]]:
    """The predictions whose (timing file, level) is sound, and the rest
    skipped; ``rows``: every measurement loaded, the peers of the second test."""
    group = lambda p: (timing_file(p.measurement), p.measurement.level)
    peerless = disagreeing(rows)
    count, fast, odd = Counter(), Counter(), Counter()
    members: dict[tuple, list[Measurement]] = defaultdict(list)
    for p in found:
        count[group(p)] += 1
        members[group(p)].append(p.measurement)
        fast[group(p)] += p.measurement.time_us < lower_bound_us(p)
        odd[group(p)] += p.measurement.id in peerless
    suspect = lambda n, g: n >= 2 and n >= SUSPECT_SHARE * count[g]
    reasons = {}
    for g in count:
        level = g[1]
        if suspect(fast[g], g):
            reasons[g] = (
                f"{fast[g]} of its timing file's level-{level} rows are faster than the "
                "datasheet allows: timed at other sizes"
            )
        elif suspect(odd[g], g):
            reasons[g] = (
                f"{odd[g]} of its timing file's level-{level} rows disagree with the same "
                f"programs elsewhere by more than the datasheets allow (x{PEER_FACTOR:g}): "
                "timed at other sizes"
            )
        elif unsteady(members[g]):
            reasons[g] = (
                f"its timing file's level-{level} rows' means are more than {UNSTEADY:g}x "
                "their fastest trials (the median row): the trials were unsteady"
            )
    kept = [p for p in found if group(p) not in reasons]
    skipped = [Skipped(p.measurement, reasons[group(p)]) for p in found if group(p) in reasons]
    return kept, skipped
