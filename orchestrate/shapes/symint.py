"""Dimensions as symbols through the pipeline: :class:`SymInt`.

A range bundle is planned from one primitive graph whose dimensions are
symbols.  The frontend and fission run once, at one binding of the
symbols (the *hint*: generic values of their ranges, ``hint_binding``), and
every number that is a dimension of the range travels through them as a
SymInt: an ``int`` whose value is the hint, which also knows its formula
(a :class:`~orchestrate.shapes.poly.Poly` over the symbols) and the
symbols' ranges.  Arithmetic keeps the formula (``batch * seq`` rows,
``seq + 1`` keys); so the type rules, the rules' specs and the generators,
which only ever did arithmetic on dimensions, carry the symbols through to
the generated source, where a SymInt prints as its formula over the
dimensions' code names (``dim0 * dim1``).  This is how a symbolic shape
system with hints works (PyTorch's dynamic shapes, TVM's symbolic shapes),
not a fit of numbers seen at several shapes.

Questions about a SymInt are answered for the whole range where its formula
decides them:

* ``==`` compares formulas: ``batch == 1`` is False even where the range
  holds 1 (code for a general ``batch`` is right at 1 too);
* ``<``, ``<=``, ``bool()`` and an exact ``//`` or ``%`` are decided by the
  bounds of the formula over the ranges (``seq <= 64`` for ``seq`` in 2..64);
* what the formula does not decide falls back to the hint, except inside
  :func:`strict` (emission), where it raises :class:`Undecided`: generated
  code must be right at every binding, so it may not depend on the hint.

Where the symbol is lost (a number that left Python arithmetic through
numpy, or through a frontend fold the symbolic inference could not follow),
the value is a plain int of the hint; the graphs made again at MIN, OPT and
MAX then differ from what the symbolic graph gives there, and the range is
refused naming the node (``plan/ranged.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from orchestrate.shapes.dims import DimRange
from orchestrate.shapes.poly import NotExact, Poly


@dataclass(frozen=True, eq=False)
class Symbols:
    """The symbols of a range: names (the model's), code names in generated
    source (``dim0``, ...), ranges, and the hint binding SymInts carry."""

    names: tuple[str, ...]
    ranges: Mapping[str, DimRange]
    hint: Mapping[str, int]

    @property
    def codes(self) -> dict[str, str]:
        return {n: f"dim{i}" for i, n in enumerate(self.names)}

    def at(self, binding: Sequence[int]) -> dict[str, int]:
        """A binding tuple (in ``names`` order) by name."""
        return dict(zip(self.names, binding))


class Undecided(Exception):
    """A question about a dimension the range does not answer (in :func:`strict`)."""


_STRICT = contextvars.ContextVar("orchestrate_strict_dims", default=False)


@contextlib.contextmanager
def strict() -> Iterator[None]:
    """Within: a question about a SymInt that its formula does not decide
    raises :class:`Undecided` instead of reading the hint."""
    token = _STRICT.set(True)
    try:
        yield
    finally:
        _STRICT.reset(token)


def _undecided(what: str):
    if _STRICT.get():
        raise Undecided(what)


def sym(poly: Poly, symbols: Symbols) -> int:
    """``poly`` as a SymInt, or a plain int when it is a constant."""
    if poly.is_const:
        return poly.const
    return SymInt(poly, symbols)


def _poly(x) -> Poly | None:
    if isinstance(x, SymInt):
        return x.poly
    if isinstance(x, int) and not isinstance(x, bool):
        return Poly.of(int.__int__(x))
    return None


class SymInt(int):
    """An int that is a formula of the range's symbols (see the module doc)."""

    poly: Poly
    symbols: Symbols

    def __new__(cls, poly: Poly, symbols: Symbols, value: int | None = None):
        if value is None:
            value = poly.evaluate(symbols.hint)
        self = int.__new__(cls, value)
        self.poly = poly
        self.symbols = symbols
        return self

    def __reduce__(self):
        return (SymInt, (self.poly, self.symbols, int.__int__(self)))

    # -- what the range says --------------------------------------------------------

    @property
    def bounds(self) -> tuple[int, int]:
        return self.poly.bounds(self.symbols.ranges)

    @property
    def max(self) -> int:
        return self.bounds[1]

    @property
    def min(self) -> int:
        return self.bounds[0]

    def at(self, binding: Mapping[str, int]) -> int:
        return self.poly.evaluate(binding)

    # -- arithmetic keeps the formula -----------------------------------------------

    def _make(self, poly: Poly) -> int:
        return sym(poly, self.symbols)

    def _hint(self, op: str, other, fn):
        _undecided(f"{self} {op} {other!r} is no formula of the dimensions")
        return fn(int.__int__(self), other)

    def __add__(self, other):
        p = _poly(other)
        return self._make(self.poly + p) if p is not None else self._hint("+", other, _add)

    def __radd__(self, other):
        return self.__add__(other)

    def __sub__(self, other):
        p = _poly(other)
        return self._make(self.poly - p) if p is not None else self._hint("-", other, _sub)

    def __rsub__(self, other):
        p = _poly(other)
        return self._make(p - self.poly) if p is not None else self._hint("-", other, _rsub)

    def __mul__(self, other):
        p = _poly(other)
        return self._make(self.poly * p) if p is not None else self._hint("*", other, _mul)

    def __rmul__(self, other):
        return self.__mul__(other)

    def __neg__(self):
        return self._make(-self.poly)

    def __pos__(self):
        return self

    def __abs__(self):
        lo, hi = self.bounds
        if lo >= 0:
            return self
        if hi <= 0:
            return -self
        _undecided(f"the sign of {self} changes over the range")
        return abs(int.__int__(self))

    def __pow__(self, k, mod=None):
        if mod is None and isinstance(k, int) and not isinstance(k, (bool, SymInt)) and k >= 0:
            out = Poly.of(1)
            for _ in range(k):
                out = out * self.poly
            return self._make(out)
        return self._hint("**", k, pow)

    def __floordiv__(self, other):
        p = _poly(other)
        if p is not None:
            q = self.poly.floordiv(p)
            if not isinstance(q, NotExact):
                return self._make(q)
        return self._hint("//", other, _floordiv)

    def __rfloordiv__(self, other):
        p = _poly(other)
        if p is not None:
            q = p.floordiv(self.poly)
            if not isinstance(q, NotExact):
                return self._make(q)
        return self._hint("r//", other, _rfloordiv)

    def __mod__(self, other):
        p = _poly(other)
        if p is not None and not isinstance(self.poly.floordiv(p), NotExact):
            return 0  # an exact quotient leaves nothing over
        return self._hint("%", other, _mod)

    def __rmod__(self, other):
        return self._hint("r%", other, _rmod)

    def __truediv__(self, other):
        return self._hint("/", other, _truediv)

    def __rtruediv__(self, other):
        return self._hint("r/", other, _rtruediv)

    # -- comparisons: the formula, then the range, then (outside strict) the hint -------

    def __eq__(self, other):
        p = _poly(other)
        if p is None:
            return NotImplemented
        return self.poly == p

    def __ne__(self, other):
        p = _poly(other)
        if p is None:
            return NotImplemented
        return self.poly != p

    def __hash__(self):
        return hash(self.poly)

    def _compare(self, other, op: str) -> bool:
        p = _poly(other)
        if p is None:
            return NotImplemented
        lo, hi = (self.poly - p).bounds(self.symbols.ranges)
        yes, no = {
            "<": (hi < 0, lo >= 0),
            "<=": (hi <= 0, lo > 0),
            ">": (lo > 0, hi <= 0),
            ">=": (lo >= 0, hi < 0),
        }[op]
        if yes or no:
            return yes
        _undecided(f"{self} {op} {other} depends on the binding")
        return _OPS[op](int.__int__(self), p.evaluate(self.symbols.hint))

    def __lt__(self, other):
        return self._compare(other, "<")

    def __le__(self, other):
        return self._compare(other, "<=")

    def __gt__(self, other):
        return self._compare(other, ">")

    def __ge__(self, other):
        return self._compare(other, ">=")

    def __bool__(self):
        lo, hi = self.bounds
        if lo > 0 or hi < 0:
            return True
        if lo == hi == 0:
            return False
        _undecided(f"whether {self} is 0 depends on the binding")
        return int.__int__(self) != 0

    # -- leaving the symbols ----------------------------------------------------------

    def __int__(self):
        _undecided(f"{self} is needed as one number")
        return int.__int__(self)

    def __index__(self):
        _undecided(f"{self} is needed as one number")
        return int.__int__(self)

    def __float__(self):
        _undecided(f"{self} is needed as one number")
        return float(int.__int__(self))

    # -- text -------------------------------------------------------------------------

    def __str__(self) -> str:
        """The formula over code names, compact: ``dim0*dim1`` (shapes in comments)."""
        return self.poly._text("*", lambda s: self.symbols.codes[s])

    __repr__ = __str__  # (structural hashes read it: the same at every hint)

    def __format__(self, spec: str) -> str:
        """In source: the formula, parenthesized unless it is one name."""
        if spec:
            _undecided(f"{self} formatted as a number")
            return format(int.__int__(self), spec)
        text = self.poly.source(self.symbols.codes)
        return text if text.isidentifier() else f"({text})"


_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _add(a, b):
    return a + b


def _sub(a, b):
    return a - b


def _rsub(a, b):
    return b - a


def _mul(a, b):
    return a * b


def _floordiv(a, b):
    return a // b


def _rfloordiv(a, b):
    return b // a


def _mod(a, b):
    return a % b


def _rmod(a, b):
    return b % a


def _truediv(a, b):
    return a / b


def _rtruediv(a, b):
    return b / a


def is_symbolic(x) -> bool:
    return isinstance(x, SymInt)


def upper(x: int) -> int:
    """The largest value ``x`` takes over the range (``x`` itself for a number)."""
    return x.max if isinstance(x, SymInt) else x


def lower(x: int) -> int:
    """The smallest value ``x`` takes over the range (``x`` itself for a number)."""
    return x.min if isinstance(x, SymInt) else x
