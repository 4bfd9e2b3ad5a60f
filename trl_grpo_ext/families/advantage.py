"""Advantage estimators (``advantage_estimator``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from ..api import Out
from ..core.advantages import StdKind, group_relative_advantages
from ..core.pkpo import Estimator, annealed_k, pass_at_k_weights
from ..names import config_error, pkpo_start_k
from .base import GenerationBatch
from .interfaces import ADVANTAGE_ESTIMATORS, AdvantageEstimatorBase, AdvantageUpdate


@ADVANTAGE_ESTIMATORS.register("grpo")
class OutcomeAdvantage(AdvantageEstimatorBase):
    """TRL's group-normalised outcome advantage; recomputed only for ``advantage_std="population"``.

    With ``advantage_std="sample"`` TRL's own advantages are kept untouched (bit-for-bit parity with GRPOTrainer).
    """

    @dataclass(frozen=True)
    class Args(AdvantageEstimatorBase.Args):  # the config fields it reads
        advantage_std: StdKind

    args: Args

    docs = "outcome_advantages.md"
    gives_group_advantages = True

    def on_generation(self, batch: GenerationBatch) -> AdvantageUpdate | None:
        if self.args.advantage_std == "sample":
            return None
        return AdvantageUpdate(advantages=self.group_advantages(batch.rewards, batch.group_size))

    def group_advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        args, scale = self.args, self.host.scale_rewards
        return group_relative_advantages(rewards, group_size, std=args.advantage_std, scale=scale)


@ADVANTAGE_ESTIMATORS.register("pass_at_k")
class PassAtKAdvantage(AdvantageEstimatorBase):
    """PKPO (Walder & Karkhanis 2025, arXiv 2505.15201): each training sample's advantage is ``(n / k) * w_i``, where
    ``w_i`` are PKPO's weights (:func:`~trl_grpo_ext.core.pkpo.pass_at_k_weights`, ``pkpo_estimator``) on the
    group's rewards: their policy gradient is an unbiased estimate of the gradient of pass@k (best reward of k samples
    for continuous rewards). The ``n / k`` makes k = 1 the reward minus the mean of the group's other rewards (RLOO,
    with ``loo_minus_one``; the reward itself with ``s``). k follows ``pkpo_anneal_fraction``.
    Rewards are gathered, so a group spanning processes is weighted whole; evaluation batches keep TRL's advantages.
    Logs ``pkpo/k`` and ``pkpo/adv_abs_mean``."""

    @dataclass(frozen=True)
    class Args(AdvantageEstimatorBase.Args):  # the config fields it reads
        pkpo_k: int | None
        pkpo_anneal_fraction: float
        pkpo_estimator: Estimator
        num_generations: int | None

    args: Args

    metrics = ("pkpo/k", "pkpo/adv_abs_mean")
    example_config = {"pkpo_k": 2}
    docs = "pass_at_k.md"
    gives_group_advantages = True

    @classmethod
    def check_combination(cls, args, members) -> None:
        if not 1 <= pkpo_start_k(args.pkpo_k, args.num_generations) <= args.num_generations:
            raise config_error(
                "pkpo_k",
                args.pkpo_k,
                f"pass@k needs 1 <= k <= num_generations ({args.num_generations}): k of the n samples of a prompt",
                f"e.g. pkpo_k={min(4, args.num_generations)}, or raise num_generations",
            )

    @classmethod
    def never_negative_advantages(cls, args) -> bool:
        """s^(loo-1) at k >= 2 is a mean of max(g_i, max_T) - max_T >= 0; at k = 1 (a schedule that reaches it) the
        leave-one-out baseline makes below-average samples negative, and ``s`` follows the rewards' sign."""
        k = pkpo_start_k(args.pkpo_k, args.num_generations)
        return args.pkpo_estimator == "loo_minus_one" and k >= 2 and args.pkpo_anneal_fraction == 0.0

    def on_generation(self, batch: GenerationBatch) -> Out[AdvantageUpdate | None]:
        if batch.mode != "train":
            return None
        advantages = self.group_advantages(batch.rewards, batch.group_size)
        metrics = {"pkpo/k": self._k(batch.group_size), "pkpo/adv_abs_mean": float(advantages.abs().mean())}
        return AdvantageUpdate(advantages=advantages), metrics

    def _k(self, group_size: int) -> int:
        args = self.args
        progress = self.host.global_step / max(self.host.max_steps, 1)
        k = pkpo_start_k(args.pkpo_k, cast(int, args.num_generations))  # set by GRPOConfig.__post_init__
        return annealed_k(min(k, group_size), progress=progress, anneal_fraction=args.pkpo_anneal_fraction)

    def group_advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        k = self._k(group_size)
        weights = pass_at_k_weights(rewards, group_size, k, estimator=self.args.pkpo_estimator)  # (n,)
        return (weights * (group_size / k)).to(rewards.dtype)
