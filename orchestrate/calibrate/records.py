"""Our own kernels against the cost model: ``orchestrate calibrate --records``.

The records ``--tune`` keeps (``orchestrate records export``) and ``make
bench-gpu`` writes (``records.jsonl``) share one schema (``tune/records.py``):
a kernel of a plan, its predicted and its measured time, on a named GPU.
``--records`` sets them against each other per GPU and template, with the
figures calibrate gives the published measurements (``stats.py``). A record
marked ``fake`` (the fake timer, the interpreter's host clock) is not a
measurement: it is counted and left out, never fitted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrate.calibrate.report import Table, table_lines
from orchestrate.calibrate.stats import fit
from orchestrate.errors import InputError
from orchestrate.text import shown
from orchestrate.tune.records import RECORDS_SCHEMA


@dataclass(frozen=True)
class KernelRecord:
    gpu: str
    template: str
    predicted_us: float
    measured_us: float


@dataclass(frozen=True)
class Records:
    kept: tuple[KernelRecord, ...]
    fake: int  # records marked fake: read, not fitted


def read(paths: Sequence[Path]) -> Records:
    """The records in ``paths`` (JSON lines); InputError naming the file and
    line of one that is not a record of this schema."""
    kept, fake = [], 0
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"--records {path}: cannot read it ({e})") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"--records {path}:{n}"
            try:
                r = json.loads(line)
            except ValueError:
                raise InputError(f"{where}: not a JSON object") from None
            if not isinstance(r, dict) or r.get("schema") != RECORDS_SCHEMA:
                raise InputError(f"{where}: not an {RECORDS_SCHEMA} record")
            if r.get("fake"):
                fake += 1
                continue
            kept.append(_record(r, where))
    return Records(tuple(kept), fake)


def _record(r: dict, where: str) -> KernelRecord:
    try:
        gpu, template = str(r["device"]["gpu"]), str(r["template"])
        predicted, measured = float(r["predicted_us"]), float(r["measured_us"])
    except (KeyError, TypeError, ValueError):
        raise InputError(
            f"{where}: lacks device.gpu, template, predicted_us or measured_us"
        ) from None
    if not (predicted > 0 and measured > 0):
        raise InputError(f"{where}: predicted_us and measured_us must be positive")
    return KernelRecord(gpu, template, predicted, measured)


def text(records: Records) -> str:
    """The table per GPU and template, and what was left out."""
    lines = [
        f"{len(records.kept)} kernel records; every predicted time is the cost model's, "
        "every measured one a GPU's"
    ]
    if records.fake:
        lines.append(f"{records.fake} fake records left out (made up or interpreter times)")
    if records.kept:
        groups: dict[str, list[tuple[float, float]]] = {}
        for r in records.kept:
            key = f"{shown(r.gpu)} {r.template}"
            groups.setdefault(key, []).append((r.predicted_us, r.measured_us))
        every = [(r.predicted_us, r.measured_us) for r in records.kept]
        rows = (*((g, fit(p)) for g, p in sorted(groups.items())), ("all", fit(every)))
        lines += ["", *table_lines(Table("our kernels by GPU and template", rows))]
    return "\n".join(lines) + "\n"
