"""The one way text from a model reaches what orchestrate writes: escaped, never pasted.

Tensor and node names come from the model, and a model is hostile until
proven otherwise: a name may hold a line break of any kind (``\\n``, ``\\r``,
``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028``, ``\\u2029``), quotes, a
comment marker or a backslash.  Generated code names everything by position
(``in0``, ``out1``, ``k003_matmul``), so no identifier is ever made from a
name.  Where a name must appear, it goes through one of these functions, and
what they return is printable ASCII on one line:

* ``string(text)``: a Python string literal (the launch table's keys);
* ``comment(text)``: one ``#`` comment line;
* ``docstring(text)``: one line for the inside of a triple-quoted docstring.

What people read (messages, tables, ``report.md``, logs) goes through
``shown(text)``: the text itself where every character prints, so a name in
any script reads as written, and otherwise each line break, control
character and terminal escape (``ESC[31m``) written as a visible backslash
escape, so that a name is one line and cannot restyle a terminal.
"""

from __future__ import annotations

_QUOTES = "\\\"'"  # backslash and both quotes: escaped in literals and docstrings


def _escape(c: str) -> str:
    o = ord(c)
    if o < 0x100:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def _ascii(text: str, special: str = "") -> str:
    """``text`` with every character outside printable ASCII, and those in
    ``special``, written as a backslash escape."""
    return "".join(c if " " <= c <= "~" and c not in special else _escape(c) for c in text)


def string(text: str) -> str:
    """A Python string literal of ``text``.  (Not JSON's escaping: it writes
    a character beyond U+FFFF as a surrogate pair, two characters to Python.)"""
    return f'"{_ascii(text, special=_QUOTES)}"'


def comment(text: str) -> str:
    """``text`` as one ``#`` comment line."""
    return f"# {_ascii(text)}"


def docstring(text: str) -> str:
    """``text`` as one line inside a \"\"\"docstring\"\"\": backslashes and quotes
    escaped, so it can neither end the string nor start an escape."""
    return _ascii(text, special=_QUOTES)


def shown(text: str) -> str:
    """``text`` for people to read: itself where every character is
    printable (letters of any script included), else with each unprintable
    one (line breaks of every kind, ESC, other controls) as Python writes
    it in a literal (``\\n``, ``\\x1b``, ``\\u2028``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
