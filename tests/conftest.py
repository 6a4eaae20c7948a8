"""Test-session set-up.

Without CUDA, Triton must run in its interpreter, and triton decides that once,
when it is first imported (some tests import it early: torch's dynamo exporter,
the compile checks).  So the interpreter is switched on here, before any test
module is imported, and the `gpu` tier is skipped.

Every hypothesis property runs under the profile ``tests/fuzz_util.py``
registers: "ci" in `make test` (the same examples every run, so a run is
deterministic, whichever worker a test lands on), "fuzz" under
ORCHESTRATE_FUZZ=1.  Loaded here, not by the fuzz suite's import, which
only some workers make.
"""

from __future__ import annotations

import os

import pytest


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


if not _cuda():
    os.environ["TRITON_INTERPRET"] = "1"

from hypothesis import settings  # noqa: E402

from tests import fuzz_util  # noqa: E402

settings.load_profile(fuzz_util.PROFILE)


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def small_blocks(monkeypatch):
    """Attention interpreter blocks of 16: several query blocks and key
    steps.  The configuration space is cached per problem size, so the cache
    is cleared around the change (else a size seen before keeps its large
    blocks)."""
    from orchestrate.templates.attention import config

    space = config.attention
    space.cache_clear()
    monkeypatch.setattr(config, "ATTENTION_INTERPRET_BLOCK", 16)
    yield
    space.cache_clear()
