"""Advantage estimators (``advantage_estimator``)."""

from __future__ import annotations

from ..core.advantages import group_relative_advantages
from .base import ADVANTAGE_ESTIMATORS, Extension, GenerationBatch, GenerationUpdate


@ADVANTAGE_ESTIMATORS.register("grpo")
class OutcomeAdvantage(Extension):
    """TRL's group-normalised outcome advantage; recomputed only for ``advantage_std="population"``.

    With ``advantage_std="sample"`` TRL's own advantages are kept untouched (bit-for-bit parity with GRPOTrainer).
    """

    docs = "outcome_advantages.md"

    def on_generation(self, batch: GenerationBatch) -> GenerationUpdate | None:
        if self.args.advantage_std == "sample":
            return None
        advantages = group_relative_advantages(
            batch.rewards, batch.group_size, std=self.args.advantage_std, scale=self.host.scale_rewards
        )
        return GenerationUpdate(advantages=advantages)
