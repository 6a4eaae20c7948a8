"""Recurrent networks through ``orchestrate.optimize``: a stacked LSTM and a
GRU as torch exports them, and a bidirectional LSTM whose sequence lengths
are a graph input; each verified against the float64 truth and onnxruntime
on random inputs (the lengths drawn within the sequence)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

import orchestrate
from orchestrate.check.verify import integer_ranges
from orchestrate.decompose import fission
from orchestrate.frontend import prepare


class Tagger(torch.nn.Module):
    """A recurrent stack and a linear head on every step (a tagger, an OCR
    line recogniser's decoder)."""

    def __init__(self, cell, bidirectional: bool, layers: int):
        super().__init__()
        self.rnn = cell(8, 12, num_layers=layers, bidirectional=bidirectional)
        self.head = torch.nn.Linear(24 if bidirectional else 12, 5)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y)


@pytest.mark.parametrize(
    "cell, bidirectional, layers",
    [(torch.nn.LSTM, True, 2), (torch.nn.GRU, False, 1), (torch.nn.RNN, True, 1)],
    ids=["lstm-bidirectional-2-layers", "gru", "rnn-bidirectional"],
)
def test_torch_exported_recurrent_stacks_optimize_and_verify(tmp_path, cell, bidirectional, layers):
    """Three steps: each reads the state the step before wrote, and the
    planner's linear program stays small (at four steps, CBC spent 40 s
    proving the two-layer LSTM's plan optimal)."""
    torch.manual_seed(0)
    model = Tagger(cell, bidirectional, layers).eval()
    src = tmp_path / "tagger.onnx"
    torch.onnx.export(model, (torch.randn(3, 2, 8),), str(src), dynamo=False, opset_version=17)
    assert {n.op_type for n in onnx.load(src).graph.node} & {"LSTM", "GRU", "RNN"}
    result = orchestrate.optimize(src, tmp_path / "tagger.orch", trials=2, reproducible=True)
    assert result.report.ok
    assert max(c.rel for c in result.report.checks) <= 1e-4


def lengths_model(seq=5, batch=3, n_in=4, hidden=6) -> onnx.ModelProto:
    """A bidirectional LSTM reading ``lens`` [batch] int32, then a ReLU."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 4 * hidden, n_in)).astype(np.float32) * 0.5
    r = rng.standard_normal((2, 4 * hidden, hidden)).astype(np.float32) * 0.5
    b = rng.standard_normal((2, 8 * hidden)).astype(np.float32) * 0.5
    nodes = [
        helper.make_node(
            "LSTM",
            ["x", "w", "r", "b", "lens"],
            ["y", "y_h"],
            direction="bidirectional",
            hidden_size=hidden,
        ),
        helper.make_node("Relu", ["y"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bilstm",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [seq, batch, n_in]),
            helper.make_tensor_value_info("lens", onnx.TensorProto.INT32, [batch]),
        ],
        [onnx.ValueInfoProto(name="out"), onnx.ValueInfoProto(name="y_h")],
        initializer=[numpy_helper.from_array(v, k) for k, v in (("w", w), ("r", r), ("b", b))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(model)


def test_a_bidirectional_lstm_with_sequence_lengths_optimizes_and_verifies(tmp_path):
    model = lengths_model()
    src = tmp_path / "bilstm.onnx"
    onnx.save(model, src)
    # random lengths are drawn from 0..seq, each value the masks tell apart
    assert integer_ranges(fission(prepare(model))) == {"lens": 6}
    result = orchestrate.optimize(src, tmp_path / "bilstm.orch", trials=3, reproducible=True)
    assert result.report.ok
    assert {c.name for c in result.report.checks} == {"out", "y_h"}
