"""What times a kernel: the protocol the tuner calls, and a stand-in.

A timer says what it measures on (``TimerInfo``: the GPU's name, its driver,
Triton's version, how it times, and whether its figures are real) and times
one spec at its configuration, in microseconds.  ``prepare`` is called once
with every spec about to be timed, so a timer can compile them all ahead
(in parallel) and keep compilation out of the timing.

The real one is ``tune.gpu.GpuTimer`` (``triton.testing.do_bench`` on the
GPU present).  ``FakeTimer`` returns figures from a function, deterministic
and labelled fake: tests inject it to exercise the whole tuning path on a
CPU.  Its figures are never measurements, and every record made from them
says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec


@dataclass(frozen=True)
class TimerInfo:
    """What a timer's figures are measurements of (part of the cache key)."""

    device: str  # the GPU's own name (torch.cuda.get_device_name), or a fake's label
    driver: str  # NVIDIA driver version
    triton: str  # Triton version
    method: str  # how a figure is taken, for the records
    fake: bool = False  # figures made up, not measured


class Timer(Protocol):
    info: TimerInfo

    def refuses(self, spec: KernelSpec) -> str | None:
        """Why this timer cannot time ``spec`` at all (None: it can)."""

    def prepare(self, graph: Graph, specs: Sequence[KernelSpec]) -> None:
        """Get ready to time ``specs`` (compile them, say); may do nothing."""

    def time(self, graph: Graph, spec: KernelSpec) -> float:
        """Microseconds of one launch of ``spec`` at ``spec.config``."""


class FakeTimer:
    """Figures from ``figure(graph, spec) -> µs``; counts what it timed.
    ``fail``: hashes whose timing raises (a configuration that does not run)."""

    def __init__(
        self,
        figure: Callable[[Graph, KernelSpec], float],
        *,
        device: str = "fake GPU",
        driver: str = "fake",
        triton: str = "fake",
        fail: frozenset[str] = frozenset(),
    ):
        self.figure = figure
        self.info = TimerInfo(
            device, driver, triton, "fake: figures from a function, not measured", fake=True
        )
        self.fail = fail
        self.timed: list[str] = []  # spec hashes, in the order timed
        self.prepared: list[str] = []

    def refuses(self, spec: KernelSpec) -> str | None:
        return None

    def prepare(self, graph: Graph, specs: Sequence[KernelSpec]) -> None:
        self.prepared += [s.hash for s in specs]

    def time(self, graph: Graph, spec: KernelSpec) -> float:
        if spec.hash in self.fail:
            raise RuntimeError(f"fake failure of {spec.template} {spec.hash}")
        self.timed.append(spec.hash)
        return float(self.figure(graph, spec))
