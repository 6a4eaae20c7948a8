"""Range bundles, the pure parts: dimensions as SymInts (``shapes/symint.py``),
dimension expressions printed as source (``shapes/poly.py``), the hint
binding (``shapes/hints.py``) and the family's file format (``shapes/family.py``).

Expected values come from plain Python over the same numbers and from hand
computations, never from the code under test.
"""

from __future__ import annotations

import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrate.errors import InputError
from orchestrate.shapes.dims import DimRange
from orchestrate.shapes.family import Dim, Family
from orchestrate.shapes.hints import hint_binding, hint_value
from orchestrate.shapes.poly import Poly
from orchestrate.shapes.symint import Symbols, SymInt, Undecided, strict, sym, upper

RANGES = {"batch": DimRange(1, 8), "seq": DimRange(2, 64)}
SYMBOLS = Symbols(("batch", "seq"), RANGES, {"batch": 3, "seq": 35})
B = SymInt(Poly.of("batch"), SYMBOLS)
S = SymInt(Poly.of("seq"), SYMBOLS)


def test_arithmetic_keeps_the_formula_and_the_hint():
    rows = B * S
    assert isinstance(rows, SymInt) and int.__int__(rows) == 3 * 35
    assert rows.poly == Poly.of("batch") * Poly.of("seq")
    assert math.prod([B, S, 64]).poly == 64 * Poly.of("batch") * Poly.of("seq")
    assert (1 + S).poly == Poly.of("seq") + 1 and (S - 1).poly == Poly.of("seq") - 1
    assert sum([B, S]).poly == Poly.of("batch") + Poly.of("seq")
    # exact quotients stay formulas; what cancels to a number is a plain int
    assert (B * S * 64 // 64).poly == (B * S).poly and (B * S * 64) // (B * 64) == S
    assert type(S - S) is int and S - S == 0 and (B * S * 64) % 64 == 0
    assert pickle.loads(pickle.dumps(B * S)).poly == (B * S).poly


def test_equality_compares_formulas_not_values():
    """batch == 1 is False though the range holds 1: code printed for a
    general batch is right at 1 too, and the hint never decides it."""
    assert B != 1 and not (B == 3) and S != B and S == SymInt(Poly.of("seq"), SYMBOLS)
    assert {S: "seq"}[SymInt(Poly.of("seq"), SYMBOLS)] == "seq"
    assert B in (1, B) and B not in (1, 3)


def test_the_range_decides_what_it_can():
    assert S <= 64 and S < 65 and S > 1 and S >= 2 and not (S > 64) and not (S < 2)
    assert bool(S) and upper(B * S) == 8 * 64 and upper(7) == 7
    assert abs(S - 1) is not None and max(S, 64) == 64
    assert (B * S).bounds == (2, 512)


@pytest.mark.parametrize(
    "question",
    [
        lambda: S < 10,
        lambda: S > B,
        lambda: S % 4,
        lambda: S // 4,
        lambda: S / 2,
        lambda: int(S),
        lambda: float(S),
        lambda: f"{S:5d}",
        lambda: bool(S - 10),
    ],
)
def test_what_the_range_does_not_decide_is_refused_when_strict(question):
    """Outside ``strict`` such a question reads the hint (and the checks at
    MIN, OPT and MAX catch a wrong guess); inside, it is an error: printed
    code may not depend on the binding."""
    question()  # the hint answers
    with strict(), pytest.raises(Undecided):
        question()


def test_source_text_is_the_formula_over_code_names():
    assert f"{S}" == "dim1" and f"{B * S}" == "(dim0 * dim1)" and f"{S + 1}" == "(dim1 + 1)"
    assert str(64 * B * S) == "64*dim0*dim1" and repr(S) == "dim1"
    assert sym(Poly.of(5), SYMBOLS) == 5 and type(sym(Poly.of(5), SYMBOLS)) is int


@pytest.mark.parametrize(
    "poly, want",
    [
        (Poly(), "0"),
        (Poly.of(7), "7"),
        (Poly.of(-7), "-7"),
        (Poly.of("batch"), "dim0"),
        (3 * Poly.of("batch") * Poly.of("seq") + 2, "3 * dim0 * dim1 + 2"),
        (Poly.of("batch") ** 2 - Poly.of("seq"), "dim0 * dim0 - dim1"),
        (-4 * Poly.of("batch"), "-4 * dim0"),
    ],
)
def test_source_by_hand(poly, want):
    assert poly.source({"batch": "dim0", "seq": "dim1"}) == want


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(st.tuples(st.integers(0, 2), st.integers(0, 2)), st.integers(-30, 30)),
    st.integers(0, 300),
    st.integers(0, 300),
)
def test_source_is_python_giving_the_same_values(coeffs, dim0, dim1):
    p = Poly()
    for (e0, e1), c in coeffs.items():
        p = p + c * Poly.of("batch") ** e0 * Poly.of("seq") ** e1
    text = p.source({"batch": "dim0", "seq": "dim1"})
    want = sum(c * dim0**e0 * dim1**e1 for (e0, e1), c in coeffs.items())
    assert eval(text, {"dim0": dim0, "dim1": dim1}) == want  # noqa: S307 - our own text


@pytest.mark.parametrize(
    "data, match",
    [
        (None, "not a polynomial"),
        (5, "not a polynomial"),
        ([[[0, 1]]], "not a polynomial"),  # a term without its coefficient
        ([[[0, "x"], 3]], "not a polynomial"),
        ([[[0, 1], "three"]], "not a polynomial"),
        ([[[1], 3]], "wrong shape"),  # one exponent for two symbols
        ([[[0, 9], 3]], "wrong shape"),  # degree 9: no shape is that
        ([[[-1, 0], 3]], "wrong shape"),
    ],
)
def test_poly_from_json_refuses_malformed_data(data, match):
    with pytest.raises(ValueError, match=match) as e:
        Poly.from_json(data, ["batch", "seq"], "dims.json shapes.h")
    assert str(e.value).startswith("dims.json shapes.h: ")


def test_poly_from_json_refuses_a_fractional_coefficient():
    # int(2.5) == 2 would read dims.json's 2.5 * seq as 2 * seq
    for data in ([[[0, 1], 2.5]], [[[0, 1], "3"]], [[[0, 1], True]]):
        with pytest.raises(ValueError, match="integer coefficients"):
            Poly.from_json(data, ["batch", "seq"], "dims.json")


def _family() -> Family:
    b, s = Poly.of("batch"), Poly.of("seq")
    sixteen = Poly.of(16)
    dims = (Dim("batch", "dim0", DimRange(1, 8, 4)), Dim("seq", "dim1", DimRange(2, 64, 32)))
    return Family(
        dims=dims,
        inputs={"x": (b, s, sixteen)},
        shapes={"h": (b * s, sixteen), "scores": (b, s, s)},
        attrs={"reshape": {"shape": (b, s, Poly.of(4), Poly.of(4)), "axis": -1, "mode": "x"}},
        sliced={"pos": (s, sixteen)},
        computed={"count": ((), "float32", (s,))},
    )


def test_family_json_round_trip():
    family = _family()
    again = Family.from_json(family.to_json(), "P.dims.json")
    assert again == family
    assert again.input_shape("x", (3, 10)) == (3, 10, 16)
    assert again.named((3, 10)) == "batch=3, seq=10"
    assert again.computed_at("count", (3, 10)).item() == 10.0


def _broken(edit) -> dict:
    data = _family().to_json()
    edit(data)
    return data


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.pop("inputs"),
        lambda d: d["dims"][1].update(code="seq"),  # code names are dim0, dim1, ...
        lambda d: d["dims"][0].update(min="one"),
        lambda d: d["dims"][0].update(min=9),  # MIN above MAX
        lambda d: d["dims"][1].update(name="batch"),  # two dimensions of one name
        lambda d: d["shapes"]["h"][0].append([[0, 0, 0], 1]),  # three exponents for two
        lambda d: d["attrs"]["reshape"].update(axis={"value": [1, 2]}),
        lambda d: d["attrs"]["reshape"].update(axis={"other": 1}),
        lambda d: d["computed"]["count"].update(dtype="object"),
        lambda d: d.update(inputs=[1, 2]),
    ],
)
def test_family_from_json_refuses_malformed_data(edit):
    with pytest.raises(InputError, match=r"^P\.dims\.json: malformed dimensions \(") as e:
        Family.from_json(_broken(edit), "P.dims.json")
    assert "\n" not in str(e.value)


# -- the hint binding --------------------------------------------------------------------------


@st.composite
def _ranges(draw):
    lo = draw(st.integers(1, 200))
    hi = draw(st.integers(lo, lo + 300))
    avoid = draw(st.sets(st.integers(1, 520), max_size=40))
    return DimRange(lo, hi), avoid


@settings(max_examples=300, deadline=None)
@given(_ranges())
def test_the_hint_is_a_generic_value_of_the_range(case):
    r, avoid = case
    got = hint_value(r, avoid)
    # odd and >= 3: a power-of-two block never divides it and no size-1 or
    # size-2 special case is made there; never a value to avoid
    assert got % 2 == 1 and got >= 3 and got not in avoid
    generic = [v for v in range(r.min, r.max + 1) if v % 2 == 1 and v >= 3 and v not in avoid]
    if generic:  # inside the range, the generic value nearest its middle
        middle = r.min + (r.max - r.min) // 2
        assert got in r and abs(got - middle) == min(abs(v - middle) for v in generic)
    else:  # a short range: the first generic value above MAX
        assert got > r.max
        assert all(v % 2 == 0 or v < 3 or v in avoid for v in range(r.max + 1, got))


def test_hints_by_hand():
    assert hint_value(DimRange(2, 64), {33}) == 31
    assert hint_value(DimRange(1, 2)) == 3 and hint_value(DimRange(1, 2), {3}) == 5
    assert hint_binding([DimRange(1, 8), DimRange(1, 8)]) == (3, 5)  # each unlike the others


def test_the_hint_of_a_huge_range_is_found_without_listing_it():
    """1..10**9 (a list of it took 24 GB): the generic value nearest the middle."""
    got = hint_value(DimRange(1, 10**9), avoid={500_000_001})
    assert got == 499_999_999
