"""The hook interface of a family member and the contexts the trainer hands to the hooks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..core.registry import Registry
from ..core.sample_filter import SAMPLE_FILTER_STRATEGIES
from ..trl_compat import PER_SEQUENCE_LOSS_TYPES, aggregate_like_loss_type, per_token_kl

if TYPE_CHECKING:
    from ..trainer import GRPOExtTrainer


@dataclass
class GenerationBatch:
    """One scored generation batch, before TRL shuffles and splits it.

    Attributes:
        output: TRL's local output dict (``advantages`` (B,), ``completion_mask`` (B, T), ...); hooks edit it in place.
        rewards_per_func: (N, F) rewards of all processes (N = B x processes), NaN for None.
        rewards: (N,) weighted sum as TRL computes it, NaN where unscorable.
        group_size: completions per prompt.
        process_slice: this process's rows in the N global rows.
        mode: "train" or "eval".
        keep: (N,) bool rows that train, set by the sample filter (None: all).
        inputs, prompts, completions, completion_ids_list: this process's rows as TRL passed them to the reward
            functions.
        rank_scores: (N,) what a sample filter ranks rows by: the weighted reward sum, or under
            ``multi_objective_aggregation="normalize_then_sum"`` TRL's advantage (NaN where unscorable).
        gather_padded: gathers a (B, T) tensor of every process, padded to the longest T (identity on one process).
    """

    output: dict[str, Any]
    rewards_per_func: torch.Tensor
    rewards: torch.Tensor
    group_size: int
    process_slice: slice
    mode: str
    keep: torch.Tensor | None = None
    inputs: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[Any] = field(default_factory=list)
    completions: list[Any] = field(default_factory=list)
    completion_ids_list: list[list[int]] = field(default_factory=list)
    rank_scores: torch.Tensor | None = None
    gather_padded: Callable[[torch.Tensor], torch.Tensor] | None = None
    _global_completions: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    def global_completions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, T') completion ids and completion mask of all processes, gathered once per batch (a collective on
        first use: call it on every process)."""
        if self._global_completions is None:
            ids, mask = self.output["completion_ids"], self.output["completion_mask"]
            if self.gather_padded is not None:
                ids, mask = self.gather_padded(ids), self.gather_padded(mask)
            self._global_completions = (ids, mask)
        return self._global_completions


@dataclass
class LossContext:
    """One micro-batch inside ``_compute_loss``.

    Attributes:
        inputs: the micro-batch TRL's loss reads (advantages possibly rescaled by the sample filter).
        mask: (B, T) loss mask (completion mask x tool/filter mask).
        mode: "train" or "eval".
        row_scale: factor the sample filter applies to per-sequence aggregations (1.0 otherwise).
        logps: (B, T) the policy's log-probs with gradient, as the model returned them (set by the trainer).
        selected: (B, T) bool, tokens chosen by the token clip, if any.
        entropies: (B, T) per-token entropies of the same forward pass (no gradient needed).
        policy_weight: (B, T) the factor TRL 1.16 multiplies into its per-token policy loss (not the KL term): the
            ``top_entropy_quantile`` mask x the ``off_policy_mask_threshold`` sequence mask x vLLM's importance-sampling
            ratio, each where configured; None when none is (set by the trainer with ``logps``). Terms that act like the
            policy loss (the KL-Cov penalty) are multiplied by it, and token clips choose among ``policy_mask``.
    """

    inputs: dict[str, Any]
    mask: torch.Tensor
    mode: str
    row_scale: float = 1.0
    logps: torch.Tensor | None = None
    selected: torch.Tensor | None = None
    entropies: torch.Tensor | None = None
    policy_weight: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def policy_mask(self) -> torch.Tensor:
        """(B, T) bool: the tokens whose policy loss TRL keeps (loss, entropy and off-policy masks, IS ratio > 0)."""
        mask = self.mask.bool()
        return mask if self.policy_weight is None else mask & (self.policy_weight > 0)

    def weighted(self, per_token: torch.Tensor) -> torch.Tensor:
        """(B, T) ``per_token`` multiplied by :attr:`policy_weight` (unchanged when TRL applies no such factor)."""
        return per_token if self.policy_weight is None else per_token * self.policy_weight

    @property
    def old_logps(self) -> torch.Tensor:
        """TRL's old log-probs, or the detached current ones when TRL skipped them (on-policy)."""
        old = self.inputs.get("old_per_token_logps")
        return self.logps.detach() if old is None else old

    @property
    def advantages(self) -> torch.Tensor:
        """(B, T) advantages as the loss sees them."""
        adv = self.inputs["advantages"]
        return (adv.unsqueeze(1) if adv.dim() == 1 else adv).expand_as(self.mask)


class Extension:
    """Base class of a family member; every hook is a no-op.

    Hooks, in the order the trainer calls them:
        ``on_generation(batch)``: after TRL scored a generation batch (edit ``batch.output``).
        ``modify_logps(logps, ctx)``: inside the loss, on the log-probs TRL's loss is about to use.
        ``extra_loss(ctx)``: a term added to TRL's loss (aggregate it with :meth:`aggregate`).
        ``after_loss(ctx)``: after the loss of a micro-batch (accumulate statistics, act at optimizer-step ends).
        ``state_dict()`` / ``load_state_dict(state)``: saved in and restored from checkpoints.
    """

    def __init__(self, trainer: GRPOExtTrainer):
        self.trainer = trainer
        self.args = trainer.args

    def on_generation(self, batch: GenerationBatch) -> None:
        pass

    def modify_logps(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor:
        return logps

    def extra_loss(self, ctx: LossContext) -> torch.Tensor | None:
        return None

    def after_loss(self, ctx: LossContext) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    # Helpers shared by the members
    def trl_kl(self, ctx: LossContext) -> torch.Tensor:
        """(B, T) the KL term exactly as TRL's loss computes it for this micro-batch (differentiable)."""
        return per_token_kl(
            ctx.logps,
            ctx.inputs["ref_per_token_logps"],
            old_logps=ctx.old_logps,
            bias_correction=self.args.use_bias_correction_kl,
        )

    def log_metric(self, mode: str, name: str, value: float) -> None:
        self.trainer._metrics[mode][name].append(float(value))

    def aggregate(self, per_token: torch.Tensor, ctx: LossContext, *, scale_rows: bool = True) -> torch.Tensor:
        """Aggregate a (B, T) term exactly like the configured ``loss_type`` (see :mod:`trl_grpo_ext.trl_compat`).

        ``scale_rows``: apply the sample filter's per-sequence rescale (``ctx.row_scale``), as for any term that
        should average over the kept rows only; pass False for a term that mirrors TRL's own (unscaled) loss.
        """
        trainer = self.trainer
        value = aggregate_like_loss_type(
            per_token,
            ctx.mask,
            loss_type=trainer.loss_type,
            training=ctx.mode == "train",
            gradient_accumulation_steps=trainer.current_gradient_accumulation_steps,
            steps_per_generation=self.args.steps_per_generation,
            num_processes=trainer.accelerator.num_processes,
            max_completion_length=trainer.max_completion_length,
            num_items_in_batch=ctx.inputs.get("num_items_in_batch"),
        )
        if scale_rows and trainer.loss_type in PER_SEQUENCE_LOSS_TYPES:
            value = value * ctx.row_scale
        return value


ADVANTAGE_ESTIMATORS: Registry[type[Extension]] = Registry("advantage_estimator")
TOKEN_CLIPS: Registry[type[Extension] | None] = Registry("token_clip")
KL_CONTROLLERS: Registry[type[Extension] | None] = Registry("kl_control")
ENTROPY_CONTROLS: Registry[type[Extension] | None] = Registry("entropy_control")


class _WithNone:
    """The sample-filter names: ``"none"`` plus the core strategies (register strategies in the core registry)."""

    family = "sample_filter"

    def __contains__(self, name: object) -> bool:
        return name == "none" or name in SAMPLE_FILTER_STRATEGIES

    def names(self) -> list[str]:
        return ["none", *SAMPLE_FILTER_STRATEGIES.names()]


def registry_for(switch: str):
    """The registry behind a config switch (``advantage_estimator``, ``token_clip``, ``sample_filter``, ...)."""
    registries = {
        "advantage_estimator": ADVANTAGE_ESTIMATORS,
        "token_clip": TOKEN_CLIPS,
        "kl_control": KL_CONTROLLERS,
        "entropy_control": ENTROPY_CONTROLS,
        "sample_filter": _WithNone(),
    }
    return registries[switch]
