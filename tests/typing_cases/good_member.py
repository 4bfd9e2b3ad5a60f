"""Members written against the family interfaces and registered in the typed registries: type-check
(tests/test_typing.py runs mypy on it; nothing here runs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from trl_grpo_ext.families import (
    ADVANTAGE_WEIGHTINGS,
    KL_CONTROLLERS,
    SAMPLE_FILTERS,
    TOKEN_CLIPS,
    GenerationBatch,
    LossContext,
)
from trl_grpo_ext.families.base import Host, RolloutService
from trl_grpo_ext.families.interfaces import (
    AdvantageUpdate,
    AdvantageWeightingBase,
    FilterUpdate,
    KLControllerBase,
    Out,
    SampleFilterBase,
    TokenClipBase,
)


@ADVANTAGE_WEIGHTINGS.register("halve_negatives")
class HalveNegatives(AdvantageWeightingBase):
    """An advantage weighting: negative advantages count half, in the batch and in the loss."""

    @dataclass(frozen=True)
    class Args(AdvantageWeightingBase.Args):
        beta: float

    metrics: ClassVar[tuple[str, ...]] = ("halve/negative_frac",)

    def on_generation(self, batch: GenerationBatch) -> Out[AdvantageUpdate | None]:
        advantages = batch.output["advantages"]
        return None, {"halve/negative_frac": float((advantages < 0).float().mean())}

    def shape_advantages(self, advantages: torch.Tensor, ctx: LossContext) -> torch.Tensor:
        return torch.where(advantages < 0, advantages / 2, advantages)


@SAMPLE_FILTERS.register("positive_only")
class PositiveOnly(SampleFilterBase):
    """A sample filter: rows with a positive reward train."""

    def on_generation(self, batch: GenerationBatch) -> FilterUpdate | None:
        return FilterUpdate(keep=torch.nan_to_num(batch.rewards, nan=0.0) > 0)


@TOKEN_CLIPS.register("negative_logp_tokens")
class NegativeLogpTokens(TokenClipBase):
    """A token clip acting on the tokens of negative log-probability (any Extension subclass may be one: its hooks are
    all in the loss)."""

    def select_tokens(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor | None:
        return ctx.policy_mask & (ctx.logps.detach() < 0)

    @dataclass(frozen=True)
    class Args(TokenClipBase.Args):
        beta: float

    args: Args

    def extra_loss(self, ctx: LossContext) -> torch.Tensor | None:
        if self.args.beta == 0.0:
            return None
        return self.aggregate(ctx.logps * 0.0, ctx)


@KL_CONTROLLERS.register("halving_kl")
class HalvingKL(KLControllerBase):
    """A KL controller halving beta at every step end, through the service its base names."""

    def after_loss(self, ctx: LossContext) -> None:
        if self.host.step_end:
            self.beta_control.set_beta(self.host.beta / 2)


@SAMPLE_FILTERS.register("regenerating_filter")
class RegeneratingFilter(SampleFilterBase):
    """A member naming a service of its own in its constructor (the rollouts) and using it."""

    def __init__(self, args: SampleFilterBase.Args, host: Host, *, rollouts: RolloutService):
        super().__init__(args, host)
        self.rollouts = rollouts

    def on_generation(self, batch: GenerationBatch) -> FilterUpdate | None:
        again = self.rollouts.regenerate(batch.prompts, temperature=1.0)
        return FilterUpdate(keep=torch.ones(len(again.completions), dtype=torch.bool))
