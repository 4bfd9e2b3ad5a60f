"""A member written against the family interface: type-checks (tests/test_typing.py runs mypy on it)."""

from __future__ import annotations

from typing import ClassVar

import torch

from trl_grpo_ext.families import Extension, GenerationBatch, LossContext
from trl_grpo_ext.families.base import GenerationUpdate


class HalveNegatives(Extension):
    """An advantage weighting: negative advantages count half, in the batch and in the loss."""

    config_fields: ClassVar[tuple[str, ...]] = ("beta",)
    metrics: ClassVar[tuple[str, ...]] = ("halve/negative_frac",)

    def on_generation(self, batch: GenerationBatch) -> GenerationUpdate | None:
        advantages = batch.output["advantages"]
        self.log_metric(batch.mode, "halve/negative_frac", float((advantages < 0).float().mean()))
        return None

    def shape_advantages(self, advantages: torch.Tensor, ctx: LossContext) -> torch.Tensor:
        return torch.where(advantages < 0, advantages / 2, advantages)

    def select_tokens(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor | None:
        return ctx.policy_mask & (ctx.logps.detach() < 0)

    def extra_loss(self, ctx: LossContext) -> torch.Tensor | None:
        if self.args.beta == 0.0:
            return None
        return self.aggregate(ctx.logps * 0.0, ctx)
