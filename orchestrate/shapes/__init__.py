"""Symbolic shapes: dimension ranges, affine dimension expressions, and
shape inference over an ONNX model whose dimensions are symbols.

This is the first stage only: nothing in planning, emission or the runner
reads it yet.  ``orchestrate inspect --shape x=1..8x2..64`` shows it.
"""

from orchestrate.shapes.affine import Affine, NotAffine
from orchestrate.shapes.dims import DimRange, parse_dim, parse_range_shape

__all__ = ["Affine", "DimRange", "NotAffine", "parse_dim", "parse_range_shape"]
