"""The row-reduce template: reductions over the same rows with their
prologue, row ops and broadcast epilogue (softmax, layernorm).

Cost (``cost/roofline.py`` turns these counts into time): one block per
``BLOCK_ROWS`` rows; a looped row's loop steps are its column blocks per
pass.  Split (``SPLIT_K`` = S > 1, a few long rows): S times the blocks,
each with 1/S of the column blocks; bytes: the fp32 partial results, S per
row and reduction, written and read back; latency: ``FIXUP_LATENCIES``
after the last wave, as split-K's fix-up."""

from __future__ import annotations

import math

from orchestrate.cost import terms
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec, Rows, split_k
from orchestrate.templates.base import Template
from orchestrate.templates.row_reduce.emit import row_reduce
from orchestrate.templates.row_reduce.rule import RULE


def blocks(graph: Graph, spec: KernelSpec) -> int:
    """One program per ``BLOCK_ROWS`` rows, times SPLIT_K."""
    rows = spec.roles
    assert isinstance(rows, Rows)
    return math.ceil(rows.rows / spec.config["BLOCK_ROWS"]) * split_k(spec.config)


def steps(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """A looped row: column blocks per pass, times the passes (split: each
    program its share); no dot, so Triton does not pipeline these loads."""
    rows = spec.roles
    assert isinstance(rows, Rows)
    if not rows.looped:
        return 0, 1
    per_row = math.ceil(rows.length / spec.config["BLOCK_COLS"])
    return math.ceil(per_row / split_k(spec.config)) * terms.passes(graph, spec), 1


def scratch(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """A split row reduce's scratch: SPLIT_K partial results per row and
    reduction, and one counter per block of rows (GPU or interpreter blocks,
    whichever has more)."""
    rows = spec.roles
    assert isinstance(rows, Rows)
    c = spec.config
    fewest = min(c["BLOCK_ROWS"], dict(c.interpret).get("BLOCK_ROWS", c["BLOCK_ROWS"]))
    partials = split_k(c) * rows.rows * len(rows.reductions)
    return partials, math.ceil(rows.rows / fewest)


TEMPLATE = Template(
    RULE, row_reduce, blocks=blocks, steps=steps, passes=terms.passes, scratch=scratch
)
