"""Watching a trainer that generates with TRL's colocated vLLM: every engine call, and every training batch as the
loss will see it (after the members' splices), with the trainer's log-probs of its rows measured before the step."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trl_grpo_ext.adapter.compat import policy_logps_at_temperature


@dataclass
class EngineCall:
    """One ``LLM.generate`` of the colocated engine: prompt token ids, the sampling temperature and count, and the
    completion token ids it returned (one per prompt)."""

    prompt_ids: list[list[int]]
    temperature: float
    n: int
    completion_ids: list[list[int]]


@dataclass
class Batch:
    """One training batch (TRL's generation output after every member ran), on this process.

    ``spliced``: the rows members' splices wrote, and the temperature each was sampled at (a later splice's rows
    replace an earlier one's: AEPO writes the first rows after dynamic sampling's refill); ``trainer_logps``: (B, T)
    the trainer's log-probs of every row at the temperature it was sampled at, measured right after generation (the
    weights vLLM was given for this step); ``gap``: per row, mean |trainer - vLLM| log-prob over its completion."""

    out: dict
    temperatures: dict[int, float | None] = field(default_factory=dict)
    trainer_logps: torch.Tensor | None = None
    gap: torch.Tensor | None = None

    def rows_gap(self, rows) -> float:
        return float(self.gap[list(rows)].max()) if len(rows) else 0.0

    @property
    def spliced(self) -> list[int]:
        return sorted(self.temperatures)

    @property
    def spliced_temperature(self) -> float | None:
        """The one temperature of the spliced rows (``ValueError`` when splices of two temperatures are mixed)."""
        values = set(self.temperatures.values())
        if len(values) > 1:
            raise ValueError(f"spliced rows of several temperatures: {self.temperatures}")
        return values.pop() if values else None

    @property
    def own_rows(self) -> list[int]:
        return [i for i in range(self.out["completion_ids"].size(0)) if i not in self.spliced]


class Probe:
    """Installs itself on ``trainer`` (instance attributes, restored by ``monkeypatch``)."""

    def __init__(self, trainer, monkeypatch):
        self.trainer = trainer
        self.calls: list[EngineCall] = []
        self.batches: list[Batch] = []
        self._pending: list = []
        llm = trainer.vllm_generation.llm
        real_generate, real_score = llm.generate, trainer._generate_and_score_completions
        real_splice = getattr(trainer, "_apply_splice", None)  # GRPOExtTrainer's

        def generate(prompts, sampling_params=None, **kwargs):
            outputs = real_generate(prompts, sampling_params=sampling_params, **kwargs)
            self.calls.append(
                EngineCall(
                    prompt_ids=[list(p["prompt_token_ids"]) for p in prompts],
                    temperature=sampling_params.temperature,
                    n=sampling_params.n,
                    completion_ids=[list(o.token_ids) for output in outputs for o in output.outputs],
                )
            )
            return outputs

        def apply_splice(out, splice):
            real_splice(out, splice)
            rows = list(range(len(splice.rollout.completion_ids))) if splice.rows is None else list(splice.rows)
            self._pending.append((rows, splice.rollout.temperature))

        def generate_and_score(inputs):
            self._pending = []
            out = real_score(inputs)
            if trainer.model.training:
                self.batches.append(self._measure(out))
            return out

        monkeypatch.setattr(llm, "generate", generate)
        if real_splice is not None:
            monkeypatch.setattr(trainer, "_apply_splice", apply_splice)
        monkeypatch.setattr(trainer, "_generate_and_score_completions", generate_and_score)

    @torch.no_grad()
    def _measure(self, out) -> Batch:
        trainer = self.trainer
        snapshot = {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in out.items()}
        batch = Batch(out=snapshot)
        for rows, temperature in self._pending:  # in the order the trainer applied them
            batch.temperatures.update(dict.fromkeys(rows, temperature))
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
        mask = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
        width = out["completion_ids"].size(1)
        logps = policy_logps_at_temperature(trainer, ids, mask, width, temperature=trainer.temperature)  # (B, T)
        for temperature in set(batch.temperatures.values()) - {None, trainer.temperature}:
            rows = torch.tensor([row for row, t in batch.temperatures.items() if t == temperature])
            logps[rows] = policy_logps_at_temperature(trainer, ids[rows], mask[rows], width, temperature=temperature)
        batch.trainer_logps = logps
        completion = out["completion_mask"].float()
        diff = (logps - out["sampling_per_token_logps"]).abs().nan_to_num(0.0) * completion
        batch.gap = diff.sum(1) / completion.sum(1).clamp(min=1.0)  # (B,)
        return batch


def generation_batch(trainer, dataset, num_prompts: int = 2) -> dict:
    """One scored training generation batch outside ``train()`` (what tests/conftest.py's ``scored_batch`` does; that
    conftest is shadowed by this folder's for ``from conftest import``)."""
    trainer.model.train(True)
    trainer.current_gradient_accumulation_steps = 1
    rows = [dataset[i] for i in range(num_prompts) for _ in range(trainer.num_generations)]
    return trainer._generate_and_score_completions(rows)
