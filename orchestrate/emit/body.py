"""The statements of one kernel body, with common subexpressions named once.

A :class:`Body` collects lines.  ``let`` names an expression the first time
it is seen and returns the name after that: index arithmetic as an ``Expr``
(``emit/expr.py``, returned as a ``Sym`` that keeps the expression's range and
lane-invariance), values as Triton text.  ``lazy`` reserves a definition
(a block-shaped zero, a mask) that is written only if some expression uses
it: nothing is ever removed from generated source after the fact.

Loops are forked bodies: a fork sees the names bound so far, numbers on
from the same counter and keeps its own names to itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrate.emit.expr import (
    Const,
    Expr,
    Sym,
    bounds,
    children,
    is_lane_invariant,
    render,
    symbolic_bound,
)
from orchestrate.emit.helpers import Helper


@dataclass
class Lazy:
    """A definition written only if used."""

    name: str
    line: str
    used: bool = False


@dataclass
class _Shared:
    """What a body and its forks share."""

    counter: int = 0
    helpers: list[Helper] = field(default_factory=list)
    lazy: dict[str, Lazy] = field(default_factory=dict)
    # value name -> (mask text, other) of each load: who knows which loads
    # are already zero where a mask is off
    loads: dict[str, tuple[str | None, str]] = field(default_factory=dict)


class Body:
    def __init__(self, indent: str = "    ", shared: _Shared | None = None):
        self.lines: list[str | Lazy] = []
        self.indent = indent
        self.shared = shared or _Shared()
        self._names: dict[str, str] = {}
        self.linear_of: dict[tuple, Expr] = {}  # (dims, shape) -> the linear index they split

    @property
    def helpers(self) -> list[Helper]:
        return self.shared.helpers

    def fresh(self, stem: str) -> str:
        self.shared.counter += 1
        return f"{stem}{self.shared.counter}"

    def let(self, expr, stem: str = "t"):
        """The name of ``expr`` (an ``Expr`` or Triton text), bound on first use."""
        if isinstance(expr, Expr):
            if isinstance(expr, (Const, Sym)):
                return expr
            text = self.text(expr)
            name = self._bind(text, stem)
            lo, hi = bounds(expr)
            return Sym(name, lo, hi, lane=not is_lane_invariant(expr), bound=symbolic_bound(expr))
        if expr.isidentifier() or is_number(expr):
            return expr
        return self._bind(expr, stem)

    def _bind(self, text: str, stem: str) -> str:
        if text not in self._names:
            name = self.fresh(stem)
            self.lines.append(f"{self.indent}{name} = {text}")
            self._names[text] = name
        return self._names[text]

    def define(self, name: str, expr: Expr) -> Expr:
        """Bind ``expr`` to ``name`` (unless it is a constant or a name already)."""
        if isinstance(expr, (Const, Sym)):
            return expr
        self.lines.append(f"{self.indent}{name} = {self.text(expr)}")
        lo, hi = bounds(expr)
        return Sym(name, lo, hi, lane=not is_lane_invariant(expr), bound=symbolic_bound(expr))

    def lazy(self, name: str, definition: str, lo=None, hi=None, lane: bool = True) -> Sym:
        """Reserve ``name = definition`` here, written only if an expression uses it."""
        entry = Lazy(name, f"{self.indent}{name} = {definition}")
        self.shared.lazy[name] = entry
        self.lines.append(entry)
        return Sym(name, lo, hi, lane)

    def text(self, e: Expr | None) -> str:
        """``e`` as Triton source; the lazy definitions it uses are written."""
        if e is None:
            return "None"
        self._mark(e)
        return render(e)

    def _mark(self, e: Expr) -> None:
        if isinstance(e, Sym):
            entry = self.shared.lazy.get(e.name)
            if entry is not None:
                entry.used = True
            return
        for child in children(e):
            self._mark(child)

    def loaded(self, name: str, mask: str | None, other: str) -> None:
        self.shared.loads[name] = (mask, other)

    def zero_where_off(self, value: str, mask: Expr) -> bool:
        """Whether ``value`` is a load under exactly ``mask`` with other=0."""
        found = self.shared.loads.get(value)
        return found is not None and found[0] == render(mask) and found[1] in ("0", "0.0")

    def use(self, helper: Helper) -> None:
        """Record that the body calls ``helper``."""
        if helper not in self.shared.helpers:
            self.shared.helpers.append(helper)

    def comment(self, text: str) -> None:
        self.lines.append(f"{self.indent}# {text}")

    def raw(self, line: str) -> None:
        self.lines.append(f"{self.indent}{line}")

    def fork(self, indent: str) -> Body:
        child = Body(indent, self.shared)
        child._names = dict(self._names)
        child.linear_of = dict(self.linear_of)
        return child

    def code(self) -> list[str]:
        """The lines, with the lazy definitions that were used."""
        return [
            x.line if isinstance(x, Lazy) else x
            for x in self.lines
            if not isinstance(x, Lazy) or x.used
        ]


def is_number(text: str) -> bool:
    """Whether ``text`` is a numeric literal."""
    try:
        float(text)
        return True
    except ValueError:
        return False
