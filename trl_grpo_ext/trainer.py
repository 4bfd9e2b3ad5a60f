"""``GRPOExtTrainer``: TRL's ``GRPOTrainer`` composing the anti-collapse families through six small overrides.

Overridden TRL 1.16 methods (and why):
    ``__init__``: check the config, build one extension per family, name failing reward functions in their errors.
    ``_calculate_rewards``: keep the gathered (N, F) rewards for group-level extensions; refuse infinite rewards.
    ``_generate_and_score_completions``: run ``on_generation`` hooks (advantages, sample filter) before TRL shuffles.
    ``_compute_loss``: open a loss context, rescale filtered micro-batches, add extension loss terms.
    ``_get_per_token_logps_and_entropies``: the only differentiable log-probs; advantages are shaped (they may need
        the entropies) and token clips act on the log-probs here.
    ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: save and restore extension state (TRL's own pattern).

Extensions never see the trainer: :class:`TrainerHost` (below) is their only door to TRL, with the
:class:`~trl_grpo_ext.adapter.rollouts.RolloutService` for the members that generate outside TRL's batch; every TRL
name used here is listed in ``adapter.compat.TRL_SURFACE`` (``tests/test_boundary.py``).
"""

from __future__ import annotations

import collections.abc
import contextlib
import contextvars
import copy
import functools
import inspect
import json
import logging
import math
import numbers
import os
import re
import sys
import tempfile
from typing import Any

import torch
import trl
from accelerate.utils import gather_object
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from .adapter import compat as trl_compat
from .adapter import versions
from .adapter.compat import (
    aggregate_like_loss_type,
    combined_rewards,
    default_output_dir,
    prepare_scoring_model,
    reward_kwargs,
    trl_policy_weight,
)
from .adapter.rollouts import RolloutService, apply_splice
from .callbacks import CollapseMonitor, ExtClock, ExtTimingCallback, MetricGroupsCallback
from .config import PLUGIN_FIELDS, GRPOExtConfig
from .core.advantages import MAX_ABS_REWARD
from .families import FAMILIES, TRAINER_METRICS, Extension, GenerationBatch, LossContext, declared_metrics
from .families.base import KEEP_KEY, GenerationUpdate
from .families.contracts import Receiver
from .families.observers import OBSERVERS

logger = logging.getLogger(__name__)

#: File written into each checkpoint folder with the state of every extension.
STATE_FILE = "grpo_ext_state.json"


class AccelerateCollectives:
    """:class:`~trl_grpo_ext.core.collectives.Collectives` over an ``accelerate.Accelerator``."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.rank = accelerator.process_index

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.accelerator.num_processes == 1:
            return tensor
        return self.accelerator.reduce(tensor, reduction="sum")

    def all_cat(self, tensor: torch.Tensor) -> torch.Tensor:
        acc = self.accelerator
        if acc.num_processes == 1:
            return tensor
        lengths = acc.gather(torch.tensor([tensor.numel()], device=acc.device)).tolist()
        width = max(lengths)
        padded = tensor.new_zeros(width)
        padded[: tensor.numel()] = tensor.to(padded.device)
        gathered = acc.gather(padded.to(acc.device)).view(len(lengths), width)  # (world, width)
        return torch.cat([gathered[i, :n] for i, n in enumerate(lengths)])


class HandOff:
    """One value handed between two of the trainer's overrides where TRL 1.16 calls one inside the other and passes
    nothing between them (``_calculate_rewards`` inside ``_generate_and_score_completions``,
    ``_get_per_token_logps_and_entropies`` inside ``_compute_loss``).

    The value lives in a context variable for the length of the outer override's ``super()`` call (``with
    handoff.open(value) as slot``), not on the trainer: the trainer holds no state between its calls. The first inner
    call that wants the value takes it (:meth:`take`) or fills an empty slot (:meth:`put`). Outside the outer call, and
    for every later inner call of the same outer call, there is nothing to take or fill: a forward or a scoring that a
    member runs itself (AEPO's regenerated samples) can neither read nor overwrite the batch's value. Context variables
    are per thread (and per asyncio task), so two trainers in two threads never see each other's values.
    """

    def __init__(self, name: str):
        self.name = name
        self._slot: contextvars.ContextVar[list | None] = contextvars.ContextVar(f"trl_grpo_ext.{name}", default=None)

    @contextlib.contextmanager
    def open(self, value=None):
        if self._slot.get() is not None:
            raise RuntimeError(f"{self.name}: opened again inside its own call (TRL's call order changed?)")
        slot = [value]
        token = self._slot.set(slot)
        try:
            yield slot
        finally:
            self._slot.reset(token)

    def take(self):
        """The value, once per opening (None after it is taken, and while closed)."""
        slot = self._slot.get()
        if slot is None:
            return None
        value, slot[0] = slot[0], None
        return value

    def put(self, value) -> None:
        """Fill the open slot if it is still empty (the first inner call wins); nothing while closed."""
        slot = self._slot.get()
        if slot is not None and slot[0] is None:
            slot[0] = value


#: What TRL's own scoring of a generation batch gives the batch's hooks (rewards and rows as TRL scored them).
SCORED = HandOff("_generate_and_score_completions")
#: The loss context of a micro-batch, filled by TRL's policy forward inside ``_compute_loss``.
LOSS_CONTEXT = HandOff("_compute_loss")


class TrainerHost:
    """The :class:`~trl_grpo_ext.families.base.Host` of a ``GRPOExtTrainer``: everything the extensions use of TRL.

    TRL 1.16 private surface used here: ``_metrics``, ``_logs``, ``_step``, ``_tokenizer``, ``_dist``,
    ``_log_completion_extra``, ``_log_metric``, and the attributes ``beta``, ``loss_type``, ``epsilon_low`` /
    ``epsilon_high``, ``scale_rewards``, ``reward_weights``, ``reward_funcs``, ``environments``,
    ``top_entropy_quantile``, ``eos_token_ids``, ``max_completion_length``, ``current_gradient_accumulation_steps``
    (pinned by ``tests/test_trl_contract.py``). Generation, scoring and forwards outside TRL's batch are the
    :class:`~trl_grpo_ext.adapter.rollouts.RolloutService`'s (``rollouts``, for the members that declare ``rollout``).
    """

    #: The collapse monitor built on a host is fed by the hooks and logs through it (see CollapseMonitor).
    feeds_collapse_monitor = True

    def __init__(self, trainer: GRPOExtTrainer):
        self._trainer = trainer
        self.args = trainer.args
        self.collectives = trainer.ext_collectives
        self.clock = trainer.ext_clock

    # ------------------------------------------------------------------ state
    @property
    def beta(self) -> float:
        return self._trainer.beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._trainer.beta = value

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
    def step_reward_funcs(self) -> list:
        return self._trainer.step_reward_funcs

    @property
    def ratio_clip(self) -> tuple[float, float]:
        return self._trainer.epsilon_low, self._trainer.epsilon_high

    def drop_ratio_clip(self) -> None:
        self._trainer.epsilon_low = math.inf
        self._trainer.epsilon_high = math.inf

    # ------------------------------------------------------------------ services
    def log(self, mode: str, name: str, value: float) -> None:
        self._trainer._metrics[mode][name].append(float(value))

    def log_column(self, name: str, values: list) -> None:
        """Extend a column of TRL's completions table (one value per row of the last batch)."""
        self._trainer._logs["extra"][name].extend(values)

    def add_callback(self, callback) -> None:
        self._trainer.add_callback(callback)

    def metric_values(self, mode: str, name: str) -> list:
        return trl_compat.metric_values(self._trainer, mode, name)

    def save_checkpoint(self) -> None:
        trl_compat.save_checkpoint(self._trainer)

    def restore_checkpoint(self, folder: str) -> None:
        trl_compat.restore_checkpoint(self._trainer, folder)

    @property
    def rollouts(self) -> RolloutService:
        return self._trainer.ext_rollouts

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

    def prepare_scoring_model(self, model):
        """A frozen scoring model placed like TRL's reward models for the engine in use (DeepSpeed, FSDP, DDP)."""
        trainer = self._trainer
        return prepare_scoring_model(model, trainer.accelerator, deepspeed=trainer.is_deepspeed_enabled)

    def score_rule_based(self, inputs: list[dict], prompts: list, completions: list) -> torch.Tensor:
        """(n,) weighted sum of the Python reward functions on this process's rows (model-based ones are skipped);
        NaN where every function returned None."""
        trainer = self._trainer
        kwargs = self.reward_kwargs(inputs, completion_ids=None)
        # Not TRL's batch: nothing may reach its completions table or metrics, and its environments are not these.
        kwargs.update(log_extra=lambda *args, **kw: None, log_metric=lambda *args, **kw: None)
        kwargs.pop("environments", None)
        total = torch.zeros(len(prompts), device=trainer.accelerator.device)
        for weight, func in zip(trainer.reward_weights.tolist(), trainer.reward_funcs, strict=True):
            if isinstance(func, torch.nn.Module):
                continue
            scores = func(prompts=prompts, completions=completions, **kwargs)
            total += weight * torch.tensor([float("nan") if s is None else s for s in scores], device=total.device)
        return total

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
            steps_per_generation=self.args.steps_per_generation,
            num_processes=trainer.accelerator.num_processes,
            max_completion_length=trainer.max_completion_length,
            num_items_in_batch=num_items_in_batch,
        )

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._trainer.accelerator.gather(tensor)

    def gather_object(self, obj: list) -> list:
        return gather_object(obj)

    def log_advantages(self, per_row: torch.Tensor) -> None:
        logged = self._trainer._logs["advantages"]
        for _ in range(min(per_row.numel(), len(logged))):
            logged.pop()
        logged.extend(per_row.tolist())

    def reward_kwargs(self, inputs, completion_ids) -> dict[str, Any]:
        """As TRL 1.16's ``_calculate_rewards`` builds them (``trl_compat.reward_kwargs``), plus ``completion_ids``."""
        return {**reward_kwargs(self._trainer, inputs), "completion_ids": completion_ids}


#: Plugin fields read when training starts, not by the members: a change before train() takes effect.
READ_AT_TRAIN = ("ext_resume_state",)


def _plugin_settings(args: GRPOExtConfig) -> dict[str, Any]:
    """A copy of every field the plugin adds to ``GRPOConfig`` that its members are built from (the family switches
    and their parameters; not :data:`READ_AT_TRAIN`)."""
    return {name: copy.deepcopy(getattr(args, name)) for name in PLUGIN_FIELDS if name not in READ_AT_TRAIN}


def _reward_timeouts() -> int:
    """Math answers scored 0.0 by a time bound in this process so far (0 before the worker pool of
    :mod:`trl_grpo_ext.rewards.pool` is imported)."""
    pool = sys.modules.get("trl_grpo_ext.rewards.pool")
    return 0 if pool is None else pool.timeouts_total()


def _is_reward_value(value) -> bool:
    """A float, int, bool, numpy scalar or 0-d tensor (what TRL turns into a float), or None (unscorable)."""
    if value is None or isinstance(value, numbers.Real):
        return True
    if isinstance(value, torch.Tensor):
        return value.ndim == 0
    return type(value).__module__ == "numpy" and not getattr(value, "shape", True)


def _check_reward_output(name: str, output):
    """TRL indexes and converts a reward function's output without checking it: a string, a bare number or None, or
    nested lists end in a raw TypeError / RuntimeError naming nothing. Name the function, the row and the fix.
    Returns the output, a generator materialised as a list; tensors and arrays pass unchanged (TRL takes them)."""
    fix = "Return a list with one float (or None for an unscorable completion) per completion."
    values = output
    if isinstance(output, torch.Tensor) or type(output).__module__ == "numpy":
        values = output.tolist() if getattr(output, "ndim", 0) else output
    elif isinstance(output, collections.abc.Iterator):
        output = values = list(output)
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise ValueError(f"Reward function '{name}' returned {type(values).__name__} {values!r:.80}. {fix}")
    for i, value in enumerate(values):
        if not _is_reward_value(value):
            raise ValueError(
                f"Reward function '{name}' returned {value!r:.80} ({type(value).__name__}) for completion {i}. {fix}"
            )
    return output


def _with_context(func):
    """Wrap a Python reward function so that an exception names the function that raised it (TRL's does not), and a
    malformed output is refused with its name (TRL would fail later on it, naming nothing). An async function stays
    one (TRL awaits those concurrently)."""
    if isinstance(func, torch.nn.Module):
        return func
    name = getattr(func, "__name__", type(func).__name__)

    def named(error: Exception) -> RuntimeError:
        return RuntimeError(
            f"Reward function '{name}' raised {type(error).__name__}: {error}. Fix the function, or return None "
            "for the completions it cannot score (they get advantage 0)."
        )

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def awaited(*args, **kwargs):
            try:
                output = await func(*args, **kwargs)
            except Exception as error:
                raise named(error) from error
            return _check_reward_output(name, output)

        return awaited

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        try:
            output = func(*args, **kwargs)
        except Exception as error:
            raise named(error) from error
        return _check_reward_output(name, output)

    return wrapped


def _check_prompts(datasets: dict[str, Any], *, environment: bool = False) -> None:
    """Every (map-style) dataset has a ``prompt`` column of non-empty text or chat messages: TRL fails on the others
    deep inside generation with a raw ``KeyError: 'prompt'``, ``IndexError`` or tokenizer error naming no row.

    With an ``environment_factory`` (``environment=True``) TRL 1.16 makes ``prompt`` optional: an environment's
    ``reset()`` supplies or extends it (a routing dataset may carry only an ``environment`` column), so neither a
    missing column nor an empty prompt is an error there."""
    if environment:
        return
    for label, dataset in datasets.items():
        names = getattr(dataset, "column_names", None)
        if dataset is None or names is None or not hasattr(dataset, "__len__"):
            continue  # streaming datasets are read lazily: TRL reports their rows as it meets them
        if "prompt" not in names:
            raise ValueError(
                f"{label} has no 'prompt' column (columns: {names}). Fix: rename the column that holds the prompts to "
                "'prompt' (dataset.rename_column(old, 'prompt')); other columns reach the reward functions by name."
            )
        for i, prompt in enumerate(dataset["prompt"]):
            if isinstance(prompt, str):
                ok = bool(prompt)
            elif isinstance(prompt, list):  # conversational: messages with text content
                ok = bool(prompt) and all(isinstance(m, dict) and "content" in m for m in prompt)
            else:
                ok = False
            if not ok:
                raise ValueError(
                    f"{label}['prompt'][{i}] = {prompt!r:.80} ({type(prompt).__name__}): a prompt must be a non-empty "
                    "string or a non-empty list of chat messages ({'role': ..., 'content': ...}). Fix: drop or repair "
                    "that row (dataset.filter(...)), or cast the column to text."
                )


def checkpoint_damage(folder: str, *, ext_state: bool = True) -> str | None:
    """Why the checkpoint ``folder`` cannot be resumed from, or None: its ``trainer_state.json`` (written last by
    transformers, in place, so a kill can leave it truncated) must exist and parse, and with ``ext_state`` the
    extensions' state file must parse when present."""
    state = os.path.join(folder, TRAINER_STATE_NAME)
    if not os.path.exists(state):
        return f"it has no {TRAINER_STATE_NAME} (saving was interrupted)"
    for path in (state, os.path.join(folder, STATE_FILE)):
        if path != state and (not ext_state or not os.path.exists(path)):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            return f"{os.path.basename(path)} is damaged ({error})"
    return None


def last_complete_checkpoint(output_dir: str, *, ext_state: bool = True) -> str:
    """The newest ``checkpoint-N`` folder of ``output_dir`` whose files parse (:func:`checkpoint_damage`); damaged or
    incomplete newer ones (a kill while saving) are skipped with a warning naming the file. Raises ``ValueError``
    when there is none."""
    folders = []
    if os.path.isdir(output_dir):
        for name in os.listdir(output_dir):
            match = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", name)
            if match and os.path.isdir(os.path.join(output_dir, name)):
                folders.append((int(match.group(1)), os.path.join(output_dir, name)))
    for _, folder in sorted(folders, reverse=True):
        damage = checkpoint_damage(folder, ext_state=ext_state)
        if damage is None:
            return folder
        logger.warning("Skipping %s: %s; resuming from an earlier checkpoint.", folder, damage)
    raise ValueError(
        f"resume_from_checkpoint=True: no complete checkpoint (a {PREFIX_CHECKPOINT_DIR}-N folder whose "
        f"{TRAINER_STATE_NAME} parses) in output_dir={output_dir!r}. Fix: pass the checkpoint's path, or start without "
        "resuming."
    )


class GRPOExtTrainer(GRPOTrainer):
    """Drop-in ``GRPOTrainer`` with PRM step advantages, Clip-Cov / KL-Cov, PF-PPO filtering, KL control, AEPO and
    collapse monitoring.

    Takes every ``GRPOTrainer`` argument plus ``step_reward_funcs`` (for ``advantage_estimator="prm"``); ``args`` must
    be a :class:`GRPOExtConfig` (a plain ``GRPOConfig`` is refused with the fix). Each config switch selects one member
    of its family's registry; all members run together through the same hooks, in the order advantage estimator,
    sample filter, token clip, KL control, entropy control. With every switch off it trains exactly like
    ``GRPOTrainer``.
    """

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: GRPOExtConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
        *,
        step_reward_funcs=None,
    ):
        # GRPOTrainer's parameters in GRPOTrainer's order and with its defaults (tests/test_drop_in.py pins them), so
        # every positional or keyword call that works for GRPOTrainer works here; ours are keyword-only, after them.
        kwargs = dict(
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            quantization_config=quantization_config,
            peft_config=peft_config,
            tools=tools,
            rollout_func=rollout_func,
            environment_factory=environment_factory,
        )
        if args is None:
            args = GRPOExtConfig(default_output_dir(model))
        elif not isinstance(args, GRPOExtConfig):
            raise TypeError(
                f"GRPOExtTrainer needs args=GRPOExtConfig(...), got {type(args).__name__}. GRPOExtConfig takes every "
                "GRPOConfig field: replace GRPOConfig(...) with GRPOExtConfig(...)."
            )
        args.validate()  # a field changed since the config was built gets the error construction would have given
        selected = {switch: registry.get(getattr(args, switch)) for switch, registry in FAMILIES.items()}
        if step_reward_funcs is not None and not any("scoring_model" in m.host_capabilities for m in selected.values()):
            # host.step_reward_funcs needs the capability: no selected member would read them
            raise ValueError(
                "step_reward_funcs are used only with advantage_estimator='prm' (a member that scores steps); set "
                "GRPOExtConfig.advantage_estimator='prm' or drop step_reward_funcs."
            )
        for switch, cls in selected.items():  # a member that generates outside TRL's batch (declares "rollout")
            member = getattr(args, switch)
            if "rollout" in cls.host_capabilities and kwargs.get("environment_factory") is not None:
                raise ValueError(
                    f"{switch}={member!r} cannot run with environment_factory: it generates prompts again after TRL "
                    "has already reset and stepped this batch's environment instances, so its rollouts would act on "
                    "(and be rewarded from) those stepped instances. Fix: use it with tools= or a rollout_func (their "
                    f"env_mask is honoured), or set GRPOExtConfig.{switch}='none'."
                )
        if callable(step_reward_funcs):
            step_reward_funcs = [step_reward_funcs]
        self.step_reward_funcs = list(step_reward_funcs or [])
        for i, source in enumerate(self.step_reward_funcs):
            if not callable(source):
                raise TypeError(
                    f"step_reward_funcs[{i}]={source!r:.80} is not callable. Pass functions (the recipe maps names to "
                    "functions with trl_grpo_ext.rewards.STEP_REWARD_FUNCS.get(name)); a PRM model goes in "
                    "GRPOExtConfig.prm_model_name_or_path."
                )
        environment = kwargs["environment_factory"] is not None
        _check_prompts({"train_dataset": kwargs["train_dataset"]}, environment=environment)
        eval_sets = kwargs["eval_dataset"]
        if isinstance(eval_sets, dict):
            _check_prompts({f"eval_dataset[{key!r}]": v for key, v in eval_sets.items()}, environment=environment)
        else:
            _check_prompts({"eval_dataset": eval_sets}, environment=environment)
        self.ext_clock = ExtClock()  # set before super().__init__ so no hook can run without it
        super().__init__(model, reward_funcs, args, **kwargs)
        self._check_dataset_size()
        self.reward_funcs = [_with_context(f) for f in self.reward_funcs]
        self.ext_collectives = AccelerateCollectives(self.accelerator)
        self.extensions: dict[str, Extension] = {}
        self.ext_receiver = Receiver(lambda: self.state.global_step)  # checks every member output it receives
        # the rollout room's door to TRL
        self.ext_rollouts = RolloutService(self, members=self.extensions.values(), receiver=self.ext_receiver)
        self.ext_host = TrainerHost(self)
        for switch, registry in FAMILIES.items():  # one member per family, in the order the hooks run
            cls = registry.get(getattr(args, switch))
            if not cls.is_off:
                self.extensions[switch] = cls(self.ext_host)
        for name in OBSERVERS.names():  # watchers (collapse monitor), switched on by their own fields
            cls = OBSERVERS.get(name)
            if cls.enabled(args):
                self.extensions[name] = cls(self.ext_host)
        # What the members were built from: a change to args before train() would not reach them (train() refuses it)
        self.ext_built_with = _plugin_settings(args)
        declared = declared_metrics(self.extensions.values())
        self.add_callback(MetricGroupsCallback(key for keys in declared.values() for key in keys))
        self.add_callback(ExtTimingCallback(self.ext_clock, self.ext_host))  # last, so it times the monitor too

    # ------------------------------------------------------------------ helpers
    def _check_dataset_size(self) -> None:
        """TRL's sampler drops an incomplete generation batch: a training set with fewer prompts than one generation
        batch holds trains 0 steps and returns as if it had finished."""
        dataset = self.train_dataset
        if dataset is None or not hasattr(dataset, "__len__"):
            return
        needed = self.args.generation_batch_size // self.num_generations
        if len(dataset) < needed:
            raise ValueError(
                f"train_dataset has {len(dataset)} prompt(s), but one generation batch takes {needed} "
                f"(generation_batch_size={self.args.generation_batch_size} / num_generations={self.num_generations}): "
                "training would run 0 steps. Add prompts, or lower per_device_train_batch_size / steps_per_generation."
            )

    def ext_accumulation_steps(self) -> int:
        """The micro-batches of the current optimizer step. transformers sets ``current_gradient_accumulation_steps``
        only once its training loop runs: before it (``evaluate()`` before ``train()``, ``eval_on_start``) this is
        ``gradient_accumulation_steps``, which TRL's eval loss does not read anyway."""
        return getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)

    def ext_generator(self, tag: str, *, per_rank: bool, device: torch.device | str) -> torch.Generator:
        """A generator seeded from (seed, global step, micro-step, tag[, rank]): reproducible, no global RNG use.

        ``per_rank=False`` gives every process the same stream (for decisions over gathered data).
        """
        micro = self._step % max(self.ext_accumulation_steps(), 1)
        rank = self.accelerator.process_index if per_rank else 0
        key = f"{self.args.seed}|{self.state.global_step}|{micro}|{tag}|{rank}"
        seed = int.from_bytes(key.encode(), "little") % (2**63 - 1)
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        return generator

    # ------------------------------------------------------------------ generation side
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        with self.ext_clock.measure():
            self._check_and_keep_rewards(rewards_per_func, inputs, prompts, completions, completion_ids_list)
        return rewards_per_func

    def _check_and_keep_rewards(self, rewards_per_func, inputs, prompts, completions, completion_ids_list) -> None:
        infinite = torch.isinf(rewards_per_func)
        if infinite.any():
            bad = sorted({self.reward_func_names[j] for j in infinite.nonzero()[:, 1].tolist()})
            raise ValueError(
                f"Reward function(s) {bad} returned an infinite reward. Rewards must be finite floats; return None "
                "for a completion that cannot be scored (it then gets advantage 0), or clip the reward."
            )
        huge = rewards_per_func.abs() > MAX_ABS_REWARD  # NaN compares False: None rewards pass
        if huge.any():
            bad = sorted({self.reward_func_names[j] for j in huge.nonzero()[:, 1].tolist()})
            raise ValueError(
                f"Reward function(s) {bad} returned a reward above {MAX_ABS_REWARD:g} in absolute value "
                f"(largest {rewards_per_func[huge].abs().max().item():.3g}): TRL's group statistics (float32) would "
                "overflow and every advantage would silently be 0. Rescale the reward (e.g. divide it by its scale)."
            )
        weighted = combined_rewards(rewards_per_func, self.reward_weights).abs()
        if bool((weighted > MAX_ABS_REWARD).any()):  # NaN compares False
            raise ValueError(
                f"The weighted reward sum reaches {weighted.nan_to_num(0.0).max().item():.3g} (reward_weights="
                f"{self.reward_weights.tolist()}), above {MAX_ABS_REWARD:g}: TRL's group statistics (float32) would "
                "overflow and every advantage would silently be 0. Fix: lower GRPOExtConfig.reward_weights or rescale "
                "the rewards."
            )
        SCORED.put(
            dict(
                rewards_per_func=rewards_per_func,
                inputs=inputs,
                prompts=prompts,
                completions=completions,
                completion_ids_list=completion_ids_list,
            )
        )

    def _generate_and_score_completions(self, inputs):
        timeouts = _reward_timeouts()
        with SCORED.open() as scored:  # TRL's own scoring of this batch fills it (_calculate_rewards)
            output = super()._generate_and_score_completions(inputs)
        with self.ext_clock.measure():
            self._on_generation(output, scored[0])
            if sys.modules.get("trl_grpo_ext.rewards.pool") is not None:  # once math answers were scored by it
                # rewards/timeouts: answers of this batch scored 0.0 by a time bound (the members' scoring included)
                (key,) = TRAINER_METRICS
                mode = "train" if self.model.training else "eval"
                self._metrics[mode][key].append(float(_reward_timeouts() - timeouts))
        return output

    def _on_generation(self, output, scored: dict[str, Any]) -> None:
        """Run the members' ``on_generation`` on TRL's output and the rewards TRL scored it with (``scored``:
        ``rewards_per_func`` and the rows as TRL passed them to the reward functions)."""
        if scored is None:
            raise RuntimeError(
                "GRPOExtTrainer: TRL's _generate_and_score_completions did not call _calculate_rewards; this TRL "
                f"version ({trl.__version__}) is not supported (use trl{versions.supported_range()})."
            )
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        local_rows = output["completion_ids"].size(0)
        rank = self.accelerator.process_index
        batch = GenerationBatch(
            output=output,
            rewards=combined_rewards(scored["rewards_per_func"], self.reward_weights),
            group_size=group_size,
            process_slice=slice(rank * local_rows, (rank + 1) * local_rows),
            mode=mode,
            gather_padded=self._gather_padded,
            **scored,
        )
        if self.args.multi_objective_aggregation == "normalize_then_sum":
            # TRL's advantage (still its own here: no estimator ran yet) is what this aggregation ranks rows by.
            scores = self.accelerator.gather(output["advantages"].detach()).float()  # (N,)
            batch.rank_scores = scores.masked_fill(torch.isnan(batch.rewards), float("nan"))
        splices = []
        rows = batch.rewards.numel()  # every process's rows
        for extension in self.extensions.values():
            update = self.ext_receiver.generation_update(extension, extension.on_generation(batch), rows=rows)
            if update is not None:
                self._apply_generation_update(batch, update)
                if update.splice is not None:
                    splices.append(update.splice)
        for splice in splices:  # after every member: the others saw TRL's own samples
            self._apply_splice(batch, splice)

    def _apply_generation_update(self, batch: GenerationBatch, update: GenerationUpdate) -> None:
        """Write what a member returned into TRL's batch (the only place TRL's generation output is edited)."""
        out = batch.output
        completion_mask = out["completion_mask"]  # (B, T)
        if update.advantages is not None:
            local = update.advantages[batch.process_slice]  # (B,) or (B, T')
            if local.dim() == 2:  # token level: this process's width, 0 on padding
                local = local[:, : completion_mask.size(1)].to(completion_mask.device) * completion_mask
            out["advantages"] = local
            # TRL's completions table shows one advantage per row: a token-level one by its first token's value
            per_row = update.advantages if update.advantages.dim() == 1 else update.advantages[:, 0]
            self.ext_host.log_advantages(per_row)
        if update.keep is not None:
            batch.keep = update.keep
            local_keep = update.keep[batch.process_slice]  # (B,)
            base = out.get("tool_mask")
            base = torch.ones_like(completion_mask) if base is None else base
            out["tool_mask"] = base * local_keep.unsqueeze(1).to(base.dtype)
            out["num_items_in_batch"] = self.accelerator.gather((completion_mask * out["tool_mask"]).sum()).sum()
            out[KEEP_KEY] = local_keep

    def _apply_splice(self, batch: GenerationBatch, splice) -> None:
        """Write a member's :class:`~trl_grpo_ext.adapter.rollouts.Splice` into TRL's batch (the rollout mechanism of
        :mod:`trl_grpo_ext.adapter.rollouts`; a method so that tests can watch it)."""
        apply_splice(batch.output, splice, self.ext_rollouts, keep_key=KEEP_KEY)

    def _gather_padded(self, tensor: torch.Tensor) -> torch.Tensor:
        """(B, T) of every process, right-padded with 0 to the longest T, concatenated: (N, T')."""
        acc = self.accelerator
        if acc.num_processes == 1:
            return tensor
        return acc.gather(acc.pad_across_processes(tensor, dim=1, pad_index=0))

    # ------------------------------------------------------------------ loss side
    def _compute_loss(self, model, inputs):
        with self.ext_clock.measure():
            mode = "train" if self.model.training else "eval"
            completion_mask = inputs["completion_mask"]
            mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
            row_scale = 1.0
            for extension in self.extensions.values():
                row_scale *= self.ext_receiver.loss_scale(extension, extension.loss_scale(inputs, mode))
            # a copy per micro-batch: members change its advantages, never the buffered batch TRL reuses
            inputs = {**inputs, "advantages": inputs["advantages"] * row_scale} if row_scale != 1.0 else dict(inputs)
            ctx = LossContext(inputs=inputs, mask=mask, mode=mode, row_scale=row_scale)
        with LOSS_CONTEXT.open(ctx):  # TRL's policy forward inside takes it (_get_per_token_logps_and_entropies)
            loss = super()._compute_loss(model, inputs)
        if ctx.forward_logps is None:
            raise RuntimeError(
                "GRPOExtTrainer: TRL's _compute_loss did not call _get_per_token_logps_and_entropies; this TRL version "
                f"({trl.__version__}) is not supported (use trl{versions.supported_range()})."
            )
        with self.ext_clock.measure():
            for extension in self.extensions.values():
                term = self.ext_receiver.loss_term(extension, extension.extra_loss(ctx))
                if term is not None:
                    loss = loss + term
            for extension in self.extensions.values():
                extension.after_loss(ctx)
        return loss

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        ctx = LOSS_CONTEXT.take()  # the first call inside _compute_loss: the policy's differentiable forward
        if ctx is not None:
            ctx.forward_logps = logps
            ctx.entropies = entropies
            with self.ext_clock.measure():
                # TRL's loss reads inputs["advantages"] after this call; ctx.inputs is this micro-batch's own dict
                advantages = ctx.inputs["advantages"]
                receive, (rows, width) = self.ext_receiver, logps.shape
                for extension in self.extensions.values():
                    shaped = extension.shape_advantages(advantages, ctx)
                    advantages = receive.shaped_advantages(extension, shaped, given=advantages, rows=rows, width=width)
                ctx.inputs["advantages"] = advantages
                ctx.policy_weight = trl_policy_weight(
                    self, logps=logps, entropies=entropies, mask=ctx.mask, inputs=ctx.inputs, old_logps=ctx.old_logps
                )
                ctx.selected = self._selection(logps, ctx)
                for extension in self.extensions.values():
                    logps = receive.logps(extension, extension.modify_logps(logps, ctx), like=logps)
        return logps, entropies, aux

    def _selection(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor | None:
        """The (B, T) tokens the one selecting member (a token clip) returned from ``select_tokens``, or None."""
        chosen = None
        for name, extension in self.extensions.items():
            selected = self.ext_receiver.selection(extension, extension.select_tokens(logps, ctx), like=logps)
            if selected is not None:
                if chosen is not None:
                    raise ValueError(
                        f"Two members select tokens in one run ({chosen[0]!r} and {name!r}): ctx.selected holds one "
                        "selection. Fix: switch one of them off."
                    )
                chosen = (name, selected)
        return None if chosen is None else chosen[1]

    # ------------------------------------------------------------------ checkpoints
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """TRL's ``train``, after checking the config again (a field changed since construction gets the same error);
        ``resume_from_checkpoint=True`` takes the last *complete* checkpoint (every file it needs parses), where
        transformers takes the last folder even if a kill interrupted its writing."""
        self.args.validate()  # fields changed after the trainer was built: the same errors as at construction
        self._check_args_unchanged()
        if resume_from_checkpoint is True:  # a damaged state file of ours matters only when it is to be loaded
            resume_from_checkpoint = last_complete_checkpoint(
                self.args.output_dir, ext_state=self.args.ext_resume_state == "load"
            )
        elif isinstance(resume_from_checkpoint, (str, os.PathLike)) and os.path.isdir(resume_from_checkpoint):
            # transformers' file; ours gets its own message (and the 'ignore' escape hatch) when it is loaded
            damage = checkpoint_damage(str(resume_from_checkpoint), ext_state=False)
            if damage is not None:
                raise ValueError(
                    f"resume_from_checkpoint={str(resume_from_checkpoint)!r}: {damage}. Fix: resume from an earlier "
                    "checkpoint, or pass resume_from_checkpoint=True to take the newest complete one."
                )
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _check_args_unchanged(self) -> None:
        """The members, and what they told TRL at construction (KL-Cov's dropped ratio clip, AEPO's warnings, the
        monitor's callback), come from the config the trainer was built with: a plugin field changed on ``args`` since
        (the notebook habit: ``trainer.args.token_clip = "clip_cov"``) would train with the old value while ``args``
        and the saved config said the new one. Refused, naming each field."""
        now = _plugin_settings(self.args)
        changed = [name for name, value in now.items() if value != self.ext_built_with[name]]
        if changed:
            shown = ", ".join(f"{name}: {self.ext_built_with[name]!r} -> {now[name]!r}" for name in changed)
            raise ValueError(
                f"GRPOExtConfig field(s) changed on trainer.args after the trainer was built ({shown}); its members "
                "were built from the first values, so the run would not be the one args describe. Fix: set them in "
                "the GRPOExtConfig before building GRPOExtTrainer (or build a new trainer), or put the old values "
                "back."
            )

    @property
    def collapse_monitor(self) -> CollapseMonitor | None:
        """The :class:`~trl_grpo_ext.callbacks.CollapseMonitor` of this run (``diversity_metrics``), or None."""
        observer = self.extensions.get("collapse_monitor")
        return None if observer is None else observer.monitor

    def _stateful(self) -> dict[str, Any]:
        """Everything with checkpointed state: the extensions, by family or observer name."""
        return dict(self.extensions)

    def ext_state_dict(self) -> dict[str, Any]:
        return {name: part.state_dict() for name, part in self._stateful().items() if part.state_dict()}

    def _save_checkpoint(self, model, trial):
        # The extensions' state is written first, atomically (temporary file + rename): a kill at any moment leaves
        # either no file or a complete one, and a checkpoint that has the Trainer's trainer_state.json (written last by
        # transformers) always has it.
        state = self.ext_state_dict()
        if state and self.args.should_save:
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, STATE_FILE)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{STATE_FILE}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(state, f, indent=2, allow_nan=False)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(tmp)
                raise
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, STATE_FILE)
        parts = self._stateful()
        has_state = any(part.state_dict() for part in parts.values())
        if self.args.ext_resume_state == "ignore":
            if has_state:
                logger.warning("ext_resume_state='ignore': extensions start from their initial state, %s unread.", path)
            return
        if not os.path.exists(path):
            if has_state:
                logger.warning(
                    "Checkpoint %s has no %s: extensions start from their initial state.", checkpoint, STATE_FILE
                )
            return
        fix = "Fix: restore the file, or resume with ext_resume_state='ignore' to start the extensions afresh"
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"Extension state {path} cannot be read ({error}). {fix}.") from error
        if not isinstance(state, dict) or not all(isinstance(v, dict) for v in state.values()):
            raise ValueError(f"Extension state {path} must map family names to JSON objects. {fix}.")
        for name, part_state in state.items():
            if name not in parts:
                logger.warning("Checkpoint state for %r ignored: that family is off in this run.", name)
                continue
            try:
                parts[name].load_state_dict(part_state)
            except (KeyError, TypeError, ValueError) as error:
                raise ValueError(f"Extension state {path}, entry {name!r}: {error}. {fix}.") from error


__all__ = ["GRPOExtTrainer"]
