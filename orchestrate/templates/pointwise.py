"""The pointwise template: elementwise and layout primitives, one program per
``BLOCK`` output elements."""

from __future__ import annotations

from orchestrate.cost import terms
from orchestrate.emit.pointwise import pointwise
from orchestrate.kernels.pointwise import POINTWISE_RULE
from orchestrate.templates.base import Template

TEMPLATE = Template(POINTWISE_RULE, pointwise, blocks=terms.flat_blocks)
