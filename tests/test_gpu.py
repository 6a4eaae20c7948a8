"""The `gpu` tier (make test-gpu): compiled Triton kernels and CUDA graphs.

Skipped on machines without CUDA (tests/conftest.py).  Each test compiles
real kernels, so they cover what the interpreter cannot: dtypes and layouts
the compiler checks, and the CUDA-graph replay of a whole plan.
"""

from __future__ import annotations

import numpy as np
import pytest

import orchestrate
from orchestrate import onnxrt, pipeline
from tests import graphs

pytestmark = pytest.mark.gpu


def _run_compiled(graph, plan, inputs):
    from orchestrate.emit import emit
    from orchestrate.runtime import Program, load_kernels

    program = Program(plan, graph, load_kernels(emit(graph, plan), False),
                      interpret=False, cuda_graph=False)  # fmt: skip
    return program.run(inputs)


@pytest.mark.parametrize(
    "fn, shapes, dtype, tol",
    [
        (graphs.softmax, [(1000, 4099)], "float32", 1e-5),
        (graphs.layernorm, [(257, 768), (768,), (768,)], "float32", 1e-5),
        (graphs.mlp, [(129, 96), (96, 384), (384,), (384, 96)], "float32", 1e-4),
        (graphs.mlp, [(129, 96), (96, 384), (384,), (384, 96)], "float16", 2e-2),
        (graphs.exp_into_two_reductions, [(333, 517)], "float32", 1e-5),
    ],
)
def test_planned_kernels_compile_and_match_reference(fn, shapes, dtype, tol):
    from orchestrate import reference
    from orchestrate.planner import PlanOptions, plan

    g = graphs.build(fn, shapes, dtype=dtype)
    p = plan(g, PlanOptions(reproducible=True))
    inputs = {k: (v * 0.5).astype(dtype) for k, v in graphs.random_inputs(g).items()}
    got = _run_compiled(g, p, inputs)
    want = reference.run(g, inputs, float64=True)
    for o in g.outputs:
        scale = float(np.abs(want[o]).max())
        np.testing.assert_allclose(got[o].astype(np.float64), want[o], rtol=tol, atol=tol * scale)


def test_conv_and_pool_compile():
    from orchestrate import reference
    from tests.emit_util import plan_from_sets

    def net(b, x, w):
        c = b.relu(b.conv(x, w, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1))
        return b.pool(c, "max", kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), dilations=(1, 1))

    g = graphs.build(net, [(2, 16, 33, 35), (32, 16, 3, 3)])
    names = [n.name for n in g.nodes]
    p = plan_from_sets(g, [names[:-1], names[-1:]])
    inputs = graphs.random_inputs(g)
    got = _run_compiled(g, p, inputs)
    want = reference.run(g, inputs, float64=True)
    np.testing.assert_allclose(got[g.outputs[0]], want[g.outputs[0]], rtol=1e-4, atol=1e-4)


def test_bundle_on_gpu_replays_a_cuda_graph(tmp_path):
    """Run 1 compiles, run 2 captures the plan in a CUDA graph, run 3 replays
    it with new inputs: all three match onnxruntime."""
    src = "examples/models/tiny_bert.onnx"
    out = orchestrate.optimize(src, tmp_path / "bert.orch", trials=1).path
    model = orchestrate.load(out)
    assert not model.interpret
    onnx_model = pipeline.load(src)
    rng = np.random.default_rng(0)
    for _ in range(3):
        feeds = {
            "input_ids": rng.integers(0, 1000, size=(1, 16)).astype(np.int64),
            "attention_mask": np.ones((1, 16), np.int64),
        }
        got = model.run(feeds)
        want = onnxrt.run(onnx_model, feeds)
        for name, w in want.items():
            np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4 * np.abs(w).max())
    assert model.program._graph is not None, "the third run replayed a captured CUDA graph"
