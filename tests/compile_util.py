"""Compile single generated kernels for sm_90 in a subprocess (no GPU needed).

The fit tests (``test_fit.py`` and the rule families' own) cut kernels out of
plans, print each as a one-kernel module, compile it with the real Triton
compiler (the interpreter must be off, hence the subprocess) and read back
the compiled shared memory and spills to hold the fit model to them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from orchestrate.emit import kernel_source
from orchestrate.emit.source import Launch, module, pointers

ROOT = Path(__file__).resolve().parents[1]

_COMPILE = """
import importlib.util, json, sys
from orchestrate.check.compile_check import compile_module
out = []
for path, dtypes in json.load(open(sys.argv[1])):
    spec = importlib.util.spec_from_file_location("m" + str(len(out)), path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    (c,) = compile_module(m, dtypes)
    out.append([c.shared, c.spill_bytes])
print(json.dumps(out))
"""


def compile_sm90(
    tmp_path: Path,
    kernels: Sequence[tuple],
    extra_dtypes: Mapping[str, str] = {},
    timeout: int = 600,
) -> list[tuple[int, int | None]]:
    """(shared bytes, spilled bytes or None) of each (graph, spec, writes,
    function name, module title) compiled for sm_90; skips the test when
    there is no ptxas."""
    jobs = []
    for i, (g, spec, writes, name, title) in enumerate(kernels):
        ks = kernel_source(g, spec, writes, name)
        slots = {v: k for k, v in pointers(g, spec, writes).slots.items()}
        path = tmp_path / f"k{i}.py"
        path.write_text(
            module([ks], [Launch("k", ks.name, tuple(slots[p] for p in ks.params))], title)
        )
        dtypes = {t: g.types[t].dtype for t in (*spec.inputs, *writes)} | dict(extra_dtypes)
        jobs.append((str(path), dtypes))
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE, str(tmp_path / "jobs.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if run.returncode and "ptxas" in run.stderr and "not found" in run.stderr:
        pytest.skip("no ptxas to compile with")
    assert run.returncode == 0, run.stderr[-4000:]
    return [tuple(c) for c in json.loads(run.stdout.strip().splitlines()[-1])]
