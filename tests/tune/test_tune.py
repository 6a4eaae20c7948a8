"""--tune on a CPU: the whole tuning path with a fake timer, and the cache's guarantees.

The timers here are ``FakeTimer``s whose figures the tests choose, so what
the plan must do follows from the figures, not from the code under test.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from orchestrate import api, cli, templates
from orchestrate.cost.devices import get_device
from orchestrate.cost.measured import Measured, calibrate
from orchestrate.cost.roofline import Prices, cost
from orchestrate.errors import InputError
from orchestrate.explain import summary_lines
from orchestrate.ir import precision
from orchestrate.kernels.spec import MATMUL, VIEW
from orchestrate.plan import Plan
from orchestrate.plan.planner import PlanOptions, plan
from orchestrate.tune import FakeTimer, TimerInfo, Tune, tuner
from orchestrate.tune.cache import Cache, Key, Row
from orchestrate.tune.gpu import GpuTimer, compile_ahead, kernel_module_source, tensor_dtypes
from tests import graphs

H200 = get_device("h200")
OPTIONS = PlanOptions(device="h200", reproducible=True)


def mlp():
    """x @ w1 + b1, GELU, @ w2: two matmuls, an epilogue the model fuses."""
    return graphs.build(graphs.mlp, [(32, 64), (64, 128), (128,), (128, 64)])


def model_times(factor=lambda spec: 1.0):
    """A fake timer: the cost model's time for the spec x ``factor(spec)``."""
    return lambda g, s: cost(g, s, H200).time_us * factor(s)


def tuned(graph, timer, cache: Path, configs: int = 3):
    return plan(graph, OPTIONS, tune=Tune(timer, configs, cache))


def test_a_kernel_measured_slow_is_avoided(tmp_path):
    g = mlp()
    before = plan(g, OPTIONS).plan
    assert any(k.template == MATMUL and len(k.primitives) > 1 for k in before.kernels)

    def fused_matmul_is_slow(s):
        return 1000.0 if s.template == MATMUL and len(s.nodes) > 1 else 1.0

    after = tuned(g, FakeTimer(model_times(fused_matmul_is_slow)), tmp_path / "m.sqlite").plan
    assert not any(k.template == MATMUL and len(k.primitives) > 1 for k in after.kernels)
    assert {n.name for n in g.nodes} <= {p for k in after.kernels for p in k.primitives}
    assert after.tuning is not None and after.tuning.measured > 0


def test_a_second_run_measures_nothing(tmp_path):
    g, db = mlp(), tmp_path / "m.sqlite"
    first = FakeTimer(model_times())
    a = tuned(g, first, db).plan
    assert len(first.timed) == a.tuning.measured > 0
    again = FakeTimer(model_times())
    b = tuned(g, again, db).plan
    assert again.timed == [] and again.prepared == []
    assert (b.tuning.measured, b.tuning.cached) == (0, a.tuning.measured)
    assert [k.hash for k in b.kernels] == [k.hash for k in a.kernels]


@pytest.mark.parametrize(
    "other", [{"device": "another GPU"}, {"triton": "9.9"}, {"driver": "999.1"}]
)
def test_another_device_triton_or_driver_misses_the_cache(tmp_path, other):
    g, db = mlp(), tmp_path / "m.sqlite"
    first = FakeTimer(model_times())
    tuned(g, first, db)
    second = FakeTimer(model_times(), **other)
    tuned(g, second, db)
    assert sorted(second.timed) == sorted(first.timed)


def test_the_dtype_is_part_of_the_key(tmp_path):
    key = Key("abc", "gpu", "float32", "3.6", "550")
    with Cache(tmp_path / "m.sqlite") as c:
        c.put([Row(key, 5.0, 4.0, False, "2026-01-01T00:00:00+00:00", {})])
        assert c.get([key]) == {key: 5.0}
        half = Key("abc", "gpu", "float16", "3.6", "550")
        assert c.get([half]) == {}
    # and the same model at fp16 is measured again (its specs differ too)
    g = mlp()
    first = FakeTimer(model_times())
    tuned(g, first, tmp_path / "n.sqlite")
    half_timer = FakeTimer(model_times())
    tuned(precision.lower_precision(g, "fp16", "mlp"), half_timer, tmp_path / "n.sqlite")
    assert half_timer.timed and not set(half_timer.timed) & set(first.timed)


def test_each_spec_times_the_models_best_configurations_only(tmp_path):
    g = mlp()
    seen: dict[tuple, list] = {}

    def figure(graph, s):
        seen.setdefault((s.template, s.nodes), []).append(s.config)
        return 1.0

    tuned(g, FakeTimer(figure), tmp_path / "m.sqlite", configs=2)
    assert max(len(v) for v in seen.values()) == 2
    assert all(len(set(v)) == len(v) for v in seen.values())
    # views are never timed
    assert all(t != VIEW for t, _ in seen)


def test_the_fastest_measured_configuration_is_planned_and_its_bundle_verifies(tmp_path):
    g_times: dict[tuple, dict] = {}

    def area(s):  # the fake GPU prefers big tiles, and runs matmuls faster than anything else
        blocks = dict(s.config.blocks)
        return 1e3 / math.prod(blocks.get(k, 1) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))

    def figure(graph, s):
        us = area(s) if s.template == MATMUL else cost(graph, s, H200).time_us
        g_times.setdefault((s.template, s.nodes), {})[s.config] = us
        return us

    src = Path("examples/models/tiny_bert.onnx")
    untuned = api.optimize(src, tmp_path / "a.orch", device="h200", trials=0).plan
    made = api.optimize(
        src,
        tmp_path / "b.orch",
        device="h200",
        trials=1,
        tune=Tune(FakeTimer(figure), 3, tmp_path / "m.sqlite"),
    )
    assert made.report.ok
    matmuls = [k for k in made.plan.kernels if k.template == MATMUL]
    timed_here = [k for k in matmuls if (k.template, k.primitives) in g_times]  # (not copies)
    assert timed_here
    for k in timed_here:
        timed = g_times[(k.template, k.primitives)]
        assert timed[k.config] == min(timed.values())
    was = {k.primitives: k.config for k in untuned.kernels}
    assert any(was.get(k.primitives) not in (None, k.config) for k in matmuls)
    loaded = api.load(tmp_path / "b.orch")  # regenerated from plan.json at the tuned configs
    assert [k.config for k in loaded.plan.kernels] == [k.config for k in made.plan.kernels]


def test_a_configuration_that_fails_is_left_out_and_not_cached(tmp_path, capsys):
    g, db = mlp(), tmp_path / "m.sqlite"
    probe = FakeTimer(model_times())
    tuned(g, probe, db.with_name("probe.sqlite"))
    bad = probe.timed[0]
    timer = FakeTimer(model_times(), fail=frozenset({bad}))
    p = tuned(g, timer, db).plan
    assert p.tuning.failed == 1 and bad not in timer.timed
    assert "left out: RuntimeError" in capsys.readouterr().err
    with Cache(db) as c:
        assert bad not in {r.key.spec_hash for r in c.rows()}


class Interrupting(FakeTimer):
    """Interrupted (as by Ctrl-C) at the ``after``-th timing."""

    def __init__(self, after: int):
        super().__init__(model_times())
        self.after = after

    def time(self, graph, spec):
        if len(self.timed) == self.after:
            raise KeyboardInterrupt
        return super().time(graph, spec)


def test_an_interrupted_run_keeps_what_it_committed(tmp_path):
    g, db = mlp(), tmp_path / "m.sqlite"
    clean = FakeTimer(model_times())
    tuned(g, clean, tmp_path / "clean.sqlite")
    with pytest.raises(KeyboardInterrupt):
        tuned(g, Interrupting(after=len(clean.timed) // 2), db)
    with Cache(db) as c:
        kept = c.count()
    assert 0 < kept <= len(clean.timed) // 2
    rest = FakeTimer(model_times())
    tuned(g, rest, db)
    assert len(rest.timed) == len(clean.timed) - kept


_WRITER = """
import sys, time
from orchestrate.tune.cache import Cache, Key, Row
path, who, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Cache(path) as c:
    for b in range(batches if batches > 0 else 10**9):
        c.put([Row(Key(f"{who}-{b}-{i}", "gpu", "float32", "t", "d"), 1.0, 1.0, False,
                   "2026-01-01T00:00:00+00:00", {"pad": "x" * 2000}) for i in range(10)])
        print(b, flush=True)
"""


_OPENER = """
import os, sys, time
from orchestrate.tune.cache import Cache
folder, n = sys.argv[1], int(sys.argv[2])
while not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.001)
for i in range(n):
    Cache(os.path.join(folder, f"c{i}.sqlite")).close()
"""


def test_processes_opening_one_new_file_at_once_all_adopt_it(tmp_path):
    # The first opener creates the table while the others look: each must
    # see either an empty file or ours, never a half-made "foreign" one, and
    # the mode change to WAL must not fail on the others' locks.
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPENER, str(tmp_path), "25"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(6)
    ]
    (tmp_path / "go").touch()
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, [err.decode()[-300:] for _, err in results]
    for i in range(25):
        with Cache(tmp_path / f"c{i}.sqlite") as c:
            assert c.count() == 0


def test_concurrent_writers_lose_nothing(tmp_path):
    db = tmp_path / "m.sqlite"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(db), f"p{k}", "15"], stdout=subprocess.DEVNULL
        )
        for k in range(4)
    ]
    errors = []

    def thread_writer(k):
        try:
            with Cache(db) as c:
                for b in range(15):
                    keys = [Key(f"t{k}-{b}-{i}", "gpu", "float32", "t", "d") for i in range(10)]
                    c.put(
                        [Row(key, 1.0, 1.0, False, "2026-01-01T00:00:00+00:00", {}) for key in keys]
                    )
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=thread_writer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert errors == []
    with Cache(db) as c:
        assert c.count() == (4 + 3) * 15 * 10


def test_a_killed_writer_leaves_a_usable_cache(tmp_path):
    db = tmp_path / "m.sqlite"
    p = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(db), "k", "0"], stdout=subprocess.PIPE, text=True
    )
    for _ in range(5):  # five batches committed, then killed mid-write
        p.stdout.readline()
    p.kill()
    p.wait(timeout=60)
    with Cache(db) as c:
        n = c.count()
        assert n >= 50 and n % 10 == 0  # whole batches only
        assert c._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        c.put([Row(Key("after", "gpu", "float32", "t", "d"), 1.0, 1.0, False, "x", {})])
        assert c.count() == n + 1


def test_calibration_is_the_geometric_mean_per_template():
    scales, overall = calibrate([("matmul", 2.0), ("matmul", 8.0), ("pointwise", 1.0)])
    assert scales == pytest.approx({"matmul": 4.0, "pointwise": 1.0})
    assert overall == pytest.approx(16 ** (1 / 3))
    assert calibrate([]) == ({}, 1.0)


def test_kernels_not_measured_are_scaled_by_what_was(tmp_path):
    g = mlp()
    target = OPTIONS.target()
    everything = _candidates(g, target)
    matmuls = [k for k in everything if k.template == MATMUL]
    timer = FakeTimer(model_times(lambda s: 3.0))
    result = tuner.tune(g, matmuls, target, Tune(timer, 1, tmp_path / "m.sqlite"))
    assert result.measured.scale(MATMUL) == pytest.approx(3.0)
    assert result.measured.scale("row_reduce") == pytest.approx(3.0)  # no row_reduce measured
    prices = Prices(g, H200, result.measured)
    other = next(k for k in everything if k.template not in (MATMUL, VIEW))
    assert prices.cost(other).time_us == pytest.approx(3.0 * cost(g, other, H200).time_us)
    m = matmuls[0]
    assert prices.cost(m).time_us == pytest.approx(timer.figure(g, m))
    plain = Prices(g, H200, Measured({}, {"pointwise": 0.5}, 2.0))
    assert plain.cost(other).time_us == pytest.approx(
        (0.5 if other.template == "pointwise" else 2.0) * cost(g, other, H200).time_us
    )


def _candidates(g, target):
    from orchestrate.ilp.partition import partition
    from orchestrate.plan.candidates import enumerate_kernels

    return [k for p in partition(g) for k in enumerate_kernels(g, p.nodes, target).kernels]


def test_records_export_one_complete_line_per_measurement(tmp_path):
    g, db = mlp(), tmp_path / "m.sqlite"
    timer = FakeTimer(lambda graph, s: 7.0 * len(s.nodes), device="fake H200")
    tuned(g, timer, db)
    out = tmp_path / "records.jsonl"
    r = CliRunner().invoke(cli.main, ["records", "export", str(out), "--cache", str(db)])
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == len(timer.timed) == len(set(timer.timed))
    assert {x["spec_hash"] for x in lines} == set(timer.timed)
    for x in lines:
        assert x["schema"] == "orchestrate-records/1"
        assert x["measured_us"] == 7.0 * len(x["nodes"]) and x["fake"] is True
        assert x["ops"] == [n["op"] for n in x["nodes"]]
        assert x["device"]["name"] == "h200" and x["device"]["gpu"] == "fake H200"
        assert x["device"]["bandwidth_gbs"] == H200.bandwidth_gbs
        assert x["triton"] == "fake" and x["driver"] == "fake" and x["timestamp"]
        assert x["predicted_us"] > 0 and "num_warps" in x["config"]
    # a lone matmul: 2·M·N·K flops, its operands and result in bytes
    (mm,) = [
        x
        for x in lines
        if x["template"] == MATMUL
        and x["ops"] == ["matmul"]
        and x["inputs"][0]["shape"] == [32, 64]
        and x["rank"] == 0
    ]
    assert mm["flops"] == 2 * 32 * 128 * 64 and mm["dot_flops"] == mm["flops"]
    assert mm["bytes"] == 4 * (32 * 64 + 64 * 128 + 32 * 128)
    assert [i["weight"] for i in mm["inputs"]] == [False, False]  # x0 and x1 are graph inputs
    r = CliRunner().invoke(
        cli.main,
        ["records", "export", str(tmp_path / "h.jsonl"), "--cache", str(db), "--device", "H200"],
    )
    assert r.exit_code == 0 and len((tmp_path / "h.jsonl").read_text().splitlines()) == len(lines)


def _as_a_reader_who_cannot_write(work) -> tuple[int, str]:
    """``work()`` in a forked child that cannot write: as user nobody when
    the tests run as root (whom file modes do not stop), else as itself.
    Its exit status and what it printed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        os.close(r)
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            os.write(w, repr(work()).encode())
            os._exit(0)
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            os.write(w, f"{type(e).__name__}: {e}".encode())
            os._exit(1)
    os.close(w)
    with os.fdopen(r) as f:
        said = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), said


def test_a_read_only_cache_is_exported_and_left_as_it_was():
    """A cache in WAL mode needs its -shm index written even to be read;
    in a folder its reader cannot write, export reads it as immutable."""
    from orchestrate.tune.export import export

    folder, out = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    try:
        db = folder / "m.sqlite"
        with Cache(db) as c:
            c.put(
                [
                    Row(
                        Key(f"h{i}", "gpu", "float32", "t", "d"),
                        1.0 + i,
                        1.0,
                        False,
                        "2026-01-01T00:00:00+00:00",
                        {},
                    )
                    for i in range(3)
                ]
            )
        before = snapshot_of(folder)
        db.chmod(0o444)
        folder.chmod(0o555)
        out.chmod(0o777)
        code, said = _as_a_reader_who_cannot_write(lambda: export(out / "r.jsonl", None, db))
        assert code == 0 and said == "(3, 0)", said
        assert [
            json.loads(x)["measured_us"] for x in (out / "r.jsonl").read_text().splitlines()
        ] == [1.0, 2.0, 3.0]
        assert snapshot_of(folder) == before  # nothing written, no -wal or -shm left
        # a cache opened for reading never writes, even where it could
        folder.chmod(0o755)
        with Cache(db, read_only=True) as c, pytest.raises(InputError, match="readonly"):
            c.put([Row(Key("x", "gpu", "float32", "t", "d"), 1.0, 1.0, False, "x", {})])
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)
        shutil.rmtree(out)


def snapshot_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def assert_one_line_error(r, *needles):
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    for n in needles:
        assert n in r.output


def test_records_export_refuses_in_one_line(tmp_path):
    run = CliRunner().invoke
    empty = tmp_path / "empty.sqlite"
    Cache(empty).close()
    out = tmp_path / "r.jsonl"
    assert_one_line_error(
        run(cli.main, ["records", "export", str(out), "--cache", str(empty)]), "empty"
    )
    missing = tmp_path / "none.sqlite"
    assert_one_line_error(
        run(cli.main, ["records", "export", str(out), "--cache", str(missing)]),
        "no measurement cache",
    )
    assert not missing.exists()
    with Cache(tmp_path / "m.sqlite") as c:
        c.put(
            [
                Row(
                    Key("h", "gpu", "float32", "t", "d"),
                    1.0,
                    1.0,
                    False,
                    "x",
                    {"device": {"name": "h200"}},
                )
            ]
        )
    full = ["--cache", str(tmp_path / "m.sqlite")]
    assert_one_line_error(
        run(cli.main, ["records", "export", str(tmp_path / "no/dir/r.jsonl"), *full])
    )
    assert_one_line_error(
        run(cli.main, ["records", "export", str(out), *full, "--device", "a100"]), "--device a100"
    )
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("command", ["optimize", "plan"])
def test_tune_without_a_gpu_exits_2_in_one_line_writing_nothing(tmp_path, command):
    out = tmp_path / ("out.orch" if command == "optimize" else "plan.json")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrate.cli",
            command,
            "examples/models/tiny_bert.onnx",
            "-o",
            str(out),
            "--tune",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "--tune: no CUDA GPU" in r.stderr, r.stderr
    assert r.stdout == "" and not out.exists() and list(tmp_path.iterdir()) == []


def test_tune_configs_alone_is_refused():
    r = CliRunner().invoke(cli.main, ["plan", "m.onnx", "-o", "p.json", "--tune-configs", "2"])
    assert_one_line_error(r, "--tune-configs 2: only with --tune")


def test_the_gpu_timer_path_runs_every_candidate_in_the_interpreter(tmp_path):
    """GpuTimer's own path (module per spec, launcher, tensors, split-K
    scratch, flags), with the interpreter for the GPU and a clock that
    counts calls."""
    calls = []

    def bench(fn):
        fn()
        calls.append(1)
        return 0.001  # ms

    info = TimerInfo("interpreter", "none", "test", "one call", fake=True)
    timer = GpuTimer(device="cpu", bench=bench, info=info)
    p = tuned(mlp(), timer, tmp_path / "m.sqlite", configs=2).plan
    assert p.tuning.failed == 0 and p.tuning.measured == len(calls) > 0
    assert p.tuning.gpu == "interpreter"
    # 0.001 ms is 1 µs, plus the model's price of any optional output written
    assert all(k.predicted_us >= 1.0 for k in p.kernels if k.template != VIEW)
    assert any(k.predicted_us == 1.0 for k in p.kernels)


def test_kernels_compile_ahead_in_a_pool_for_the_gpu(tmp_path):
    """The compile step of GpuTimer.prepare, for sm_90 without a GPU (as
    compile_check does): worker processes, no interpreter."""
    g = mlp()
    specs = [k for k in _candidates(g, OPTIONS.target()) if k.template != VIEW][:3]
    jobs = [(kernel_module_source(g, k), tensor_dtypes(g, k)) for k in specs]
    seen = []
    errors = compile_ahead(jobs, 90, 2, lambda stage, i, n: seen.append((stage, i, n)))
    assert errors == [None] * 3
    assert seen[-1] == ("compile", 3, 3)


def test_the_tuning_is_reported_next_to_the_plan_and_kept_in_its_file(tmp_path):
    g = mlp()
    p = tuned(g, FakeTimer(model_times(lambda s: 2.0)), tmp_path / "m.sqlite").plan
    text = "\n".join(summary_lines(p))
    assert f"{p.tuning.measured} timed, 0 from the cache" in text
    assert "FAKE timer" in text and "matmul 2" in text
    assert Plan.from_json(p.to_json(), templates.NAMES).tuning == p.tuning
    untuned = plan(g, OPTIONS).plan
    assert "tuning" not in untuned.to_json() and "tuning:" not in "\n".join(summary_lines(untuned))


@pytest.mark.gpu
def test_tune_on_the_gpu_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    """The real timer: a matmul, bias and ReLU tuned on the GPU present and
    verified; the second run times nothing; the records name this GPU."""
    import onnx
    from onnx import helper, numpy_helper

    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64), np.float32), "w")
    b = numpy_helper.from_array(np.zeros(64, np.float32), "b")
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["a"]),
            helper.make_node("Relu", ["a"], ["y"]),
        ],
        "m",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [16, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [16, 64])],
        [w, b],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    args = ["optimize", str(tmp_path / "m.onnx"), "--tune", "--trials", "1", "-o"]
    first = CliRunner().invoke(cli.main, [*args, str(tmp_path / "a.orch")])
    assert first.exit_code == 0, first.output
    assert "tuning:" in first.output and " 0 from the cache" in first.output
    second = CliRunner().invoke(cli.main, [*args, str(tmp_path / "b.orch")])
    assert second.exit_code == 0, second.output
    assert ": 0 timed," in second.output
    out = tmp_path / "r.jsonl"
    r = CliRunner().invoke(cli.main, ["records", "export", str(out)])
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines and all(x["fake"] is False and x["measured_us"] > 0 for x in lines)
    assert {x["device"]["gpu"] for x in lines} == {torch.cuda.get_device_name(0)}


def _row(spec_hash: str, us: float = 1.0) -> Row:
    return Row(Key(spec_hash, "gpu", "float32", "t", "d"), us, 1.0, False, "x", {"device": {}})


def test_a_cache_of_another_schema_is_one_line_not_an_internal_error(tmp_path):
    """An SQLite file that is not ours (another app's tables; a table of our
    name with other columns under our version number) is refused, and left
    as it was: nothing is created in it."""
    import sqlite3

    run = CliRunner().invoke
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE notes (id INTEGER, text TEXT)")
    r = run(cli.main, ["records", "export", str(tmp_path / "r.jsonl"), "--cache", str(other)])
    assert_one_line_error(r, "other.sqlite", "not an orchestrate measurement cache", "notes")
    with sqlite3.connect(other) as db:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert tables == ["notes"]
    renamed = tmp_path / "renamed.sqlite"
    with sqlite3.connect(renamed) as db:
        db.execute("CREATE TABLE measurements (spec_hash TEXT, measured_us REAL)")
        db.execute("PRAGMA user_version = 1")
    r = run(cli.main, ["records", "export", str(tmp_path / "r.jsonl"), "--cache", str(renamed)])
    assert_one_line_error(r, "renamed.sqlite", "columns spec_hash, measured_us")
    g = mlp()
    with pytest.raises(InputError, match="not an orchestrate measurement cache"):
        tuned(g, FakeTimer(model_times()), renamed)


def test_damaged_rows_are_skipped_and_counted_and_never_used(tmp_path):
    """Rows with bad JSON, a text or infinite time: export writes the good
    rows and says how many it skipped; a tuned run measures those again."""
    import sqlite3

    db = tmp_path / "m.sqlite"
    with Cache(db) as c:
        c.put([_row("good"), _row("json"), _row("text"), _row("inf")])
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE measurements SET record = '{not json' WHERE spec_hash = 'json'")
        conn.execute("UPDATE measurements SET measured_us = 'fast' WHERE spec_hash = 'text'")
        conn.execute("UPDATE measurements SET measured_us = 9e999 WHERE spec_hash = 'inf'")
    out = tmp_path / "r.jsonl"
    r = CliRunner().invoke(cli.main, ["records", "export", str(out), "--cache", str(db)])
    assert r.exit_code == 0, r.output
    assert "1 measurement" in r.output and "3 damaged rows skipped" in r.output
    (line,) = out.read_text().splitlines()
    assert json.loads(line)["spec_hash"] == "good"
    with Cache(db) as c:
        found = c.get([_row(h).key for h in ("good", "json", "text", "inf")])
    assert set(k.spec_hash for k in found) == {"good", "json"}  # a bad record is still a time


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.0, 0.0])
def test_a_timing_that_is_not_a_time_is_never_cached_or_used(tmp_path, bad, capsys):
    g = mlp()
    probe = FakeTimer(model_times())
    tuned(g, probe, tmp_path / "probe.sqlite")
    victim = probe.timed[0]
    timer = FakeTimer(lambda graph, s: bad if s.hash == victim else model_times()(graph, s))
    p = tuned(g, timer, tmp_path / "m.sqlite").plan
    assert p.tuning.failed == 1 and "left out" in capsys.readouterr().err
    with Cache(tmp_path / "m.sqlite") as c:
        assert all(math.isfinite(r.measured_us) and r.measured_us > 0 for r in c.rows())
        assert victim not in {r.key.spec_hash for r in c.rows()}
    with Cache(tmp_path / "x.sqlite") as c, pytest.raises(ValueError, match="not a time"):
        c.put([_row("h", bad)])
