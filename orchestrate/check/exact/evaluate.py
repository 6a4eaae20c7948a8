"""Evaluating primitives in Z_p x Z_q (one trial's values, shared by both sides).

A value is a pair of uint64 arrays (residues mod p, residues mod q).  After
an exp only the Z_p half means anything (exp maps the Z_q half of its
argument into Z_p); the check compares the Z_q half only where no exp
reached.  Gather indices and where conditions are concrete integer arrays:
constants, or graph inputs drawn in the range of the axis they index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from orchestrate import ir
from orchestrate.check.exact import field as F
from orchestrate.check.verify import integer_ranges
from orchestrate.ir import Op
from orchestrate.ir.reference import IMPLS

Value = tuple[np.ndarray, np.ndarray]


@dataclass
class Trial:
    """One trial's field and random values: inputs, constants' images and
    the fresh variables of nodes outside the fragment, drawn once by name so
    both sides read the same ones."""

    field: F.Field
    rng: np.random.Generator
    graph: ir.Graph  # the original: its inputs, constants and index ranges
    special: dict[str, int] = field(default_factory=dict)
    values: dict[str, Value] = field(default_factory=dict)
    concrete: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        f = self.field
        self.special = {k: int(self.rng.integers(0, f.p * f.q)) for k in ("+inf", "-inf", "nan")}
        ranges = integer_ranges(self.graph)
        for i in self.graph.inputs:
            if i.name in ranges:
                idx = self.rng.integers(0, ranges[i.name], size=i.type.shape)
                self.concrete[i.name] = idx
                self.values[i.name] = (
                    np.mod(idx, f.p).astype(F.U64),
                    np.mod(idx, f.q).astype(F.U64),
                )
            else:
                self.values[i.name] = self.fresh(i.type.shape)

    def fresh(self, shape: tuple[int, ...]) -> Value:
        f = self.field
        return (
            self.rng.integers(0, f.p, size=shape, dtype=F.U64),
            self.rng.integers(0, f.q, size=shape, dtype=F.U64),
        )

    def constant(self, name: str, arr: np.ndarray) -> Value:
        """A constant's image (by array: each side reads its own constants)."""
        key = f"constant:{name}:{id(arr)}"
        if key not in self.values:
            f = self.field
            self.values[key] = (
                F.residues(arr, f.p, self.special),
                F.residues(arr, f.q, self.special),
            )
        return self.values[key]

    def variable(self, name: str, shape: tuple[int, ...]) -> Value:
        """The fresh variable standing for the output of a node outside."""
        key = "outside:" + name
        if key not in self.values:
            self.values[key] = self.fresh(shape)
        return self.values[key]

    def index(self, graph: ir.Graph, name: str) -> np.ndarray:
        """A concrete gather index or where condition (a constant or an input)."""
        if name in graph.constants:
            return np.asarray(graph.constants[name])
        return self.concrete[name]


def evaluate(node: ir.Node, args: list[Value], graph: ir.Graph, trial: Trial) -> Value:
    """The value of a node inside the fragment."""
    f = trial.field
    ps, qs = [a[0] for a in args], [a[1] for a in args]
    op, attrs = node.op, node.attrs

    def each(fn: Callable[[list[np.ndarray], int], np.ndarray]) -> Value:
        return fn(ps, f.p), fn(qs, f.q)

    if op is Op.ADD:
        return each(lambda x, m: (x[0] + x[1]) % F.U64(m))
    if op is Op.SUB:
        return each(lambda x, m: (x[0] + (F.U64(m) - x[1])) % F.U64(m))
    if op is Op.NEG:
        return each(lambda x, m: (F.U64(m) - x[0]) % F.U64(m))
    if op is Op.MUL:
        return each(lambda x, m: F.mulmod(x[0], x[1], m))
    if op is Op.DIV:
        return each(lambda x, m: F.mulmod(x[0], F.inverse(x[1], m), m))
    if op is Op.MATMUL:
        return each(lambda x, m: F.matmul(x[0], x[1], m))
    if op is Op.SUM:
        axes = tuple(attrs["axes"])
        return each(
            lambda x, m: (
                np.sum(x[0], axis=axes, keepdims=bool(attrs["keepdims"]), dtype=F.U64) % F.U64(m)
            )
        )
    if op is Op.CUMSUM:
        return each(lambda x, m: _cumsum(x[0], attrs, m))
    if op is Op.EXP:
        return f.exp(qs[0]), np.zeros(qs[0].shape, F.U64)
    if op is Op.CAST:
        return ps[0], qs[0]
    if op is Op.GATHER:
        idx = trial.index(graph, node.inputs[1])
        return each(lambda x, m: np.take(x[0], idx, axis=attrs["axis"]))
    if op is Op.WHERE:
        cond = trial.index(graph, node.inputs[0]).astype(bool)
        return each(lambda x, m: np.where(cond, x[1], x[2]))
    if op is Op.PAD:
        pad = float(attrs["value"])

        def padded(x: list[np.ndarray], m: int) -> np.ndarray:
            r = x[0].ndim
            widths = [(attrs["pads"][i], attrs["pads"][i + r]) for i in range(r)]
            value = F.residues(np.array([pad]), m, trial.special)[0]
            return np.pad(x[0], widths, mode="constant", constant_values=value)

        return each(padded)
    impl = IMPLS[op]  # layout: the reference executor's own, on residues
    return each(lambda x, m: np.ascontiguousarray(impl(attrs, *x)).astype(F.U64, copy=False))


def _cumsum(x: np.ndarray, attrs, m: int) -> np.ndarray:
    """The cumulative sum mod ``m`` along ``axis`` (reverse, exclusive as the primitive)."""
    ax = attrs["axis"]
    y = np.flip(x, ax) if attrs["reverse"] else x
    total = np.cumsum(y % F.U64(m), axis=ax, dtype=F.U64) % F.U64(m)
    if attrs["exclusive"]:
        first = np.zeros_like(np.take(total, [0], axis=ax))
        total = np.concatenate([first, np.delete(total, -1, axis=ax)], axis=ax)
    return np.flip(total, ax) if attrs["reverse"] else total
