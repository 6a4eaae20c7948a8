"""The scan template: a cumulative sum along one axis, its prologue on the
loads and an aligned elementwise epilogue, in one package: its rule and
roles (``rule.py``), configuration (``config.py``), kernel (``emit.py``)
and, here, its cost terms and registry entry.

Cost (``cost/roofline.py`` turns these counts into time): bytes: each input
read once, each output written once (a scan is a stream, like a row
reduce); flops: each node once per element; blocks: one per ``BLOCK_ROWS``
rows; a looped row's loop steps are its column blocks, one after another
(each block's carry needs the one before).
"""

from __future__ import annotations

import math

from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec
from orchestrate.templates.base import Template
from orchestrate.templates.scan.emit import scan
from orchestrate.templates.scan.rule import RULE, SCAN, Scan

__all__ = ["RULE", "SCAN", "TEMPLATE", "Scan"]


def blocks(graph: Graph, spec: KernelSpec) -> int:
    """One program per ``BLOCK_ROWS`` rows."""
    return math.ceil(spec.roles.rows / spec.config["BLOCK_ROWS"])


def steps(graph: Graph, spec: KernelSpec) -> tuple[int, int]:
    """A looped row: its column blocks, one after another."""
    roles = spec.roles
    if not roles.looped:
        return 0, 1
    return math.ceil(roles.length / spec.config["BLOCK_COLS"]), 1


TEMPLATE = Template(RULE, scan, blocks=blocks, steps=steps)
