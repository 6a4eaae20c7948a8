"""The low_rank template's roles: what its kernel computes, named."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrate.kernels.spec import Anchored

NAME = "low_rank"


@dataclass(frozen=True)
class LowRank(Anchored):
    """A low-rank side branch folded into its matmul (``templates/low_rank/rule.py``):
    Y = [x | alpha (x @ A)[:, :rank]] @ [W ; B[:rank]] + P's adds.
    ``anchor``: C = x @ W; no prologue; ``epilogue``: P's adds, the join and
    the nodes after it (graph order), as a matmul's epilogue (the spec's
    renaming and the matmul cost and fit models read it as an ``Anchored``)."""

    x: str = ""  # the activation both x @ W and x @ A read
    down: str = ""  # T = x @ A
    up: str = ""  # U = T @ B
    scaling: tuple[str, ...] = ()  # U's scalar-constant MUL / DIV nodes: their product is alpha
    main: str = ""  # P: C or its last add, what the join adds the low-rank term to
    join: str = ""  # Y = P + alpha U
    rank: int = 0  # r: the concatenation's extra K columns

    @property
    def block_r(self) -> int:
        """The rank padded to a power of two of at least 16 (tl.dot's minimum)."""
        return max(16, 1 << max(0, self.rank - 1).bit_length())

    @property
    def main_path(self) -> tuple[str, ...]:
        """P's adds: the epilogue nodes before the join."""
        return self.epilogue[: self.epilogue.index(self.join)]

    def structure(self, local: Mapping[str, int], ext: Mapping[str, int]) -> str:
        """The branch's matmuls and scales, the join, and the rank."""
        parts = (self.down, self.up, *self.scaling, self.main, self.join)
        return "lr" + ",".join(str(local.get(t, "-")) for t in parts) + f":r{self.rank}"
