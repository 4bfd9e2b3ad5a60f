"""PF-PPO policy filtration: train only on the samples whose rewards are reliable.

Zhang, Shen et al. 2024, "Policy Filtration for RLHF to Mitigate Noise in Reward Models" (arXiv 2409.06957, ICML
2025), sec. 4: reward models are more reliable at the extremes of their range, so keep the best (and worst) samples of
each prompt. Here the filter acts per prompt group (the paper's BoN/BR/BW), after the advantages have been computed over
the full group.

Notation:
    N: completions, consecutive runs of G = ``group_size`` share a prompt; P = N / G groups.

A strategy is a plain function mapping grouped rewards (P, G) and a generator to a keep mask (P, G); the built-in ones
are :data:`SAMPLE_FILTER_STRATEGIES`. :func:`pf_keep_mask` takes a built-in's name or any such function:

    >>> def above_mean(grouped, generator):
    ...     return grouped >= grouped.nanmean(dim=1, keepdim=True)
    >>> pf_keep_mask(torch.tensor([0.0, 1.0, 2.0, 3.0]), 4, strategy=above_mean).tolist()
    [False, False, True, True]

(The ``sample_filter`` switch's names are the family's registry: ``register_strategy`` of
``trl_grpo_ext.families.sample_filter`` makes a function of yours one of them.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import torch

#: ``(P, G) rewards (NaN = unscorable), generator -> (P, G) bool keep mask``
Strategy = Callable[[torch.Tensor, "torch.Generator | None"], torch.Tensor]


def _rank_desc(grouped: torch.Tensor) -> torch.Tensor:
    """Rank of every entry in its row, 0 = highest reward; NaN (unscorable) ranks last, ties by position."""
    keyed = torch.nan_to_num(grouped.float(), nan=float("-inf"))  # (P, G)
    order = torch.sort(keyed, dim=1, descending=True, stable=True).indices  # (P, G)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(grouped.size(1), device=grouped.device).expand_as(order))
    return ranks  # (P, G)


def best_of_n(grouped: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """BoN: keep the highest-reward completion of each group."""
    return _rank_desc(grouped) == 0


def best_worst(grouped: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """BW: keep the best and the worst completion of each group (two distinct rows when G >= 2).

    The worst is the lowest scorable reward; a group whose rewards are all NaN keeps its first two rows.
    """
    ranks = _rank_desc(grouped)  # (P, G)
    scorable = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)  # (P, 1)
    last = (scorable - 1).clamp(min=1)  # rank of the worst scorable entry, never the best's rank 0
    return (ranks == 0) | (ranks == last)


def best_random(grouped: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """BR: keep the best completion and one other picked uniformly at random in each group."""
    ranks = _rank_desc(grouped)  # (P, G)
    best = ranks == 0
    noise = torch.rand(grouped.shape, generator=generator, device=grouped.device)  # (P, G)
    noise = noise.masked_fill(best, -1.0)
    other = torch.zeros_like(best)
    other.scatter_(1, noise.argmax(dim=1, keepdim=True), True)
    return best | (other & (grouped.size(1) > 1))


def nonzero_std(grouped: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Keep every completion of the groups whose scorable rewards are not all equal (DAPO's dynamic-sampling filter).

    A group with no spread gives every completion advantage 0: no signal, only KL and noise.
    """
    keyed = grouped.float()
    hi = torch.nan_to_num(keyed, nan=float("-inf")).amax(dim=1, keepdim=True)  # (P, 1)
    lo = torch.nan_to_num(keyed, nan=float("inf")).amin(dim=1, keepdim=True)  # (P, 1)
    return (hi > lo).expand_as(grouped)


#: The built-in strategies by name (read-only; the names ``sample_filter`` takes for them).
SAMPLE_FILTER_STRATEGIES: Mapping[str, Strategy] = MappingProxyType(
    {"best_of_n": best_of_n, "best_random": best_random, "best_worst": best_worst, "nonzero_std": nonzero_std}
)


def _resolve(strategy: str | Strategy) -> tuple[str, Strategy]:
    """(name, function) of a built-in's name or a strategy function."""
    if callable(strategy):
        return getattr(strategy, "__name__", repr(strategy)), strategy
    if strategy not in SAMPLE_FILTER_STRATEGIES:
        raise ValueError(
            f"Unknown sample_filter strategy {strategy!r}. Valid names: {', '.join(sorted(SAMPLE_FILTER_STRATEGIES))}; "
            "or pass a function (P, G) rewards, generator -> (P, G) bool keep mask."
        )
    return strategy, SAMPLE_FILTER_STRATEGIES[strategy]


def pf_keep_mask(
    rewards: torch.Tensor,
    group_size: int,
    *,
    strategy: str | Strategy,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Which completions PF-PPO keeps for training.

    Args:
        rewards: (N,) one reward per completion (NaN = unscorable, never preferred).
        group_size: G; N must be a multiple of G.
        strategy: a name in :data:`SAMPLE_FILTER_STRATEGIES` ("best_of_n", "best_random", "best_worst",
            "nonzero_std") or a strategy function.
        generator: randomness for strategies that draw (best_random); on the device of ``rewards``.

    Returns:
        (N,) bool.
    """
    name, fn = _resolve(strategy)
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards must be 1-D with a multiple of group_size ({group_size}) entries, got {tuple(rewards.shape)}."
        )
    grouped = rewards.view(-1, group_size)  # (P, G)
    try:
        keep = fn(grouped, generator)
    except Exception as error:
        raise RuntimeError(
            f"The sample_filter strategy '{name}' raised {type(error).__name__}: "
            f"{error}. Fix the strategy: it takes (P, G) rewards (NaN = unscorable) and a generator, and returns a "
            "(P, G) bool keep mask."
        ) from error
    if not isinstance(keep, torch.Tensor) or keep.shape != grouped.shape or keep.dtype != torch.bool:
        got = f"{keep.dtype} {tuple(keep.shape)}" if isinstance(keep, torch.Tensor) else f"{type(keep).__name__}"
        raise ValueError(
            f"The sample_filter strategy '{name}' must return a bool mask of shape {tuple(grouped.shape)}, got {got}."
        )
    return keep.reshape(-1)


def r_squared(x: torch.Tensor, y: torch.Tensor) -> float:
    """Coefficient of determination of the least-squares line of ``y`` on ``x`` (= squared Pearson correlation).

    NaN when fewer than two points or when either side has no spread.
    """
    x, y = x.double(), y.double()
    if x.numel() < 2:
        return float("nan")
    xc, yc = x - x.mean(), y - y.mean()
    denom = (xc.pow(2).sum() * yc.pow(2).sum()).sqrt()
    if denom == 0:
        return float("nan")
    return float(((xc * yc).sum() / denom) ** 2)


def rank_filter_strategies(
    rewards: torch.Tensor,
    true_scores: torch.Tensor,
    group_size: int,
    *,
    strategies: Sequence[str] | Mapping[str, str | Strategy] | None = None,
    generator: torch.Generator | None = None,
) -> list[tuple[str, float]]:
    """Rank strategies the way PF-PPO chooses one: by R^2 between reward and true score on the kept samples.

    PF-PPO sec. 4.2: on a labelled set (e.g. completions with a verified correctness or human score), the strategy whose
    kept samples show the highest R^2 between the reward model's score and the true score is the one whose rewards are
    most reliable. ``"none"`` (keep everything) is ranked too, as the baseline.

    Args:
        rewards: (N,) the reward (model) scores of the labelled completions.
        true_scores: (N,) their true scores.
        group_size: G; consecutive rows share a prompt.
        strategies: built-in names, or ``{name: strategy function or built-in name}`` (yours among them), to
            compare (default: every built-in strategy).
        generator: for strategies that draw.

    Returns:
        ``[(name, r2), ...]`` best first; strategies with an undefined R^2 (NaN) last.
    """
    if rewards.shape != true_scores.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and true_scores {tuple(true_scores.shape)} differ in shape.")
    chosen = SAMPLE_FILTER_STRATEGIES if strategies is None else strategies
    named = chosen.items() if isinstance(chosen, Mapping) else [_resolve(name) for name in chosen]
    results = [("none", r_squared(rewards, true_scores))]
    for name, fn in named:
        keep = pf_keep_mask(rewards, group_size, strategy=fn, generator=generator)
        results.append((name, r_squared(rewards[keep], true_scores[keep])))
    return sorted(results, key=lambda item: (math.isnan(item[1]), 0.0 if math.isnan(item[1]) else -item[1]))
