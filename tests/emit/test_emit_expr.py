"""The index-expression tree: each rewrite rule, rendering, bounds, and properties that
simplification, rendering and bounds agree with plain Python evaluation."""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrate.emit.expr import (
    FALSE,
    TRUE,
    Add,
    And,
    Cmp,
    Const,
    Expr,
    FloorDiv,
    Max,
    Min,
    Mod,
    Mul,
    Sym,
    Where,
    and_,
    as_expr,
    bounds,
    eq,
    evaluate,
    ge,
    gt,
    is_false,
    is_lane_invariant,
    is_true,
    le,
    lt,
    maximum,
    minimum,
    ne,
    render,
    simplify,
    where,
)

i, j = Sym("i", 0, 4), Sym("j", 0, 6)
x, y, a, b, c = Sym("x"), Sym("y"), Sym("a"), Sym("b"), Sym("c")
offs = Sym("offs")
pid = Sym("pid_b", 0, 8, lane=False)
TL = SimpleNamespace(minimum=min, maximum=max, where=lambda cond, p, q: p if cond else q)


def check(e, structure, text):
    assert e == structure
    assert render(e) == text


# rule 1: constant folding and identities


def test_constant_folding():
    check(as_expr(2) + 3, Const(5), "5")
    check(as_expr(-7) // 2, Const(-4), "-4")
    check(as_expr(-7) % 3, Const(2), "2")
    check(as_expr(4) * 5 - 1, Const(19), "19")
    check(minimum(3, 5), Const(3), "3")
    check(maximum(3, 5), Const(5), "5")
    assert evaluate(lt(2, 3), {}) is True and render(lt(2, 3)) == "True"
    assert evaluate(eq(2, 3), {}) is False and render(eq(2, 3)) == "False"
    assert and_(lt(1, 2), ge(3, 3)) is None
    assert is_false(lt(1, 2) & ne(4, 4))


def test_identities():
    check(x + 0, x, "x")
    check(x * 1, x, "x")
    check(x * 0, Const(0), "0")
    check(x // 1, x, "x")
    check(x % 1, Const(0), "0")
    check(0 // x, Const(0), "0")
    check(0 % x, Const(0), "0")


def test_operators_take_ints_on_either_side():
    check(10 - x, Add((Mul(x, Const(-1)), Const(10))), "-x + 10")
    check(24 // x, FloorDiv(Const(24), x), "24 // x")
    check(7 % x, Mod(Const(7), x), "7 % x")
    with pytest.raises(TypeError):
        x + 1.5


def test_division_by_zero_is_not_folded():
    check(as_expr(3) // 0, FloorDiv(Const(3), Const(0)), "3 // 0")


# rule 2: sums


def test_add_flattens_and_puts_the_constant_last():
    check((x + 1) + (y + 2), Add((x, y, Const(3))), "x + y + 3")
    check(1 + x, Add((x, Const(1))), "x + 1")
    check(simplify(Add((Add((x, Const(1))), Add((y, Const(-1)))))), Add((x, y)), "x + y")


def test_add_combines_like_terms_in_first_appearance_order():
    check(2 * x + 3 * x, Mul(x, Const(5)), "x * 5")
    check(x - x, Const(0), "0")
    check(y + x + 1 + y, Add((Mul(y, Const(2)), x, Const(1))), "y * 2 + x + 1")
    check(x + y - x, y, "y")


# rule 3: products


def test_mul_moves_constants_right_and_folds_them():
    check(3 * x, Mul(x, Const(3)), "x * 3")
    check((x * 2) * 3, Mul(x, Const(6)), "x * 6")
    check((x * 2) * y, Mul(Mul(x, y), Const(2)), "x * y * 2")
    check(x * 2 * -1, Mul(x, Const(-2)), "x * -2")


def test_mul_distributes_a_constant_over_a_sum():
    check((x + 2) * 3, Add((Mul(x, Const(3)), Const(6))), "x * 3 + 6")
    check((x + y) * y, Mul(Add((x, y)), y), "(x + y) * y")


# rule 4: floor division by a positive constant


def test_floordiv_splits_off_multiples_when_the_rest_is_in_range():
    check((i * 6 + j) // 6, i, "i")
    check((j + i * 6 + 12) // 6, Add((i, Const(2))), "i + 2")
    check(
        (x * 6 + j + 3) // 6,
        FloorDiv(Add((Mul(x, Const(6)), j, Const(3))), Const(6)),
        "(x * 6 + j + 3) // 6",
    )
    check(
        (x * 6 + offs) // 6,
        FloorDiv(Add((Mul(x, Const(6)), offs)), Const(6)),
        "(x * 6 + offs) // 6",
    )


def test_floordiv_of_products_and_quotients():
    check((x * 12) // 6, Mul(x, Const(2)), "x * 2")
    check((x * 2) // 6, FloorDiv(x, Const(3)), "x // 3")
    check((x * 4) // 6, FloorDiv(Mul(x, Const(4)), Const(6)), "x * 4 // 6")
    check(x // 2 // 3, FloorDiv(x, Const(6)), "x // 6")
    check(j // 6, Const(0), "0")
    check(Sym("k", 12, 18) // 6, Const(2), "2")


def test_unbounded_index_split_is_kept():
    check(offs // 24 % 4, Mod(FloorDiv(offs, Const(24)), Const(4)), "offs // 24 % 4")


# rule 5: modulo by a positive constant


def test_mod_in_range_is_dropped():
    check(j % 6, j, "j")
    check(Sym("k", 6, 12) % 6, Add((Sym("k", 6, 12), Const(-6))), "k - 6")
    check((i * 6 + j) % 6, j, "j")


def test_mod_drops_multiples_of_the_divisor():
    check((x * 6 + y) % 6, Mod(y, Const(6)), "y % 6")
    check((x * 12) % 6, Const(0), "0")
    check((x + 7) % 6, Mod(Add((x, Const(1))), Const(6)), "(x + 1) % 6")
    check(x % 24 % 6, Mod(x, Const(6)), "x % 6")
    check(x % 6 % 4, Mod(Mod(x, Const(6)), Const(4)), "x % 6 % 4")


def _c_mod(p: int, q: int) -> int:
    """``p % q`` as the kernel computes it: truncating, like C."""
    r = abs(p) % abs(q)
    return -r if p < 0 else r


def test_mod_keeps_a_dividend_that_dropping_terms_would_make_negative():
    """``(11 - e) % 6`` must not become ``(5 - e) % 6``: for e > 5 that
    dividend is negative, where the kernel's truncating ``%`` differs from
    Python's (a reversed slice reshaped reads such an index)."""
    e = Sym("e", 0, 12)
    m = (as_expr(11) - e) % 6
    for v in range(12):
        text = render(m).replace("e", str(v))
        p, q = text.rsplit(" % ", 1)
        assert _c_mod(eval(p), int(q)) == (11 - v) % 6, (v, text)


# rule 6: the reshape round trip


def test_reshape_round_trip():
    check(offs // 6 * 6 + offs % 6, offs, "offs")
    check(offs % 6 + offs // 6 * 6 + y, Add((offs, y)), "offs + y")
    check((offs // 6) * 12 + (offs % 6) * 2, Mul(offs, Const(2)), "offs * 2")
    check(
        offs // 6 * 5 + offs % 6,
        Add((Mul(FloorDiv(offs, Const(6)), Const(5)), Mod(offs, Const(6)))),
        "offs // 6 * 5 + offs % 6",
    )


def test_reshape_of_a_reshape_merges_step_by_step():
    def split_and_join(flat):
        return flat // 24 % 4 * 24 + flat // 6 % 4 * 6 + flat % 6

    check(split_and_join(offs), Mod(offs, Const(96)), "offs % 96")
    check(split_and_join(Sym("offs", 0, 96)), Sym("offs", 0, 96), "offs")


@settings(max_examples=100, deadline=None)
@given(dims=st.lists(st.integers(1, 7), min_size=1, max_size=4), bounded=st.booleans())
def test_split_then_join_is_the_identity(dims, bounded):
    """A flat index split into a multi-index (as a reshape does) and joined again."""
    numel = 1
    for d in dims:
        numel *= d
    flat = Sym("offs", 0, numel) if bounded else offs
    joined, stride = as_expr(0), numel
    for d in dims:
        stride //= d
        joined = joined + flat // stride % d * stride
    expected = Const(0) if numel == 1 else flat if bounded else Mod(offs, Const(numel))
    assert joined == expected


# rule 7: comparisons and conjunctions


def test_comparisons_decided_by_bounds():
    assert is_true(lt(i, 8)) and is_true(lt(i, 4)) and not is_true(lt(i, 3))
    assert is_true(ge(i, 0)) and is_false(lt(i, 0)) and is_false(gt(i, 3))
    assert is_true(le(i * 6 + j, 23)) and is_false(eq(j, 7)) and is_true(ne(j, -1))
    assert is_true(lt(x, x + 1)) and is_true(eq(x + 1, 1 + x))
    check(lt(x, 8), Cmp("<", x, Const(8)), "x < 8")
    check(lt(i, 3), Cmp("<", i, Const(3)), "i < 3")
    check(eq(j, 0), Cmp("==", j, Const(0)), "j == 0")
    check(ne(j, 5), Cmp("!=", j, Const(5)), "j != 5")


def test_and_drops_true_dedups_and_flattens():
    m = lt(a, b)
    check(m & ge(c, 0), And((m, Cmp(">=", c, Const(0)))), "(a < b) & (c >= 0)")
    check(and_(m, None, lt(i, 4), m), m, "a < b")
    check(
        (m & lt(c, 1)) & (lt(x, 2) & m), And((m, lt(c, 1), lt(x, 2))), "(a < b) & (c < 1) & (x < 2)"
    )
    assert and_(m, lt(i, 0)) == FALSE
    assert and_(None, None) is None and and_() is None and and_(lt(i, 4)) is None
    assert TRUE & m == m


# rule 8: min, max, where


def test_min_max_decided_by_bounds():
    check(minimum(i, 7), i, "i")
    check(minimum(7, i), i, "i")
    check(maximum(i, 0), i, "i")
    check(minimum(i, 3), i, "i")
    check(minimum(i, 2), Min(i, Const(2)), "tl.minimum(i, 2)")
    check(maximum(x, 0), Max(x, Const(0)), "tl.maximum(x, 0)")
    check(minimum(x, x), x, "x")


def test_where_with_a_decided_condition_picks_a_branch():
    check(where(lt(i, 4), a, b), a, "a")
    check(where(lt(i, 0), a, b), b, "b")
    check(where(lt(x, 0), a, a), a, "a")
    check(
        where(lt(x, 0), -x, x),
        Where(Cmp("<", x, Const(0)), Mul(x, Const(-1)), x),
        "tl.where(x < 0, -x, x)",
    )


# rendering


@pytest.mark.parametrize(
    ("e", "text"),
    [
        (x - 3, "x - 3"),
        (a - b, "a - b"),
        (-x, "-x"),
        (-(a + b), "-a - b"),
        (a - 2 * b, "a - b * 2"),
        ((a + b) * c, "(a + b) * c"),
        (Mul(Const(-1), a), "-a"),
        (Mul(Add((a, b)), Const(-1)), "-(a + b)"),
        (Mul(a, Const(-3)), "a * -3"),
        (Add((a, Mul(Add((b, c)), Const(-1)))), "a - (b + c)"),
        (Add((a, Const(-3))), "a - 3"),
        (FloorDiv(a, Mul(b, c)), "a // (b * c)"),
        (Mul(FloorDiv(a, b), c), "a // b * c"),
        (Mod(Add((a, b)), c), "(a + b) % c"),
        (lt(a + 1, b * 2), "a + 1 < b * 2"),
        (Cmp("<", Cmp("<", a, b), c), "(a < b) < c"),
        (where(lt(a, b) & lt(b, c), a + 1, c), "tl.where((a < b) & (b < c), a + 1, c)"),
        (
            Sym("rm[:, None]", 0, 16) * 64 + Sym("rn[None, :]", 0, 64),
            "rm[:, None] * 64 + rn[None, :]",
        ),
        (Sym("pid.to(tl.int64)", lane=False) * 4, "pid.to(tl.int64) * 4"),
    ],
)
def test_render(e, text):
    assert render(e) == text
    if "rm[" not in text and "tl.int64" not in text:  # these are checked as text only
        env = {"a": 7, "b": -3, "c": 5, "x": 4}
        assert eval(text, {"tl": TL}, env) == evaluate(e, env)


# bounds and lane invariance


def test_bounds():
    assert bounds(i * 6 + j) == (0, 24)
    assert bounds(i * -2 + 1) == (-5, 2)
    assert bounds(x + i) == (None, None)
    assert bounds(offs % 8) == (0, 8)
    assert bounds(FloorDiv(Sym("k", -7, 7), Const(2))) == (-4, 4)
    assert bounds(Mul(i, j)) == (0, 16)
    assert bounds(Min(x, i)) == (None, 4) and bounds(Max(x, i)) == (0, None)
    assert bounds(Where(lt(x, 0), i, j)) == (0, 6)
    assert bounds(lt(x, 0)) == (0, 2)


def test_lane_invariance():
    assert is_lane_invariant(pid * 4 + 3)
    assert is_lane_invariant(Const(5))
    assert not is_lane_invariant(pid * 4 + offs)
    assert not is_lane_invariant(where(lt(offs, 3), pid, 0))
    assert is_lane_invariant(pid + offs - offs)  # the lane-varying part cancels


# properties over random trees

OPS = ["<", "<=", ">=", ">", "==", "!="]
FACTORS = st.sampled_from([1, 2, 3, 4, 6, 8, 12, 24])  # with common factors, for the rules


def _ints(leaves, depth):
    leaf = st.sampled_from(leaves) | st.integers(-12, 12).map(Const)
    if depth == 0:
        return leaf
    sub = _ints(leaves, depth - 1)
    k = FACTORS.map(Const)
    return st.one_of(
        leaf,
        st.lists(sub, min_size=2, max_size=3).map(lambda ts: Add(tuple(ts))),
        st.builds(Mul, sub, sub),
        st.builds(Mul, sub, k | st.integers(-3, -1).map(Const)),
        st.builds(FloorDiv, sub, k),
        st.builds(Mod, sub, k),
        st.builds(Min, sub, sub),
        st.builds(Max, sub, sub),
        st.builds(Where, _masks(sub), sub, sub),
        st.builds(_split_join, sub, FACTORS, st.sampled_from([None, 2, 3, 4]), st.integers(-2, 2)),
    )


def _split_join(t, d, m, s):
    """A reshape's split and join, raw: ``(t // d % m) * (d*s) + (t % d) * s``."""
    high = FloorDiv(t, Const(d)) if m is None else Mod(FloorDiv(t, Const(d)), Const(m))
    return Add((Mul(high, Const(d * s)), Mul(Mod(t, Const(d)), Const(s))))


def _masks(ints):
    cmp = st.builds(Cmp, st.sampled_from(OPS), ints, ints)
    return cmp | st.lists(cmp, min_size=2, max_size=3).map(lambda ts: And(tuple(ts)))


# trees are drawn over unranged placeholders, built once; each case then binds them to
# symbols with random ranges
NAMES = ("i", "j", "k", "u")
INTS = _ints([Sym(n) for n in NAMES], 3)
TREES = INTS | _masks(INTS)


def _bind(e, syms):
    """The raw tree ``e`` with each placeholder replaced by its ranged symbol."""
    if isinstance(e, Sym):
        return syms[e.name]
    kw = {}
    for f in fields(e):
        v = getattr(e, f.name)
        if isinstance(v, tuple):
            v = tuple(_bind(t, syms) for t in v)
        kw[f.name] = _bind(v, syms) if isinstance(v, Expr) else v
    return type(e)(**kw)


@st.composite
def cases(draw):
    """A raw tree (integer or mask) over symbols with random ranges ("u" unbounded), and an
    env within those ranges."""
    syms, env = {"u": Sym("u")}, {"u": draw(st.integers(-40, 40))}
    for name in NAMES[:-1]:
        lo, width = draw(st.integers(-20, 20)), draw(st.integers(1, 60))
        syms[name] = Sym(name, lo, lo + width, lane=draw(st.booleans()))
        env[name] = draw(st.integers(lo, lo + width - 1))
    return _bind(draw(TREES), syms), env


def _in_bounds(e, v):
    lo, hi = bounds(e)
    return (lo is None or lo <= v) and (hi is None or v < hi)


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_simplify_render_and_bounds_agree_with_python(case):
    """One property run, several checks (drawing trees costs more than checking them): the
    simplified tree has the raw tree's value, is a fixpoint of ``simplify`` and is lane
    invariant if the raw tree is; both trees' rendered source evaluates as Python to their
    value, which lies in their bounds."""
    raw, env = case
    s = simplify(raw)
    assert evaluate(s, env) == evaluate(raw, env)
    assert simplify(s) == s
    assert is_lane_invariant(s) or not is_lane_invariant(raw)
    for e in (raw, s):
        assert eval(render(e), {"tl": TL}, dict(env)) == evaluate(e, env), render(e)
        assert _in_bounds(e, evaluate(e, env)), (render(e), bounds(e))
