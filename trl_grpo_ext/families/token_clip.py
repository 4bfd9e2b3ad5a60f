"""Clip-Cov and KL-Cov (``token_clip``), Cui et al. 2025 (arXiv 2505.22617).

Both choose among the tokens whose policy loss TRL keeps (``LossContext.policy_mask``: the loss mask, and where
configured ``top_entropy_quantile``'s entropy mask, the off-policy sequence mask and vLLM's importance-sampling
mask), so no selection falls on a token TRL already excluded; the KL-Cov penalty is multiplied by the same factor
TRL multiplies into its policy loss (``LossContext.policy_weight``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import torch

from ..api import Out
from ..core.collectives import LOCAL
from ..core.token_clip import (
    clip_cov_mask,
    dppo_outside_mask,
    kl_cov_mask,
    kl_cov_penalty,
    ppo_clipped_mask,
    squared_log_ratio,
    token_covariance,
)
from ..names import config_error
from .base import Host, LossContext, Off, RatioClip
from .interfaces import TOKEN_CLIPS, TokenClipBase

logger = logging.getLogger(__name__)

TOKEN_CLIPS.register("none")(Off)


def require_token_level(args, problem: str, fix: str = "set importance_sampling_level='token'") -> None:
    """Refuse sequence-level importance sampling (GSPO) for a member that acts on tokens."""
    if args.importance_sampling_level != "token":
        raise config_error("token_clip", args.token_clip, problem, fix)


class _CovarianceClip(TokenClipBase):
    @dataclass(frozen=True)
    class Args(TokenClipBase.Args):  # the config fields it reads
        token_clip_scope: str

    args: Args

    @classmethod
    def check_combination(cls, args, members) -> None:
        require_token_level(
            args,
            "token-level covariance clipping needs token-level importance sampling",
            "set importance_sampling_level='token' or token_clip='none'",
        )

    prefix = ""

    def collectives(self):
        return self.host.collectives if self.args.token_clip_scope == "global" else LOCAL

    def covariance(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor:
        """(B, T) centred covariance of the policy-loss tokens, computed once per micro-batch for selection and logs."""
        return token_covariance(logps, ctx.row_advantages, ctx.policy_mask, collectives=self.collectives())

    def selection_metrics(self, ctx: LossContext, cov: torch.Tensor, selected: torch.Tensor) -> dict[str, float]:
        """Global metrics: fraction and number of tokens selected, mean covariance of valid and of selected tokens."""
        coll = self.host.collectives
        valid = ctx.policy_mask
        stats = torch.stack([valid.sum().float(), selected.sum().float(), cov[valid].sum(), cov[selected].sum()])
        n_valid, n_sel, cov_sum, sel_cov_sum = coll.all_sum(stats).tolist()
        metrics = {
            f"{self.prefix}/selected_frac": n_sel / max(n_valid, 1.0),
            f"{self.prefix}/selected_tokens": n_sel,
            f"{self.prefix}/cov_mean": cov_sum / max(n_valid, 1.0),
        }
        if n_sel > 0:
            metrics[f"{self.prefix}/selected_cov_mean"] = sel_cov_sum / n_sel
        return metrics


@TOKEN_CLIPS.register("clip_cov")
class ClipCov(_CovarianceClip):
    """Detach the log-probs of the selected tokens: their policy-loss gradient is removed, nothing else changes.

    TRL's loss also reads the same log-probs for the KL term; :meth:`extra_loss` adds back exactly the KL gradient of
    the selected tokens (value 0), so only their policy gradient goes, as in the paper and verl.
    """

    @dataclass(frozen=True)
    class Args(_CovarianceClip.Args):  # the config fields it reads
        clip_cov_ratio: float
        clip_cov_lb: float
        clip_cov_ub: float

    args: Args

    prefix = "clip_cov"
    metrics = ("clip_cov/selected_frac", "clip_cov/selected_tokens", "clip_cov/cov_mean", "clip_cov/ppo_clipped_frac")
    optional_metrics = ("clip_cov/selected_cov_mean",)  # when a token was selected
    example_config = {"clip_cov_ratio": 0.05, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}
    docs = "clip_cov_kl_cov.md"

    def select_tokens(self, logps: torch.Tensor, ctx: LossContext) -> Out[torch.Tensor | None]:
        host = self.host
        candidates = ctx.policy_mask  # (B, T)
        epsilon_low, epsilon_high = host.ratio_clip
        exclude = ppo_clipped_mask(
            logps,
            ctx.old_logps,
            ctx.advantages,
            candidates,
            epsilon_low=epsilon_low,
            epsilon_high=epsilon_high,
        )
        cov = self.covariance(logps, ctx)
        selected = clip_cov_mask(
            logps,
            ctx.row_advantages,
            candidates,
            ratio=self.args.clip_cov_ratio,
            lb=self.args.clip_cov_lb,
            ub=self.args.clip_cov_ub,
            generator=host.generator("clip_cov", per_rank=True, device=logps.device),
            exclude=exclude,
            collectives=self.collectives(),
            covariance=cov,
        )
        coll = host.collectives
        n_clipped, n_valid = coll.all_sum(torch.stack([exclude.sum(), candidates.sum()]).float()).tolist()
        metrics = {
            **self.selection_metrics(ctx, cov, selected),
            "clip_cov/ppo_clipped_frac": n_clipped / max(n_valid, 1.0),
        }
        return selected, metrics

    def modify_logps(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor:
        return torch.where(ctx.selection, logps.detach(), logps)

    def extra_loss(self, ctx: LossContext) -> torch.Tensor | None:
        return restore_kl_gradient(self, ctx)


def restore_kl_gradient(member, ctx: LossContext) -> torch.Tensor | None:
    """The KL gradient of the tokens whose log-probs a member detached (``ctx.selected``): value 0, so that only their
    policy gradient goes (TRL's KL term reads the same log-probs). None when nothing is to restore."""
    beta = member.host.beta
    selected = ctx.selected
    if beta == 0.0 or selected is None or not bool(selected.any()):
        return None
    kl = member.trl_kl(ctx)
    restore = (kl - kl.detach()) * selected.to(kl.dtype)  # value 0, gradient of the selected tokens' KL
    # Mirrors TRL's own KL term, which the sample filter's rescale corrects separately: no row scale here.
    return beta * member.aggregate(restore, ctx, scale_rows=False)


@TOKEN_CLIPS.register("kl_cov")
class KLCov(_CovarianceClip):
    """Add ``kl_cov_coef * |logp - old_logp|`` on the top-covariance tokens, aggregated like the loss type.

    Unless ``kl_cov_ppo_clip``, TRL's ratio clip is switched off (epsilon -> inf), as in the paper and verl.
    """

    @dataclass(frozen=True)
    class Args(_CovarianceClip.Args):  # the config fields it reads
        kl_cov_ratio: float
        kl_cov_coef: float
        kl_cov_ppo_clip: bool

    args: Args

    prefix = "kl_cov"
    metrics = ("kl_cov/selected_frac", "kl_cov/selected_tokens", "kl_cov/cov_mean", "kl_cov/penalty_mean")
    optional_metrics = ("kl_cov/selected_cov_mean",)  # when a token was selected
    example_config = {"kl_cov_ratio": 0.05, "num_iterations": 2}
    docs = "clip_cov_kl_cov.md"

    @classmethod
    def check_combination(cls, args, members) -> None:
        super().check_combination(args, members)
        if not args.is_off_policy:
            raise config_error(
                "token_clip",
                args.token_clip,
                "KL-Cov is inert on-policy: with num_iterations=1 and steps_per_generation <= "
                "gradient_accumulation_steps the old log-probs equal the current ones, so |logp - old_logp| and its "
                "gradient are 0",
                "set num_iterations=2 (as the paper) or steps_per_generation > gradient_accumulation_steps, "
                "or use token_clip='clip_cov'",
            )
        asked = []
        if not args.kl_cov_ppo_clip and args.epsilon_high is not None:
            asked.append(f"epsilon_high={args.epsilon_high}")
        if not args.kl_cov_ppo_clip and args.loss_type == "cispo":
            asked.append("loss_type='cispo' (its cap is epsilon_high)")
        if asked:
            raise config_error(
                "kl_cov_ppo_clip",
                args.kl_cov_ppo_clip,
                f"KL-Cov without the PPO clip (the paper's setting) sets TRL's epsilon_low / epsilon_high to "
                f"infinity, which would silently drop the clip you asked for: {', '.join(asked)}",
                "set kl_cov_ppo_clip=True to keep TRL's clip under KL-Cov, or drop epsilon_high / use another "
                "loss_type",
            )

    def __init__(self, args: Args, host: Host, *, ratio_clip: RatioClip):
        super().__init__(args, host)
        if not args.kl_cov_ppo_clip:
            logger.warning(
                "token_clip='kl_cov' with kl_cov_ppo_clip=False switches TRL's PPO ratio clip off (epsilon_low=%s, "
                "epsilon_high=%s -> no clip), as the KL-Cov paper and verl do; the KL-Cov penalty is the only trust "
                "region. Set kl_cov_ppo_clip=True to keep TRL's clip (DAPO's clip-higher, CISPO's cap).",
                *host.ratio_clip,
            )
            ratio_clip.drop_ratio_clip()

    def select_tokens(self, logps: torch.Tensor, ctx: LossContext) -> Out[torch.Tensor | None]:
        cov = self.covariance(logps, ctx)
        selected = kl_cov_mask(
            logps,
            ctx.row_advantages,
            ctx.policy_mask,
            ratio=self.args.kl_cov_ratio,
            collectives=self.collectives(),
            covariance=cov,
        )
        return selected, self.selection_metrics(ctx, cov, selected)

    def extra_loss(self, ctx: LossContext) -> Out[torch.Tensor | None]:
        # (B, T); weighted like TRL's policy loss (entropy / off-policy masks, vLLM importance-sampling ratio).
        selected = ctx.selection
        penalty = ctx.weighted(kl_cov_penalty(ctx.logps, ctx.old_logps, selected))
        coll = self.host.collectives
        stats = coll.all_sum(torch.stack([penalty.detach().sum(), selected.sum().float()]))
        metrics = {"kl_cov/penalty_mean": (stats[0] / stats[1].clamp(min=1.0)).item()}
        return self.args.kl_cov_coef * self.aggregate(penalty, ctx), metrics


#: TRL loss types whose policy term is PPO's ``-min(r A, clip(r) A)``, which DPPO turns into ``-r A`` on the tokens
#: inside its trust region by switching the ratio clip off; the others (``cispo``, ``sapo``, ``vespo``) shape the
#: ratio themselves.
DPPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


@TOKEN_CLIPS.register("dppo")
class DPPO(TokenClipBase):
    """DPPO's binary trust region (Qi et al. 2026, arXiv 2602.04879): TRL's ratio clip is switched off and the tokens
    whose probability moved too far from the policy that sampled them, the way their advantage pushes, lose their
    policy gradient (their log-probs are detached; their KL gradient is added back, as for Clip-Cov). With
    ``dppo_log_ratio_coef`` > 0, prime-rl's ``kl_tau * (log p - log q)^2`` on every loss token.

    The anchor ``q`` is the rollout policy: vLLM's sampling log-probs where TRL has them, else TRL's old log-probs (the
    policy at generation time).
    """

    @dataclass(frozen=True)
    class Args(TokenClipBase.Args):  # its own parameters (config fields of GRPOExtConfig: config.members)
        dppo_divergence: Literal["tv", "kl"] = field(
            default="tv",
            metadata={
                "help": "DPPO's divergence on the sampled token: 'tv' (Binary-TV, the probability difference p - q) "
                "or 'kl' (Binary-KL between 'this token or another' now and at rollout)."
            },
        )
        dppo_delta_low: float = field(
            default=0.2,
            metadata={
                "help": "DPPO's trust-region bound for tokens with A <= 0 (how far their probability may fall, or "
                "their binary KL); 0.2 is prime-rl's dppo_mask_low and verl's default."
            },
        )
        dppo_delta_high: float = field(
            default=0.2,
            metadata={
                "help": "DPPO's trust-region bound for tokens with A > 0 (how far their probability may rise, or "
                "their binary KL)."
            },
        )
        dppo_log_ratio_coef: float = field(
            default=0.0,
            metadata={
                "help": "Weight of prime-rl's (log p - log q)^2 on every loss token beside the DPPO mask (its kl_tau, "
                "1e-3 in its configs); 0 is the paper's and verl's loss."
            },
        )

    args: Args
    metrics = ("dppo/masked_frac", "dppo/masked_high_frac", "dppo/masked_low_frac", "dppo/prob_shift_mean")
    optional_metrics = ("dppo/log_ratio_sq_mean",)  # with dppo_log_ratio_coef > 0
    example_config = {"dppo_divergence": "tv", "dppo_delta_low": 0.2, "dppo_delta_high": 0.2, "num_iterations": 2}
    docs = "dppo.md"

    @classmethod
    def check_combination(cls, args, members) -> None:
        for name in ("dppo_delta_low", "dppo_delta_high"):
            value = getattr(args, name)
            if not value > 0:  # finite: the config's number check ran first
                raise config_error(
                    name, value, "must be a finite number > 0", f"e.g. {name}=0.2 (prime-rl's and verl's default)"
                )
            if args.dppo_divergence == "tv" and value >= 1:
                raise config_error(
                    name,
                    value,
                    "a probability difference of 1 or more is never reached: no token would be masked",
                    f"e.g. {name}=0.2",
                )
        if not args.dppo_log_ratio_coef >= 0:
            raise config_error(
                "dppo_log_ratio_coef",
                args.dppo_log_ratio_coef,
                "must be a finite number >= 0",
                "e.g. dppo_log_ratio_coef=1e-3 (prime-rl's kl_tau) or 0 (the paper's loss)",
            )
        require_token_level(
            args, "DPPO's trust region is per token; sequence-level importance sampling has no token ratio to mask"
        )
        if args.loss_type not in DPPO_LOSS_TYPES:
            raise config_error(
                "token_clip",
                args.token_clip,
                f"DPPO replaces PPO's ratio clip, and loss_type={args.loss_type!r} shapes the ratio its own way",
                f"use one of loss_type={DPPO_LOSS_TYPES}, or token_clip='none' to keep {args.loss_type!r}",
            )
        if args.epsilon_high is not None:
            raise config_error(
                "token_clip",
                args.token_clip,
                f"DPPO switches TRL's ratio clip off (its trust region replaces it), which would silently drop the "
                f"epsilon_high={args.epsilon_high} you asked for",
                "drop epsilon_high (DPPO's asymmetric region is dppo_delta_low / dppo_delta_high)",
            )
        if not (args.is_off_policy or args.use_vllm):
            raise config_error(
                "token_clip",
                args.token_clip,
                "DPPO is inert on-policy without vLLM: with num_iterations=1 and steps_per_generation <= "
                "gradient_accumulation_steps the policy that sampled the batch is the one trained, so no token "
                "leaves the trust region",
                "set num_iterations=2 or steps_per_generation > gradient_accumulation_steps, or generate with vLLM "
                "(its sampling log-probs are the anchor)",
            )

    def __init__(self, args: Args, host: Host, *, ratio_clip: RatioClip):
        super().__init__(args, host)
        ratio_clip.drop_ratio_clip()  # the trust region replaces the clip (verl, prime-rl, the paper)

    @staticmethod
    def anchor(ctx: LossContext) -> torch.Tensor:
        """(B, T) the rollout policy's log-probs: vLLM's where TRL kept them, else TRL's old ones (TRL's own
        ``off_policy_mask`` reads the same)."""
        sampling = ctx.inputs.get("sampling_per_token_logps")
        return ctx.old_logps if sampling is None else sampling

    def select_tokens(self, logps: torch.Tensor, ctx: LossContext) -> Out[torch.Tensor | None]:
        args = self.args
        anchor = self.anchor(ctx)
        valid = ctx.policy_mask
        outside, high = dppo_outside_mask(
            logps, anchor, ctx.advantages, valid,
            divergence=args.dppo_divergence, delta_low=args.dppo_delta_low, delta_high=args.dppo_delta_high,
        )  # fmt: skip
        shift = (logps.detach().float().exp() - anchor.detach().float().exp()).abs()  # (B, T)
        stats = torch.stack([valid.sum(), outside.sum(), high.sum()]).float()
        stats = self.host.collectives.all_sum(torch.cat([stats, (shift * valid).sum().reshape(1)]))
        n_valid, n_out, n_high, shift_sum = stats.tolist()
        n_valid = max(n_valid, 1.0)
        return outside, {
            "dppo/masked_frac": n_out / n_valid,
            "dppo/masked_high_frac": n_high / n_valid,
            "dppo/masked_low_frac": (n_out - n_high) / n_valid,
            "dppo/prob_shift_mean": shift_sum / n_valid,
        }

    def modify_logps(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor:
        return torch.where(ctx.selection, logps.detach(), logps)

    def extra_loss(self, ctx: LossContext) -> Out[torch.Tensor | None]:
        restore = restore_kl_gradient(self, ctx)
        coef = self.args.dppo_log_ratio_coef
        if coef == 0.0:
            return restore
        per_token = ctx.weighted(squared_log_ratio(ctx.logps, self.anchor(ctx)))  # (B, T)
        valid = ctx.mask.bool()
        stats = self.host.collectives.all_sum(torch.stack([(per_token.detach() * valid).sum(), valid.sum().float()]))
        penalty = coef * self.aggregate(per_token, ctx)
        metrics = {"dppo/log_ratio_sq_mean": (stats[0] / stats[1].clamp(min=1.0)).item()}
        return (penalty if restore is None else penalty + restore), metrics
