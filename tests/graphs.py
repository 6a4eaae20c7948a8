"""Small primitive graphs for planner tests, built directly with the Builder."""

from __future__ import annotations

import random

import numpy as np

from orchestrate import ir
from orchestrate.decompose import eliminate_dead_code
from orchestrate.decompose.builder import Builder, Value
from orchestrate.ir import type_rules


def build(fn, shapes, dtype="float32", name="g") -> ir.Graph:
    """The primitive graph of ``fn(b, *inputs)``; inputs x0, x1, ... of ``shapes``."""
    b = Builder()
    b.begin(name, name)
    xs = [Value(f"x{i}", ir.TensorType(tuple(s), dtype)) for i, s in enumerate(shapes)]
    out = fn(b, *xs)
    outs = out if isinstance(out, tuple) else (out,)
    g = ir.Graph(
        tuple(b.nodes),
        tuple(ir.Input(x.name, x.type) for x in xs),
        tuple(o.name for o in outs),
        b.constants,
        name,
    )
    return type_rules.validate(eliminate_dead_code(g))


def softmax(b, x, axis=-1):
    m = b.reduce_max(x, [axis])
    e = b.exp(b.sub(x, m))
    return b.div(e, b.sum(e, [axis]))


def layernorm(b, x, gamma, beta):
    mu = b.mean(x, [-1])
    d = b.sub(x, mu)
    var = b.mean(b.mul(d, d), [-1])
    return b.add(b.mul(b.mul(d, b.recip(b.sqrt(b.add(var, 1e-5)))), gamma), beta)


def mlp(b, x, w1, b1, w2):
    h = b.add(b.matmul(x, w1), b1)
    g = b.mul(b.mul(h, 0.5), b.add(b.erf(b.mul(h, 0.7071067811865476)), 1.0))
    return b.matmul(g, w2)


def exp_into_two_reductions(b, x):
    """A cheap elementwise op feeding two reductions over different axes: the
    reductions cannot share a kernel, so each is best fused with its own
    copy of exp (recomputation) instead of materialising exp(x)."""
    e = b.exp(x)
    return b.sum(e, [1]), b.reduce_max(e, [0])


def random_dag(seed: int, n_nodes: int = 5) -> ir.Graph:
    """A random graph of elementwise ops, reductions and at most one matmul
    over (8, 8) tensors, with one or two outputs."""
    rng = random.Random(seed)

    def fn(b, x0, x1):
        vals = [x0, x1]
        matmuls = 0
        for _ in range(n_nodes):
            a = rng.choice(vals[-3:] if rng.random() < 0.7 else vals)
            kind = rng.random()
            if kind < 0.45:
                other = rng.choice(vals)
                op = rng.choice([b.add, b.mul, b.sub, b.max])
                v = op(a, other) if other.shape == a.shape or other.rank == 0 else b.exp(a)
            elif kind < 0.65:
                v = rng.choice([b.exp, b.tanh, b.neg])(a)
            elif kind < 0.85 and a.shape == (8, 8):
                v = b.expand(rng.choice([b.sum, b.reduce_max])(a, [rng.choice([0, 1])]), (8, 8))
                v = b.add(v, a)
            elif matmuls == 0 and a.shape == (8, 8):
                v = b.matmul(a, x1)
                matmuls += 1
            else:
                v = b.mul(a, 2.0)
            vals.append(v)
        outs = [vals[-1]]
        if rng.random() < 0.5 and vals[-2] is not vals[-1] and vals[-2].name not in ("x0", "x1"):
            outs.append(vals[-2])
        return tuple(outs)

    return build(fn, [(8, 8), (8, 8)], name=f"dag{seed}")


def random_inputs(graph: ir.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal(i.type.shape).astype(i.type.dtype) for i in graph.inputs}
