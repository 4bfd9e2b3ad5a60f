"""Observers: members that watch training without changing it (the collapse monitor, pass@k at evaluation).

They are extensions like the families' members (same hooks, same :class:`~.base.Host`, services by name), switched
on by their own config fields instead of one switch: ``enabled(args)`` says whether a run builds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..api import Out
from ..callbacks import CollapseMonitor, monitor_metric_keys
from ..core.diversity import pass_at_k
from ..detector import detector_from_config
from .base import Callbacks, Evaluation, GenerationBatch, Host, LossContext, MonitorSource
from .interfaces import OBSERVERS, ObserverBase


@OBSERVERS.register("collapse_monitor")
class CollapseObserver(ObserverBase):
    """Feeds :class:`~trl_grpo_ext.callbacks.CollapseMonitor` (``diversity_metrics``, ``collapse_*``) from the hooks:
    every generation batch's completion ids (all processes) and every training loss pass's entropies."""

    @dataclass(frozen=True)
    class Args(ObserverBase.Args):  # the config fields it reads
        diversity_metrics: list[str]
        diversity_ngram_sizes: list[int]
        diversity_repetition_n: int
        diversity_low_entropy_threshold: float
        diversity_every: int
        collapse_entropy_min: float | None
        collapse_distinct2_drop: float | None
        collapse_repetition_max: float | None
        collapse_entropy_max: float | None
        collapse_entropy_rise: float | None
        collapse_detector: str
        collapse_detector_window: int
        collapse_detector_warmup: int
        collapse_onset_fraction: float
        collapse_length_rise: float | None
        collapse_prompt_info_drop: float | None
        collapse_repetition_rise: float | None
        collapse_length_info_gate: float | None
        collapse_audit_rewards: list[str]
        collapse_audit_threshold: float
        collapse_audit_rise: float | None
        collapse_validation_metric: str | None
        collapse_validation_drop: float
        collapse_validation_z: float
        collapse_shape_acts: bool
        collapse_rollback_then: str
        collapse_action: str
        log_completions: bool
        save_strategy: str
        save_total_limit: int | None

    args: Args

    docs = "monitoring.md"
    #: Every key the monitor can log; an instance holds those its run logs (``diversity_metrics``,
    #: ``diversity_ngram_sizes``).
    metrics = monitor_metric_keys()

    @staticmethod
    def enabled(args) -> bool:
        return bool(args.diversity_metrics)

    def __init__(self, args: Args, host: Host, *, monitor_source: MonitorSource, callbacks: Callbacks):
        super().__init__(args, host)
        # this run's keys, of every key the class declares (the trainer reads an instance's)
        self.metrics = monitor_metric_keys(  # type: ignore[misc]
            args.diversity_metrics,
            args.diversity_ngram_sizes,
            detector=args.collapse_detector != "none",
            audits=bool(args.collapse_audit_rewards),
        )
        self.monitor = CollapseMonitor(
            monitor_source,
            metrics=args.diversity_metrics,
            ngram_sizes=args.diversity_ngram_sizes,
            repetition_n=args.diversity_repetition_n,
            low_entropy_threshold=args.diversity_low_entropy_threshold,
            alarm_entropy_min=args.collapse_entropy_min,
            alarm_distinct2_drop=args.collapse_distinct2_drop,
            alarm_repetition_max=args.collapse_repetition_max,
            alarm_entropy_max=args.collapse_entropy_max,
            alarm_entropy_rise=args.collapse_entropy_rise,
            alarm_action=args.collapse_action,
            detector=detector_from_config(args),
            every=args.diversity_every,
            audit_rewards=args.collapse_audit_rewards,
            audit_threshold=args.collapse_audit_threshold,
            validation_metric=args.collapse_validation_metric,
            shape_acts=args.collapse_shape_acts,
            rollback_then=args.collapse_rollback_then,
        )
        callbacks.add_callback(self.monitor)  # logs at step ends and acts on the alarm (save / stop)

    def on_generation(self, batch: GenerationBatch) -> None:
        ids, mask = batch.global_completions()
        self.monitor.observe_generation(ids, mask, batch.group_size, batch.mode)
        self.monitor.observe_rewards(batch.rewards, batch.rewards_per_func, batch.group_size, batch.mode)

    def after_loss(self, ctx: LossContext) -> None:
        if ctx.mode == "train" and ctx.entropies is not None:
            self.monitor.record_entropy(ctx.entropies.detach()[ctx.inputs["completion_mask"].bool()])

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.monitor.load_state_dict(state)


@OBSERVERS.register("pass_at_k")
class PassAtK(ObserverBase):
    """``eval_pass_at_k``: unbiased pass@k (Chen et al. 2021) from each evaluation batch's sampled completions, and
    with ``eval_pass_greedy`` the accuracy of one greedy decode per prompt (``pass@k/greedy``)."""

    @dataclass(frozen=True)
    class Args(ObserverBase.Args):  # the config fields it reads
        eval_pass_at_k: list[int]
        eval_pass_threshold: float
        eval_pass_greedy: bool

    args: Args

    docs = "monitoring.md"
    #: Evaluation keys (``eval_`` prefixed in the logs): one ``pass@k/sampled_{k}`` per ``eval_pass_at_k``, and the
    #: greedy accuracy with ``eval_pass_greedy``.
    metrics = ("pass@k/sampled_{k}", "pass@k/greedy")

    @staticmethod
    def enabled(args) -> bool:
        return bool(args.eval_pass_at_k)

    def __init__(self, args: Args, host: Host, *, evaluation: Evaluation):
        super().__init__(args, host)
        self.evaluation = evaluation

    def on_generation(self, batch: GenerationBatch) -> Out[None]:
        if batch.mode != "eval":
            return None
        args = self.args
        correct = (torch.nan_to_num(batch.rewards, nan=float("-inf")) >= args.eval_pass_threshold).view(
            -1, batch.group_size
        )  # (P, G)
        n, counts = batch.group_size, correct.sum(1).tolist()
        metrics = {
            f"pass@k/sampled_{k}": sum(pass_at_k(n, int(c), int(k)) for c in counts) / max(len(counts), 1)
            for k in args.eval_pass_at_k
        }
        if args.eval_pass_greedy:
            metrics["pass@k/greedy"] = self._greedy_accuracy(batch)
        return None, metrics

    def _greedy_accuracy(self, batch: GenerationBatch) -> float:
        host, out = self.host, batch.output
        # one row per prompt: the first of each group (groups may span processes)
        rows = [i for i in range(out["prompt_ids"].size(0)) if (batch.process_slice.start + i) % batch.group_size == 0]
        # Every process decodes (a collective under FSDP / ZeRO-3), one with no group start on its first row, unscored.
        decode = rows or [0]
        prompts = [batch.prompts[i] for i in decode]
        completions = self.evaluation.greedy_completions(out["prompt_ids"][decode], out["prompt_mask"][decode], prompts)
        local_correct = torch.zeros(0, device=host.device)
        if rows:
            total = self.evaluation.score_rule_based([batch.inputs[i] for i in rows], prompts, completions)
            local_correct = (torch.nan_to_num(total, nan=float("-inf")) >= self.args.eval_pass_threshold).float()
        stats = torch.stack([local_correct.sum(), torch.tensor(float(len(rows)), device=host.device)])
        stats = host.collectives.all_sum(stats)
        return float(stats[0] / stats[1].clamp(min=1.0))
