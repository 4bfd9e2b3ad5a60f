"""Observers: members that watch training without changing it (the collapse monitor, pass@k at evaluation).

They are extensions like the families' members (same hooks, same :class:`~.base.Host`), switched on by their own
config fields instead of one switch: ``enabled(args)`` says whether a run builds them.
"""

from __future__ import annotations

from typing import Any

from ..callbacks import CollapseMonitor
from ..core.registry import Registry
from .base import Extension, GenerationBatch, LossContext

OBSERVERS: Registry[type[Extension]] = Registry("observer")


@OBSERVERS.register("collapse_monitor")
class CollapseObserver(Extension):
    """Feeds :class:`~trl_grpo_ext.callbacks.CollapseMonitor` (``diversity_metrics``, ``collapse_*``) from the hooks:
    every generation batch's completion ids (all processes) and every training loss pass's entropies."""

    docs = "monitoring.md"

    @staticmethod
    def enabled(args) -> bool:
        return bool(args.diversity_metrics)

    def __init__(self, host):
        super().__init__(host)
        args = self.args
        self.monitor = CollapseMonitor(
            host,
            metrics=args.diversity_metrics,
            ngram_sizes=args.diversity_ngram_sizes,
            repetition_n=args.diversity_repetition_n,
            low_entropy_threshold=args.diversity_low_entropy_threshold,
            alarm_entropy_min=args.collapse_entropy_min,
            alarm_distinct2_drop=args.collapse_distinct2_drop,
            alarm_repetition_max=args.collapse_repetition_max,
            alarm_action=args.collapse_action,
        )
        host.add_callback(self.monitor)  # logs at step ends and acts on the alarm (save / stop)

    def on_generation(self, batch: GenerationBatch) -> None:
        ids, mask = batch.global_completions()
        self.monitor.observe_generation(ids, mask, batch.group_size, batch.mode)

    def after_loss(self, ctx: LossContext) -> None:
        if ctx.mode == "train" and ctx.entropies is not None:
            self.monitor.record_entropy(ctx.entropies.detach()[ctx.inputs["completion_mask"].bool()])

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.monitor.load_state_dict(state)
