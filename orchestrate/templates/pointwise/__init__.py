"""The pointwise template: elementwise and layout primitives, one program per
``BLOCK`` output elements."""

from __future__ import annotations

from orchestrate.cost import terms
from orchestrate.templates.base import Template
from orchestrate.templates.pointwise.emit import pointwise
from orchestrate.templates.pointwise.rule import RULE

TEMPLATE = Template(RULE, pointwise, blocks=terms.flat_blocks)
