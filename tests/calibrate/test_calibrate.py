"""orchestrate calibrate: its statistics by hand, its predictions of a small
fixture (tests/cost/data/measurements.jsonl) and its command line."""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrate import cli
from orchestrate.calibrate import harness, sanity
from orchestrate.calibrate.harness import launcher, runtime_class
from orchestrate.calibrate.predict import Prediction, options_for, predict_all
from orchestrate.calibrate.run import calibrate, choose
from orchestrate.calibrate.stats import fit, ranks, spearman
from orchestrate.cost import measurements
from orchestrate.cost.devices import get_device
from orchestrate.cost.figures import HARNESS_FLOOR_US, HARNESS_PER_KERNEL

FIXTURE = Path(__file__).resolve().parents[1] / "cost" / "data" / "measurements.jsonl"


def test_statistics_by_hand():
    """(2, 1), (1, 2), (1, 1): unbiased on average (2 * 1/2 * 1 = 1), a
    typical miss of 2**(2/3), all within 2x; the ranks (3, 1.5, 1.5) and
    (1.5, 3, 1.5) correlate at -0.75 / 1.5 = -0.5."""
    f = fit([(2, 1), (1, 2), (1, 1)])
    assert f.n == 3 and f.geomean == pytest.approx(1.0)
    assert f.error == pytest.approx(2 ** (2 / 3)) and f.within == 1.0
    assert f.spearman == pytest.approx(-0.5)
    assert ranks([5, 1, 5, 3]) == [3.5, 1.0, 3.5, 2.0]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2], [2, 1]) is None and spearman([1, 1, 1], [1, 2, 3]) is None
    miss = fit([(10, 1), (1, 1)])
    assert miss.within == 0.5 and math.isclose(miss.geomean, math.sqrt(10))


def test_runtimes_and_who_launches_their_kernels():
    assert runtime_class("eager") == "eager" and runtime_class("torch.compile:default") == "compile"
    assert runtime_class("torch.compile:cudagraphs") == "cudagraphs"
    assert runtime_class("orchestrate") == "other"
    assert launcher("eager") == "eager"
    assert launcher("torch.compile:default") == "compile"
    assert launcher("torch.compile:max-autotune-no-cudagraphs") == "compile"
    for graphed in ("torch.compile:reduce-overhead", "torch.compile:max-autotune", "orchestrate"):
        assert launcher(graphed) == "graph"


def test_the_harness_floor_is_read_from_each_timing_files_small_programs():
    """The h100 eager row's file has one small program (0.25 ms, one op): its
    floor, read through the real caller; a row of a file with no small
    program takes the launcher's default, and a row timed alone (runtime
    orchestrate) has no host time."""
    rows = measurements.load(FIXTURE)
    eager = next(m for m in rows if m.runtime == "eager" and m.gpu == "h100")
    (p,) = predict_all([eager])
    assert (p.host.call_us, p.host.per_kernel_us) == (0.0, 250.0)  # eager: every op pays it
    assert p.predicted_us == pytest.approx(250.0)
    assert p.host.total([10.0, 300.0]) == 550.0
    compiled = replace(
        eager, runtime="torch.compile:default", source=replace(eager.source, timing="x")
    )
    h = harness.host(compiled, harness.floors([(eager, [1.0])]))
    share = HARNESS_PER_KERNEL["compile"]
    assert h.per_kernel_us == pytest.approx(HARNESS_FLOOR_US["compile"] * share)
    assert h.call_us + h.per_kernel_us == pytest.approx(HARNESS_FLOOR_US["compile"])
    assert harness.host(replace(eager, runtime="orchestrate")).total([3.0]) == 3.0


def _copies(m, times, timing="t.json", gpu=None):
    """Row ``m`` as many times as ``times``, each its own program id, from one file."""
    return [
        replace(
            m,
            id=f"{m.id}/{timing}/{i}",
            time_us=t,
            gpu=gpu or m.gpu,
            source=replace(m.source, timing=timing),
        )
        for i, t in enumerate(times)
    ]


def test_the_floor_passes_over_a_few_outliers_and_a_slow_tail():
    """Twenty small one-op programs, two far below the rest and two far
    above: the floor is the one that misses them least, between the two
    middle times (47 and 48 µs), whatever the outliers."""
    eager = next(m for m in measurements.load(FIXTURE) if m.runtime == "eager")
    times = [5.0, 6.0] + [40.0 + i for i in range(16)] + [400.0, 900.0]
    rows = _copies(eager, times)
    floor = harness.floors((m, [1.0]) for m in rows)[harness.timing_file(rows[0])]
    assert 47.0 <= floor <= 48.0
    calmer = _copies(eager, [45.0, 46.0] + times[2:18] + [60.0, 61.0])
    assert harness.floors((m, [1.0]) for m in calmer)[harness.timing_file(rows[0])] == floor


def test_the_floor_is_per_op_for_eager_and_per_call_for_a_graph():
    """Eager pays the floor for every op: one-op programs at 20 µs and
    three-op programs at 60 µs imply one floor of 20 µs, and each is then
    predicted exactly.  A CUDA graph pays it once per call (2% per kernel):
    the same times imply two floors, and the fit takes the one that the
    larger group of programs implies (three at 60 µs against two at 20)."""
    eager = next(m for m in measurements.load(FIXTURE) if m.runtime == "eager")
    rows = _copies(eager, [20.0, 20.0, 60.0, 60.0, 60.0])
    kernels = [[1.0], [1.0], [1.0] * 3, [1.0] * 3, [1.0] * 3]
    floor = harness.floors(zip(rows, kernels))[harness.timing_file(rows[0])]
    assert floor == pytest.approx(20.0)
    for m, k in zip(rows, kernels):
        assert harness.host(m, {harness.timing_file(m): floor}).total(k) == pytest.approx(m.time_us)
    graphed = [replace(m, runtime="torch.compile:reduce-overhead") for m in rows]
    floor = harness.floors(zip(graphed, kernels))[harness.timing_file(rows[0])]
    assert floor == pytest.approx(60.0 / (0.98 + 0.06))
    # a row not from a timing file sets no floor
    big = replace(rows[0], source=replace(rows[0].source, timing=""))
    assert harness.floors([(big, [1.0])]) == {}


def _predicted(rows):
    return [Prediction(m, m.time_us, m.time_us, (), harness.NONE) for m in rows]


def test_a_level_with_rows_faster_than_the_datasheet_is_set_aside():
    """Two of twenty rows below what the datasheet allows set the file's
    level aside, with the count in the reason; one of forty does not (a
    level needs two, and 5% of its rows)."""
    eager = next(m for m in measurements.load(FIXTURE) if m.runtime == "eager")
    assert sanity.lower_bound_us(_predicted([eager])[0]) > 1e-4
    bad = _copies(eager, [1e-6, 1e-6] + [100.0] * 18, timing="bad.json")
    one = _copies(eager, [1e-6] + [100.0] * 39, timing="one.json")
    kept, skipped = sanity.set_aside(_predicted(bad + one))
    assert {p.measurement.source.timing for p in kept} == {"one.json"} and len(kept) == 40
    assert (
        len(skipped) == 20 and "2 of its timing file's level-1 rows are faster" in skipped[0].reason
    )


def _large(m):
    """Row ``m`` with a 64 MiB input: a program whose time is its GPU's."""
    graph = {**m.graph, "inputs": [{**m.graph["inputs"][0], "shape": [4096, 4096]}]}
    big = replace(m, graph=graph)
    assert not harness.small(big)
    return big


def test_a_level_that_disagrees_with_the_same_programs_elsewhere_is_set_aside():
    """One program timed at 100 µs on an H100 in three files and at 50 ms on
    an H200 in a fourth: no datasheet lets an H200 be 500x slower, so the
    H200 row disagrees with its peers and theirs agree; a level of such rows
    is set aside, naming the factor."""
    eager = _large(next(m for m in measurements.load(FIXTURE) if m.runtime == "eager"))
    peers = [_copies(eager, [100.0], timing=f"{t}.json")[0] for t in "abc"]
    odd = _copies(eager, [50_000.0], timing="d.json", gpu="h200")[0]
    near = _copies(eager, [60.0], timing="e.json", gpu="h200")[0]  # an H200 a bit faster
    assert sanity.disagreeing(peers + [odd, near]) == {odd.id}
    group = [replace(odd, id=f"{odd.id}/{i}") for i in range(3)]
    kept, skipped = sanity.set_aside(_predicted(peers + group), peers + group)
    assert {p.measurement.id for p in kept} == {p.id for p in peers}
    assert len(skipped) == 3 and "disagree with the same programs elsewhere" in skipped[0].reason


def test_a_fast_host_is_not_read_as_other_sizes():
    """A small program's time is its host's: two rows of one timed at 5 µs
    on a desktop against 100 µs on five cloud hosts are not compared, and
    their level is kept; the same program at a size whose time is the GPU's
    is compared, and the desktop's level set aside."""
    eager = next(m for m in measurements.load(FIXTURE) if m.runtime == "eager")
    assert harness.small(eager)
    for program, kept_all in ((eager, True), (_large(eager), False)):
        peers = [_copies(program, [100.0], timing=f"{t}.json")[0] for t in "abcde"]
        fast = _copies(program, [5.0] * 2, timing="desktop.json", gpu="h200")
        assert sanity.disagreeing(peers + fast) == (set() if kept_all else {m.id for m in fast})
        kept, skipped = sanity.set_aside(_predicted(peers + fast), peers + fast)
        assert (len(kept), len(skipped)) == ((7, 0) if kept_all else (5, 2))


def test_a_level_whose_trials_were_unsteady_is_set_aside():
    """A file whose median row's mean is twice its fastest trial is set
    aside, naming why; one whose rows are steady but for a few is not."""
    eager = next(m for m in measurements.load(FIXTURE) if m.runtime == "eager")
    spread = lambda rows, means: [replace(m, min_us=100.0 / f) for m, f in zip(rows, means)]
    noisy = spread(_copies(eager, [100.0] * 5, timing="noisy.json"), [2, 2, 2, 1, 1])
    steady = spread(_copies(eager, [100.0] * 5, timing="steady.json"), [9, 9, 1.1, 1, 1])
    kept, skipped = sanity.set_aside(_predicted(noisy + steady))
    assert {p.measurement.source.timing for p in kept} == {"steady.json"}
    assert len(skipped) == 5 and "the trials were unsteady" in skipped[0].reason


def test_each_runtime_is_priced_as_it_runs():
    """Eager: one library or generated kernel per ONNX op, each waiting at
    least for its dispatch from the host; torch.compile: the plan, after the
    call's host time."""
    found, skipped = calibrate([FIXTURE])
    assert not skipped and len(found) == 3
    by_runtime = {p.measurement.runtime: p for p in found}
    eager = by_runtime["eager"]
    assert {k.template for k in eager.kernels} <= {"library_matmul", "library_conv", "pointwise"}
    floor = eager.host.per_kernel_us
    assert eager.predicted_us == pytest.approx(sum(max(k.time_us, floor) for k in eager.kernels))
    compiled = by_runtime["torch.compile:default"]
    assert compiled.predicted_us == pytest.approx(
        compiled.host.call_us
        + sum(max(k.time_us, compiled.host.per_kernel_us) for k in compiled.kernels)
    )
    assert compiled.host.call_us > 0
    assert all(isinstance(p, Prediction) and p.predicted_us > 0 for p in found)


def test_only_max_autotune_lets_generated_gemms_stand_for_inductor():
    """Inductor calls cuBLAS and cuDNN unless a max-autotune mode tries its
    Triton templates too: the default mode's plan has no generated GEMM or
    convolution, max-autotune's may have a generated GEMM, but a program with
    a convolution stays with library calls (the module doc of predict.py)."""
    rows = measurements.load(FIXTURE)
    conv = next(m for m in rows if m.kind == "conv")
    assert options_for(conv).gemm_backends == ("library",) and options_for(conv).tf32
    tuned = replace(conv, runtime="torch.compile:max-autotune-no-cudagraphs")
    assert options_for(tuned).gemm_backends == ("library",) and options_for(tuned).tf32
    assert options_for(replace(conv, runtime="eager")).gemm_backends == ("library",)
    matmul = next(m for m in rows if m.kind == "matmul")
    for runtime in ("torch.compile:max-autotune", "torch.compile:max-autotune-no-cudagraphs"):
        assert options_for(replace(matmul, runtime=runtime)).gemm_backends == ("triton", "library")
    assert options_for(replace(matmul, runtime="torch.compile:default")).gemm_backends == (
        "library",
    )
    found = predict_all([tuned, replace(conv, id="c2", runtime="torch.compile:max-autotune")])
    assert {k.template for p in found for k in p.kernels} <= {"library_conv", "pointwise"}


def test_rows_are_chosen_by_gpu_runtime_and_kind():
    rows = measurements.load(FIXTURE)
    assert {m.gpu for m in choose(rows, gpus=["h100"])} == {"h100"}
    assert {runtime_class(m.runtime) for m in choose(rows, runtimes=["compile"])} == {"compile"}
    assert [m.kind for m in choose(rows, kinds=["conv"])] == ["conv"]
    assert choose(rows, gpus=["t4"]) == []


def test_a_program_that_cannot_be_planned_is_skipped_with_its_reason(monkeypatch):
    row = measurements.load(FIXTURE)[0]

    def refuse(m):
        from orchestrate.errors import UnsupportedError

        raise UnsupportedError("no decomposition for Frobnicate", {"Frobnicate": 1})

    module = importlib.import_module("orchestrate.calibrate.predict")
    monkeypatch.setattr(module.measurements, "model", refuse)
    s = module.predict(row)
    assert isinstance(s, module.Skipped) and "Frobnicate" in s.reason


def test_the_command_prints_tables_and_writes_its_rows(tmp_path):
    out = tmp_path / "c.json"
    r = CliRunner().invoke(cli.main, ["calibrate", str(FIXTURE), "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "by GPU and runtime" in r.output and "h100 eager" in r.output
    data = json.loads(out.read_text())
    assert len(data["predictions"]) == 3 and not data["skipped"]
    r = CliRunner().invoke(cli.main, ["calibrate", str(FIXTURE), "--gpu", "t4"])
    assert r.exit_code == 2 and "no measurement row matches" in r.output
    r = CliRunner().invoke(cli.main, ["calibrate", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2 and "missing.jsonl" in r.output and "Traceback" not in r.output


def _program(m, inputs, initializers, nodes, runtime):
    graph = {
        "opsets": {"": 17},
        "inputs": inputs,
        "outputs": [{"name": "y", "dtype": "float32", "shape": [4096, 4096]}],
        "initializers": initializers,
        "nodes": nodes,
    }
    return replace(m, id=f"{m.id}/{runtime}", runtime=runtime, graph=graph)


def test_cuda_graph_modes_copy_the_inputs_before_the_replay_not_the_weights():
    """torch.compile's CUDA-graph modes copy each input into the graph's
    buffers before the replay: one more streaming kernel, over the inputs'
    bytes (read and written) and not the weights'; eager, the default mode and
    max-autotune without CUDA graphs copy nothing.  Rows of one program under
    the default mode and reduce-overhead share a plan, not the copy."""
    base = next(m for m in measurements.load(FIXTURE) if m.gpu == "h100")
    x = {"name": "x", "dtype": "float32", "shape": [4096, 4096]}
    relu = [{"op": "Relu", "inputs": ["x"], "outputs": ["y"]}]
    runtimes = (
        "eager",
        "torch.compile:default",
        "torch.compile:max-autotune-no-cudagraphs",
        "torch.compile:reduce-overhead",
        "torch.compile:max-autotune",
        "torch.compile:cudagraphs",
    )
    rows = [_program(base, [x], [], relu, r) for r in runtimes]
    found = dict(zip(runtimes, predict_all(rows)))
    streamed = 2 * 4096 * 4096 * 4  # read once, written once
    for runtime, p in found.items():
        copies = runtime in runtimes[3:]
        assert len(p.kernels) == 1 + copies, runtime
        if copies:
            copy = p.kernels[0]
            assert copy.bytes == streamed and copy.flops == 0
            # no faster than the datasheet's bandwidth allows
            assert copy.time_us >= streamed / (get_device("h100").bandwidth_gbs * 1e3)
            assert p.predicted_us == pytest.approx(p.host.total(k.time_us for k in p.kernels))
    plain, graphed = found["torch.compile:default"], found["torch.compile:reduce-overhead"]
    assert graphed.kernels[1:] == plain.kernels and graphed.model_us == plain.model_us
    # a weight is the module's own: only the input is copied
    w = {"name": "w", "dtype": "float32", "shape": [4096, 4096]}
    matmul = [{"op": "MatMul", "inputs": ["x", "w"], "outputs": ["y"]}]
    (p,) = predict_all([_program(base, [x], [w], matmul, "torch.compile:reduce-overhead")])
    assert p.kernels[0].bytes == streamed
    assert harness.input_copy(replace(rows[0], runtime="orchestrate")) == ()


def test_a_rows_floor_does_not_depend_on_which_rows_were_chosen():
    """``calibrate --kind`` or ``--gpu`` predicts some rows of a timing file;
    the file's floor still comes from all its small programs, which
    ``predict_all`` plans for the purpose (``among``), not from the chosen
    rows only, and not the launcher's default."""
    small = next(m for m in measurements.load(FIXTURE) if m.runtime == "eager" and m.gpu == "h100")
    x = {"name": "x", "dtype": "float32", "shape": [4096, 4096]}
    relu = [{"op": "Relu", "inputs": ["x"], "outputs": ["y"]}]
    large = replace(_program(small, [x], [], relu, "eager"), id="large")
    assert harness.small(small) and not harness.small(large)
    (alone,) = predict_all([large])
    (chosen,) = predict_all([large], among=[small, large])
    both = dict(zip(("large", "small"), predict_all([large, small])))
    assert alone.host.per_kernel_us == HARNESS_FLOOR_US["eager"]
    assert chosen.host == both["large"].host and chosen.host.per_kernel_us == pytest.approx(250.0)
    assert chosen.predicted_us == pytest.approx(both["large"].predicted_us)
