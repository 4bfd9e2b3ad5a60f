"""Outcome advantages: group-relative normalisation of one scalar reward per completion (GRPO).

Notation:
    N: completions in the (global) generation batch, consecutive runs of ``group_size`` rows share a prompt.
    G: ``group_size`` (``num_generations`` in TRL).
"""

from __future__ import annotations

from typing import Literal

import torch

#: Largest |reward| (outcome or step) accepted. Group statistics run in float32, where the squares of rewards of about
#: 1e19 overflow: the std becomes inf and every advantage silently 0. Above this bound a reward is refused; rescale it.
MAX_ABS_REWARD = 1e15

StdKind = Literal["sample", "population"]
ScaleKind = Literal["group", "batch", "none"]


def nan_std(
    x: torch.Tensor, *, dim: int | None = None, kind: StdKind = "sample", keepdim: bool = False
) -> torch.Tensor:
    """Standard deviation that ignores NaN entries.

    ``kind="sample"`` divides the squared deviations by ``n - 1`` (Bessel; TRL 1.16's ``nanstd``, NaN when n < 2),
    ``kind="population"`` by ``n`` (the seed document and DeepSeekMath, eq. in sec. 4.1.2).
    """
    if kind not in ("sample", "population"):
        raise ValueError(f"std kind must be 'sample' or 'population', got {kind!r}.")
    dtype = x.dtype
    x = x.double()  # squares of float32 values above ~1.8e19 overflow; float64 holds them up to the float32 maximum
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    if kind == "sample":
        count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
        correction = torch.where(count > 1, count / (count - 1), torch.full_like(var, float("nan")))
        var = var * correction
    std = torch.sqrt(var).to(dtype)
    if not keepdim:
        std = std.squeeze(dim) if dim is not None else std.reshape(())
    return std


def group_relative_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    std: StdKind = "sample",
    scale: ScaleKind = "group",
    eps: float = 1e-4,
) -> torch.Tensor:
    """GRPO outcome advantages ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)``.

    DeepSeekMath (Shao et al. 2024, arXiv 2402.03300), sec. 4.1.2. With ``std="sample"``, ``scale="group"`` and
    ``eps=1e-4`` this is exactly TRL 1.16's ``GRPOTrainer`` (``multi_objective_aggregation="sum_then_normalize"``).

    Args:
        rewards: (N,) one reward per completion; NaN marks an unscorable completion: it is left out of its group's
            mean and std and gets advantage 0 (TRL's convention for rewards that are all ``None``).
        group_size: G, completions per prompt; N must be a multiple of G.
        std: "sample" (n - 1, TRL's default) or "population" (n, the seed document's worked example).
        scale: "group" divides by the group's std, "batch" by the std of all N rewards (Dr. GRPO / TRL
            ``scale_rewards="batch"``), "none" only subtracts the group mean.
        eps: added to the std before dividing.

    Returns:
        (N,) advantages in the dtype of ``rewards``, finite everywhere: the statistics run in float64, so rewards up
        to the float32 maximum give the right advantages.

    Example (the seed document's worked example: population std 0.1275, A ~ {-0.392, 0, -1.176, 1.569}):
        >>> group_relative_advantages(torch.tensor([0.20, 0.25, 0.10, 0.45]), 4, std="population", eps=0.0)
        tensor([-0.3922,  0.0000, -1.1767,  1.5689])
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}.")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"The number of rewards ({rewards.numel()}) must be a multiple of group_size ({group_size}).")
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}.")
    dtype = rewards.dtype
    rewards = rewards.double()  # (N,) float64: the statistics of rewards up to the float32 maximum do not overflow
    grouped = rewards.view(-1, group_size)  # (N/G, G)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)  # (N/G, 1)
    advantages = grouped - mean  # (N/G, G)
    if scale == "group":
        if group_size > 1:
            advantages = advantages / (nan_std(grouped, dim=1, kind=std, keepdim=True) + eps)
        else:  # one completion per group: no spread, TRL uses a zero std
            advantages = advantages / eps
    elif scale == "batch":
        spread = nan_std(rewards, kind=std) if rewards.numel() > 1 else rewards.new_zeros(())
        advantages = advantages / (spread + eps)
    return torch.nan_to_num(advantages.reshape(-1), nan=0.0).to(dtype)


def w_reinforce_advantages(rewards: torch.Tensor, *, positive_weight: float, threshold: float) -> torch.Tensor:
    """Weighted REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning",
    arXiv 2506.01347, sec. 5): ``lambda * L_PSR + L_NSR`` with rewards of +1 (positive sample, reward > ``threshold``)
    and -1 (negative sample): advantage ``positive_weight`` (the paper's lambda, 0.1) for a positive sample, -1 for a
    negative one, 0 for an unscorable one (NaN). No group baseline: negative samples are pushed down, positives up by
    only lambda, which keeps pass@k at large k in the paper.

    (N,) rewards -> (N,) advantages in the rewards' dtype.
    """
    positive = rewards > threshold  # NaN compares False
    advantages = torch.where(positive, torch.full_like(rewards, positive_weight), -torch.ones_like(rewards))
    return advantages.masked_fill(torch.isnan(rewards), 0.0)


def scale_positive_advantages(advantages: torch.Tensor, *, positive_weight: float) -> torch.Tensor:
    """W-REINFORCE's weighting on baselined advantages: positive entries times ``positive_weight``, others unchanged
    (Zhu et al. 2025, arXiv 2506.01347, sec. 5, with the estimator's baseline kept).

    (B,) or (B, T) -> the same shape.
    """
    return torch.where(advantages > 0, advantages * positive_weight, advantages)


def entropy_shaped_advantages(
    advantages: torch.Tensor, entropies: torch.Tensor, *, alpha: float, kappa: float
) -> torch.Tensor:
    """Entropy-based advantage shaping (Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective", arXiv
    2506.14758): ``A_t + min(alpha * H_t, |A_t| / kappa)`` with the token's entropy H_t detached, so high-entropy
    (exploratory) tokens are reinforced more without an entropy loss. The bonus is at most ``|A_t| / kappa``: with
    ``kappa >= 1`` it never flips the sign of a negative advantage, and a token of advantage 0 gets none.

    (B, T) advantages and entropies -> (B, T).
    """
    bonus = torch.minimum(alpha * entropies.detach(), advantages.abs() / kappa)  # (B, T)
    return advantages + bonus
