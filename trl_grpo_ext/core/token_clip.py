"""Covariance-based token selection: Clip-Cov and KL-Cov.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models" (arXiv 2505.22617),
sec. 4: the change of policy entropy follows the covariance between a token's log-probability and its advantage, so a
few high-covariance tokens drive entropy collapse. Clip-Cov removes the gradient of a random few of them (eq. 9),
KL-Cov puts a KL penalty on the top few (eq. 10).

Notation:
    B: rows (completions), T: completion tokens.
    logps: log pi_theta(o_t | q, o_<t), (B, T); advantages: (B,) or (B, T); mask: valid completion tokens, (B, T).
    N: valid tokens (over all processes when ``collectives`` spans several).

Every function takes an optional ``collectives`` (see :mod:`trl_grpo_ext.core.collectives`): with the default single
process the statistics are those of the given tensors; with a process group they are those of the union of every
process's tensors ("global scope"), and each process gets back the mask of its own tokens.
"""

from __future__ import annotations

import math

import torch

from .collectives import LOCAL, Collectives


def _expand(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (B, 1)
    return advantages.expand_as(like)  # (B, T)


def token_covariance(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    collectives: Collectives = LOCAL,
) -> torch.Tensor:
    """Per-token centred product ``Cov_t = (logp_t - mean(logp)) * (A_t - mean(A))`` (Cui et al. 2025, eq. 9).

    Means run over the valid tokens (all processes with ``collectives``); ``logps`` is detached. Returns (B, T) float32,
    0 outside ``mask``.
    """
    valid = mask.bool()  # (B, T)
    lp = logps.detach().float()  # (B, T)
    vf = valid.float()  # (B, T)
    if advantages.dim() == 1:  # one advantage per row: O(B) work for its mean, no (B, T) expansion
        adv_row = advantages.detach().float()  # (B,)
        per_row = vf.sum(dim=1)  # (B,) valid tokens per row
        sums = [per_row.sum(), torch.dot(lp.reshape(-1), vf.reshape(-1)), torch.dot(adv_row, per_row)]
        stats = collectives.all_sum(torch.stack(sums))  # (3,)
        count = stats[0].clamp(min=1.0)
        cov = (lp - stats[1] / count).mul_((adv_row - stats[2] / count).unsqueeze(1))  # (B, T)
        return cov.masked_fill_(~valid, 0.0)
    adv = _expand(advantages.detach().float(), lp)  # (B, T)
    stats = collectives.all_sum(torch.stack([vf.sum(), (lp * vf).sum(), (adv * vf).sum()]))  # (3,)
    count = stats[0].clamp(min=1.0)
    cov = (lp - stats[1] / count) * (adv - stats[2] / count)  # (B, T)
    return torch.where(valid, cov, torch.zeros_like(cov))


def num_selected(num_valid: int, ratio: float) -> int:
    """``max(1, floor(ratio * num_valid))`` tokens, 0 when there is no valid token (the paper's ``k``)."""
    if num_valid <= 0:
        return 0
    return max(1, math.floor(ratio * num_valid))


def select_top_k(
    scores: torch.Tensor, eligible: torch.Tensor, k: int, *, collectives: Collectives = LOCAL
) -> torch.Tensor:
    """Boolean mask of exactly ``min(k, #eligible)`` eligible entries with the highest ``scores``.

    Over several processes the k are chosen among the union of all eligible entries; ties at the threshold go to lower
    ranks first, then to lower flat indices, so the count is exact and the choice deterministic. Vectorised: one
    ``topk`` per process and two small collectives.

    Args:
        scores: (B, T) any float scores.
        eligible: (B, T) bool.
        k: how many to select in total.
    """
    eligible = eligible.bool()
    flat_scores = scores.detach().float().reshape(-1)  # (B*T,)
    flat_eligible = eligible.reshape(-1)  # (B*T,)
    if collectives is LOCAL and k > 0:
        fast = _select_top_k_local(flat_scores, flat_eligible, k)
        if fast is not None:
            return fast.view_as(eligible)
    local_values = flat_scores[flat_eligible]  # (n_local,)
    local_top = torch.topk(local_values, min(k, local_values.numel())).values if k > 0 else local_values[:0]
    candidates = collectives.all_cat(local_top)  # (<= k * world,)
    if k <= 0 or candidates.numel() == 0:
        return torch.zeros_like(eligible)
    k_eff = min(k, candidates.numel())
    threshold = torch.topk(candidates, k_eff).values[-1]
    above = flat_eligible & (flat_scores > threshold)  # (B*T,)
    ties = flat_eligible & (flat_scores == threshold)  # (B*T,)
    counts = torch.stack([above.sum(), ties.sum()]).to(candidates.device)
    all_counts = collectives.all_cat(counts).view(-1, 2)  # (world, 2)
    remaining = k_eff - all_counts[:, 0].sum()
    ties_before = all_counts[: collectives.rank, 1].sum()
    take = int((remaining - ties_before).clamp(min=0, max=int(counts[1])))
    if take == int(counts[1]):  # every tie is taken (the usual case: one entry sits at the threshold)
        return (above | ties).view_as(eligible)
    tie_rank = torch.cumsum(ties.long(), dim=0)  # 1-based order of each tie within this process
    chosen = above | (ties & (tie_rank <= take))
    return chosen.view_as(eligible)


def _select_top_k_local(flat_scores: torch.Tensor, flat_eligible: torch.Tensor, k: int) -> torch.Tensor | None:
    """One process, the usual case: one ``topk`` of ``k + 1`` over the masked scores. Returns the (B*T,) mask when the
    k-th and (k+1)-th eligible scores differ (then the top k is unique, the same mask as the general path), else None
    (a tie at the threshold: the general path breaks it by flat index)."""
    num_eligible = int(flat_eligible.count_nonzero())
    if num_eligible <= k:
        return flat_eligible.clone()
    values, indices = _topk_1d(flat_scores.masked_fill(~flat_eligible, -math.inf), k + 1)
    kth, next_value = values[k - 1], values[k]
    if not (bool(torch.isfinite(next_value)) and kth > next_value):
        return None
    chosen = torch.zeros_like(flat_eligible)
    chosen[indices[:k]] = True
    return chosen


def _topk_1d(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(x, k)`` of a 1-D tensor with the same values: for a long ``x``, the top k of each of up to 16
    equal chunks first (the chunks run on several threads), then the top k of those. Indices of tied values may
    differ from a single topk's (callers use them only when the k-th and (k+1)-th values differ)."""
    n = x.numel()
    chunks = next((c for c in (16, 8, 4, 2) if n % c == 0 and n // c >= 4 * k), 1)
    if chunks == 1:
        return torch.topk(x, k)
    values, indices = torch.topk(x.view(chunks, n // chunks), k, dim=1)  # (chunks, k)
    indices = indices + torch.arange(chunks, device=x.device).unsqueeze(1) * (n // chunks)
    top, where = torch.topk(values.reshape(-1), k)
    return top, indices.reshape(-1)[where]


def _global_count(mask: torch.Tensor, collectives: Collectives) -> int:
    return int(collectives.all_sum(mask.count_nonzero().reshape(1).float())[0].item())


def clip_cov_mask(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ratio: float,
    lb: float,
    ub: float,
    generator: torch.Generator | None = None,
    exclude: torch.Tensor | None = None,
    collectives: Collectives = LOCAL,
    covariance: torch.Tensor | None = None,
) -> torch.Tensor:
    """Tokens whose gradient Clip-Cov removes (Cui et al. 2025, sec. 4.2, "Clip-Cov").

    Candidates are valid tokens with ``lb < Cov < ub`` that are not in ``exclude`` (the tokens the PPO clip already
    clipped); ``max(1, floor(ratio * N))`` of them are picked uniformly at random (all of them if there are fewer).

    Args:
        logps, advantages, mask: see the module notation.
        ratio: fraction r of the valid tokens to pick (paper and verl: 2e-4).
        lb, ub: the covariance window (paper and verl: 1 and 5).
        generator: source of the random choice (on the device of ``logps``); seed it for reproducible runs.
        exclude: (B, T) bool, tokens that may not be picked.
        covariance: ``token_covariance(logps, advantages, mask, collectives=collectives)`` when the caller already
            has it (it also logs it); computed here otherwise.

    Returns:
        (B, T) bool.
    """
    cov = token_covariance(logps, advantages, mask, collectives=collectives) if covariance is None else covariance
    candidates = mask.bool() & (cov > lb) & (cov < ub)  # (B, T)
    if exclude is not None:
        candidates = candidates & ~exclude.bool()
    k = num_selected(_global_count(mask, collectives), ratio)
    priorities = torch.rand(cov.shape, generator=generator, device=cov.device)  # (B, T) uniform in [0, 1)
    return select_top_k(priorities, candidates, k, collectives=collectives)


def kl_cov_mask(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ratio: float,
    collectives: Collectives = LOCAL,
    covariance: torch.Tensor | None = None,
) -> torch.Tensor:
    """Tokens KL-Cov penalises: the ``max(1, floor(ratio * N))`` valid tokens of highest Cov (Cui et al. 2025, eq. 10).

    ``ratio`` is a fraction (paper: 2e-3 for 7B, 2e-4 for 32B; the authors' scripts write it in percent);
    ``covariance`` as in :func:`clip_cov_mask`. Returns (B, T) bool.
    """
    cov = token_covariance(logps, advantages, mask, collectives=collectives) if covariance is None else covariance
    k = num_selected(_global_count(mask, collectives), ratio)
    return select_top_k(cov, mask.bool(), k, collectives=collectives)


def ppo_clipped_mask(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
) -> torch.Tensor:
    """Tokens where the PPO clip is active (ratio above 1 + eps_high with A > 0, or below 1 - eps_low with A < 0).

    Their gradient is already zero, so Clip-Cov does not spend its budget on them (verl's ``clip_by_origin``). (B, T)
    bool.
    """
    ratio = torch.exp(logps.detach().float() - old_logps.detach().float())  # (B, T)
    adv = _expand(advantages.detach().float(), ratio)  # (B, T)
    clipped = ((ratio > 1 + epsilon_high) & (adv > 0)) | ((ratio < 1 - epsilon_low) & (adv < 0))
    return clipped & mask.bool()


def kl_cov_penalty(logps: torch.Tensor, old_logps: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """Per-token KL-Cov penalty ``|logp - old_logp|`` on the selected tokens, 0 elsewhere; (B, T), differentiable."""
    return (logps - old_logps.detach()).abs() * selected.to(logps.dtype)


def dppo_outside_mask(
    logps: torch.Tensor,
    anchor_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    divergence: str,
    delta_low: float,
    delta_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DPPO's binary trust region (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning",
    arXiv 2602.04879, sec. 4, the Binary approximations): the tokens whose policy gradient leaves the trust region.

    With ``p = exp(logps)`` and ``q = exp(anchor_logps)`` (the sampled token's probability now and under the policy that
    sampled it):

    - ``divergence="tv"`` (Binary-TV): a token with A > 0 is outside when ``p - q > delta_high``; one with A <= 0
      when ``p - q < -delta_low``;
    - ``divergence="kl"`` (Binary-KL): ``D = q log(q / p) + (1 - q) log((1 - q) / (1 - p))``, the KL between the
      Bernoulli distributions "this token or another" (1e-8 inside the second logarithm, as the references); a token
      with A > 0 is outside when ``D > delta_high`` and ``p > q``; one with A <= 0 when ``D > delta_low`` and
      ``p < q``.

    A token is only ever stopped from moving further the way its advantage pushes it; A = 0 follows the negative rule
    (its gradient is 0 either way), as verl's ``compute_policy_loss_dppo_tv`` / ``_kl`` and prime-rl's default loss.

    Returns ``(outside, high)``: (B, T) bool masks within ``mask``, every token outside the region and those of them
    with A > 0. Nothing is differentiated.
    """
    p_log = logps.detach().float()  # (B, T)
    q_log = anchor_logps.detach().float()  # (B, T)
    p, q = p_log.exp(), q_log.exp()  # (B, T)
    positive = _expand(advantages.detach().float(), p) > 0  # (B, T)
    if divergence == "tv":
        out_high = (p - q) > delta_high
        out_low = (p - q) < -delta_low
    elif divergence == "kl":
        binary_kl = q * (q_log - p_log) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))  # (B, T)
        out_high = (binary_kl > delta_high) & (p > q)
        out_low = (binary_kl > delta_low) & (p < q)
    else:
        raise ValueError(f"divergence must be 'tv' or 'kl', got {divergence!r}.")
    valid = mask.bool()
    outside = torch.where(positive, out_high, out_low) & valid
    return outside, outside & positive


def squared_log_ratio(logps: torch.Tensor, anchor_logps: torch.Tensor) -> torch.Tensor:
    """Per-token ``(log p - log q)^2`` against the anchor (detached): prime-rl's ``kl_tau`` term beside its DPPO mask.
    (B, T), differentiable in ``logps``."""
    return (logps - anchor_logps.detach()).square()
