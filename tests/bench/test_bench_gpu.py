"""The one GPU run (``tools/bench_gpu``), on a CPU: its order, its projection,
its caps, the files it rewrites, its install beside the machine's packages,
and a step of the bundle end to end in the interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from orchestrate.bench import report
from orchestrate.bench.runtimes import ORCHESTRATE, TORCH_COMPILE, TORCH_EAGER, TORCH_MAX_AUTOTUNE
from orchestrate.calibrate import records as calibrate_records
from tools.bench_gpu import costs, install, scope
from tools.bench_gpu.projection import Counts, Runs, project
from tools.bench_gpu.run import BUDGET_S, Run, log_records, run_child
from tools.bench_gpu.step import TAG

ROOT = Path(__file__).resolve().parents[2]


def counts(name: str, **over) -> Counts:
    base = Counts(
        name,
        nodes=500,
        weights_mb=200.0,
        kernels=99,
        functions=13,
        predicted_ms=0.25,
        export_s=8.0,
        optimize_s=9.0,
        load_s=0.6,
        verify_s=3.0,
        build_s=0.5,
    )
    return replace(base, **over)


def test_breadth_first_the_bundle_and_eager_for_every_model_then_compile_then_max_autotune():
    steps = scope.steps(scope.FIXED, dry=False)
    order = [(s.model, s.runtime) for s in steps]
    names = [m.name for m in scope.FIXED]
    assert names == ["bert", "gpt2", "llama", "decode", "resnet50"]
    first = [(n, rt) for n in names for rt in (ORCHESTRATE, TORCH_EAGER)]
    compiled = [(n, TORCH_COMPILE) for n in names if n != "decode"]
    assert order == first + compiled + [("decode", TORCH_COMPILE)] + [
        (n, TORCH_MAX_AUTOTUNE) for n in names
    ]
    assert [s.optional for s in steps] == [False] * 14 + [True] * 6
    dry = [(s.model, s.runtime) for s in scope.steps(scope.FIXED, dry=True)]
    assert dry == first + [("bert", TORCH_COMPILE), ("bert", TORCH_MAX_AUTOTUNE)]
    with pytest.raises(ValueError, match="--only vit: not in the fixed scope"):
        scope.select(["bert", "vit"])
    assert [m.name for m in scope.select(["resnet50", "bert"])] == ["bert", "resnet50"]


def test_the_projection_prices_every_step_from_its_counts():
    steps = scope.steps(scope.FIXED, dry=False)
    c = {m.name: counts(m.name) for m in scope.FIXED}
    c["llama"] = counts("llama", export_s=30.0, optimize_s=29.0, functions=8)
    p = project(steps, c, Runs(10, 50), BUDGET_S, workers=15)
    what = [x.what for x in p.lines]
    assert what[0].startswith("prepare") and what[-1] == "finish"
    assert what[1:-1] == [f"{s.model} {s.runtime}" for s in steps]
    # the slowest model sets the prepare step: llama's 59 s of export and planning
    prep = p.lines[0]
    unit = costs.COMPILE_FUNCTION.seconds
    assert prep.seconds == pytest.approx(
        costs.PROCESS.seconds + 30 + 29 + 0.6 + 3 + 0.5 + 8 * unit / (15 // 4)
    )
    assert "llama, the slowest" in prep.basis
    # the bundle's step: start, load, cached functions, calls, the check, kernel records
    line = {x.what: x for x in p.lines}["bert orchestrate"]
    want = (
        costs.PROCESS.seconds
        + 0.6
        + 200 / costs.HOST_MB_PER_S.seconds
        + 13 * costs.COMPILE_FUNCTION.seconds
        + 60 * 0.25e-3
        + 3.0
        + 13 * costs.RECORD_KERNEL.seconds
    )
    assert line.seconds == pytest.approx(want)
    assert all(x.cap >= x.seconds for x in p.lines)
    compile_line = line = {x.what: x for x in p.lines}["bert torch-compile"]
    assert compile_line.seconds > costs.TORCH_COMPILE.seconds and "assumed" in compile_line.basis
    # required steps fit; max-autotune is projected into what they leave, in order
    assert p.fits and p.total <= BUDGET_S
    reached = {x.what for x in p.reached}
    assert reached <= {f"{n} {TORCH_MAX_AUTOTUNE}" for n in c}
    assert p.required + sum(x.seconds for x in p.reached) == pytest.approx(p.total)
    table = "\n".join(p.table())
    assert "NOT REACHED" in table or len(reached) == len(c)
    doc = p.to_json()
    assert doc["fits"] and doc["required_s"] == round(p.required, 1)


def test_a_scope_that_would_overrun_is_refused():
    steps = scope.steps(scope.FIXED, dry=False)
    slow = {m.name: counts(m.name, export_s=400.0) for m in scope.FIXED}
    p = project(steps, slow, Runs(10, 50), BUDGET_S, workers=15)
    assert not p.fits and p.required > BUDGET_S
    assert "OVER, the run is refused" in p.table()[-1]
    assert p.reached == ()  # nothing optional once the required steps overrun


def run_state(tmp_path: Path, names=("bert",)) -> Run:
    models = tuple(m for m in scope.FIXED if m.name in names)
    run = Run(tmp_path, True, models, 100.0)
    floor = {
        "device": "h200",
        "bytes": 1,
        "dot_flops": 0,
        "other_flops": 0,
        "memory_ms": 0.01,
        "compute_ms": 0.0,
    }
    for m in models:
        st = run.state[m.name]
        st.prepared = {"floor": floor, "counts": {"kernels": 3}}
        st.runtimes = [ORCHESTRATE, TORCH_EAGER]
        st.pending = {ORCHESTRATE: "not run yet", TORCH_EAGER: "not run yet"}
    return run


def measured(key: str, median: float) -> dict:
    stats = {"median": median, "p10": median, "p90": median, "runs": 5}
    return {
        "measured": {
            "key": key,
            "label": key,
            "stats": stats,
            "peak_mem_mb": 12.0,
            "memory_note": None,
            "ready_s": 1.0,
            "note": "",
            "reason": None,
        }
    }


def test_a_step_cut_off_at_its_cap_keeps_what_it_printed(tmp_path):
    run = run_state(tmp_path)
    line = TAG + json.dumps(measured(ORCHESTRATE, 2.0))
    script = (
        f"import time; print({line!r}, flush=True); print('working', flush=True); time.sleep(60)"
    )
    rc, seconds = run_child(run, "bert orchestrate", [sys.executable, "-c", script], 3.0, "bert")
    assert rc is None and seconds < 30  # killed at its cap, not at the end of its sleep
    doc = json.loads((tmp_path / "results.json").read_text())
    (m,) = doc["models"]
    assert m["latency_ms"][ORCHESTRATE] == 2.0
    assert m["latency_ms"][TORCH_EAGER] is None and m["unavailable"][TORCH_EAGER] == "not run yet"
    assert "[bert orchestrate] working" in (tmp_path / "bench.log").read_text()
    assert report.check_document(doc) == []


def test_a_wrong_answer_is_reported_next_to_its_timing_and_marked_untrusted(tmp_path):
    run = run_state(tmp_path)
    run.take("bert", measured(ORCHESTRATE, 2.0))
    errors = {"y": {"rel": 0.5, "max_abs": 3.0, "ok": False}}
    run.take("bert", {"verified": {"ok": False, "note": "FAILED: output 'y'", "errors": errors}})
    run.take("bert", measured(TORCH_EAGER, 4.0))
    doc = json.loads((tmp_path / "results.json").read_text())
    (m,) = doc["models"]
    assert m["latency_ms"] == {ORCHESTRATE: 2.0, TORCH_EAGER: 4.0}
    assert m["verified"] is False and m["verify_errors"] == errors
    assert m["untrusted"][ORCHESTRATE].startswith("its answer did not verify: FAILED")
    page = (tmp_path / "results.md").read_text()
    assert "**NO** (rel 0.5)" in page and "2*" in page and "untrusted" in page
    assert "| 2.00 |" in page  # eager's median over the bundle's


def fake_wheel(folder: Path, name: str) -> Path:
    """A wheel of one module, ``name``, that says where it was imported from."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.py", "WHERE = __file__\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr(f"{info}/RECORD", "")
    return path


def test_only_what_the_machine_lacks_is_installed_beside_its_packages(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake_wheel(wheels, "orch_lacking")
    fake_wheel(wheels, "numpy")  # the machine has numpy: its wheel must not be installed
    monkeypatch.setattr(install, "NEEDED", ("orch_lacking", "numpy"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    target = tmp_path / "site"
    message = install.ensure(wheels, target)
    assert "installed orch_lacking" in message and "numpy" not in message
    assert sorted(p.name for p in target.iterdir() if p.suffix == ".py") == ["orch_lacking.py"]
    assert sys.path[-1] == str(target)  # after the machine's own packages
    import numpy as real

    assert not real.__file__.startswith(str(target))
    monkeypatch.setattr(install, "NEEDED", ("orch_absent",))
    with pytest.raises(SystemExit, match="no wheel for orch_absent"):
        install.ensure(wheels, target)


def test_the_bundles_step_times_verifies_and_records_every_distinct_kernel(tmp_path):
    """prepare.py then step.py on the tiny BERT, in the interpreter: the
    timing, the verdict with each output's error, and one fake record per
    distinct kernel of the plan, in the records schema."""
    from tools.bench_gpu import prepare

    work = tmp_path / "work"
    work.mkdir()
    rc = prepare.main(
        [
            "--model",
            "bert",
            "--size",
            "tiny",
            "--models",
            str(tmp_path / "models"),
            "--work",
            str(work),
            "--sets",
            "2",
        ]
    )
    assert rc == 0
    prepared = json.loads((work / "bert.prepared.json").read_text())
    c = Counts.from_json(prepared["counts"])
    assert c.kernels > 0 and 0 < c.functions <= c.kernels and c.weights_mb > 0
    assert c.compile_s is None  # no --arch: nothing compiled ahead
    records = tmp_path / "records.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "tools.bench_gpu.step",
        "--prepared",
        str(work / "bert.prepared.json"),
        "--runtime",
        ORCHESTRATE,
        "--runs",
        "2",
        "--warmup",
        "1",
        "--records",
        str(records),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    messages = [json.loads(x[len(TAG) :]) for x in done.stdout.splitlines() if x.startswith(TAG)]
    assert [next(iter(m)) for m in messages] == ["measured", "verified", "records"]
    timing, verdict, recs = (next(iter(m.values())) for m in messages)
    assert timing["key"] == ORCHESTRATE and timing["stats"]["runs"] == 2
    assert verdict["ok"] and set(verdict["errors"]) == {"last_hidden_state", "pooler_output"}
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    assert (
        len(lines)
        == recs["kernels"]
        == c.functions
        + sum(
            1
            for k in json.loads((work / "bert.orch/plan.json").read_text())["kernels"]
            if k["template"] == "library"
        )
    )
    assert len({x["spec_hash"] for x in lines}) == len(lines)
    assert all(x["schema"] == "orchestrate-records/1" and x["fake"] for x in lines)
    assert all(x["measured_us"] > 0 and x["predicted_us"] > 0 for x in lines)
    # calibrate reads every one back (and leaves the interpreter's out of any fit)
    read = calibrate_records.read([records])
    assert read.fake == len(lines) and read.kept == ()
    (tmp_path / "run").mkdir()
    run = run_state(tmp_path / "run")
    (run.out / "records.jsonl").write_text(records.read_text())
    log_records(run)
    assert f"{len(lines)} fake records left out" in (run.out / "bench.log").read_text()


def test_kernels_called_one_by_one_compute_what_the_run_computes():
    from orchestrate.emit import emit
    from orchestrate.ir import reference
    from orchestrate.run.runtime import Program, load_kernels
    from tests import graphs
    from tests.emit_util import plan_from_sets

    g = graphs.build(graphs.mlp, [(9, 16), (16, 32), (32,), (32, 16)])
    planned = plan_from_sets(g, [[n.name] for n in g.nodes])
    program = Program(planned, g, load_kernels(emit(g, planned), True), interpret=True)
    feeds = graphs.random_inputs(g)
    calls = program.kernel_calls(feeds)
    assert [name for name, _ in calls] == [k.name for k in planned.plan.kernels if not k.is_view]
    out = program._values(feeds)[program._output_slots[0][1]]
    want = reference.run(g, feeds)[g.outputs[0]]
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    out.zero_()
    for _, call in calls:  # again, one at a time: the last kernel writes the output anew
        call()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


def test_a_torch_baseline_moves_its_own_copy_of_the_weights():
    """Each baseline casts and moves a copy: the module built once stays as
    built, so the next baseline's peak memory counts its weights too."""
    import torch

    from orchestrate.bench.torch_side import torch_runtimes

    module = torch.nn.Linear(4, 4)
    feeds = [{"x": np.ones((2, 4), np.float32)}]
    make = torch_runtimes(lambda: (module, "test"), ["x"], feeds, [TORCH_EAGER], "fp16", False)
    ready = make(TORCH_EAGER)
    assert module.weight.dtype == torch.float32  # the built module is untouched
    assert ready.call(0).dtype == torch.float16
