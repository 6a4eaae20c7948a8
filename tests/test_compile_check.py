"""Every generated kernel compiles for sm_90 with the real Triton compiler
(no GPU needed: Triton wheels ship ptxas).  Slow: compilation is minutes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import orchestrate
from examples import export_example
from tests.util import has_nvidia_backend

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_example_bundles_compile_for_hopper(tmp_path):
    if not has_nvidia_backend():
        pytest.skip("triton has no NVIDIA backend")
    bundles = []
    for name in ("bert", "resnet", "unet"):
        export_example(name, tmp_path / f"{name}.onnx", dynamo=False, opset=17, size="tiny")
        bundles.append(orchestrate.optimize(tmp_path / f"{name}.onnx", tmp_path / f"{name}.orch",
                                            trials=0).path)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "orchestrate.emit.compile_check", *map(str, bundles)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.count("compile for sm_90") == 3
