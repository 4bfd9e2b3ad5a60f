"""Rollouts made outside TRL's batch, and splicing them into it: the rollout room of the families.

AEPO's reference mode generates a batch's prompts again at another temperature, scores the samples with the same
reward functions, and puts the kept ones in place of the first rows of TRL's batch (:class:`Splice`); its term mode pads
them into chunks of its own (:func:`rollout_tensors`); dynamic sampling draws new prompts and splices whole groups.
Everything they do outside TRL's own batch is here:

- :class:`RolloutService`: the door to TRL for it (generation through TRL's ``_generate`` at another temperature,
  scoring through the trainer's reward functions, drawing training prompts, policy / reference log-probs, vLLM's
  importance-sampling ratio). A member names it as its ``rollouts`` service (a keyword-only
  constructor parameter); it is the only object of the families that touches TRL's generation;
- :func:`rollout_tensors`: a rollout padded as TRL pads its batch (prompts on the left, completions on the right,
  ``pad_to_multiple_of``, ``mask_truncated_completions``, tool / env masks, the sampler's log-probs);
- :func:`apply_splice`: those rows written over the first rows of TRL's generation output, every (B, T) entry widened
  to the wider width, the old / reference log-probs and vLLM importance-sampling ratio recomputed for them through
  the service (TRL's own methods), and ``num_items_in_batch`` recounted. Every process runs the same forwards whatever
  it splices (a process with nothing to splice runs them on one of its own rows): under FSDP / ZeRO-3 a forward is a
  collective.

The trainer builds the service and applies the :class:`Splice` a member returns (``GenerationUpdate.splice``) through
:func:`apply_splice`, the one generic path; it holds no code of AEPO's or dynamic sampling's.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from trl import GRPOTrainer

from ..api import Rollout, Splice
from .compat import (
    combined_rewards,
    policy_logps_at_temperature,
    reference_logps,
    vllm_importance_sampling_ratio,
)

logger = logging.getLogger(__name__)


class RolloutService:
    """Generation, scoring and forwards outside TRL's own batch, through the trainer's TRL 1.16 methods: the
    ``rollouts`` service of the members that name it (AEPO, dynamic sampling).

    TRL 1.16 surface used here (declared in ``compat.TRL_SURFACE``, pinned by ``tests/test_trl_contract.py``):
    ``_generate``, ``_calculate_rewards``, ``_get_per_token_logps_and_entropies``, ``_metrics``, ``_tokenizer``,
    ``generation_config``, ``vllm_generation``, ``use_vllm``, ``vllm_importance_sampling_*``, ``reward_weights``,
    ``eos_token_ids``, ``pad_to_multiple_of``, ``mask_truncated_completions``, and the ``ref_model`` through
    :func:`~trl_grpo_ext.adapter.compat.reference_logps`.

    Args:
        trainer: the ``GRPOTrainer`` whose model, reward functions and dataset the rollouts use.
        estimator: gives the run's advantage estimator (or None), read at each call (the trainer builds the members
            after the service); :meth:`group_advantages` asks it.
        receiver: checks what they return (``trl_grpo_ext.families.contracts.Receiver``), or None.
    """

    def __init__(self, trainer, estimator: Callable[[], Any] = lambda: None, receiver=None):
        self._trainer = trainer
        self._estimator = estimator
        self._receiver = receiver  # the trainer's check of member outputs (families.contracts.Receiver), or None
        self._stream = None  # this process's position in a streaming train_dataset (draw_prompts)

    # ------------------------------------------------------------------ how TRL pads and ends its rows
    @property
    def device(self) -> torch.device:
        return self._trainer.accelerator.device

    @property
    def pad_token_id(self) -> int:
        return self._trainer._tokenizer.pad_token_id

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self._trainer.eos_token_ids)

    @property
    def pad_to_multiple_of(self) -> int | None:
        return self._trainer.pad_to_multiple_of

    @property
    def mask_truncated_completions(self) -> bool:
        return bool(self._trainer.mask_truncated_completions)

    def truncated(self, completion_ids: list[list[int]]) -> list[bool]:
        """Per row, whether the completion stopped without EOS or pad (TRL's ``mask_truncated_completions`` test)."""
        ends = {*self.eos_token_ids, self.pad_token_id}
        return [not ids or ids[-1] not in ends for ids in completion_ids]

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a tensor of every process along dim 0."""
        return self._trainer.accelerator.gather(tensor)

    def tensors(self, rollout: Rollout) -> dict[str, torch.Tensor]:
        """``rollout`` padded as TRL pads its batch (:func:`rollout_tensors`)."""
        return rollout_tensors(rollout, self)

    # ------------------------------------------------------------------ generation and scoring
    def regenerate(self, prompts: list, *, temperature: float) -> Rollout:
        """Generate the prompts again through TRL's ``_generate`` at another sampling temperature (transformers or
        vLLM), leaving TRL's completion metrics and token counters as they were.

        ``prompts`` come in TRL's order: each prompt ``num_generations`` times in a row (vLLM's server mode generates
        every ``num_generations``-th prompt ``num_generations`` times; colocated vLLM and transformers each row once).
        Under vLLM the weights are those TRL pushed for this step (TRL pushes them at its first generation of an
        optimizer step; a regeneration in the same step reuses them), and ``Rollout.logprobs`` are vLLM's at
        ``temperature``."""
        trainer = self._trainer
        saved_metrics = {k: list(v) for k, v in trainer._metrics["train"].items()}
        saved_tokens = trainer.state.num_input_tokens_seen
        config = getattr(trainer, "generation_config", None)
        vllm = getattr(trainer, "vllm_generation", None)
        old = (config.temperature if config is not None else None, getattr(vllm, "temperature", None))
        try:
            if config is not None:
                config.temperature = temperature
            if vllm is not None:
                vllm.temperature = temperature
            prompt_ids, completion_ids, tool_mask, completions, logprobs, _, _, _ = trainer._generate(prompts)
        finally:
            if config is not None:
                config.temperature = old[0]
            if vllm is not None:
                vllm.temperature = old[1]
            trainer._metrics["train"].clear()
            trainer._metrics["train"].update(saved_metrics)
            trainer.state.num_input_tokens_seen = saved_tokens
        return Rollout(prompt_ids, completion_ids, tool_mask, completions, logprobs, temperature)

    def draw_prompts(self, count: int, generator: torch.Generator) -> list[dict[str, Any]]:
        """``count`` rows of the training dataset: from a map-style dataset drawn uniformly (with replacement) by
        ``generator``; from a streaming one (an ``IterableDataset``, which cannot be indexed) the stream's next rows,
        this process's share of it (every ``num_processes``-th row, from its rank), restarting the stream when it ends
        (its position is not checkpointed: a resumed run starts it again). ``ValueError`` naming the fix when there is
        no dataset or it is empty."""
        dataset = self._trainer.train_dataset
        if dataset is None:
            raise ValueError(
                "there is no train_dataset to draw new prompts from (refill='dynamic_sampling' refills groups with "
                "the dataset's prompts; an environment_factory that owns the data has none). Fix: pass a "
                "train_dataset, or use refill='none' with sample_filter='nonzero_std'."
            )
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            return self._stream_rows(dataset, count)
        if len(dataset) == 0:
            raise ValueError("train_dataset is empty: there are no prompts to draw. Fix: pass a non-empty dataset.")
        picks = torch.randint(len(dataset), (count,), generator=generator, device=generator.device).tolist()
        return [dataset[i] for i in picks]

    def _stream_rows(self, dataset, count: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        restarted = False
        while len(rows) < count:
            if self._stream is None:
                accelerator = self._trainer.accelerator
                self._stream = itertools.islice(
                    iter(dataset), accelerator.process_index, None, accelerator.num_processes
                )
            try:
                rows.append(next(self._stream))
                restarted = False
            except StopIteration:
                if restarted:
                    raise ValueError(
                        "train_dataset (a stream) holds no row for this process: there are no prompts to draw. Fix: "
                        "pass a non-empty dataset."
                    ) from None
                self._stream, restarted = None, True
        return rows

    def score(self, inputs: list[dict], prompts: list, completions: list, completion_ids: list) -> torch.Tensor:
        """(N,) weighted reward sum of all processes' rows (NaN where unscorable): :meth:`score_rows`' first part."""
        return self.score_rows(inputs, prompts, completions, completion_ids)[0]

    def score_rows(
        self, inputs: list[dict], prompts: list, completions: list, completion_ids: list
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(N,) weighted reward sum and (N, F) reward per function of all processes' rows (NaN where unscorable), by
        the trainer's reward functions (TRL's own ``GRPOTrainer._calculate_rewards``, not the plugin's override: no
        re-entry into the hooks; then the same checks and errors as TRL's own batch, ``ext_on_rewards``; a
        collective)."""
        trainer = self._trainer
        rewards_per_func = GRPOTrainer._calculate_rewards(trainer, inputs, prompts, completions, completion_ids)
        trainer.ext_on_rewards(rewards_per_func)
        return combined_rewards(rewards_per_func, trainer.reward_weights), rewards_per_func

    def group_advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        """(n,) advantages of whole groups scored outside TRL's batch, from their (n,) rewards: the advantage
        estimator's ``group_advantages``; ``ValueError`` where it gives none (PRM needs step rewards)."""
        member = self._estimator()
        advantages = None if member is None else member.group_advantages(rewards, group_size)
        if member is not None and self._receiver is not None:
            advantages = self._receiver.group_advantages(member, advantages, rows=rewards.numel())
        if advantages is not None:
            return advantages
        raise ValueError(
            f"advantage_estimator={getattr(self._trainer.args, 'advantage_estimator', None)!r} cannot give "
            "advantages to groups scored outside TRL's batch from their rewards alone"
        )

    # ------------------------------------------------------------------ forwards
    def policy_logps(self, chunk: dict[str, torch.Tensor], *, compute_entropy: bool = False):
        """(b, t) log-probs (with gradient when enabled) and entropies (or None) of a chunk's completions under the
        policy, through TRL's own ``GRPOTrainer._get_per_token_logps_and_entropies`` (at the training temperature; not
        the plugin's override, which would act on the micro-batch's loss context)."""
        trainer = self._trainer
        logps, entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, trainer.model, *_forward_inputs(chunk), compute_entropy=compute_entropy
        )
        return logps, entropies

    def reference_logps(self, chunk: dict[str, torch.Tensor]) -> torch.Tensor:
        """(b, t) log-probs of a chunk's completions under TRL's reference model (its ``ref_model``, or the PEFT base /
        "ref" adapter), as TRL computes its batch's ``ref_per_token_logps``."""
        return reference_logps(self._trainer, *_forward_inputs(chunk))

    def vllm_is_ratio(
        self,
        chunk: dict[str, torch.Tensor],
        sampling_logps: torch.Tensor,
        mask: torch.Tensor,
        *,
        old_logps: torch.Tensor,
        temperature: float | None = None,
    ) -> torch.Tensor | None:
        """TRL's vLLM importance-sampling ratio for a chunk's (b, t) tokens, or None when that correction is off.

        TRL divides the trainer's probability of each sampled token by vLLM's, both at the temperature the token was
        sampled at (for its own rows the training temperature: ``old_logps``): the ratio corrects the engines'
        mismatch, not a choice of distribution. Rows sampled at another ``temperature`` (AEPO's) are compared the same
        way, with the trainer's log-probs at *their* temperature (one more forward), so that the correction does not
        undo the temperature change the member makes on purpose. That forward is a collective under FSDP / ZeRO-3:
        call this on every process alike.
        """
        trainer = self._trainer
        if not (trainer.use_vllm and trainer.vllm_importance_sampling_correction):
            return None
        if temperature is not None and temperature != trainer.temperature:
            old_logps = policy_logps_at_temperature(trainer, *_forward_inputs(chunk), temperature=temperature)
        return vllm_importance_sampling_ratio(
            old_logps,
            sampling_logps,
            mask,
            mode=trainer.vllm_importance_sampling_mode,
            clip_min=trainer.args.vllm_importance_sampling_clip_min,
            clip_max=trainer.args.vllm_importance_sampling_clip_max,
        )


#: Keys of TRL 1.16's generation output for multimodal batches: a splice cannot rebuild them for new rows.
MULTIMODAL_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "pixel_attention_mask",
    "spatial_shapes",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
    "num_images",
)
#: Every (B, T) entry of TRL's generation output and the value its padding holds.
TOKEN_LEVEL_PADS = {
    "completion_ids": None,  # the tokenizer's pad id
    "completion_mask": 0,
    "tool_mask": 1,
    "old_per_token_logps": 0,
    "ref_per_token_logps": 0,
    "sampling_per_token_logps": 0,
}


def _forward_inputs(chunk: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A chunk's (b, p + t) input ids and attention mask and its completion width t (TRL's log-prob arguments)."""
    input_ids = torch.cat([chunk["prompt_ids"], chunk["completion_ids"]], dim=1)
    attention_mask = torch.cat([chunk["prompt_mask"], chunk["completion_mask"]], dim=1)
    return input_ids, attention_mask, chunk["completion_ids"].size(1)


def _round_up(width: int, multiple: int | None) -> int:
    return width if not multiple else -(-width // multiple) * multiple


def _pad_to(row: torch.Tensor, width: int, value, *, left: bool = False) -> torch.Tensor:
    """A 1-D ``row`` padded with ``value`` to ``width`` (on the left for TRL's prompts)."""
    pad = row.new_full((width - row.numel(),), value)
    return torch.cat([pad, row]) if left else torch.cat([row, pad])


def widen(tensor: torch.Tensor, width: int, value, *, left: bool = False) -> torch.Tensor:
    """(B, T) ``tensor`` padded with ``value`` to (B, width) (on the left for TRL's prompts)."""
    if tensor.size(1) >= width:
        return tensor
    pad = tensor.new_full((tensor.size(0), width - tensor.size(1)), value)
    return torch.cat([pad, tensor], dim=1) if left else torch.cat([tensor, pad], dim=1)


def rollout_tensors(rollout: Rollout, rollouts: RolloutService) -> dict[str, torch.Tensor]:
    """A rollout as TRL pads its batch: ``prompt_ids`` / ``prompt_mask`` (b, p) left-padded, ``completion_ids`` /
    ``completion_mask`` (b, t) right-padded, ``completion_mask`` 0 on a truncated row under
    ``mask_truncated_completions``; ``tool_mask`` (b, t) when the rollout has one; ``sampling_logps`` (b, t) when it has
    the sampler's log-probs (NaN where missing); widths rounded up to ``pad_to_multiple_of``; on the run's device."""
    pad_id, multiple = rollouts.pad_token_id, rollouts.pad_to_multiple_of
    prompts = [torch.tensor(ids, dtype=torch.long) for ids in rollout.prompt_ids]
    lengths = [len(ids) for ids in rollout.completion_ids]
    p_width = _round_up(max(len(p) for p in prompts), multiple)
    t_width = _round_up(max(max(lengths), 1), multiple)
    truncated = [rollouts.mask_truncated_completions and cut for cut in rollouts.truncated(rollout.completion_ids)]
    out = {
        "prompt_ids": torch.stack([_pad_to(p, p_width, pad_id, left=True) for p in prompts]),
        "prompt_mask": torch.stack([_pad_to(torch.ones_like(p), p_width, 0, left=True) for p in prompts]),
        "completion_ids": torch.stack(
            [_pad_to(torch.tensor(ids, dtype=torch.long), t_width, pad_id) for ids in rollout.completion_ids]
        ),
        "completion_mask": torch.stack(
            [
                _pad_to(torch.full((n,), 0 if cut else 1, dtype=torch.long), t_width, 0)
                for n, cut in zip(lengths, truncated, strict=True)
            ]
        ),
    }
    if rollout.tool_mask is not None:
        out["tool_mask"] = torch.stack(
            [
                _pad_to(torch.tensor(m[:n], dtype=torch.long) * (0 if cut else 1), t_width, 1)
                for m, n, cut in zip(rollout.tool_mask, lengths, truncated, strict=True)
            ]
        )
    if rollout.logprobs is not None:
        rows = [
            torch.tensor([math.nan if x is None else float(x) for x in lp[:n]], dtype=torch.float32)
            for lp, n in zip(rollout.logprobs, lengths, strict=True)
        ]
        out["sampling_logps"] = torch.stack([_pad_to(r, t_width, 0.0) for r in rows])
    return {key: value.to(rollouts.device) for key, value in out.items()}


def place_splices(splices: list[Splice], batch_rows: int, *, taken: Iterable[int] = ()) -> list[Splice]:
    """The splices of one generation batch, in the order the members returned them, each with its target rows fixed:
    a splice with explicit ``rows`` keeps them; one without (AEPO's "first rows") takes the first rows that neither
    ``taken`` (the rows a refill already put new samples in) nor an earlier splice writes or copies onto, so it never
    overwrites a group another member just put in place. Samples beyond the free rows are dropped, with a warning
    (every splice is still returned: applying one is a collective)."""
    taken = set(taken)
    placed = []
    for splice in splices:
        if splice.rows is None:
            count = len(splice.rollout.completion_ids)
            free = [row for row in range(batch_rows) if row not in taken][:count]
            if len(free) < count:
                logger.warning(
                    "A splice of %d samples found %d rows of this batch not already replaced by another member's "
                    "splice: %d of its samples are dropped.",
                    count,
                    len(free),
                    count - len(free),
                )
            kept = len(free)  # all of them unless the batch ran out of free rows
            splice = dataclasses.replace(
                splice,
                rows=free,
                rollout=splice.rollout.select(list(range(kept))),
                advantages=None if splice.advantages is None else splice.advantages[:kept],
            )
        taken.update(splice.written_rows)
        placed.append(splice)
    return placed


@torch.no_grad()
def apply_splice(out: dict[str, Any], splice: Splice, rollouts: RolloutService, *, keep_key: str) -> None:
    """Put ``splice.rollout`` in place of this process's first rows (or ``splice.rows``) of TRL's generation output
    ``out`` (in place).

    The new rows are padded as TRL pads (:func:`rollout_tensors`); their old log-probs (when TRL keeps them), reference
    log-probs (when ``beta != 0``) and vLLM importance-sampling ratio are computed with TRL's own methods through
    ``rollouts``, and ``num_items_in_batch`` is recounted like TRL's. ``keep_key``: the sample filter's per-row keep
    flag (spliced rows train).
    """
    multimodal = [key for key in MULTIMODAL_KEYS if key in out]
    if multimodal:
        raise ValueError(
            f"entropy_control='aepo' with aepo_mode='splice' cannot put its samples into a multimodal batch (TRL's "
            f"batch carries {multimodal}, which a splice cannot rebuild for new rows). Fix: set "
            "GRPOExtConfig.entropy_control='none' for image inputs."
        )
    rows = len(splice.rollout.completion_ids)
    batch_rows = out["completion_ids"].size(0)
    targets = list(range(rows)) if splice.rows is None else list(splice.rows)
    if rows > batch_rows or any(not 0 <= r < batch_rows for r in targets):
        raise RuntimeError(f"a splice of {rows} rows at {targets} into a batch of {batch_rows}")
    device = out["completion_ids"].device
    if splice.copies:
        src = torch.tensor([a for a, _ in splice.copies], dtype=torch.long, device=device)
        dst = torch.tensor([b for _, b in splice.copies], dtype=torch.long, device=device)
        for value in out.values():  # every per-row entry of TRL's batch
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.size(0) == batch_rows:
                value[dst] = value[src]
    idx = torch.tensor(targets, dtype=torch.long, device=device)  # (rows,)
    pad_id = rollouts.pad_token_id
    new = None
    if rows:
        new = rollout_tensors(splice.rollout, rollouts)
        p_width = max(out["prompt_ids"].size(1), new["prompt_ids"].size(1))
        t_width = max(out["completion_ids"].size(1), new["completion_ids"].size(1))
        for key, value in (("prompt_ids", pad_id), ("prompt_mask", 0)):
            out[key] = widen(out[key], p_width, value, left=True)
            out[key][idx] = widen(new[key], p_width, value, left=True)
        for key, value in TOKEN_LEVEL_PADS.items():  # every (B, T) entry of TRL's batch, to the wider width
            if key in out:
                out[key] = widen(out[key], t_width, pad_id if value is None else value)
        out["completion_ids"][idx] = widen(new["completion_ids"], t_width, pad_id)
        out["completion_mask"][idx] = widen(new["completion_mask"], t_width, 0)
        if "tool_mask" in out or "tool_mask" in new:
            if "tool_mask" not in out:
                out["tool_mask"] = torch.ones_like(out["completion_mask"])
            tool = new.get("tool_mask", torch.ones_like(new["completion_mask"]))
            out["tool_mask"][idx] = widen(tool, t_width, 1)
        advantages = out["advantages"]
        per_row = (
            torch.full((rows,), float(splice.advantage), dtype=advantages.dtype, device=advantages.device)
            if splice.advantages is None
            else splice.advantages.to(device=advantages.device, dtype=advantages.dtype)
        )  # (rows,)
        if advantages.dim() == 2:
            advantages = widen(advantages, t_width, 0.0)
            advantages[idx] = per_row.unsqueeze(1) * out["completion_mask"][idx].to(advantages.dtype)
        else:
            advantages[idx] = per_row
        out["advantages"] = advantages
        if keep_key in out:
            out[keep_key][idx] = True
    # Forwards are collectives under FSDP / ZeRO-3 (parameters are gathered layer by layer): every process runs the
    # same ones whatever its splice holds, a process with nothing to splice on one of its own rows, result unused.
    forward_idx = idx if rows else torch.zeros(1, dtype=torch.long, device=device)
    chunk = {key: out[key][forward_idx] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    if "old_per_token_logps" in out:  # TRL keeps them when the batch is reused off-policy (or for vLLM IS)
        out["old_per_token_logps"][idx] = rollouts.policy_logps(chunk)[0][:rows]
    if "ref_per_token_logps" in out:
        out["ref_per_token_logps"][idx] = rollouts.reference_logps(chunk)[:rows]
    width = out["completion_ids"].size(1)
    if rows and "sampling_per_token_logps" in out:
        sampling = new.get("sampling_logps")
        if sampling is None:
            sampling = torch.full_like(new["completion_mask"], math.nan, dtype=torch.float32)
        out["sampling_per_token_logps"][idx] = widen(sampling, width, 0.0).to(out["sampling_per_token_logps"].dtype)
    if "importance_sampling_ratio" in out:  # on every process (its forward at another temperature is a collective)
        old = out["old_per_token_logps"][forward_idx]
        mask = out["completion_mask"][forward_idx] * out.get("tool_mask", out["completion_mask"])[forward_idx]
        new_ratio = rollouts.vllm_is_ratio(
            chunk,
            out["sampling_per_token_logps"][forward_idx],
            mask.to(old.dtype),
            old_logps=old,
            temperature=splice.rollout.temperature,
        )
        if rows:
            ratio = out["importance_sampling_ratio"]
            if ratio.size(1) > 1:
                ratio = widen(ratio, width, 1.0)
            ratio[idx] = new_ratio[:rows].to(ratio.dtype)
            out["importance_sampling_ratio"] = ratio
    loss_mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
    out["num_items_in_batch"] = rollouts.gather(loss_mask.sum()).sum()


__all__ = [
    "MULTIMODAL_KEYS",
    "Rollout",
    "RolloutService",
    "Splice",
    "apply_splice",
    "place_splices",
    "rollout_tensors",
    "widen",
]
