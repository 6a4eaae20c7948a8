"""What a rule accepts, emission prints and the printed kernel computes.

Random primitive graphs (hypothesis) mixing elementwise ops, layout ops
(transpose, reshape, slice, pad, concat, expand, gather), reductions and a
matmul: every candidate kernel the rule table accepts in them is cut out,
emitted, run in the Triton interpreter and compared with the float64
reference.  Emission must never refuse a spec, so any exception fails the
test, as does a wrong value.  (``test_every_candidate.py`` does the same for
every candidate of the example models.)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrate.decompose.builder import Value
from tests import graphs
from tests.templates.test_every_candidate import candidate_failures

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

SHAPES = [(4, 6), (2, 3, 4), (6, 4)]


def _factorisations(n: int) -> list[tuple[int, ...]]:
    out = [(n,)]
    for a in range(2, n):
        if n % a == 0:
            out.append((a, n // a))
            out += [(a, b, n // a // b) for b in range(2, n // a) if (n // a) % b == 0]
    return out


def _step(b, draw, vals: list[Value], rng_const) -> Value:
    """One random primitive (or small pattern) over the values so far."""
    x = draw(st.sampled_from(vals[-3:]))
    kind = draw(
        st.sampled_from(
            [
                "unary",
                "binary",
                "transpose",
                "reshape",
                "slice",
                "pad",
                "concat",
                "reduce",
                "softmax",
                "gather",
                "matmul",
            ]
        )
    )
    if kind == "unary":  # bounded, so that float32 does not overflow where float64 would not
        op = draw(st.sampled_from(["exp_tanh", "tanh", "neg", "sigmoid", "abs"]))
        return b.exp(b.tanh(x)) if op == "exp_tanh" else getattr(b, op)(x)
    if kind == "binary":
        same = [v for v in vals if v.shape == x.shape]
        other = draw(st.sampled_from(same)) if draw(st.booleans()) else None
        op = draw(st.sampled_from([b.add, b.mul, b.sub, b.max]))
        if other is None:  # a broadcast constant along the last axis
            other = b.constant(rng_const.standard_normal(x.shape[-1:]).astype("float32"))
        return op(x, other)
    if kind == "transpose":
        perm = draw(st.permutations(range(x.rank)))
        return b.transpose(x, tuple(perm))
    if kind == "reshape":
        return b.reshape(x, draw(st.sampled_from(_factorisations(x.size))))
    if kind == "slice":
        axis = draw(st.integers(0, x.rank - 1))
        d = x.shape[axis]
        if d < 2:
            return b.neg(x)
        start = draw(st.integers(0, d - 2))
        return b.slice_axis(x, axis, start, d, draw(st.sampled_from([1, 2])))
    if kind == "pad":
        pads = [draw(st.integers(0, 1)) for _ in range(2 * x.rank)]
        mode = draw(st.sampled_from(["constant", "edge", "reflect"]))
        if mode == "reflect" and any(p >= d for p, d in zip(pads, x.shape + x.shape)):
            mode = "edge"
        return b.pad(x, pads, mode, 0.5)
    if kind == "concat":
        return b.concat([x, b.neg(x)], draw(st.integers(0, x.rank - 1)))
    if kind == "reduce":
        axis = draw(st.integers(0, x.rank - 1))
        r = draw(st.sampled_from([b.sum, b.reduce_max]))(x, [axis])
        return b.add(b.expand(r, x.shape), x) if draw(st.booleans()) else b.mul(r, 2.0)
    if kind == "softmax":
        return graphs.softmax(b, x, draw(st.integers(0, x.rank - 1)))
    if kind == "gather":
        axis = draw(st.integers(0, x.rank - 1))
        d = x.shape[axis]
        idx = rng_const.integers(-d, d, size=(draw(st.integers(1, 3)),)).astype("int64")
        return b.gather(x, b.constant(idx), axis)
    if x.rank < 2:
        return b.tanh(x)
    w = b.constant(rng_const.standard_normal((x.shape[-1], 5)).astype("float32"))
    return b.matmul(x, w)


@st.composite
def random_graphs(draw):
    shape = draw(st.sampled_from(SHAPES))
    n = draw(st.integers(3, 9))
    seed = draw(st.integers(0, 2**16))

    def fn(b, x0):
        rng_const = np.random.default_rng(seed)
        vals = [x0]
        for _ in range(n):
            v = _step(b, draw, vals, rng_const)
            if v.size > 512 or v.rank > 4:
                v = b.mul(vals[-1], 0.5)
            vals.append(v)
        extra = (vals[-2],) if draw(st.booleans()) and vals[-2] is not x0 else ()
        return (vals[-1], *extra)

    return graphs.build(fn, [shape])


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(g=random_graphs())
def test_every_accepted_candidate_emits_and_computes_the_reference(g):
    _, failures = candidate_failures(g, graphs.random_inputs(g, 1))
    assert not failures, f"{g}\n" + "\n".join(failures)


def test_the_generator_makes_layout_and_reductions():
    """The strategy above reaches what it is meant to test."""
    seen: set[str] = set()

    @settings(
        max_examples=40,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(g=random_graphs())
    def collect(g):
        seen.update(n.op.value for n in g.nodes)

    collect()
    assert {"transpose", "reshape", "sum", "matmul", "pad", "gather"} <= seen, seen
