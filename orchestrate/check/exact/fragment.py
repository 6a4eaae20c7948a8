"""The fragment of a primitive graph that the exact check covers.

A node is inside when its value is a polynomial (over the graph inputs, the
constants and the outputs of nodes outside) with at most one exp on any path:
add, sub, mul, neg, matmul, reduce sum, division by a constant with no zero,
casts to a float type (the identity on values), layout ops (transpose,
reshape, slice, concat, expand, identity, constant pad, gather whose index
is a constant or a graph input, where with a constant condition), and exp
of a value no exp reached.  Everything else is outside, with a reason: max,
sqrt, erf, a division by a computed value, a second exp, a cast to an
integer, a gather at computed indices...

The output of a node outside is a fresh variable of the check (the same on
both sides, by name); the check compares every value that such a node reads
and requires the node itself to be the original's, so the fragment's parts
are checked exactly and what lies between them structurally.

Per tensor the analysis keeps ``exps`` (0 or 1: whether an exp reached it),
``deg`` (its degree as a polynomial over Z_p, an exp's value counting as one
variable) and ``exp_deg`` (the largest degree over Z_q of an exp's argument
upstream, 0 if none): the false-pass bound of the check is made of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from orchestrate import ir
from orchestrate.ir import Op

LINEAR = frozenset({Op.ADD, Op.SUB, Op.NEG, Op.SUM, Op.CUMSUM})
LAYOUT = frozenset({Op.TRANSPOSE, Op.RESHAPE, Op.SLICE, Op.CONCAT, Op.EXPAND, Op.IDENTITY})


@dataclass(frozen=True)
class Info:
    exps: int
    deg: int
    exp_deg: int


@dataclass(frozen=True)
class Fragment:
    inside: Mapping[str, Info]  # inputs, constants and the nodes inside
    outside: Mapping[str, str]  # node -> why it is outside

    def regions(self, graph: ir.Graph) -> list[str]:
        """The nodes outside, grouped by the ONNX node they came from."""
        groups: dict[str, list[str]] = {}
        for n in graph.nodes:
            if n.name in self.outside:
                groups.setdefault(n.origin or n.name, []).append(self.outside[n.name])
        return [f"{origin}: {', '.join(dict.fromkeys(why))}" for origin, why in groups.items()]


def _constant(graph: ir.Graph, name: str) -> np.ndarray | None:
    return graph.constants.get(name)


def why_outside(graph: ir.Graph, node: ir.Node, info: Mapping[str, Info]) -> str | None:
    """None when ``node`` is inside (given what its inputs are), else why not."""
    op, ins = node.op, node.inputs
    if op in LINEAR or op in LAYOUT or op in (Op.MUL, Op.MATMUL):
        return None
    if op is Op.DIV:
        c = _constant(graph, ins[1])
        if node.dtype not in ir.FLOATS:
            return "integer division"
        if c is None:
            return "division by a computed value"
        if not (np.all(np.isfinite(c)) and np.all(c != 0)):
            return "division by a constant with a zero or non-finite element"
        return None
    if op is Op.CAST:
        return None if node.attrs["to"] in ir.FLOATS else f"cast to {node.attrs['to']}"
    if op is Op.EXP:
        return "a second exp on a path" if info[ins[0]].exps else None
    if op is Op.GATHER:
        src = ins[1]
        ok = src in graph.constants or any(i.name == src for i in graph.inputs)
        return None if ok else "gather at computed indices"
    if op is Op.PAD:
        return None if node.attrs["mode"] == "constant" else f"{node.attrs['mode']} pad"
    if op is Op.WHERE:
        return None if ins[0] in graph.constants else "where with a computed condition"
    return op.value


def analyse(graph: ir.Graph) -> Fragment:
    info: dict[str, Info] = {i.name: Info(0, 1, 0) for i in graph.inputs}
    info.update({c: Info(0, 0, 0) for c in graph.constants})
    outside: dict[str, str] = {}
    for n in graph.nodes:
        early = next((i for i in n.inputs if i not in info), None)
        why = (
            f"reads {early!r} before it is computed"
            if early is not None
            else why_outside(graph, n, info)
        )
        if why is not None:
            outside[n.name] = why
            info[n.name] = Info(0, 1, 0)  # a fresh variable
            continue
        args = [info[i] for i in n.inputs]
        data = args[1:] if n.op is Op.WHERE else args[:1] if n.op is Op.GATHER else args
        exps = max(a.exps for a in data)
        exp_deg = max(a.exp_deg for a in data)
        if n.op in (Op.MUL, Op.MATMUL):
            deg = sum(a.deg for a in data)
        elif n.op is Op.EXP:
            exps, deg, exp_deg = 1, 1, max(exp_deg, data[0].deg)
        else:
            deg = max(a.deg for a in data)
        info[n.name] = Info(exps, deg, exp_deg)
    return Fragment({k: v for k, v in info.items() if k not in outside}, outside)
