"""Integer index arithmetic and boolean masks as a small expression tree.

Generators used to paste index text together (``"(offs // 6) % 4"``, ``"i1 * 6 + i2"``) and to
decide things by matching that text.  Here an index is an ``Expr`` tree instead: the smart
constructors (``add``, ``mul``, ``floordiv``, ``mod``, ``lt`` ..., ``and_``, ``minimum``,
``maximum``, ``where``) and the operators on ``Expr`` apply small rewrite rules, in the spirit of
tinygrad's ``uop/symbolic.py``, until nothing changes; ``render`` prints Triton/Python source at
the very end.

Arithmetic has Python semantics (``//`` floors, ``%`` takes the divisor's sign).  Ranges come
from ``Sym``: ``bounds`` propagates them and several rules rely on them, so a rewrite is exact on
every lane whose symbols lie in their declared ranges.  (Triton's integer ``//`` and ``%``
truncate like C; the two agree whenever the dividend is non-negative, as indices are.)

Calling the dataclasses directly (``Add((x, y))``) builds a raw node, untouched; ``simplify``
rebuilds a raw tree through the smart constructors.  The smart constructors expect their
arguments already simplified.  Masks are comparisons and their ``And``; a decided mask is
``Const(True)`` or ``Const(False)``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial

from orchestrate.shapes.symint import SymInt, lower, upper

__all__ = [
    "Expr",
    "Const",
    "Sym",
    "Add",
    "Mul",
    "FloorDiv",
    "Mod",
    "Min",
    "Max",
    "Where",
    "Cmp",
    "And",
    "TRUE",
    "FALSE",
    "as_expr",
    "add",
    "sub",
    "mul",
    "floordiv",
    "mod",
    "minimum",
    "maximum",
    "where",
    "lt",
    "le",
    "ge",
    "gt",
    "eq",
    "ne",
    "and_",
    "is_true",
    "is_false",
    "simplify",
    "bounds",
    "symbolic_bound",
    "children",
    "is_lane_invariant",
    "render",
    "evaluate",
]

_OPS = {
    "<": operator.lt,
    "<=": operator.le,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class Expr:
    """Base of the tree.  Arithmetic operators and ``&`` build simplified nodes; ``==`` stays
    structural equality (use ``eq`` for an equality mask)."""

    __add__ = lambda self, o: add(self, o)
    __radd__ = lambda self, o: add(o, self)
    __sub__ = lambda self, o: sub(self, o)
    __rsub__ = lambda self, o: sub(o, self)
    __mul__ = lambda self, o: mul(self, o)
    __rmul__ = lambda self, o: mul(o, self)
    __floordiv__ = lambda self, o: floordiv(self, o)
    __rfloordiv__ = lambda self, o: floordiv(o, self)
    __mod__ = lambda self, o: mod(self, o)
    __rmod__ = lambda self, o: mod(o, self)
    __neg__ = lambda self: mul(self, -1)
    __and__ = lambda self, o: _conj(self, o)
    __rand__ = lambda self, o: _conj(o, self)


@dataclass(frozen=True)
class Const(Expr):
    """An integer; ``True``/``False`` for a decided mask (equal to 1/0, as in Python)."""

    value: int


@dataclass(frozen=True)
class Sym(Expr):
    """A value already bound in the kernel (a let-bound name, ``offs``, ``rm[:, None]``),
    printed verbatim, so it must be atomic: a name, attribute, subscript or call.  ``[lo, hi)``
    is its range over the lanes that matter (None: unknown); ``lane`` says it may differ
    between the lanes of a block.  ``bound``: an exclusive upper bound that is a formula of a
    range's dimensions (``offs_m < dim1`` on the rows that matter), which ``hi`` can only
    give at its largest; given ``hi`` as a SymInt, the Sym keeps both."""

    name: str
    lo: int | None = None
    hi: int | None = None
    lane: bool = True
    bound: Expr | None = None

    def __post_init__(self) -> None:
        # a bound that is a dimension of a range (a SymInt): its bound over the
        # range, and the formula itself as the symbolic bound
        if isinstance(self.lo, SymInt):
            object.__setattr__(self, "lo", lower(self.lo))
        if isinstance(self.hi, SymInt):
            if self.bound is None:
                object.__setattr__(self, "bound", as_expr(self.hi))
            object.__setattr__(self, "hi", upper(self.hi))
        if self.lo is not None and self.hi is not None and self.lo >= self.hi:
            raise ValueError(f"empty range [{self.lo}, {self.hi}) for {self.name}")


@dataclass(frozen=True)
class Add(Expr):
    """``terms[0] + terms[1] + ...``; simplified: no nested sum, at most one constant, last."""

    terms: tuple[Expr, ...]


@dataclass(frozen=True)
class _Pair(Expr):
    """A node with two operands ``a`` and ``b``."""

    a: Expr
    b: Expr


class Mul(_Pair):
    """``a * b``; a constant factor is always ``b``."""


class FloorDiv(_Pair):
    """``a // b``, rounding toward minus infinity."""


class Mod(_Pair):
    """``a % b``, with the sign of ``b``."""


class Min(_Pair):
    """``tl.minimum(a, b)``."""


class Max(_Pair):
    """``tl.maximum(a, b)``."""


@dataclass(frozen=True)
class Where(Expr):
    """``tl.where(cond, a, b)``."""

    cond: Expr
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Cmp(Expr):
    """``a op b``, a mask; ``op`` is one of ``< <= >= > == !=``."""

    op: str
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown comparison {self.op!r}")


@dataclass(frozen=True)
class And(Expr):
    """``(t0) & (t1) & ...``, a mask that holds where every term does."""

    terms: tuple[Expr, ...]


TRUE, FALSE, ZERO = Const(True), Const(False), Const(0)


def as_expr(x: Expr | int) -> Expr:
    """``x`` itself, an int wrapped in ``Const``, or a dimension of a range
    (a SymInt) as its formula over ``Sym`` code names with their ranges."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, SymInt):
        return _formula(x)
    if isinstance(x, int):
        return Const(x)
    raise TypeError(f"not an index expression: {x!r}")


def _formula(x: SymInt) -> Expr:
    """A SymInt's polynomial, each symbol a lane-invariant ``Sym`` (``dim0``)
    over its range."""
    codes = x.symbols.codes
    total: Expr = ZERO
    for monomial, c in x.poly.terms:
        term: Expr = Const(c)
        for s, e in monomial:
            r = x.symbols.ranges[s]
            for _ in range(e):
                term = mul(term, Sym(codes[s], r.min, r.max + 1, lane=False))
        total = add(total, term)
    return total


def _pos(e: Expr) -> bool:
    return isinstance(e, Const) and e.value > 0


def _split(e: Expr) -> tuple[Expr, int]:
    """``e`` as ``base * k``: the constant factor of a ``Mul``, else 1."""
    if isinstance(e, Mul) and isinstance(e.b, Const):
        return e.a, e.b.value
    return e, 1


def _flatten(cls: type, xs: Iterable[Expr]) -> Iterator[Expr]:
    for x in xs:
        if isinstance(x, cls):
            yield from _flatten(cls, x.terms)
        else:
            yield x


def _bucket(e: Expr, d: int) -> int | None:
    """``q`` when every value of ``e`` lies in ``[q*d, (q+1)*d)``, else None."""
    lo, hi = _range(e)
    return lo // d if lo is not None and hi is not None and lo // d == hi // d else None


def add(*xs: Expr | int) -> Expr:
    """Sum (rules 1, 2, 6): flatten nested sums, fold the constants into one last term, combine
    like terms in first-appearance order (``x*2 + x*3 -> x*5``, ``x - x -> 0``), merge reshape
    round trips; a single term is that term and an empty sum is 0."""
    const, coeffs = 0, {}
    for t in _flatten(Add, map(as_expr, xs)):
        if isinstance(t, Const):
            const += t.value
        else:
            base, k = _split(t)
            coeffs[base] = coeffs.get(base, 0) + k
    items = [(b, k) for b, k in coeffs.items() if k != 0]
    merged = _round_trip(items)
    if merged is not None:
        return add(*merged, const)
    terms = [mul(b, k) for b, k in items] + ([Const(const)] if const else [])
    if len(terms) <= 1:
        return terms[0] if terms else ZERO
    return Add(tuple(terms))


def _round_trip(items: list[tuple[Expr, int]]) -> list[Expr] | None:
    """Rule 6: ``(x // d) * (d*s) + (x % d) * s -> x * s``, and the same with ``x // d % m`` in
    place of ``x // d``, which gives ``(x % (d*m)) * s``.  The merged term takes the place of
    the first of the pair; None when no pair matches."""
    for n, (m, s) in enumerate(items):
        if not (isinstance(m, Mod) and _pos(m.b)):
            continue
        div = FloorDiv(m.a, m.b)
        for q, (f, c) in enumerate(items):
            if c != m.b.value * s:
                continue
            if f == div:
                whole = m.a
            elif isinstance(f, Mod) and _pos(f.b) and f.a == div:
                whole = mod(m.a, m.b.value * f.b.value)
            else:
                continue
            rest = [mul(b, k) for i, (b, k) in enumerate(items) if i not in (n, q)]
            rest.insert(min(n, q), mul(whole, s))
            return rest
    return None


def sub(a: Expr | int, b: Expr | int) -> Expr:
    """``a - b``, that is ``a + b * -1``."""
    return add(a, mul(b, -1))


def mul(a: Expr | int, b: Expr | int) -> Expr:
    """Product (rules 1, 3): fold constants, ``x * 0 -> 0``, ``x * 1 -> x``, a constant goes
    right (``3 * x`` is ``x * 3``), ``(x * a) * b -> x * (a*b)``, a constant distributes over a
    sum (``(x + 2) * 3 -> x * 3 + 6``), and constant factors of non-constant operands are pulled
    out (``(x * 2) * y -> (x * y) * 2``)."""
    a, b = as_expr(a), as_expr(b)
    if isinstance(a, Const) and not isinstance(b, Const):
        a, b = b, a
    if isinstance(b, Const):
        k = b.value
        if isinstance(a, Const):
            return Const(a.value * k)
        if k == 0:
            return ZERO
        if k == 1:
            return a
        if isinstance(a, Mul) and isinstance(a.b, Const):
            return mul(a.a, a.b.value * k)
        if isinstance(a, Add):
            return add(*(mul(t, k) for t in a.terms))
        return Mul(a, b)
    (ca, ka), (cb, kb) = _split(a), _split(b)
    if ka != 1 or kb != 1:
        return mul(Mul(ca, cb), ka * kb)
    return Mul(a, b)


def floordiv(a: Expr | int, b: Expr | int) -> Expr:
    """Floor division (rules 1, 4): fold constants, ``x // 1 -> x``, ``0 // x -> 0``; by a
    positive constant ``d``: a constant when ``bounds`` put ``x`` in one bucket of ``d`` (so
    ``x // d -> 0`` for ``x`` in ``[0, d)``), ``(x * k) // d -> x * (k // d)`` when ``d | k``
    and ``x // (d // k)`` when ``k | d``, ``(x // a) // d -> x // (a*d)``, and a sum splits
    off its terms whose factor is a multiple of ``d`` when the rest lies in one bucket
    (``(i * 6 + j) // 6 -> i`` for ``j`` in ``[0, 6)``)."""
    a, b = as_expr(a), as_expr(b)
    if isinstance(a, Const) and isinstance(b, Const) and b.value != 0:
        return Const(a.value // b.value)
    if b == Const(1) or a == ZERO:
        return a
    if not _pos(b):
        split = _by_symbol(a, b)
        return add(*split[0]) if split is not None else FloorDiv(a, b)
    d = b.value
    if (q := _bucket(a, d)) is not None:
        return Const(q)
    if isinstance(a, Mul) and isinstance(a.b, Const):
        if a.b.value % d == 0:
            return mul(a.a, a.b.value // d)
        if a.b.value > 0 and d % a.b.value == 0:
            return floordiv(a.a, d // a.b.value)
    if isinstance(a, FloorDiv) and _pos(a.b):
        return floordiv(a.a, a.b.value * d)
    if isinstance(a, Add):
        whole = [_split(t) for t in a.terms if isinstance(t, Mul) and _split(t)[1] % d == 0]
        rest = [t for t in a.terms if not (isinstance(t, Mul) and _split(t)[1] % d == 0)]
        if whole and (q := _bucket(add(*rest), d)) is not None:
            return add(*(mul(x, k // d) for x, k in whole), q)
    return FloorDiv(a, b)


def mod(a: Expr | int, b: Expr | int) -> Expr:
    """Modulo (rules 1, 5): fold constants, ``x % 1 -> 0``, ``0 % x -> 0``; by a positive
    constant ``d``: ``x % d -> x - q*d`` when ``bounds`` put ``x`` in bucket ``q`` (so
    ``x % d -> x`` for ``x`` in ``[0, d)``), ``(x * k) % d -> 0`` when ``d | k``,
    ``(x % a) % d -> x % d`` when ``d | a``, and a sum drops its terms whose factor is a
    multiple of ``d`` and reduces its constant mod ``d`` (``(i * 6 + j) % 6 -> j % 6``)
    where what is left cannot be negative (Triton's ``%`` truncates)."""
    a, b = as_expr(a), as_expr(b)
    if isinstance(a, Const) and isinstance(b, Const) and b.value != 0:
        return Const(a.value % b.value)
    if b == Const(1) or a == ZERO:
        return ZERO
    if not _pos(b):
        split = _by_symbol(a, b)
        return split[1] if split is not None else Mod(a, b)
    d = b.value
    if (q := _bucket(a, d)) is not None:
        return sub(a, q * d)
    if isinstance(a, Mul) and isinstance(a.b, Const) and a.b.value % d == 0:
        return ZERO
    if isinstance(a, Mod) and _pos(a.b) and a.b.value % d == 0:
        return mod(a.a, d)
    if isinstance(a, Add):
        kept = [
            Const(t.value % d) if isinstance(t, Const) else t
            for t in a.terms
            if not (isinstance(t, Mul) and _split(t)[1] % d == 0)
        ]
        rest = add(*kept)
        # only onto a dividend that stays non-negative: the kernel's ``%``
        # truncates (C), which agrees with Python's only there
        low = bounds(rest)[0]
        signed = any(_split(t)[1] < 0 for t in kept if not isinstance(t, Const))
        if kept != list(a.terms) and (low >= 0 if low is not None else not signed):
            return mod(rest, d)
    return Mod(a, b)


def _factors(e: Expr) -> tuple[list[Expr], int]:
    """``e`` as a product: its non-constant factors and its constant."""
    if isinstance(e, Const):
        return [], e.value
    if isinstance(e, Mul):
        (fa, ka), (fb, kb) = _factors(e.a), _factors(e.b)
        return fa + fb, ka * kb
    return [e], 1


def _quotient(t: Expr, b: Expr) -> Expr | None:
    """``t / b`` when ``t`` is a multiple of ``b`` as written (``x * dim1 * 64`` of
    ``dim1 * 64``), else None."""
    (ft, kt), (fb, kb) = _factors(t), _factors(b)
    if kb == 0 or kt % kb:
        return None
    rest = list(ft)
    for f in fb:
        if f not in rest:
            return None
        rest.remove(f)
    out: Expr = Const(kt // kb)
    for f in rest:
        out = mul(out, f)
    return out


def _top(e: Expr) -> Expr | None:
    """The largest value of ``e`` as an expression of the dimensions' symbols: a ``Sym``
    with a symbolic ``bound`` gives ``bound - 1``; None where not known."""
    if isinstance(e, Const):
        return e
    if isinstance(e, Sym):
        if e.bound is not None:
            return sub(e.bound, 1)
        return None if e.hi is None else Const(e.hi - 1)
    if isinstance(e, Add):
        tops = [_top(t) for t in e.terms]
        return None if None in tops else add(*tops)
    if isinstance(e, Mul) and isinstance(e.b, Const) and e.b.value >= 0:
        top = _top(e.a)
        return None if top is None else mul(top, e.b.value)
    lo, hi = _range(e)
    return None if hi is None else Const(hi)


def symbolic_bound(e: Expr) -> Expr | None:
    """An exclusive upper bound of ``e`` that is a formula of a range's dimensions
    (``dim1 * 64`` for ``offs_m * 64 + offs_d``, ``offs_m < dim1``, ``offs_d < 64``);
    None where the numeric bound says as much."""
    top = _top(e)
    return None if top is None or isinstance(top, Const) else add(top, 1)


def _by_symbol(a: Expr, b: Expr) -> tuple[list[Expr], Expr] | None:
    """(the quotient's terms, the remainder) of ``a`` by a divisor that is a formula of
    the dimensions, when every term of ``a`` but a remainder ``r`` is a multiple of ``b``
    and ``0 <= r < b`` wherever the symbols are in range (``(b1 * dim1 + offs_m) // dim1
    -> b1`` for ``offs_m`` in ``[0, dim1)``); None otherwise."""
    if _range(b)[0] is None or _range(b)[0] < 1:
        return None
    quotients, rest = [], []
    for t in _flatten(Add, [a]):
        q = _quotient(t, b)
        if q is None:
            rest.append(t)
        else:
            quotients.append(q)
    if not quotients:
        return None
    r = add(*rest)
    top = _top(r)
    if _range(r)[0] is None or _range(r)[0] < 0 or top is None:
        return None
    margin = _range(sub(b, top))[0]
    if margin is None or margin < 1:
        return None
    return quotients, r


def minimum(a: Expr | int, b: Expr | int) -> Expr:
    """``tl.minimum`` (rules 1, 8): an operand that ``bounds`` show is never larger (constants
    fold, ``tl.minimum(x, 7) -> x`` when ``x < 8``)."""
    a, b = as_expr(a), as_expr(b)
    (alo, ahi), (blo, bhi) = _range(a), _range(b)
    if a == b or (ahi is not None and blo is not None and ahi <= blo):
        return a
    if bhi is not None and alo is not None and bhi <= alo:
        return b
    return Min(a, b)


def maximum(a: Expr | int, b: Expr | int) -> Expr:
    """``tl.maximum`` (rules 1, 8): an operand that ``bounds`` show is never smaller."""
    a, b = as_expr(a), as_expr(b)
    (alo, ahi), (blo, bhi) = _range(a), _range(b)
    if a == b or (alo is not None and bhi is not None and alo >= bhi):
        return a
    if blo is not None and ahi is not None and blo >= ahi:
        return b
    return Max(a, b)


def where(cond: Expr, a: Expr | int, b: Expr | int) -> Expr:
    """``tl.where`` (rule 8): a constant condition picks its branch; equal branches are one."""
    cond, a, b = as_expr(cond), as_expr(a), as_expr(b)
    if isinstance(cond, Const):
        return a if cond.value else b
    return a if a == b else Where(cond, a, b)


def _cmp(op: str, a: Expr | int, b: Expr | int) -> Expr:
    """A comparison (rules 1, 7), decided by the bounds of ``a - b`` when they allow: ``i < 8``
    is True for ``i`` in ``[0, 8)``, ``x >= 0`` is True when ``x`` is never negative."""
    a, b = as_expr(a), as_expr(b)
    lo, hi = _range(sub(a, b))
    if op in ("==", "!="):
        if lo is not None and lo == hi:
            return Const(_OPS[op](lo, 0))
        if (lo is not None and lo > 0) or (hi is not None and hi < 0):
            return Const(op == "!=")
        return Cmp(op, a, b)
    at_lo = None if lo is None else _OPS[op](lo, 0)
    at_hi = None if hi is None else _OPS[op](hi, 0)
    # truth is monotone in a - b: "weak" is the end where it is least likely to hold
    weak, strong = (at_lo, at_hi) if op in (">", ">=") else (at_hi, at_lo)
    if weak is True:
        return TRUE
    if strong is False:
        return FALSE
    return Cmp(op, a, b)


# the comparison masks, each decided by bounds where it can be (see _cmp)
lt, le, ge, gt = partial(_cmp, "<"), partial(_cmp, "<="), partial(_cmp, ">="), partial(_cmp, ">")
eq, ne = partial(_cmp, "=="), partial(_cmp, "!=")


def _conj(*xs: Expr) -> Expr:
    """Conjunction (rule 7): flatten, drop True terms and repeats; any False term makes it
    False, no term left makes it True, one term is that term."""
    terms: list[Expr] = []
    for t in _flatten(And, map(as_expr, xs)):
        if isinstance(t, Const):
            if not t.value:
                return FALSE
        elif t not in terms:
            terms.append(t)
    if len(terms) <= 1:
        return terms[0] if terms else TRUE
    return And(tuple(terms))


def and_(*masks: Expr | None) -> Expr | None:
    """The conjunction of the masks given (None entries ignored); None when no mask is needed:
    all entries None, or the conjunction is True."""
    given = [m for m in masks if m is not None]
    if not given:
        return None
    m = _conj(*given)
    return None if is_true(m) else m


def is_true(e: Expr) -> bool:
    """The mask is decided True."""
    return isinstance(e, Const) and bool(e.value)


def is_false(e: Expr) -> bool:
    """The mask is decided False."""
    return isinstance(e, Const) and not e.value


def children(e: Expr) -> tuple[Expr, ...]:
    """The operands of ``e``."""
    if isinstance(e, (Add, And)):
        return e.terms
    if isinstance(e, Where):
        return (e.cond, e.a, e.b)
    if isinstance(e, (Const, Sym)):
        return ()
    return (e.a, e.b)


_BUILD = {
    Add: add,
    Mul: mul,
    FloorDiv: floordiv,
    Mod: mod,
    Min: minimum,
    Max: maximum,
    Where: where,
    And: _conj,
}


def simplify(e: Expr) -> Expr:
    """Rebuild a (raw) tree bottom-up through the smart constructors."""
    if isinstance(e, (Const, Sym)):
        return e
    kids = [simplify(c) for c in children(e)]
    return _cmp(e.op, *kids) if isinstance(e, Cmp) else _BUILD[type(e)](*kids)


def _sum(xs: Iterable[int | None]) -> int | None:
    xs = list(xs)
    return None if None in xs else sum(xs)


def _scale(lo: int | None, hi: int | None, k: int) -> tuple[int | None, int | None]:
    lo, hi = (None if lo is None else lo * k), (None if hi is None else hi * k)
    return (lo, hi) if k >= 0 else (hi, lo)


def _range(e: Expr) -> tuple[int | None, int | None]:
    """Closed range ``[lo, hi]`` of ``e`` (None: unbounded on that side)."""
    if isinstance(e, Const):
        return int(e.value), int(e.value)
    if isinstance(e, Sym):
        return e.lo, (None if e.hi is None else e.hi - 1)
    if isinstance(e, (Cmp, And)):
        return 0, 1
    if isinstance(e, Add):
        rs = [_range(t) for t in e.terms]
        return _sum(r[0] for r in rs), _sum(r[1] for r in rs)
    (alo, ahi), (blo, bhi) = _range(e.a), _range(e.b)
    union_lo = None if None in (alo, blo) else min(alo, blo)
    union_hi = None if None in (ahi, bhi) else max(ahi, bhi)
    if isinstance(e, Where):
        return union_lo, union_hi
    if isinstance(e, Mul):
        if blo is not None and blo == bhi:
            return _scale(alo, ahi, blo)
        if alo is not None and alo == ahi:
            return _scale(blo, bhi, alo)
        if None in (alo, ahi, blo, bhi):
            return None, None
        corners = [alo * blo, alo * bhi, ahi * blo, ahi * bhi]
        return min(corners), max(corners)
    if isinstance(e, Min):
        his = [h for h in (ahi, bhi) if h is not None]
        return union_lo, (min(his) if his else None)
    if isinstance(e, Max):
        los = [x for x in (alo, blo) if x is not None]
        return (max(los) if los else None), union_hi
    if not _pos(e.b):
        return None, None
    d = e.b.value
    if isinstance(e, FloorDiv):
        return _div(alo, d), _div(ahi, d)
    same = alo is not None and ahi is not None and alo // d == ahi // d
    return (alo % d, ahi % d) if same else (0, d - 1)


def _div(x: int | None, d: int) -> int | None:
    return None if x is None else x // d


def bounds(e: Expr) -> tuple[int | None, int | None]:
    """Half-open ``[lo, hi)`` holding ``e`` wherever its symbols are in range (None:
    unknown), by interval arithmetic over the ``Sym`` ranges; a mask is in ``[0, 2)``."""
    lo, hi = _range(e)
    return lo, (None if hi is None else hi + 1)


def is_lane_invariant(e: Expr) -> bool:
    """No lane-varying ``Sym`` inside: the same scalar for the whole program."""
    if isinstance(e, Sym):
        return not e.lane
    return all(is_lane_invariant(c) for c in children(e))


# precedence, loosest first; Python's `&` binds tighter than comparisons
_CMP, _AND, _ADD, _MUL, _NEG, _ATOM = range(6)


def render(e: Expr) -> str:
    """Python/Triton source for ``e`` with minimal parentheses: ``a + -3`` prints ``a - 3``,
    ``a + b * -1`` prints ``a - b``, ``x * -1`` prints ``-x``; ``*``, ``//``, ``%`` associate to
    the left; each comparison under ``&`` is parenthesised."""
    return _render(e)[0]


def _at(e: Expr, prec: int) -> str:
    text, p = _render(e)
    return text if p >= prec else f"({text})"


def _negated(e: Expr) -> Expr | None:
    """``-e`` when ``e`` prints with a leading minus (a negative constant or factor)."""
    if isinstance(e, Const) and e.value < 0:
        return Const(-e.value)
    base, k = _split(e)
    if k < 0:
        return base if k == -1 else Mul(base, Const(-k))
    return None


def _render(e: Expr) -> tuple[str, int]:
    if isinstance(e, Const):
        return str(e.value), (_NEG if e.value < 0 else _ATOM)
    if isinstance(e, Sym):
        return e.name, _ATOM
    if isinstance(e, Add):
        parts = [_at(e.terms[0], _ADD)]
        for t in e.terms[1:]:
            neg = _negated(t)
            parts.append(f"- {_at(neg, _ADD + 1)}" if neg is not None else f"+ {_at(t, _ADD + 1)}")
        return " ".join(parts), _ADD
    if isinstance(e, And):
        return " & ".join(_at(t, _AND + 1) for t in e.terms), _AND
    if isinstance(e, Cmp):
        return f"{_at(e.a, _CMP + 1)} {e.op} {_at(e.b, _CMP + 1)}", _CMP
    if isinstance(e, (Min, Max, Where)):
        fn = {Min: "tl.minimum", Max: "tl.maximum", Where: "tl.where"}[type(e)]
        return f"{fn}({', '.join(render(c) for c in children(e))})", _ATOM
    if isinstance(e, Mul) and Const(-1) in (e.a, e.b):
        return f"-{_at(e.a if e.b == Const(-1) else e.b, _NEG)}", _NEG
    sym = {Mul: "*", FloorDiv: "//", Mod: "%"}[type(e)]
    return f"{_at(e.a, _MUL)} {sym} {_at(e.b, _MUL + 1)}", _MUL


def evaluate(e: Expr, env: Mapping[str, int]) -> int | bool:
    """The value of ``e`` with Python semantics, symbols looked up by name in ``env``."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Sym):
        return env[e.name]
    if isinstance(e, Where):
        return evaluate(e.a if evaluate(e.cond, env) else e.b, env)
    v = [evaluate(c, env) for c in children(e)]
    if isinstance(e, Cmp):
        return _OPS[e.op](*v)
    fn = {
        Add: lambda *v: sum(v),
        And: lambda *v: all(v),
        Mul: operator.mul,
        FloorDiv: operator.floordiv,
        Mod: operator.mod,
        Min: min,
        Max: max,
    }[type(e)]
    return fn(*v)
