"""Process-supervised advantages from step rewards (DeepSeekMath "process supervision").

Shao et al. 2024, "DeepSeekMath" (arXiv 2402.03300), sec. 4.1.3: completion i has K_i steps, step j ends at token
index(j) and gets reward r_i^j. All step rewards of a group are normalised together,
``r~ = (r - mean(R)) / std(R)``, and the advantage of token t is the sum of the normalised rewards of the steps that
end at or after t:

    A_{i,t} = sum_{j : index(j) >= t} r~_i^j

Tokens after the last step end get 0.

Notation:
    N: completions (consecutive runs of G = ``group_size`` share a prompt); K: most steps in one completion;
    T: ``seq_len``, completion tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .advantages import StdKind, nan_std


def pad_steps(
    step_rewards: Sequence[Sequence[float]] | torch.Tensor,
    step_ends: Sequence[Sequence[int]] | torch.Tensor,
    *,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ragged per-completion steps -> padded ``rewards`` (N, K) float, ``ends`` (N, K) long, ``valid`` (N, K) bool.

    Tensors are taken as already padded: a step is valid where its end is >= 0 (pad ends with -1).
    """
    if torch.is_tensor(step_rewards) and torch.is_tensor(step_ends):
        if step_rewards.shape != step_ends.shape or step_rewards.dim() != 2:
            raise ValueError(
                f"Padded step_rewards {tuple(step_rewards.shape)} and step_ends {tuple(step_ends.shape)} must both be "
                "(N, K)."
            )
        ends = step_ends.long()
        return step_rewards.float(), ends, ends >= 0
    if len(step_rewards) != len(step_ends):
        raise ValueError(f"step_rewards has {len(step_rewards)} completions, step_ends {len(step_ends)}.")
    width = max((len(r) for r in step_rewards), default=0)
    n = len(step_rewards)
    rewards = torch.full((n, width), float("nan"))
    ends = torch.full((n, width), -1, dtype=torch.long)
    for i, (r, e) in enumerate(zip(step_rewards, step_ends, strict=True)):
        if len(r) != len(e):
            raise ValueError(
                f"Completion {i}: {len(r)} step rewards but {len(e)} step ends; give one of each per step."
            )
        if r:
            rewards[i, : len(r)] = torch.tensor([float("nan") if x is None else float(x) for x in r])
            ends[i, : len(e)] = torch.tensor([int(x) for x in e], dtype=torch.long)
    if device is not None:
        rewards, ends = rewards.to(device), ends.to(device)
    return rewards, ends, ends >= 0


def prm_step_advantages(
    step_rewards: Sequence[Sequence[float]] | torch.Tensor,
    step_ends: Sequence[Sequence[int]] | torch.Tensor,
    group_size: int,
    seq_len: int,
    *,
    std: StdKind = "population",
    eps: float = 1e-4,
) -> torch.Tensor:
    """Token advantages (N, seq_len) from step rewards, DeepSeekMath sec. 4.1.3.

    Args:
        step_rewards: ``step_rewards[i][j]`` reward of step j of completion i (ragged lists, or a padded (N, K) tensor);
            None / NaN marks an unscored step: left out of the group statistics, contributes 0.
        step_ends: ``step_ends[i][j]``, completion-token index of the last token of step j, in ``[0, seq_len)``
            (padded tensors use -1 for missing steps).
        group_size: G; N must be a multiple of G.
        seq_len: T, width of the returned advantages.
        std: "population" (DeepSeekMath) or "sample" normalisation over all step rewards of a group.
        eps: added to the std.

    Returns:
        (N, T) float32: reverse cumulative sum of the normalised step rewards over step-end positions.

    Example:
        >>> prm_step_advantages([[1.0, 0.0], [1.0]], [[1, 3], [2]], group_size=2, seq_len=5, eps=0.0)
        tensor([[-0.7071, -0.7071, -1.4142, -1.4142,  0.0000],
                [ 0.7071,  0.7071,  0.7071,  0.0000,  0.0000]])
    """
    rewards, ends, valid = pad_steps(step_rewards, step_ends)
    n, k = rewards.shape
    if group_size < 1 or n % group_size != 0:
        raise ValueError(f"The number of completions ({n}) must be a multiple of group_size ({group_size}).")
    if bool((valid & (ends >= seq_len)).any()):
        raise ValueError(f"A step ends at token {int(ends[valid].max())}, outside the {seq_len} completion tokens.")
    dtype = rewards.dtype
    scored = valid & ~torch.isnan(rewards)  # (N, K)
    # float64 statistics: sums and squares of step rewards up to the float32 maximum do not overflow
    grouped = rewards.double().masked_fill(~scored, float("nan")).reshape(n // group_size, group_size * k)  # (N/G, G*K)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)  # (N/G, 1)
    spread = nan_std(grouped, dim=1, kind=std, keepdim=True) if k > 0 else torch.zeros_like(mean)
    normalised = ((grouped - mean) / (spread + eps)).reshape(n, k)  # (N, K)
    normalised = torch.where(scored, torch.nan_to_num(normalised, nan=0.0), torch.zeros_like(normalised))
    at_end = torch.zeros(n, seq_len + 1, dtype=normalised.dtype, device=normalised.device)  # last column: sink
    at_end.scatter_add_(1, torch.where(valid, ends, torch.full_like(ends, seq_len)), normalised)
    return at_end[:, :seq_len].flip(1).cumsum(1).flip(1).to(dtype)  # (N, T)
