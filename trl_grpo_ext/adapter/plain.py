"""The collapse monitor's source on a plain ``trl.GRPOTrainer``: what it reads from TRL's private buffers (the metrics
TRL buffers between logs, the completions table), in the adapter with the rest of the plugin's TRL surface."""

from __future__ import annotations

import torch

from . import compat as trl_compat


def _text(completion) -> str:
    if isinstance(completion, list):
        return completion[-1]["content"] if completion else ""
    return completion


def _fingerprint(completions) -> tuple | None:
    """What tells one state of TRL's completions table from another (None while it is empty)."""
    return (len(completions), id(completions[0]), id(completions[-1])) if completions else None


class PlainTRLSource:
    """The collapse monitor's adapter to a plain ``trl.GRPOTrainer`` (its plain-TRL mode): the few members of the
    Host the monitor uses (``args``, ``global_step``, ``log``, ``log_column``, ``metric_values``, and for a rollback
    ``save_checkpoint`` / ``restore_checkpoint``), plus what it pulls there because no hook feeds it: the training
    completions TRL keeps for its table (re-tokenised) and, through ``metric_values``, the mean token entropy TRL
    logs for each loss pass. Nothing on the trainer is replaced, so without every token's entropy the plain-TRL mode
    logs ``entropy/mean`` (TRL's values of the step, averaged) but no percentiles and no low fraction
    (``GRPOExtTrainer`` feeds the monitor every token's entropy)."""

    feeds_collapse_monitor = False
    clock = None  # plain TRL keeps no plugin-time clock

    def __init__(self, trainer):
        self.trainer = trainer
        self.args = trainer.args
        self._fingerprint = None

    @property
    def global_step(self) -> int:
        return self.trainer.state.global_step

    def log(self, mode: str, name: str, value: float) -> None:
        trl_compat.log_value(self.trainer, mode, name, value)

    def log_column(self, name: str, values: list) -> None:
        self.trainer._logs["extra"][name].extend(values)

    def metric_values(self, mode: str, name: str) -> list:
        return trl_compat.metric_values(self.trainer, mode, name)

    @property
    def reward_func_names(self) -> list[str]:
        return list(self.trainer.reward_func_names)

    @property
    def reward_weights(self) -> list[float]:
        return self.trainer.reward_weights.tolist()

    def reward_batch(self):
        """(N, F) float64 rewards of the newest rows of TRL's completions table, every reward function's column in
        ``reward_func_names`` order (NaN where one returned None): the batch :meth:`completion_batch` last returned.
        None when a column is missing or their lengths differ."""
        columns = self.trainer._logs["rewards"]
        values = [list(columns.get(name, ())) for name in self.reward_func_names]
        rows = len(self.trainer._logs["completion"])
        if not values or any(len(v) != rows for v in values):
            return None
        return torch.tensor(values, dtype=torch.float64).T.contiguous()

    def save_checkpoint(self) -> None:
        trl_compat.save_checkpoint(self.trainer)

    def restore_checkpoint(self, folder: str) -> None:
        trl_compat.restore_checkpoint(self.trainer, folder)

    def discard_buffered_rollouts(self) -> None:
        trl_compat.discard_buffered_rollouts(self.trainer)

    def completion_batch(self):
        """(ids, mask, group size) of the newest training completions of TRL's table, re-tokenised; None when there
        are none new (a step that reuses its generation batch, or an evaluation's completions)."""
        completions = list(self.trainer._logs["completion"])
        fingerprint = _fingerprint(completions)
        if fingerprint is None or fingerprint == self._fingerprint:
            return None
        self._fingerprint = fingerprint
        tokenizer = getattr(self.trainer.processing_class, "tokenizer", self.trainer.processing_class)
        enc = tokenizer([_text(c) for c in completions], add_special_tokens=False, padding=True, return_tensors="pt")
        return enc["input_ids"], enc["attention_mask"], self.trainer.num_generations

    def mark_completions_seen(self) -> None:
        """An evaluation just filled TRL's table: its completions are not training data."""
        self._fingerprint = _fingerprint(self.trainer._logs["completion"]) or self._fingerprint
