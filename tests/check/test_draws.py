"""Verification inputs a user bounds (--input-range) or gives (--input)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

from orchestrate import cli
from orchestrate.check.draws import Draws, check_draws, parse_range
from orchestrate.check.verify import random_inputs
from orchestrate.decompose import fission
from orchestrate.errors import InputError
from orchestrate.frontend import prepare


def log_model() -> onnx.ModelProto:
    """y = log(x) + k[i]: real only for positive x; i indexes a table of 4."""
    table = helper.make_tensor("k", onnx.TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    nodes = [
        helper.make_node("Log", ["x"], ["lx"]),
        helper.make_node("Gather", ["k", "i"], ["ki"]),
        helper.make_node("Add", ["lx", "ki"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 5]),
            helper.make_tensor_value_info("i", onnx.TensorProto.INT64, [5]),
        ],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 5])],
        initializer=[table],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def graph():
    return fission(prepare(log_model()))


def test_a_range_bounds_the_draws_and_a_given_array_is_used_as_it_is(graph):
    given = np.arange(15, dtype=np.float32).reshape(3, 5) + 1
    for seed in range(5):
        feeds = random_inputs(graph, seed, Draws({"i": (1.0, 2.0)}, {"x": given}))
        assert set(np.unique(feeds["i"])) <= {1, 2}
        assert feeds["i"].dtype == np.int64
        np.testing.assert_array_equal(feeds["x"], given)
    floats = random_inputs(graph, 0, Draws({"x": (0.5, 0.75)}))["x"]
    assert floats.min() >= 0.5 and floats.max() < 0.75
    # without draws, an index stays within the table it indexes
    assert random_inputs(graph, 0)["i"].max() < 4


@pytest.mark.parametrize(
    "draws, message",
    [
        (Draws({"z": (0, 1)}), "--input-range z: .* has no input 'z'"),
        (Draws({"i": (0, 1.5)}), "--input-range i: input 'i' is int64: give integer bounds"),
        (
            Draws(given={"x": np.zeros((3, 4), np.float32)}),
            r"--input x: float32\[3, 4\] given, the model takes float32\[3, 5\]",
        ),
        (Draws(given={"x": np.zeros((3, 5), np.float64)}), r"--input x: float64\[3, 5\] given"),
    ],
)
def test_bad_draws_name_the_flag(graph, draws, message):
    with pytest.raises(InputError, match=message):
        check_draws(draws, graph, "m.onnx")


@pytest.mark.parametrize("text", ["x", "x=1", "x=a..b", "x=2..1", "x=0..inf"])
def test_bad_range_text(text):
    with pytest.raises(InputError, match="--input-range"):
        parse_range(text)


def test_the_cli_verifies_with_a_range_and_with_a_file(tmp_path):
    src = tmp_path / "log.onnx"
    onnx.save(log_model(), src)
    np.save(tmp_path / "x.npy", np.full((3, 5), 2.0, np.float32))
    out = tmp_path / "log.orch"
    runner = CliRunner()
    r = runner.invoke(
        cli.main, ["optimize", str(src), "-o", str(out), "--input-range", "x=0.1..10"]
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(
        cli.main,
        [
            "verify",
            str(out),
            "--model",
            str(src),
            "--input",
            f"x={tmp_path / 'x.npy'}",
            "--input-range",
            "i=0..3",
        ],
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(
        cli.main, ["verify", str(out), "--model", str(src), "--input-range", "i=0..9"]
    )
    assert r.exit_code == 2, r.output  # index 9 of a table of 4: refused before the run
