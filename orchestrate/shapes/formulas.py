"""The formulas of a prepared model's tensors, as fission reads them.

For a range, the frontend prepares the model at the hint binding of its
dimensions (``shapes/hints.py``): shapes become numbers and shape
arithmetic (``Shape -> Gather -> Concat -> Reshape``) folds to constants.
Symbolic shape inference over the same model (``shapes/infer.py``) gives
each tensor's shape, and each small integer tensor's values, as formulas of
the dimensions.  :class:`Formulas` hands them to fission by tensor name, as
SymInts valued at the hint, after checking that each formula gives there
the number the frontend made: the graph inputs' shapes, a folded constant's
shape (a causal mask of ``seq x seq``) and a folded constant's values (a
reshape target ``[batch*seq, 64]``, ``x.shape[1]`` as a float).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrate import text
from orchestrate.errors import InputError
from orchestrate.shapes.rules import Value
from orchestrate.shapes.symint import Symbols, sym


@dataclass(frozen=True)
class Formulas:
    """``tensors``: what inference found, by ONNX tensor name (see the module doc)."""

    symbols: Symbols
    tensors: Mapping[str, Value]
    source: str

    def shape(self, name: str, dims: Sequence[int]) -> tuple[int, ...]:
        """``dims`` (tensor ``name``'s shape at the hint) with each dimension
        that is a formula as a SymInt."""
        v = self.tensors.get(name)
        if v is None or len(v.shape) != len(dims):
            return tuple(int(d) for d in dims)
        out = []
        for k, (p, d) in enumerate(zip(v.shape, dims)):
            if p.evaluate(self.symbols.hint) != d:
                raise InputError(
                    f"{self.source}: tensor '{text.shown(name)}' axis {k} is {d} at "
                    f"{self._hint()}, where its formula {text.shown(str(p))} gives "
                    f"{p.evaluate(self.symbols.hint)}"
                )
            out.append(sym(p, self.symbols))
        return tuple(out)

    def values(self, name: str, arr: np.ndarray) -> tuple[int, ...] | None:
        """The values of constant ``name`` (``arr``, at the hint) where they
        are formulas, flat; None where none is."""
        v = self.tensors.get(name)
        if v is None or v.data is None or len(v.data) != arr.size:
            return None
        if all(p.is_const for p in v.data):
            return None
        flat = arr.reshape(-1)
        for k, p in enumerate(v.data):
            if p.evaluate(self.symbols.hint) != flat[k]:
                return None  # not what inference says: the check at MIN and MAX decides
        return tuple(sym(p, self.symbols) for p in v.data)

    def _hint(self) -> str:
        return ", ".join(f"{text.shown(s)}={v}" for s, v in self.symbols.hint.items())
