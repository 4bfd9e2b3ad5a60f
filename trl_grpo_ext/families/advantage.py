"""Advantage estimators (``advantage_estimator``)."""

from __future__ import annotations

from ..core.advantages import group_relative_advantages
from .base import ADVANTAGE_ESTIMATORS, Extension, GenerationBatch


def replace_advantages(extension: Extension, batch: GenerationBatch, global_advantages) -> None:
    """Put new (N, ...) global advantages into the batch: this process's slice into the output, all into the logs."""
    batch.output["advantages"] = global_advantages[batch.process_slice]
    # Token-level advantages are logged by their first-token value (the completion's whole return).
    per_row = global_advantages if global_advantages.dim() == 1 else global_advantages[:, 0]
    extension.host.log_advantages(per_row)


@ADVANTAGE_ESTIMATORS.register("grpo")
class OutcomeAdvantage(Extension):
    """TRL's group-normalised outcome advantage; recomputed only for ``advantage_std="population"``.

    With ``advantage_std="sample"`` TRL's own advantages are kept untouched (bit-for-bit parity with GRPOTrainer).
    """

    docs = "outcome_advantages.md"

    def on_generation(self, batch: GenerationBatch) -> None:
        if self.args.advantage_std == "sample":
            return
        advantages = group_relative_advantages(
            batch.rewards, batch.group_size, std=self.args.advantage_std, scale=self.host.scale_rewards
        )
        replace_advantages(self, batch, advantages)
