"""``orchestrate records export OUT.jsonl``: the measurement cache as JSON lines
(one per measurement; the fields are ``tune/records.py``'s)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from orchestrate.errors import InputError
from orchestrate.plan import pipeline
from orchestrate.tune.cache import Cache, default_path
from orchestrate.tune.records import line


def export(
    out: str | os.PathLike, device: str | None = None, cache_path: str | os.PathLike | None = None
) -> tuple[int, int]:
    """Write every measurement (of ``device``: a GPU's name or a
    ``devices.py`` row, any case) to ``out`` as JSON lines; how many, and
    how many damaged rows were skipped.  InputError, nothing written, when
    there is none, the cache is not one, or ``out`` cannot be written."""
    out = Path(out)
    path = Path(cache_path) if cache_path is not None else default_path()
    pipeline.check_output_path(out, path, "the measurement cache")
    if not path.is_file():
        raise InputError(
            f"{path}: no measurement cache (orchestrate optimize --tune on a GPU makes one)"
        )
    with Cache(path, read_only=True) as cache:
        rows = cache.rows()
        skipped = cache.skipped
    if not rows:
        damaged = f" ({skipped} damaged rows skipped)" if skipped else ""
        raise InputError(f"{path}: the measurement cache is empty{damaged}")
    if device is not None:
        want = device.lower()
        row_of = {id(r): r.record.get("device", {}).get("name", "?") for r in rows}
        chosen = [r for r in rows if want in (r.key.device.lower(), row_of[id(r)])]
        if not chosen:
            have = sorted({f"{r.key.device} ({row_of[id(r)]})" for r in rows})
            raise InputError(
                f"--device {device}: no measurements of it in {path} (it holds {', '.join(have)})"
            )
        rows = chosen
    # strict JSON: rows() let no NaN or infinity through
    text = "".join(json.dumps(line(r), sort_keys=True, allow_nan=False) + "\n" for r in rows)
    pipeline.write_atomic(out, text.encode())
    return len(rows), skipped
