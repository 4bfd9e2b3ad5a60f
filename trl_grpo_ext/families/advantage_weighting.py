"""Advantage weightings (``advantage_weighting``): reweight the estimator's advantages by their sign."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..api import Out
from ..core.advantages import scale_positive_advantages, w_reinforce_advantages
from ..names import config_error
from .advantage import OutcomeAdvantage
from .base import GenerationBatch, LossContext, Off
from .interfaces import ADVANTAGE_WEIGHTINGS, AdvantageUpdate, AdvantageWeightingBase

ADVANTAGE_WEIGHTINGS.register("none")(Off)


@ADVANTAGE_WEIGHTINGS.register("w_reinforce")
class WReinforce(AdvantageWeightingBase):
    """W-REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning", arXiv
    2506.01347, sec. 5): ``lambda * L_PSR + L_NSR``, positive samples reinforced with a small weight
    (``w_reinforce_lambda``), negative ones pushed down fully.

    ``w_reinforce_baseline="none"`` (the paper): a sample whose reward exceeds ``w_reinforce_threshold`` gets advantage
    ``lambda``, any other -1, an unscorable one 0, in place of the group-normalised advantage (so only with
    ``advantage_estimator="grpo"``). ``"group"``: the estimator's own advantages (any estimator, token-level too) with
    their positive entries multiplied by ``lambda`` inside the loss. Evaluation batches keep TRL's advantages.

    Logs ``w_reinforce/positive_frac`` (fraction of samples reinforced positively, all processes) and
    ``w_reinforce/adv_mean`` (mean advantage after weighting).
    """

    @dataclass(frozen=True)
    class Args(AdvantageWeightingBase.Args):  # the config fields it reads
        w_reinforce_lambda: float
        w_reinforce_baseline: str
        w_reinforce_threshold: float

    args: Args

    metrics = ("w_reinforce/positive_frac", "w_reinforce/adv_mean")
    example_config = {"w_reinforce_lambda": 0.1}
    docs = "w_reinforce.md"

    @classmethod
    def check_combination(cls, args, members) -> None:
        estimator = members["advantage_estimator"]
        if args.w_reinforce_baseline == "none":
            if not issubclass(estimator, OutcomeAdvantage):
                raise config_error(
                    "w_reinforce_baseline",
                    args.w_reinforce_baseline,
                    f"'none' replaces the group advantage by +lambda / -1, so advantage_estimator="
                    f"{args.advantage_estimator!r} would be discarded",
                    "set w_reinforce_baseline='group' (weights that estimator's advantages) or "
                    "advantage_estimator='grpo'",
                )
            if args.advantage_std != "sample":
                raise config_error(
                    "advantage_std",
                    args.advantage_std,
                    "w_reinforce_baseline='none' replaces the group-normalised advantages by +lambda / -1, so the "
                    "standard deviation they are divided by does nothing",
                    "keep advantage_std='sample', or set w_reinforce_baseline='group'",
                )
            if not members["refill"].is_off:
                raise config_error(
                    "w_reinforce_baseline",
                    args.w_reinforce_baseline,
                    "without a baseline W-REINFORCE gives every group a gradient (+lambda / -1 per sample), so no "
                    f"group lacks signal and refill={args.refill!r} has nothing to refill",
                    "set w_reinforce_baseline='group', or refill='none'",
                )
        elif estimator.never_negative_advantages(args):
            raise config_error(
                "advantage_weighting",
                args.advantage_weighting,
                f"w_reinforce_baseline='group' multiplies the positive advantages by w_reinforce_lambda and keeps the "
                f"negative ones, but {estimator.__name__} (advantage_estimator={args.advantage_estimator!r}) writes "
                "no negative advantage with these settings, so lambda only rescales the loss (lambda = 0: no gradient "
                "at all)",
                "use W-REINFORCE with advantage_estimator='grpo', or anneal PKPO's k to 1 (pkpo_anneal_fraction > 0: "
                "its pass@1 advantages have both signs), or set advantage_weighting='none'",
            )

    def on_generation(self, batch: GenerationBatch) -> Out[AdvantageUpdate | None]:
        if batch.mode != "train":
            return None
        args = self.args
        if args.w_reinforce_baseline == "none":
            advantages = w_reinforce_advantages(
                batch.rewards, positive_weight=args.w_reinforce_lambda, threshold=args.w_reinforce_threshold
            )  # (N,)
            scorable = ~torch.isnan(batch.rewards)
            positive = (batch.rewards > args.w_reinforce_threshold).float().sum() / scorable.sum().clamp(min=1)
            metrics = {"w_reinforce/positive_frac": float(positive), "w_reinforce/adv_mean": float(advantages.mean())}
            return AdvantageUpdate(advantages=advantages.to(batch.rewards.dtype)), metrics
        # "group": the weighting acts in the loss; log what it will do to this batch (rows by their first token)
        local = batch.output["advantages"]
        per_row = local if local.dim() == 1 else local[:, 0]  # (B,)
        rows = self.host.gather(per_row.detach().float())  # (N,)
        weighted = scale_positive_advantages(rows, positive_weight=args.w_reinforce_lambda)
        return None, {
            "w_reinforce/positive_frac": float((rows > 0).float().mean()),
            "w_reinforce/adv_mean": float(weighted.mean()),
        }

    def shape_advantages(self, advantages: torch.Tensor, ctx: LossContext) -> torch.Tensor:
        if ctx.mode != "train" or self.args.w_reinforce_baseline != "group":
            return advantages
        return scale_positive_advantages(advantages, positive_weight=self.args.w_reinforce_lambda)
