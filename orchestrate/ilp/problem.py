"""One linear program's instance: a partition's candidates, priced, ready to solve.

``Problem`` holds the candidate specs of one partition with their costs,
the tensors available from outside, the tensors it must output, the
primitive edges (they tighten the relaxation) and the warm start.  Both
baselines' kernels are added as candidates (``include``), so the optimum is
never worse than either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrate.cost.roofline import Cost, Prices
from orchestrate.errors import InputError
from orchestrate.ilp import program
from orchestrate.ilp.baselines import Priced
from orchestrate.ilp.partition import Partition
from orchestrate.ir import MAX_ELEMENTS, Graph
from orchestrate.kernels.spec import KernelSpec
from orchestrate.plan.candidates import Enumeration


@dataclass
class Problem:
    part: Partition
    kernels: list[KernelSpec]
    costs: list[Cost]
    edges: list[tuple[str, str]]
    found: Enumeration  # what enumeration examined, rejected and pruned
    warm: list[program.Choice] = field(default_factory=list)

    def include(self, prices: Prices, plan: Sequence[Priced]) -> list[program.Choice]:
        """Add the kernels of ``plan`` to the candidates; return them as choices."""
        # (a node set may have two candidates: a generated kernel and a library call)
        index = {(k.template, k.nodes, k.outputs): i for i, k in enumerate(self.kernels)}
        choices = []
        for p in plan:
            key = (p.kernel.template, p.kernel.nodes, p.kernel.outputs)
            if key not in index:
                index[key] = len(self.kernels)
                self.kernels.append(p.kernel)
                self.costs.append(prices.cost(p.kernel))
            choices.append(program.Choice(index[key], p.writes))
        return choices

    def solve(
        self, prices: Prices, *, time_limit, recompute, budget=None, budget_exempt=frozenset()
    ) -> program.Solution:
        return program.solve(
            *self._data(prices),
            warm=self.warm,
            time_limit=time_limit,
            recompute=recompute,
            edges=self.edges,
            name=f"partition {self.part.index}",
            budget=budget,
            budget_exempt=budget_exempt,
            unwritable=unwritable(prices.graph, self.kernels),
        )

    def solve_each_without(
        self, prices: Prices, drops: Sequence[set[int]], clock, *, recompute
    ) -> list[program.Solution | InputError]:
        """The program re-solved once per set of candidates in ``drops``,
        each barred in turn (``program.solve_each_without``)."""
        return program.solve_each_without(
            drops,
            clock,
            *self._data(prices),
            warm=self.warm,
            recompute=recompute,
            edges=self.edges,
            name=f"partition {self.part.index}",
            unwritable=unwritable(prices.graph, self.kernels),
        )

    def _data(self, prices: Prices) -> tuple:
        """(kernels, costs, write times, sizes, available, required): what
        every solve of the program reads."""
        graph = prices.graph
        return (
            self.kernels,
            self.costs,
            {t: prices.write_us(t) for k in self.kernels for t in k.optional},
            {t: graph.types[t].nbytes for k in self.kernels for t in (*k.outputs, *k.optional)},
            set(self.part.inputs),
            list(self.part.outputs),
        )

    def chosen(self, sol: program.Solution) -> list[tuple[KernelSpec, tuple[str, ...]]]:
        return [(self.kernels[c.kernel], c.writes) for c in sol.choices]


def unwritable(graph: Graph, kernels: Sequence[KernelSpec]) -> dict[str, str]:
    """The tensors the candidates could write that are too large to hold in
    memory (``ir.MAX_ELEMENTS``), each with the reason: only a kernel that
    keeps them on chip may make them (a flash kernel's scores)."""
    out = {}
    for k in kernels:
        for t in (*k.outputs, *k.optional):
            size = graph.types[t].size
            if size > MAX_ELEMENTS and t not in out:
                out[t] = (
                    f"{size:,} elements, more than the {MAX_ELEMENTS:,} (2**36) one tensor in memory may have"
                )
    return out


def problem(graph: Graph, part: Partition, found: Enumeration, prices: Prices) -> Problem:
    kernels = list(found.kernels)
    return Problem(
        part, kernels, [prices.cost(k) for k in kernels], primitive_edges(graph, part.nodes), found
    )


def primitive_edges(graph: Graph, nodes) -> list[tuple[str, str]]:
    inside = set(nodes)
    return [(q, n) for n in nodes for q in graph.producer[n].inputs if q in inside]
