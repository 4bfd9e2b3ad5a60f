"""AEPO, Arbitrary Entropy Policy Optimization (arXiv 2510.08141; not "Agentic Entropy-Balanced PO").

Replaces an entropy bonus by a REINFORCE term on samples drawn from a temperature-adjusted policy:

    grad J_AEPO = grad J_GRPO + alpha * E_{o ~ pi^T}[ grad log pi(o | q) * R(q, o) ],
    T = T_high if H(pi_old) < H_target else T_low.

Sampling hotter than the policy when its entropy is under target (colder when above) and reinforcing the good
samples pulls the policy's entropy toward the target. Reference implementation: T_high 1.2, T_low 0.8, H_target 0.5,
samples with group advantage > 0.05 get advantage 1, at most 60 of them per batch (half when entropy is above target).

Notation: N completions (consecutive groups of G share a prompt); logps (B, T).
"""

from __future__ import annotations

import torch

from .advantages import group_relative_advantages


def aepo_temperature(entropy: float | None, *, target: float, temperature_high: float, temperature_low: float) -> float:
    """``T_high`` when the measured entropy is below ``target``, else ``T_low`` (``T_low`` before any measurement)."""
    if entropy is None:
        return temperature_low
    return temperature_high if entropy < target else temperature_low


def aepo_select(
    rewards: torch.Tensor,
    group_size: int,
    *,
    adv_threshold: float,
    max_samples: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Which temperature-T samples AEPO reinforces: group advantage (TRL's sample-std normalisation) above
    ``adv_threshold``, at most ``max_samples`` of them, chosen uniformly at random when there are more. (N,) bool."""
    advantages = group_relative_advantages(rewards, group_size)  # (N,), 0 for NaN rewards
    keep = advantages > adv_threshold
    if int(keep.sum()) > max_samples:
        priority = torch.rand(rewards.shape, generator=generator, device=rewards.device).masked_fill(~keep, -1.0)
        chosen = torch.topk(priority, max_samples).indices
        keep = torch.zeros_like(keep)
        keep[chosen] = True
    return keep


def aepo_per_token_loss(logps: torch.Tensor, old_logps: torch.Tensor) -> torch.Tensor:
    """Per-token REINFORCE surrogate with advantage 1: ``-exp(logp - old_logp)`` (B, T).

    Its gradient at ``logp == old_logp`` is ``-grad logp``, the REINFORCE estimator of the AEPO term; the ratio keeps it
    correct when the samples are reused after an update (``num_iterations > 1``).
    """
    return -torch.exp(logps - old_logps.detach())


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, *, quantile: float) -> torch.Tensor:
    """(B, T) bool: the valid tokens whose entropy is at or above the ``1 - quantile`` quantile of the valid tokens'
    entropies (the ``quantile`` highest-entropy fraction, as TRL's ``top_entropy_quantile``), computed over this
    tensor's tokens only (no collective). ``quantile >= 1`` keeps every valid token.

    Args:
        entropies: (B, T) per-token entropies.
        mask: (B, T) valid tokens.
        quantile: fraction in (0, 1] of the highest-entropy tokens to keep.
    """
    valid = mask.bool()  # (B, T)
    if quantile >= 1.0 or not bool(valid.any()):
        return valid
    threshold = torch.quantile(entropies[valid].float(), 1.0 - quantile)
    return valid & (entropies >= threshold)
