"""examples/ranges.py (make dynamic-check): its range parsing and shape
choice, and one model end to end on a small range (slow: the interpreter)."""

from __future__ import annotations

import argparse

import pytest

from examples.ranges import Span, bindings, main, parse_range, rel_error


def test_range_is_batch_by_sequence_with_opt_defaulting_to_max():
    assert parse_range("1..8x2..64@32") == {"batch": Span(1, 8, 8), "sequence": Span(2, 64, 32)}
    assert parse_range("4") == {"batch": Span(4, 4, 4)}
    assert str(Span(2, 64, 32)) == "2..64@32" and str(Span(1, 8, 8)) == "1..8"


@pytest.mark.parametrize("text", ["", "1..8x2..64x3", "8..1", "1..8@9", "1@2", "ax2"])
def test_bad_range_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="--range"):
        parse_range(text)


def test_shapes_checked_are_min_max_then_distinct_seeded_non_multiples_of_16():
    spans = parse_range("1..8x2..64")
    got = bindings(spans, ["batch", "sequence"], 3, seed=5)
    assert got[:2] == [{"batch": 1, "sequence": 2}, {"batch": 8, "sequence": 64}]
    assert len(got) == 5 and len({tuple(b.values()) for b in got}) == 5
    assert all(b["sequence"] % 16 and 2 <= b["sequence"] <= 64 for b in got[2:])
    assert got == bindings(spans, ["batch", "sequence"], 3, seed=5)
    # a batch-only range of 2 values has no room for random shapes
    assert bindings(parse_range("1..2"), ["batch"], 3, seed=0) == [{"batch": 1}, {"batch": 2}]


def test_relative_error_is_max_difference_over_max_magnitude():
    assert rel_error([1.0, -4.0], [1.0, -4.0]) == 0.0
    assert rel_error([1.5, -4.0], [1.0, -4.0]) == pytest.approx(0.5 / 4.0)
    assert rel_error([1.0], [1.0, 2.0]) == float("inf")


@pytest.mark.slow
def test_bert_torchscript_on_a_small_range(tmp_path, capsys):
    rc = main(
        [
            "--only",
            "bert",
            "--exporters",
            "torchscript",
            "--range",
            "1..4x2..9",
            "--random",
            "1",
            "--trials",
            "0",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    row = next(
        line
        for line in (tmp_path / "dynamic.md").read_text().splitlines()
        if line.startswith("| bert |")
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == ["torchscript", "1..4x2..9"] and cells[9] == "ok"
    assert cells[7].startswith("1x2, 4x9, ")  # MIN, MAX, one random shape
    assert float(cells[8]) <= 1e-4
