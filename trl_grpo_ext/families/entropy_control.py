"""``entropy_control: aepo``: hold policy entropy at a target (Arbitrary Entropy Policy Optimization)."""

from __future__ import annotations

import logging
import math
import time

import torch
from torch.nn.utils.rnn import pad_sequence

from ..core.aepo import aepo_per_token_loss, aepo_select, aepo_temperature, high_entropy_mask
from ..core.state import state_number
from .base import ENTROPY_CONTROLS, Extension, GenerationBatch, LossContext, Off

logger = logging.getLogger(__name__)

ENTROPY_CONTROLS.register("none")(Off)


@ENTROPY_CONTROLS.register("aepo")
class AEPO(Extension):
    """AEPO (arXiv 2510.08141) on top of whatever GRPO loss runs.

    Per training generation batch:

    1. ``T = aepo_temperature_high`` if the previous optimizer step's global mean token entropy is under
       ``aepo_target_entropy``, else ``aepo_temperature_low`` (every process reads the same all-reduced value);
    2. the same prompts are generated again at T through TRL's own ``_generate`` (transformers or vLLM), scored by the
       same reward functions; TRL's completion metrics are left untouched by this extra generation;
    3. samples whose group advantage exceeds ``aepo_adv_threshold`` get advantage 1; at most ``aepo_max_samples``
       (half as many when entropy is above target) are kept, drawn with a generator seeded identically on every rank;
    4. their REINFORCE term ``aepo_coef * mean_tokens(-exp(logp - old_logp))`` (old log-probs from the policy before
       the update, at the training temperature) is added to the loss, the kept samples split into
       ``steps_per_generation`` chunks of a fixed size, so TRL's batch, shuffling and gathers are untouched.

    The term honours the masks TRL applies to its own loss: tool-response / ``env_mask`` tokens returned by
    ``_generate`` (``tools=``, a ``rollout_func``) and truncated completions under ``mask_truncated_completions`` train
    nothing; under ``top_entropy_quantile < 1`` only the highest-entropy fraction of the AEPO samples' own tokens train
    (quantile over this process's AEPO tokens); with vLLM's ``vllm_importance_sampling_correction`` the term is
    multiplied by the same importance-sampling ratio TRL computes (vLLM's sampling log-probs vs the training model's).
    TRL's ``off_policy_mask_threshold`` keeps every sequence with a non-negative advantage, so it keeps every AEPO
    sample (advantage 1). ``environment_factory`` is refused (the regeneration would step environments TRL already
    reset and stepped for this batch).

    Logs ``aepo/temperature``, ``aepo/entropy``, ``aepo/entropy_gap``, ``aepo/samples_used``, ``aepo/positive_frac``,
    ``aepo/extra_gen_time`` (seconds of the extra generation and scoring) and ``aepo/loss``.
    """

    metrics = ("aepo/temperature", "aepo/samples_used", "aepo/positive_frac", "aepo/extra_gen_time")
    example_config = {"aepo_adv_threshold": 0.0}
    docs = "aepo.md"

    def __init__(self, host):
        super().__init__(host)
        args = self.args
        if args.use_vllm and args.vllm_mode == "colocate" and args.vllm_enable_sleep_mode:
            # Sleep level 2 discards vLLM's weights after every generate: AEPO's second generation of the batch must
            # push them again (in server mode, or colocated without sleep, the same step's weights are not re-sent).
            logger.warning(
                "entropy_control='aepo' with vllm_enable_sleep_mode: every generation batch pushes the weights to "
                "vLLM twice (TRL's generation, then AEPO's regeneration), because sleep mode discards them after each "
                "generate. Turn vllm_enable_sleep_mode off if memory allows."
            )
        self.last_entropy: float | None = None
        self.temperature: float | None = None
        self._chunks: list[dict[str, torch.Tensor]] = []
        self._window: torch.Tensor | None = None

    # ------------------------------------------------------------------ generation side
    def on_generation(self, batch: GenerationBatch) -> None:
        if batch.mode != "train":
            return
        args, host = self.args, self.host
        start = time.perf_counter()
        temperature = aepo_temperature(
            self.last_entropy,
            target=args.aepo_target_entropy,
            temperature_high=args.aepo_temperature_high,
            temperature_low=args.aepo_temperature_low,
        )
        self.temperature = temperature
        rollout = host.regenerate(batch.prompts, temperature=temperature)
        rewards = host.score(batch.inputs, batch.prompts, rollout.completions, rollout.completion_ids)  # (N,)
        below = self.last_entropy is not None and self.last_entropy < args.aepo_target_entropy
        cap = args.aepo_max_samples if below else max(args.aepo_max_samples // 2, 1)
        generator = host.generator("aepo", per_rank=False, device=rewards.device)
        keep = aepo_select(
            rewards, batch.group_size, adv_threshold=args.aepo_adv_threshold, max_samples=cap, generator=generator
        )
        local = keep[batch.process_slice].nonzero().flatten().tolist()
        self._chunks = self._build_chunks(
            rollout.prompt_ids, rollout.completion_ids, local, tool_mask=rollout.tool_mask, logprobs=rollout.logprobs
        )
        elapsed = time.perf_counter() - start
        positive = float((keep.float().sum() / max(keep.numel(), 1)).item())
        self.log_metric("train", "aepo/temperature", temperature)
        self.log_metric("train", "aepo/samples_used", float(keep.sum()))
        self.log_metric("train", "aepo/positive_frac", positive)
        self.log_metric("train", "aepo/extra_gen_time", elapsed)
        if self.last_entropy is not None:
            self.log_metric("train", "aepo/entropy", self.last_entropy)
            self.log_metric("train", "aepo/entropy_gap", self.last_entropy - args.aepo_target_entropy)

    def _row_mask(self, completion_ids: list[int], tool_mask: list[int] | None) -> torch.Tensor:
        """(t,) loss mask of one AEPO sample: TRL's tool / env mask, and 0 everywhere for a truncated completion
        under ``mask_truncated_completions`` (as TRL masks its own)."""
        if not completion_ids:
            return torch.zeros(1, dtype=torch.long)
        mask = torch.ones(len(completion_ids), dtype=torch.long)
        if tool_mask is not None:
            mask = mask * torch.tensor(tool_mask[: len(completion_ids)], dtype=torch.long)
        if self.args.mask_truncated_completions:
            ends = {*self.host.eos_token_ids, self.host.pad_token_id}
            if completion_ids[-1] not in ends:
                mask = torch.zeros_like(mask)
        return mask

    @torch.no_grad()
    def _build_chunks(
        self, prompt_ids, completion_ids, rows: list[int], *, tool_mask=None, logprobs=None
    ) -> list[dict[str, torch.Tensor]]:
        """Split the kept samples into steps_per_generation micro-chunks of one fixed size (padding rows masked)."""
        host = self.host
        spg = self.args.steps_per_generation
        device = host.device
        size = max(1, math.ceil(len(rows) / spg))
        pad_id = host.pad_token_id
        chunks = []
        for k in range(spg):
            part = rows[k * size : (k + 1) * size]
            if not part:
                chunks.append({})
                continue
            prompts = [torch.tensor(prompt_ids[i]) for i in part]
            comps = [torch.tensor(completion_ids[i] or [pad_id]) for i in part]
            p_ids = pad_sequence([p.flip(0) for p in prompts], batch_first=True, padding_value=pad_id).flip(1)
            p_mask = pad_sequence([torch.ones_like(p).flip(0) for p in prompts], batch_first=True).flip(1)
            c_ids = pad_sequence(comps, batch_first=True, padding_value=pad_id)
            # Attention covers every completion token; the loss mask drops tool / env tokens and masked rows.
            c_mask = pad_sequence(
                [
                    torch.ones(len(completion_ids[i]), dtype=torch.long)
                    if completion_ids[i]
                    else torch.zeros(1, dtype=torch.long)
                    for i in part
                ],
                batch_first=True,
            )
            loss_mask = pad_sequence(
                [self._row_mask(completion_ids[i], None if tool_mask is None else tool_mask[i]) for i in part],
                batch_first=True,
            )
            chunk = {
                "prompt_ids": p_ids.to(device),
                "prompt_mask": p_mask.to(device),
                "completion_ids": c_ids.to(device),
                "completion_mask": c_mask.to(device),
                "loss_mask": loss_mask.to(device),
            }
            chunk["old_logps"] = host.policy_logps(chunk)[0].detach()
            if logprobs is not None:
                sampling = pad_sequence(
                    [torch.tensor([math.nan if x is None else float(x) for x in (logprobs[i] or [0.0])]) for i in part],
                    batch_first=True,
                ).to(device)
                ratio = host.vllm_is_ratio(
                    chunk["old_logps"],
                    sampling.to(chunk["old_logps"].dtype),
                    chunk["loss_mask"].to(chunk["old_logps"].dtype),
                )
                if ratio is not None:
                    chunk["is_ratio"] = ratio
            chunks.append(chunk)
        return chunks

    # ------------------------------------------------------------------ loss side
    def extra_loss(self, ctx: LossContext) -> torch.Tensor | None:
        if ctx.mode != "train" or not self._chunks:
            return None
        chunk = self._chunks[self.host.micro_step % len(self._chunks)]
        if not chunk:
            return None
        quantile = self.host.top_entropy_quantile
        logps, entropies = self.host.policy_logps(chunk, compute_entropy=quantile < 1.0)  # (b, t)
        mask = chunk["loss_mask"]
        if quantile < 1.0:
            mask = high_entropy_mask(entropies.detach(), mask, quantile=quantile)
        mask = mask.to(logps.dtype)
        per_token = aepo_per_token_loss(logps, chunk["old_logps"])
        if "is_ratio" in chunk:
            per_token = per_token * chunk["is_ratio"]
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
        loss = self.args.aepo_coef * loss / self.host.accumulation_steps
        self.log_metric("train", "aepo/loss", float(loss.detach()))
        return loss

    def after_loss(self, ctx: LossContext) -> None:
        if ctx.mode != "train" or ctx.entropies is None:
            return
        mask = ctx.mask.to(ctx.entropies.dtype)
        stats = torch.stack([(ctx.entropies.detach() * mask).sum(), mask.sum()])
        self._window = stats if self._window is None else self._window + stats
        if self.host.step_end:
            total, count = self.host.collectives.all_sum(self._window.float()).tolist()
            self._window = None
            if count > 0:
                self.last_entropy = total / count

    def state_dict(self):
        return {"last_entropy": self.last_entropy, "temperature": self.temperature}

    def load_state_dict(self, state):
        self.last_entropy = state_number(state, "last_entropy", low=0.0, optional=True)
        self.temperature = state_number(state, "temperature", low=0.0, low_open=True, optional=True)
