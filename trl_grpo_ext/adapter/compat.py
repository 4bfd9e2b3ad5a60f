"""The only lines copied from TRL, each where TRL 1.16.0 offers no hook. Guarded by tests/test_trl_contract.py.

``GRPOTrainer._compute_loss`` (trl/trainer/grpo_trainer.py, TRL 1.16.0) builds the per-token loss in a local variable
and aggregates it by ``loss_type``. Extra loss terms (the KL-Cov penalty, the KL gradient Clip-Cov must keep, the KL
part of the PF-PPO rescale) have to be aggregated the same way, and the KL controller measures the same k3 estimate.
If a TRL upgrade changes either, the parity tests fail.
"""

from __future__ import annotations

import copy

import torch

from ..names import KNOWN_LOSS_TYPES, PER_SEQUENCE_LOSS_TYPES, TOKEN_COUNT_LOSS_TYPES, TRL_VERSION  # noqa: F401


def aggregate_like_loss_type(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str,
    training: bool,
    gradient_accumulation_steps: int,
    steps_per_generation: int,
    num_processes: int,
    max_completion_length: int,
    num_items_in_batch: torch.Tensor | None,
) -> torch.Tensor:
    """Reduce a (B, T) per-token term to the scalar that TRL 1.16's ``_compute_loss`` would make of it.

    Copied from the ``loss_type`` branches of ``GRPOTrainer._compute_loss`` (TRL 1.16.0), including the division by the
    gradient-accumulation steps that TRL applies itself (HF's automatic scaling is off for GRPO).
    """
    mask = mask.to(per_token.dtype)
    accumulation = gradient_accumulation_steps if training else 1.0
    if loss_type in ("grpo", "sapo"):
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0) / accumulation
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * max_completion_length) / accumulation
    if loss_type in TOKEN_COUNT_LOSS_TYPES:
        normalizer = num_items_in_batch.clamp(min=1.0) / num_processes
        if training:
            normalizer = normalizer * gradient_accumulation_steps / steps_per_generation
        return (per_token * mask).sum() / normalizer
    if loss_type == "luspo":
        return (per_token * mask).sum(-1).mean() / accumulation
    raise ValueError(f"Unknown loss_type {loss_type!r}: trl_grpo_ext knows the aggregation of TRL {TRL_VERSION} only.")


def per_token_kl(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    *,
    old_logps: torch.Tensor | None = None,
    bias_correction: bool = False,
) -> torch.Tensor:
    """TRL 1.16's per-token k3 estimate of KL(pi_theta || pi_ref), optionally importance-corrected (token level).

    ``exp(ref - logp) - (ref - logp) - 1``; with ``bias_correction`` (``use_bias_correction_kl``) multiplied by
    ``exp(logp - old)``. (B, T).
    """
    delta = ref_logps - logps
    kl = torch.exp(delta) - delta - 1
    if bias_correction:
        kl = kl * torch.exp(logps - old_logps)
    return kl


def combined_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """TRL 1.16's weighted sum of the reward functions (``sum_then_normalize``); NaN where every function gave None.

    (N, F) -> (N,).
    """
    rewards = (rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    return rewards.masked_fill(torch.isnan(rewards_per_func).all(dim=1), float("nan"))


def vllm_importance_sampling_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """TRL 1.16's vLLM importance-sampling ratio (``vllm_importance_sampling_correction``), copied from
    ``GRPOTrainer._generate_and_score_completions``: ``exp(old - sampling)`` per token (``token_*`` modes, (B, T)) or
    summed per sequence (``sequence_*`` modes, (B, 1)); ``*_truncate`` clamps it to [clip_min, clip_max], ``*_mask``
    sets it to 0 outside. NaN sampling log-probs (vLLM could not score the token) count as ratio 1.
    """
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)  # (B, T)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)  # (B, 1)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode in ("sequence_mask", "token_mask"):
        low = clip_min if clip_min is not None else -float("inf")
        high = clip_max if clip_max is not None else float("inf")
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    raise ValueError(
        f"Unknown vllm_importance_sampling_mode {mode!r}; TRL {TRL_VERSION} knows token_truncate, token_mask, "
        "sequence_truncate, sequence_mask."
    )


def reward_kwargs(trainer, inputs: list[dict]) -> dict:
    """The keyword arguments TRL 1.16's ``GRPOTrainer._calculate_rewards`` passes to a Python reward function besides
    ``prompts``, ``completions`` and ``completion_ids`` (copied from it: every dataset column but "prompt", "completion"
    and "completion_ids", one entry per row; ``trainer_state``, ``log_extra``, ``log_metric``, and ``environments``
    when TRL has them). ``tests/test_trl_contract.py::test_reward_kwargs_parity_with_trl`` compares them with what TRL
    passes."""
    keys = [key for key in inputs[0] if key not in ("prompt", "completion", "completion_ids")]
    kwargs = {key: [row[key] for row in inputs] for key in keys}
    kwargs["trainer_state"] = trainer.state
    kwargs["log_extra"] = trainer._log_completion_extra
    kwargs["log_metric"] = trainer._log_metric
    if getattr(trainer, "environments", None) is not None:
        kwargs["environments"] = trainer.environments
    return kwargs


def reference_logps(trainer, input_ids, attention_mask, logits_to_keep) -> torch.Tensor:
    """(b, t) reference-model log-probs as TRL 1.16's ``_generate_and_score_completions`` computes them for its batch:
    with the ``ref_model``, or for a PEFT model with the base (or its "ref" adapter). Copied from TRL (no hook computes
    them for given rows); ``tests/test_aepo.py::test_spliced_reference_logps_follow_trls_choice_of_reference`` checks
    them against TRL's own."""
    from trl import GRPOTrainer

    def logps(*args):  # TRL's own forward, not the plugin's override (no re-entry into the hooks)
        return GRPOTrainer._get_per_token_logps_and_entropies(trainer, *args)

    if trainer.ref_model is not None:
        return logps(trainer.ref_model, input_ids, attention_mask, logits_to_keep)[0]
    from trl.trainer.utils import use_adapter

    model = trainer.accelerator.unwrap_model(trainer.model)
    with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
        return logps(trainer.model, input_ids, attention_mask, logits_to_keep)[0]


@torch.no_grad()
def policy_logps_at_temperature(trainer, input_ids, attention_mask, logits_to_keep, *, temperature: float):
    """(b, t) policy log-probs of the last ``logits_to_keep`` tokens at ``temperature``, without gradient.

    TRL 1.16 fuses its training temperature into the model's forward (``add_fused_lm_head`` in ``GRPOTrainer.__init__``
    divides the logits by ``args.temperature`` inside the patched forward), so ``_get_per_token_logps_and_entropies``
    cannot score at another temperature. This takes the model's own logits (its unfused forward, ``fused_lm_head``
    left off: final-logit softcapping and logit scales as the model applies them), divides them by ``temperature`` and
    gathers the tokens' log-probs with TRL's ``selective_log_softmax``, as TRL's loss did before the fused head. One
    forward over the (b, t + 1, V) logits (a collective under FSDP / ZeRO-3, like TRL's). At the training temperature
    it equals TRL's own log-probs (``tests/test_trl_contract.py`` checks it)."""
    from trl.trainer.utils import selective_log_softmax

    with trainer.accelerator.autocast():
        logits = trainer.model(
            input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1
        ).logits  # (b, t + 1, V)
    return selective_log_softmax(logits[:, :-1].float(), input_ids[:, -logits_to_keep:], temperature=temperature)


def trl_policy_weight(trainer, *, logps, entropies, mask, inputs: dict, old_logps) -> torch.Tensor | None:
    """(B, T) the factor TRL 1.16's ``_compute_loss`` multiplies into its per-token policy loss (not the KL term),
    rebuilt with TRL's own methods from the same micro-batch: the entropy mask (``top_entropy_quantile``, a
    collective: every process calls it for every micro-batch, as TRL does), the off-policy sequence mask
    (``off_policy_mask_threshold``) and vLLM's importance-sampling ratio (not for ``loss_type="vespo"``, which uses it
    otherwise). None when none applies. Copied from ``_compute_loss`` (no hook returns it);
    ``tests/test_trl_contract.py::test_policy_weight_parity_with_trls_loss_gradient`` checks it against the gradient
    of TRL's own loss."""
    weight = None
    if trainer.top_entropy_quantile < 1.0:
        entropy_mask = trainer.get_high_entropy_mask(entropies.detach(), mask, 1 - trainer.top_entropy_quantile)
        weight = entropy_mask.to(logps.dtype)
    if trainer.off_policy_mask_threshold is not None:
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        off_policy = trainer.get_off_policy_mask(
            advantages=advantages,
            per_token_logps=logps,
            sampling_per_token_logps=inputs.get("sampling_per_token_logps", old_logps),
            mask=mask,
            off_policy_threshold=trainer.off_policy_mask_threshold,
        ).to(logps.dtype)
        weight = off_policy if weight is None else weight * off_policy
    if trainer.use_vllm and trainer.vllm_importance_sampling_correction and trainer.loss_type != "vespo":
        ratio = inputs["importance_sampling_ratio"].to(logps.dtype)
        weight = ratio if weight is None else weight * ratio
    return None if weight is None else weight.expand_as(mask).detach()


def prepare_scoring_model(model, accelerator, *, deepspeed: bool):
    """A frozen scoring model (a PRM) placed as TRL 1.16's ``GRPOTrainer.__init__`` places its reward models: under
    DeepSpeed wrapped by TRL's ``prepare_deepspeed`` (under ZeRO-3 ``from_pretrained`` has already partitioned it, and
    only the engine gathers its parameters for a forward), otherwise through accelerate's evaluation-mode
    ``prepare_model`` (under FSDP it is sharded like the policy). Under both its forwards are collectives."""
    if deepspeed:
        from trl.models import prepare_deepspeed

        return prepare_deepspeed(model, accelerator)
    return accelerator.prepare_model(model, evaluation_mode=True, device_placement=True)


def default_output_dir(model) -> str:
    """The ``output_dir`` TRL 1.16's ``GRPOTrainer`` gives a run started without ``args``: ``"<model name>-GRPO"``, the
    model's id without its owner (copied from ``GRPOTrainer.__init__``; ``tests/test_drop_in.py`` checks parity)."""
    from trl.trainer.utils import get_config_model_id

    model_name = model if isinstance(model, str) else get_config_model_id(model.config)
    return f"{model_name.split('/')[-1]}-GRPO"


#: Metrics TRL 1.16's GRPOTrainer logs that the plugin's dashboards and plots show beside its own.
TRL_METRICS = ("reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "clip_ratio/region_mean", "step_time")

#: The ``GRPOTrainer`` methods the plugin overrides (``adapter/hooks.py``, ``TRLHooks``).
OVERRIDDEN_HOOKS = (
    "_calculate_rewards",
    "_generate_and_score_completions",
    "_compute_loss",
    "_get_per_token_logps_and_entropies",
    "_save_checkpoint",
    "_load_optimizer_and_scheduler",
)

#: Every ``GRPOTrainer`` method and attribute trl_grpo_ext reads, writes or overrides (all in this adapter package,
#: most behind ``TrainerHost``). A TRL port reviews exactly these; ``tests/test_boundary.py`` checks the list is
#: complete and that each name exists in the installed TRL.
TRL_SURFACE = (
    *OVERRIDDEN_HOOKS,
    # transformers.Trainer methods a collapse rollback calls (restore_checkpoint below)
    "_load_from_checkpoint",
    # private methods and buffers it calls or edits
    "_dist",
    "_generate",
    "_log_completion_extra",
    "_log_metric",
    "_logs",
    "_metrics",
    "_step",
    "_buffered_inputs",
    "_tokenizer",
    "get_high_entropy_mask",
    "get_off_policy_mask",
    # attributes it reads (beta and the epsilons also written: KL control, KL-Cov without the PPO clip)
    "beta",
    "epsilon_low",
    "epsilon_high",
    "environments",
    "eos_token_ids",
    "generation_config",
    "loss_type",
    "mask_truncated_completions",
    "max_completion_length",
    "num_generations",
    "num_generations_eval",
    "off_policy_mask_threshold",
    "pad_to_multiple_of",
    "ref_model",
    "reward_func_names",
    "reward_funcs",
    "reward_weights",
    "scale_rewards",
    "temperature",
    "top_entropy_quantile",
    "use_vllm",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
)
#: Set by GRPOTrainer only in some modes (vLLM), read with ``getattr(..., None)``.
TRL_OPTIONAL_SURFACE = ("vllm_generation",)


def log_value(trainer, mode: str, name: str, value: float) -> None:
    """Buffer ``value`` under ``name`` in TRL's metrics of ``mode`` ("train" / "eval"), averaged at its next log."""
    trainer._metrics[mode][name].append(float(value))


def metric_values(trainer, mode: str, name: str) -> list:
    """The values TRL's ``GRPOTrainer`` buffered under ``name`` since its last log (``_metrics[mode][name]``, a list TRL
    replaces at each log); an empty list when there are none."""
    return trainer._metrics[mode].get(name, [])


def log_advantages(trainer, per_row: torch.Tensor) -> None:
    """Replace the advantages of the last N rows of TRL's completions table (``_logs["advantages"]``) by (N,)
    ``per_row``."""
    logged = trainer._logs["advantages"]
    for _ in range(min(per_row.numel(), len(logged))):
        logged.pop()
    logged.extend(per_row.tolist())


def zero_logged_advantages(trainer, rows: torch.Tensor) -> None:
    """The advantages TRL's completions table shows for this batch's ``rows`` ((N,) bool over every process's rows, the
    table's newest N) set to 0 (screened completions train with advantage 0)."""
    logged = trainer._logs["advantages"]
    count = min(rows.numel(), len(logged))
    tail = torch.tensor(list(logged)[len(logged) - count :], dtype=torch.float64)  # (count,) the table's newest
    log_advantages(trainer, tail.masked_fill(rows[rows.numel() - count :].cpu().bool(), 0.0))


def save_checkpoint(trainer) -> None:
    """Save a checkpoint of the trainer now (``transformers.Trainer._save_checkpoint``: weights, optimizer, scheduler,
    RNG and trainer state, and a ``GRPOExtTrainer``'s extension state), at ``checkpoint-<global step>``. A collective
    under DeepSpeed / FSDP: every process calls it."""
    trainer._save_checkpoint(trainer.model_wrapped if trainer.model_wrapped is not None else trainer.model, trial=None)


def discard_buffered_rollouts(trainer) -> None:
    """Drop the generation batch TRL buffered for the coming steps (``steps_per_generation`` > 1), so that the next
    training step generates afresh: after a rollback that continues, the buffered completions are the alarmed
    policy's. TRL 1.16's ``_prepare_inputs`` regenerates when ``_buffered_inputs`` is None (as after a resume)."""
    trainer._buffered_inputs = None


def restore_checkpoint(trainer, folder: str) -> None:
    """Load a checkpoint's weights, optimizer and scheduler (and a ``GRPOExtTrainer``'s extension state) into the
    running trainer, as ``transformers.Trainer`` (5.x) does when it resumes: DeepSpeed through its engine, FSDP into
    the wrapped model, otherwise into the model. The trainer's state (global step, log history) is kept: the record
    of what ran. A collective under DeepSpeed / FSDP: every process calls it."""
    if getattr(trainer, "is_deepspeed_enabled", False):
        from transformers.integrations.deepspeed import deepspeed_load_checkpoint

        deepspeed_load_checkpoint(trainer.model_wrapped, folder)
    elif getattr(trainer, "is_fsdp_enabled", False):
        trainer._load_from_checkpoint(folder, trainer.model_wrapped)
    else:
        trainer._load_from_checkpoint(folder)
    trainer._load_optimizer_and_scheduler(folder)


#: The PEFT adapter TRL 1.14-1.16 score the reference with where the model has one (``use_adapter(model, "ref")``
#: in ``_generate_and_score_completions``; TRL loads it itself when training starts from a pretrained adapter);
#: without it they disable the adapters, so the reference is the base model.
REFERENCE_ADAPTER = "ref"


def _peft_model(trainer):
    model = trainer.accelerator.unwrap_model(trainer.model)
    return model if isinstance(getattr(model, "peft_config", None), dict) else None


def _reference_adapter_pairs(model) -> tuple[list, list]:
    """(policy adapter parameters, reference adapter parameters), paired by name (``.ref.`` for ``.<active>.``)."""
    active = model.active_adapter
    params = dict(model.named_parameters())
    sources, targets = [], []
    for name, param in params.items():
        if f".{REFERENCE_ADAPTER}." not in name:
            continue
        source = params.get(name.replace(f".{REFERENCE_ADAPTER}.", f".{active}."))
        shape = getattr(param, "ds_shape", param.shape)
        if source is None or getattr(source, "ds_shape", source.shape) != shape:
            raise ValueError(
                f"ref_update='reset': the PEFT reference adapter '{REFERENCE_ADAPTER}' has a parameter {name} with no "
                f"counterpart of the same shape in the trained adapter '{active}', so the policy's adapter cannot be "
                f"copied into it. Fix: train without a '{REFERENCE_ADAPTER}' adapter of another configuration, or use "
                "ref_update='none'"
            )
        sources.append(source)
        targets.append(param)
    return sources, targets


def prepare_reference(trainer) -> bool:
    """Make TRL's reference one a reset can move; False where there is none (``beta == 0``).

    Without PEFT it is TRL's reference model. With PEFT TRL's reference is the adapter-disabled base model, which a
    reset cannot make the policy without merging the adapter into the base (and then every adapter checkpoint
    would miss it); so the reference becomes a frozen copy of the trained adapter under the name TRL 1.14-1.16
    score the reference with, ``"ref"``: created here as a copy of the adapter (a freshly initialised LoRA
    adapter is zero, so the reference is still the base model, exactly) unless TRL loaded one already (a
    pretrained adapter: TRL's own initial copy)."""
    if getattr(trainer, "ref_model", None) is not None:
        return True
    model = _peft_model(trainer)
    if model is None or trainer.beta == 0.0:
        return False
    if REFERENCE_ADAPTER not in model.peft_config:
        active = model.active_adapter
        if getattr(trainer.args, "use_vllm", False) and getattr(model.peft_config[active], "modules_to_save", None):
            raise ValueError(
                "ref_update='reset' with PEFT keeps the reference as a second adapter, and TRL's vLLM weight sync "
                "strips only the trained adapter's copies of modules_to_save (modules_to_save.default.*): the "
                "reference's copies would reach vLLM under names it does not have. Fix: train without modules_to_save "
                "in the LoRA config, or use_vllm=False, or ref_update='none'"
            )
        model.add_adapter(REFERENCE_ADAPTER, copy.deepcopy(model.peft_config[active]))
        model.set_adapter(active)  # peft keeps the active adapter; said here so no version changes it
        sources, targets = _reference_adapter_pairs(model)
        with torch.no_grad():
            for source, target in zip(sources, targets, strict=True):
                target.requires_grad_(False)
                target.copy_(source)
    else:
        _reference_adapter_pairs(model)  # checked now, not at the first reset
    return True


def reset_reference(trainer) -> bool:
    """Make TRL's reference the current policy (the weights copied in place; ``sync_ref_model`` at ``alpha = 1``,
    through TRL's own ``SyncRefModelCallback.sync_target_model``, which gathers the parameters under DeepSpeed
    ZeRO-3; under FSDP2 both are sharded alike and each process copies its own shards): TRL's reference model, or
    with PEFT the reference adapter :func:`prepare_reference` made (the trained adapter copied into it). A
    collective under ZeRO-3: every process calls it. Returns False where there is no reference."""
    from trl.trainer.callbacks import SyncRefModelCallback

    ref = getattr(trainer, "ref_model", None)
    if ref is not None:
        source, target = trainer.accelerator.unwrap_model(trainer.model), ref
    else:
        model = _peft_model(trainer)
        if model is None or REFERENCE_ADAPTER not in model.peft_config:
            return False
        sources, targets = _reference_adapter_pairs(model)
        source, target = torch.nn.ParameterList(sources), torch.nn.ParameterList(targets)
    with torch.no_grad():
        SyncRefModelCallback.sync_target_model(source, target, 1.0)
    return True


def reset_optimizer_moments(optimizer) -> int:
    """Zero every tensor of the optimizer's per-parameter state (Adam's moments) and its step counts, as a fresh
    optimizer would start: the wrappers accelerate and DeepSpeed put around a torch optimizer are unwrapped
    (``.optimizer``) to the one that holds ``state``. Returns how many parameters' states were reset."""
    inner = optimizer
    while not getattr(inner, "state", None) and getattr(inner, "optimizer", None) is not None:
        inner = inner.optimizer
    count = 0
    for state in getattr(inner, "state", {}).values():
        if not isinstance(state, dict):
            continue
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                value.zero_()
            elif key == "step" and isinstance(value, (int, float)):
                state[key] = type(value)(0)
        count += 1
    return count
