"""What ``orchestrate inspect`` prints for a range of shapes: text and JSON."""

from __future__ import annotations

from orchestrate.shapes.infer import SymbolicShapes, shape_text
from orchestrate.shapes.poly import Poly


def _dim(d: Poly) -> int | str:
    return d.const if d.is_const else str(d)


def _largest(result: SymbolicShapes, shape) -> str:
    if shape is None or all(d.is_const for d in shape):
        return ""
    return "  at most " + "x".join(str(d.bounds(result.ranges)[1]) for d in shape)


def lines(result: SymbolicShapes) -> list[str]:
    ranges = ", ".join(f"{s} {r}" for s, r in sorted(result.ranges.items())) or "none"
    out = [f"symbolic dimensions: {ranges}", "inputs:"]
    width = max(map(len, (*result.inputs, *result.outputs)), default=0)
    for name in result.inputs:
        out.append(f"  {name:<{width}}  {shape_text(result.shape(name))}")
    out.append("outputs:")
    for name in result.outputs:
        shape = result.shape(name)
        out.append(f"  {name:<{width}}  {shape_text(shape)}{_largest(result, shape)}")
    if result.declined:
        n = len(result.declined)
        out.append(f"declined ({n} node{'s' * (n != 1)}; what depends on them is unknown):")
        out.extend(f"  {d}" for d in result.declined)
    else:
        out.append("declined: none")
    return out


def as_json(result: SymbolicShapes) -> dict:
    def shapes(names):
        return {
            n: (None if (s := result.shape(n)) is None else [_dim(d) for d in s]) for n in names
        }

    return {
        "ranges": {
            s: {"min": r.min, "max": r.max, "opt": r.opt} for s, r in sorted(result.ranges.items())
        },
        "inputs": shapes(result.inputs),
        "outputs": shapes(result.outputs),
        "values": shapes(result.values),
        "declined": [{"node": d.node, "op": d.op, "reason": d.reason} for d in result.declined],
    }
