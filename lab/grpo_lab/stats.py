"""How a claim that a tool helps is decided (the project's evidence standard, docs/results.md).

The independent unit is the warm start (the SFT seed): GRPO seeds run from the same warm start are nested in it. A
method is paired with vanilla run by run (same warm start, GRPO seed, budget and evaluation samples); the paired
differences are aggregated with a two-stage cluster bootstrap (Davison & Hinkley 1997, sec. 3.8): resample warm starts
with replacement, then GRPO seeds with replacement within each drawn warm start, take the mean, repeat; the 95%
interval is the 2.5th to 97.5th percentile of those means. The verdict reads only the interval:

- **helps**: the lower bound is above 0;
- **hurts**: the upper bound is below 0;
- **no effect shown**: the interval contains 0 (its width says what effect the study could have detected).

Fewer than :data:`MIN_WARM_STARTS` warm starts or :data:`MIN_GRPO_SEEDS` GRPO seeds per warm start make a study
*exploratory*; :func:`verdict` says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

#: A headline claim needs at least this many warm starts ...
MIN_WARM_STARTS = 6
#: ... and at least this many GRPO seeds from each.
MIN_GRPO_SEEDS = 2
#: Bootstrap resamples (the standard asks for at least 10,000).
RESAMPLES = 10_000


@dataclass(frozen=True)
class Interval:
    """A mean paired difference and its cluster-bootstrap interval."""

    mean: float
    low: float
    high: float
    warm_starts: int
    runs: int

    @property
    def width(self) -> float:
        return self.high - self.low


def cluster_bootstrap(
    differences: Mapping[object, Sequence[float]],
    *,
    resamples: int = RESAMPLES,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Mean of the paired differences and its two-stage cluster-bootstrap percentile interval.

    Args:
        differences: warm start -> the paired differences (method - vanilla) of its GRPO seeds.
        resamples: bootstrap resamples.
        level: coverage of the interval.
        seed: seeds the resampling (``torch.Generator``), so a report prints the same interval every time.

    The point estimate is the mean over warm starts of each warm start's mean (every warm start weighs the same, as
    in the resampling). Vectorised: all resamples at once, no Python loop over them.
    """
    clusters = [torch.tensor(list(v), dtype=torch.float64) for v in differences.values()]
    if not clusters or any(c.numel() == 0 for c in clusters):
        raise ValueError("cluster_bootstrap needs at least one warm start, each with at least one difference.")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}.")
    generator = torch.Generator().manual_seed(seed)
    n = len(clusters)
    width = max(c.numel() for c in clusters)
    values = torch.zeros(n, width, dtype=torch.float64)  # (W, S) padded
    sizes = torch.tensor([c.numel() for c in clusters])  # (W,)
    for i, c in enumerate(clusters):
        values[i, : c.numel()] = c
    drawn = torch.randint(0, n, (resamples, n), generator=generator)  # (R, W) warm starts drawn
    within = torch.rand(resamples, n, width, generator=generator, dtype=torch.float64) * sizes[drawn].unsqueeze(-1)
    picks = within.long()  # (R, W, S): a seed index below each drawn warm start's size
    slot = torch.arange(width)  # only the first size(w) draws of a warm start count (it has size(w) seeds)
    counted = slot < sizes[drawn].unsqueeze(-1)  # (R, W, S)
    chosen = values[drawn.unsqueeze(-1), picks]  # (R, W, S)
    cluster_means = (chosen * counted).sum(-1) / counted.sum(-1)  # (R, W)
    means = cluster_means.mean(-1)  # (R,)
    tail = (1.0 - level) / 2
    low, high = torch.quantile(means, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    point = statistics.fmean(float(c.mean()) for c in clusters)
    return Interval(point, low, high, warm_starts=n, runs=int(sizes.sum()))


def verdict(
    interval: Interval,
    *,
    min_warm_starts: int = MIN_WARM_STARTS,
    min_seeds: int = MIN_GRPO_SEEDS,
    higher_is_better: bool = True,
) -> str:
    """ "helps" / "hurts" / "no effect shown" from the interval alone, with "(exploratory)" when the study has fewer
    than ``min_warm_starts`` warm starts or fewer than ``min_seeds`` runs per warm start on average.
    ``higher_is_better=False`` for a metric where less is better (a proxy-gold gap, repetition)."""
    better, worse = ("helps", "hurts") if higher_is_better else ("hurts", "helps")
    if interval.low > 0:
        word = better
    elif interval.high < 0:
        word = worse
    else:
        word = "no effect shown"
    if interval.warm_starts < min_warm_starts or interval.runs < min_seeds * interval.warm_starts:
        word += " (exploratory)"
    return word


def paired_differences(
    method: Mapping[tuple[int, int], float], vanilla: Mapping[tuple[int, int], float]
) -> dict[int, list[float]]:
    """Warm start -> [method - vanilla] over the (warm start, GRPO seed) keys both have, in seed order."""
    out: dict[int, list[float]] = {}
    for key in sorted(set(method) & set(vanilla)):
        out.setdefault(key[0], []).append(method[key] - vanilla[key])
    return out


__all__ = ["Interval", "MIN_GRPO_SEEDS", "MIN_WARM_STARTS", "cluster_bootstrap", "paired_differences", "verdict"]
