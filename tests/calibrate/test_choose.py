"""Which k rows of a new GPU the transfer study measures (``choose.cover``)."""

import random

from orchestrate.calibrate import choose, learn
from orchestrate.cost.learned import CATEGORICAL, FEATURES

BYTES = FEATURES.index("log_bytes")
TEMPLATE = FEATURES.index("template")


def _rows(groups: int, each: int, seed: int = 0) -> list[list[float]]:
    """``groups`` tight clusters of ``each`` rows: each feature a multiple of
    the cluster's number plus a little noise; the template (categorical) random."""
    rng = random.Random(seed)
    scale = [rng.uniform(-2.0, 2.0) for _ in FEATURES]
    rows = []
    for g in range(groups):
        for _ in range(each):
            x = [s * g + 0.05 * rng.random() for s in scale]
            x[BYTES] = 100.0 * g + rng.random()
            x[TEMPLATE] = float(rng.randrange(5))
            rows.append(x)
    rng.shuffle(rows)
    return rows


def test_the_rows_chosen_cover_every_cluster():
    rows = _rows(groups=5, each=40)
    for seed in range(3):
        picked = choose.cover(rows, 5, seed=seed)
        assert len(picked) == 5 == len(set(picked)) and picked == sorted(picked)
        assert sorted(int(rows[j][BYTES] // 100) for j in picked) == [0, 1, 2, 3, 4]


def test_random_draws_miss_clusters_that_cover_does_not():
    """What choosing buys: 20 of 200 rows in 20 clusters, drawn at random,
    leave a third of the clusters unmeasured; chosen, one or two at most
    (k-means can settle with two centres in one cluster)."""
    rows = _rows(groups=20, each=10)
    samples = [learn.Sample("l4", 1.0, 1.0, tuple(x)) for x in rows]
    clusters = lambda picked: {int(rows[j][BYTES] // 100) for j in picked}
    chosen = [len(clusters(learn.covering(samples, 20, d))) for d in range(3)]
    drawn = [len(clusters(learn.at_random(samples, 20, d))) for d in range(3)]
    assert min(chosen) >= 18 > 16 >= max(drawn), (chosen, drawn)


def test_cover_is_deterministic_and_reads_no_categorical_feature():
    rows = _rows(groups=4, each=25)
    assert choose.cover(rows, 6, seed=1) == choose.cover(rows, 6, seed=1)
    shuffled = [list(x) for x in rows]
    for x in shuffled:
        for name in CATEGORICAL:
            x[FEATURES.index(name)] = 0.0
    assert choose.cover(shuffled, 6, seed=1) == choose.cover(rows, 6, seed=1)


def test_cover_takes_every_row_when_k_is_not_smaller():
    rows = _rows(groups=2, each=3)
    assert choose.cover(rows, 6) == list(range(6)) == choose.cover(rows, 9)
    assert choose.cover(rows, 0) == []
