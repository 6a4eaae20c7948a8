"""The one way text reaches generated source: escaped, never pasted.

Tensor and node names come from the model, and a model is hostile until
proven otherwise: a name may hold a line break, quotes or a comment marker.
Generated code names things by position (``in0``, ``out1``); where a name
must appear it goes through one of these functions:

* ``string(text)``: a Python string literal (the launch table's keys);
* ``comment(text)``: one comment line, control characters escaped;
* ``docstring(text)``: the inside of a triple-quoted docstring;
* ``identifier(text, fallback)``: a Python identifier made of the name's
  letters, digits and underscores.
"""

from __future__ import annotations

import json
import keyword
import re


def string(text: str) -> str:
    """A Python string literal of ``text`` (JSON's escaping is valid Python)."""
    return json.dumps(text, ensure_ascii=True)


def comment(text: str) -> str:
    """``text`` as one ``#`` comment line."""
    safe = "".join(c if c.isprintable() and c not in "\r\n" else repr(c)[1:-1] for c in text)
    return f"# {safe}"


def docstring(text: str) -> str:
    """``text`` for the inside of a \"\"\"docstring\"\"\": quotes and backslashes escaped,
    control characters other than line breaks escaped."""
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    return "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in out)


def identifier(text: str, fallback: str = "t") -> str:
    stem = re.sub(r"[^0-9a-zA-Z_]+", "_", text).strip("_") or fallback
    if stem[0].isdigit() or keyword.iskeyword(stem):
        stem = f"{fallback}_{stem}"
    return stem
