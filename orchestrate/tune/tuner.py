"""Tuning: the cost model orders each spec's configurations, the best few are timed.

For every distinct candidate spec (by structural hash; views excluded) the
rule table is asked again for the spec's node set, and every configuration
that fits is collected with the model's predicted time (the order
``kernels/rule.py``'s ``ranked`` gives a tuner).  The first ``configs`` are
timed, unless the cache (``tune/cache.py``) already holds them; each spec's
configurations are written to the cache as one transaction as soon as they
are timed, so an interrupted run keeps what it measured.  The fastest
measured configuration is the spec's: the linear program sees its time and
the plan runs it.  What the measurements teach the specs nobody timed is
``cost/measured.py``'s rule.

A configuration that fails to compile or run is left out with a line on
stderr (nothing is cached for it); a spec none of whose configurations ran
keeps the model's scaled figure.
"""

from __future__ import annotations

import math
import numbers
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from orchestrate.cost.measured import Measured, calibrate
from orchestrate.cost.roofline import Ranker
from orchestrate.errors import InputError
from orchestrate.ir import Graph
from orchestrate.kernels.spec import VIEW, KernelSpec, Target, with_hash
from orchestrate.plan import Tuning
from orchestrate.templates import match_all
from orchestrate.tune.cache import Cache, Key, Row
from orchestrate.tune.records import describe, spec_dtype
from orchestrate.tune.timer import Timer

Progress = Callable[[str, int, int], None]
CONFIGS = 3  # configurations timed per spec (--tune-configs)


@dataclass(frozen=True)
class Tune:
    """How to tune: the timer, the configurations timed per spec, and the
    cache file (None: the user's cache directory, ``tune.cache.default_path``)."""

    timer: Timer
    configs: int = CONFIGS
    cache: Path | None = None

    def __post_init__(self):
        n = self.configs
        if not isinstance(n, numbers.Integral) or isinstance(n, (bool, np.bool_)) or n < 1:
            raise InputError(f"configs={n!r}: must be an integer >= 1")
        if not callable(getattr(self.timer, "time", None)) or not hasattr(self.timer, "info"):
            raise InputError(f"timer: expected a tune.timer.Timer, got {type(self.timer).__name__}")


@dataclass(frozen=True)
class Tuned:
    """What tuning found: the prices, each spec's fastest configuration, and the report."""

    measured: Measured
    fastest: Mapping[str, KernelSpec]  # model-chosen spec hash -> that spec at its fastest config
    report: Tuning

    def apply(self, spec: KernelSpec) -> KernelSpec:
        """``spec`` at its fastest measured configuration (unchanged if not measured)."""
        best = self.fastest.get(spec.hash)
        if best is None or best.config == spec.config or best.template != spec.template:
            return spec
        return replace(spec, config=best.config, hash=best.hash)


@dataclass
class _Spec:
    spec: KernelSpec  # the model's choice
    options: list[tuple[KernelSpec, float]]  # (configuration, predicted µs), best first
    times: dict[str, float] = field(default_factory=dict)  # option hash -> µs


def alternatives(
    graph: Graph, spec: KernelSpec, target: Target, n: int
) -> list[tuple[KernelSpec, float]]:
    """The ``n`` configurations of ``spec`` the cost model ranks first, as
    (hashed spec, predicted µs), best first: the rule table asked again for
    the same node set, every fitting configuration of the spec's template
    that its rule ranks recorded."""
    model = Ranker(target.device)
    seen: list[tuple[float, int, KernelSpec]] = []

    def record(g: Graph, s: KernelSpec) -> float:
        us = model(g, s)
        seen.append((us, len(seen), s))
        return us

    match_all(graph, spec.nodes, replace(target, rank=record))  # every rule for the set
    mine = [x for x in seen if x[2].template == spec.template and x[2].outputs == spec.outputs]
    best = sorted(mine, key=lambda x: (x[0], x[1]))[:n]
    # a rule that ranks nothing (a library call: no configurations): its one spec
    return [(with_hash(graph, s), us) for us, _, s in best] or [(spec, model(graph, spec))]


def tune(
    graph: Graph,
    candidates: Iterable[KernelSpec],
    target: Target,
    settings: Tune,
    progress: Progress | None = None,
    reproducible: bool = False,
) -> Tuned:
    """Time the candidates' best configurations (cache first); the prices they make."""
    started = time.perf_counter()
    report = progress or (lambda stage, i, n: None)
    timer, info = settings.timer, settings.timer.info
    specs: dict[str, _Spec] = {}
    refused: dict[str, tuple[str, set[str]]] = {}  # template -> (why, spec hashes)
    for k in candidates:
        if k.template == VIEW or k.hash in specs:
            continue
        why = timer.refuses(k)
        if why is not None:
            refused.setdefault(k.template, (why, set()))[1].add(k.hash)
            continue
        specs[k.hash] = _Spec(k, alternatives(graph, k, target, settings.configs))
    for template, (why, hashes) in sorted(refused.items()):
        print(
            f"orchestrate: tune: {len(hashes)} {template} specs not timed ({why}): the "
            "model's time, scaled",
            file=sys.stderr,
        )
    dtypes = {h: spec_dtype(graph, s.spec) for h, s in specs.items()}

    def key(h: str, option: KernelSpec) -> Key:
        return Key(option.hash, info.device, dtypes[h], info.triton, info.driver)

    measured = 0
    now: dict[str, float] = {}  # option hash -> µs, timed in this run
    broken: set[str] = set()  # option hashes that failed to run in this run
    with Cache(settings.cache) as cache:
        hits: dict[str, float] = {}  # option hash -> µs, from the cache
        for h, s in specs.items():
            found = cache.get(key(h, o) for o, _ in s.options)
            s.times = {k.spec_hash: us for k, us in found.items()}
            hits.update(s.times)
        cached = len(hits)
        todo = [o for s in specs.values() for o, _ in s.options if o.hash not in s.times]
        if todo:
            timer.prepare(graph, _distinct(todo))
        pending = [s for s in specs.values() if any(o.hash not in s.times for o, _ in s.options)]
        for i, (h, s) in enumerate((h, s) for h, s in specs.items() if s in pending):
            rows = []
            for rank, (option, predicted) in enumerate(s.options):
                if option.hash in s.times:
                    continue
                if option.hash in now:  # another spec's option, timed already in this run
                    s.times[option.hash] = now[option.hash]
                    continue
                if option.hash in broken:
                    continue
                try:
                    us = float(timer.time(graph, option))
                    if not (math.isfinite(us) and us > 0):  # never cached, never used
                        raise ValueError(f"the timer returned {us!r} µs")
                except Exception as e:  # noqa: BLE001 - one configuration, reported and left out
                    broken.add(option.hash)
                    print(
                        f"orchestrate: tune: {option.template} {option.hash} "
                        f"{option.config.to_json()}: left out: {type(e).__name__}: "
                        f"{str(e)[:200]}",
                        file=sys.stderr,
                    )
                    continue
                s.times[option.hash] = now[option.hash] = us
                measured += 1
                record = describe(graph, option, target.device, rank) | {"method": info.method}
                rows.append(Row(key(h, option), us, predicted, info.fake, _now(), record))
            cache.put(rows)  # one transaction per spec: a killed run keeps the specs before
            report("tune", i + 1, len(pending))
    times: dict[str, float] = {}
    fastest: dict[str, KernelSpec] = {}
    ratios = []
    for h, s in specs.items():
        timed = [(s.times[o.hash], r, o) for r, (o, _) in enumerate(s.options) if o.hash in s.times]
        if not timed:
            continue
        us, _, best = min(timed, key=lambda x: (x[0], x[1]))
        times[h] = times[best.hash] = us
        fastest[h] = best
        first, predicted = s.options[0]
        if first.hash in s.times:
            ratios.append((s.spec.template, s.times[first.hash] / predicted))
    scales, overall = calibrate(ratios)
    seconds = 0.0 if reproducible else round(time.perf_counter() - started, 1)
    skipped = sum(len(h) for _, h in refused.values())
    summary = Tuning(
        seconds,
        len(specs),
        settings.configs,
        measured,
        cached,
        len(broken),
        skipped,
        info.device,
        info.driver,
        info.triton,
        info.fake,
        {t: round(v, 4) for t, v in scales.items()},
        round(overall, 4),
    )
    return Tuned(Measured(times, scales, overall), fastest, summary)


def _distinct(specs: Sequence[KernelSpec]) -> list[KernelSpec]:
    return list({s.hash: s for s in specs}.values())


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
