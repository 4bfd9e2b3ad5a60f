"""Advantage estimators (``advantage_estimator``)."""

from __future__ import annotations

from ..core.advantages import group_relative_advantages
from ..core.pkpo import annealed_k, pass_at_k_weights
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


@ADVANTAGE_ESTIMATORS.register("pass_at_k")
class PassAtKAdvantage(Extension):
    """PKPO (Walder & Karkhanis 2025, arXiv 2505.15201): each training sample's advantage is ``(n / k) * w_i``, where
    ``w_i`` are PKPO's weights (:func:`~trl_grpo_ext.core.pkpo.pass_at_k_weights`, ``pkpo_estimator``) on the
    group's rewards: their policy gradient is an unbiased estimate of the gradient of pass@k (best reward of k samples
    for continuous rewards). The ``n / k`` makes k = 1 the reward itself. k follows ``pkpo_anneal_fraction``.
    Rewards are gathered, so a group spanning processes is weighted whole; evaluation batches keep TRL's advantages.
    Logs ``pkpo/k`` and ``pkpo/adv_abs_mean``."""

    metrics = ("pkpo/k", "pkpo/adv_abs_mean")
    example_config = {"pkpo_k": 2}
    docs = "pass_at_k.md"

    def on_generation(self, batch: GenerationBatch) -> GenerationUpdate | None:
        if batch.mode != "train":
            return None
        args, host = self.args, self.host
        progress = host.global_step / max(host.max_steps, 1)
        k = annealed_k(min(args.pkpo_k, batch.group_size), progress=progress, anneal_fraction=args.pkpo_anneal_fraction)
        weights = pass_at_k_weights(batch.rewards, batch.group_size, k, estimator=args.pkpo_estimator)
        advantages = (weights * (batch.group_size / k)).to(batch.rewards.dtype)
        self.log_metric("train", "pkpo/k", k)
        self.log_metric("train", "pkpo/adv_abs_mean", float(advantages.abs().mean()))
        return GenerationUpdate(advantages=advantages)
