"""The row-reduce template: reductions over the same rows with their
prologue, row ops and broadcast epilogue (softmax, layernorm)."""

from __future__ import annotations

import math

from orchestrate.cost import terms
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec, Rows
from orchestrate.templates.base import Template
from orchestrate.templates.row_reduce.emit import row_reduce
from orchestrate.templates.row_reduce.rule import RULE


def blocks(graph: Graph, spec: KernelSpec) -> int:
    """One program per ``BLOCK_ROWS`` rows."""
    rows = spec.roles
    assert isinstance(rows, Rows)
    return math.ceil(rows.rows / spec.config["BLOCK_ROWS"])


def steps(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """A looped row: column blocks per pass, times the passes; no dot, so
    Triton does not pipeline these loads."""
    rows = spec.roles
    assert isinstance(rows, Rows)
    if not rows.looped:
        return 0, 1
    return math.ceil(rows.length / spec.config["BLOCK_COLS"]) * terms.passes(graph, spec), 1


TEMPLATE = Template(RULE, row_reduce, blocks=blocks, steps=steps)
