"""Which KernelBench timing files to read, and at which commit.

A timing file is ``results/timing/<GPU dir>/baseline_time_torch.json`` (eager)
or ``baseline_time_torch_compile_<backend>[_<mode>].json``; its programs are
``KernelBench/level<N>/<name>.py``.  A timing is paired with the problem files
*of the commit that first wrote its content*: the newest commit merely holding
a file can be one where the problems changed under it (KernelBench's sizes
grew on 2025-07-02 in b08d959, a commit that still holds the older timings of
A100_modal and others; and 7c914ea copied A6000_babel's June timings to
A6000_babel_v0.0 beside the new sizes).  So each distinct content (git blob)
counts once, at its earliest commit, and for each (GPU dir, runtime) the
newest such version is kept on each side of ``SIZES_CHANGED``.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

# the day KernelBench's level 1-3 sizes were scaled up (commit b08d959)
SIZES_CHANGED = int(datetime(2025, 7, 2, tzinfo=timezone.utc).timestamp())

TIMING = re.compile(
    r"results/timing/(?P<dir>[^/]+)/baseline_time_torch"
    r"(?:_compile_(?P<backend>inductor|cudagraphs)(?:_(?P<mode>[a-z-]+))?)?\.json"
)


@dataclass(frozen=True)
class Version:
    """One content of one timing file, as a commit wrote it."""

    commit: str
    time: int  # committer time, Unix seconds
    blob: str  # the content's git object id
    path: str
    gpu_dir: str
    runtime: str  # "eager", "torch.compile:<mode>", "torch.compile:cudagraphs"

    @property
    def era(self) -> str:
        return "before" if self.time < SIZES_CHANGED else "after"


def runtime(backend: str | None, mode: str | None) -> str:
    """The row's runtime for a timing file name's backend and mode."""
    if backend is None:
        return "eager"
    if backend == "inductor":
        return f"torch.compile:{mode or 'default'}"
    return f"torch.compile:{backend}"  # another backend (cudagraphs) in its default mode


def versions(listing: str) -> list[Version]:
    """The timing-file writes in ``git log --format='commit %H %ct' --raw
    --no-renames --no-abbrev`` output; deletions and other files dropped."""
    out = []
    commit, time = "", 0
    for line in listing.splitlines():
        if line.startswith("commit "):
            _, commit, stamp = line.split()
            time = int(stamp)
        elif line.startswith(":"):
            meta, path = line.split("\t", 1)
            *_, blob, status = meta.split()
            m = TIMING.fullmatch(path)
            if m and status != "D":
                rt = runtime(m["backend"], m["mode"])
                out.append(Version(commit, time, blob, path, m["dir"], rt))
    return out


def pick(found: list[Version]) -> list[Version]:
    """The versions to read: each content at its first commit, then per (GPU
    dir, runtime, side of ``SIZES_CHANGED``) the newest; sorted."""
    first: dict[str, Version] = {}
    for v in sorted(found, key=lambda v: (v.time, v.commit, v.path)):
        first.setdefault(v.blob, v)
    newest: dict[tuple[str, str, str], Version] = {}
    for v in first.values():
        key = (v.gpu_dir, v.runtime, v.era)
        if key not in newest or (newest[key].time, newest[key].commit) < (v.time, v.commit):
            newest[key] = v
    return sorted(newest.values(), key=lambda v: (v.gpu_dir, v.runtime, v.time))


class Repo:
    """A KernelBench git directory (a mirror or a checkout), read with git."""

    def __init__(self, path: Path):
        self.path = path

    def git(self, *args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(self.path), *args], capture_output=True, text=True, check=False
        )
        if done.returncode:
            raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def timing_versions(self) -> list[Version]:
        args = ["--format=commit %H %ct", "--raw", "--no-renames", "--no-abbrev"]
        return versions(self.git("log", "--all", *args, "--", "results/timing"))

    def show(self, commit: str, path: str) -> str:
        return self.git("show", f"{commit}:{path}")

    def problems(self, commit: str, levels: list[int]) -> set[str]:
        """The problem files' paths at ``commit``."""
        folders = [f"KernelBench/level{n}" for n in levels]
        return set(self.git("ls-tree", "-r", "--name-only", commit, "--", *folders).split())
