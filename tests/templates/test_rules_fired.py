"""Which pattern rules fired, where, and what each was worth (plan.rules, explain)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from orchestrate import cli, templates
from orchestrate.plan import Plan, pipeline
from orchestrate.plan import candidates as enumeration
from orchestrate.plan.planner import PlanOptions, plan

DEMO = "examples/models/tiny_bert.onnx"
OPTIONS = PlanOptions(device="h200", reproducible=True)


@pytest.fixture(scope="module")
def graph():
    return pipeline.fission_file(DEMO)


@pytest.fixture(scope="module")
def planned(graph):
    return plan(graph, OPTIONS).plan


def _without(monkeypatch, rule_name: str):
    """Planning with one pattern rule switched off."""
    real = enumeration.pattern_rules
    monkeypatch.setattr(
        enumeration,
        "pattern_rules",
        lambda *target: [r for r in real(*target) if r.name != rule_name],
    )


def test_attention_fired_on_every_layer_with_its_kernels(planned):
    (use,) = [u for u in planned.rules if u.rule == "attention"]
    kernels = {k.name: k for k in planned.kernels}
    assert len(use.kernels) == 2  # tiny BERT's two layers
    assert all(kernels[name].template == "attention" for name in use.kernels)
    assert use.with_us < use.without_us


def test_without_figure_is_the_plan_made_without_the_rule(graph, planned, monkeypatch):
    """Switching the rule off costs exactly the difference the plan records."""
    (use,) = [u for u in planned.rules if u.rule == "attention"]
    _without(monkeypatch, "attention")
    alone = plan(graph, OPTIONS).plan
    assert not any(k.template == "attention" for k in alone.kernels)
    assert "attention" not in {u.rule for u in alone.rules}
    gained = use.without_us - use.with_us
    assert alone.summary.predicted_us == pytest.approx(
        planned.summary.predicted_us + gained, abs=1e-3
    )


def test_rules_survive_the_plan_file(planned):
    again = Plan.from_json(json.loads(json.dumps(planned.to_json())), templates.NAMES)
    assert again.rules == planned.rules


def test_explain_names_the_rules_that_fired(tmp_path):
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(cli.main, ["plan", DEMO, "-o", str(out), "--device", "h200"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli.main, ["explain", str(out)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    start = lines.index(
        "rules that fired (partitions where each fired: planned / without the rule):"
    )
    fired = [line.split()[0] for line in lines[start + 1 :] if line.startswith("  ")]
    assert "attention" in fired
    row = next(line for line in lines[start + 1 :] if line.split()[:1] == ["attention"])
    assert "2 kernels" in row and "k0" in row


def test_no_rewrites_plans_without_any_pattern_rule(graph, planned):
    alone = plan(graph, PlanOptions(device="h200", reproducible=True, rewrites=False)).plan
    assert alone.rules == () and not alone.options.rewrites
    pattern = {"attention", "merged_matmul", "norm_matmul", "low_rank", "library_attention"}
    assert not pattern & {k.template for k in alone.kernels}
    assert alone.summary.predicted_us > planned.summary.predicted_us


def test_no_rewrites_from_the_command_line(tmp_path):
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(cli.main, ["plan", DEMO, "-o", str(out), "--no-rewrites"])
    assert r.exit_code == 0, r.output
    assert "rewrite rules: off (--no-rewrites)" in r.output
    assert json.loads(out.read_text())["options"]["rewrites"] is False
    assert "rules that fired" not in CliRunner().invoke(cli.main, ["explain", str(out)]).output


def test_the_re_solves_side_by_side_give_the_figures_one_at_a_time(graph, planned, monkeypatch):
    """``alternatives.fired_all`` runs the re-solves in threads; the figures
    (and the plan) are those of running them one after another."""
    import threading

    from orchestrate.ilp import alternatives

    threads = set()
    real = alternatives._priced

    def priced(*args):
        threads.add(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(alternatives, "_priced", priced)
    monkeypatch.setattr(alternatives.os, "cpu_count", lambda: 4)
    side_by_side = plan(graph, OPTIONS).plan
    assert len(threads) >= 2, threads
    monkeypatch.setattr(alternatives, "MAX_WORKERS", 1)
    threads.clear()
    one_at_a_time = plan(graph, OPTIONS).plan
    assert len(threads) == 1
    assert side_by_side.rules == one_at_a_time.rules == planned.rules
    assert side_by_side.to_json() == one_at_a_time.to_json()
