"""Affine dimension expressions: ``c0 + c1*s1 + ... + cn*sn`` over named symbols.

Immutable and canonical (terms sorted by symbol, no zero coefficients), so
two expressions are equal exactly when ``==`` says so and print the same.
Adding, subtracting and scaling by an integer always give an Affine;
multiplying two non-constant expressions or dividing inexactly does not, and
gives a :class:`NotAffine` with the reason instead.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrate.shapes.dims import DimRange


@dataclass(frozen=True)
class NotAffine:
    """A result that has no affine form; ``reason`` says why in one line."""

    reason: str


@dataclass(frozen=True)
class Affine:
    const: int = 0
    terms: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def of(value: Affine | int | str) -> Affine:
        """An int is a constant, a str a symbol."""
        if isinstance(value, Affine):
            return value
        if isinstance(value, str):
            return Affine(0, ((value, 1),))
        return Affine(int(value))

    @staticmethod
    def _make(const: int, coeffs: Mapping[str, int]) -> Affine:
        return Affine(const, tuple(sorted((s, c) for s, c in coeffs.items() if c)))

    @property
    def is_const(self) -> bool:
        return not self.terms

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for s, _ in self.terms)

    def __add__(self, other: Affine | int) -> Affine:
        other = Affine.of(other)
        coeffs = dict(self.terms)
        for s, c in other.terms:
            coeffs[s] = coeffs.get(s, 0) + c
        return Affine._make(self.const + other.const, coeffs)

    __radd__ = __add__

    def __neg__(self) -> Affine:
        return Affine(-self.const, tuple((s, -c) for s, c in self.terms))

    def __sub__(self, other: Affine | int) -> Affine:
        return self + -Affine.of(other)

    def __rsub__(self, other: Affine | int) -> Affine:
        return Affine.of(other) + -self

    def __mul__(self, k: int) -> Affine:
        if not isinstance(k, int) or isinstance(k, bool):
            return NotImplemented
        return Affine._make(self.const * k, {s: c * k for s, c in self.terms})

    __rmul__ = __mul__

    def times(self, other: Affine | int) -> Affine | NotAffine:
        """The product, when one side is a constant."""
        other = Affine.of(other)
        if other.is_const:
            return self * other.const
        if self.is_const:
            return other * self.const
        return NotAffine(f"({self}) * ({other}) is a product of symbols")

    def floordiv(self, k: Affine | int) -> Affine | NotAffine:
        """``self // k`` for a constant ``k``: exact for every binding, or a
        constant; anything else has no affine form."""
        k = Affine.of(k)
        if not k.is_const:
            return NotAffine(f"({self}) / ({k}) divides by a symbol")
        d = k.const
        if d == 0:
            return NotAffine(f"({self}) / 0 divides by zero")
        if self.is_const:
            return Affine(self.const // d)
        if self.const % d or any(c % d for _, c in self.terms):
            return NotAffine(f"({self}) / {d} is not exact for every value of its symbols")
        return Affine._make(self.const // d, {s: c // d for s, c in self.terms})

    def evaluate(self, binding: Mapping[str, int]) -> int:
        """The value with each symbol replaced by ``binding[symbol]``."""
        return self.const + sum(c * binding[s] for s, c in self.terms)

    def bounds(self, ranges: Mapping[str, DimRange]) -> tuple[int, int]:
        """(smallest, largest) value over the declared ranges of its symbols."""
        lo = hi = self.const
        for s, c in self.terms:
            r = ranges[s]
            lo += c * (r.min if c > 0 else r.max)
            hi += c * (r.max if c > 0 else r.min)
        return lo, hi

    def __str__(self) -> str:
        parts = []
        for s, c in self.terms:
            mag = s if abs(c) == 1 else f"{abs(c)}*{s}"
            parts.append(("- " if c < 0 else "+ ") + mag)
        if self.const or not parts:
            parts.append(("- " if self.const < 0 else "+ ") + str(abs(self.const)))
        text = " ".join(parts)
        return text[2:] if text.startswith("+ ") else "-" + text[2:]


def parse_affine(text: str) -> Affine | None:
    """A dimension written as an affine expression of symbols (``past + 1``,
    ``2*s0``, ``s0 + s1 - 1``, as exporters write a dim_param), or None when
    ``text`` is not one: integers, names, ``+``, ``-``, ``*`` by an integer
    and parentheses only."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    value = _affine_of(tree)
    return value if isinstance(value, Affine) else None


def _affine_of(node: ast.AST) -> Affine | None:
    if isinstance(node, ast.Name):
        return Affine.of(node.id)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Affine.of(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _affine_of(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        a, b = _affine_of(node.left), _affine_of(node.right)
        if a is None or b is None:
            return None
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        product = a.times(b)
        return product if isinstance(product, Affine) else None
    return None


def expression_of(dim_param: str, symbols: set[str] | frozenset[str]) -> Affine | None:
    """``dim_param`` as an affine expression of ``symbols`` (``past + 1``,
    where ``past`` names a dimension elsewhere or is given a range), or None
    for a plain name: a name that merely contains ``-`` (``seq-len``) is one."""
    e = parse_affine(dim_param)
    if e is None or e.is_const or e == Affine.of(dim_param) or not e.symbols <= symbols:
        return None
    return e


def plain_names(dim_params) -> set[str]:
    """The dim_params that are names, which expressions may use."""
    return {p for p in dim_params if p.isidentifier()}
