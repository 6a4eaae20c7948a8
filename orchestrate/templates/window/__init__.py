"""The window template: one max or average pool with an elementwise prologue
and an aligned epilogue, one program per ``BLOCK`` output elements."""

from __future__ import annotations

from orchestrate.cost import terms
from orchestrate.templates.base import Template
from orchestrate.templates.window.emit import window
from orchestrate.templates.window.rule import RULE

TEMPLATE = Template(RULE, window, flops=terms.anchored_split_flops, blocks=terms.flat_blocks)
