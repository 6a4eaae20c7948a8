"""Planning large graphs: spans cut for size where the fewest bytes are
live, kernels stitched back across those cuts, and a time limit that always
returns a plan (the greedy incumbent when the solver had no better one)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pulp
import pytest
from click.testing import CliRunner
from onnx import helper

from orchestrate import api, cli, ir, templates
from orchestrate.ilp import program
from orchestrate.ilp.partition import partition
from orchestrate.plan import Plan, planner
from orchestrate.plan.candidates import Limits
from orchestrate.plan.planner import PlanOptions
from tests import graphs
from tests.util import elem


def _chain(n: int):
    def build(b, x):
        for i in range(n):
            x = b.exp(x) if i % 2 else b.mul(x, 0.5)
        return x

    return build


def _plan(g: ir.Graph, **limits) -> planner.Plan:
    return planner.plan(g, PlanOptions(device="h100", limits=Limits(**limits))).plan


def test_a_long_span_is_cut_into_pieces_no_larger_than_the_limit():
    g = graphs.build(_chain(40), [(4, 64)])
    assert len(partition(g)) == 1  # no natural cut in a chain
    parts = partition(g, max_nodes=8)
    assert all(len(p.nodes) <= 8 for p in parts) and len(parts) >= 5
    assert [n for p in parts for n in p.nodes] == [n.name for n in g.nodes]
    assert len({p.span for p in parts}) == 1  # one span, cut for size
    for before, after in zip(parts, parts[1:]):
        assert before.outputs == (before.nodes[-1],) and after.inputs[0] == before.nodes[-1]


def test_the_size_cut_falls_where_the_fewest_bytes_are_live():
    """Four ops on a 64x256 tensor, a row sum, four ops on its 64x1 result,
    then four on 64x256 again: a piece of at most 8 nodes ends in the narrow
    stretch, where one 256-byte tensor crosses the cut, not 64 KB."""

    def build(b, x, z):
        for _ in range(4):
            x = b.exp(b.mul(x, 0.5))
        s = b.sum(x, [1])
        for _ in range(2):
            s = b.exp(b.mul(s, 0.5))
        y = b.mul(z, s)
        for _ in range(2):
            y = b.exp(b.mul(y, 0.5))
        return y

    g = graphs.build(build, [(64, 256), (64, 256)])
    parts = partition(g, max_nodes=14)
    first = parts[0]
    crossing = [t for t in first.outputs if t in parts[1].inputs]
    narrow = [t for t in crossing if g.types[t].shape == (64, 1)]
    assert narrow, [(t, g.types[t].shape) for t in crossing]


def test_kernels_are_stitched_back_across_size_cuts():
    """A 40-node elementwise chain in pieces of 8 plans as the whole chain
    does: one kernel, the same predicted time, the merges reported."""
    g = graphs.build(_chain(40), [(4, 64)])
    whole, cut = _plan(g), _plan(g, partition_nodes=8)
    assert whole.summary.kernels == 1 and whole.solver.stitched == 0
    assert cut.solver.partitions >= 5 and cut.solver.stitched == cut.solver.partitions - 1
    assert cut.summary.kernels == 1
    assert cut.summary.predicted_us == pytest.approx(whole.summary.predicted_us)
    assert cut.baselines["greedy"].kernels == 1


@pytest.mark.parametrize("seed", range(12))
def test_stitched_plans_of_random_graphs_are_valid(seed):
    """Pieces of three nodes over random DAGs (multi-output kernels, shared
    inputs): every stitched plan passes the plan checker (assemble runs it),
    is never slower than its pieces unstitched, and names each kernel's
    primitives exactly once unless the optimum recomputes."""
    g = graphs.random_dag(seed, n_nodes=12)
    p = _plan(g, partition_nodes=3)
    assert p.solver.stitched_us >= 0
    written = [t for k in p.kernels for t in k.outputs]
    assert len(written) == len(set(written))
    assert set(g.outputs) <= set(written)


def test_a_stitched_plan_runs_and_verifies(tmp_path):
    """The merged kernel is emitted, run (interpreter) and verified like any."""
    x = helper.make_tensor_value_info("x", elem("float32"), [4, 64])
    y = helper.make_tensor_value_info("y", elem("float32"), [4, 64])
    ops = ["Relu", "Exp", "Neg", "Sigmoid"] * 5
    names = ["x"] + [f"t{i}" for i in range(len(ops) - 1)] + ["y"]
    nodes = [helper.make_node(op, [names[i]], [names[i + 1]]) for i, op in enumerate(ops)]
    model = helper.make_model(
        helper.make_graph(nodes, "chain", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    path = tmp_path / "chain.onnx"
    onnx.save(model, path)
    options = PlanOptions(device="h100", limits=Limits(partition_nodes=4))
    bundle = api.optimize(path, tmp_path / "chain.orch", options=options, trials=1)
    assert bundle.plan.solver.stitched >= 4 and bundle.plan.summary.kernels == 1
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 64), dtype=np.float32)}
    want = 1 / (1 + np.exp(np.exp(np.maximum(feeds["x"], 0))))
    for _ in range(4):
        want = 1 / (1 + np.exp(np.exp(np.maximum(want, 0))))
    np.testing.assert_allclose(api.load(bundle.path).run(feeds)["y"], want, rtol=1e-5)


def _out_of_time(monkeypatch):
    """CBC stopping on its time limit before any integer solution, as it
    does on a large partition under a small --time-limit."""

    def stopped(prob, **options):
        prob.status = pulp.LpStatusNotSolved
        return "Result - Stopped on time limit\n\nNo feasible solution found\nLower bound: 1.5\n"

    monkeypatch.setattr(program, "solve_cbc", stopped)


def test_a_time_limit_keeps_the_greedy_incumbent(monkeypatch):
    g = graphs.build(graphs.mlp, [(32, 64), (64, 256), (256,), (256, 64)])
    _out_of_time(monkeypatch)
    p = _plan(g)
    assert p.solver.status == "greedy"
    greedy = p.baselines["greedy"]
    assert p.summary.kernels == greedy.kernels
    assert p.summary.predicted_us == pytest.approx(greedy.predicted_us)
    assert p.solver.gap == pytest.approx((greedy.predicted_us - 1.5) / greedy.predicted_us, 1e-3)


def test_the_cli_reports_the_incumbent_and_exits_0(monkeypatch, tmp_path):
    _out_of_time(monkeypatch)
    x = helper.make_tensor_value_info("x", elem("float32"), [8, 64])
    y = helper.make_tensor_value_info("y", elem("float32"), [8, 64])
    nodes = [helper.make_node("Softmax", ["x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = helper.make_model(
        helper.make_graph(nodes, "m", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.save(model, tmp_path / "m.onnx")
    r = CliRunner().invoke(
        cli.main,
        ["plan", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "p.json"), "--time-limit", "1"],
    )
    assert r.exit_code == 0, r.output
    assert "solver: greedy, gap" in r.output and (tmp_path / "p.json").exists()


def _gather_model(folder, rows: int, cols: int = 1024):
    """Gather rows of a rows x cols float32 table, then Relu; the table is
    external data of zeros (a sparse file: no disk, no time)."""
    t = onnx.TensorProto(name="table", data_type=onnx.TensorProto.FLOAT, dims=[rows, cols])
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (
        ("location", "table.bin"),
        ("offset", "0"),
        ("length", str(4 * rows * cols)),
    ):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    with open(folder / "table.bin", "wb") as f:
        f.truncate(4 * rows * cols)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"]),
        helper.make_node("Relu", ["e"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "lookup",
        [helper.make_tensor_value_info("ids", elem("int64"), [4])],
        [helper.make_tensor_value_info("y", elem("float32"), [4, cols])],
        [t],
    )
    path = folder / "lookup.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_model_past_2_gib_of_weights_plans_and_optimizes(tmp_path):
    """2.16 GB of weights in one tensor: past what one protobuf can hold, so
    a step that serialized the weights would fail.  They stay in their file
    (mapped, not loaded), the plan is made, and the bundle written."""
    import shutil

    rows = 2**19 + 4096  # x 1024 x 4 bytes = 2.16 GB
    path = _gather_model(tmp_path, rows)
    runner = CliRunner()
    try:
        r = runner.invoke(cli.main, ["plan", str(path), "-o", str(tmp_path / "p.json")])
        assert r.exit_code == 0, r.output
        out = tmp_path / "lookup.orch"
        r = runner.invoke(cli.main, ["optimize", str(path), "-o", str(out), "--trials", "0"])
        assert r.exit_code == 0, r.output
        assert (out / "weights.npz").stat().st_size > 2**31
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)  # the bundle's 2 GB


def test_weights_are_read_in_place_and_checked_against_their_file(tmp_path):
    """A small external table runs as the model says (onnxruntime reads the
    mapped array), and a file too short for its tensor is one clear error."""
    path = _gather_model(tmp_path, 64, cols=8)
    values = np.arange(64 * 8, dtype=np.float32).reshape(64, 8) - 100
    values.tofile(tmp_path / "table.bin")
    bundle = api.optimize(path, tmp_path / "b.orch", trials=1)
    ids = np.array([0, 5, 63, 12], np.int64)
    got = api.load(bundle.path).run({"ids": ids})["y"]
    np.testing.assert_array_equal(got, np.maximum(values[ids], 0))
    with open(tmp_path / "table.bin", "r+b") as f:
        f.truncate(100)
    r = CliRunner().invoke(cli.main, ["plan", str(path), "-o", str(tmp_path / "p.json")])
    assert r.exit_code == 2
    assert "table.bin" in r.output and "too few" in r.output and "Traceback" not in r.output


def test_fresh_names_are_the_least_unused_suffix():
    """A Sum of 10,000 inputs names 10,000 adds: each name is the least
    unused suffix, as a search from 1 would give, found without one."""
    from orchestrate.decompose.builder import Builder

    b = Builder(reserved=["y/add_3", "y/mul"])
    b.begin("sum", "y")
    assert [b.fresh("add") for _ in range(4)] == ["y/add", "y/add_2", "y/add_4", "y/add_5"]
    assert b.fresh("mul") == "y/mul_2"
    b._used.add("y/add_6")  # a name taken since (an ONNX output renamed in)
    assert b.fresh("add") == "y/add_7"


def _sum_model(folder, n: int):
    ins = [helper.make_tensor_value_info(f"x{i}", elem("float32"), [4, 8]) for i in range(n)]
    node = helper.make_node("Sum", [f"x{i}" for i in range(n)], ["y"], name="sum")
    y = helper.make_tensor_value_info("y", elem("float32"), [4, 8])
    model = helper.make_model(
        helper.make_graph([node], "sum", ins, [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.save(model, folder / "sum.onnx")
    return folder / "sum.onnx"


def test_the_time_limit_bounds_the_planning_not_each_program(tmp_path):
    """--time-limit is the planning's time, enumeration and every program
    together: spent before the first program, each partition keeps its
    greedy plan unsolved (no program run), reported, and the plan is valid."""
    src = _sum_model(tmp_path, 1200)  # 1,199 adds: several size cuts
    out = tmp_path / "p.json"
    r = CliRunner().invoke(cli.main, ["plan", str(src), "-o", str(out), "--time-limit", "0.01"])
    assert r.exit_code == 0, r.output
    assert "solver: greedy" in r.output
    p = Plan.from_json(json.loads(out.read_text()), templates.NAMES)
    assert p.solver.status == "greedy" and p.solver.solves == 0 and p.solver.partitions > 1
    assert p.summary.predicted_us == pytest.approx(p.baselines["greedy"].predicted_us)
    r = CliRunner().invoke(cli.main, ["plan", str(src), "-o", str(out)])
    assert r.exit_code == 0 and "solver: optimal" in r.output, r.output
