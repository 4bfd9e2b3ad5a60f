"""``entropy_control: aepo``: hold policy entropy at a target (Arbitrary Entropy Policy Optimization)."""

from __future__ import annotations

import math
import time

import torch
from torch.nn.utils.rnn import pad_sequence

from ..core.aepo import aepo_per_token_loss, aepo_select, aepo_temperature
from ..core.state import state_number
from ..trl_compat import combined_rewards
from .base import ENTROPY_CONTROLS, Extension, GenerationBatch, LossContext

ENTROPY_CONTROLS.register("none")(None)


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

    Logs ``aepo/temperature``, ``aepo/entropy``, ``aepo/entropy_gap``, ``aepo/samples_used``, ``aepo/positive_frac``,
    ``aepo/extra_gen_time`` (seconds of the extra generation and scoring) and ``aepo/loss``.
    """

    def __init__(self, trainer):
        super().__init__(trainer)
        self.last_entropy: float | None = None
        self.temperature: float | None = None
        self._chunks: list[dict[str, torch.Tensor]] = []
        self._window: torch.Tensor | None = None

    # ------------------------------------------------------------------ generation side
    def _generate_at(self, temperature: float, prompts):
        trainer = self.trainer
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
            return trainer._generate(prompts)
        finally:
            if config is not None:
                config.temperature = old[0]
            if vllm is not None:
                vllm.temperature = old[1]
            trainer._metrics["train"].clear()
            trainer._metrics["train"].update(saved_metrics)
            trainer.state.num_input_tokens_seen = saved_tokens

    def on_generation(self, batch: GenerationBatch) -> None:
        if batch.mode != "train":
            return
        args, trainer = self.args, self.trainer
        start = time.perf_counter()
        temperature = aepo_temperature(
            self.last_entropy,
            target=args.aepo_target_entropy,
            temperature_high=args.aepo_temperature_high,
            temperature_low=args.aepo_temperature_low,
        )
        self.temperature = temperature
        prompt_ids, completion_ids, _, completions, _, _, _, _ = self._generate_at(temperature, batch.prompts)
        rewards_per_func = trainer._calculate_rewards(batch.inputs, batch.prompts, completions, completion_ids)
        rewards = combined_rewards(rewards_per_func, trainer.reward_weights)  # (N,) all processes
        below = self.last_entropy is not None and self.last_entropy < args.aepo_target_entropy
        cap = args.aepo_max_samples if below else max(args.aepo_max_samples // 2, 1)
        generator = trainer.ext_generator("aepo", per_rank=False, device=rewards.device)
        keep = aepo_select(
            rewards, batch.group_size, adv_threshold=args.aepo_adv_threshold, max_samples=cap, generator=generator
        )
        local = keep[batch.process_slice].nonzero().flatten().tolist()
        self._chunks = self._build_chunks(prompt_ids, completion_ids, local)
        elapsed = time.perf_counter() - start
        positive = float((keep.float().sum() / max(keep.numel(), 1)).item())
        self.log_metric("train", "aepo/temperature", temperature)
        self.log_metric("train", "aepo/samples_used", float(keep.sum()))
        self.log_metric("train", "aepo/positive_frac", positive)
        self.log_metric("train", "aepo/extra_gen_time", elapsed)
        if self.last_entropy is not None:
            self.log_metric("train", "aepo/entropy", self.last_entropy)
            self.log_metric("train", "aepo/entropy_gap", self.last_entropy - args.aepo_target_entropy)

    @torch.no_grad()
    def _build_chunks(self, prompt_ids, completion_ids, rows: list[int]) -> list[dict[str, torch.Tensor]]:
        """Split the kept samples into steps_per_generation micro-chunks of one fixed size (padding rows masked)."""
        trainer = self.trainer
        spg = self.args.steps_per_generation
        device = trainer.accelerator.device
        size = max(1, math.ceil(len(rows) / spg))
        pad_id = trainer._tokenizer.pad_token_id
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
            c_mask = pad_sequence(
                [
                    torch.ones(len(completion_ids[i]), dtype=torch.long)
                    if completion_ids[i]
                    else torch.zeros(1, dtype=torch.long)
                    for i in part
                ],
                batch_first=True,
            )
            chunk = {
                "prompt_ids": p_ids.to(device),
                "prompt_mask": p_mask.to(device),
                "completion_ids": c_ids.to(device),
                "completion_mask": c_mask.to(device),
            }
            chunk["old_logps"] = self._logps(trainer.model, chunk).detach()
            chunks.append(chunk)
        return chunks

    def _logps(self, model, chunk) -> torch.Tensor:
        input_ids = torch.cat([chunk["prompt_ids"], chunk["completion_ids"]], dim=1)
        attention_mask = torch.cat([chunk["prompt_mask"], chunk["completion_mask"]], dim=1)
        logps, _, _ = self.trainer._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, chunk["completion_ids"].size(1), compute_entropy=False
        )
        return logps

    # ------------------------------------------------------------------ loss side
    def extra_loss(self, ctx: LossContext) -> torch.Tensor | None:
        if ctx.mode != "train" or not self._chunks:
            return None
        chunk = self._chunks[self.trainer._step % len(self._chunks)]
        if not chunk:
            return None
        logps = self._logps(self.trainer.model, chunk)  # (b, t), with gradient
        mask = chunk["completion_mask"].to(logps.dtype)
        per_token = aepo_per_token_loss(logps, chunk["old_logps"])
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
        loss = self.args.aepo_coef * loss / self.trainer.current_gradient_accumulation_steps
        self.log_metric("train", "aepo/loss", float(loss.detach()))
        return loss

    def after_loss(self, ctx: LossContext) -> None:
        if ctx.mode != "train" or ctx.entropies is None:
            return
        mask = ctx.mask.to(ctx.entropies.dtype)
        stats = torch.stack([(ctx.entropies.detach() * mask).sum(), mask.sum()])
        self._window = stats if self._window is None else self._window + stats
        if self.trainer.accelerator.sync_gradients:
            total, count = self.trainer.ext_collectives.all_sum(self._window.float()).tolist()
            self._window = None
            if count > 0:
                self.last_entropy = total / count

    def state_dict(self):
        return {"last_entropy": self.last_entropy, "temperature": self.temperature}

    def load_state_dict(self, state):
        self.last_entropy = state_number(state, "last_entropy", low=0.0, optional=True)
        self.temperature = state_number(state, "temperature", low=0.0, low_open=True, optional=True)
