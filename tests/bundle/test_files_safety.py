"""Files: what a command may replace, what it never touches, and that a
failure, a bad option or a signal leaves nothing half-written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

from orchestrate import cli
from orchestrate.frontend import onnxrt
from tests.util import elem

ROOT = Path(__file__).resolve().parents[2]


def _model(outputs=("y", "z")) -> onnx.ModelProto:
    """y = relu(x), z = -x: two outputs, named as asked."""
    x = helper.make_tensor_value_info("x", elem("float32"), [2, 8])
    nodes = [
        helper.make_node("Relu", ["x"], [outputs[0]], name="relu"),
        helper.make_node("Neg", ["x"], [outputs[1]], name="neg"),
    ]
    g = helper.make_graph(nodes, "m", [x], [onnx.ValueInfoProto(name=o) for o in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(m)


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def assert_user_error(result, *needles):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    for n in needles:
        assert n in result.output, result.output


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder``, with the bytes of each file."""
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
        for p in sorted(folder.rglob("*"))
    }


def hidden(folder: Path) -> list[str]:
    """Temporary entries (.NAME.XXXX, .NAME.old.XXXX, .orchestrate-out.XXXX)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(model, bundle) made once through the CLI; tests copy the bundle."""
    root = tmp_path_factory.mktemp("built")
    src = root / "m.onnx"
    onnx.save(_model(), src)
    r = invoke("optimize", src, "-o", root / "m.orch", "--trials", "1")
    assert r.exit_code == 0, r.output
    return src, root / "m.orch"


def _copy(built, tmp_path: Path, name: str = "out") -> tuple[Path, Path]:
    src, bundle = built
    model = tmp_path / "m.onnx"
    shutil.copy(src, model)
    out = tmp_path / name
    shutil.copytree(bundle, out)
    return model, out


# 1. an existing folder is replaced only if it is a bundle orchestrate wrote


def test_an_earlier_bundle_is_replaced_and_nothing_stray_remains(built, tmp_path):
    model, out = _copy(built, tmp_path)
    before = (out / "manifest.json").read_bytes()
    r = invoke("optimize", model, "-o", out, "--trials", "0")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["kernels.py", "manifest.json", "plan.json", "report.md", "weights.npz"]
    )
    assert (out / "manifest.json").read_bytes() != before  # really rewritten ("not run")
    assert hidden(tmp_path) == []


def test_an_empty_folder_is_used(built, tmp_path):
    model, _ = _copy(built, tmp_path)
    (tmp_path / "empty").mkdir()
    r = invoke("optimize", model, "-o", tmp_path / "empty", "--trials", "0")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "empty" / "manifest.json").is_file()
    assert hidden(tmp_path) == []


def _webapp(out: Path) -> None:
    out.mkdir()
    (out / "manifest.json").write_text('{"name": "my app", "start_url": "/"}')
    (out / "index.html").write_text("<html></html>")


def _with_notes(out: Path) -> None:
    (out / "notes.txt").write_text("my notes")


def _edited(out: Path) -> None:
    with open(out / "kernels.py", "a") as f:
        f.write("# my edit\n")


def _manifest_list(out: Path) -> None:
    (out / "manifest.json").write_text("[1, 2]")


def _manifest_foreign_format(out: Path) -> None:
    m = json.loads((out / "manifest.json").read_text())
    m["format"] = "someone-else/1"
    (out / "manifest.json").write_text(json.dumps(m))


def _manifest_not_json(out: Path) -> None:
    (out / "manifest.json").write_text("{oops")


def _file_missing(out: Path) -> None:
    (out / "report.md").unlink()


def _folder_for_a_file(out: Path) -> None:
    (out / "report.md").unlink()
    (out / "report.md").mkdir()
    (out / "report.md" / "mine.txt").write_text("keep")


def _only_a_manifest(out: Path) -> None:
    out.mkdir()
    (out / "manifest.json").write_text('{"format": "orchestrate-bundle/1"}')


@pytest.mark.parametrize(
    "make, copy, needle",
    [
        (_webapp, False, "holds files an orchestrate bundle does not: index.html"),
        (_with_notes, True, "holds files an orchestrate bundle does not: notes.txt"),
        (_edited, True, "kernels.py was changed since orchestrate wrote it"),
        (_manifest_list, True, "manifest.json is not a JSON object"),
        (_manifest_foreign_format, True, "does not name an orchestrate bundle format"),
        (_manifest_not_json, True, "manifest.json is not valid JSON"),
        (_file_missing, True, "report.md is missing"),
        (_folder_for_a_file, True, "report.md is not a plain file"),
        (_only_a_manifest, False, "does not list the bundle's files"),
    ],
)
def test_a_folder_that_is_not_an_unchanged_bundle_is_left_alone(
    built, tmp_path, make, copy, needle
):
    model, out = _copy(built, tmp_path)
    if not copy:
        shutil.rmtree(out)
    make(out)
    before = snapshot(tmp_path)
    r = invoke("optimize", model, "-o", out, "--trials", "0")
    assert_user_error(r, str(out), "not an orchestrate bundle", needle, "refusing to replace it")
    assert snapshot(tmp_path) == before


def test_a_file_name_with_a_line_break_is_shown_on_one_line(built, tmp_path):
    model, out = _copy(built, tmp_path)
    (out / "a\nb.txt").write_text("x")
    r = invoke("optimize", model, "-o", out, "--trials", "0")
    assert_user_error(r, "does not: a\\nb.txt)")
    assert (out / "a\nb.txt").exists()


def test_the_bundle_is_checked_again_just_before_it_is_replaced(built, tmp_path, monkeypatch):
    """A file the user puts into OUT while the bundle is built still counts."""
    import orchestrate
    from orchestrate import bundle

    model, out = _copy(built, tmp_path)
    real = bundle.Staging.commit

    def commit(self):
        (out / "notes.txt").write_text("written during the run")
        return real(self)

    monkeypatch.setattr(bundle.Staging, "commit", commit)
    with pytest.raises(orchestrate.InputError, match="notes.txt"):
        orchestrate.optimize(model, out, trials=0)
    assert (out / "notes.txt").read_text() == "written during the run"
    assert hidden(tmp_path) == []


def test_a_failed_rename_puts_the_old_bundle_back(built, tmp_path, monkeypatch):
    import orchestrate

    model, out = _copy(built, tmp_path)
    before = snapshot(out)
    real = os.rename

    def rename(a, b):
        if Path(b) == out.resolve() and Path(a).name.startswith(".out."):
            raise OSError(28, "No space left on device")
        return real(a, b)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(orchestrate.InputError, match="No space left on device"):
        orchestrate.optimize(model, out, trials=0)
    monkeypatch.undo()
    assert snapshot(out) == before
    assert hidden(tmp_path) == []


# 2. the input model, and what holds it, is never deleted or overwritten


def test_optimize_into_the_folder_that_holds_the_model_is_refused(built, tmp_path):
    _, out = _copy(built, tmp_path)
    shutil.copy(built[0], out / "model.onnx")  # an earlier bundle, the model put into it
    before = snapshot(tmp_path)
    r = invoke("optimize", out / "model.onnx", "-o", out, "--trials", "0")
    assert_user_error(r, str(out), "holds the input model", "refusing to replace it")
    # above the model, and through a symbolic link to its folder
    (tmp_path / "link").symlink_to(out)
    for target in (tmp_path, tmp_path / "link"):
        r = invoke("optimize", out / "model.onnx", "-o", target, "--trials", "0")
        assert_user_error(r, "holds the input model")
    (tmp_path / "link").unlink()
    assert snapshot(tmp_path) == before


def test_the_current_folder_is_never_replaced(built, tmp_path, monkeypatch):
    _, out = _copy(built, tmp_path)
    model = tmp_path / "elsewhere" / "m.onnx"
    model.parent.mkdir()
    shutil.copy(built[0], model)
    before = snapshot(tmp_path)
    monkeypatch.chdir(out)  # a bundle, so only its being the current folder stops it
    for target in (".", out):
        r = invoke("optimize", model, "-o", target, "--trials", "0")
        assert_user_error(r, "holds the current folder")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["plan", "decompose"])
def test_plan_and_decompose_refuse_to_overwrite_the_model(tmp_path, command):
    model = tmp_path / "m.onnx"
    onnx.save(_model(), model)
    (tmp_path / "same.onnx").symlink_to(model)
    data = model.read_bytes()
    for out in (model, tmp_path / "." / "m.onnx", tmp_path / "same.onnx"):
        assert_user_error(invoke(command, model, "-o", out), str(out), "is the input model")
    assert model.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "same.onnx"]


def test_decompose_refuses_to_overwrite_the_models_external_data(tmp_path):
    from onnx import numpy_helper

    x = helper.make_tensor_value_info("x", elem("float32"), [2, 8])
    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "m",
        [x],
        [onnx.ValueInfoProto(name="y")],
        initializer=[w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(
        m, tmp_path / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0
    )
    data = (tmp_path / "w.bin").read_bytes()
    r = invoke("decompose", tmp_path / "m.onnx", "-o", tmp_path / "w.bin")
    assert_user_error(r, "w.bin", "external data of the input model")
    assert (tmp_path / "w.bin").read_bytes() == data


def test_explain_refuses_to_draw_over_the_plan(tmp_path):
    model, plan = tmp_path / "m.onnx", tmp_path / "p.json"
    onnx.save(_model(), model)
    assert invoke("plan", model, "-o", plan).exit_code == 0
    data = plan.read_bytes()
    assert_user_error(invoke("explain", plan, "--picture", plan), "is the input plan")
    assert plan.read_bytes() == data


def test_explain_never_draws_over_the_dimensions_it_reads(tmp_path):
    """P.dims.json beside P.json is what makes the plan read as dynamic:
    --picture P.dims.json (or a bundle's dims.json) is refused, untouched."""
    model, plan = tmp_path / "m.onnx", tmp_path / "p.json"
    onnx.save(_model(), model)
    assert invoke("plan", model, "-o", plan).exit_code == 0
    for target in ("p.dims.json", "dims.json"):
        r = invoke("explain", plan, "--picture", tmp_path / target)
        assert_user_error(r, "is the plan's dimensions")
        assert not (tmp_path / target).exists()


def test_a_static_plan_beside_a_stale_dims_file(tmp_path):
    """A static plan over a dynamic one removes its dimensions; a file at
    P.dims.json that is not a plan's dimensions is refused before any work,
    and P.json is not written."""
    model, plan = tmp_path / "m.onnx", tmp_path / "p.json"
    onnx.save(_model(), model)
    dims = tmp_path / "p.dims.json"
    dims.write_text("{}")
    r = invoke("plan", model, "-o", plan)
    assert_user_error(r, "p.dims.json: malformed dimensions", "choose another --output")
    assert not plan.exists() and dims.read_text() == "{}"
    dynamic = _model()
    dynamic.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "b"
    onnx.save(dynamic, model)
    r = invoke("plan", model, "-o", plan, "--dim", "b=1..4")  # a dynamic plan writes its own
    assert r.exit_code == 0, r.output
    assert json.loads(dims.read_text())["dims"][0]["name"] == "b"
    onnx.save(_model(), model)
    r = invoke("plan", model, "-o", plan)
    assert r.exit_code == 0, r.output
    assert plan.is_file() and not dims.exists()  # the static plan does not read as dynamic


@pytest.mark.parametrize(
    "command",
    [
        lambda b, m: ("explain", b / "plan.json", "--picture", b / "manifest.json"),
        lambda b, m: ("explain", b / "plan.json", "--picture", b / "report.md"),
        lambda b, m: ("bench", b, "--model", m, "--runs", 1, "--json", b / "plan.json"),
        lambda b, m: ("plan", m, "-o", b / "plan.json"),
        lambda b, m: ("run", b, "--input", f"x={b.parent / 'x.npy'}", "--output-dir", b),
    ],
    ids=["explain-manifest", "explain-report", "bench-json", "plan-into", "run-output-dir"],
)
def test_nothing_writes_into_a_bundle(built, tmp_path, command):
    """A bundle is replaced whole, by optimize, or not at all: a file written
    into it made load refuse it as modified. Each is one line, before any
    work, and the bundle is as it was."""
    model, out = _copy(built, tmp_path)
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    before = snapshot(out)
    assert_user_error(invoke(*command(out, model)), "refusing to write into a bundle")
    assert snapshot(out) == before


def test_records_export_never_overwrites_its_cache(tmp_path):
    cache = tmp_path / "measurements.sqlite"
    cache.write_bytes(b"SQLite format 3\x00" + bytes(100))
    r = invoke("records", "export", cache, "--cache", cache)
    assert_user_error(r, "is the measurement cache")
    assert cache.read_bytes().startswith(b"SQLite format 3")


# 3. SIGTERM and SIGHUP clean up like SIGINT and exit with 128 + the signal


@pytest.mark.parametrize(
    "signum, ranged",
    [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGTERM, True)],
    ids=["SIGTERM", "SIGHUP", "SIGTERM-range"],
)
def test_a_signal_during_optimize_leaves_nothing(tmp_path, signum, ranged):
    """Sent while the bundle is verified (a range's over its bindings):
    exit 128 + the signal, one line, nothing left, never a crash."""
    model = tmp_path / "m.onnx"
    m = _model()
    if ranged:
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "b"
    onnx.save(m, model)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from orchestrate import cli; cli.main()",
            "optimize",
            str(model),
            "-o",
            str(tmp_path / "out"),
            "--trials",
            "100",
            *(["--dim", "b=1..64"] if ranged else []),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    staged = None
    while staged is None and proc.poll() is None and time.monotonic() < deadline:
        # the staging folder, once its first complete write is there (verifying starts)
        staged = next((p for p in tmp_path.glob(".out.*") if (p / "manifest.json").exists()), None)
        time.sleep(0.01)
    assert staged is not None, proc.communicate()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1] == (
        f"orchestrate: error: interrupted by {signal.Signals(signum).name}"
    )
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


_STUBBORN = """
import sys, time
from orchestrate import cli
from orchestrate import api

MARK = sys.argv[1]


def stubborn(*args, **kwargs):
    open(MARK, "w").close()
    try:
        time.sleep(60)
    except BaseException:
        pass  # lost, as an extension module being imported may lose it
    time.sleep(60)

api.verify = stubborn
sys.argv[1:] = sys.argv[2:]
cli.main()
"""


def test_a_signal_that_some_code_swallows_still_ends_the_command(tmp_path):
    model, mark = tmp_path / "m.onnx", tmp_path / "verifying"
    onnx.save(_model(), model)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _STUBBORN,
            str(mark),
            "optimize",
            str(model),
            "-o",
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mark.exists(), proc.communicate()
    mark.unlink()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "orchestrate: error: interrupted by SIGTERM"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_an_interrupt_while_solving_leaves_no_solver_files(tmp_path, monkeypatch):
    """PuLP removes its model and solution files only when CBC returns."""
    import tempfile

    model = tmp_path / "m.onnx"
    onnx.save(_model(), model)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("TMPDIR", str(scratch))
    real_wait, solves = subprocess.Popen.wait, []

    def wait(self, *args, **kwargs):
        real_wait(self, *args, **kwargs)  # CBC done, its files written: now the signal
        solves.append(sorted(p.name for p in scratch.rglob("*")))
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess.Popen, "wait", wait)
    r = invoke("plan", model, "-o", tmp_path / "p.json")
    monkeypatch.undo()
    assert r.exit_code == 130 and "interrupted by SIGINT" in r.output, r.output
    assert solves and any(n.endswith("-pulp.mps") for n in solves[0]), solves
    left = [p.name for p in scratch.rglob("*") if "pulp" in p.name or "orchestrate" in p.name]
    assert left == []
    assert not (tmp_path / "p.json").exists()


# 4. run --output-dir: all outputs or none


@pytest.fixture(scope="module")
def two_outputs(tmp_path_factory):
    """A bundle whose outputs map to y.npy and z.npy, and an input file."""
    root = tmp_path_factory.mktemp("two")
    onnx.save(_model(), root / "m.onnx")
    assert invoke("optimize", root / "m.onnx", "-o", root / "b", "--trials", "0").exit_code == 0
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    np.save(root / "x.npy", x)
    return root / "b", root / "x.npy", x


def test_output_dir_writes_every_output_and_replaces_old_files(two_outputs, tmp_path):
    bundle, xfile, x = two_outputs
    out = tmp_path / "o"
    out.mkdir()
    np.save(out / "y.npy", np.zeros(1))
    (out / "keep.txt").write_text("mine")
    r = invoke("run", bundle, "--input", f"x={xfile}", "--output-dir", out)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt", "y.npy", "z.npy"]
    np.testing.assert_array_equal(np.load(out / "y.npy"), np.maximum(x, 0))
    np.testing.assert_array_equal(np.load(out / "z.npy"), -x)


def test_a_folder_at_an_output_file_name_writes_nothing(two_outputs, tmp_path):
    bundle, xfile, _ = two_outputs
    out = tmp_path / "o"
    (out / "z.npy").mkdir(parents=True)
    before = snapshot(tmp_path)
    r = invoke("run", bundle, "--input", f"x={xfile}", "--output-dir", out)
    assert_user_error(r, f"{out / 'z.npy'}", "output 'z'", "is a folder")
    assert snapshot(tmp_path) == before  # y.npy was not written either


def test_a_failed_move_puts_every_old_output_back(two_outputs, tmp_path, monkeypatch):
    bundle, xfile, _ = two_outputs
    out = tmp_path / "o"
    out.mkdir()
    np.save(out / "y.npy", np.full(3, 1.0))
    np.save(out / "z.npy", np.full(3, 2.0))
    before = snapshot(tmp_path)
    real = os.rename

    def rename(a, b):
        if Path(b) == out / "z.npy" and ".orchestrate-out." in str(a) and "new" in str(a):
            raise OSError(28, "No space left on device")
        return real(a, b)

    monkeypatch.setattr(os, "rename", rename)
    r = invoke("run", bundle, "--input", f"x={xfile}", "--output-dir", out)
    monkeypatch.undo()
    assert_user_error(r, "--output-dir", "No space left on device")
    assert snapshot(tmp_path) == before  # y.npy was moved in, then the old one put back


def test_a_new_output_folder_is_removed_when_writing_fails(two_outputs, tmp_path, monkeypatch):
    bundle, xfile, _ = two_outputs
    real = os.rename

    def rename(a, b):
        if Path(b).name == "z.npy":
            raise OSError(28, "No space left on device")
        return real(a, b)

    monkeypatch.setattr(os, "rename", rename)
    r = invoke("run", bundle, "--input", f"x={xfile}", "--output-dir", tmp_path / "new")
    monkeypatch.undo()
    assert_user_error(r, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_two_outputs_with_one_file_name_are_both_named(tmp_path):
    onnx.save(_model(outputs=("out:0", "out_0")), tmp_path / "m.onnx")
    r = invoke("optimize", tmp_path / "m.onnx", "-o", tmp_path / "b", "--trials", "0")
    assert r.exit_code == 0, r.output
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    r = invoke(
        "run", tmp_path / "b", "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "o"
    )
    assert_user_error(r, "'out:0'", "'out_0'", "out_0.npy")
    assert not (tmp_path / "o").exists()
    assert hidden(tmp_path) == []


def test_output_dir_never_overwrites_an_input_file(two_outputs, tmp_path):
    bundle, _, x = two_outputs
    np.save(tmp_path / "y.npy", x)
    data = (tmp_path / "y.npy").read_bytes()
    r = invoke("run", bundle, "--input", f"x={tmp_path / 'y.npy'}", "--output-dir", tmp_path)
    assert_user_error(r, "y.npy", "--input x", "refusing to overwrite it")
    assert (tmp_path / "y.npy").read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["y.npy"]


# 5. files and folders get the user's umask


@pytest.mark.parametrize("mask, folder, file", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_new_files_follow_the_umask(two_outputs, tmp_path, mask, folder, file):
    bundle, xfile, _ = two_outputs
    model = tmp_path / "m.onnx"
    onnx.save(_model(), model)
    old = os.umask(mask)
    try:
        results = [
            invoke("optimize", model, "-o", tmp_path / "b", "--trials", "0"),
            invoke("plan", model, "-o", tmp_path / "p.json"),
            invoke("decompose", model, "-o", tmp_path / "prim.onnx"),
            invoke("run", bundle, "--input", f"x={xfile}", "--output-dir", tmp_path / "o"),
        ]
    finally:
        os.umask(old)
    for r in results:
        assert r.exit_code == 0, r.output

    def mode(p: Path) -> int:
        return p.stat().st_mode & 0o777

    for d in (tmp_path / "b", tmp_path / "o"):
        assert mode(d) == folder, d
        for f in d.iterdir():
            assert mode(f) == file, f
    assert mode(tmp_path / "p.json") == file
    assert mode(tmp_path / "prim.onnx") == file


# 6. a symbolic link as -o


def test_a_linked_output_replaces_the_bundle_it_points_to(built, tmp_path):
    (tmp_path / "store").mkdir()
    model, real = _copy(built, tmp_path / "store")
    link = tmp_path / "latest"
    link.symlink_to(real)
    before = (real / "manifest.json").read_bytes()
    r = invoke("optimize", model, "-o", link, "--trials", "0")
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert (real / "manifest.json").read_bytes() != before
    assert hidden(tmp_path) == [] and hidden(tmp_path / "store") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "store"]


def test_a_dangling_link_as_output_is_refused(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(_model(), model)
    (tmp_path / "out").symlink_to(tmp_path / "gone")
    r = invoke("optimize", model, "-o", tmp_path / "out", "--trials", "0")
    assert_user_error(r, "is a symbolic link", "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out"]


# 7. output locations are checked before the work starts


_CHILD = """
import json, sys
from click.testing import CliRunner
from orchestrate import cli
for args in json.loads(sys.argv[1]):
    r = CliRunner().invoke(cli.main, args)
    print(json.dumps([r.exit_code, r.output]))
"""


def _drop_file_capabilities():
    """In the child before exec: root without CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH obeys file modes like any user."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP


def _invoke_obeying_modes(cases, probe: Path) -> list[tuple[int, str]]:
    """Run each CLI argument list where file modes apply: in this process,
    or, as root, in one child process that has lost root's file override."""
    cases = [[str(a) for a in args] for args in cases]
    if os.geteuid() != 0:
        return [(r.exit_code, r.output) for r in map(lambda a: invoke(*a), cases)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    check = subprocess.run(
        [sys.executable, "-c", f"import os; print(os.access({str(probe)!r}, os.W_OK))"],
        capture_output=True,
        text=True,
        preexec_fn=_drop_file_capabilities,
    )
    if check.stdout.strip() != "False":
        pytest.skip("root here cannot give up its file-permission override")
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(cases)],
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=_drop_file_capabilities,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    return [tuple(json.loads(line)) for line in p.stdout.splitlines()]


def test_an_unwritable_output_folder_is_refused_before_the_work(two_outputs, tmp_path):
    bundle, xfile, _ = two_outputs
    (tmp_path / "bad.onnx").write_text("not a model: reading it would fail first")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    cases = [
        ["optimize", tmp_path / "bad.onnx", "-o", locked / "out"],
        ["plan", tmp_path / "bad.onnx", "-o", locked / "p.json"],
        ["decompose", tmp_path / "bad.onnx", "-o", locked / "p.onnx"],
        ["run", bundle, "--input", f"x={xfile}", "--output-dir", locked / "o"],
        ["run", bundle, "--input", f"x={xfile}", "--output-dir", locked],
        ["explain", tmp_path / "bad.json", "--picture", locked / "g.svg"],
    ]
    try:
        results = _invoke_obeying_modes(cases, locked)
    finally:
        locked.chmod(0o755)
    assert len(results) == len(cases)
    for args, (code, output) in zip(cases, results):
        assert code == 2, (args, output)
        lines = [line for line in output.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in output, output
        assert f"folder {locked} is not writable" in output, output
    assert list(locked.iterdir()) == []


@pytest.mark.parametrize("where", ["missing", "file"])
def test_a_missing_folder_or_a_file_in_its_place_is_refused_before_the_work(tmp_path, where):
    (tmp_path / "bad.onnx").write_text("not a model: reading it would fail first")
    (tmp_path / "file").write_text("a file, not a folder")
    parent = tmp_path / where
    needle = "does not exist" if where == "missing" else "is not a folder"
    for args in (
        ["optimize", tmp_path / "bad.onnx", "-o", parent / "out"],
        ["plan", tmp_path / "bad.onnx", "-o", parent / "p.json"],
        ["decompose", tmp_path / "bad.onnx", "-o", parent / "p.onnx"],
        ["run", tmp_path / "nobundle", "--output-dir", parent / "o"],
        ["explain", tmp_path / "bad.json", "--picture", parent / "g.svg"],
    ):
        assert_user_error(invoke(*args), str(parent), needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx", "file"]


def test_a_device_file_is_never_replaced(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(_model(), model)
    r = invoke("plan", model, "-o", "/dev/null")
    assert_user_error(r, "/dev/null", "not a regular file")
    assert Path("/dev/null").is_char_device()


# 8. the same --input twice


def test_the_same_input_given_twice_is_refused(two_outputs, tmp_path):
    bundle, xfile, _ = two_outputs
    r = invoke(
        "run",
        bundle,
        "--input",
        f"x={xfile}",
        "--input",
        f"x={xfile}",
        "--output-dir",
        tmp_path / "o",
    )
    assert_user_error(r, "--input x", "given twice")
    assert not (tmp_path / "o").exists()


# 9. big-endian .npy inputs


def test_a_big_endian_input_gives_the_same_outputs(two_outputs, tmp_path):
    bundle, _, x = two_outputs
    np.save(tmp_path / "big.npy", x.astype(">f4"))
    assert np.load(tmp_path / "big.npy").dtype.str == ">f4"
    r = invoke(
        "run", bundle, "--input", f"x={tmp_path / 'big.npy'}", "--output-dir", tmp_path / "o"
    )
    assert r.exit_code == 0, r.output
    want = onnxrt.run(_model(), {"x": x})
    for name in ("y", "z"):
        got = np.load(tmp_path / "o" / f"{name}.npy")
        assert got.dtype == np.float32 and got.dtype.isnative
        np.testing.assert_array_equal(got, want[name])
