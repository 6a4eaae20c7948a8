"""``make bench-decode`` (``tools/bench_decode.py``) end to end on the tiny
decode step in the interpreter: the three ways decode, the bundle's two agree
token for token, and decode.json holds what the docs say it does.

A long end-to-end run (30-40 s, most of it optimizing the range bundle and
its in-place step), so in ``make test-slow``: the decoding it drives is
``tests/run/test_generate.py``'s, in ``make test``."""

from __future__ import annotations

import json

import pytest

from tools import bench_decode

pytestmark = pytest.mark.slow


def test_the_tiny_decode_runs_three_ways_and_writes_its_figures(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OUT", raising=False)
    rc = bench_decode.main(
        ["--size", "tiny", "--tokens", "3", "--dtype", "fp32", "--out", str(tmp_path)]
    )
    assert rc == 0
    doc = json.loads((tmp_path / "decode.json").read_text())
    assert set(doc["ways"]) == {"in place", "concat", "torch eager"}
    assert "not a GPU time" in doc["device"]
    for way in doc["ways"].values():
        assert len(way["tokens"]) == 3 and way["ms_per_step"] > 0
    kept, grown = doc["ways"]["in place"], doc["ways"]["concat"]
    assert doc["in_place_equals_concat"] and kept["tokens"] == grown["tokens"]
    assert doc["tokens_equal_to_eager"] == 3  # fp32: the same argmax as torch
    # a row stored a step in place; the whole cache, growing, over the concat
    first, last = kept["cache_bytes_stored_first_last"]
    assert first == last
    first, last = grown["cache_bytes_stored_first_last"]
    assert last > first
    assert kept["predicted_bytes_per_token"] < grown["predicted_bytes_per_token"]
    assert "wrote" in capsys.readouterr().out
