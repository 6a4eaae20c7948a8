"""``make bench-gpu``: one GPU run, within its budget, that surely brings back the table.

    python3 -m tools.bench_gpu [--out DIR] [--budget 540] [--only NAME ...] [--dry-run]

The GPU machine is lent for 15 minutes in all, each command at most 10,
and brings back at most 8 files of 16 MiB from ``$OUT``.  So one call, of
at most ``--budget`` seconds (540), writes into ``--out`` (default
``$OUT``, else out/bench-gpu; the dry run's out/bench-dry) these files
and no others:

``results.json``    ``orchestrate.bench.report``'s document, rewritten after
                    every figure a step prints: a run cut short keeps them
``results.md``      the same as a table, rewritten with it
``chart.png``       median latency per model and runtime, with the floor
``records.jsonl``   each distinct kernel of the final plans timed alone
``projection.json`` the projected time of every step, its cap, and why
``bench.log``       everything the run and its children printed, and at the
                    end the records against the model per GPU and template
                    (``orchestrate calibrate --records``)

In order (``scope.py``): what the machine lacks installed beside its
packages (``install.py``); every model prepared at once (``prepare.py``:
exported, optimized with ``trials=0``, counted, its kernels compiled ahead
for the GPU); the steps projected from those counts (``projection.py``);
then, breadth first, each step in a child process of its own with a hard
cap (``step.py``): the bundle (timed, then verified, then its kernels
timed one by one) and eager for every model, torch.compile for every
model, and max-autotune in what is left.  A step starts only when its
projection fits what is left of the budget; one cut off at its cap keeps
what it printed.  A wrong answer is reported next to its timing, which is
marked untrusted, never dropped.

``--dry-run`` (``make bench-gpu-dry``) is the same script on a CPU: the
offline install proven, the full-size models exported and planned here to
count what the real run will do, the real run projected from those counts
and refused when it would overrun its budget (exit 2), then every step over
the tiny models in Triton's interpreter (records marked fake).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tools.bench_gpu import costs, install, scope
from tools.bench_gpu.projection import Counts, Projection, Runs, compile_unit, project
from tools.bench_gpu.step import TAG

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 540.0
DRY_BUDGET_S = 900.0  # the dry run's own steps, in the interpreter on 2 cores
DRY_MIN_CAP_S = 240.0  # interpreter steps are not priced by a GPU's figures
FILES = ("results.json", "results.md", "chart.png", "records.jsonl", "projection.json", "bench.log")
MAX_FILES, MAX_FILE_MB = 8, 16
PREPARE_CAP_S = {False: 240.0, True: 600.0}  # (dry) a model's prepare step


@dataclasses.dataclass
class ModelState:
    """What the run knows of one model so far."""

    runtimes: list = dataclasses.field(default_factory=list)  # its steps' runtimes, in order
    prepared: dict | None = None
    measured: dict = dataclasses.field(default_factory=dict)  # runtime -> Measured
    pending: dict = dataclasses.field(default_factory=dict)  # runtime -> why no figure (yet)
    verified: bool | None = None
    verify_note: str = "not verified yet"
    errors: dict = dataclasses.field(default_factory=dict)
    records: dict | None = None


class Run:
    """The run's state, its log, and the files it rewrites as figures arrive."""

    def __init__(self, out: Path, dry: bool, models: tuple[scope.Model, ...], budget: float):
        self.out, self.dry, self.models, self.budget = out, dry, models, budget
        self.started = time.time()
        self.lock = threading.RLock()
        self.state = {m.name: ModelState() for m in models}
        self.skipped: list[dict] = []
        self.extra: dict = {}
        self.device = "CPU (Triton interpreter)" if dry else "unknown GPU"
        self._log = open(out / "bench.log", "a", buffering=1)

    def left(self) -> float:
        return self.budget - (time.time() - self.started)

    def log(self, text: str) -> None:
        with self.lock:
            stamp = f"[{time.time() - self.started:6.1f}s] "
            for line in text.rstrip("\n").splitlines() or [""]:
                self._log.write(stamp + line + "\n")
                print(stamp + line, flush=True)

    # -- the files --------------------------------------------------------------------------

    def document(self) -> dict:
        from orchestrate.bench import clock, report
        from orchestrate.bench.floor import Floor
        from orchestrate.bench.run import Measured, ModelResult

        records = []
        for m in self.models:
            st = self.state[m.name]
            if st.prepared is None:
                continue
            measured = [
                st.measured.get(rt) or Measured(rt, rt, reason=st.pending[rt]) for rt in st.runtimes
            ]
            result = ModelResult(
                m.name,
                scope.DTYPE,
                measured,
                Floor(**st.prepared["floor"]),
                st.prepared["counts"]["kernels"],
                st.verified,
                st.verify_note,
                st.errors,
            )
            rec = report.model_record(result)
            rec["label"] = m.label + (" (tiny variant)" if self.dry else "")
            rec["records"] = st.records
            records.append(rec)
        doc = report.document(
            records,
            device=self.device,
            clock=clock.clock_name(not self.dry),
            interpreter=self.dry,
            skipped=self.skipped,
        )
        doc.update(budget_s=self.budget, wall_s=round(time.time() - self.started, 1), **self.extra)
        return doc

    def write(self) -> dict:
        """results.json and results.md, each replaced whole (a reader never
        sees half a file)."""
        from orchestrate.bench import report

        with self.lock:
            doc = self.document()
            _replace(self.out / "results.json", json.dumps(doc, indent=1) + "\n")
            _replace(self.out / "results.md", report.markdown(doc) + "\n")
            return doc

    # -- what a step prints ------------------------------------------------------------------

    def take(self, model: str, message: dict) -> None:
        from orchestrate.bench.run import Measured
        from orchestrate.bench.stats import Stats

        st = self.state[model]
        with self.lock:
            if "measured" in message:
                m = dict(message["measured"])
                m["stats"] = Stats(**m["stats"]) if m["stats"] else None
                got = Measured(**m)
                st.measured[got.key] = got
                st.pending.pop(got.key, None)
                shown = (
                    f"median {got.stats.median:.4g} ms"
                    if got.stats
                    else f"unavailable: {got.reason}"
                )
                self.log(f"{model} {got.key}: {shown}")
            elif "verified" in message:
                v = message["verified"]
                st.verified, st.verify_note, st.errors = v["ok"], v["note"], v["errors"]
                self.log(f"{model}: {v['note']}")
            elif "records" in message:
                st.records = r = message["records"]
                if "error" in r:
                    self.log(f"{model}: its kernels could not be timed alone: {r['error']}")
                    self.write()
                    return
                self.log(
                    f"{model}: {r['kernels']} kernels timed alone: {r['measured_us']:.1f} us "
                    f"in all, predicted {r['predicted_us']:.1f} us"
                    + (" (FAKE: interpreter times)" if r["fake"] else "")
                )
            self.write()


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_child(
    run: Run,
    label: str,
    cmd: list[str],
    cap: float,
    model: str | None = None,
    env: dict | None = None,
) -> tuple[int | None, float]:
    """Run ``cmd`` with a hard cap of ``cap`` seconds, its output into the
    log and its ``@@bench`` lines into the run; (exit status, or None when
    cut off; seconds)."""
    started = time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    cut = threading.Event()

    def kill():
        cut.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and whatever it started
        except ProcessLookupError:
            pass

    timer = threading.Timer(cap, kill)
    timer.start()
    try:
        for line in proc.stdout:
            if line.startswith(TAG) and model is not None:
                try:
                    message = json.loads(line[len(TAG) :])
                except json.JSONDecodeError:
                    run.log(f"[{label}] unreadable: {line.rstrip()[:200]}")
                    continue
                run.take(model, message)
            else:
                run.log(f"[{label}] {line.rstrip()}")
        rc = proc.wait()
    finally:
        timer.cancel()
    return (None if cut.is_set() else rc), time.time() - started


def child_env(dry: bool, interpret: bool = False) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    if dry and interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


# -- the stages ----------------------------------------------------------------------------------


def prepare_all(
    run: Run,
    models,
    work: Path,
    models_dir: Path,
    *,
    size_of,
    device: str,
    arch: int | None,
    workers: int,
    jobs: int,
    counts_only: bool,
    cap: float,
) -> dict[str, dict]:
    """Every model's prepare step, ``jobs`` at once; the prepared records."""
    work.mkdir(parents=True, exist_ok=True)
    todo, done = list(models), {}
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                m = todo.pop(0)
            cmd = [
                sys.executable,
                "-m",
                "tools.bench_gpu.prepare",
                "--model",
                m.name,
                "--size",
                size_of(m),
                "--models",
                str(models_dir),
                "--work",
                str(work),
                "--dtype",
                scope.DTYPE,
                "--device",
                device,
                "--workers",
                str(workers),
            ]
            if arch is not None:
                cmd += ["--arch", str(arch)]
            if counts_only:
                cmd.append("--counts-only")
            env = child_env(run.dry)
            if run.dry:  # a fresh cache: the compile ahead compiles, as on a new GPU machine
                env["TRITON_CACHE_DIR"] = str(work / "triton-cache")
            rc, seconds = run_child(run, f"prepare {m.name} {size_of(m)}", cmd, cap, env=env)
            path = work / f"{m.name}.prepared.json"
            if rc == 0 and path.exists():
                done[m.name] = json.loads(path.read_text())
            else:
                why = f"cut off at its cap of {cap:.0f} s" if rc is None else f"exit status {rc}"
                run.log(f"prepare {m.name}: FAILED ({why}, {seconds:.0f} s): see the lines above")
                done[m.name] = {"failed": why}

    threads = [threading.Thread(target=worker) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done


def run_steps(run: Run, steps, work: Path, runs: Runs, projection: Projection) -> None:
    """Each step in order, each in its child with its cap, each started
    only when its projection fits what is left."""
    lines = {x.what: x for x in projection.lines}
    reserve = costs.FINISH.seconds
    tried = False  # an optional step started in what was left: the last one
    for step in steps:
        st = run.state[step.model]
        if st.prepared is None:
            st.pending[step.runtime] = "not run: the model's prepare step failed"
            continue
        line = lines[f"{step.model} {step.runtime}"]
        cap = max(line.cap, DRY_MIN_CAP_S) if run.dry else line.cap
        left = run.left() - reserve
        if step.optional and line.seconds > left and left >= costs.OPTIONAL_LEAST_S and not tried:
            tried, line = True, dataclasses.replace(line, seconds=left, cap=left)
            run.log(
                f"{step.model} {step.runtime}: projected beyond what is left; given the "
                f"{left:.0f} s left"
            )
        if line.seconds > left:
            st.pending[step.runtime] = (
                f"not run: projected {line.seconds:.0f} s, {max(0, left):.0f} s of the budget left"
            )
            run.log(f"{step.model} {step.runtime}: {st.pending[step.runtime]}")
            run.write()
            continue
        cap = min(cap, left)
        st.pending[step.runtime] = "running (cut off before it printed a figure)"
        cmd = [
            sys.executable,
            "-m",
            "tools.bench_gpu.step",
            "--prepared",
            str(work / f"{step.model}.prepared.json"),
            "--runtime",
            step.runtime,
            "--runs",
            str(runs.runs),
            "--warmup",
            str(runs.warmup),
            "--records",
            str(run.out / "records.jsonl"),
        ]
        run.log(f"{step.model} {step.runtime}: projected {line.seconds:.0f} s, cap {cap:.0f} s")
        rc, seconds = run_child(
            run,
            f"{step.model} {step.runtime}",
            cmd,
            cap,
            step.model,
            child_env(run.dry, interpret=True),
        )
        if step.runtime in st.pending:  # it printed no figure
            st.pending[step.runtime] = (
                f"not finished within its cap of {cap:.0f} s"
                if rc is None
                else f"the step failed (exit status {rc}): see bench.log"
            )
        elif rc is None:
            run.log(
                f"{step.model} {step.runtime}: cut off at its cap of {cap:.0f} s after its timing"
            )
        run.log(f"{step.model} {step.runtime}: {seconds:.0f} s")
        run.write()


# -- the whole run -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m tools.bench_gpu", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the files (default $OUT, else out/bench-gpu; dry run out/bench-dry)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=BUDGET_S,
        help=f"seconds of wall time for the real run (default {BUDGET_S:.0f})",
    )
    p.add_argument("--only", nargs="+", metavar="NAME", help="part of the fixed scope")
    p.add_argument("--dry-run", action="store_true", help="the same steps on this CPU, tiny models")
    p.add_argument("--wheels", type=Path, default=install.WHEELS)
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help="folder for bundles and inputs (default: a new temporary folder, removed at the end)",
    )
    p.add_argument(
        "--models",
        type=Path,
        default=ROOT / "out/models",
        help="where the ONNX models are exported (kept: a second run reuses them)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="models prepared at once (default: all of them on a GPU machine, 2 in the dry run)",
    )
    args = p.parse_args(argv)
    try:
        models = scope.select(args.only)
    except ValueError as e:
        print(f"bench-gpu: error: {e}", file=sys.stderr)
        return 2
    dry = args.dry_run
    out = args.out or Path(
        os.environ.get("OUT") or (ROOT / ("out/bench-dry" if dry else "out/bench-gpu"))
    )
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:  # this run's files, not an earlier run's
        (out / name).unlink(missing_ok=True)
    run = Run(out, dry, models, DRY_BUDGET_S if dry else args.budget)
    run.log(
        f"bench-gpu: {'dry run on this CPU' if dry else 'one GPU run'}: "
        f"{', '.join(m.name for m in models)} at {scope.DTYPE}, batch {scope.BATCH}; "
        f"files into {out}"
    )
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-gpu-work-"))
    try:
        return _main(run, args, models, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def _main(run: Run, args, models, work: Path) -> int:
    dry = run.dry
    cores = os.cpu_count() or 2
    # the offline install
    if dry:
        proof = install.prove(args.wheels)
        run.extra["offline_install"] = proof
        run.log(
            f"offline install {'ok' if proof['ok'] else 'FAILED'}: {', '.join(proof['wheels'])} "
            f"({proof['wheels_mb']} MiB) into a folder holding only {proof['installed']}"
        )
    else:
        run.log(install.ensure(args.wheels, ROOT / "out/site"))
    from orchestrate.bench import clock
    from orchestrate.cost import devices

    arch, device = 90, "h200"
    if not dry:
        if not clock.cuda():
            run.log("bench-gpu: no CUDA GPU here (make bench-gpu-dry runs the same steps on a CPU)")
            return 2
        import torch

        run.device = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        arch = 10 * major + minor
        device = devices.detect() or devices.DEFAULT_DEVICE
        run.log(f"GPU: {run.device} (sm_{arch}), planned as devices.py's {device!r}")
    runs = Runs(10, 50) if not dry else Runs(1, 5)
    steps = scope.steps(models, dry)
    jobs = args.jobs or (len(models) if not dry else min(2, cores))
    workers = max(1, (cores - 1) // len(models))
    # every model prepared at once: exported, planned, counted, compiled ahead
    prepared = prepare_all(
        run,
        models,
        work,
        args.models if not dry else work / "models",
        size_of=lambda m: "tiny" if dry else m.size,
        device=device,
        arch=arch,
        workers=1 if dry else workers,
        jobs=jobs,
        counts_only=False,
        cap=PREPARE_CAP_S[dry],
    )
    prepare_s = time.time() - run.started
    for m in models:
        if "failed" not in prepared[m.name]:
            run.state[m.name].prepared = prepared[m.name]
        else:
            run.skipped.append(
                {
                    "name": m.name,
                    "dtype": scope.DTYPE,
                    "reason": "its prepare "
                    f"step failed ({prepared[m.name]['failed']}): see bench.log",
                }
            )
    for step in steps:
        run.state[step.model].runtimes.append(step.runtime)
        run.state[step.model].pending[step.runtime] = "not run yet"
    ok = {n: p for n, p in prepared.items() if "failed" not in p}
    if dry:  # the real run, projected from the full-size models counted here
        projection = dry_projection(run, args, models, work, ok)
        if projection is None or not projection.fits:
            run.write()
            return 2
    counts = {n: Counts.from_json(p["counts"]) for n, p in ok.items()}
    unit = compile_unit(list(counts.values()), 1 if dry else workers)
    mine = project(
        [s for s in steps if s.model in counts],
        counts,
        runs,
        run.budget,
        workers=workers,
        unit=unit,
        prepare_s=prepare_s,
    )
    if not dry:
        publish(run, mine, "this run, from the counts measured here")
        publish(run, projection, "this run, from the counts measured here")
    run.write()
    run_steps(run, [s for s in steps if s.model in ok], work, runs, mine)
    return finish(run)


def dry_projection(run: Run, args, models, work: Path, tiny: dict) -> Projection | None:
    """The real run projected from the full-size models, exported (kept in
    ``--models``) and planned here; the compile of a function measured on
    the tiny models' compile ahead."""
    run.log("counting the real run: the full-size models exported and planned here")
    full = prepare_all(
        run,
        models,
        work / "full-size",
        args.models,
        size_of=lambda m: m.size,
        device="h200",
        arch=None,
        workers=1,
        jobs=args.jobs or min(2, os.cpu_count() or 2),
        counts_only=True,
        cap=PREPARE_CAP_S[True],
    )
    failed = [n for n, p in full.items() if "failed" in p]
    if failed:
        run.log(f"bench-gpu: cannot project the real run: {', '.join(failed)} did not prepare")
        return None
    unit = compile_unit([Counts.from_json(p["counts"]) for p in tiny.values()], 1)
    unit = dataclasses.replace(
        unit, source=unit.source + " (the tiny models', for sm_90 on this CPU)"
    )
    gpu_steps = scope.steps(models, dry=False)
    projection = project(
        gpu_steps,
        {n: Counts.from_json(p["counts"]) for n, p in full.items()},
        Runs(10, 50),
        BUDGET_S,
        workers=15,
        unit=unit,
    )
    publish(
        run,
        projection,
        "the real run on a 16-core GPU machine, from the full-size models counted on this CPU",
    )
    run.extra["full_size_counts"] = {n: p["counts"] for n, p in full.items()}
    return projection


def publish(run: Run, projection: Projection, what: str) -> None:
    run.log(f"projection of {what}:")
    for line in projection.table():
        run.log("  " + line)
    if not projection.fits:
        run.log(
            f"bench-gpu: REFUSED: the required steps are projected at "
            f"{projection.required:.0f} s, over the {projection.budget:.0f} s budget"
        )
    run.extra["projection"] = {"of": what, **projection.to_json()}
    _replace(run.out / "projection.json", json.dumps(run.extra["projection"], indent=1) + "\n")


def log_records(run: Run) -> None:
    """Our kernels' records against the model, per GPU and template (what
    ``orchestrate calibrate --records`` prints), into the log."""
    from orchestrate.calibrate import records
    from orchestrate.errors import InputError

    path = run.out / "records.jsonl"
    if not path.exists():
        run.log("bench-gpu: no kernel records were written")
        return
    try:
        table = records.text(records.read([path]))
    except InputError as e:
        run.log(f"bench-gpu: the kernel records do not read back: {e}")
        return
    for line in table.splitlines():
        run.log(line)


def finish(run: Run) -> int:
    """The chart and the last results; the folder checked against what
    comes back from a GPU machine."""
    from orchestrate.bench import report

    doc = run.write()
    run.log(report.chart(doc, run.out / "chart.png"))
    doc = run.write()
    problems = report.check_document(doc)
    log_records(run)
    for line in problems:
        run.log(f"bench-gpu: schema: {line}")
    files = sorted(p for p in run.out.iterdir() if p.is_file() and not p.name.startswith("."))
    big = [
        f"{p.name} ({p.stat().st_size / 2**20:.1f} MiB)"
        for p in files
        if p.stat().st_size > MAX_FILE_MB * 2**20
    ]
    if len(files) > MAX_FILES or big:
        problems.append(
            f"{len(files)} files in {run.out} (at most {MAX_FILES}), over "
            f"{MAX_FILE_MB} MiB: {', '.join(big) or 'none'}"
        )
        run.log(f"bench-gpu: {problems[-1]}")
    timed = [m["name"] for m in doc["models"] if m["latency_ms"].get("orchestrate") is not None]
    missing = [m.name for m in run.models if m.name not in timed]
    run.log(
        f"bench-gpu: wrote {', '.join(p.name for p in files)} into {run.out} in "
        f"{doc['wall_s']:.0f} s; the bundle timed for {len(timed)} of {len(run.models)} models"
        + (f" (not {', '.join(missing)})" if missing else "")
    )
    proof = run.extra.get("offline_install")
    if proof is not None and not proof["ok"]:
        problems.append(f"the offline install failed: {proof['import']}")
    return 1 if problems or missing else 0
