"""Shapes as symbols: dimension ranges (``dims.py``), dimension expressions
(``poly.py``), dimensions carried through the pipeline as symbols
(``symint.py``), a model's inputs bound to them (``binding.py``), symbolic
shape inference over the ONNX graph (``infer.py``, ``ops.py``; it gives the
frontend's folded shapes their formulas, and ``orchestrate inspect --shape
x=1..8x2..64`` shows it), and the family of primitive graphs over a range
(``family.py``).
"""

from orchestrate.shapes.dims import DimRange, parse_dim, parse_range_shape
from orchestrate.shapes.poly import NotExact, Poly

__all__ = ["DimRange", "NotExact", "Poly", "parse_dim", "parse_range_shape"]
