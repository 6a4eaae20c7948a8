"""The window template: one max or average pool with an elementwise prologue
and an aligned epilogue, one program per ``BLOCK`` output elements."""

from __future__ import annotations

from orchestrate.cost import terms
from orchestrate.emit.window import window
from orchestrate.kernels.anchored import WINDOW_RULE
from orchestrate.templates.base import Template

TEMPLATE = Template(WINDOW_RULE, window, flops=terms.anchored_split_flops, blocks=terms.flat_blocks)
