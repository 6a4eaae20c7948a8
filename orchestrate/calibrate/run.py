"""Calibrate end to end: read the measurements, choose the rows, predict them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from orchestrate.calibrate import sanity
from orchestrate.calibrate.harness import runtime_class
from orchestrate.calibrate.predict import Prediction, Skipped, predict_all
from orchestrate.cost import measurements
from orchestrate.cost.measurements import Measurement
from orchestrate.errors import InputError

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "data" / "measurements"


def choose(
    rows: Sequence[Measurement],
    gpus: Sequence[str] = (),
    runtimes: Sequence[str] = (),
    kinds: Sequence[str] = (),
) -> list[Measurement]:
    """The rows on those GPUs, runtimes (``eager``, ``compile`` or a runtime's
    own name) and kinds (each: all when empty)."""
    return [
        m
        for m in rows
        if (not gpus or m.gpu in gpus)
        and (not runtimes or m.runtime in runtimes or runtime_class(m.runtime) in runtimes)
        and (not kinds or m.kind in kinds)
    ]


def calibrate(
    paths: Sequence[Path],
    gpus: Sequence[str] = (),
    runtimes: Sequence[str] = (),
    kinds: Sequence[str] = (),
    progress=None,
    jobs: int = 1,
) -> tuple[list[Prediction], list[Skipped]]:
    """The chosen rows of the measurement files or folders ``paths``
    (default: the project's ``data/measurements``), predicted."""
    rows: list[Measurement] = []
    for p in paths or [DEFAULT_DATA]:
        if not Path(p).exists():
            raise InputError(f"{p}: no such measurement file or folder")
        rows += measurements.load(p)
    chosen = choose(rows, gpus, runtimes, kinds)
    if not chosen:
        raise InputError("no measurement row matches the --gpu, --runtime and --kind given")
    done = predict_all(chosen, progress, jobs=jobs, among=rows)
    found, suspect = sanity.set_aside([p for p in done if isinstance(p, Prediction)], rows)
    return found, [s for s in done if isinstance(s, Skipped)] + suspect


def to_json(found: Sequence[Prediction], skipped: Sequence[Skipped]) -> dict:
    """Every row's prediction (with its plan's kernels), for reading back."""
    return {
        "predictions": [
            {
                "id": p.measurement.id,
                "gpu": p.measurement.gpu,
                "runtime": p.measurement.runtime,
                "kind": p.measurement.kind,
                "measured_us": p.measurement.time_us,
                "predicted_us": p.predicted_us,
                "model_us": p.model_us,
                "kernels": [asdict(k) for k in p.kernels],
                "host": asdict(p.host),
            }
            for p in found
        ],
        "skipped": [{"id": s.measurement.id, "reason": s.reason} for s in skipped],
    }


def write_json(found: Sequence[Prediction], skipped: Sequence[Skipped], path: Path) -> None:
    from orchestrate.plan.pipeline import write_atomic

    write_atomic(path, (json.dumps(to_json(found, skipped), indent=1) + "\n").encode())
