"""Which k programs of a new GPU to measure: ones that cover the rest.

Adapting the learned model to a new GPU (``learn.adapt``) learns from k of
its measured rows.  Drawn at random, twenty rows of a few hundred often
repeat one kind of program and miss another; chosen to cover the GPU's
programs, they teach more (AutoTVM picks what to measure for diversity for
the same reason).  ``cover`` clusters the rows by their program features
(k-means, seeded by k-means++) and takes the row nearest each centre.

It reads the features only, never a measured time: a user choosing what to
measure on a new GPU knows the programs, not their times.  Pure numpy and
deterministic for a seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orchestrate.cost.learned import CATEGORICAL, FEATURES

ITERATIONS = 50
# the numeric features, standardised over the GPU's rows (the device's own
# figures are one value on one GPU and standardise to zero)
_NUMERIC = [i for i, name in enumerate(FEATURES) if name not in CATEGORICAL]


def standardised(xs: Sequence[Sequence[float]]) -> np.ndarray:
    """The numeric features of each row, each column scaled to mean 0, deviation 1."""
    x = np.array([[row[i] for i in _NUMERIC] for row in xs], dtype=np.float64)
    spread = x.std(axis=0)
    return (x - x.mean(axis=0)) / np.where(spread > 0, spread, 1.0)


def _seeds(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++: each next centre drawn with probability ~ its squared distance."""
    centres = [x[rng.integers(len(x))]]
    d = ((x - centres[0]) ** 2).sum(axis=1)  # each row's squared distance to its nearest centre
    for _ in range(1, k):
        total = d.sum()
        j = rng.choice(len(x), p=d / total) if total > 0 else rng.integers(len(x))
        centres.append(x[j])
        d = np.minimum(d, ((x - x[j]) ** 2).sum(axis=1))
    return np.array(centres)


def _kmeans(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Lloyd's k-means from k-means++ seeds: the k centres."""
    centres = _seeds(x, k, np.random.default_rng(seed))
    for _ in range(ITERATIONS):
        label = ((x[:, None, :] - centres[None]) ** 2).sum(-1).argmin(axis=1)
        moved = np.array(
            [x[label == c].mean(axis=0) if (label == c).any() else centres[c] for c in range(k)]
        )
        if np.allclose(moved, centres):
            break
        centres = moved
    return centres


def cover(xs: Sequence[Sequence[float]], k: int, seed: int = 0) -> list[int]:
    """The indices (ascending) of ``k`` of the feature rows ``xs`` that cover
    them: the row nearest each k-means centre, each row taken once."""
    if k <= 0:
        return []
    if k >= len(xs):
        return list(range(len(xs)))
    x = standardised(xs)
    picked: list[int] = []
    for centre in _kmeans(x, k, seed):
        order = np.argsort(((x - centre) ** 2).sum(axis=1), kind="stable")
        picked.append(next(int(j) for j in order if int(j) not in picked))
    return sorted(picked)
