"""The Python API: ``orchestrate.decompose`` callable after any import, and
every argument of ``decompose``, ``optimize``, ``verify_bundle`` and ``load``
checked up front, with an InputError that names the argument."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import orchestrate
from orchestrate import api
from orchestrate.errors import InputError
from orchestrate.plan.candidates import Limits
from orchestrate.plan.planner import PlanOptionError, PlanOptions
from tests.util import elem

ROOT = Path(__file__).resolve().parents[1]


def _relu(dims=("N", 8)) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", elem("float32"), list(dims))
    y = helper.make_tensor_value_info("y", elem("float32"), list(dims))
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "m", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture
def model_file(tmp_path) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(_relu(), path)
    return path


def test_decompose_stays_callable_after_any_import(tmp_path, model_file):
    """A fresh interpreter: decompose twice, after ``optimize`` (which imports
    the subpackage), and after ``import orchestrate.decompose`` itself."""
    script = textwrap.dedent(
        """
        import inspect, sys
        import onnx, orchestrate
        model = onnx.load(sys.argv[1])
        shapes = {"x": (2, 8)}
        names = lambda p: [o.name for o in p.graph.output]
        first = orchestrate.decompose(model, shapes)
        second = orchestrate.decompose(model, shapes=shapes)
        orchestrate.optimize(sys.argv[1], sys.argv[2], shapes=shapes, trials=0)
        third = orchestrate.decompose(model, shapes)
        import orchestrate.decompose
        fourth = orchestrate.decompose(model, shapes)
        from orchestrate import decompose
        fifth = decompose(model, shapes)
        assert first == second == third == fourth == fifth, "decompositions differ"
        assert names(fifth) == ["y"]
        params = list(inspect.signature(orchestrate.decompose).parameters)
        assert params == ["model", "shapes"], params
        assert "primitive" in orchestrate.decompose.__call__.__doc__
        print("ok")
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run(
        [sys.executable, "-c", script, str(model_file), str(tmp_path / "m.orch")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("ok")


def test_numpy_integer_shapes_are_integers(tmp_path, model_file):
    """``shapes={"x": (np.int64(3), 8)}`` once failed after planning (the
    manifest could not hold numpy integers): any integer is accepted and
    written as a plain int."""
    out = tmp_path / "m.orch"
    result = orchestrate.optimize(
        model_file, out, shapes={"x": (np.int64(3), np.int32(8))}, trials=1
    )
    assert result.report is not None and result.report.ok
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shapes"] == {"x": [3, 8]}
    prim = orchestrate.decompose(onnx.load(model_file), {"x": np.array([3, 8])})
    assert [d.dim_value for d in prim.graph.input[0].type.tensor_type.shape.dim] == [3, 8]


@pytest.mark.parametrize("form", ["2x8", "2,8", (2, 8)])
def test_api_shapes_take_the_clis_strings(tmp_path, model_file, form):
    """``shapes={"x": "2x8"}`` is the CLI's ``--shape x=2x8``, as a range
    string ``"1..4x8"`` already was."""
    result = orchestrate.optimize(model_file, tmp_path / "m.orch", shapes={"x": form}, trials=1)
    assert result.report.ok
    manifest = json.loads((tmp_path / "m.orch" / "manifest.json").read_text())
    assert manifest["shapes"] == {"x": [2, 8]}
    prim = orchestrate.decompose(onnx.load(model_file), {"x": form})
    assert [d.dim_value for d in prim.graph.input[0].type.tensor_type.shape.dim] == [2, 8]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"shapes": {"x": "1..4x1..8"}}, "shapes['x']: axis 1 of input 'x' is fixed at 8"),
        ({"shapes": {"q": "1..4x8"}}, "shapes['q']: the model has no input 'q'"),
        ({"dims": {"zz": "1..4"}}, "dims['zz']: the model has no dimension 'zz'"),
    ],
)
def test_api_range_errors_name_the_apis_arguments(tmp_path, model_file, kwargs, needle):
    """A range given through the API is refused naming ``shapes``/``dims``,
    not the CLI's ``--shape``/``--dim``."""
    with pytest.raises(InputError) as e:
        orchestrate.optimize(model_file, tmp_path / "m.orch", trials=0, **kwargs)
    assert needle in str(e.value) and "--" not in str(e.value), str(e.value)


NAN = float("nan")


@pytest.mark.parametrize(
    "kwargs, needles",
    [
        ({"trials": -3}, ["trials=-3", "integer >= 0"]),
        ({"trials": True}, ["trials=True"]),
        ({"trials": 1.5}, ["trials=1.5"]),
        ({"rtol": -1e-3}, ["rtol=-0.001", ">= 0"]),
        ({"rtol": NAN}, ["rtol=nan"]),
        ({"atol": math.inf}, ["atol=inf"]),
        ({"atol": "1e-3"}, ["atol='1e-3'"]),
        ({"shapes": {"x": (2.5, 8)}}, ["shapes['x']", "dimension 0 is 2.5"]),
        ({"shapes": {"x": (-2, 8)}}, ["shapes['x']", "dimension 0 is -2", ">= 0"]),
        ({"shapes": {"x": (-2, 8)}}, ["shapes['x']", "dimension 0 is -2"]),
        ({"shapes": {"x": (True, 8)}}, ["shapes['x']", "dimension 0 is True"]),
        ({"shapes": {"x": "2xq"}}, ["shapes['x']", "'2xq' is not dimensions", "'1x128'"]),
        ({"shapes": {"x": b"2x8"}}, ["shapes['x']", "tuple of dimensions", "bytes"]),
        ({"shapes": {1: (2, 8)}}, ["shapes", "strings", "1"]),
        ({"shapes": [("x", (2, 8))]}, ["shapes", "mapping", "list"]),
        ({"shapes": {"x": (10**8, 10**8)}}, ["shapes['x']", "10,000,000,000,000,000 elements"]),
        ({"shapes": {"q": (2, 8)}}, ["shapes['q']", "no input 'q'", "x"]),
        ({"shapes": {"x": (2, 8, 1)}}, ["shapes['x']", "rank 2, not 3"]),
        ({"shapes": None}, ["'x' has dimension 'N'", "shapes={'x': (N, 8)}"]),
        ({"devise": "h100"}, ["devise: no such argument", "device, memory_budget"]),
        ({"options": "fast"}, ["options: expected", "PlanOptions", "str"]),
        ({"options": PlanOptions(), "device": "h100"}, ["options and device", "not both"]),
        ({"progress": 5}, ["progress: expected a function"]),
        ({"device": "tpu9"}, ["device='tpu9'", "unknown device", "h100"]),
        ({"device": 7}, ["device=7", "expected a device name"]),
        ({"time_limit": NAN}, ["time_limit=nan", "finite"]),
        ({"time_limit": math.inf}, ["time_limit=inf"]),
        ({"time_limit": -1}, ["time_limit=-1"]),
        ({"time_limit": "60"}, ["time_limit='60'"]),
        ({"memory_budget": -1}, ["memory_budget=-1", "integer >= 0"]),
        ({"memory_budget": 1.5}, ["memory_budget=1.5"]),
        ({"memory_budget": True}, ["memory_budget=True"]),
        ({"tf32": "yes"}, ["tf32='yes'", "True or False"]),
        ({"recompute": None}, ["recompute=None"]),
        ({"limits": {"max_nodes": 4}}, ["limits=", "Limits"]),
        ({"limits": Limits(max_nodes=0)}, ["limits.max_nodes=0", ">= 1"]),
        ({"limits": Limits(max_nodes=65)}, ["limits.max_nodes=65", "<= 64"]),
    ],
)
def test_bad_optimize_arguments_are_named(tmp_path, model_file, kwargs, needles):
    kwargs = {"shapes": {"x": (2, 8)}, **kwargs}
    out = tmp_path / "m.orch"
    with pytest.raises(InputError) as e:
        orchestrate.optimize(model_file, out, **kwargs)
    message = str(e.value)
    assert "\n" not in message
    for n in needles:
        assert n in message, message
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize(
    "model_path, out_dir, needle",
    [
        (123, "out", "model_path: expected a path"),
        ("m.onnx", None, "out_dir: expected a path"),
        ("", "out", "model_path: an empty path"),
        ("m.onnx", "", "out_dir: an empty path"),
    ],
)
def test_bad_paths_are_named(tmp_path, model_path, out_dir, needle):
    with pytest.raises(InputError, match=needle):
        orchestrate.optimize(model_path, out_dir, shapes={"x": (2, 8)})


def test_plan_options_refuse_bad_fields_by_name():
    """PlanOptions checks itself, so the CLI and the API refuse the same values."""
    with pytest.raises(PlanOptionError, match=r"time_limit=nan") as e:
        PlanOptions(time_limit=NAN)
    assert (e.value.field, e.value.problem) == (
        "time_limit",
        "must be a finite number of seconds > 0",
    )
    assert PlanOptions(time_limit=np.float32(2), memory_budget=np.int64(5)).memory_budget == 5
    assert type(PlanOptions(memory_budget=np.int64(5)).memory_budget) is int
    assert PlanOptions(time_limit=None, device="H100").time_limit is None


@pytest.mark.parametrize(
    "model, shapes, needle",
    [
        ("m.onnx", None, "model: expected an onnx.ModelProto, got str"),
        (None, None, "model: expected an onnx.ModelProto, got NoneType"),
        ("relu", {"x": (-1, 8)}, r"shapes\['x'\]: dimension 0 is -1"),
        ("relu", {"q": (1, 8)}, r"shapes\['q'\]: the model has no input 'q'"),
        ("relu", (2, 8), "shapes: expected a mapping"),
        ("relu", None, r"pass shapes=\{'x': \(N, 8\)\}"),
    ],
)
def test_bad_decompose_arguments_are_named(model, shapes, needle):
    if model == "relu":
        model = _relu()
    with pytest.raises(InputError, match=needle):
        orchestrate.decompose(model, shapes)


def test_decompose_checks_the_model():
    m = _relu((2, 8))
    m.graph.node[0].input[0] = "nowhere"
    with pytest.raises(InputError, match="model: invalid ONNX model"):
        orchestrate.decompose(m)


def test_load_and_verify_bundle_check_their_arguments(tmp_path, model_file):
    missing = tmp_path / "none.orch"
    with pytest.raises(InputError, match=r"interpret='yes': expected True, False or None"):
        orchestrate.load(missing, interpret="yes")
    with pytest.raises(InputError, match="interpret=1"):
        api.load(missing, interpret=1)
    with pytest.raises(InputError, match="out_dir: expected a path"):
        orchestrate.load(3.5)
    for kwargs, needle in (
        ({"trials": 0}, "trials=0: must be an integer >= 1"),
        ({"trials": "3"}, "trials='3'"),
        ({"rtol": NAN}, "rtol=nan"),
        ({"atol": -1}, "atol=-1"),
        ({"shapes": {"x": (2, -1)}}, r"shapes\['x'\]: dimension 1 is -1"),
    ):
        with pytest.raises(InputError, match=needle):
            api.verify_bundle(missing, model_file, **kwargs)
    with pytest.raises(InputError, match="model_path: expected a path"):
        api.verify_bundle(missing, object())
