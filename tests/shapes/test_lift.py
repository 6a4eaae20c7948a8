"""Range bundles, the pure parts: integer polynomials lifted from
values on a grid (``shapes/poly.py``), the grid's values (``shapes/probes.py``)
and the family's file format (``shapes/family.py``).

Expected values come from a plain evaluator written here (``_evaluate``) and
from hand computations, never from the code under test.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrate.errors import InputError
from orchestrate.shapes.dims import DimRange
from orchestrate.shapes.family import Dim, Family
from orchestrate.shapes.poly import Grid, NotLifted, Poly
from orchestrate.shapes.probes import grid_values


def _evaluate(coeffs: dict[tuple[int, ...], int], point: tuple[int, ...]) -> int:
    """sum c * prod v**e: the polynomial a test chose, evaluated independently."""
    return sum(c * math.prod(v**e for v, e in zip(point, exps)) for exps, c in coeffs.items())


@st.composite
def _polynomials(draw):
    """(grid values per dimension, coefficients of degree <= count - 1 per dimension)."""
    rank = draw(st.integers(1, 3))
    values = []
    for _ in range(rank):
        n = draw(st.integers(1, 3))
        vs = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n, unique=True))
        values.append(tuple(sorted(vs)))
    monomials = list(itertools.product(*(range(len(v)) for v in values)))
    coeffs = {m: draw(st.integers(-30, 30)) for m in monomials}
    return tuple(values), coeffs


@settings(max_examples=150, deadline=None)
@given(_polynomials(), st.lists(st.integers(1, 500), min_size=3, max_size=3))
def test_lift_recovers_integer_polynomials_exactly(case, off_grid):
    values, coeffs = case
    grid = Grid(values)
    seen = {p: _evaluate(coeffs, p) for p in grid.points}
    lifted = grid.lift(seen)
    assert isinstance(lifted, Poly), lifted
    # the same terms, zero coefficients dropped
    assert dict(lifted.terms) == {m: c for m, c in coeffs.items() if c}
    point = tuple(off_grid[: grid.rank])
    assert lifted(point) == _evaluate(coeffs, point)
    # a sequence in points order gives the same polynomial as the mapping
    assert grid.lift([seen[p] for p in grid.points]) == lifted


@settings(max_examples=100, deadline=None)
@given(_polynomials(), st.lists(st.integers(0, 300), min_size=3, max_size=3))
def test_source_is_python_giving_the_same_values(case, point):
    values, coeffs = case
    poly = Grid(values).lift({p: _evaluate(coeffs, p) for p in Grid(values).points})
    codes = [f"dim{i}" for i in range(len(values))]
    text = poly.source(codes)
    binding = tuple(point[: len(values)])
    got = eval(text, {"__builtins__": {}}, dict(zip(codes, binding)))  # noqa: S307
    assert got == _evaluate(coeffs, binding) == poly(binding)


@pytest.mark.parametrize(
    "terms, want",
    [
        ((), "0"),
        ((((0, 0), 7),), "7"),
        ((((0, 0), -7),), "-7"),
        ((((1, 0), 1),), "dim0"),
        ((((0, 0), 2), ((1, 1), 3)), "3 * dim0 * dim1 + 2"),
        ((((0, 1), -1), ((2, 0), 1)), "dim0 * dim0 - dim1"),
        ((((1, 0), -4),), "-4 * dim0"),
    ],
)
def test_source_by_hand(terms, want):
    assert Poly(terms).source(["dim0", "dim1"]) == want


# Values no polynomial gives: each either is NotLifted or, when a polynomial
# happens to pass through the grid's values, differs from it off the grid.
# That second case is why the callers check every lift at MIN, OPT and MAX.


def test_ceiling_division_with_a_fractional_slope_is_not_lifted():
    # ceil(v / 16) at 17, 33, 49 is 2, 3, 4: the line v / 16 + 15/16, not integer
    got = Grid(((17, 33, 49),)).lift([math.ceil(v / 16) for v in (17, 33, 49)])
    assert isinstance(got, NotLifted)
    assert "no polynomial with integer coefficients" in got.reason


def test_ceiling_division_constant_on_the_grid_is_fitted_by_chance():
    # ceil(v / 16) is 1 at 3, 7 and 9: the constant 1, wrong at 33 (3)
    got = Grid(((3, 7, 9),)).lift([1, 1, 1])
    assert got == Poly.const(1, 1)
    assert got((33,)) == 1 != math.ceil(33 / 16)


def test_next_power_of_two_is_not_lifted():
    # 4, 8, 8 at 3, 5, 7: second difference -4 over 2 * 2**2 gives x**2 coefficient -1/2
    got = Grid(((3, 5, 7),)).lift([4, 8, 8])
    assert isinstance(got, NotLifted)


def test_power_of_two_fitted_by_chance_differs_off_the_grid():
    # 2**v at 1, 2, 3 is 2, 4, 8 = v*v - v + 2 there, but 2**4 = 16 != 14
    got = Grid(((1, 2, 3),)).lift([2, 4, 8])
    assert got == Poly((((0,), 2), ((1,), -1), ((2,), 1)))
    assert got((4,)) == 14 != 2**4


def test_two_dimensional_product_of_ceilings_is_not_lifted():
    grid = Grid(((17, 33, 49), (3, 5, 7)))
    got = grid.lift([math.ceil(a / 16) * b for a, b in grid.points])
    assert isinstance(got, NotLifted)


@pytest.mark.parametrize("values", [((),), ((1, 2, 3, 4),), ((3, 3),), ((1, 2), (5, 5, 6))])
def test_grid_refuses_bad_values(values):
    with pytest.raises(ValueError, match="one to three distinct values"):
        Grid(values)


# -- the file form ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(_polynomials())
def test_poly_json_round_trip(case):
    values, coeffs = case
    poly = Poly(tuple(sorted((m, c) for m, c in coeffs.items() if c)))
    assert Poly.from_json(poly.to_json(), len(values), "here") == poly


@pytest.mark.parametrize(
    "data, match",
    [
        (None, "not a polynomial"),
        (5, "not a polynomial"),
        ([[[0, 1]]], "not a polynomial"),  # a term without its coefficient
        ([[[0, "x"], 3]], "not a polynomial"),
        ([[[0, 1], "three"]], "not a polynomial"),
        ([[[1], 3]], "wrong shape"),  # rank 1 for a rank-2 polynomial
        ([[[0, 3], 3]], "wrong shape"),  # degree 3: no grid lifts it
        ([[[-1, 0], 3]], "wrong shape"),
    ],
)
def test_poly_from_json_refuses_malformed_data(data, match):
    with pytest.raises(ValueError, match=match) as e:
        Poly.from_json(data, 2, "dims.json shapes.h")
    assert str(e.value).startswith("dims.json shapes.h: ")


def test_poly_from_json_refuses_a_fractional_coefficient():
    # int(2.5) == 2 would read dims.json's 2.5 * seq as 2 * seq
    for data in ([[[0, 1], 2.5]], [[[0, 1], "3"]], [[[0, 1], True]]):
        with pytest.raises(ValueError, match="integer coefficients"):
            Poly.from_json(data, 2, "dims.json")


def _family() -> Family:
    b, s = Poly((((1, 0), 1),)), Poly((((0, 1), 1),))
    sixteen = Poly.const(16, 2)
    dims = (Dim("batch", "dim0", DimRange(1, 8, 4)), Dim("seq", "dim1", DimRange(2, 64, 32)))
    return Family(
        dims=dims,
        grid=Grid(((3, 5, 7), (3, 33, 63))),
        inputs={"x": (b, s, sixteen)},
        shapes={"h": (Poly((((1, 1), 1),)), sixteen), "scores": (b, s, s)},
        attrs={
            "reshape": {
                "shape": (b, s, Poly.const(4, 2), Poly.const(4, 2)),
                "axis": -1,
                "mode": "x",
            }
        },
        sliced={"pos": (s, sixteen)},
    )


def test_family_json_round_trip():
    family = _family()
    again = Family.from_json(family.to_json(), "P.dims.json")
    assert again == family
    assert again.input_shape("x", (3, 10)) == (3, 10, 16)
    assert again.named((3, 10)) == "batch=3, seq=10"


def _broken(edit) -> dict:
    data = _family().to_json()
    edit(data)
    return data


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.pop("grid"),
        lambda d: d["dims"][1].update(code="seq"),  # code names are dim0, dim1, ...
        lambda d: d["dims"][0].update(min="one"),
        lambda d: d["grid"].pop(),  # grid and dims of different ranks
        lambda d: d["grid"][0].append(9),  # four values
        lambda d: d["shapes"]["h"][0].append([[0, 0, 0], 1]),  # a rank-3 term in rank 2
        lambda d: d["attrs"]["reshape"].update(axis={"value": [1, 2]}),
        lambda d: d["attrs"]["reshape"].update(axis={"other": 1}),
        lambda d: d.update(inputs=[1, 2]),
    ],
)
def test_family_from_json_refuses_malformed_data(edit):
    with pytest.raises(InputError, match=r"^P\.dims\.json: malformed dimensions \(") as e:
        Family.from_json(_broken(edit), "P.dims.json")
    assert "\n" not in str(e.value)


# -- the grid's values ------------------------------------------------------------------------


@st.composite
def _ranges(draw):
    lo = draw(st.integers(1, 200))
    hi = draw(st.integers(lo, lo + 300))
    avoid = draw(st.sets(st.integers(1, 520), max_size=40))
    return DimRange(lo, hi), avoid


@settings(max_examples=300, deadline=None)
@given(_ranges())
def test_grid_values_are_generic_values_of_the_range(case):
    r, avoid = case
    got = grid_values(r, avoid)
    everything = range(r.min, r.max + 1)
    # always three distinct values, odd and >= 3: a power-of-two block never
    # divides them and no size-1 or size-2 special case is printed there
    assert len(set(got)) == len(got) == 3 and list(got) == sorted(got)
    assert all(v % 2 == 1 and v >= 3 for v in got)
    Grid((got,))  # a valid grid dimension
    preferred = [v for v in everything if v % 2 == 1 and v >= 3 and v not in avoid]
    generic = [v for v in everything if v % 2 == 1 and v >= 3]
    if len(preferred) >= 3:
        assert all(v in r and v not in avoid for v in got)
    elif len(generic) >= 3:
        assert all(v in r for v in got)
    else:  # a short range: its generic values, then fresh ones just above MAX
        inside = [v for v in got if v in r]
        assert inside == generic
        assert all(v > r.max and v not in avoid for v in got if v not in r)


def test_grid_values_by_hand():
    # odd, >= 3, not 5 (avoided): 3, 7, 9, ... 63 -> near a quarter, the middle, the top (pool[7], pool[15], pool[-1])
    assert grid_values(DimRange(2, 64), {5}) == (19, 35, 63)
    # too short for three generic values: 3 from the range, then 5 and 7 above it
    assert grid_values(DimRange(1, 3)) == (3, 5, 7)
    assert grid_values(DimRange(1, 4)) == (3, 5, 7)
    assert grid_values(DimRange(1, 2)) == (3, 5, 7)
    assert grid_values(DimRange(1, 2), {5}) == (3, 7, 9)


def test_grid_values_of_a_huge_range_are_found_without_listing_it():
    """1..10**9 (a list of it took 24 GB): three generic values near the
    quarter, the middle and the top, found by stepping past what is not."""
    r = DimRange(1, 10**9)
    got = grid_values(r, avoid={250_000_001})
    assert got == (250_000_003, 500_000_001, 999_999_999)
    assert all(v % 2 == 1 and v >= 3 and r.min <= v <= r.max for v in got)
