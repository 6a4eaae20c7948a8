"""KernelBench's published timings as measurement rows.

    python -m tools.measurements.kernelbench KBREPO --out data/measurements/kernelbench.jsonl
        [--levels 1,2] [--only SUBSTR] [--timeout S] [--jobs N] [--memory GB] [--cache DIR]

KBREPO is a git directory of ScalingIntelligence/KernelBench (a mirror will
do: only ``git log`` and ``git show`` are used).  For each (GPU directory,
runtime) the timing file versions of ``history.pick`` are read; each timed
program (``KernelBench/level<N>/<name>.py`` at the commit that wrote the
timing) is exported once per distinct content (sha256) at its published size
(``export``), each in its own process, and cached as a shape-only ONNX under
``--cache`` so a run resumes where the last one stopped.  One row per (GPU
directory, runtime, program, content): the published mean in ms with its
spread, the GPU (a row of ``orchestrate.cost.devices``, from the entry's
``hardware`` string), the graph description and the source.  What is left
out is printed at the end with its reason: timing files of GPUs the table
lacks, entries without a figure, programs that did not export.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import onnx

from orchestrate.cost.devices import from_name
from tools.measurements import export
from tools.measurements.describe import describe
from tools.measurements.history import Repo, Version, pick

REPO = "ScalingIntelligence/KernelBench"


@dataclass(frozen=True)
class Timed:
    """One published figure and the program it times."""

    version: Version
    level: int
    file: str  # "19_ReLU.py"
    entry: dict  # the timing file's entry: mean, std, min, max (ms), num_trials, hardware
    gpu: str  # the orchestrate.cost.devices row
    sha: str  # sha256 of the problem file's text

    @property
    def program(self) -> str:
        return f"level{self.level}/{self.file.removesuffix('.py')}"


def _number(file: str) -> int:
    head = file.split("_", 1)[0]
    return int(head) if head.isdigit() else 1 << 30


def _figure(entry) -> bool:
    """Whether a timing entry holds a usable figure."""
    if not isinstance(entry, dict) or not isinstance(entry.get("hardware"), str):
        return False
    mean = entry.get("mean")
    return isinstance(mean, int | float) and not isinstance(mean, bool) and mean > 0


def gather(repo: Repo, levels: list[int], only: str, notes: list[str]):
    """The timed figures to turn into rows and the problem sources by sha256;
    what is left out goes to ``notes``."""
    timed, sources = [], {}
    blobs: dict[tuple[str, str], str] = {}
    for v in pick(repo.timing_versions()):
        table = json.loads(repo.show(v.commit, v.path))
        present = repo.problems(v.commit, levels)
        empty, unknown, missing = 0, Counter(), 0
        for level in levels:
            for file, entry in sorted(table.get(f"level{level}", {}).items()):
                if only not in f"level{level}/{file}":
                    continue
                if not _figure(entry):
                    empty += 1
                    continue
                gpu = from_name(entry["hardware"])
                if gpu is None:
                    unknown[entry["hardware"]] += 1
                    continue
                path = f"KernelBench/level{level}/{file}"
                if path not in present:
                    missing += 1
                    continue
                if (v.commit, path) not in blobs:
                    text = repo.show(v.commit, path)
                    sha = hashlib.sha256(text.encode()).hexdigest()
                    sources.setdefault(sha, text)
                    blobs[v.commit, path] = sha
                timed.append(Timed(v, level, file, entry, gpu, blobs[v.commit, path]))
        where = f"{v.path} @ {v.commit[:7]}"
        if empty:
            notes.append(f"{where}: {empty} entries without a figure (null, or no hardware)")
        for hardware, n in unknown.items():
            notes.append(f"{where}: {n} entries on {hardware!r}, a GPU the device table lacks")
        if missing:
            notes.append(f"{where}: {missing} entries without their problem file at that commit")
    return timed, sources


class Cache:
    """Exports by problem sha256: ``<sha>.onnx`` (shape-only) and ``<sha>.json``
    (what became of it, under which limits)."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def onnx(self, sha: str) -> Path:
        return self.folder / f"{sha}.onnx"

    def outcome(self, sha: str, seconds: float, memory_gb: float) -> export.Outcome | None:
        """The cached outcome, unless a failure came from a limit now raised."""
        path = self.folder / f"{sha}.json"
        if not path.is_file():
            return None
        found = json.loads(path.read_text())
        o = export.Outcome(found["ok"], found["reason"], found["limit"], found["seconds"])
        if found.get("version") != export.VERSION:
            return None
        if o.ok and not self.onnx(sha).is_file():
            return None
        if o.limit == "time" and seconds > found["timeout"]:
            return None
        if o.limit == "memory" and memory_gb > found["memory_gb"]:
            return None
        return o

    def keep(self, sha: str, o: export.Outcome, seconds: float, memory_gb: float) -> None:
        record = {"ok": o.ok, "reason": o.reason, "limit": o.limit, "seconds": o.seconds}
        record |= {"timeout": seconds, "memory_gb": memory_gb, "version": export.VERSION}
        (self.folder / f"{sha}.json").write_text(json.dumps(record) + "\n")


def export_all(todo, sources, cache: Cache, args) -> dict[str, export.Outcome]:
    """Each sha of ``todo`` ((sha, label) pairs) exported or taken from the
    cache; those that ran out of memory beside others get a lone second try."""
    cores = os.cpu_count() or 1
    done: dict[str, export.Outcome] = {}

    def one(sha: str, label: str, memory_gb: float, threads: int) -> None:
        o = cache.outcome(sha, args.timeout, memory_gb)
        if o is None:
            o = export.run(sources[sha], cache.onnx(sha), args.timeout, memory_gb, threads)
            cache.keep(sha, o, args.timeout, memory_gb)
            what = "exported" if o.ok else f"not exported: {o.reason}"
            print(f"  {label} {sha[:8]}: {what} ({o.seconds} s)", file=sys.stderr, flush=True)
        done[sha] = o

    share, threads = args.memory / args.jobs, max(1, cores // args.jobs)
    with ThreadPoolExecutor(args.jobs) as pool:
        for f in [pool.submit(one, sha, label, share, threads) for sha, label in todo]:
            f.result()
    if args.jobs > 1:
        for sha, label in todo:
            if done[sha].limit == "memory":
                one(sha, label, args.memory, cores)
    return done


def row(t: Timed, graph: dict) -> dict:
    e, v = t.entry, t.version
    floats = [i["dtype"] for i in graph["inputs"] if i["dtype"].startswith(("float", "bfloat"))]
    out = {
        "id": f"kernelbench/{v.gpu_dir}/{v.runtime}/{t.program}@{t.sha[:8]}",
        "suite": "kernelbench",
        "program": t.file.removesuffix(".py"),
        "level": t.level,
        "dtype": (floats or ["float32"])[0],
        "gpu": t.gpu,
        "hardware": e["hardware"],
        "runtime": v.runtime,
        "time_ms": e["mean"],
    }
    for key, field in (("std", "std_ms"), ("min", "min_ms"), ("max", "max_ms")):
        if isinstance(e.get(key), int | float):
            out[field] = e[key]
    if isinstance(e.get("num_trials"), int):
        out["trials"] = e["num_trials"]
    problem = f"KernelBench/level{t.level}/{t.file}"
    out["source"] = {"repo": REPO, "commit": v.commit, "timing": v.path, "problem": problem}
    out["source"]["problem_sha256"] = t.sha
    out["graph"] = graph
    return out


def build(timed: list[Timed], done: dict[str, export.Outcome], cache: Cache) -> list[dict]:
    """One row per (GPU dir, runtime, program, content), the newest figure."""
    newest: dict[tuple, Timed] = {}
    for t in timed:
        if done[t.sha].ok:
            key = (t.version.gpu_dir, t.version.runtime, t.program, t.sha)
            if key not in newest or newest[key].version.time < t.version.time:
                newest[key] = t
    graphs = {sha: describe(onnx.load(str(cache.onnx(sha)))) for sha in {k[3] for k in newest}}

    def order(t: Timed):
        return (t.version.gpu_dir, t.version.runtime, t.level, _number(t.file), t.version.time)

    return [row(t, graphs[t.sha]) for t in sorted(newest.values(), key=order)]


def summary(rows: list[dict], timed: list[Timed], done, notes: list[str]) -> list[str]:
    from orchestrate.cost.measurements import kind_of

    lines = [f"rows: {len(rows)}"]
    for title, key in (("gpu", "gpu"), ("runtime", "runtime"), ("level", "level")):
        counts = Counter(r[key] for r in rows)
        lines.append(f"by {title}: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    kinds = Counter(kind_of(r["graph"]) for r in rows)
    lines.append("by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    failed = defaultdict(set)
    for t in timed:
        if not done[t.sha].ok:
            failed[t.sha].add(t)
    lines.append(f"programs exported: {sum(o.ok for o in done.values())} of {len(done)}")
    if failed:
        lines.append(
            f"not exported ({len(failed)} programs, {sum(map(len, failed.values()))} figures):"
        )
        for sha, ts in sorted(failed.items(), key=lambda kv: min(t.program for t in kv[1])):
            t = min(ts, key=lambda t: t.program)
            lines.append(f"  {t.program} {sha[:8]} ({t.version.era}): {done[sha].reason}")
    if notes:
        lines.append("left out of the timing files:")
        lines += [f"  {n}" for n in notes]
    return lines


def write_rows(rows: list[dict], out: Path) -> None:
    """JSON lines, gzipped (with no time stamp: the same rows, the same bytes)
    when ``out`` ends in .gz."""
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows).encode()
    if out.suffix == ".gz":
        text = gzip.compress(text, compresslevel=9, mtime=0)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(text)
    os.replace(tmp, out)


def _memory_gb() -> float:
    """80% of the memory available now."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return round(int(line.split()[1]) / 2**20 * 0.8, 1)
    return 8.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.measurements.kernelbench")
    p.add_argument("repo", type=Path, help="a git directory of ScalingIntelligence/KernelBench")
    p.add_argument("--out", type=Path, required=True, help="the rows (JSON lines)")
    p.add_argument("--levels", default="1,2", help="comma-separated levels (default 1,2)")
    p.add_argument("--only", default="", help="programs whose level/name contains this")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per export (600)")
    p.add_argument("--jobs", type=int, default=1, help="exports at once (1)")
    p.add_argument("--memory", type=float, default=None, help="GB for all exports together")
    p.add_argument("--cache", type=Path, default=Path("out/measurements/cache"))
    args = p.parse_args(argv)
    try:
        levels = [int(x) for x in args.levels.split(",") if x.strip()]
    except ValueError:
        p.error(f"--levels {args.levels!r}: expected numbers such as 1,2")
    if args.jobs < 1:
        p.error("--jobs: at least 1")
    args.memory = args.memory or _memory_gb()
    repo = Repo(args.repo)
    try:
        repo.git("rev-parse", "--git-dir")
    except RuntimeError:
        p.error(f"{args.repo} is not a git directory (a KernelBench mirror or checkout)")
    notes: list[str] = []
    timed, sources = gather(repo, levels, args.only, notes)
    labels = {}
    for t in sorted(timed, key=lambda t: (t.version.era != "before", t.level, _number(t.file))):
        labels.setdefault(t.sha, t.program)
    print(f"{len(timed)} figures, {len(labels)} programs to export", file=sys.stderr)
    cache = Cache(args.cache)
    done = export_all(list(labels.items()), sources, cache, args)
    rows = build(timed, done, cache)
    write_rows(rows, args.out)
    print("\n".join(summary(rows, timed, done, notes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
