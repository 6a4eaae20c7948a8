"""Stages import downward only: no import cycle in orchestrate/, and the
edges the design forbids are absent.

Imports are read from the source with ``ast``, those inside functions
included (a lazy import is still a dependency), so a cycle cannot hide in a
function body.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "orchestrate"

# what a stage may not import (prefixes of module names); a stage is a module
# and its submodules, but for those in EXACT (the frozen plan is the package
# ``orchestrate.plan`` itself; its planner and pipeline compose the stages)
FORBIDDEN = {
    "orchestrate.ir": ["orchestrate."],  # the IR stands alone (but for errors)
    "orchestrate.kernels": [
        "orchestrate.cost",
        "orchestrate.ilp",
        "orchestrate.emit",
        "orchestrate.plan",
        "orchestrate.templates",
    ],
    # a template's parts (rule, generator, cost terms) come from the stages
    # below; the rule table, the cost model and the emitter look templates up
    "orchestrate.templates": [
        "orchestrate.ilp",
        "orchestrate.plan",
        "orchestrate.cost.roofline",
        "orchestrate.run",
        "orchestrate.tune",
        "orchestrate.bundle",
    ],
    "orchestrate.cost": ["orchestrate.ilp", "orchestrate.emit", "orchestrate.plan.planner"],
    "orchestrate.ilp": ["orchestrate.emit", "orchestrate.plan.planner", "orchestrate.run"],
    "orchestrate.emit": ["orchestrate.cost", "orchestrate.ilp", "orchestrate.plan.planner"],
    # the generators' building blocks know no template
    "orchestrate.emit.body": ["orchestrate.templates"],
    "orchestrate.emit.codegen": ["orchestrate.templates"],
    "orchestrate.emit.expr": ["orchestrate.templates"],
    "orchestrate.emit.helpers": ["orchestrate.templates"],
    "orchestrate.emit.source": ["orchestrate.templates"],
    "orchestrate.cost.terms": ["orchestrate.templates"],
    "orchestrate.plan": [
        "orchestrate.cost",
        "orchestrate.ilp",
        "orchestrate.emit",
        "orchestrate.plan.planner",
    ],
    "orchestrate.run": [
        "orchestrate.cost",
        "orchestrate.ilp",
        "orchestrate.plan.planner",
        "orchestrate.kernels.rules",
        "pulp",
    ],
}
EXACT = {"orchestrate.plan"}
# the GPU table (``cost/devices.py``, an empty package above it) any stage may read
ANYONE = {"orchestrate.cost.devices"}
# the IR may import errors, and itself
ALLOWED_FROM_IR = ("orchestrate.errors", "orchestrate.ir")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """Every module ``path`` imports, at any depth of the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:  # `from orchestrate import ir` imports a module,
                sub = f"{base}.{a.name}"  # `from orchestrate.ir import Op` reads one
                out.add(sub if sub in known else base)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    edges = {}
    for name, path in mods.items():
        found = imports(path, known)
        # importing a package's submodule runs the package first: count the
        # submodule, not the package, so `from orchestrate import x` in a
        # module that the package itself imports lazily is no cycle
        edges[name] = {m for m in found if m in known and m != name and m != "orchestrate"}
        edges[name] |= {m for m in found if not m.startswith("orchestrate")}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in edges:
                continue
            if state.get(w) == 1:
                return stack[stack.index(w) :] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(edges):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_no_import_cycle():
    cycle = find_cycle(
        {k: {m for m in v if m.startswith("orchestrate")} for k, v in graph().items()}
    )
    assert cycle is None, " -> ".join(cycle)


def test_the_package_imports_nothing_but_errors_and_its_version_eagerly():
    """``import orchestrate`` stays light: the stages load when used."""
    top = ast.parse((PACKAGE / "__init__.py").read_text())
    eager = {n.module for n in top.body if isinstance(n, ast.ImportFrom)}
    assert eager <= {"orchestrate.errors", "orchestrate.version"}, eager


def test_stages_import_downward_only():
    bad = []
    for name, deps in graph().items():
        for stage, banned in FORBIDDEN.items():
            if name != stage and (stage in EXACT or not name.startswith(stage + ".")):
                continue
            for dep in deps:
                if stage == "orchestrate.ir" and any(
                    dep == a or dep.startswith(a + ".") for a in ALLOWED_FROM_IR
                ):
                    continue
                if dep in ANYONE and stage != "orchestrate.ir":
                    continue
                if any(
                    dep == b
                    or dep.startswith(b if b.endswith(".") else b + ".")
                    or dep == b.rstrip(".")
                    for b in banned
                ):
                    bad.append(f"{name} imports {dep}")
    assert not bad, "\n".join(sorted(bad))


def test_the_checker_finds_a_cycle():
    """The test above can fail: a made-up cycle is found."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _optimize_decode(tmp_path, dims):
    import onnx

    import orchestrate
    from tests.shapes.test_dim_expressions import _decode

    src = tmp_path / "decode.onnx"
    onnx.save(_decode(), src)
    return lambda: orchestrate.optimize(src, tmp_path / "out.orch", dims=dims, trials=1)


@pytest.mark.parametrize("dims", [{"past": "4"}, {"past": "1..6@3"}], ids=["static", "range"])
def test_optimize_calls_no_higher_stage_by_name(tmp_path, dims):
    """Followed call by call (``tools/callpath.py``), an optimize, static and
    over a range, never calls from a lower stage into a higher one by name:
    the stages above are reached only through values handed down."""
    from tools.callpath import climbs

    found = climbs(_optimize_decode(tmp_path, dims))
    assert not found, sorted(found)


def test_a_climb_is_found_where_the_stages_order_says_so(tmp_path, monkeypatch):
    """The count can fail: with the frontend ranked above fission, fission's
    call of ``frontend.opset_of`` is a climb."""
    from tools import callpath

    ranks = [(p, 3.5 if p == "orchestrate.frontend" else r) for p, r in callpath.RANKS]
    monkeypatch.setattr(callpath, "RANKS", ranks)
    found = callpath.climbs(_optimize_decode(tmp_path, {"past": "4"}))
    assert any(callee == "orchestrate.frontend.opset_of" for _, callee, _, _ in found), found
