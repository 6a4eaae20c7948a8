"""Training the learned cost model, and how well it transfers to a GPU it has not seen.

A sample is one predicted measurement row: the features of its program's
kernels on its GPU under its runtime (``cost/learned.py``) and the target
``log(measured / predicted)``, the analytic model's miss; or one record of
our own kernels (``records.py``), a program of one kernel timed alone.  The model is
LightGBM regression under an L1 loss (the mean absolute log ratio is the
error factor calibrate reports), on small trees, deterministic.

**Transfer** (after the cost-model transfer work: train where measurements
are plentiful, adapt with a few from the new GPU).  For each GPU held out:

1. a base model is trained on every other GPU's rows;
2. k of the held-out GPU's rows (k = 0, 5, 10, 20, 50), chosen to cover its
   programs (``covering``: the row nearest each centre of k-means over the
   program features, never the measured times; ``at_random`` draws them as
   the study did before), adapt it (``adapt``): the base model's median
   miss on those k rows is added to every prediction, and from 10 rows on,
   ``ADAPT_ROUNDS`` rounds of small trees are fitted to what is left, so
   what the GPU does differently is learnt from its own rows while the base
   trees keep what the GPUs share;
3. the adapted model predicts the held-out GPU's other rows; the table gives
   the error factor and Spearman of the corrected predictions, averaged over
   ``DRAWS`` choices of the k rows (k-means seeds), beside the analytic
   model's on the same rows.

The rows of one program at several sizes or runtimes are not independent;
the held-out GPU's rows are never in its base model, which is what the
figures claim: a model trained on other GPUs, adapted with k measurements.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from orchestrate.calibrate import choose
from orchestrate.calibrate.harness import launcher
from orchestrate.calibrate.predict import Prediction
from orchestrate.calibrate.records import KernelRecord
from orchestrate.calibrate.stats import fit
from orchestrate.cost import learned
from orchestrate.cost.devices import get_device
from orchestrate.cost.learned import CATEGORICAL, FEATURES, LearnedModel
from orchestrate.cost.measurements import Measurement
from orchestrate.errors import InputError

KS = (0, 5, 10, 20, 50)
DRAWS = 5
ADAPT_ROUNDS = 30
PARAMS = {
    "objective": "l1",
    "learning_rate": 0.05,
    "num_leaves": 31,
    "min_data_in_leaf": 10,
    "min_data_per_group": 5,  # rows of one template (LightGBM's default is 100)
    "cat_smooth": 1.0,
    "feature_fraction": 0.9,
    "lambda_l2": 1.0,
    "verbose": -1,
    "deterministic": True,
    "force_row_wise": True,
    "num_threads": 1,
    "seed": 0,
}
ROUNDS = 600
ADAPT = {**PARAMS, "learning_rate": 0.1, "num_leaves": 4, "min_data_in_leaf": 2}


@dataclass(frozen=True)
class Sample:
    """One measured time the model learns from: a published row's program or
    one of our kernels' records."""

    gpu: str  # the device row
    predicted_us: float  # the analytic model's
    measured_us: float
    x: tuple[float, ...]

    @property
    def y(self) -> float:
        """The target: log(measured / predicted)."""
        return math.log(self.measured_us / self.predicted_us)


def sample(p: Prediction) -> Sample:
    m = p.measurement
    h = p.host
    x = learned.features(
        p.kernels, get_device(m.gpu), launcher(m.runtime), h.call_us, h.per_kernel_us
    )
    return Sample(m.gpu, p.predicted_us, m.time_us, tuple(x))


def record_sample(r: KernelRecord) -> Sample:
    """A kernel record as a sample: a program of one kernel timed alone, read
    as the planner asks about a kernel (``LearnedModel.scale``)."""
    x = learned.features([r.terms], r.device, launcher("orchestrate"))
    return Sample(r.device.name, r.predicted_us, r.measured_us, tuple(x))


def samples(found: Sequence[Prediction], records: Sequence[KernelRecord] = ()) -> list[Sample]:
    """The predictions that have kernels, then the kernel records, as samples."""
    return [sample(p) for p in found if p.kernels and p.predicted_us > 0] + [
        record_sample(r) for r in records
    ]


def data_hash(rows: Sequence[Measurement], records: Sequence[KernelRecord] = ()) -> str:
    """The sha256 of the measurement rows and kernel records a model is
    trained from (their ids and times, in any order; the rows calibrate
    skipped count too)."""
    return learned.rows_hash(
        [json.dumps([m.id, m.time_us], separators=(",", ":")) for m in rows]
        + [json.dumps([r.id, r.measured_us], separators=(",", ":")) for r in records]
    )


def dataset(
    lgb,
    rows: Sequence[Sample],
    features: Sequence[str] = FEATURES,
    categorical: Sequence[str] = CATEGORICAL,
):
    """LightGBM's dataset of ``rows`` (their features named ``features``)."""
    return lgb.Dataset(
        np.array([s.x for s in rows], dtype=np.float64),
        label=np.array([s.y for s in rows], dtype=np.float64),
        feature_name=list(features),
        categorical_feature=list(categorical),
        free_raw_data=False,
        params={"verbose": -1},
    )


def fit_booster(rows: Sequence[Sample], seed: int = 0, rounds: int = ROUNDS):
    """LightGBM trained on ``rows`` (the module doc's parameters)."""
    lgb = learned.lightgbm()
    params = {**PARAMS, "seed": seed, "min_data_in_leaf": min(10, max(1, len(rows) // 4))}
    return lgb.train(params, dataset(lgb, rows), num_boost_round=rounds)


@dataclass(frozen=True)
class Adapted:
    """A base model adapted to a new GPU: its median miss there (the L1
    optimum of a constant), then trees fitted to what is left."""

    base: object  # lightgbm.Booster
    offset: float
    trees: object | None  # lightgbm.Booster over the base's features, or None

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = self.base.predict(x) + self.offset
        return out if self.trees is None else out + self.trees.predict(x)


def adapt(booster, rows: Sequence[Sample], seed: int = 0) -> Adapted:
    """``booster`` adapted with ``rows`` (k of a new GPU): the median of its
    residuals on them, then ``ADAPT_ROUNDS`` rounds of small trees on the rest
    (none where nothing is left to split)."""
    if not rows:
        return Adapted(booster, 0.0, None)
    x = np.array([s.x for s in rows], dtype=np.float64)
    residual = np.array([s.y for s in rows]) - booster.predict(x)
    offset = float(np.median(residual))
    if len(rows) < 10:
        return Adapted(booster, offset, None)
    lgb = learned.lightgbm()
    params = {**ADAPT, "seed": seed, "min_data_in_leaf": max(2, len(rows) // 5)}
    data = lgb.Dataset(
        x,
        label=residual - offset,
        feature_name=list(FEATURES),
        categorical_feature=list(CATEGORICAL),
        params={"verbose": -1, "min_data_in_bin": 1},
    )
    trees = lgb.train(params, data, num_boost_round=ADAPT_ROUNDS)
    return Adapted(booster, offset, trees if trees.num_trees() else None)


def train(rows: Sequence[Sample], data: str, seed: int = 0) -> LearnedModel:
    """The learned model over every sample given (``samples``); ``data``:
    the hash of the rows and records they came from (``data_hash``)."""
    if len(rows) < 2:
        raise InputError("training the learned model needs at least two predicted rows")
    gpus = tuple(sorted({s.gpu for s in rows}))
    return LearnedModel(fit_booster(rows, seed), data, gpus, "")


def apply(model: LearnedModel, found: Sequence[Prediction]) -> list[Prediction]:
    """The predictions corrected by ``model`` (their programs' features); one
    without kernels is left as it is."""
    fixable = [i for i, p in enumerate(found) if p.kernels and p.predicted_us > 0]
    fixes = dict(zip(fixable, model.corrections([sample(found[i]).x for i in fixable])))
    return [
        replace(p, predicted_us=p.predicted_us * math.exp(fixes[i])) if i in fixes else p
        for i, p in enumerate(found)
    ]


def corrected(booster, rows: Sequence[Sample]) -> list[tuple[float, float]]:
    """(corrected prediction, measured) for each row."""
    if not rows:
        return []
    fixes = booster.predict(np.array([s.x for s in rows], dtype=np.float64))
    return [(s.predicted_us * math.exp(float(c)), s.measured_us) for s, c in zip(rows, fixes)]


@dataclass(frozen=True)
class Point:
    """One held-out GPU at one k: the analytic and the learned fit, averaged
    over the draws (n: rows evaluated per draw)."""

    gpu: str
    k: int
    n: int
    analytic_error: float
    analytic_spearman: float | None
    error: float
    spearman: float | None


def _geo(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _mean(xs: Sequence[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def at_random(rows: Sequence[Sample], k: int, d: int) -> list[int]:
    """The ``d``-th random draw of ``k`` of a GPU's rows (their indices)."""
    return sorted(random.Random(1000 * d + k).sample(range(len(rows)), k))


def covering(rows: Sequence[Sample], k: int, d: int) -> list[int]:
    """``k`` of a GPU's rows chosen to cover its programs (``choose.cover``,
    seeded by ``d``): what the study measures on a new GPU."""
    return choose.cover([s.x for s in rows], k, seed=d)


def draw(
    rows: Sequence[Sample], k: int, d: int, pick=covering
) -> tuple[list[Sample], list[Sample]]:
    """The ``d``-th draw of ``k`` of a GPU's rows by ``pick``: (those k, the rest)."""
    picked = set(pick(rows, k, d))
    return (
        [s for j, s in enumerate(rows) if j in picked],
        [s for j, s in enumerate(rows) if j not in picked],
    )


def transfer(
    rows: Sequence[Sample],
    ks: Sequence[int] = KS,
    draws: int = DRAWS,
    progress=None,
    pick=covering,
) -> list[Point]:
    """The leave-one-GPU-out study of the module doc over ``rows``
    (``samples``), one Point per (GPU, k) for each k below the GPU's row
    count; ``pick`` chooses the k rows (``covering`` or ``at_random``)."""
    gpus = sorted({s.gpu for s in rows})
    points = []
    for i, gpu in enumerate(gpus):
        if progress is not None:
            progress(i + 1, len(gpus))
        mine = [s for s in rows if s.gpu == gpu]
        rest = [s for s in rows if s.gpu != gpu]
        if len(rest) < 2 or len(mine) < 3:
            continue
        base = fit_booster(rest)
        for k in ks:
            if k >= len(mine) - 2:
                continue
            analytic, learnt = [], []
            for d in range(draws if k else 1):
                shots, held = draw(mine, k, d, pick)
                model = adapt(base, shots, seed=d)
                analytic.append(fit([(s.predicted_us, s.measured_us) for s in held]))
                learnt.append(fit(corrected(model, held)))
            points.append(
                Point(
                    gpu,
                    k,
                    analytic[0].n,
                    _geo([f.error for f in analytic]),
                    _mean([f.spearman for f in analytic]),
                    _geo([f.error for f in learnt]),
                    _mean([f.spearman for f in learnt]),
                )
            )
    return points
