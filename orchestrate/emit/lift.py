"""One ``kernels.py`` for a range of shapes: lifting the numbers of its instances.

The emitter prints a plan at one binding of the dimensions, with every
dimension a literal (``rows < 39``).  A dynamic bundle's kernels must serve
every binding, so ``lift_source`` takes the sources printed at each point of
the family's grid (``shapes/family.py``), which have the same tokens except
for numbers, and turns each number that differs into a polynomial of the
dimensions (``rows < dim0 * dim1``).  Then:

* each ``@triton.jit`` function that uses a dimension takes it as a runtime
  argument (not ``tl.constexpr``), so one compiled kernel serves the range;
  Triton still specializes an argument that is 1 or a multiple of 16;
* each launcher takes every dimension as a keyword (``dim0=..., dim1=...``)
  and passes those its function uses;
* a comment's numbers are lifted where they are polynomials; a figure that
  is not (bytes of memory traffic) is shown at the plan's binding, as the
  module's docstring says.

A number that no polynomial gives, a dimension where Triton needs a
compile-time constant (``tl.arange``, a block shape), or one outside any
function is a :class:`Unliftable` naming the function: that kernel cannot
serve the range as planned.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrate import text
from orchestrate.shapes.poly import Grid, NotLifted

# Triton calls whose arguments must be compile-time constants
_CONSTEXPR_CALLS = {
    "arange",
    "zeros",
    "full",
    "static_range",
    "reshape",
    "view",
    "broadcast_to",
    "expand_dims",
    "trans",
    "permute",
}
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class Unliftable:
    """Why the instances do not make one source; ``function`` the generated
    function it is in (None: outside any)."""

    function: str | None
    reason: str


def lift_source(
    sources: Mapping[tuple[int, ...], str],
    grid: Grid,
    codes: Sequence[str],
    names: Sequence[str],
    shown: str | None = None,
    shown_at: str = "",
) -> str | Unliftable:
    """The source serving every binding (see the module doc).  ``sources``
    holds the source at each grid point; ``names`` the dimensions' names in
    the model (escaped into comments); ``shown`` the source at the plan's
    binding (``shown_at``), whose comments give the figures no polynomial
    gives, when its tokens align."""
    points = grid.points
    toks = {p: _tokens(sources[p]) for p in points}
    first = toks[points[0]]
    base = sources[points[0]]
    functions = _functions(base)
    for p in points[1:]:
        if len(toks[p]) != len(first):
            return Unliftable(None, "the kernels' source has a different shape at another binding")
    opt = _tokens(shown) if shown is not None else None
    if opt is not None and (
        len(opt) != len(first) or any(a.type != b.type for a, b in zip(opt, first))
    ):
        opt = None
    edits: list[tuple[tuple[int, int], tuple[int, int], str]] = []
    for i, tok in enumerate(first):
        values = [toks[p][i] for p in points]
        strings = [t.string for t in values]
        if all(s == tok.string for s in strings):
            continue
        where = _function_at(functions, tok.start[0])
        if any(t.type != tok.type for t in values):
            return Unliftable(where, "its tokens differ between bindings")
        if tok.type == tokenize.COMMENT:
            lifted = _lift_comment(strings, grid, codes)
            if lifted is None:
                lifted = opt[i].string if opt is not None else _blank_numbers(tok.string)
            edits.append((tok.start, tok.end, lifted))
            continue
        whole = [_whole(s) for s in strings] if tok.type == tokenize.NUMBER else [None]
        if any(w is None for w in whole):
            return Unliftable(where, f"{tok.string!r} differs between bindings")
        if where is None:
            return Unliftable(
                None, f"the number {tok.string} outside any function depends on the shape"
            )
        p = grid.lift(whole)
        if isinstance(p, NotLifted):
            return Unliftable(
                where, f"a number depends on the shape as no polynomial does ({p.reason})"
            )
        expr = p.source(codes)
        # a float literal (a dimension folded into a constant: mean pooling's
        # division by seq) stays a float: the dimension times 1.0
        float_literal = not strings[0].isdigit()
        edits.append((tok.start, tok.end, f"({expr} * 1.0)" if float_literal else _atom(expr)))
    lifted = _apply(base, edits)
    return _with_arguments(lifted, codes, names, shown_at)


def _whole(literal: str) -> int | None:
    """The integer a number literal holds (``64`` or ``64.0``), or None."""
    if literal.isdigit():
        return int(literal)
    try:
        value = float(literal)
    except ValueError:
        return None
    return int(value) if value.is_integer() and abs(value) < 2**53 else None


def _tokens(source: str) -> list[tokenize.TokenInfo]:
    skip = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    return [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip]


def _atom(expr: str) -> str:
    return expr if re.fullmatch(r"\w+", expr) else f"({expr})"


def _lift_comment(strings: Sequence[str], grid: Grid, codes: Sequence[str]) -> str | None:
    """The comment with its numbers lifted; None when one is no polynomial."""
    words = [_NUMBER.split(s) for s in strings]
    if any(w != words[0] for w in words):
        return None
    numbers = [[int(n) for n in _NUMBER.findall(s)] for s in strings]
    if any(len(n) != len(numbers[0]) for n in numbers):
        return None
    out = [words[0][0]]
    for k in range(len(numbers[0])):
        p = grid.lift([n[k] for n in numbers])
        if isinstance(p, NotLifted):
            return None
        out += [p.source(codes) if p.is_const else _atom(p.source(codes)), words[0][k + 1]]
    return "".join(out)


def _blank_numbers(comment: str) -> str:
    return _NUMBER.sub("?", comment)


def _apply(source: str, edits: list) -> str:
    lines = source.splitlines(keepends=True)
    for (r0, c0), (r1, c1), new in sorted(edits, reverse=True):
        assert r0 == r1, "a token spans lines"
        line = lines[r0 - 1]
        lines[r0 - 1] = line[:c0] + new + line[c1:]
    return "".join(lines)


def _functions(source: str) -> list[tuple[int, int, str]]:
    tree = ast.parse(source)
    return [
        (n.lineno, n.end_lineno or n.lineno, n.name)
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
    ]


def _function_at(functions, line: int) -> str | None:
    return next((name for lo, hi, name in functions if lo <= line <= hi), None)


def _is_jit(node: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Attribute) and d.attr == "jit" for d in node.decorator_list)


def _with_arguments(
    source: str, codes: Sequence[str], names: Sequence[str], shown_at: str
) -> str | Unliftable:
    """Dimensions as arguments: to jitted functions that use them, and as
    keywords to every launcher (see the module doc)."""
    tree = ast.parse(source)
    code_set = set(codes)
    uses: dict[str, list[str]] = {}
    jit: set[str] = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in code_set}
        uses[node.name] = [c for c in codes if c in used]
        if _is_jit(node):
            jit.add(node.name)
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr in _CONSTEXPR_CALLS
                ):
                    inner = {n.id for n in ast.walk(call) if isinstance(n, ast.Name)}
                    if inner & code_set:
                        return Unliftable(
                            node.name,
                            f"tl.{call.func.attr} needs a dimension as a compile-time constant",
                        )
    lines = source.splitlines(keepends=True)
    inserts: list[tuple[int, str]] = []  # (line index to insert before, text)
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        mine = uses[node.name]
        if node.name in jit:
            if mine:
                if not node.args.args:
                    return Unliftable(
                        node.name, "a jitted function without arguments uses a dimension"
                    )
                at = _before_meta(lines, node)
                indent = re.match(r"\s*", lines[at]).group(0)
                block = (
                    f"{indent}# dimensions: runtime arguments, one compiled kernel for the range\n"
                )
                block += "".join(f"{indent}{c},\n" for c in mine)
                inserts.append((at, block))
            continue
        # a launcher: every dimension as a keyword; calls of jitted functions pass theirs
        header = lines[node.lineno - 1]
        if "interpret=False" not in header:
            if mine:
                return Unliftable(node.name, "a helper outside the launchers uses a dimension")
            continue
        lines[node.lineno - 1] = header.replace(
            "interpret=False", "*, " + "".join(f"{c}, " for c in codes) + "interpret=False", 1
        )
        for call in ast.walk(node):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Subscript)
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id in jit
            ):
                theirs = uses.get(call.func.value.id, [])
                if not theirs:
                    continue
                if not call.keywords:
                    return Unliftable(node.name, "a launch without keyword arguments")
                at = call.keywords[0].value.lineno - 1
                indent = re.match(r"\s*", lines[at]).group(0)
                inserts.append((at, "".join(f"{indent}{c}={c},\n" for c in theirs)))
    for at, block in sorted(inserts, reverse=True):
        lines.insert(at, block)
    out = "".join(lines)
    return _header(out, codes, names, shown_at)


def _before_meta(lines: list[str], node: ast.FunctionDef) -> int:
    """The line before which a jitted function's dimension arguments go: its
    ``# meta-parameters`` comment, else its first constexpr, else after its
    last argument."""
    body = node.body[0].lineno - 1
    for k in range(node.lineno, body):
        if lines[k].strip() == "# meta-parameters" or "tl.constexpr" in lines[k]:
            return k
    last = node.args.args[-1]
    return last.end_lineno or last.lineno


def _header(source: str, codes: Sequence[str], names: Sequence[str], shown_at: str) -> str:
    """The docstring says which dimension is which (names escaped) and where
    the comments' other figures come from."""
    end = source.index('"""', 3) if source.startswith('"""') else -1
    if end < 0:
        return source
    said = "\n".join(f"    {c}: {text.docstring(n)}" for c, n in zip(codes, names))
    note = (
        "\nDynamic shapes: every launcher takes the dimensions as keywords, and\n"
        "the kernels that use one take it as a runtime argument:\n" + said + "\n"
        f"Figures in comments that are no formula of them are at {text.docstring(shown_at)}.\n"
    )
    return source[:end] + note + source[end:]
