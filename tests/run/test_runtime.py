"""The runtime: buffers by liveness, views alias, interpreter without a GPU."""

from __future__ import annotations

import numpy as np

from tests import graphs
from tests.emit_util import plan_from_sets, run_plan


def _chain(b, x):
    t = x
    for _ in range(5):
        t = b.tanh(b.add(t, 1.0))
    return b.reshape(t, (x.shape[1], x.shape[0]))


def test_chain_of_kernels_with_a_view_output_is_correct():
    g = graphs.build(_chain, [(6, 10)])
    names = [n.name for n in g.nodes]
    # one kernel per (add, tanh) pair, then the reshape as a view
    sets = [names[i : i + 2] for i in range(0, 10, 2)] + [names[10:]]
    plan = plan_from_sets(g, sets)
    assert [k.template for k in plan.plan.kernels] == ["pointwise"] * 5 + ["view"]
    out, _ = run_plan(g, plan, graphs.random_inputs(g))
    from orchestrate.ir import reference

    want = reference.run(g, graphs.random_inputs(g))
    np.testing.assert_allclose(out[g.outputs[0]], want[g.outputs[0]], rtol=1e-6)


def test_liveness_schedule():
    """Five same-sized tensors written in a chain, each read only by the next
    kernel: two buffers serve them all, and the last (whose view is the
    output) is never handed back to the pool."""
    from orchestrate.emit import emit
    from orchestrate.run.runtime import Program, load_kernels

    g = graphs.build(_chain, [(6, 10)])
    names = [n.name for n in g.nodes]
    plan = plan_from_sets(g, [names[i : i + 2] for i in range(0, 10, 2)] + [names[10:]])
    program = Program(plan, g, load_kernels(emit(g, plan), True), interpret=True)
    free = {i: sorted(v) for i, v in program.free_after.items()}
    written = [k.outputs[0] for k in plan.plan.kernels[:5]]
    # each intermediate goes back to the pool right after the kernel that reads it
    assert free == {i + 1: [written[i]] for i in range(4)}
    program.run(graphs.random_inputs(g))
    assert program.stats == {"allocated": 2, "reused": 3}


def test_triton_imported_too_early_is_a_clear_error(tmp_path):
    """Triton fixes interpreter-or-compiler when first imported; a program that
    imported it before orchestrate could switch the interpreter on gets told
    what to do, not a traceback from inside a kernel."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import triton.language\n"
        "from orchestrate.errors import OrchestrateError\n"
        "from orchestrate.run.runtime import load_kernels\n"
        "try:\n"
        "    load_kernels('KERNELS = {}', True)\n"
        "except OrchestrateError as e:\n"
        "    print('refused:', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert "refused:" in out.stdout and "TRITON_INTERPRET=1" in out.stdout, out.stderr


def test_threads_running_one_program_each_get_their_own_answer():
    """Many threads calling run on one Program (its buffers are pooled):
    every answer is the reference's for that thread's own inputs.  Five runs
    a thread are plenty: without the lock nearly every run is wrong."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrate.emit import emit
    from orchestrate.ir import reference
    from orchestrate.run.runtime import Program, load_kernels

    g = graphs.build(graphs.mlp, [(9, 16), (16, 32), (32,), (32, 16)])
    planned = plan_from_sets(g, [[n.name] for n in g.nodes])
    program = Program(planned, g, load_kernels(emit(g, planned), True), interpret=True)
    feeds = [graphs.random_inputs(g, seed) for seed in range(16)]
    want = [reference.run(g, f)[g.outputs[0]] for f in feeds]

    def runs(k: int) -> int:  # 16 threads x 5 runs each
        wrong = 0
        for _ in range(5):
            got = program.run(feeds[k])[g.outputs[0]]
            wrong += not np.allclose(got, want[k], rtol=1e-5, atol=1e-5)
        return wrong

    with ThreadPoolExecutor(16) as pool:
        assert sum(pool.map(runs, range(16))) == 0


def test_running_a_bundle_leaves_the_environment_as_it_was(tmp_path):
    """In a fresh process without TRITON_INTERPRET (the test session sets
    it): a bundle loaded and run twice without a GPU gives the right answer,
    a second optimize in the same process runs its kernels too, and neither
    the process's environment nor a child's has the variable."""
    import os
    import subprocess
    import sys

    import onnx
    from onnx import helper

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 32])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 32])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx"
    )
    script = f"""
import os, subprocess, sys
import numpy as np
from orchestrate import api
bundle = api.optimize({str(tmp_path / "m.onnx")!r}, {str(tmp_path / "m.orch")!r}, trials=0)
loaded = api.load(bundle.path)
x = np.linspace(-1, 1, 128, dtype=np.float32).reshape(4, 32)
for _ in range(2):
    assert np.array_equal(loaded.run({{"x": x}})["y"], np.maximum(x, 0))
# a second bundle's kernels in the same process: triton, imported by orchestrate
# under the interpreter, is still the interpreter's
api.optimize({str(tmp_path / "m.onnx")!r}, {str(tmp_path / "m2.orch")!r}, trials=1)
assert "TRITON_INTERPRET" not in os.environ, os.environ["TRITON_INTERPRET"]
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('TRITON_INTERPRET'))"],
                       capture_output=True, text=True, check=True)
assert child.stdout.strip() == "None", child.stdout
print("clean")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "clean" in r.stdout, r.stderr[-2000:]
