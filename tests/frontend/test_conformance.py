"""Every ONNX backend node conformance case: decomposed and correct, or declined.

A case may never crash with another exception or give a wrong answer
(see tests/conformance.py for what each status means).
"""

from __future__ import annotations

import collections
import functools

import pytest

from tests import conformance

CASES = {c.name: c for c in conformance.cases()}
MIN_CORRECT = 600


@functools.cache
def outcome(name: str) -> conformance.Outcome:
    return conformance.run_case(CASES[name])


@pytest.mark.parametrize("name", sorted(CASES))
def test_case(name):
    o = outcome(name)
    assert o.status in ("passed", "bound", "declined"), f"{o.status}: {o.detail}"


def test_enough_cases_are_decomposed_and_correct():
    counts = collections.Counter(outcome(n).status for n in CASES)
    correct = counts["passed"] + counts["bound"]
    assert correct >= MIN_CORRECT, dict(counts)
    assert counts["wrong"] == counts["crashed"] == 0, dict(counts)
