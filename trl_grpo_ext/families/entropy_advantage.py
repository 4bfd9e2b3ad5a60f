"""``advantage_weighting: entropy_advantage``: entropy-shaped token advantages (Cheng et al. 2025)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..api import Out
from ..core.advantages import entropy_shaped_advantages
from .base import LossContext
from .interfaces import ADVANTAGE_WEIGHTINGS, AdvantageWeightingBase


@ADVANTAGE_WEIGHTINGS.register("entropy_advantage")
class EntropyAdvantage(AdvantageWeightingBase):
    """Entropy-based advantage shaping (Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective", arXiv
    2506.14758): every trained token's advantage gains ``min(entropy_adv_alpha * H_t, |A_t| / entropy_adv_kappa)``,
    with ``H_t`` the policy's entropy at the token in the same forward pass, detached. No entropy loss: high-entropy
    (forking) tokens of rewarded samples are reinforced more and those of penalised samples less, and the clip keeps
    the bonus below ``|A_t| / kappa`` so it never flips an advantage's sign (``kappa >= 1``).

    An advantage weighting (``entropy_control`` until 0.2.0): applied inside the loss (``shape_advantages``) to the
    advantages of whatever estimator ran, so a (B,) sequence advantage becomes a (B, T) token advantage; token clips
    (Clip-Cov / KL-Cov) and TRL's off-policy mask see the shaped advantages. Evaluation losses keep the unshaped ones.

    Logs ``entropy_adv/bonus_mean`` (mean bonus over trained tokens, all processes) and ``entropy_adv/capped_frac``
    (fraction of trained tokens whose bonus hit the ``|A| / kappa`` cap; a token of advantage 0 is not counted as
    capped).
    """

    @dataclass(frozen=True)
    class Args(AdvantageWeightingBase.Args):  # the config fields it reads
        entropy_adv_alpha: float
        entropy_adv_kappa: float

    args: Args

    metrics = ("entropy_adv/bonus_mean", "entropy_adv/capped_frac")
    docs = "entropy_advantage.md"

    def shape_advantages(self, advantages: torch.Tensor, ctx: LossContext) -> Out[torch.Tensor]:
        if ctx.mode != "train":
            return advantages
        args = self.args
        token_adv = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages).expand_as(ctx.mask)  # (B, T)
        entropies = ctx.token_entropies.detach().to(token_adv.dtype)  # (B, T)
        shaped = entropy_shaped_advantages(
            token_adv, entropies, alpha=args.entropy_adv_alpha, kappa=args.entropy_adv_kappa
        )  # (B, T)
        valid = ctx.mask.bool()  # (B, T)
        bonus = shaped - token_adv
        capped = (
            (args.entropy_adv_alpha * entropies > token_adv.abs() / args.entropy_adv_kappa) & (token_adv != 0) & valid
        )
        stats = torch.stack([bonus[valid].sum().float(), capped.sum().float(), valid.sum().float()])
        bonus_sum, n_capped, n_valid = self.host.collectives.all_sum(stats.detach()).tolist()
        return shaped, {
            "entropy_adv/bonus_mean": bonus_sum / max(n_valid, 1.0),
            "entropy_adv/capped_frac": n_capped / max(n_valid, 1.0),
        }
