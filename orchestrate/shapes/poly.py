"""Dimension expressions: polynomials with integer coefficients over named symbols.

A dimension of a range bundle is a number or a formula of the symbols the
user gave ranges to: ``batch``, ``seq``, ``batch*seq`` rows, ``seq + 1``
keys after a decode step, ``3*hidden``.  :class:`Poly` is such a formula:
immutable and canonical (monomials sorted, no zero coefficient), so two
expressions are equal exactly when ``==`` says so and print the same.

Adding, subtracting and multiplying always give a Poly.  Dividing gives
one only where the quotient is exact for every value of the symbols
(``(6*seq) // 3``, ``(batch*seq*64) // (batch*64)``); anything else is a
:class:`NotExact` with the reason, which callers turn into a refusal.
``bounds`` is interval arithmetic over the symbols' ranges, so a question
such as "is ``seq - 1`` ever negative" is answered for the whole range.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrate.shapes.dims import DimRange

Monomial = tuple[tuple[str, int], ...]  # (symbol, exponent), sorted by symbol; () is 1


@dataclass(frozen=True)
class NotExact:
    """A result that is no polynomial with integer coefficients; ``reason`` in one line."""

    reason: str


@dataclass(frozen=True)
class Poly:
    """``sum(c * prod(s ** e))`` over ``terms`` ((monomial, c), sorted, no zero c)."""

    terms: tuple[tuple[Monomial, int], ...] = ()

    # -- making --------------------------------------------------------------------

    @staticmethod
    def of(value: Poly | int | str) -> Poly:
        """An int is a constant, a str a symbol."""
        if isinstance(value, Poly):
            return value
        if isinstance(value, str):
            return Poly(((((value, 1),), 1),))
        value = int(value)
        return Poly((((), value),)) if value else Poly()

    @staticmethod
    def _make(coeffs: Mapping[Monomial, int]) -> Poly:
        return Poly(tuple(sorted((m, c) for m, c in coeffs.items() if c)))

    # -- reading -------------------------------------------------------------------

    @property
    def is_const(self) -> bool:
        return all(not m for m, _ in self.terms)

    @property
    def const(self) -> int:
        """The constant term (the value, for a constant)."""
        return next((c for m, c in self.terms if not m), 0)

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for m, _ in self.terms for s, _ in m)

    @property
    def linear(self) -> tuple[tuple[str, int], ...] | None:
        """((symbol, coefficient), ...) when every term has degree one or zero, else None."""
        out = []
        for m, c in self.terms:
            if len(m) > 1 or (m and m[0][1] != 1):
                return None
            if m:
                out.append((m[0][0], c))
        return tuple(out)

    # -- arithmetic ----------------------------------------------------------------

    def __add__(self, other: Poly | int) -> Poly:
        other = Poly.of(other)
        coeffs = dict(self.terms)
        for m, c in other.terms:
            coeffs[m] = coeffs.get(m, 0) + c
        return Poly._make(coeffs)

    __radd__ = __add__

    def __neg__(self) -> Poly:
        return Poly(tuple((m, -c) for m, c in self.terms))

    def __sub__(self, other: Poly | int) -> Poly:
        return self + -Poly.of(other)

    def __rsub__(self, other: Poly | int) -> Poly:
        return Poly.of(other) + -self

    def __mul__(self, other: Poly | int) -> Poly:
        if isinstance(other, bool) or not isinstance(other, (Poly, int)):
            return NotImplemented
        other = Poly.of(other)
        coeffs: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = _times(m1, m2)
                coeffs[m] = coeffs.get(m, 0) + c1 * c2
        return Poly._make(coeffs)

    __rmul__ = __mul__

    def floordiv(self, divisor: Poly | int) -> Poly | NotExact:
        """``self // divisor`` where it is exact for every value of the
        symbols, or a constant; NotExact otherwise.  A divisor must be one
        term (``64``, ``batch*64``) or an expression equal to the whole."""
        d = Poly.of(divisor)
        if not d.terms:
            return NotExact(f"({self}) / 0 divides by zero")
        shown = str(d) if d.is_const or len(d.terms) == 1 and d.terms[0][1] == 1 else f"({d})"
        if self.is_const and d.is_const:
            return Poly.of(self.const // d.const)
        if d == self:
            return Poly.of(1)
        if len(d.terms) != 1:
            return NotExact(f"({self}) / {shown} divides by a sum")
        ((dm, dc),) = d.terms
        coeffs: dict[Monomial, int] = {}
        for m, c in self.terms:
            rest = _over(m, dm)
            if rest is None or c % dc:
                return NotExact(f"({self}) / {shown} is not exact for every value of its symbols")
            coeffs[rest] = c // dc
        return Poly._make(coeffs)

    # -- values ------------------------------------------------------------------------

    def evaluate(self, binding: Mapping[str, int]) -> int:
        """The value with each symbol replaced by ``binding[symbol]``."""
        total = 0
        for m, c in self.terms:
            term = c
            for s, e in m:
                term *= binding[s] ** e
            total += term
        return total

    def substitute(self, values: Mapping[str, int]) -> Poly:
        """``self`` with the symbols ``values`` names replaced by their values."""
        out = Poly()
        for m, c in self.terms:
            term = Poly.of(c)
            for s, e in m:
                term = term * (Poly.of(values[s] ** e) if s in values else Poly.of(s) ** e)
            out = out + term
        return out

    def __pow__(self, k: int) -> Poly:
        out = Poly.of(1)
        for _ in range(k):
            out = out * self
        return out

    def bounds(self, ranges: Mapping[str, DimRange]) -> tuple[int, int]:
        """(smallest, largest) value over the ranges of its symbols: interval
        arithmetic, term by term, so exact for sums of monomials in distinct
        symbols and never narrower than the truth."""
        lo = hi = 0
        for m, c in self.terms:
            a, b = 1, 1
            for s, e in m:
                r = ranges[s]
                ends = (r.min**e, r.max**e)
                if e % 2 == 0 and r.min < 0 < r.max:
                    ends = (0, max(ends))
                candidates = (a * ends[0], a * ends[1], b * ends[0], b * ends[1])
                a, b = min(candidates), max(candidates)
            lo += min(c * a, c * b)
            hi += max(c * a, c * b)
        return lo, hi

    # -- text ------------------------------------------------------------------------------

    def __str__(self) -> str:
        """``2*batch*seq + seq - 1``: the model's symbol names (messages escape them)."""
        return self._text("*", lambda s: s)

    def source(self, codes: Mapping[str, str]) -> str:
        """Python source over the symbols' code names: ``2 * dim0 * dim1 + dim1 - 1``."""
        return self._text(" * ", lambda s: codes[s])

    def _text(self, times: str, name) -> str:
        if not self.terms:
            return "0"
        parts = []
        for m, c in sorted(self.terms, key=lambda t: (-_degree(t[0]), t[0])):
            factors = [name(s) for s, e in m for _ in range(e)]
            body = times.join(([str(abs(c))] if abs(c) != 1 or not factors else []) + factors)
            parts.append(("-" if c < 0 else "+", body))
        text = ("-" if parts[0][0] == "-" else "") + parts[0][1]
        for sign, body in parts[1:]:
            text += f" {sign} {body}"
        return text

    def to_json(self, order: Sequence[str]) -> list:
        """``[[exponents in order], c], ...``: the exponent of each of ``order``'s symbols."""
        return [[[dict(m).get(s, 0) for s in order], c] for m, c in self.terms]

    @staticmethod
    def from_json(data, order: Sequence[str], where: str) -> Poly:
        """The polynomial ``to_json`` wrote; ValueError naming ``where`` otherwise."""
        bad = ValueError(f"{where}: not a polynomial with integer coefficients")
        if not isinstance(data, list):
            raise bad
        coeffs: dict[Monomial, int] = {}
        for term in data:
            if not isinstance(term, list) or len(term) != 2 or not isinstance(term[0], list):
                raise bad
            exps, c = term
            if type(c) is not int or any(type(e) is not int for e in exps):
                raise bad
            if len(exps) != len(order) or min(exps, default=0) < 0 or max(exps, default=0) > 4:
                raise ValueError(f"{where}: a polynomial term of the wrong shape")
            m = tuple((s, e) for s, e in zip(order, exps) if e)
            coeffs[m] = coeffs.get(m, 0) + c
        return Poly._make(coeffs)


def _times(a: Monomial, b: Monomial) -> Monomial:
    exps = dict(a)
    for s, e in b:
        exps[s] = exps.get(s, 0) + e
    return tuple(sorted(exps.items()))


def _over(a: Monomial, b: Monomial) -> Monomial | None:
    """``a / b`` when ``b`` divides ``a``, else None."""
    exps = dict(a)
    for s, e in b:
        left = exps.get(s, 0) - e
        if left < 0:
            return None
        exps[s] = left
    return tuple(sorted((s, e) for s, e in exps.items() if e))


def _degree(m: Monomial) -> int:
    return sum(e for _, e in m)


def product(dims: Sequence[Poly | int]) -> Poly:
    return math.prod((Poly.of(d) for d in dims), start=Poly.of(1))


# -- dimension expressions as exporters write them ------------------------------------


def parse_dim_expression(text: str) -> Poly | None:
    """A dimension written as an expression of symbols (``past + 1``,
    ``2*s0``, ``s0*s1``, as exporters write a dim_param), or None when
    ``text`` is not one: integers, names, ``+``, ``-``, ``*`` and
    parentheses only."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    return _poly_of(tree)


def _poly_of(node: ast.AST) -> Poly | None:
    if isinstance(node, ast.Name):
        return Poly.of(node.id)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Poly.of(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _poly_of(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        a, b = _poly_of(node.left), _poly_of(node.right)
        if a is None or b is None:
            return None
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        return a * b
    return None


def expression_of(dim_param: str, symbols: set[str] | frozenset[str]) -> Poly | None:
    """``dim_param`` as an expression of ``symbols`` (``past + 1``, where
    ``past`` names a dimension elsewhere or is given a range), or None for a
    plain name: a name that merely contains ``-`` (``seq-len``) is one."""
    e = parse_dim_expression(dim_param)
    if e is None or e.is_const or e == Poly.of(dim_param) or not e.symbols <= symbols:
        return None
    return e


def plain_names(dim_params) -> set[str]:
    """The dim_params that are names, which expressions may use."""
    return {p for p in dim_params if p.isidentifier()}
