"""The measurement cache: one SQLite file in the user's cache directory.

    $ORCHESTRATE_CACHE_DIR/measurements.sqlite, else
    $XDG_CACHE_HOME/orchestrate/measurements.sqlite, else
    ~/.cache/orchestrate/measurements.sqlite

One row per measurement, keyed by what makes a figure valid: the spec's
structural hash (its ops, shapes, dtypes and launch configuration), the
GPU's name, the spec's dtype, Triton's version and the driver's.  A run
that finds its key measures nothing.  Each row also holds what
``orchestrate records export`` writes (the record: template, nodes,
shapes, configuration, bytes, flops, the device's figures, the model's
prediction), so the cache is the training data.

Several processes may tune at once: the file is in WAL mode (readers do
not block the writer), every connection waits up to ``BUSY_TIMEOUT_S`` for
a lock, and each batch of rows is one ``BEGIN IMMEDIATE`` transaction, so a
run killed part-way leaves every batch it committed and nothing of the one
it was writing.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrate.errors import InputError

SCHEMA_VERSION = 1  # PRAGMA user_version
BUSY_TIMEOUT_S = 60.0
FILE_NAME = "measurements.sqlite"

COLUMNS = (
    "spec_hash",
    "device",
    "dtype",
    "triton",
    "driver",
    "measured_us",
    "predicted_us",
    "fake",
    "created",
    "record",
)
_TABLE = """
CREATE TABLE IF NOT EXISTS measurements (
    spec_hash    TEXT NOT NULL,
    device       TEXT NOT NULL,
    dtype        TEXT NOT NULL,
    triton       TEXT NOT NULL,
    driver       TEXT NOT NULL,
    measured_us  REAL NOT NULL,
    predicted_us REAL NOT NULL,
    fake         INTEGER NOT NULL,
    created      TEXT NOT NULL,
    record       TEXT NOT NULL,
    PRIMARY KEY (spec_hash, device, dtype, triton, driver)
)
"""


def directory() -> Path:
    """The user's cache directory for orchestrate."""
    if os.environ.get("ORCHESTRATE_CACHE_DIR"):
        return Path(os.environ["ORCHESTRATE_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "orchestrate"
    return Path.home() / ".cache" / "orchestrate"


def default_path() -> Path:
    return directory() / FILE_NAME


@dataclass(frozen=True)
class Key:
    spec_hash: str
    device: str
    dtype: str
    triton: str
    driver: str


@dataclass(frozen=True)
class Row:
    key: Key
    measured_us: float
    predicted_us: float
    fake: bool
    created: str  # ISO 8601, UTC
    record: dict[str, Any]  # what records export writes beyond the columns


class Cache:
    """An open measurement cache (one connection: one per thread or process)."""

    def __init__(self, path: str | os.PathLike | None = None, read_only: bool = False):
        """``read_only``: open without ever writing (a file or folder the
        user cannot write, records export): nothing is created or adopted."""
        self.path = Path(path) if path is not None else default_path()
        self._skipped = 0
        try:
            if read_only:
                self._db = _read_only(self.path)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            # One snapshot: another process may be creating the table meanwhile.
            self._db.execute("BEGIN")
            try:
                foreign, new = _foreign(self._db), _new(self._db)
            finally:
                self._db.execute("COMMIT")
            if new and read_only:
                raise InputError(
                    f"{self.path}: an empty file, not a measurement cache yet "
                    "(orchestrate optimize --tune on a GPU fills one)"
                )
            if new:  # made ours, unless another process did so first
                self._write(self._adopt)
                _wal(self._db)
            elif foreign is not None:
                raise InputError(f"{self.path}: {foreign}")
        except InputError:
            self._db.close()
            raise
        except (OSError, sqlite3.Error) as e:
            raise InputError(f"{self.path}: cannot open the measurement cache: {e}") from None

    @property
    def skipped(self) -> int:
        """Rows the last ``rows()`` left out as damaged."""
        return self._skipped

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    def _adopt(self, db: sqlite3.Connection) -> None:
        """Under the write lock: create the table in a new file, or check
        what the process that got there first made of it."""
        if _new(db):
            db.execute(_TABLE)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        foreign = _foreign(db)
        if foreign is not None:
            raise InputError(f"{self.path}: {foreign}")

    def _write(self, work) -> None:
        """``work(db)`` as one transaction, taken with the write lock up front."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            work(self._db)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def get(self, keys: Iterable[Key]) -> dict[Key, float]:
        """The measured µs of each key found."""
        found = {}
        for k in keys:
            row = self._db.execute(
                "SELECT measured_us FROM measurements WHERE spec_hash = ? AND device = ? AND "
                "dtype = ? AND triton = ? AND driver = ?",
                (k.spec_hash, k.device, k.dtype, k.triton, k.driver),
            ).fetchone()
            us = _time(row[0]) if row is not None else None
            if us is not None:  # (a damaged figure is measured again, not used)
                found[k] = us
        return found

    def put(self, rows: Sequence[Row]) -> None:
        """Store ``rows`` in one transaction (a row with a key already there replaces it)."""
        bad = [r for r in rows if _time(r.measured_us) is None]
        if bad:
            raise ValueError(f"not a time in µs: {bad[0].measured_us!r} for {bad[0].key}")
        if not rows:
            return
        values = [
            (
                r.key.spec_hash,
                r.key.device,
                r.key.dtype,
                r.key.triton,
                r.key.driver,
                r.measured_us,
                r.predicted_us,
                int(r.fake),
                r.created,
                json.dumps(r.record, sort_keys=True),
            )
            for r in rows
        ]
        insert = "INSERT OR REPLACE INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        try:
            self._write(lambda db: db.executemany(insert, values))
        except sqlite3.Error as e:
            raise InputError(f"{self.path}: cannot write the measurement cache: {e}") from None

    def rows(self) -> list[Row]:
        """Every row, oldest first; damaged ones (a figure that is not a
        positive finite time, a record that is not a JSON object) are left
        out and counted in ``skipped``."""
        out, skipped = [], 0
        query = "SELECT * FROM measurements ORDER BY created, spec_hash, device"
        for (
            h,
            dev,
            dtype,
            triton,
            driver,
            measured,
            predicted,
            fake,
            created,
            record,
        ) in self._db.execute(query):
            row = _row(h, dev, dtype, triton, driver, measured, predicted, fake, created, record)
            if row is None:
                skipped += 1
            else:
                out.append(row)
        self._skipped = skipped
        return out

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM measurements").fetchone()[0])


def _read_only(path: Path) -> sqlite3.Connection:
    """``path`` opened for reading only.  A file in WAL mode needs its
    ``-shm`` index written even to be read; where the folder or file cannot
    be written, it is read as immutable (no locks: a file its reader cannot
    write is not being written by that reader's tuning runs)."""
    uri = path.resolve().as_uri()
    try:
        return _opened(f"{uri}?mode=ro")
    except sqlite3.OperationalError:
        return _opened(f"{uri}?immutable=1")


def _opened(uri: str) -> sqlite3.Connection:
    """A connection to ``uri`` that has read the file's schema."""
    db = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error:
        db.close()
        raise
    return db


def _wal(db: sqlite3.Connection) -> None:
    """Put the file in WAL mode (it stays so).  SQLite answers a mode change
    that meets another connection's lock with "locked" at once, without
    waiting, so this retries; a file left in rollback mode is still correct,
    only its readers then block its writer."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S / 10
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)


def _new(db: sqlite3.Connection) -> bool:
    """Whether the open database is a new, empty file."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    return version == 0 and db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def _foreign(db: sqlite3.Connection) -> str | None:
    """Why the open database is not a measurement cache this orchestrate
    reads, or None (ours, or a new empty file)."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        return (
            f"a measurement cache of schema {version}, written by a newer orchestrate "
            f"(this one reads {SCHEMA_VERSION})"
        )
    if version == 0:
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master")]
        if names:
            return (
                f"not an orchestrate measurement cache (an SQLite file with tables "
                f"{', '.join(sorted(names)[:5])}); pass another --cache"
            )
        return None
    columns = [r[1] for r in db.execute("PRAGMA table_info(measurements)")]
    if columns != list(COLUMNS):
        return (
            f"not an orchestrate measurement cache of schema {version} (its measurements "
            f"table has columns {', '.join(columns) or 'none'}); pass another --cache"
        )
    return None


def _time(value) -> float | None:
    """``value`` as a time in µs, or None unless it is a positive finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    us = float(value)
    return us if math.isfinite(us) and us > 0 else None


def _row(h, dev, dtype, triton, driver, measured, predicted, fake, created, record) -> Row | None:
    """A stored row as a Row, or None when it is damaged."""
    us = _time(measured)
    if us is None or not all(isinstance(v, str) for v in (h, dev, dtype, triton, driver, created)):
        return None
    if isinstance(predicted, bool) or not isinstance(predicted, (int, float)):
        return None
    try:
        data = json.loads(record) if isinstance(record, str) else None
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return Row(Key(h, dev, dtype, triton, driver), us, float(predicted), bool(fake), created, data)
