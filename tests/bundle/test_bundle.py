"""orchestrate optimize / run / verify: the bundle, its checks and bad input."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

import orchestrate
from orchestrate import api, cli
from orchestrate.errors import InputError
from orchestrate.frontend import onnxrt
from tests.util import elem


def _model(op: str = "Add") -> onnx.ModelProto:
    """y = tanh(x * w) <op> b, z = where(x > 0, x, 0.5 * x)"""
    x = helper.make_tensor_value_info("x", elem("float32"), [3, 17])
    inits = [
        numpy_helper.from_array(np.linspace(-1, 1, 17, dtype=np.float32), "w"),
        numpy_helper.from_array(np.full((3, 1), 0.25, np.float32), "b"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"]),
        helper.make_node("Tanh", ["xw"], ["t"]),
        helper.make_node(op, ["t", "b"], ["y"]),
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("Mul", ["x", "half"], ["hx"]),
        helper.make_node("Where", ["pos", "x", "hx"], ["z"]),
    ]
    outs = [onnx.ValueInfoProto(name="y"), onnx.ValueInfoProto(name="z")]
    g = helper.make_graph(nodes, "small", [x], outs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(m)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundle")
    src = root / "small.onnx"
    onnx.save(_model(), src)
    result = orchestrate.optimize(src, root / "small.orch", trials=2, reproducible=True)
    return src, result.path


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def test_bundle_layout_and_manifest(built):
    _, out = built
    assert sorted(p.name for p in out.iterdir()) == [
        "kernels.py",
        "manifest.json",
        "plan.json",
        "report.md",
        "weights.npz",
    ]
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["files"]) == {"plan.json", "kernels.py", "weights.npz", "report.md"}
    assert "PASSED" in (out / "report.md").read_text()
    src = (out / "kernels.py").read_text()
    assert "@triton.jit" in src and "def launch_" in src and "tl.load(" in src


def test_load_and_run_matches_onnxruntime(built):
    src, out = built
    x = np.random.default_rng(3).standard_normal((3, 17)).astype(np.float32)
    got = orchestrate.load(out).run({"x": x})
    want = onnxrt.run(_model(), {"x": x})
    for name in ("y", "z"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", ["transposed view", "fortran order", "every other row"])
def test_inputs_in_any_memory_layout(built, layout):
    """Kernels index their buffers densely, so a strided input (a transposed
    view, Fortran order, a slice with a step) must be laid out in C order
    before it reaches them, whatever numpy hands the runner."""
    src, out = built
    dense = np.random.default_rng(5).standard_normal((3, 17)).astype(np.float32)
    x = {
        "transposed view": np.ascontiguousarray(dense.T).T,
        "fortran order": np.asfortranarray(dense),
        "every other row": np.repeat(dense, 2, axis=0)[::2],
    }[layout]
    assert not x.flags.c_contiguous and np.array_equal(x, dense)
    got = orchestrate.load(out).run({"x": x})
    want = onnxrt.run(_model(), {"x": dense})
    for name in ("y", "z"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_nan_and_inf_propagate_like_onnxruntime(built):
    _, out = built
    x = np.random.default_rng(4).standard_normal((3, 17)).astype(np.float32)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    got = orchestrate.load(out).run({"x": x})
    want = onnxrt.run(_model(), {"x": x})
    for name in ("y", "z"):
        np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(want[name]))
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("victim", ["kernels.py", "plan.json", "weights.npz", "report.md"])
def test_modified_or_missing_file_is_refused(built, tmp_path, victim):
    import shutil

    _, out = built
    copy = tmp_path / "copy.orch"
    shutil.copytree(out, copy)
    with open(copy / victim, "ab") as f:
        f.write(b"\n# tampered\n")
    with pytest.raises(InputError, match=f"{victim} was modified"):
        orchestrate.load(copy)
    r = invoke("run", copy, "--input", "x=unused.npy")
    assert r.exit_code == 2 and f"{victim} was modified" in r.output and "Traceback" not in r.output
    (copy / victim).unlink()
    with pytest.raises(InputError, match=f"{victim} is missing"):
        orchestrate.load(copy)


def test_run_writes_outputs_and_rejects_bad_inputs(built, tmp_path):
    _, out = built
    x = np.random.default_rng(5).standard_normal((3, 17)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "x64.npy", x.astype(np.float64))
    np.save(tmp_path / "short.npy", x[:2])
    r = invoke("run", out, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["y.npy", "z.npy"]
    for bad, needle in [
        (f"x={tmp_path / 'x64.npy'}", "dtype float64, expected float32"),
        (f"x={tmp_path / 'short.npy'}", "shape [2, 17], expected [3, 17]"),
        (f"q={tmp_path / 'x.npy'}", "unknown input 'q'"),
        (f"x={tmp_path / 'nope.npy'}", "no such file"),
        ("x", "expected NAME=FILE.npy"),
    ]:
        r = invoke("run", out, "--input", bad, "--output-dir", tmp_path / "o2")
        assert r.exit_code == 2, (bad, r.output)
        assert needle in r.output and "Traceback" not in r.output
        assert not (tmp_path / "o2").exists()


def test_verify_tells_a_model_from_a_mutated_copy(built, tmp_path):
    src, out = built
    r = invoke("verify", out, "--model", src, "--trials", "2")
    assert r.exit_code == 0, r.output
    mutated = tmp_path / "mutated.onnx"
    onnx.save(_model("Sub"), mutated)
    r = invoke("verify", out, "--model", mutated, "--trials", "2")
    assert r.exit_code == 1, r.output
    assert "output 'y'" in r.output and "relative" in r.output


def test_failed_verification_leaves_nothing(tmp_path, monkeypatch):
    """A bundle whose kernels compute the wrong thing is never written."""
    from orchestrate.emit import codegen

    real = codegen.elementwise

    def wrong(n, args, dtypes, use=lambda h: None):
        expr = real(n, args, dtypes, use)
        return expr.replace(" + ", " - ") if n.op.value == "add" else expr

    monkeypatch.setattr(codegen, "elementwise", wrong)
    src = tmp_path / "small.onnx"
    onnx.save(_model(), src)
    with pytest.raises(api.VerificationError, match="output 'y'"):
        orchestrate.optimize(src, tmp_path / "bad.orch", trials=1)
    assert not (tmp_path / "bad.orch").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["small.onnx"]


def test_refuses_to_replace_a_folder_that_is_not_a_bundle(tmp_path):
    src = tmp_path / "small.onnx"
    onnx.save(_model(), src)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("do not delete")
    r = invoke("optimize", src, "-o", precious)
    assert r.exit_code == 2 and "not an orchestrate bundle" in r.output
    assert (precious / "thesis.tex").read_text() == "do not delete"


def test_bench_times_the_bundle_and_onnxruntime(built):
    src, out = built
    r = invoke("bench", out, "--model", src, "--runs", "2", "--warmup", "1", "--against", "ort-cpu")
    assert r.exit_code == 0, r.output
    assert "orchestrate (Triton interpreter)" in r.output and "onnxruntime (CPU)" in r.output
    assert "say nothing about GPU speed" in r.output


def test_a_bundle_of_an_older_format_is_refused(built, tmp_path):
    import shutil

    _, out = built
    old = tmp_path / "old.orch"
    shutil.copytree(out, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["format"] = "orchestrate-bundle/1"
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(orchestrate.InputError, match="older orchestrate"):
        orchestrate.load(old)
    r = invoke("run", old)
    assert r.exit_code == 2 and "optimize" in r.output


def test_planned_kernels_with_equal_specs_share_one_jitted_function(tmp_path):
    """A two-layer model: the layers' kernels share functions, and the
    launch table binds each planned kernel to its own tensors."""
    from orchestrate import bundle

    src = "examples/models/tiny_bert.onnx"
    result = orchestrate.optimize(src, tmp_path / "bert.orch", trials=1, reproducible=True)
    text = (result.path / "kernels.py").read_text()
    functions = text.count("@triton.jit\ndef ") - text.count("@triton.jit\ndef _")
    planned = [k for k in result.plan.kernels if not k.is_view]
    assert len(planned) > functions >= len({k.hash for k in planned})
    program = orchestrate.load(result.path).program
    assert len({launch.__name__ for launch, _ in program.launches.values()}) == functions
    constants = bundle.read(result.path).constants
    literals = {name for name, value in constants.items() if value.size == 1}
    for k in planned:
        _, tensors = program.launches[k.name]
        assert set(tensors) == (set(k.inputs) - literals) | set(k.outputs), k.name
