"""The :class:`~trl_grpo_ext.families.base.Host` of a ``GRPOExtTrainer`` and the services a member may name
(``families.base.SERVICES``): what the family members use of TRL, in the adapter with the rest of the plugin's TRL
surface. Each service is an object of its own over the trainer, so a member holds only what it named.

TRL 1.16 private surface used here: ``_metrics``, ``_logs``, ``_step``, ``_tokenizer``, ``_dist``, and the attributes
``beta``, ``loss_type``, ``epsilon_low`` / ``epsilon_high``, ``scale_rewards``, ``reward_weights``, ``reward_funcs``,
``environments``, ``top_entropy_quantile``, ``eos_token_ids``, ``max_completion_length``,
``current_gradient_accumulation_steps`` (pinned by ``tests/test_trl_contract.py``). Generation, scoring and forwards
outside TRL's batch are the :class:`~trl_grpo_ext.adapter.rollouts.RolloutService`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import gather_object

from . import compat as trl_compat
from .compat import aggregate_like_loss_type, prepare_scoring_model, reward_kwargs


class _OfTrainer:
    def __init__(self, trainer):  # a GRPOExtTrainer (the adapter imports nothing of the plugin's trainer)
        self._trainer = trainer


class TrainerHost(_OfTrainer):
    """The :class:`~trl_grpo_ext.families.base.Host` of a ``GRPOExtTrainer``: the run's state and settings,
    collectives, seeded generators, loss aggregation."""

    collectives: Any  #: the trainer's ``AccelerateCollectives``

    def __init__(self, trainer):
        super().__init__(trainer)
        self.collectives = trainer.ext_collectives

    @property
    def beta(self) -> float:
        return self._trainer.beta

    @property
    def loss_type(self) -> str:
        return self._trainer.loss_type

    @property
    def device(self):
        return self._trainer.accelerator.device

    @property
    def num_processes(self) -> int:
        return self._trainer.accelerator.num_processes

    @property
    def global_step(self) -> int:
        return self._trainer.state.global_step

    @property
    def reward_func_names(self) -> list[str]:
        """TRL's name of each reward function, in ``reward_funcs`` order (the keys of ``rewards/<name>/mean``)."""
        return list(self._trainer.reward_func_names)

    @property
    def reward_weights(self) -> list[float]:
        """TRL's weight of each reward function (``reward_weights``; 1.0 each by default)."""
        return self._trainer.reward_weights.tolist()

    @property
    def max_steps(self) -> int:
        """The optimizer steps of this training run (0 before it starts)."""
        return self._trainer.state.max_steps

    @property
    def micro_step(self) -> int:
        return self._trainer._step

    @property
    def accumulation_steps(self) -> int:
        return self._trainer.ext_accumulation_steps()

    @property
    def step_end(self) -> bool:
        return self._trainer.accelerator.sync_gradients

    @property
    def tokenizer(self):
        return self._trainer._tokenizer

    @property
    def scale_rewards(self) -> str:
        return self._trainer.scale_rewards

    @property
    def top_entropy_quantile(self) -> float:
        return self._trainer.top_entropy_quantile

    @property
    def ratio_clip(self) -> tuple[float, float]:
        return self._trainer.epsilon_low, self._trainer.epsilon_high

    def generator(self, tag: str, *, per_rank: bool, device) -> torch.Generator:
        return self._trainer.ext_generator(tag, per_rank=per_rank, device=device)

    def aggregate(self, per_token, mask, *, mode: str, num_items_in_batch) -> torch.Tensor:
        trainer = self._trainer
        return aggregate_like_loss_type(
            per_token,
            mask,
            loss_type=trainer.loss_type,
            training=mode == "train",
            gradient_accumulation_steps=trainer.ext_accumulation_steps(),
            steps_per_generation=trainer.args.steps_per_generation,
            num_processes=trainer.accelerator.num_processes,
            max_completion_length=trainer.max_completion_length,
            num_items_in_batch=num_items_in_batch,
        )

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._trainer.accelerator.gather(tensor)

    def gather_object(self, obj: list) -> list:
        return gather_object(obj)


# ---------------------------------------------------------------------------------------------------- services
class BetaService(_OfTrainer):
    """``beta_control``: sets TRL's live beta after ``check`` (the receiver's, naming the member)."""

    def __init__(self, trainer, check: Callable[[float], float]):
        super().__init__(trainer)
        self._check = check

    def set_beta(self, value: float) -> None:
        self._trainer.beta = self._check(value)


class RatioClipService(_OfTrainer):
    """``ratio_clip``."""

    def drop_ratio_clip(self) -> None:
        self._trainer.epsilon_low = math.inf
        self._trainer.epsilon_high = math.inf


class ScoringService(_OfTrainer):
    """``scoring``: step reward functions, scoring models placed like TRL's reward models, TRL's reward kwargs."""

    @property
    def step_reward_funcs(self) -> list:
        return self._trainer.step_reward_funcs

    def prepare_scoring_model(self, model):
        """A frozen scoring model placed like TRL's reward models for the engine in use (DeepSpeed, FSDP, DDP)."""
        trainer = self._trainer
        return prepare_scoring_model(model, trainer.accelerator, deepspeed=trainer.is_deepspeed_enabled)

    def reward_kwargs(self, inputs, completion_ids) -> dict[str, Any]:
        """As TRL 1.16's ``_calculate_rewards`` builds them (``compat.reward_kwargs``), plus ``completion_ids``."""
        return {**reward_kwargs(self._trainer, inputs), "completion_ids": completion_ids}


class CallbackService(_OfTrainer):
    """``callbacks``."""

    def add_callback(self, callback) -> None:
        self._trainer.add_callback(callback)


class ReferenceService(_OfTrainer):
    """``reference``: TRL's reference model and the optimizer's moments."""

    def prepare_reference(self) -> bool:
        return trl_compat.prepare_reference(self._trainer)

    def reset_reference(self) -> bool:
        return trl_compat.reset_reference(self._trainer)

    def reset_optimizer_moments(self) -> int:
        return trl_compat.reset_optimizer_moments(self._trainer.optimizer)


class EvaluationService(_OfTrainer):
    """``evaluation``: greedy decodes and rule-based scores outside TRL's batch."""

    @torch.no_grad()
    def greedy_completions(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, prompts: list) -> list:
        """One greedy decode per (left-padded) prompt with the policy, decoded like TRL's completions (messages for
        conversational prompts). The policy is prepared as TRL 1.16's ``_generate`` prepares it for transformers'
        ``generate`` (ZeRO-3 parameters gathered under ``ds3_gather_for_generation``, FSDP1 parameters summoned):
        a collective under sharded engines, so every process calls it."""
        from trl.models import unwrap_model_for_generation

        trainer = self._trainer
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
            ) as model,
            trainer._dist.summon_full_params(trainer.model_wrapped, recurse=False),
        ):
            generated = model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                do_sample=False,
                max_new_tokens=trainer.max_completion_length,
                pad_token_id=trainer._tokenizer.pad_token_id,
                eos_token_id=trainer.eos_token_ids,
            )
        texts = trainer._tokenizer.batch_decode(generated[:, prompt_ids.size(1) :], skip_special_tokens=True)
        if prompts and isinstance(prompts[0], list):  # conversational
            return [[{"role": "assistant", "content": text}] for text in texts]
        return texts

    def score_rule_based(self, inputs: list[dict], prompts: list, completions: list) -> torch.Tensor:
        """(n,) weighted sum of the Python reward functions on this process's rows (model-based ones are skipped);
        NaN where every function returned None."""
        trainer = self._trainer
        kwargs = reward_kwargs(trainer, inputs)
        # Not TRL's batch: nothing may reach its completions table or metrics, and its environments are not these.
        kwargs.update(log_extra=lambda *args, **kw: None, log_metric=lambda *args, **kw: None, completion_ids=None)
        kwargs.pop("environments", None)
        total = torch.zeros(len(prompts), device=trainer.accelerator.device)
        for weight, func in zip(trainer.reward_weights.tolist(), trainer.reward_funcs, strict=True):
            if isinstance(func, torch.nn.Module):
                continue
            scores = func(prompts=prompts, completions=completions, **kwargs)
            total += weight * torch.tensor([float("nan") if s is None else s for s in scores], device=total.device)
        return total


class MonitorSource(TrainerHost):
    """``monitor_source``: what the collapse monitor (``trl_grpo_ext.callbacks.CollapseMonitor``) reads and does in a
    ``GRPOExtTrainer`` beyond the host (the plain-TRL one is ``adapter.plain.PlainTRLSource``): the run's arguments,
    TRL's completions table and logged metrics, and the checkpoints of a rollback. The trainer's hooks feed it."""

    #: The collapse monitor built on this source is fed by the hooks (observe_generation, record_entropy).
    feeds_collapse_monitor = True

    def __init__(self, trainer):
        super().__init__(trainer)
        self.clock = trainer.ext_clock  # the monitor's work outside the hooks counts as plugin time (timing/ext_s)

    @property
    def args(self):
        return self._trainer.args

    def log(self, mode: str, name: str, value: float) -> None:
        """Buffer a metric in TRL's metrics of ``mode`` (the monitor's own keys, ``monitor_metric_keys``)."""
        trl_compat.log_value(self._trainer, mode, name, value)

    def log_column(self, name: str, values: list) -> None:
        """Extend a column of TRL's completions table (one value per row of the last batch)."""
        self._trainer._logs["extra"][name].extend(values)

    def metric_values(self, mode: str, name: str) -> list:
        return trl_compat.metric_values(self._trainer, mode, name)

    def save_checkpoint(self) -> None:
        trl_compat.save_checkpoint(self._trainer)

    def restore_checkpoint(self, folder: str) -> None:
        trl_compat.restore_checkpoint(self._trainer, folder)

    def discard_buffered_rollouts(self) -> None:
        trl_compat.discard_buffered_rollouts(self._trainer)
