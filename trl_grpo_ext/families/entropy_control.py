"""``entropy_control: aepo``: hold policy entropy at a target (Arbitrary Entropy Policy Optimization)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import cast

import torch

from ..api import Out, Rollout, Splice
from ..core.aepo import (
    aepo_below_target,
    aepo_candidates,
    aepo_entropy_sums,
    aepo_per_token_loss,
    aepo_pick,
    aepo_sample_count,
    high_entropy_mask,
)
from ..core.state import state_number
from ..names import config_error
from .base import GenerationBatch, Host, LossContext, Off, RolloutService
from .interfaces import ENTROPY_CONTROLS, EntropyControlBase, SpliceUpdate

logger = logging.getLogger(__name__)

ENTROPY_CONTROLS.register("none")(Off)


#: The rules of each ``aepo_mode`` (the fields of trl_grpo_ext 0.2.0 and earlier; CHANGELOG.md): ``splice`` runs the
#: reference code's, ``term`` 0.1.0's. first_step: the first batch, nothing measured yet, counts as below the target
#: ("high") or above it; at_target: entropy exactly at the target counts as below ("high", the reference's <=) or
#: above; cap_rule and sample_order: how many candidates train and which (trl_grpo_ext.core.aepo); entropy_estimator:
#: what is steered on (-log p of the sampled tokens, or the full-distribution entropy).
AEPO_RULES: dict[str, dict[str, str]] = {
    "splice": dict(
        first_step="high", at_target="high", cap_rule="halve_count", sample_order="first", entropy_estimator="sampled"
    ),
    "term": dict(
        first_step="low", at_target="low", cap_rule="halve_cap", sample_order="random", entropy_estimator="exact"
    ),
}


@ENTROPY_CONTROLS.register("aepo")
class AEPO(EntropyControlBase):
    """AEPO (arXiv 2510.08141) on top of whatever GRPO loss runs; by default as the authors' code runs it.

    Per training generation batch:

    1. the entropy estimate (:data:`AEPO_RULES` of ``aepo_mode``: ``entropy_estimator``) of the previous optimizer
       step's trained tokens, all-reduced so every process reads the same value (``first_step`` decides the first
       batch), chooses ``T = aepo_temperature_high`` under ``aepo_target_entropy`` (``at_target`` decides equality),
       else ``aepo_temperature_low``;
    2. the first ``aepo_regenerate_fraction`` of this process's prompt groups are generated again at T through TRL's
       own ``_generate`` (transformers or vLLM) and scored by the same reward functions; TRL's completion metrics are
       left untouched by this extra generation;
    3. samples whose group advantage exceeds ``aepo_adv_threshold`` are candidates; ``cap_rule`` says how many
       train (``aepo_max_samples``, halved above target), ``sample_order`` which;
    4. ``aepo_mode="splice"``: they replace the first rows of this process's training batch with advantage
       ``aepo_coef`` (the trainer rebuilds TRL's masks and log-probs for them) and train through TRL's own loss;
       ``aepo_mode="term"``: their REINFORCE term ``aepo_coef * mean_tokens(-exp(logp - old_logp))`` (old log-probs
       from the policy before the update) is added to the loss, split into ``steps_per_generation`` chunks of a fixed
       size, TRL's batch untouched.

    Spliced rows are TRL rows: every mask and correction TRL applies to its own rows applies to them (tool /
    ``env_mask``, ``mask_truncated_completions``, entropy and off-policy masks, vLLM importance sampling), and every
    family composes with them. The term honours the same masks explicitly: tool / env tokens and truncated completions
    train nothing; under ``top_entropy_quantile < 1`` only the highest-entropy fraction of the AEPO samples' own
    tokens train (quantile over this process's AEPO tokens); with vLLM's ``vllm_importance_sampling_correction`` it is
    multiplied by TRL's importance-sampling ratio. Under vLLM the samples are drawn by vLLM at T, and that ratio
    compares vLLM's log-probs with the trainer's at T (TRL compares its own rows at the training temperature): it
    corrects the engines' mismatch, as on TRL's rows, and leaves the temperature change, AEPO's point, in place.
    ``generation_kwargs["temperature"]`` under vLLM is refused (TRL lets it override every sampling temperature), and
    ``environment_factory`` (the regeneration would step environments TRL already reset and stepped for this batch).

    Logs ``aepo/temperature``, ``aepo/entropy``, ``aepo/entropy_gap``, ``aepo/regenerated`` (rows, all processes),
    ``aepo/samples_used``, ``aepo/positive_frac``, ``aepo/extra_gen_time`` (seconds of the extra generation and
    scoring) and, in term mode, ``aepo/loss``.
    """

    @dataclass(frozen=True)
    class Args(EntropyControlBase.Args):  # the config fields it reads
        aepo_target_entropy: float
        aepo_temperature_high: float
        aepo_temperature_low: float
        aepo_coef: float
        aepo_max_samples: int
        aepo_adv_threshold: float
        aepo_mode: str
        aepo_regenerate_fraction: float
        generation_batch_size: int | None
        num_generations: int | None
        steps_per_generation: int | None
        use_vllm: bool
        vllm_mode: str
        vllm_enable_sleep_mode: bool
        generation_kwargs: dict | str | None

    args: Args

    metrics = (
        "aepo/temperature",
        "aepo/regenerated",
        "aepo/samples_used",
        "aepo/positive_frac",
        "aepo/extra_gen_time",
    )
    #: entropy once a step measured it; the term only in term mode, on steps that kept samples
    optional_metrics = ("aepo/entropy", "aepo/entropy_gap", "aepo/loss")
    example_config = {"aepo_adv_threshold": 0.0}
    docs = "aepo.md"

    @classmethod
    def check_combination(cls, args, members) -> None:
        if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
            raise config_error(
                "entropy_control",
                args.entropy_control,
                "AEPO replaces the entropy bonus, but entropy_coef / use_adaptive_entropy is also on",
                "set entropy_coef=0 and use_adaptive_entropy=False, or entropy_control='none'",
            )

    def __init__(self, args: Args, host: Host, *, rollouts: RolloutService):
        super().__init__(args, host)
        self.rollouts = rollouts
        generation_kwargs = args.generation_kwargs if isinstance(args.generation_kwargs, dict) else {}
        if args.use_vllm and "temperature" in generation_kwargs:
            # TRL's colocated vLLM applies generation_kwargs over its own temperature at every generate call, so
            # AEPO's regeneration would silently sample at the user's value instead of aepo_temperature_high / low.
            raise ValueError(
                "entropy_control='aepo' with use_vllm cannot sample at its own temperature while generation_kwargs "
                f"sets temperature={generation_kwargs['temperature']!r} (TRL passes generation_kwargs to vLLM "
                "over every other sampling setting). Fix: drop 'temperature' from generation_kwargs and set "
                "GRPOExtConfig.temperature instead."
            )
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
        self._warned_split_groups = False
        processes = host.num_processes
        assert args.generation_batch_size is not None and args.num_generations is not None  # set by GRPOConfig
        regenerated = self.regenerated_rows(args.generation_batch_size // processes, args.num_generations) * processes
        if regenerated < args.aepo_max_samples:
            # The reference's quarter assumes batches of hundreds of prompts (512 x 5 samples: 640 regenerated, the
            # cap of 60 binds). Measured here (docs/aepo.md): a quarter of 4 prompts does not hold the target.
            logger.warning(
                "entropy_control='aepo': aepo_regenerate_fraction=%s regenerates %d samples per generation batch, "
                "fewer than aepo_max_samples=%d, so at most %d samples (those with a positive advantage) steer the "
                "entropy. The reference's fraction assumes batches of hundreds of prompts; with this batch, raise "
                "aepo_regenerate_fraction (1.0 regenerates every prompt) if aepo/entropy does not reach the target.",
                args.aepo_regenerate_fraction,
                regenerated,
                args.aepo_max_samples,
                regenerated,
            )

    # ------------------------------------------------------------------ generation side
    def regenerated_rows(self, local_rows: int, group_size: int) -> int:
        """How many of this process's first rows are generated again: ``floor(aepo_regenerate_fraction x groups)``
        whole groups (at least one); every row when this process's rows split a group (a group must be scored whole,
        and every process must generate the same number of rows)."""
        fraction = self.args.aepo_regenerate_fraction
        if local_rows % group_size:
            if fraction < 1.0 and not self._warned_split_groups:
                self._warned_split_groups = True
                logger.warning(
                    "entropy_control='aepo': this process's %d rows split a group of %d, so AEPO regenerates all of "
                    "them instead of aepo_regenerate_fraction=%s (make the rows per process a multiple of "
                    "num_generations to regenerate a fraction).",
                    local_rows,
                    group_size,
                    fraction,
                )
            return local_rows
        groups = local_rows // group_size
        return max(1, math.floor(fraction * groups + 1e-9)) * group_size

    def on_generation(self, batch: GenerationBatch) -> Out[SpliceUpdate | None]:
        if batch.mode != "train":
            return None
        args, host, rules = self.args, self.host, AEPO_RULES[self.args.aepo_mode]
        rollouts = self.rollouts
        start = time.perf_counter()
        below = aepo_below_target(
            self.last_entropy,
            target=args.aepo_target_entropy,
            at_target=rules["at_target"],
            unmeasured=rules["first_step"],
        )
        temperature = args.aepo_temperature_high if below else args.aepo_temperature_low
        self.temperature = temperature
        local_rows = len(batch.prompts)
        rows = self.regenerated_rows(local_rows, batch.group_size)
        prompts, inputs = batch.prompts[:rows], batch.inputs[:rows]
        rollout = rollouts.regenerate(prompts, temperature=temperature)
        rewards = rollouts.score(inputs, prompts, rollout.completions, rollout.completion_ids)  # (rows x processes,)
        candidates = aepo_candidates(rewards, batch.group_size, adv_threshold=args.aepo_adv_threshold)
        if rollouts.mask_truncated_completions:  # a truncated sample trains nothing there: it would only displace a row
            truncated = torch.tensor(rollouts.truncated(rollout.completion_ids), device=rewards.device)
            candidates &= ~rollouts.gather(truncated).bool()
        count = aepo_sample_count(
            int(candidates.sum()), below_target=below, max_samples=args.aepo_max_samples, cap_rule=rules["cap_rule"]
        )
        generator = host.generator("aepo", per_rank=False, device=rewards.device)
        keep = aepo_pick(candidates, count, order=rules["sample_order"], generator=generator)
        rank = batch.process_slice.start // max(local_rows, 1)
        local = keep[rank * rows : (rank + 1) * rows].nonzero().flatten().tolist()
        update = None
        if args.aepo_mode == "splice":
            update = SpliceUpdate(splice=Splice(rollout.select(local), advantage=args.aepo_coef))
        else:
            self._chunks = self._build_chunks(rollout, local)
        metrics = {
            "aepo/temperature": temperature,
            "aepo/regenerated": float(rewards.numel()),
            "aepo/samples_used": float(keep.sum()),
            "aepo/positive_frac": float(keep.float().mean()) if keep.numel() else 0.0,
            "aepo/extra_gen_time": time.perf_counter() - start,
        }
        if self.last_entropy is not None:
            metrics["aepo/entropy"] = self.last_entropy
            metrics["aepo/entropy_gap"] = self.last_entropy - args.aepo_target_entropy
        return update, metrics

    @torch.no_grad()
    def _build_chunks(self, rollout: Rollout, rows: list[int]) -> list[dict[str, torch.Tensor]]:
        """Term mode: the kept samples in ``steps_per_generation`` micro-chunks of one fixed size, padded as TRL pads
        its batch (``rollouts.tensors``), with old log-probs and, under vLLM's
        correction, TRL's IS ratio.

        Every process builds ``steps_per_generation`` chunks whatever it kept: a chunk with no sample of this process
        holds its first regenerated row with an all-zero loss mask, so that the policy forwards (collectives under
        FSDP / ZeRO-3) run on every process in every micro-step and the term adds exactly 0 there.
        """
        rollouts = self.rollouts
        spg = cast(int, self.args.steps_per_generation)  # GRPOConfig.__post_init__ sets it (typed int | None)
        size = max(1, math.ceil(len(rows) / spg))
        chunks = []
        for k in range(spg):
            part = rows[k * size : (k + 1) * size]
            chunk = rollouts.tensors(rollout.select(part or [0]))
            tool = chunk.pop("tool_mask", None)
            sampling = chunk.pop("sampling_logps", None)
            chunk["loss_mask"] = chunk["completion_mask"] if tool is None else chunk["completion_mask"] * tool
            if not part:
                chunk["loss_mask"] = torch.zeros_like(chunk["loss_mask"])
            chunk["old_logps"] = rollouts.policy_logps(chunk)[0].detach()
            if sampling is not None:  # vLLM's log-probs at AEPO's temperature: the ratio compares at that temperature
                ratio = rollouts.vllm_is_ratio(
                    chunk,
                    sampling.to(chunk["old_logps"].dtype),
                    chunk["loss_mask"].to(chunk["old_logps"].dtype),
                    old_logps=chunk["old_logps"],
                    temperature=rollout.temperature,
                )
                if ratio is not None:
                    chunk["is_ratio"] = ratio
            chunks.append(chunk)
        return chunks

    # ------------------------------------------------------------------ loss side
    def extra_loss(self, ctx: LossContext) -> Out[torch.Tensor | None]:
        if ctx.mode != "train" or not self._chunks:
            return None
        chunk = self._chunks[self.host.micro_step % len(self._chunks)]
        quantile = self.host.top_entropy_quantile
        # On every process, in every micro-step (a forward is a collective under FSDP / ZeRO-3; see _build_chunks).
        logps, entropies = self.rollouts.policy_logps(chunk, compute_entropy=quantile < 1.0)  # (b, t)
        mask = chunk["loss_mask"]
        if quantile < 1.0:
            mask = high_entropy_mask(entropies.detach(), mask, quantile=quantile)
        mask = mask.to(logps.dtype)
        per_token = aepo_per_token_loss(logps, chunk["old_logps"])
        if "is_ratio" in chunk:
            per_token = per_token * chunk["is_ratio"]
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
        loss = self.args.aepo_coef * loss / self.host.accumulation_steps
        return loss, ({"aepo/loss": float(loss.detach())} if bool(chunk["loss_mask"].any()) else {})

    def after_loss(self, ctx: LossContext) -> None:
        if ctx.mode != "train":
            return
        estimator = AEPO_RULES[self.args.aepo_mode]["entropy_estimator"]
        if ctx.entropies is None and estimator == "exact":
            return
        stats = aepo_entropy_sums(logps=ctx.logps, entropies=ctx.entropies, mask=ctx.mask, estimator=estimator)
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
