"""Our own kernels against the cost model: ``orchestrate calibrate --records``.

The records ``--tune`` keeps (``orchestrate records export``) and ``make
bench-gpu`` writes (``records.jsonl``) share one schema (``tune/records.py``):
a kernel of a plan, its predicted and its measured time, on a named GPU.
``--records`` sets them against each other per GPU and template, with the
figures calibrate gives the published measurements (``stats.py``). A record
marked ``fake`` (the fake timer, the interpreter's host clock) is not a
measurement: it is counted and left out, never fitted.

A record holds what the learned model reads of a kernel (``Terms``: the
template, bytes, flops, the roofline's terms, the grid) and the figures of
the device row that priced it, so the records join the published rows in
training (``calibrate --records FILE --train OUT``, ``learn.record_sample``):
each is a program of one kernel timed alone, as the planner asks the learned
model about a kernel.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from orchestrate.calibrate.report import Table, table_lines
from orchestrate.calibrate.stats import fit
from orchestrate.cost.devices import Device
from orchestrate.cost.learned import Terms
from orchestrate.errors import InputError
from orchestrate.text import shown
from orchestrate.tune.records import RECORDS_SCHEMA


@dataclass(frozen=True)
class KernelRecord:
    id: str  # the GPU measured, the spec's hash, when (for the training data's hash)
    gpu: str  # the name the GPU measured gave itself
    device: Device  # the figures that priced it
    terms: Terms  # what the learned model reads of the kernel
    measured_us: float

    @property
    def template(self) -> str:
        return self.terms.template

    @property
    def predicted_us(self) -> float:
        return self.terms.time_us


@dataclass(frozen=True)
class Records:
    kept: tuple[KernelRecord, ...]
    fake: int  # records marked fake: read, not fitted


def read(paths: Sequence[Path], gpus: Sequence[str] = ()) -> Records:
    """The records in ``paths`` (JSON lines) priced for one of the device rows
    ``gpus`` (all when empty); InputError naming the file and line of one that
    is not a record of this schema."""
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
            record = _record(r, where)  # a fake one is checked too: its writer is ours
            if gpus and record.device.name not in gpus:
                continue
            if r.get("fake"):
                fake += 1
            else:
                kept.append(record)
    return Records(tuple(kept), fake)


def _record(r: dict, where: str) -> KernelRecord:
    field = "device"
    try:
        dev = r["device"]
        gpu = str(dev["gpu"])
        figures = {f.name: dev[f.name] for f in fields(Device)}
        if not all(_positive(v) for k, v in figures.items() if k not in ("name", "label")):
            raise ValueError(figures)
        device = Device(**figures)
        field = "template, predicted_us or measured_us"
        template = str(r["template"])
        predicted, measured = float(r["predicted_us"]), float(r["measured_us"])
        field = "outputs"
        outputs = r["outputs"]
        written = sum(int(np.prod(o["shape"], dtype=np.int64)) for o in outputs)
        dtype = str(np.dtype(outputs[0]["dtype"])) if outputs else "other"
        field = "bytes, flops, dot_flops, blocks or model"
        model = r["model"]
        terms = Terms(
            template,
            dtype,
            int(r["bytes"]),
            int(r["flops"]),
            int(r["dot_flops"]),
            written,
            float(model["memory_us"]),
            float(model["compute_us"]),
            float(model["latency_us"]),
            int(r["blocks"]),
            predicted,
        )
    except (KeyError, TypeError, ValueError, IndexError):
        raise InputError(f"{where}: lacks its {field} (or it is malformed)") from None
    if not (predicted > 0 and measured > 0):
        raise InputError(f"{where}: predicted_us and measured_us must be positive")
    ident = f"{gpu}/{r.get('spec_hash', '')}/{r.get('timestamp', '')}"
    return KernelRecord(ident, gpu, device, terms, measured)


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


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
