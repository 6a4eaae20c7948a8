"""Loss operators: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Training graphs end in them, and evaluation graphs (a model scored on its
labels) keep them.  The class of each element is picked from the [N, C,
d1, ...] input by a one-hot of its label (``label == iota`` over C), so a
label equal to ``ignore_index``, which may lie outside [0, C), picks
nothing and weighs nothing.  ``mean`` divides by the summed weights of the
elements not ignored (their count without ``weights``), as the spec and
onnxruntime do.
"""

from __future__ import annotations

import numpy as np

from orchestrate.decompose.builder import Builder, Value
from orchestrate.decompose.reduce import LogSoftmax
from orchestrate.errors import GraphError, UnsupportedError
from orchestrate.ir import Op


def _nll(
    b: Builder,
    log_prob: Value,
    target: Value,
    weight: Value | None,
    reduction: str,
    ignore_index: int | None,
    op: str,
) -> Value:
    if reduction not in ("none", "sum", "mean"):
        raise UnsupportedError(f"{op} reduction {reduction!r}", {f"{op}.reduction": 1})
    if log_prob.rank < 2 or target.shape != (log_prob.shape[0], *log_prob.shape[2:]):
        raise GraphError(f"{op}: input {log_prob.shape} with target {target.shape}")
    classes = log_prob.shape[1]
    labels = b.reshape(target, (target.shape[0], 1, *target.shape[1:]))  # [N, 1, d...]
    iota = b.constant(
        np.arange(classes, dtype=target.dtype).reshape((1, classes) + (1,) * (log_prob.rank - 2))
    )
    picked = b.eq(labels, iota)  # [N, C, d...]
    if ignore_index is not None:
        picked = b.and_(picked, b.unary(Op.NOT, b.eq(labels, ignore_index)))
    w = (
        b.cast(picked, log_prob.dtype)
        if weight is None
        else b.where(picked, b.reshape(weight, (1, classes) + (1,) * (log_prob.rank - 2)), 0.0)
    )
    loss = b.neg(b.sum(b.mul(log_prob, w), [1], keepdims=False))  # [N, d...]
    if reduction == "none":
        return loss
    axes = list(range(loss.rank))
    total = b.sum(loss, axes, keepdims=False)
    if reduction == "sum":
        return total
    return b.div(total, b.sum(w, list(range(w.rank)), keepdims=False))


def NegativeLogLikelihoodLoss(
    b: Builder,
    x: Value,
    target: Value,
    weight: Value | None = None,
    *,
    ignore_index: int | None = None,
    reduction: str = "mean",
) -> Value:
    return _nll(b, x, target, weight, reduction, ignore_index, "NegativeLogLikelihoodLoss")


def SoftmaxCrossEntropyLoss(
    b: Builder,
    scores: Value,
    labels: Value,
    weights: Value | None = None,
    *,
    ignore_index: int | None = None,
    reduction: str = "mean",
):
    """The loss of ``log_softmax(scores, axis=1)``, and that log-probability."""
    log_prob = LogSoftmax(b, scores, axis=1)
    loss = _nll(b, log_prob, labels, weights, reduction, ignore_index, "SoftmaxCrossEntropyLoss")
    return loss, log_prob


OPS = {
    "NegativeLogLikelihoodLoss": NegativeLogLikelihoodLoss,
    "SoftmaxCrossEntropyLoss": SoftmaxCrossEntropyLoss,
}
