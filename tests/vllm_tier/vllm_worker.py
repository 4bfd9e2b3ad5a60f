"""One rank of the 2-process vLLM run (torchrun, gloo on CPU): every family that generates, each rank with its own
colocated engine. Writes what it saw to ``<out>/rank<r>.json`` for tests/vllm_tier/test_vllm_two_processes.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cpu_vllm  # noqa: I001  (vLLM's environment first)
import pytest
import torch
from conftest import VLLM_ARGS
from datasets import Dataset
from probe import Probe
from test_vllm_colocate import ALL_ON, SYNCED, even_operand_reward

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer


def main(out: Path, model: str) -> None:
    cpu_vllm.force_plain_cpu_linear()
    monkeypatch = pytest.MonkeyPatch()
    # Odd prompts give no signal (refilled); the pool to draw from is mostly even.
    prompts = [f"{a}+{b}=" for a in (1, 3, 0, 2, 4, 6, 8) for b in range(1, 9)]
    settings = {**VLLM_ARGS, **ALL_ON, "max_steps": 3, "output_dir": str(out / "run")}
    settings.update(
        vllm_importance_sampling_mode="token_truncate", dynamic_sampling_max_rounds=3, aepo_adv_threshold=-1
    )
    args = GRPOExtConfig(**settings)
    trainer = GRPOExtTrainer(
        model=model,
        reward_funcs=[even_operand_reward],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=testkit.build_char_tokenizer(),
    )
    probe = Probe(trainer, monkeypatch)
    drawn: list[list[str]] = []
    real_draw = trainer.ext_rollouts.draw_prompts

    def draw(count, generator):
        rows = real_draw(count, generator)
        drawn.append([r["prompt"] for r in rows])
        return rows

    monkeypatch.setattr(trainer.ext_rollouts, "draw_prompts", draw)
    trainer.train()
    tok = trainer.processing_class
    rank = trainer.accelerator.process_index
    logs = [h for h in trainer.state.log_history if "loss" in h]
    result = {
        "rank": rank,
        "num_processes": trainer.accelerator.num_processes,
        "losses": [h["loss"] for h in logs],
        "refilled": [h.get("dynamic/refilled_groups", 0.0) for h in logs],
        "aepo_used": [h.get("aepo/samples_used", 0.0) for h in logs],
        "betas": [h.get("kl/beta") for h in logs],
        "engine_calls": [
            {"temperature": c.temperature, "prompts": [tok.decode(p) for p in c.prompt_ids]} for c in probe.calls
        ],
        "drawn": drawn,
        "max_gap": max(b.rows_gap(range(b.gap.numel())) for b in probe.batches),
        "spliced_rows": [len(b.spliced) for b in probe.batches],
        "synced": SYNCED,
        "first_completion": probe.calls[0].completion_ids[0],
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
