"""``GRPOExtTrainer``: TRL's ``GRPOTrainer`` composing the anti-collapse families.

TRL's private hooks are overridden in the adapter (:class:`~trl_grpo_ext.adapter.hooks.TRLHooks`), which hands this
class what each needs through its public ``ext_*`` methods:
    ``ext_on_rewards``: refuse infinite or huge rewards (TRL's ``_calculate_rewards``).
    ``ext_on_generation``: run ``on_generation`` hooks (advantages, sample filter) before TRL shuffles the batch.
    ``ext_loss_context`` / ``ext_finish_loss``: open a loss context, rescale filtered micro-batches, add extension loss
        terms (around TRL's ``_compute_loss``).
    ``ext_on_policy_forward``: the only differentiable log-probs; advantages are shaped (they may need the entropies)
        and token clips act on the log-probs here.
    ``ext_save_state`` / ``ext_load_state``: save and restore extension state (TRL's own pattern).

Extensions never see the trainer: :class:`~trl_grpo_ext.adapter.host.TrainerHost` is their only door to TRL, with the
:class:`~trl_grpo_ext.adapter.rollouts.RolloutService` for the members that generate outside TRL's batch; every TRL
name used here is listed in ``adapter.compat.TRL_SURFACE`` (``tests/test_boundary.py``).
"""

from __future__ import annotations

import collections.abc
import contextlib
import copy
import functools
import inspect
import json
import logging
import numbers
import os
import sys
import tempfile
from dataclasses import replace
from typing import Any, NamedTuple

import torch

from .adapter import host as services
from .adapter.compat import (
    PER_SEQUENCE_LOSS_TYPES,
    combined_rewards,
    default_output_dir,
    log_advantages,
    log_value,
    per_token_kl,
    trl_policy_weight,
    zero_logged_advantages,
)
from .adapter.hooks import TRLHooks
from .adapter.rollouts import RolloutService, apply_splice, place_splices
from .api import RefillUpdate
from .callbacks import CollapseMonitor, ExtClock, ExtTimingCallback, MetricGroupsCallback
from .checkpoints import STATE_FILE, checkpoint_damage, last_complete_checkpoint
from .config import PLUGIN_FIELDS, GRPOExtConfig
from .core.advantages import MAX_ABS_REWARD
from .families import FAMILIES, TRAINER_METRICS, GenerationBatch, LossContext, declared_metrics
from .families.base import KEEP_KEY, E, GenerationUpdate, build_member, services_of
from .families.contracts import Receiver
from .families.observers import OBSERVERS
from .families.slots import Slots

logger = logging.getLogger(__name__)


class MicroBatch(NamedTuple):
    """A micro-batch as its loss begins (``ext_loss_context``), before TRL's policy forward: what its
    :class:`LossContext` is built from."""

    inputs: dict[str, Any]  # the micro-batch's own copy, the dict TRL's loss reads
    mask: torch.Tensor  # (B, T)
    mode: str
    row_scale: float


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


class GRPOExtTrainer(TRLHooks):
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
        if step_reward_funcs is not None and not any("scoring" in services_of(m) for m in selected.values()):
            # only a member naming the scoring service reads them: none is selected
            raise ValueError(
                "step_reward_funcs are used only with advantage_estimator='prm' (a member that scores steps); set "
                "GRPOExtConfig.advantage_estimator='prm' or drop step_reward_funcs."
            )
        for switch, cls in selected.items():  # a member that generates outside TRL's batch (declares "rollout")
            member = getattr(args, switch)
            if "rollouts" in services_of(cls) and kwargs.get("environment_factory") is not None:
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
        self._check_validation_size()
        self.reward_funcs = [_with_context(f) for f in self.reward_funcs]
        self.ext_collectives = AccelerateCollectives(self.accelerator)
        self.extensions = Slots()  # one typed slot per family, then the observers
        # checks every member output it receives, and logs the metrics a hook returns with it
        self.ext_receiver = Receiver(lambda: self.state.global_step, log=self.ext_log)
        # the rollout room's door to TRL
        self.ext_rollouts = RolloutService(
            self, estimator=lambda: self.extensions.advantage_estimator, receiver=self.ext_receiver
        )
        self.ext_host = services.TrainerHost(self)
        for switch, registry in FAMILIES.items():  # one member per family, in the order the hooks run
            cls = registry.get(getattr(args, switch))
            if not cls.is_off:
                self.extensions[switch] = self.ext_build(cls)
        for name in OBSERVERS.names():  # watchers (collapse monitor), switched on by their own fields
            cls = OBSERVERS.get(name)
            if cls.enabled(args):
                self.extensions[name] = self.ext_build(cls)
        for extension in self.extensions.values():  # a state no checkpoint could write fails now, not at the first save
            self.ext_receiver.state(extension, extension.state_dict())
        # What the members were built from: a change to args before train() would not reach them (train() refuses it)
        self.ext_built_with = _plugin_settings(args)
        declared = declared_metrics(self.extensions.values())
        self.add_callback(MetricGroupsCallback(key for keys in declared.values() for key in keys))
        self.add_callback(ExtTimingCallback(self.ext_clock, self.ext_log))  # last, so it times the monitor too

    def ext_log(self, mode: str, key: str, value: float) -> None:
        """Buffer a metric in TRL's metrics of ``mode`` (averaged at the next log): the trainer's own, and those the
        members return with their hooks' values (the receiver checks them first)."""
        log_value(self, mode, key, value)

    def ext_build(self, member: type[E]) -> E:
        """``member(args, host, **services)``: its own Args from this run's config, the host, and each service its
        constructor names (``families.base.SERVICES``), built for it."""
        factories = {
            "beta_control": lambda owner: services.BetaService(self, functools.partial(self.ext_receiver.beta, owner)),
            "ratio_clip": lambda owner: services.RatioClipService(self),
            "scoring": lambda owner: services.ScoringService(self),
            "callbacks": lambda owner: services.CallbackService(self),
            "evaluation": lambda owner: services.EvaluationService(self),
            "reference": lambda owner: services.ReferenceService(self),
            "rollouts": lambda owner: self.ext_rollouts,
            "monitor_source": lambda owner: services.MonitorSource(self),
        }
        return build_member(member, self.args, self.ext_host, factories)

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

    #: Fewer held-out prompts than this leave validation gold either blind to all but large drops (its noise floor,
    #: ``collapse_validation_z``) or tripped by sampling noise (without one: docs/results.md, 6 of 12 false alarms with
    #: 20 prompts, 1 of 24 with about 90).
    VALIDATION_PROMPTS_MIN = 50

    def _check_validation_size(self) -> None:
        """Warn when ``collapse_validation_metric`` reads an evaluation of so few prompts that its sampling noise is of
        the size of ``collapse_validation_drop``."""
        args, eval_sets = self.args, self.eval_dataset
        if not args.collapse_validation_metric or eval_sets is None:
            return
        sets = eval_sets.values() if isinstance(eval_sets, dict) else [eval_sets]
        sizes = [len(d) for d in sets if hasattr(d, "__len__")]
        if sizes and min(sizes) < self.VALIDATION_PROMPTS_MIN:
            logger.warning(
                "collapse_validation_metric=%r reads an evaluation of %d prompt(s): at that size its sampling noise "
                "is as large as the drop that alarms (collapse_validation_drop=%s), so its noise floor "
                "(collapse_validation_z=%s standard errors) lets only large drops alarm, and without one noise alone "
                "trips it (in the project's study, 6 false alarms in 12 healthy runs with 20 prompts). Evaluate on "
                "%d or more prompts.",
                args.collapse_validation_metric, min(sizes), args.collapse_validation_drop, args.collapse_validation_z,
                self.VALIDATION_PROMPTS_MIN,
            )  # fmt: skip

    def ext_accumulation_steps(self) -> int:
        """The micro-batches of the current optimizer step. transformers sets ``current_gradient_accumulation_steps``
        only once its training loop runs: before it (``evaluate()`` before ``train()``, ``eval_on_start``) this is
        ``gradient_accumulation_steps``, which TRL's eval loss does not read anyway."""
        return getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)

    def ext_generator(self, tag: str, *, per_rank: bool, device: torch.device | str) -> torch.Generator:
        """A generator seeded from (seed, global step, micro-step, tag[, rank]): reproducible, no global RNG use.

        ``per_rank=False`` gives every process the same stream (for decisions over gathered data).
        """
        micro = self.ext_host.micro_step % max(self.ext_accumulation_steps(), 1)
        rank = self.accelerator.process_index if per_rank else 0
        key = f"{self.args.seed}|{self.state.global_step}|{micro}|{tag}|{rank}"
        seed = int.from_bytes(key.encode(), "little") % (2**63 - 1)
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        return generator

    # ------------------------------------------------------------------ generation side
    def ext_on_rewards(self, rewards_per_func: torch.Tensor) -> None:
        """TRL scored a generation batch (``rewards_per_func`` (N, F), gathered): refuse infinite or huge rewards."""
        with self.ext_clock.measure():
            self._check_rewards(rewards_per_func)

    def _check_rewards(self, rewards_per_func: torch.Tensor) -> None:
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

    def ext_on_generation(self, output: dict[str, Any], scored: dict[str, Any], *, timeouts_before: int) -> None:
        """TRL generated and scored a batch (``output``, before it is shuffled and split): the members'
        ``on_generation`` with the rewards TRL scored it with (``scored``: ``rewards_per_func`` and the rows as TRL
        passed them to the reward functions), and the batch's reward time-outs logged."""
        with self.ext_clock.measure():
            self._on_generation(output, scored)
            if sys.modules.get("trl_grpo_ext.rewards.pool") is not None:  # once math answers were scored by it
                # rewards/timeouts: answers of this batch scored 0.0 by a time bound (the members' scoring included)
                (key,) = TRAINER_METRICS
                mode = "train" if self.model.training else "eval"
                self.ext_log(mode, key, float(_reward_timeouts() - timeouts_before))

    def ext_reward_timeouts(self) -> int:
        """Answers scored 0.0 by a time bound so far (this process); :meth:`ext_on_generation` logs the batch's."""
        return _reward_timeouts()

    def _on_generation(self, output, scored: dict[str, Any]) -> None:
        """Run the members' ``on_generation`` on TRL's output and the rewards TRL scored it with."""
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        local_rows = output["completion_ids"].size(0)
        rank = self.accelerator.process_index
        rewards = combined_rewards(scored["rewards_per_func"], self.reward_weights)  # (N,)
        rank_scores = None
        if self.args.multi_objective_aggregation == "normalize_then_sum":
            # TRL's advantage (still its own here: no estimator ran yet) is what this aggregation ranks rows by.
            scores = self.accelerator.gather(output["advantages"].detach()).float()  # (N,)
            rank_scores = scores.masked_fill(torch.isnan(rewards), float("nan"))
        batch = GenerationBatch(
            output=output,  # the members read a view of it; only this trainer writes TRL's dict
            rewards=rewards,
            group_size=group_size,
            process_slice=slice(rank * local_rows, (rank + 1) * local_rows),
            mode=mode,
            rank_scores=rank_scores,
            gather_padded=self._gather_padded,
            **scored,
        )
        splices = []
        rows = rewards.numel()  # every process's rows
        replaced = False  # a member after the estimator put advantages of its own in place of the group's
        refilled: list[int] = []  # this process's rows a refill put new samples in
        for family, extension in self.extensions.having("on_generation"):
            update = self.ext_receiver.generation_update(
                extension, extension.on_generation(batch), rows=rows, family=family, mode=mode,
                width=lambda batch=batch: batch.global_completions()[1].size(1),
                functions=batch.rewards_per_func.size(1),
            )  # fmt: skip
            if update is None:
                continue
            if isinstance(update, RefillUpdate) and update.splice is not None:  # at once: the next members read it
                batch = self._apply_refill(output, batch, update)
                refilled += update.splice.written_rows
            elif update.splice is not None:
                splices.append(update.splice)
            batch = self._apply_generation_update(output, batch, update)
            replaced |= family not in ("advantage_estimator", "refill") and update.advantages is not None
        self._screen(output, batch, regroup=not replaced)
        # after every member (the others saw the batch's own samples), each on rows no refill or earlier splice took
        for splice in place_splices(splices, output["completion_ids"].size(0), taken=refilled):
            self._apply_splice(output, splice)

    def _apply_refill(self, out: dict[str, Any], batch: GenerationBatch, update: RefillUpdate) -> GenerationBatch:
        """Write a refill's new samples into TRL's batch ``out`` (tokens, advantages, log-probs: :meth:`_apply_splice`)
        and return the batch the next members read: the same rows with the new samples' rewards (per function and
        weighted, gathered from every process), dataset rows, prompts, completions and ids in place, copies copied."""
        splice = update.splice
        self._apply_splice(out, splice)
        local = batch.process_slice
        per_func = batch.rewards_per_func[local].clone()  # (B, F) this process's rows
        lists = [list(batch.inputs), list(batch.prompts), list(batch.completions), list(batch.completion_ids_list)]
        if splice.copies:  # written first, as apply_splice writes them: every source read before any target is written
            sources, targets = [src for src, _ in splice.copies], [dst for _, dst in splice.copies]
            per_func[targets] = per_func[sources]
            for values in lists:
                for target, value in zip(targets, [values[src] for src in sources], strict=True):
                    values[target] = value
        per_func[splice.rows] = update.rewards_per_func.to(per_func)  # (len(rows), F)
        new = zip(update.inputs, splice.rollout.completions, splice.rollout.completion_ids, strict=True)
        for row, (inputs, completion, ids) in zip(splice.rows, new, strict=True):
            for values, value in zip(lists, (inputs, inputs["prompt"], completion, list(ids)), strict=True):
                values[row] = value
        rewards_per_func = self.accelerator.gather(per_func)  # (N, F)
        inputs, prompts, completions, completion_ids_list = lists
        return GenerationBatch(
            output=out, rewards_per_func=rewards_per_func, group_size=batch.group_size, process_slice=local,
            rewards=combined_rewards(rewards_per_func, self.reward_weights), mode=batch.mode, keep=batch.keep,
            inputs=inputs, prompts=prompts, completions=completions, completion_ids_list=completion_ids_list,
            rank_scores=batch.rank_scores, gather_padded=batch.gather_padded,
        )  # fmt: skip

    def _screen(self, output: dict[str, Any], batch: GenerationBatch, *, regroup: bool) -> None:
        """``collapse_action="screen"`` after its alarm: the rows of this training batch an audit flags (the collapse
        monitor's ``last_flags``: favoured by the training reward, failed by an audit) leave their group. They train
        with advantage 0, and the others' advantages are computed again by the advantage estimator from the group's
        unflagged rewards (a flagged reward as an unscorable one, NaN): zeroing the flagged rows alone would leave the
        honest rows of their group measured against the hacked rewards, below the group mean, and pushed down. A
        weighting that shapes in the loss (W-REINFORCE with its group baseline, entropy-shaped advantages) then shapes
        the recomputed advantages. The flagged rows' advantages are zeroed only where the estimator cannot recompute
        (PRM's step rewards), where TRL normalises each reward first (``normalize_then_sum``), and where a member
        replaced the group's advantages with its own (``regroup`` False: W-REINFORCE without a baseline, whose
        advantages have no group to leave, so zeroing is exact there). A refill's new samples are screened like the
        others (the monitor read the refilled batch); rows AEPO's splice replaces next are new samples, not screened.
        Logs ``audit/screened`` (rows of all processes)."""
        monitor = self.collapse_monitor
        if monitor is None or not monitor.screening or batch.mode != "train" or monitor.last_flags is None:
            return
        flags = monitor.last_flags  # (N,) every process's rows
        advantages = output["advantages"]  # (B,) or (B, T)
        estimator = self.extensions.advantage_estimator
        regroup = (
            regroup
            and bool(flags.any())
            and estimator is not None
            and type(estimator).gives_group_advantages
            and self.args.multi_objective_aggregation == "sum_then_normalize"
            and advantages.dim() == 1
        )
        if regroup:
            rewards = batch.rewards.masked_fill(flags.to(batch.rewards.device), float("nan"))  # (N,)
            regrouped = self.ext_rollouts.group_advantages(rewards, batch.group_size)  # (N,)
            regrouped = regrouped.masked_fill(flags.to(regrouped.device), 0.0)
            output["advantages"] = regrouped[batch.process_slice].to(advantages)
            log_advantages(self, regrouped)
        else:
            keep = (~flags[batch.process_slice]).to(advantages)  # (B,)
            output["advantages"] = advantages * (keep if advantages.dim() == 1 else keep.unsqueeze(1))
            zero_logged_advantages(self, flags)
        self.ext_log("train", "audit/screened", float(flags.sum()))

    def _apply_generation_update(
        self, out: dict[str, Any], batch: GenerationBatch, update: GenerationUpdate
    ) -> GenerationBatch:
        """Write what a member returned into TRL's batch ``out`` (the only place TRL's generation output is edited);
        the batch the next members read (with the rows that train, where ``update`` says)."""
        completion_mask = out["completion_mask"]  # (B, T)
        if update.advantages is not None:
            local = update.advantages[batch.process_slice]  # (B,) or (B, T')
            if local.dim() == 2:  # token level: this process's width, 0 on padding
                local = local[:, : completion_mask.size(1)].to(completion_mask.device) * completion_mask
            out["advantages"] = local
            # TRL's completions table shows one advantage per row: a token-level one by its first token's value
            per_row = update.advantages if update.advantages.dim() == 1 else update.advantages[:, 0]
            log_advantages(self, per_row)
        if update.keep is not None:
            # the rows every member so far kept (a refill's and a sample filter's flags both hold)
            batch = replace(batch, keep=update.keep if batch.keep is None else update.keep & batch.keep)
            local_keep = batch.keep[batch.process_slice]  # (B,)
            base = out.get("tool_mask")
            base = torch.ones_like(completion_mask) if base is None else base
            out["tool_mask"] = base * local_keep.unsqueeze(1).to(base.dtype)
            out["num_items_in_batch"] = self.accelerator.gather((completion_mask * out["tool_mask"]).sum()).sum()
            out[KEEP_KEY] = local_keep
        return batch

    def _apply_splice(self, out: dict[str, Any], splice) -> None:
        """Write a member's :class:`~trl_grpo_ext.adapter.rollouts.Splice` into TRL's batch ``out`` (the rollout
        mechanism of :mod:`trl_grpo_ext.adapter.rollouts`; a method so that tests can watch it)."""
        apply_splice(out, splice, self.ext_rollouts, keep_key=KEEP_KEY)

    def _gather_padded(self, tensor: torch.Tensor) -> torch.Tensor:
        """(B, T) of every process, right-padded with 0 to the longest T, concatenated: (N, T')."""
        acc = self.accelerator
        if acc.num_processes == 1:
            return tensor
        return acc.gather(acc.pad_across_processes(tensor, dim=1, pad_index=0))

    # ------------------------------------------------------------------ loss side
    def ext_loss_context(self, inputs: dict[str, Any]) -> tuple[dict[str, Any], MicroBatch]:
        """A micro-batch's loss begins: the inputs TRL's loss is to see (a copy, with the row scale applied to its
        advantages) and what the loss context will be built from once TRL's policy forward ran.

        The row scale (``pf_rescale``, per-sequence loss types): rows / kept rows of the micro-batch, where a sample
        filter or a refill masked rows (``KEEP_KEY``), so that the loss is the mean over the kept rows, not diluted by
        the masked ones. The policy term is linear in the advantages; :meth:`ext_finish_loss` adds the KL term's
        missing ``(scale - 1) * beta * KL``."""
        with self.ext_clock.measure():
            mode = "train" if self.model.training else "eval"
            completion_mask = inputs["completion_mask"]
            mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
            keep, row_scale = inputs.get(KEEP_KEY), 1.0
            if keep is not None and self.args.pf_rescale and self.loss_type in PER_SEQUENCE_LOSS_TYPES:
                kept = int(keep.sum())
                row_scale = keep.numel() / kept if 0 < kept < keep.numel() else 1.0
            # a copy per micro-batch: members change its advantages, never the buffered batch TRL reuses
            inputs = {**inputs, "advantages": inputs["advantages"] * row_scale} if row_scale != 1.0 else dict(inputs)
        return inputs, MicroBatch(inputs=inputs, mask=mask, mode=mode, row_scale=row_scale)

    def ext_finish_loss(self, loss: torch.Tensor, ctx: LossContext) -> torch.Tensor:
        """TRL's loss of the micro-batch, plus the KL term's share of the row scale and the members' loss terms; their
        ``after_loss``."""
        with self.ext_clock.measure():
            if ctx.row_scale != 1.0 and self.beta != 0.0:  # TRL's KL term is not scaled by the advantages
                kl = per_token_kl(
                    ctx.logps, ctx.inputs["ref_per_token_logps"], old_logps=ctx.old_logps,
                    bias_correction=self.args.use_bias_correction_kl,
                )  # fmt: skip
                aggregated = self.ext_host.aggregate(
                    kl, ctx.mask, mode=ctx.mode, num_items_in_batch=ctx.inputs.get("num_items_in_batch")
                )
                loss = loss + self.beta * (ctx.row_scale - 1.0) * aggregated
            for _, extension in self.extensions.having("extra_loss"):
                term = self.ext_receiver.loss_term(extension, extension.extra_loss(ctx), mode=ctx.mode)
                if term is not None:
                    loss = loss + term
            for _, extension in self.extensions.having("after_loss"):
                self.ext_receiver.nothing(extension, "after_loss", extension.after_loss(ctx), mode=ctx.mode)
        return loss

    def ext_on_policy_forward(
        self, logps: torch.Tensor, entropies: torch.Tensor | None, batch: MicroBatch
    ) -> tuple[torch.Tensor, LossContext]:
        """The micro-batch's differentiable policy forward (``logps`` (B, T)): the members shape its advantages
        (they may read the entropies) and act on the log-probs TRL's loss is to use. Returns those log-probs and the
        loss context the loss terms read (frozen; each stage makes the next one)."""
        with self.ext_clock.measure():
            inputs = batch.inputs  # this micro-batch's own dict: TRL's loss reads its advantages after this call
            ctx = LossContext(
                inputs=inputs, mask=batch.mask, mode=batch.mode, logps=logps,
                row_scale=batch.row_scale, entropies=entropies,
            )  # fmt: skip
            receive, (rows, width), weighting = self.ext_receiver, logps.shape, self.extensions.advantage_weighting
            if weighting is not None:
                given = inputs["advantages"]
                shaped = weighting.shape_advantages(given, ctx)
                inputs["advantages"] = receive.shaped_advantages(
                    weighting, shaped, given=given, rows=rows, width=width, mode=ctx.mode
                )
            weight = trl_policy_weight(
                self, logps=logps, entropies=entropies, mask=ctx.mask, inputs=inputs, old_logps=ctx.old_logps
            )
            ctx = replace(ctx, policy_weight=weight)
            clip = self.extensions.token_clip  # the one member that selects tokens
            if clip is not None:
                selected = receive.selection(clip, clip.select_tokens(logps, ctx), like=logps, mode=ctx.mode)
                ctx = replace(ctx, selected=selected)
            for _, extension in self.extensions.having("modify_logps"):
                logps = receive.logps(extension, extension.modify_logps(logps, ctx), like=logps, mode=ctx.mode)
        return logps, ctx

    # ------------------------------------------------------------------ checkpoints
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """TRL's ``train``, after checking the config again (a field changed since construction gets the same error);
        ``resume_from_checkpoint=True`` takes the last *complete* checkpoint (every file it needs parses), where
        transformers takes the last folder even if a kill interrupted its writing."""
        self.args.validate()  # fields changed after the trainer was built: the same errors as at construction
        self._check_args_unchanged()
        if resume_from_checkpoint is True:  # a damaged state file of ours matters only when it is to be loaded
            resume_from_checkpoint = last_complete_checkpoint(
                self.args.output_dir,
                ext_state=self.args.ext_resume_state == "load",
                log=lambda folder, why: logger.warning(
                    "Skipping %s: %s; resuming from an earlier checkpoint.", folder, why
                ),
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
        states = {}
        for name, part in self._stateful().items():  # named errors instead of json's, at the save that meets them
            states[name] = self.ext_receiver.state(part, part.state_dict())
        return {name: state for name, state in states.items() if state}

    def ext_save_state(self, folder: str) -> None:
        """Write the extensions' state into the checkpoint ``folder`` about to be saved, first and atomically
        (temporary file + rename): a kill at any moment leaves either no file or a complete one, and a checkpoint that
        has the Trainer's trainer_state.json (written last by transformers) always has it."""
        state = self.ext_state_dict()
        if state and self.args.should_save:
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

    def ext_load_state(self, checkpoint: str) -> None:
        """Restore the extensions' state from the checkpoint being resumed (after TRL loaded its optimizer and
        scheduler), by ``ext_resume_state``."""
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
