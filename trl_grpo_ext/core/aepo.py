"""AEPO, Arbitrary Entropy Policy Optimization (arXiv 2510.08141; not "Agentic Entropy-Balanced PO").

Replaces an entropy bonus by a REINFORCE term on samples drawn from a temperature-adjusted policy:

    grad J_AEPO = grad J_GRPO + alpha * E_{o ~ pi^T}[ grad log pi(o | q) * R(q, o) ],
    T = T_high if H(pi_old) <= H_target else T_low   (the reference code tests <=; see at_target).

Sampling hotter than the policy when its entropy is under target (colder when above) and reinforcing the good
samples pulls the policy's entropy toward the target. Reference implementation (597358816/AEPO, ``ray_trainer.py``):
T_high 1.2, T_low 0.8, H_target 0.5; the first quarter of the prompts is generated again at T; samples with group
advantage > 0.05 get advantage 1, the first ``min(60, n)`` of them (halved above target) replace the first rows of the
training batch and go through the same clipped PPO loss; entropy starts at 0 and is read as ``-mean(logp)`` of the
trained tokens.

Notation: N completions (consecutive groups of G share a prompt); logps (B, T).
"""

from __future__ import annotations

import torch

from .advantages import group_relative_advantages


def aepo_below_target(
    entropy: float | None, *, target: float, at_target: str = "high", unmeasured: str = "low"
) -> bool:
    """Whether AEPO acts as if entropy were under target: it samples at ``T_high`` (else ``T_low``) and keeps the full
    sample cap.

    ``at_target="high"`` (reference, ``ray_trainer.py`` ``if entropy <= entropy_base``): ``entropy <= target``;
    ``"low"``: ``entropy < target``. ``entropy=None`` (nothing measured yet): ``unmeasured="high"`` counts it as under
    target (the reference starts from entropy 0), ``"low"`` as above it (nothing measured, nothing assumed).
    """
    if entropy is None:
        return unmeasured == "high"
    return entropy <= target if at_target == "high" else entropy < target


def aepo_sample_count(num_candidates: int, *, below_target: bool, max_samples: int, cap_rule: str) -> int:
    """How many of ``num_candidates`` positive temperature-T samples AEPO reinforces.

    ``cap_rule="halve_count"`` (reference, ``ray_trainer.py``: ``min(reinforce_sample_num, n)``, halved with ``//``
    above target): 60 for n = 100, 40 for n = 40 below target; 20 for n = 40 and 0 for n = 1 above it.
    ``"halve_cap"``: ``min(n, cap)`` with ``cap = max_samples`` below target and ``max(max_samples // 2, 1)`` above
    (30 for n = 40, 1 for n = 1 above target).
    """
    if cap_rule == "halve_count":
        count = min(max_samples, num_candidates)
        return count if below_target else count // 2
    if cap_rule == "halve_cap":
        cap = max_samples if below_target else max(max_samples // 2, 1)
        return min(num_candidates, cap)
    raise ValueError(f"aepo_sample_count: unknown cap_rule {cap_rule!r}; use 'halve_count' or 'halve_cap'")


def aepo_candidates(rewards: torch.Tensor, group_size: int, *, adv_threshold: float) -> torch.Tensor:
    """(N,) bool: samples whose group advantage (TRL's sample-std normalisation, 0 for NaN rewards) exceeds
    ``adv_threshold`` (reference: ``_select_by_advantage(threshold=0.05, absolute=False)``)."""
    return group_relative_advantages(rewards, group_size) > adv_threshold


def aepo_pick(
    candidates: torch.Tensor, count: int, *, order: str = "first", generator: torch.Generator | None = None
) -> torch.Tensor:
    """(N,) bool: ``count`` of the ``candidates`` (N,) bool. ``order="first"`` (reference:
    ``entropy_controller[:sample_num]``) takes them in row order; ``"random"`` draws them uniformly."""
    if count >= int(candidates.sum()):
        return candidates.clone()
    if order == "first":
        return candidates & (candidates.long().cumsum(0) <= count)
    if order == "random":
        priority = torch.rand(candidates.shape, generator=generator, device=candidates.device)
        chosen = torch.topk(priority.masked_fill(~candidates, -1.0), count).indices
        keep = torch.zeros_like(candidates)
        keep[chosen] = True
        return keep
    raise ValueError(f"aepo_pick: unknown order {order!r}; use 'first' or 'random'")


def aepo_entropy_sums(
    *, logps: torch.Tensor, entropies: torch.Tensor | None, mask: torch.Tensor, estimator: str
) -> torch.Tensor:
    """(2,) float [sum, token count] of the entropy estimate AEPO steers on, over the ``mask`` (B, T) tokens.

    ``estimator="sampled"`` (reference, ``dp_actor.py``: ``entropy_loss = -masked_mean(log_probs)``): ``-logp`` of
    the sampled tokens, an unbiased estimate of the policy's entropy only for tokens sampled from the policy itself (on
    tokens sampled hotter it reads higher: 4.35 against an exact 3.61 at T 1.2 in the porting cross-check);
    ``"exact"``: the full-distribution entropy of each position (``entropies``).
    """
    weights = mask.to(logps.dtype)  # (B, T)
    if estimator == "sampled":
        values = -logps.detach()
    elif estimator == "exact":
        if entropies is None:
            raise ValueError("aepo_entropy_sums: estimator='exact' needs the per-token entropies")
        values = entropies.detach().to(logps.dtype)
    else:
        raise ValueError(f"aepo_entropy_sums: unknown estimator {estimator!r}; use 'sampled' or 'exact'")
    return torch.stack([(values * weights).sum(), weights.sum()]).float()


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
