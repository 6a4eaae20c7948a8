"""orchestrate plan / explain from the command line."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import helper, numpy_helper

from orchestrate import cli
from tests.util import elem


def _model(gamma_input: bool = False) -> onnx.ModelProto:
    """layernorm(x) @ w + b, then GELU: one norm_matmul kernel after fission
    and planning, or (``gamma_input``: the norm's scale is an input, which the
    norm_matmul rule declines) a row-reduce and a matmul."""
    x = helper.make_tensor_value_info("x", elem("float32"), [8, 32])
    inputs = [x, helper.make_tensor_value_info("g", elem("float32"), [32])] if gamma_input else [x]
    inits = [] if gamma_input else [numpy_helper.from_array(np.ones(32, np.float32), "g")]
    inits += [
        numpy_helper.from_array(np.zeros(32, np.float32), "beta"),
        numpy_helper.from_array(np.eye(32, 48, dtype=np.float32), "w"),
        numpy_helper.from_array(np.full(48, 0.1, np.float32), "b"),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "beta"], ["ln"], axis=-1),
        helper.make_node("MatMul", ["ln", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["h"]),
        helper.make_node("Gelu", ["h"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "ln_mlp", inputs, [onnx.ValueInfoProto(name="y")], initializer=inits
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    return onnx.shape_inference.infer_shapes(m)


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def test_plan_then_explain(tmp_path):
    src, plan = tmp_path / "m.onnx", tmp_path / "m.plan.json"
    onnx.save(_model(gamma_input=True), src)
    r = invoke("plan", src, "-o", plan, "--device", "a100", "--reproducible")
    assert r.exit_code == 0, r.output
    p = json.loads(plan.read_text())
    assert p["device"] == "a100" and p["solver"]["status"] == "optimal"
    templates = [k["template"] for k in p["kernels"]]
    assert templates == ["row_reduce", "matmul"], templates
    for key in ("graph", "kernels", "summary", "baselines", "solver"):
        assert key in p
    again = tmp_path / "again.json"
    invoke("plan", src, "-o", again, "--device", "a100", "--reproducible")
    assert again.read_bytes() == plan.read_bytes()

    picture = tmp_path / "m.dot"
    r = invoke("explain", plan, "--rejected", "--picture", picture)
    assert r.exit_code == 0, r.output
    assert "k000_row_reduce" in r.output and "k001_matmul" in r.output
    assert "unfused" in r.output and "greedy" in r.output
    assert "k000_row_reduce -> k001_matmul via ln" in r.output
    text = picture.read_text()
    assert text.startswith("digraph") and len(re.findall(r"^\s*k\d+ \[", text, re.M)) == 2


def test_plan_folds_the_norm_into_the_matmul(tmp_path):
    src, plan = tmp_path / "m.onnx", tmp_path / "m.plan.json"
    onnx.save(_model(), src)
    assert invoke("plan", src, "-o", plan, "--device", "a100", "--reproducible").exit_code == 0
    assert [k["template"] for k in json.loads(plan.read_text())["kernels"]] == ["norm_matmul"]
    r = invoke("explain", plan)
    assert r.exit_code == 0, r.output
    assert re.search(r"^  norm_matmul .*k000_norm_matmul", r.output, re.M), r.output


def test_memory_budget_too_small_is_a_clear_error(tmp_path):
    src, plan = tmp_path / "m.onnx", tmp_path / "m.plan.json"
    onnx.save(_model(gamma_input=True), src)  # two kernels: the norm's output is written
    r = invoke("plan", src, "-o", plan, "--memory-budget", "0", "--no-recompute")
    assert r.exit_code == 2 and "--memory-budget 0" in r.output and "Traceback" not in r.output
    assert not plan.exists()
    least = re.search(r"every plan materialises at least (\d+) bytes", r.output).group(1)
    r = invoke("plan", src, "-o", plan, "--memory-budget", least, "--no-recompute")
    assert r.exit_code == 0, r.output
    assert json.loads(plan.read_text())["summary"]["materialized_bytes"] == int(least)


def test_bad_options_and_files(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    r = invoke("plan", src, "-o", tmp_path / "p.json", "--device", "tpu9")
    assert r.exit_code == 2 and "--device tpu9: unknown device" in r.output
    r = invoke("plan", src, "-o", tmp_path / "p.json", "--time-limit", "0")
    assert r.exit_code == 2 and "--time-limit" in r.output
    (tmp_path / "junk.json").write_text('{"hello": 1}')
    r = invoke("explain", tmp_path / "junk.json")
    assert r.exit_code == 2 and "not an orchestrate plan" in r.output
    (tmp_path / "broken.json").write_text("{")
    r = invoke("explain", tmp_path / "broken.json")
    assert r.exit_code == 2 and "not a JSON plan" in r.output
    assert not (tmp_path / "p.json").exists()


def test_a_plan_of_an_older_format_is_refused_with_the_reason(tmp_path):
    src, plan = tmp_path / "m.onnx", tmp_path / "m.plan.json"
    onnx.save(_model(), src)
    assert invoke("plan", src, "-o", plan, "--reproducible").exit_code == 0
    data = json.loads(plan.read_text())
    assert data["format"] == "orchestrate-plan/5"
    assert all({"num_warps", "num_stages"} <= set(k["config"]) for k in data["kernels"])
    data["format"] = "orchestrate-plan/1"
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    r = invoke("explain", old)
    assert r.exit_code == 2 and "older orchestrate" in r.output and "Traceback" not in r.output


def test_rules_lists_the_table():
    r = invoke("rules")
    assert r.exit_code == 0, r.output
    names = [line.split()[0] for line in r.output.splitlines() if " library " not in line]
    assert names == [
        "view",
        "scan",
        "pointwise",
        "row_reduce",
        "matmul",
        "conv",
        "window",
        "norm_merged_matmul",
        "merged_matmul",
        "attention",
        "norm_matmul",
        "low_rank",
    ]
