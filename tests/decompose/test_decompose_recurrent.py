"""RNN, GRU and LSTM against onnxruntime: every direction, both layouts,
sequence lengths, initial states, peepholes, clip and the optional
activations; the primitive graph has no recurrent op left and one input
projection per direction."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from orchestrate.decompose import recurrent
from orchestrate.errors import InputError, UnsupportedError
from orchestrate.frontend import onnxrt
from orchestrate.ir import Op
from tests.util import check_decomposition, node_model

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
OUTPUTS = {"RNN": 2, "GRU": 2, "LSTM": 3}
FUNCTIONS = {"RNN": 1, "GRU": 2, "LSTM": 3}  # activations per direction
SEQ, BATCH, N_IN, HIDDEN = 4, 3, 5, 6


def recurrent_model(
    op,
    *,
    seed=0,
    direction="forward",
    layout=0,
    bias=True,
    lens=None,
    states=True,
    peepholes=False,
    weights_as_inputs=False,
    seq=SEQ,
    **attrs,
):
    """(model, feeds) of one ``op`` node; W, R, B and P are initializers
    unless ``weights_as_inputs``."""
    rng = np.random.default_rng(seed)
    g, dirs = GATES[op], 2 if direction == "bidirectional" else 1
    x_shape = (seq, BATCH, N_IN) if layout == 0 else (BATCH, seq, N_IN)
    state_shape = (dirs, BATCH, HIDDEN) if layout == 0 else (BATCH, dirs, HIDDEN)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    weights = {
        "w": rng.standard_normal((dirs, g * HIDDEN, N_IN)).astype(np.float32) * 0.5,
        "r": rng.standard_normal((dirs, g * HIDDEN, HIDDEN)).astype(np.float32) * 0.5,
    }
    order = ["x", "w", "r", "b" if bias else "", "lens" if lens is not None else ""]
    if bias:
        weights["b"] = rng.standard_normal((dirs, 2 * g * HIDDEN)).astype(np.float32) * 0.5
    if lens is not None:
        feeds["lens"] = np.array(lens, dtype=np.int32)
    names = ["h0", "c0"] if op == "LSTM" else ["h0"]
    for name in names:
        order.append(name if states else "")
        if states:
            feeds[name] = rng.standard_normal(state_shape).astype(np.float32)
    if op == "LSTM":
        order.append("p" if peepholes else "")
        if peepholes:
            weights["p"] = rng.standard_normal((dirs, 3 * HIDDEN)).astype(np.float32)
    while order[-1] == "":
        order.pop()
    if weights_as_inputs:
        feeds, weights = {**feeds, **weights}, {}
    model = node_model(
        op,
        {k: v for k, v in feeds.items()},
        constants=weights,
        input_order=order,
        n_outputs=OUTPUTS[op],
        opset=14,
        direction=direction,
        hidden_size=HIDDEN,
        layout=layout,
        **attrs,
    )
    return model, feeds


def time_major_expected(op, feeds, **kwargs):
    """onnxruntime's outputs for layout 1, which it does not run: the
    layout-0 model on transposed inputs, its outputs transposed back."""
    model, _ = recurrent_model(op, layout=0, **kwargs)
    moved = {k: v.transpose(1, 0, 2) if k in ("x", "h0", "c0") else v for k, v in feeds.items()}
    out = onnxrt.run(model, moved)
    return {
        k: v.transpose(2, 0, 1, 3) if k == "y0" else v.transpose(1, 0, 2) for k, v in out.items()
    }


def check(op, **kwargs):
    model, feeds = recurrent_model(op, **kwargs)
    expected = None
    if kwargs.get("layout"):
        expected = time_major_expected(
            op, feeds, **{k: v for k, v in kwargs.items() if k != "layout"}
        )
    return check_decomposition(model, feeds, rtol=1e-4, atol=1e-5, expected=expected)


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_every_direction_and_layout(op, direction, layout):
    graph = check(op, direction=direction, layout=layout)
    ops = Counter(n.op for n in graph.nodes)
    dirs = 2 if direction == "bidirectional" else 1
    # one input projection, one recurrent matmul per step and direction
    # (GRU's candidate gate takes a second one)
    per_step = 2 if op == "GRU" else 1
    assert ops[Op.MATMUL] == 1 + dirs * per_step * SEQ


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lengths_including_an_empty_row(op, direction):
    check(op, direction=direction, lens=[0, 2, SEQ])


@pytest.mark.parametrize("op", list(GATES))
def test_no_bias_no_initial_state_and_weights_as_inputs(op):
    check(op, bias=False, states=False)
    check(op, weights_as_inputs=True, direction="bidirectional")


@pytest.mark.parametrize("op", list(GATES))
def test_clip_bounds_every_activation_input(op):
    check(op, clip=0.3, seed=1)


def test_gru_linear_before_reset():
    check("GRU", linear_before_reset=1, direction="bidirectional", lens=[1, 3, 4])


def test_lstm_peepholes_and_coupled_input_forget():
    check("LSTM", peepholes=True, direction="bidirectional", lens=[1, 4, 2])
    check("LSTM", input_forget=1, peepholes=True)


@pytest.mark.parametrize(
    "op, activations, alpha, beta",
    [
        ("RNN", ["Relu"], None, None),
        ("RNN", ["Affine", "LeakyRelu"], [0.5, 0.2], [0.1]),
        ("GRU", ["HardSigmoid", "Softsign"], [0.3], [0.4]),
        ("GRU", ["Sigmoid", "Elu"], None, None),
        (
            "LSTM",
            ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Softplus", "ScaledTanh"],
            [0.3, 0.7],
            [0.4, 1.2],
        ),
        ("LSTM", ["Sigmoid", "ThresholdedRelu", "Tanh"], [0.1], None),
    ],
)
def test_optional_activations_take_alpha_and_beta_in_order(op, activations, alpha, beta):
    attrs = {"activations": activations}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    direction = "bidirectional" if len(activations) == 2 * FUNCTIONS[op] else "forward"
    check(op, direction=direction, **attrs)


def test_a_sequence_past_the_unroll_limit_is_refused_naming_it():
    model, feeds = recurrent_model("LSTM", seq=recurrent.MAX_STEPS + 1)
    with pytest.raises(
        UnsupportedError, match=f"{recurrent.MAX_STEPS + 1} time steps.*up to {recurrent.MAX_STEPS}"
    ):
        check_decomposition(model, feeds)


def test_a_constant_length_outside_the_sequence_is_refused():
    model, feeds = recurrent_model("GRU", lens=[1, 2, SEQ + 1])
    lens = feeds.pop("lens")
    model.graph.input.remove(next(i for i in model.graph.input if i.name == "lens"))
    from onnx import numpy_helper

    model.graph.initializer.append(numpy_helper.from_array(lens, "lens"))
    with pytest.raises(InputError, match=r"sequence_lens \[1, 2, 5\] outside \[0, 4\]"):
        check_decomposition(model, feeds)


def test_an_unknown_activation_is_declined_naming_it():
    model, feeds = recurrent_model("RNN", activations=["Swish"])
    with pytest.raises(UnsupportedError, match="RNN activation 'Swish'"):
        check_decomposition(model, feeds, expected={})
