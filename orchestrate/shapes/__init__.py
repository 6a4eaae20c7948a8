"""Shapes as symbols: dimension ranges (``dims.py``), affine dimension
expressions (``affine.py``), a model's inputs bound to them (``binding.py``),
symbolic shape inference over the ONNX graph (``infer.py``, ``ops.py``; shown
by ``orchestrate inspect --shape x=1..8x2..64``, not read by planning), and
the family of primitive graphs over a range (``family.py``, ``probes.py``,
``poly.py``).
"""

from orchestrate.shapes.affine import Affine, NotAffine
from orchestrate.shapes.dims import DimRange, parse_dim, parse_range_shape

__all__ = ["Affine", "DimRange", "NotAffine", "parse_dim", "parse_range_shape"]
