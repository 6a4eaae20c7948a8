"""The learned model's transfer to a GPU left out, tried other ways than the
study's own (``orchestrate calibrate --transfer``, ``calibrate/learn.py``).

    make calibrate                       # writes out/calibrate/predictions.json
    python -m tools.transfer_trials [out/calibrate/predictions.json]

Each trial leaves each GPU out, trains on the others and, where it adapts,
adapts with k = 20 of the GPU's rows (the study's draws: chosen to cover
its programs, ``learn.covering``), then gives the error factor and Spearman
on the GPU's other rows:

* ``study, k at random``: the study with the k rows drawn at random, as it
  was before they were chosen (``learn.at_random``);
* ``study``: the study's model and adaptation (what the README reports):
  the base model's median miss on the k rows, then small trees on the rest;
* ``median only``: the study's base model and its median miss alone;
* ``cache+power``: two more device features, the L2 cache's size and the
  board's power limit (``DEVICE_EXTRA``, datasheet and whitepaper figures),
  adapted by the median miss;
* ``nearest``: the base model also learns which GPU each row is; the GPU
  left out is predicted as the training GPU whose predictions fit its k rows
  best, plus their median miss;
* ``bigger``: the base model with 63 leaves, 1,000 rounds, 5 rows a leaf,
  adapted as the study does.

Then the ``bound`` columns: the base model (no row of the GPU) corrected by
the exact median miss of *all* the GPU's rows, of each timing file's, and
of each timing file's rows of one kind: what any offset adapted from k rows
could reach at best.  And ``own rows``: no GPU left out, the model trained
on the other GPUs' rows and four fifths of the GPU's own, scored on the
fifth left (5-fold, every row scored once): what the features can tell of
that GPU's rows given far more than k of them.

Last, a second table: each GPU's rows predicted by another GPU's *measured*
times of the same programs (the runtime, level and sizes), scaled by their
exact median ratio, from the other GPU that does it best: how well one
GPU's times tell another's with no model at all.

Written for docs/calibration.md ("What limits it"); a research tool, not
part of the package.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from orchestrate.calibrate import learn
from orchestrate.calibrate.harness import launcher
from orchestrate.calibrate.learn import Sample, adapt, corrected, fit_booster
from orchestrate.calibrate.stats import fit
from orchestrate.cost import learned
from orchestrate.cost.devices import get_device
from orchestrate.cost.learned import CATEGORICAL, FEATURES, Terms

K = 20
# L2 cache (MB) and board power (W): the vendors' datasheets and architecture
# whitepapers (A100, H100, Ada, GA102, Turing); the B200's L2 as measured by
# Chips and Cheese ("Nvidia's B200: Keeping the CUDA Juggernaut Rolling")
DEVICE_EXTRA = {
    "h100": (50, 700),
    "h100-pcie": (50, 350),
    "a100": (40, 400),
    "a100-40gb-sxm": (40, 400),
    "b200": (126, 1000),
    "l4": (48, 72),
    "l40s": (96, 350),
    "a10": (6, 150),
    "a10g": (6, 300),
    "rtx-a6000": (6, 300),
    "t4": (4, 70),
    "rtx3090ti": (6, 450),
}


def read(path: Path) -> list[tuple[str, str, Sample]]:
    """(row id, kind, sample) for each prediction ``calibrate --json`` wrote."""
    out = []
    for p in json.loads(path.read_text())["predictions"]:
        if not p["kernels"] or p["predicted_us"] <= 0:
            continue
        host = p["host"]
        x = learned.features(
            [Terms(**k) for k in p["kernels"]],
            get_device(p["gpu"]),
            launcher(p["runtime"]),
            host["call_us"],
            host["per_kernel_us"],
        )
        out.append(
            (p["id"], p["kind"], Sample(p["gpu"], p["predicted_us"], p["measured_us"], tuple(x)))
        )
    return out


def timing_file(row_id: str) -> str:
    """The id up to its level: suite / timing directory / runtime / level."""
    return "/".join(row_id.split("/")[:4])


class Offset:
    def __init__(self, model, offset: float, column: float | None = None):
        self.model, self.offset, self.column = model, offset, column

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.column is not None:
            x = np.hstack([x, np.full((len(x), 1), self.column)])
        return self.model.predict(x) + self.offset


def _booster(rows: Sequence[Sample], features: Sequence[str], categorical: Sequence[str], **params):
    lgb = learned.lightgbm()
    rounds = params.pop("rounds", learn.ROUNDS)
    data = learn.dataset(lgb, rows, features, categorical)
    return lgb.train({**learn.PARAMS, **params}, data, num_boost_round=rounds)


def _median_miss(model, rows: Sequence[Sample]) -> float:
    x = np.array([s.x for s in rows])
    return float(np.median(np.array([s.y for s in rows]) - model.predict(x)))


def _with_device(s: Sample) -> Sample:
    return replace(s, x=(*s.x, *(math.log(v) for v in DEVICE_EXTRA[s.gpu])))


class _Extra:
    """A model over two more device features, given the GPU's values."""

    def __init__(self, model, gpu: str):
        self.model, self.extra = model, [math.log(v) for v in DEVICE_EXTRA[gpu]]

    def predict(self, x):
        return self.model.predict(np.hstack([x, np.tile(self.extra, (len(x), 1))]))


def _median_only(base, shots, draw):
    return Offset(base, _median_miss(base, shots))


def _cache_and_power(rest):
    rows = [_with_device(s) for s in rest]
    return _booster(rows, (*FEATURES, "log_l2", "log_power"), CATEGORICAL)


def _nearest_base(rest):
    gpus = sorted({s.gpu for s in rest})
    tagged = [replace(s, x=(*s.x, float(gpus.index(s.gpu)))) for s in rest]
    return gpus, _booster(tagged, (*FEATURES, "gpu"), (*CATEGORICAL, "gpu"))


def _nearest(base, shots, draw):
    gpus, model = base
    x = np.array([s.x for s in shots])
    fits = []
    for i in range(len(gpus)):
        miss = np.array([s.y for s in shots]) - Offset(model, 0.0, float(i)).predict(x)
        fits.append((float(np.mean(np.abs(miss - np.median(miss)))), i))
    best = Offset(model, 0.0, float(min(fits)[1]))
    return Offset(best, _median_miss(best, shots))


# name: (the base model from the other GPUs' rows, its adaptation to k rows)
TRIALS: dict[str, tuple[Callable, Callable]] = {
    "study": (fit_booster, lambda base, shots, draw: adapt(base, shots, seed=draw)),
    "median only": (fit_booster, _median_only),
    "cache+power": (
        _cache_and_power,
        lambda base, shots, draw: _median_only(_Extra(base, shots[0].gpu), shots, draw),
    ),
    "nearest": (_nearest_base, _nearest),
    "bigger": (
        lambda rest: _booster(
            rest, FEATURES, CATEGORICAL, num_leaves=63, rounds=1000, min_data_in_leaf=5
        ),
        lambda base, shots, draw: adapt(base, shots, seed=draw),
    ),
}


def trial(rows: Sequence[Sample], gpu: str, make: Callable, adapted: Callable, pick=learn.covering):
    """The study's draws of k = 20 rows (or ``pick``'s): the mean error factor and Spearman."""
    mine = [s for s in rows if s.gpu == gpu]
    base = make([s for s in rows if s.gpu != gpu])
    errors, ranks = [], []
    for d in range(learn.DRAWS):
        shots, held = learn.draw(mine, K, d, pick)
        f = fit(corrected(adapted(base, shots, d), held))
        errors.append(math.log(f.error))
        ranks.append(f.spearman)
    return math.exp(sum(errors) / len(errors)), sum(ranks) / len(ranks)


def bounds(rows: Sequence[tuple[str, str, Sample]], gpu: str) -> list[float]:
    """The base model's error on the GPU after the exact median miss of all
    its rows, of each timing file's, of each timing file and kind's."""
    mine = [(i, k, s) for i, k, s in rows if s.gpu == gpu]
    base = fit_booster([s for _, _, s in rows if s.gpu != gpu])
    miss = np.array([s.y for _, _, s in mine]) - base.predict(np.array([s.x for _, _, s in mine]))
    out = []
    for key in (lambda i, k: "", lambda i, k: timing_file(i), lambda i, k: (timing_file(i), k)):
        groups: dict = {}
        for j, (i, k, _) in enumerate(mine):
            groups.setdefault(key(i, k), []).append(j)
        left = np.zeros(len(mine))
        for idx in groups.values():
            left[idx] = miss[idx] - np.median(miss[idx])
        out.append(math.exp(float(np.mean(np.abs(left)))))
    return out


FOLDS = 5


def own_rows(rows: Sequence[Sample], gpu: str, folds: int = FOLDS) -> tuple[float, float]:
    """The error factor and Spearman on the GPU's rows of models trained on
    the other GPUs' rows and the rest of its own (``folds``-fold, each row
    scored once, by a model that did not see it)."""
    mine = [s for s in rows if s.gpu == gpu]
    rest = [s for s in rows if s.gpu != gpu]
    order = np.random.default_rng(0).permutation(len(mine))
    pairs = []
    for f in range(folds):
        scored = set(order[f::folds].tolist())
        trained = rest + [s for j, s in enumerate(mine) if j not in scored]
        pairs += corrected(fit_booster(trained), [s for j, s in enumerate(mine) if j in scored])
    found = fit(pairs)
    return found.error, found.spearman


def program_key(row_id: str) -> tuple[str, ...]:
    """A row's program on any GPU: its runtime, level and program (with sizes)."""
    return tuple(row_id.split("/")[2:5])


def measured_times(rows: Sequence[tuple[str, str, Sample]]) -> dict:
    """Each GPU's measured time of each program (``program_key``)."""
    times: dict[str, dict[tuple[str, ...], float]] = {}
    for i, _, s in rows:
        times.setdefault(s.gpu, {})[program_key(i)] = s.measured_us
    return times


def measured_neighbour(times: dict, gpu: str):
    """The GPU's rows predicted by another GPU's *measured* times of the same
    programs (``measured_times``), scaled by their exact median ratio, for the
    other GPU that does best: (that GPU, programs shared, error factor,
    Spearman), or None."""
    mine, best = times[gpu], None
    for other, theirs in sorted(times.items()):
        shared = sorted(set(mine) & set(theirs))
        if other == gpu or len(shared) < 40:
            continue
        ratio = float(np.median([math.log(mine[c] / theirs[c]) for c in shared]))
        f = fit([(theirs[c] * math.exp(ratio), mine[c]) for c in shared])
        if best is None or f.error < best[2]:
            best = (other, len(shared), f.error, f.spearman)
    return best


def main(argv: Sequence[str]) -> int:
    path = Path(argv[0] if argv else "out/calibrate/predictions.json")
    if not path.exists():
        print(f"{path}: not found; run make calibrate first", file=sys.stderr)
        return 2
    rows = read(path)
    samples = [s for _, _, s in rows]
    gpus = sorted({s.gpu for s in samples} & set(DEVICE_EXTRA))
    head = [f"{name} k={K}" for name in ("study, k at random", *TRIALS)]
    head += ["bound: GPU", "file", "file+kind", f"own rows ({FOLDS}-fold)"]
    print("| GPU left out | " + " | ".join(head) + " |")
    print("|---" * (len(head) + 1) + "|")
    for gpu in gpus:
        study = TRIALS["study"]
        tried = [trial(samples, gpu, *study, pick=learn.at_random)]
        tried += [trial(samples, gpu, *t) for t in TRIALS.values()]
        cells = [f"{e:.2f}x {r:.2f}" for e, r in tried]
        cells += [f"{b:.2f}x" for b in bounds(rows, gpu)]
        cells.append("{:.2f}x {:.2f}".format(*own_rows(samples, gpu)))
        print(f"| {gpu} | " + " | ".join(cells) + " |", flush=True)
    print()
    print("| GPU | predicted by the measured times of | programs shared | error | Spearman |")
    print("|---|---|---|---|---|")
    times = measured_times(rows)
    for gpu in gpus:
        found = measured_neighbour(times, gpu)
        if found is not None:
            other, n, error, rank = found
            print(f"| {gpu} | {other} | {n} | {error:.2f}x | {rank:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
