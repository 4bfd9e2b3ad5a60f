"""``advantage_estimator: prm``: process-supervised token advantages (DeepSeekMath sec. 4.1.3)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from ..api import Out
from ..core.advantages import StdKind, group_relative_advantages
from ..core.prm import prm_step_advantages
from ..prm.segmentation import segment_completion
from ..prm.sources import CausalLMPRM, TokenClassificationPRM, call_step_function, source_name, sum_step_rewards
from .base import GenerationBatch, Host, ScoringModels
from .interfaces import ADVANTAGE_ESTIMATORS, AdvantageEstimatorBase, AdvantageUpdate

logger = logging.getLogger(__name__)


@ADVANTAGE_ESTIMATORS.register("prm")
class PRMAdvantage(AdvantageEstimatorBase):
    """Segments completions into steps, scores the steps, and turns them into (B, T) token advantages.

    Per generation batch: each process segments its completions (``prm_step_separator`` or
    ``prm_step_separator_token_id``), scores the steps with every source (Python ``step_reward_funcs`` and/or the PRM
    model) and sums them; step rewards and step ends are gathered from all processes so that a group spanning
    processes is normalised as a whole, then each process keeps its rows. ``prm_outcome_coef`` adds
    ``c * A_outcome`` (TRL's group-normalised outcome advantage) to every token.
    """

    @dataclass(frozen=True)
    class Args(AdvantageEstimatorBase.Args):  # the config fields it reads
        advantage_std: StdKind
        prm_model_name_or_path: str | None
        prm_model_type: str
        prm_batch_size: int
        prm_step_separator: str
        prm_step_separator_token_id: int | None
        prm_causal_step_tag: str
        prm_causal_good_token: str
        prm_causal_bad_token: str
        prm_outcome_coef: float
        prm_std: StdKind

    args: Args

    metrics = (
        "prm/steps_mean",
        "prm/no_step_frac",
        "prm/single_step_frac",
        "prm/step_reward_mean",
        "prm/nan_step_frac",
        "prm/adv_abs_mean",
    )
    docs = "prm.md"

    def __init__(self, args: Args, host: Host, *, scoring: ScoringModels):
        super().__init__(args, host)
        self.scoring = scoring
        self.sources = list(scoring.step_reward_funcs)
        if args.prm_model_name_or_path is not None:
            model: TokenClassificationPRM | CausalLMPRM
            if args.prm_model_type == "token_classification":
                model = TokenClassificationPRM(
                    args.prm_model_name_or_path,
                    separator=args.prm_step_separator,
                    batch_size=args.prm_batch_size,
                    device=host.device,
                )
            else:
                model = CausalLMPRM(
                    args.prm_model_name_or_path,
                    step_tag=args.prm_causal_step_tag,
                    good_token=args.prm_causal_good_token,
                    bad_token=args.prm_causal_bad_token,
                    batch_size=args.prm_batch_size,
                    device=host.device,
                )
            # Placed like TRL's reward models (ZeRO-3: a DeepSpeed engine; FSDP: sharded). Its forwards are then
            # collectives: every process scores its B completions in the same ceil(B / prm_batch_size) forwards.
            model.model = scoring.prepare_scoring_model(model.model)
            self.sources.append(model)
        if not self.sources:
            raise ValueError(
                "advantage_estimator='prm' needs step rewards: pass step_reward_funcs=[...] to GRPOExtTrainer or set "
                "prm_model_name_or_path in GRPOExtConfig."
            )

    def on_generation(self, batch: GenerationBatch) -> Out[AdvantageUpdate | None]:
        args, host = self.args, self.host
        out = batch.output
        tokenizer = host.tokenizer
        mask = out["completion_mask"]  # (B, T)
        ids = out["completion_ids"]  # (B, T)
        lengths = mask.sum(1).tolist()
        separator = None if args.prm_step_separator_token_id is not None else args.prm_step_separator
        segments = [
            segment_completion(
                tokenizer,
                ids[i, : lengths[i]].tolist(),
                separator=separator,
                separator_token_id=args.prm_step_separator_token_id,
            )
            for i in range(ids.size(0))
        ]
        steps = [s.texts for s in segments]
        kwargs = self.scoring.reward_kwargs(batch.inputs, batch.completion_ids_list)  # what TRL passes reward functions
        scored = [
            call_step_function(src, source_name(src), batch.prompts, batch.completions, steps, **kwargs)
            for src in self.sources
        ]
        step_rewards = sum_step_rewards(scored)
        ends = [s.ends for s in segments]

        # Gather so that groups spanning processes are normalised over all their completions.
        all_rewards = host.gather_object(step_rewards)
        all_ends = host.gather_object(ends)
        width = max(host.gather_object([ids.size(1)]))
        advantages = prm_step_advantages(all_rewards, all_ends, batch.group_size, width, std=args.prm_std)
        advantages = advantages.to(ids.device)
        if args.prm_outcome_coef != 0.0:
            outcome = group_relative_advantages(
                batch.rewards, batch.group_size, std=args.advantage_std, scale=host.scale_rewards
            )
            advantages = advantages + args.prm_outcome_coef * outcome.to(ids.device).unsqueeze(1)
        local = advantages[batch.process_slice, : ids.size(1)] * mask  # (B, T), 0 on padding
        # (N, width): the trainer keeps this process's rows
        return AdvantageUpdate(advantages=advantages), self._step_metrics(all_rewards, local, mask)

    def _step_metrics(self, all_rewards, local, mask) -> dict[str, float]:
        counts = [len(r) for r in all_rewards]
        values = [v for r in all_rewards for v in r]
        finite = [v for v in values if not math.isnan(v)]
        stats = torch.stack([(local.abs() * mask).sum(), mask.sum()]).float()
        total = self.host.collectives.all_sum(stats)
        metrics = {
            "prm/steps_mean": sum(counts) / max(len(counts), 1),
            "prm/no_step_frac": sum(c == 0 for c in counts) / max(len(counts), 1),
            "prm/single_step_frac": sum(c == 1 for c in counts) / max(len(counts), 1),
            "prm/adv_abs_mean": (total[0] / total[1].clamp(min=1.0)).item(),
        }
        if finite:
            metrics["prm/step_reward_mean"] = sum(finite) / len(finite)
        if values:
            metrics["prm/nan_step_frac"] = nan_frac = 1 - len(finite) / len(values)
            if nan_frac > 0:
                logger.info("prm: %.1f%% of steps have no score (None/NaN): they count 0.", 100 * nan_frac)
        return metrics
