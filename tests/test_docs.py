"""The README states facts the code must keep true."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from orchestrate import cli
from orchestrate.cost.devices import DEVICES
from orchestrate.decompose import SUPPORTED_OPS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_supported_op_list_matches_the_decomposition_table():
    block = re.search(r"<!-- supported-ops -->\n(.*?)\n<!-- /supported-ops -->", README, re.S)
    listed = [op.strip() for op in block.group(1).split(",")]
    assert listed == list(SUPPORTED_OPS)
    assert f"Supported ONNX ops ({len(SUPPORTED_OPS)};" in README


def test_every_command_and_device_is_documented():
    for name in cli.main.commands:
        assert f"orchestrate {name}" in README, name
    for device in DEVICES:
        assert device in README, device


def test_documented_options_exist():
    runner = CliRunner()
    for command, options in {
        "plan": [
            "--device",
            "--memory-budget",
            "--time-limit",
            "--no-recompute",
            "--tf32",
            "--max-kernel-nodes",
            "--reproducible",
            "--shape",
        ],
        "optimize": ["--trials", "--rtol", "--atol", "--dtype"],
        "inspect": ["--dtype"],
        "explain": ["--picture", "--roofline", "--rejected", "--limit"],
        "run": ["--input", "--output-dir"],
        "verify": ["--model", "--trials"],
    }.items():
        out = runner.invoke(cli.main, [command, "--help"]).output
        for opt in options:
            assert opt in out, (command, opt)
            assert opt in README, opt
