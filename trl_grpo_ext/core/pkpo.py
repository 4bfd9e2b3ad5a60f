"""Pass@k policy optimisation: reward transformations whose policy gradient is an unbiased estimate of the gradient of
pass@k (binary rewards) or of maxg@k, the expected best reward of k samples (continuous rewards).

Walder & Karkhanis 2025, "Pass@K Policy Optimization: Solving Harder Reinforcement Learning Problems" (PKPO, arXiv
2505.15201). From n >= k samples of a prompt with rewards g_1..g_n, every k-subset S is one draw of "k samples", so the
U-statistic ``(1 / C(n, k)) sum_S max_S g * sum_{j in S} grad log p(x_j)`` is unbiased for ``grad maxg@k``; collected
per sample it is ``sum_i s_i grad log p(x_i)`` with

    s_i = (1 / C(n, k)) * sum_{S containing i} max_S g                                                   (eq. 17-20)

and, with the samples sorted ascending (``r_i`` the rank of i),
``s_i = (1 / C(n, k)) * [C(r_i - 1, k - 1) g_i + sum_{m > r_i} C(m - 2, k - 2) g_(m)]``.
Subtracting from s_i anything that does not depend on x_i keeps the estimate unbiased and lowers its variance; the
paper's best, ``s^(loo-1)``, subtracts the mean best reward of the (k - 1)-subsets of the *other* samples:

    s^(loo-1)_i = (k / n) * mean_{T subset of others, |T| = k - 1} [max(g_i, max_T g) - max_T g]          (eq. 33)

which is ``(k / n) / C(n - 1, k - 1) * [g_i C(q_i, k - 1) - sum_{j <= q_i} C(j - 1, k - 2) g_(j)]`` with q_i the number
of samples strictly below g_i (a subset with a sample at or above g_i adds nothing). For binary rewards: a right sample
gets ``(k / n) * C(n - c, k - 1) / C(n - 1, k - 1)`` (c right of n), a wrong one 0.

At k = 1 the (k - 1)-subsets are empty and eq. 33 is undefined (read with max over nothing = 0 it would be g_i / n,
no baseline at all: a group whose samples all score 1 would be pushed up). There ``loo_minus_one`` is the paper's
leave-one-out estimator s^(loo) (eq. 29), which at k = 1 is the RLOO baseline:

    s^(loo)_i = (1 / n) * (g_i - mean_{j != i} g_j)          (k = 1; 0 for a group of one sample)

so a group whose rewards are all equal gets 0, as under GRPO, and k annealed to 1 ends on plain pass@1 with a baseline.

Notation:
    P: prompts, G = n: samples per prompt, k: the k of pass@k (1 <= k <= G). Rewards (P * G,) in prompt-major order.
"""

from __future__ import annotations

from math import comb
from typing import Literal

import torch

Estimator = Literal["s", "loo_minus_one"]


def _binomials(n: int, k: int, *, offset: int, dtype, device) -> torch.Tensor:
    """(n + 1,) C(j + offset, k) for j = 0..n, 0 where undefined (j + offset < k or k < 0)."""
    values = [comb(j + offset, k) if k >= 0 and j + offset >= 0 else 0 for j in range(n + 1)]
    return torch.tensor(values, dtype=dtype, device=device)


def pass_at_k_weights(
    rewards: torch.Tensor, group_size: int, k: int, *, estimator: Estimator = "loo_minus_one"
) -> torch.Tensor:
    """(N,) the per-sample weights s_i (``estimator="s"``) or s^(loo-1)_i of PKPO (see the module docstring): used in
    place of the advantage, their policy gradient estimates the gradient of pass@k (maxg@k for continuous rewards).

    Args:
        rewards: (N,) rewards, N = P * group_size, consecutive rows one prompt's samples; NaN (unscorable) counts as the
            lowest reward of its group.
        group_size: n, samples per prompt.
        k: the k of pass@k, 1 <= k <= n.
        estimator: ``"s"`` (the plain U-statistic weights) or ``"loo_minus_one"`` (baselined, lowest variance).

    Returns:
        (N,) float64 weights, in the rows' order. Ties are broken by row order (the estimate does not depend on it).
        At k = 1 ``loo_minus_one`` gives the leave-one-out weights ``(g_i - mean of the others) / n`` (module
        docstring).
    """
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be (P * group_size,) with group_size >= 1; got {tuple(rewards.shape)}, {group_size}"
        )
    if not 1 <= k <= group_size:
        raise ValueError(f"pass@k needs 1 <= k <= group_size ({group_size}), got k={k}.")
    if estimator not in ("s", "loo_minus_one"):
        raise ValueError(f"estimator must be 's' or 'loo_minus_one', got {estimator!r}.")
    n = group_size
    grouped = rewards.double().view(-1, n)  # (P, n)
    missing = torch.isnan(grouped)
    low = torch.where(missing, torch.inf, grouped).amin(dim=1, keepdim=True)  # (P, 1) the group's lowest reward
    low = torch.where(torch.isinf(low), torch.zeros_like(low), low)  # a group with no reward at all: 0
    values = torch.where(missing, low, grouped)  # (P, n): an unscorable sample counts as the group's worst
    order = torch.sort(values, dim=1, stable=True)  # ascending; ties by row
    sorted_g, index = order.values, order.indices  # (P, n)
    ranks = torch.empty_like(index)
    ranks.scatter_(1, index, torch.arange(n, device=index.device).expand_as(index))  # (P, n) 0-based rank of each row
    dtype, device = torch.float64, rewards.device
    if estimator == "s":
        own = _binomials(n - 1, k - 1, offset=0, dtype=dtype, device=device)  # C(r, k-1), r = 0..n-1 (0-based rank)
        above = _binomials(n - 1, k - 2, offset=-1, dtype=dtype, device=device)  # C(m-1, k-2) at 0-based rank m
        weighted = sorted_g * above[:n]  # (P, n): C(m - 1, k - 2) g_(m), 0-based m (= C(m' - 2, k - 2), 1-based m')
        suffix = weighted.flip(1).cumsum(1).flip(1)  # (P, n): sum over ranks >= m
        after = torch.cat([suffix[:, 1:], suffix.new_zeros(suffix.size(0), 1)], dim=1)  # sum over ranks > m
        per_rank = (own[:n] * sorted_g + after) / comb(n, k)  # (P, n), by rank
        return torch.gather(per_rank, 1, ranks).reshape(-1)
    if k == 1:  # s^(loo) (eq. 29) at k = 1: the leave-one-out baseline, eq. 33 being undefined there
        if n == 1:
            return torch.zeros_like(values).reshape(-1)
        others = (values.sum(dim=1, keepdim=True) - values) / (n - 1)  # (P, n)
        return ((values - others) / n).reshape(-1)
    # s^(loo-1): q_i = samples strictly below g_i; prefix sums of C(j - 1, k - 2) g_(j) over the sorted group
    below = (values.unsqueeze(2) > values.unsqueeze(1)).sum(dim=2)  # (P, n): q_i
    prefix_w = _binomials(n - 1, k - 2, offset=0, dtype=dtype, device=device)  # C(j - 1, k - 2), j = 1..n
    prefix = torch.cat([sorted_g.new_zeros(sorted_g.size(0), 1), (sorted_g * prefix_w).cumsum(1)], dim=1)  # (P, n+1)
    count = _binomials(n, k - 1, offset=0, dtype=dtype, device=device)  # C(q, k - 1), q = 0..n
    gain = values * count[below] - torch.gather(prefix, 1, below)  # (P, n)
    return (gain * (k / n) / comb(n - 1, k - 1)).reshape(-1)


def annealed_k(k: int, *, progress: float, anneal_fraction: float) -> int:
    """The k of a schedule that goes from ``k`` down to 1 linearly over the first ``anneal_fraction`` of training and
    stays at 1 after it (PKPO sec. 5: optimise pass@k early, pass@1 at the end); ``anneal_fraction=0``: constant k.
    ``progress`` in [0, 1] is the fraction of training done."""
    if anneal_fraction <= 0.0:
        return k
    done = min(max(progress / anneal_fraction, 0.0), 1.0)
    return max(1, round(k - done * (k - 1)))


__all__ = ["Estimator", "annealed_k", "pass_at_k_weights"]
