"""Loading and running a bundle needs no PuLP: the reference GPU machine has
none, and the runtime is all a user of a bundle should need."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

import orchestrate

ROOT = Path(__file__).resolve().parents[2]


def test_a_bundle_loads_and_runs_with_pulp_unimportable(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Exp", ["r"], ["y"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.save(model, tmp_path / "m.onnx")
    orchestrate.optimize(tmp_path / "m.onnx", tmp_path / "m.orch", trials=0)
    script = (
        "import sys; sys.modules['pulp'] = None\n"  # `import pulp` now raises ImportError
        "import numpy as np, orchestrate\n"
        f"b = orchestrate.load({str(tmp_path / 'm.orch')!r})\n"
        "y = b.run({'x': np.full((2, 8), 0.5, np.float32)})['y']\n"
        "assert 'pulp' not in {m for m in sys.modules if sys.modules[m] is not None}\n"
        "print(float(y[0, 0]))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert np.isclose(float(r.stdout.split()[-1]), np.exp(0.5), rtol=1e-5)
