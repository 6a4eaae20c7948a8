"""Integer polynomials over a dynamic bundle's dimensions, and lifting them.

A dynamic bundle is one plan for every binding of its dimensions (``batch``,
``seq``) in their ranges.  Its shapes, attributes and the numbers in its
kernels are functions of the binding: ``batch * seq`` rows, ``64 * seq``
elements, ``seq * seq`` scores.  :class:`Poly` is such a function, a
polynomial with integer coefficients, evaluated at a binding and printed as
Python source over the dimensions' code names (``dim0``, ``dim1``).

:class:`Grid` finds one from values: the pipeline runs at the bindings of a
grid (up to three values per dimension), and ``Grid.lift`` interpolates the
values seen there (tensor-product Lagrange, exact in fractions), so a
number that is a polynomial of degree at most two in each dimension is
recovered exactly.  Anything else (a ceiling, a power of two, a coefficient
that is not an integer) is a :class:`NotLifted` with the reason; the callers
also check every lifted value at bindings off the grid (the range's MIN, OPT
and MAX), so a wrong fit is caught, not trusted.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

Monomial = tuple[int, ...]  # the exponent of each dimension


@dataclass(frozen=True)
class NotLifted:
    """No polynomial gives these values; ``reason`` says why in one line."""

    reason: str


@dataclass(frozen=True)
class Poly:
    """``sum(c * prod(dim_i ** e_i))`` over ``terms`` ((exponents, c), sorted,
    no zero coefficient).  A constant has the one term ``((0, ..., 0), c)``
    or none (zero)."""

    terms: tuple[tuple[Monomial, int], ...]

    @staticmethod
    def const(value: int, rank: int) -> Poly:
        return Poly((((0,) * rank, int(value)),) if value else ())

    @property
    def is_const(self) -> bool:
        return all(not any(e) for e, _ in self.terms)

    @property
    def value(self) -> int:
        """The constant's value (ValueError when it depends on a dimension)."""
        if not self.is_const:
            raise ValueError("not a constant")
        return sum(c for _, c in self.terms)

    def __call__(self, binding: Sequence[int]) -> int:
        total = 0
        for exps, c in self.terms:
            term = c
            for v, e in zip(binding, exps):
                term *= v**e
            total += term
        return total

    def source(self, names: Sequence[str]) -> str:
        """Python source: ``3 * dim0 * dim1 + 2`` (atomic when one name or a number)."""
        parts = []
        for exps, c in sorted(self.terms, key=lambda t: (-sum(t[0]), t[0])):
            factors = [n for n, e in zip(names, exps) for _ in range(e)]
            mag = abs(c)
            body = " * ".join(([str(mag)] if mag != 1 or not factors else []) + factors)
            parts.append(("-" if c < 0 else "+", body))
        if not parts:
            return "0"
        text = ("-" if parts[0][0] == "-" else "") + parts[0][1]
        for sign, body in parts[1:]:
            text += f" {sign} {body}"
        return text

    def to_json(self) -> list:
        return [[list(e), c] for e, c in self.terms]

    @staticmethod
    def from_json(data, rank: int, where: str) -> Poly:
        def whole(x) -> int:
            if type(x) is not int:
                raise ValueError
            return x

        try:
            terms = tuple(sorted((tuple(whole(x) for x in e), whole(c)) for e, c in data))
        except (TypeError, ValueError):
            raise ValueError(f"{where}: not a polynomial with integer coefficients") from None
        if any(len(e) != rank or min(e, default=0) < 0 or max(e, default=0) > 2 for e, _ in terms):
            raise ValueError(f"{where}: a polynomial term of the wrong shape")
        return Poly(tuple((e, c) for e, c in terms if c))


@dataclass(frozen=True)
class Grid:
    """The bindings the pipeline runs at: every combination of ``values``
    (one tuple per dimension, at most three distinct values each)."""

    values: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        for v in self.values:
            if not 1 <= len(v) <= 3 or len(set(v)) != len(v):
                raise ValueError(f"grid values {v}: one to three distinct values per dimension")

    @property
    def rank(self) -> int:
        return len(self.values)

    @property
    def points(self) -> tuple[tuple[int, ...], ...]:
        return tuple(itertools.product(*self.values))

    def lift(self, seen: Mapping[tuple[int, ...], int] | Sequence[int]) -> Poly | NotLifted:
        """The polynomial taking ``seen[p]`` at each point ``p`` (a sequence is
        in ``points`` order).  NotLifted when a coefficient is not an integer."""
        ys = [seen[p] for p in self.points] if isinstance(seen, Mapping) else list(seen)
        if len(set(ys)) == 1:
            return Poly.const(ys[0], self.rank)
        coeffs = _solve(self.values, [Fraction(y) for y in ys])
        terms = []
        for exps, c in zip(itertools.product(*(range(len(v)) for v in self.values)), coeffs):
            if c.denominator != 1:
                shown = ", ".join(str(y) for y in ys[:6])
                return NotLifted(
                    f"values {shown}{', ...' if len(ys) > 6 else ''} are no "
                    f"polynomial with integer coefficients"
                )
            if c:
                terms.append((exps, int(c)))
        return Poly(tuple(sorted(terms)))


def _solve(values: Sequence[Sequence[int]], ys: list[Fraction]) -> list[Fraction]:
    """Coefficients (monomials in ``itertools.product`` order) of the
    interpolating polynomial: the inverse Vandermonde of each dimension
    applied along its axis of the grid."""
    shape = [len(v) for v in values]
    coeffs = ys
    for axis, vals in enumerate(values):
        inv = _inverse_vandermonde(vals)
        n = shape[axis]
        inner = 1
        for s in shape[axis + 1 :]:
            inner *= s
        out = [Fraction(0)] * len(coeffs)
        for base in range(len(coeffs)):
            i = (base // inner) % n
            if i:
                continue
            column = [coeffs[base + j * inner] for j in range(n)]
            for e in range(n):
                out[base + e * inner] = sum((inv[e][j] * column[j] for j in range(n)), Fraction(0))
        coeffs = out
    return coeffs


def _inverse_vandermonde(vals: Sequence[int]) -> list[list[Fraction]]:
    """``inv`` with ``sum_j inv[e][j] * y_j`` the coefficient of ``x**e`` of
    the polynomial through ``(vals[j], y_j)``."""
    n = len(vals)
    m = [
        [Fraction(v) ** e for e in range(n)] + [Fraction(int(r == i)) for r in range(n)]
        for i, v in enumerate(vals)
    ]
    for col in range(n):
        pivot = next(r for r in range(col, n) if m[r][col] != 0)
        m[col], m[pivot] = m[pivot], m[col]
        p = m[col][col]
        m[col] = [x / p for x in m[col]]
        for r in range(n):
            if r != col and m[r][col] != 0:
                f = m[r][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col])]
    # m = [I | V^-1] with V[i][e] = vals[i] ** e, so coeffs = V^-1 @ y
    return [row[n:] for row in m]
