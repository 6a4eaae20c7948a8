"""Sets a rule once accepted that emission could not print or computed wrong.

Found by trying every candidate of exported models (ConvNeXt, square
channels-first layer norms, transposed softmaxes) and random graphs.  Each
case either is refused by its rule, with a reason, or emits and matches the
reference: never an exception from emission.
"""

from __future__ import annotations

import numpy as np
import pytest

from orchestrate.ir import reference
from orchestrate.kernels.spec import KernelSpec, Rejection
from tests import graphs
from tests.emit_util import plan_from_sets, run_plan, spec_of

# masked-out lanes compute on neutral values (inf - inf) in the interpreter
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


def _layernorm(b, x, axis):
    m = b.mean(x, [axis])
    d = b.sub(x, m)
    return b.mul(d, b.recip(b.sqrt(b.add(b.mean(b.mul(d, d), [axis]), 1e-6))))


MOVED_ACROSS_ROWS = {
    # ConvNeXt's channels-first layer norm: NCHW -> NHWC, normalise C, back (C == H == W)
    "ln_round_trip": (
        lambda b, x: b.transpose(_layernorm(b, b.transpose(x, (0, 2, 3, 1)), 3), (0, 3, 1, 2)),
        [(1, 4, 4, 4)],
    ),
    "transpose_after_sum": (lambda b, x: b.transpose(b.sub(x, b.sum(x, [1])), (1, 0)), [(3, 3)]),
    "transpose_after_softmax": (
        lambda b, x: b.transpose(graphs.softmax(b, x, 1), (0, 2, 1)),
        [(2, 4, 4)],
    ),
    "flip_after_ln": (lambda b, x: b.slice_axis(_layernorm(b, x, 1), 0, 2, -4, -1), [(3, 4)]),
    "gather_after_max": (
        lambda b, x: b.gather(b.sub(x, b.reduce_max(x, [1])), b.constant(np.array([2, 0, 1])), 0),
        [(3, 4)],
    ),
    "second_reduction_through_transpose": (
        lambda b, x: b.sum(b.transpose(b.sub(x, b.mean(x, [1])), (1, 0)), [1]),
        [(3, 3)],
    ),
}


@pytest.mark.parametrize("case", list(MOVED_ACROSS_ROWS))
def test_row_results_moved_across_rows_are_refused_and_the_graph_still_runs(case):
    fn, shapes = MOVED_ACROSS_ROWS[case]
    g = graphs.build(fn, shapes)
    names = [n.name for n in g.nodes]
    r = spec_of(g, names)
    assert isinstance(r, Rejection) and "across rows" in r.reason, r
    # the planner's kernels for the same graph run it correctly
    from orchestrate.plan.planner import PlanOptions, plan

    _check(g, plan(g, PlanOptions(reproducible=True)))


def test_a_prologue_transpose_is_still_fused():
    """Moving the input before the reduction is fine: ConvNeXt's NCHW -> NHWC
    transpose runs inside the layer norm kernel."""
    g = graphs.build(lambda b, x: _layernorm(b, b.transpose(x, (0, 2, 3, 1)), 3), [(1, 4, 4, 4)])
    names = [n.name for n in g.nodes]
    assert isinstance(spec_of(g, names), KernelSpec)
    _check(g, plan_from_sets(g, [names]))


def _attention(b, q, k, v):
    s = b.mul(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), 0.25)
    return b.matmul(graphs.softmax(b, s), v)


SCALAR_MASKS = {  # a pad or concat on an axis indexed by one scalar per program
    "matmul_concat_batch": (lambda b, x, w: b.matmul(b.concat([x, x], 0), w), [(1, 3, 3), (3, 3)]),
    "matmul_pad_batch": (
        lambda b, x, w: b.matmul(b.pad(x, [1, 0, 0, 0, 0, 0]), w),
        [(2, 3, 3), (3, 3)],
    ),
    "matmul_concat_b_batch": (
        lambda b, w, x: b.matmul(w, b.concat([x, x], 0)),
        [(3, 3), (1, 3, 3)],
    ),
    "attention_concat_heads": (
        lambda b, q, k, v: _attention(b, b.concat([q, q], 1), k, v),
        [(1, 1, 16, 16), (1, 2, 16, 16), (1, 2, 16, 16)],
    ),
    "pointwise_slice_of_pad": (
        lambda b, x: b.slice_axis(b.pad(x, [0, 1, 0, 0, 0, 0]), 1, 2, 3),
        [(2, 3, 4)],
    ),
    "window_pool_of_padded_channel": (
        lambda b, x: b.pool(
            b.slice_axis(b.pad(x, [0, 1, 0, 0, 0, 0, 0, 0]), 1, 0, 1),
            "max",
            kernel=(2, 2),
            strides=(1, 1),
            pads=(0, 0, 0, 0),
            dilations=(1, 1),
        ),
        [(1, 2, 4, 4)],
    ),
}


@pytest.mark.parametrize("case", list(SCALAR_MASKS))
def test_masks_on_axes_indexed_by_one_scalar(case):
    fn, shapes = SCALAR_MASKS[case]
    g = graphs.build(fn, shapes)
    names = [n.name for n in g.nodes]
    assert isinstance(spec_of(g, names), KernelSpec)
    _check(g, plan_from_sets(g, [names]))


def _check(g, planned):
    rng = np.random.default_rng(0)
    inputs = {i.name: rng.standard_normal(i.type.shape).astype(i.type.dtype) for i in g.inputs}
    got, _ = run_plan(g, planned, inputs)
    want = reference.run(g, inputs, float64=True)
    for o in g.outputs:
        np.testing.assert_allclose(got[o], want[o], rtol=1e-4, atol=1e-5, err_msg=o)
