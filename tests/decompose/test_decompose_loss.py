"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from tests.util import check_decomposition, node_model

RNG = np.random.default_rng(0)


def case(extra_dims, with_weight, ignore):
    n, c = 3, 5
    x = RNG.standard_normal((n, c, *extra_dims)).astype(np.float32)
    target = RNG.integers(0, c, size=(n, *extra_dims)).astype(np.int64)
    if ignore is not None:
        target.flat[::3] = ignore
    consts = {"w": RNG.uniform(0.5, 2.0, size=c).astype(np.float32)} if with_weight else {}
    return x, target, consts


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize(
    "extra_dims, with_weight, ignore",
    [((), False, None), ((2,), True, None), ((4,), True, -1), ((), False, 2)],
)
def test_losses(op, reduction, extra_dims, with_weight, ignore):
    x, target, consts = case(extra_dims, with_weight, ignore)
    feeds = {"x": x, "t": target}
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    n_outputs = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    model = node_model(
        op,
        feeds,
        constants=consts,
        input_order=["x", "t", *consts],
        n_outputs=n_outputs,
        opset=13,
        **attrs,
    )
    check_decomposition(model, feeds, rtol=1e-5, atol=1e-6)
