"""``python -m tools.callpath MODEL [--shape NAME=SHAPE ...]``: the climbs of ``orchestrate.optimize``.

A climb is a call from a function of a lower stage into a function of a higher
one, by name: the caller's module imports the callee's module (at its top or
inside a function; importing a package is not importing its submodules).  Calls through a value passed down (a callback, a registry entry, a
method of an object handed in) are the stages' interfaces, not climbs;
``--by-value`` counts them too.  The
stages' order is ``RANKS`` below, lowest first; the longest matching prefix
decides.  Each distinct caller -> callee pair is counted once, however often it
runs.  The optimize runs with ``--trials 1`` in a temporary folder.
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib.util
import sys
import tempfile
from pathlib import Path

RANKS = [
    ("orchestrate.errors", 0),
    ("orchestrate.text", 0),
    ("orchestrate.version", 0),
    ("orchestrate.files", 0),
    ("orchestrate.ir", 1),
    ("orchestrate.shapes.dims", 1),  # dimension values (ranges, expressions, symbols)
    ("orchestrate.shapes.poly", 1),
    ("orchestrate.shapes.symint", 1),
    ("orchestrate.frontend", 2),  # loading and checking a model; fission reads it
    ("orchestrate.decompose", 3),
    ("orchestrate.shapes", 4),
    ("orchestrate.cost.devices", 5),
    ("orchestrate.kernels", 6),
    ("orchestrate.plan", 7),  # the frozen Plan (plan/__init__.py): data the stages read
    ("orchestrate.cost.terms", 7),
    ("orchestrate.emit.expr", 7),
    ("orchestrate.emit.body", 7),
    ("orchestrate.emit.codegen", 7),
    ("orchestrate.emit.helpers", 7),
    ("orchestrate.emit.source", 7),
    ("orchestrate.templates", 8),
    ("orchestrate.cost", 9),
    ("orchestrate.plan.candidates", 10),
    ("orchestrate.plan.admit", 10),
    ("orchestrate.ilp", 11),
    ("orchestrate.plan.planner", 12),
    ("orchestrate.plan.pipeline", 12),
    ("orchestrate.emit", 13),
    ("orchestrate.bundle", 14),
    ("orchestrate.plan.ranged", 15),
    ("orchestrate.run", 16),
    ("orchestrate.check", 17),
    ("orchestrate.tune", 18),
    ("orchestrate.explain", 18),
    ("orchestrate.bench", 18),
    ("orchestrate.api", 20),
    ("orchestrate.cli", 21),
]


def stage(module: str) -> tuple[str, int] | None:
    best = None
    for prefix, r in RANKS:
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best[0])
        ):
            best = (prefix, r)
    return best


def imports(module: str) -> set[str]:
    """The orchestrate modules ``module`` imports, anywhere in its source."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return set()
    out = set()
    for node in ast.walk(ast.parse(Path(spec.origin).read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("orchestrate")}


def climbs(run, by_value: bool = False) -> collections.Counter:
    """(caller, callee, caller's stage, callee's stage) of each climb ``run()``
    makes; ``by_value``: calls through values passed down count too."""
    found: collections.Counter = collections.Counter()
    imported: dict[str, set[str]] = {}
    stack: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event == "call":
            callee = (frame.f_globals.get("__name__", ""), frame.f_code.co_qualname)
            caller = stack[-1] if stack else ("", "")
            stack.append(callee)
            (cm, cf), (m, f) = caller, callee
            if not (cm.startswith("orchestrate") and m.startswith("orchestrate")):
                return
            a, b = stage(cm), stage(m)
            if a is None or b is None or b[1] <= a[1] or f == "<module>":
                return
            names = imported.setdefault(cm, imports(cm))
            if by_value or m in names:
                found[(f"{cm}.{cf}", f"{m}.{f}", a[0], b[0])] += 1
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.callpath", description=__doc__.splitlines()[0]
    )
    p.add_argument("model")
    p.add_argument("--shape", action="append", default=[], help="NAME=SHAPE, as optimize takes")
    p.add_argument(
        "--by-value",
        action="store_true",
        help="count calls through values passed down (callbacks, registry entries) too",
    )
    args = p.parse_args(argv)
    import orchestrate

    shapes = dict(s.split("=", 1) for s in args.shape) or None
    with tempfile.TemporaryDirectory() as tmp:
        found = climbs(
            lambda: orchestrate.optimize(
                args.model, Path(tmp) / "out.orch", shapes=shapes, trials=1
            ),
            args.by_value,
        )
    for (caller, callee, a, b), _ in sorted(found.items()):
        print(f"{a} -> {b}: {caller} -> {callee}")
    pairs = {(a, b) for (_, _, a, b) in found}
    print(f"{len(found)} climbs ({len(pairs)} pairs of stages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
