"""The scan template: CumSum as a cumulative sum over rows, its prologue on
the loads and its elementwise epilogue, against the float64 reference in the
interpreter; the planner's choice of it; its fit compiled for sm_90.

CumSum used to be a matmul by an N x N triangular constant: N**2 bytes of
weights and N times the work (KernelBench's cumsum programs were predicted
100-340x their measured time).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from orchestrate.cost.devices import get_device
from orchestrate.cost.roofline import cost
from orchestrate.ir import Op
from orchestrate.plan import pipeline
from orchestrate.plan.planner import PlanOptions
from orchestrate.templates.scan import config
from tests import graphs
from tests.compile_util import compile_sm90
from tests.emit_util import assert_matches_reference, one_kernel

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


@pytest.fixture(params=[False, True], ids=["single", "looped"])
def looped(request, monkeypatch):
    """Rows longer than 4 scanned in blocks of 4 (GPU) / 8 (interpreter)."""
    if request.param:
        monkeypatch.setattr(config, "SINGLE_PASS_ROW", 4)
        monkeypatch.setattr(config, "LOOP_BLOCK", 4)
        monkeypatch.setattr(config, "INTERPRET_LOOP_BLOCK", 8)
    return request.param


def cumsum(b, x, axis, exclusive=False, reverse=False):
    return b.emit(Op.CUMSUM, [x], axis=axis, exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape,axis", [((3, 21), 1), ((4, 19, 2), 1), ((17, 3), 0)])
def test_a_scan_matches_the_reference(looped, shape, axis, exclusive, reverse):
    g = graphs.build(lambda b, x: cumsum(b, x, axis, exclusive, reverse), [shape])
    planned = one_kernel(g)
    assert [s.template for s in planned.specs] == ["scan"]
    assert planned.specs[0].roles.looped == (looped and shape[axis] > 4)
    assert_matches_reference(g, planned, graphs.random_inputs(g, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["int32", "int64", "float16"])
@pytest.mark.parametrize("exclusive,reverse", [(False, False), (True, True)])
def test_a_scan_of_integers_and_halves(looped, dtype, exclusive, reverse):
    """Integers add exactly (wrapping as the dtype does); halves in fp32."""
    g = graphs.build(lambda b, x: cumsum(b, x, 1, exclusive, reverse), [(3, 23)], dtype=dtype)
    inputs = graphs.random_inputs(g, 1)
    assert_matches_reference(g, one_kernel(g), inputs, rtol=2e-3, atol=2e-2)


def test_position_ids_are_one_kernel(looped):
    """cumsum(mask) * mask - 1 (transformers' position ids from an attention
    mask): the cast a prologue, the multiply and subtract its epilogue."""

    def fn(b, mask):
        m = b.cast(mask, "int64")
        return b.sub(b.mul(cumsum(b, m, 1), m), 1)

    g = graphs.build(fn, [(2, 13)], dtype="int32")
    planned = one_kernel(g)
    assert [s.template for s in planned.specs] == ["scan"]
    x = (np.random.default_rng(2).random((2, 13)) > 0.3).astype(np.int32)
    assert_matches_reference(g, planned, {"x0": x})


def _cumsum_model(rows: int, n: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])
    axis = onnx.numpy_helper.from_array(np.array(1, np.int64), "axis")
    g = helper.make_graph([helper.make_node("CumSum", ["x", "axis"], ["y"])], "c", [x], [y], [axis])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_the_planner_runs_a_cumsum_as_a_stream():
    """32768 x 32768 fp32: one scan kernel whose predicted time is its 8.6 GB
    at the device's bandwidth, not a matmul by a 4 GB triangle."""
    graph = pipeline.fission_model(_cumsum_model(32768, 32768), None, "c.onnx")
    assert not graph.constants
    planned = pipeline.plan_graph(graph, PlanOptions(device="h100"))
    [spec] = planned.specs
    device = get_device("h100")
    c = cost(graph, spec, device)
    stream_us = 2 * 32768 * 32768 * 4 / (device.bandwidth_gbs * 1e3)
    assert spec.template == "scan" and stream_us < c.time_us < 1.5 * stream_us


def test_the_scan_fits_hopper_as_modelled(tmp_path):
    """Compiled for sm_90: no more shared memory than the fit model allows."""
    from orchestrate.templates import working_set

    g = graphs.build(lambda b, x: cumsum(b, x, 1), [(64, 4000)])
    planned = one_kernel(g)
    [(k, spec)] = list(zip(planned.plan.kernels, planned.specs))
    [(shared, spills)] = compile_sm90(tmp_path, [(g, spec, k.outputs, "scan_1", ["t"])])
    assert shared <= working_set(g, spec).shared_bytes and not spills
