"""The evidence standard's statistics (grpo_lab.stats): hand-checked intervals, verdicts, a loop reference."""

from __future__ import annotations

import random
import statistics

import pytest

from grpo_lab.stats import Interval, cluster_bootstrap, paired_differences, verdict


def test_constant_differences_give_a_point_interval():
    interval = cluster_bootstrap({0: [1.5, 1.5], 1: [1.5], 2: [1.5, 1.5, 1.5]})
    assert (interval.mean, interval.low, interval.high) == pytest.approx((1.5, 1.5, 1.5))
    assert (interval.warm_starts, interval.runs) == (3, 6)


def test_two_warm_starts_span_their_means():
    # Two warm starts, one run each: a resample's mean is a (1/4), (a + b) / 2 (1/2) or b (1/4), so the 2.5% and
    # 97.5% percentiles are a and b.
    interval = cluster_bootstrap({"w0": [-1.0], "w1": [3.0]})
    assert interval.mean == pytest.approx(1.0)
    assert (interval.low, interval.high) == pytest.approx((-1.0, 3.0))


def test_seeds_are_resampled_within_their_warm_start():
    # One warm start with runs 0 and 1: the inner resample's mean is 0, 0.5 or 1.
    interval = cluster_bootstrap({0: [0.0, 1.0]})
    assert (interval.low, interval.high) == pytest.approx((0.0, 1.0))


def test_every_warm_start_weighs_the_same():
    # warm start 0 has three runs at 0, warm start 1 one run at 4: the mean of the warm starts' means is 2
    assert cluster_bootstrap({0: [0.0, 0.0, 0.0], 1: [4.0]}).mean == pytest.approx(2.0)


def _loop_reference(differences, resamples, seed):
    """The same two-stage bootstrap written as plain loops."""
    rng = random.Random(seed)
    clusters = list(differences.values())
    means = []
    for _ in range(resamples):
        drawn = [rng.choice(clusters) for _ in clusters]
        means.append(statistics.fmean(statistics.fmean(rng.choice(c) for _ in c) for c in drawn))
    means.sort()
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def test_matches_a_loop_reference():
    differences = {w: [random.Random(w).gauss(0.5 * w, 1.0) for _ in range(2)] for w in range(6)}
    interval = cluster_bootstrap(differences, resamples=20_000)
    low, high = _loop_reference(differences, 20_000, seed=1)
    assert interval.low == pytest.approx(low, abs=0.08) and interval.high == pytest.approx(high, abs=0.08)
    assert interval.low < interval.mean < interval.high


def test_seeded():
    differences = {0: [0.1, -0.3], 1: [0.4, 0.2], 2: [-0.1, 0.0]}
    assert cluster_bootstrap(differences, seed=3) == cluster_bootstrap(differences, seed=3)


def test_verdicts():
    assert verdict(Interval(1.0, 0.2, 1.8, warm_starts=6, runs=12)) == "helps"
    assert verdict(Interval(-1.0, -1.8, -0.2, warm_starts=6, runs=12)) == "hurts"
    assert verdict(Interval(0.3, -0.5, 1.1, warm_starts=6, runs=12)) == "no effect shown"
    assert verdict(Interval(1.0, 0.2, 1.8, warm_starts=3, runs=9)) == "helps (exploratory)"
    assert verdict(Interval(1.0, 0.2, 1.8, warm_starts=6, runs=6)) == "helps (exploratory)"  # one seed each
    # a metric where less is better (a proxy-gold gap): a negative difference helps
    assert verdict(Interval(-1.0, -1.8, -0.2, warm_starts=6, runs=12), higher_is_better=False) == "helps"
    assert verdict(Interval(1.0, 0.2, 1.8, warm_starts=6, runs=12), higher_is_better=False) == "hurts"
    assert verdict(Interval(0.3, -0.5, 1.1, warm_starts=6, runs=12), higher_is_better=False) == "no effect shown"


def test_paired_differences():
    method = {(0, 0): 0.8, (0, 1): 0.7, (1, 0): 0.5, (2, 0): 0.9}
    vanilla = {(0, 0): 0.6, (0, 1): 0.7, (1, 0): 0.6}
    got = paired_differences(method, vanilla)
    assert list(got) == [0, 1] and got[0] == pytest.approx([0.2, 0.0]) and got[1] == pytest.approx([-0.1])


def test_bad_input():
    with pytest.raises(ValueError, match="at least one warm start"):
        cluster_bootstrap({})
    with pytest.raises(ValueError, match="at least one warm start"):
        cluster_bootstrap({0: []})
    with pytest.raises(ValueError, match="level"):
        cluster_bootstrap({0: [1.0]}, level=1.5)
