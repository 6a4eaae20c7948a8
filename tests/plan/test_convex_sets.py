"""The precomputed convexity test (``kernels/region.convex_sets``) that
enumeration asks before matching a set agrees with ``region.convexity``,
which walks the graph from the set each time."""

from __future__ import annotations

import itertools
import random

import pytest

from orchestrate import ir
from orchestrate.cost.devices import get_device
from orchestrate.ir import Op
from orchestrate.kernels.region import convex_sets, convexity
from orchestrate.kernels.spec import Target
from orchestrate.plan import candidates
from orchestrate.plan.candidates import enumerate_kernels
from tests import graphs

DEVICE = get_device("h100")
T = ir.TensorType((4,), "float32")


def _dag(seed: int, n_nodes: int) -> ir.Graph:
    """A random DAG of adds and exps over one input, wired to any earlier
    node (long edges make paths that leave a set and come back)."""
    rng = random.Random(seed)
    names = ["x"]
    nodes = []
    for i in range(n_nodes):
        k = 1 if rng.random() < 0.3 else 2
        inputs = tuple(rng.choice(names) for _ in range(k))
        nodes.append(ir.Node(Op.EXP if k == 1 else Op.ADD, f"n{i}", inputs, T))
        names.append(f"n{i}")
    return ir.Graph(tuple(nodes), (ir.Input("x", T),), (f"n{n_nodes - 1}",), {})


def _chain_with_bypass() -> ir.Graph:
    """a -> b -> c and a -> c: {a, c} leaves through b and comes back."""
    return ir.Graph(
        (
            ir.Node(Op.EXP, "a", ("x",), T),
            ir.Node(Op.EXP, "b", ("a",), T),
            ir.Node(Op.ADD, "c", ("a", "b"), T),
        ),
        (ir.Input("x", T),),
        ("c",),
        {},
    )


def test_a_set_with_a_path_out_and_back_is_not_convex():
    g = _chain_with_bypass()
    members = ["a", "b", "c"]
    sets = convex_sets(g, members)
    assert not sets.convex(0b101)
    assert convexity(g, {"a", "c"}) is not None
    assert sets.convex(0b111) and sets.convex(0b011) and sets.convex(0b110)
    # b outside the members (another partition's): the path still leaves {a, c}
    assert not convex_sets(g, ["a", "c"]).convex(0b11)


@pytest.mark.parametrize("seed", range(12))
def test_agrees_with_convexity_on_every_subset(seed):
    g = _dag(seed, 9)
    rng = random.Random(seed)
    names = [n.name for n in g.nodes]
    # the members: all nodes, or a random part (paths may leave through the rest)
    members = names if seed % 2 else rng.sample(names, 6)
    sets = convex_sets(g, members)
    refused = 0
    for k in range(1, len(members) + 1):
        for combo in itertools.combinations(range(len(members)), k):
            expected = convexity(g, {members[i] for i in combo}) is None
            mask = sum(1 << i for i in combo)
            assert sets.convex(mask) == expected, [members[i] for i in combo]
            refused += not expected
    assert refused > 0 or seed % 2 == 0  # every full random DAG here has a non-convex set


class _Everything:
    def convex(self, mask) -> bool:
        return True


@pytest.mark.parametrize("seed", range(6))
def test_enumeration_is_the_same_without_the_shortcut(seed, monkeypatch):
    """Skipping the non-convex sets before matching them counts them as
    rejected, as matching them did: the same kernels, the same counts."""
    g = graphs.random_dag(seed, 8)
    names = [n.name for n in g.nodes]
    fast = enumerate_kernels(g, names, Target(DEVICE))
    monkeypatch.setattr(candidates, "convex_sets", lambda graph, members: _Everything())
    slow = enumerate_kernels(g, names, Target(DEVICE))
    assert fast == slow


def test_the_path_named_does_not_depend_on_string_hashing():
    """``convexity`` names the same path whatever order the set iterates in
    (a set of names iterates in an order of the process's string hashing:
    plan.json's declined reasons were different from run to run).  Each
    order is played by a dict's keys, which iterate as inserted."""
    g = _dag(3, 12)
    names = [n.name for n in g.nodes]
    refused = [c for c in itertools.combinations(names, 4) if convexity(g, set(c)) is not None]
    assert refused
    for combo in refused:
        reasons = {convexity(g, dict.fromkeys(p).keys()) for p in itertools.permutations(combo)}
        assert len(reasons) == 1, reasons


@pytest.mark.parametrize("mask", [0, 1, 0b1011, 1 << 70 | 1 << 3, (1 << 64) - 1])
def test_bits_are_the_set_indices_smallest_first(mask):
    assert list(candidates.bits(mask)) == [i for i in range(mask.bit_length()) if mask >> i & 1]
