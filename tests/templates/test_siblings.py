"""The merged-siblings rule: it fires on Q/K/V and on gate/up, its
check declines with the reason where it must, the linear program weighs it
by cost, the cost model prices one launch, and bundles with merged kernels
verify against onnxruntime (in the interpreter) and exactly."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from orchestrate import api, cli
from orchestrate.check.exact.bundle import verify_exact
from orchestrate.cost import roofline
from orchestrate.cost.devices import get_device
from orchestrate.kernels import config
from orchestrate.kernels.spec import MATMUL, MERGED_MATMUL, Rejection, Siblings, Target
from orchestrate.plan import pipeline
from orchestrate.plan.planner import PlanOptions, plan
from orchestrate.templates import match
from tests import graphs
from tests.emit_util import assert_matches_reference

ROOT = Path(__file__).resolve().parents[2]
TINY_BERT = ROOT / "examples" / "models" / "tiny_bert.onnx"
OPTIONS = PlanOptions(device="h200", reproducible=True)


def _save(path: Path, nodes, inputs, outputs, weights: dict[str, np.ndarray]) -> Path:
    g = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [onnx.ValueInfoProto(name=n) for n in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(onnx.shape_inference.infer_shapes(m), path)  # the outputs' types
    return path


def _weights(**shapes) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        k: (rng.standard_normal(s) / np.sqrt(s[0])).astype("float32") for k, s in shapes.items()
    }


def gated_mlp(path: Path) -> Path:
    """A Llama-style MLP: down(silu(x @ gate) * (x @ up))."""
    nodes = [
        helper.make_node("MatMul", ["x", "gate"], ["g"], name="gate_proj"),
        helper.make_node("MatMul", ["x", "up"], ["u"], name="up_proj"),
        helper.make_node("Sigmoid", ["g"], ["s"], name="sigmoid"),
        helper.make_node("Mul", ["g", "s"], ["silu"], name="silu"),
        helper.make_node("Mul", ["silu", "u"], ["h"], name="gated"),
        helper.make_node("MatMul", ["h", "down"], ["y"], name="down_proj"),
    ]
    return _save(
        path, nodes, [("x", [1, 8, 32])], ["y"], _weights(gate=(32, 48), up=(32, 48), down=(48, 32))
    )


def not_siblings(path: Path) -> Path:
    """Matmuls sharing an activation that must stay apart: one multiplies
    by a graph input (not a constant weight), one by a weight with a batch
    dimension."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"]),
        helper.make_node("MatMul", ["x", "y"], ["b"]),
        helper.make_node("Mul", ["x", "two"], ["x2"]),
        helper.make_node("MatMul", ["x2", "w2"], ["c"]),
        helper.make_node("MatMul", ["x2", "w3"], ["d"]),
    ]
    weights = _weights(w1=(32, 16), w2=(32, 16), w3=(1, 32, 16))
    weights["two"] = np.array(2.0, dtype="float32")
    return _save(path, nodes, [("x", [1, 8, 32]), ("y", [32, 16])], ["a", "b", "c", "d"], weights)


def _merged(p) -> list:
    return [k for k in p.kernels if k.template == MERGED_MATMUL]


@pytest.fixture(scope="module")
def bert():
    g = pipeline.fission_file(TINY_BERT)
    return g, plan(g, OPTIONS)


# -- where it fires ------------------------------------------------------------------


def test_listed_in_the_rule_table():
    r = CliRunner().invoke(cli.main, ["rules"])
    assert r.exit_code == 0, r.output
    (line,) = [x for x in r.output.splitlines() if x.startswith(MERGED_MATMUL)]
    assert "pattern" in line and "Q/K/V" in line


def test_tiny_bert_merges_q_k_v_of_every_layer(bert):
    graph, planned = bert
    merged = [s for s in planned.specs if s.template == MERGED_MATMUL]
    assert len(merged) == 2  # one per layer
    for layer, spec in enumerate(merged):
        anchors = [g.anchor for g in spec.roles.segments]
        assert [graph.producer[a].origin for a in anchors] == [
            f"/layers.{layer}/{w}/MatMul" for w in ("query", "key", "value")
        ]
        # one activation, the weights side by side: 3 x 64 columns
        assert {graph.producer[a].inputs[0] for a in anchors} == {spec.roles.activation}
        assert [(g.start, g.stop) for g in spec.roles.segments] == [(0, 64), (64, 128), (128, 192)]
    # no projection is computed twice
    runs = [p for k in planned.plan.kernels for p in k.primitives if "/MatMul" in p]
    assert len(runs) == len(set(runs))


def test_merged_q_k_v_verify_against_onnxruntime_and_exactly(tmp_path):
    out = tmp_path / "bert.orch"
    made = api.optimize(TINY_BERT, out, trials=1, device="h200")
    assert made.report.ok and not made.report.simulated
    assert len(_merged(made.plan)) == 2
    result = verify_exact(out, TINY_BERT)
    assert result.ok, result.mismatch


def test_gate_and_up_merge_and_verify(tmp_path):
    path = gated_mlp(tmp_path / "mlp.onnx")
    made = api.optimize(path, tmp_path / "mlp.orch", trials=1, device="h200")
    assert made.report.ok and not made.report.simulated
    (k,) = _merged(made.plan)
    origins = {p.name: p.origin for p in made.plan.primitives}
    assert sorted(origins[p] for p in k.primitives) == ["gate_proj", "up_proj"]
    assert verify_exact(tmp_path / "mlp.orch", path).ok


def projections(b, x):
    """Q, K and a narrower V (grouped-query heads) of one activation, each
    with its bias; widths that are not multiples of the tiles."""
    rng = np.random.default_rng(2)

    def const(*shape):
        return b.constant((rng.standard_normal(shape) / 4).astype(x.type.dtype))

    return tuple(b.add(b.matmul(x, const(24, n)), const(n)) for n in (40, 40, 24))


@pytest.fixture
def small_tiles(monkeypatch):
    """Matmul interpreter tiles of 16: several tiles per segment, and
    segments whose last tile is partial (the space is cached per size)."""
    config.matmul.cache_clear()
    monkeypatch.setattr(config, "MATMUL_INTERPRET_BLOCK", 16)
    yield
    config.matmul.cache_clear()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_merged_kernel_with_biases_matches_the_reference(dtype, small_tiles):
    graph = graphs.build(projections, [(2, 20, 24)], dtype=dtype)
    planned = plan(graph, OPTIONS)
    (spec,) = [s for s in planned.specs if s.template == MERGED_MATMUL]
    assert [len(g.epilogue) for g in spec.roles.segments] == [1, 1, 1]  # the biases
    assert [(g.start, g.stop) for g in spec.roles.segments] == [(0, 40), (40, 80), (80, 104)]
    x = np.random.default_rng(0).standard_normal((2, 20, 24)).astype(dtype)
    tol = {"float32": (1e-5, 1e-5), "float16": (1e-2, 1e-2)}[dtype]
    src = assert_matches_reference(graph, planned, {"x0": x}, *tol)
    assert src.count("tile = tl.program_id(0)") == 1 and "elif tile < end_1:" in src


# -- where it declines ------------------------------------------------------------------


def test_declines_a_computed_operand_and_a_batched_weight_with_the_reason(tmp_path):
    path = not_siblings(tmp_path / "apart.onnx")
    planned = plan(pipeline.fission_file(path), OPTIONS).plan
    assert not _merged(planned)
    reasons = [d.reason for d in planned.declined if d.rule == MERGED_MATMUL]
    assert len(reasons) == 2, planned.declined
    assert any("second operand y is not a constant weight" in r for r in reasons)
    assert any("has batch dimensions" in r and "[1, 32, 16]" in r for r in reasons)
    out = tmp_path / "apart.json"
    r = CliRunner().invoke(cli.main, ["plan", str(path), "-o", str(out), "--device", "h200"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli.main, ["explain", str(out), "--rejected"])
    assert r.exit_code == 0, r.output
    assert "merged_matmul at" in r.output and "is not a constant weight" in r.output


def test_an_epilogue_reading_two_siblings_is_declined(tmp_path):
    graph = pipeline.fission_file(gated_mlp(tmp_path / "mlp.onnx"))
    target = Target(get_device("h200"))
    by_origin = {n.origin: n.name for n in graph.nodes}
    pair = [by_origin["gate_proj"], by_origin["up_proj"]]
    assert match(graph, pair, target).template == MERGED_MATMUL
    # silu(gate) is gate's own epilogue; silu(gate) * up reads both siblings
    silu = [n.name for n in graph.nodes if n.origin in ("sigmoid", "silu")]
    assert match(graph, pair + silu, target).template == MERGED_MATMUL
    found = match(graph, pair + silu + [by_origin["gated"]], target)
    assert isinstance(found, Rejection)
    assert found.reason == (
        f"{by_origin['gated']} reads two siblings ({pair[0]}, {pair[1]}): "
        "each epilogue reads its own"
    )


# -- cost and the linear program ------------------------------------------------------


def test_cost_is_one_launch_reading_the_activation_once(bert):
    graph, planned = bert
    spec = next(s for s in planned.specs if s.template == MERGED_MATMUL)
    roles = spec.roles
    assert isinstance(roles, Siblings)
    device = get_device("h200")
    merged = roofline.cost(graph, spec, device)
    t = graph.types
    moved = (
        t[roles.activation].nbytes
        + sum(t[g.weight].nbytes for g in roles.segments)
        + sum(t[g.anchor].nbytes for g in roles.segments)
    )
    assert merged.bytes == moved
    # each sibling alone, at the merged kernel's tiles: the grid is their sum
    target = Target(device, rank=lambda g, s: 0 if s.config.blocks == spec.config.blocks else 1)
    alone = [match(graph, [g.anchor], target) for g in roles.segments]
    assert all(s.template == MATMUL and s.config.blocks == spec.config.blocks for s in alone)
    assert merged.blocks == sum(roofline.cost(graph, s, device).blocks for s in alone)
    assert merged.time_us < sum(roofline.cost(graph, s, device).time_us for s in alone)


def test_the_linear_program_keeps_separate_matmuls_when_merged_costs_more(bert, monkeypatch):
    graph, _ = bert
    real = roofline.cost

    def dearer(g, spec, device):  # a target where one launch of the merged kernel is slow
        c = real(g, spec, device)
        return replace(c, launch_us=c.launch_us + 100.0) if spec.template == MERGED_MATMUL else c

    monkeypatch.setattr(roofline, "cost", dearer)
    planned = plan(graph, OPTIONS).plan
    assert not _merged(planned)
    projections = [
        k
        for k in planned.kernels
        if any(
            p.endswith(("query/MatMul_output_0", "key/MatMul_output_0", "value/MatMul_output_0"))
            for p in k.primitives
        )
    ]
    assert len(projections) == 6  # each projection in a kernel of its own
