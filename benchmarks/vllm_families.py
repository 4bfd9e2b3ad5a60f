"""Every family member (and all at once) for two steps under TRL's colocated vLLM, with what the vLLM tier checks
printed as a table: engine calls, spliced rows, the largest vLLM-vs-trainer log-prob gap on TRL's rows and on the
rows members spliced in (each at the temperature it was sampled at), TRL's importance-sampling ratio.

    .venv-vllm/bin/python benchmarks/vllm_families.py       # the vLLM venv (bash tests/vllm_tier/make_venv.sh)

The members, their settings and TRL's four importance-sampling modes spread over them are those of
tests/vllm_tier/test_vllm_colocate.py (``MEMBERS``), watched by the tier's ``Probe``; about a minute on 2 CPU cores.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "vllm_tier"), str(ROOT / "tests")]
import cpu_vllm  # noqa: E402,I001  (sets vLLM's environment before vLLM is imported)


def main() -> None:
    cpu_vllm.force_plain_cpu_linear()
    cpu_vllm.share_engines()
    import pytest
    from conftest import VLLM_ARGS
    from probe import Probe
    from test_vllm_colocate import IS_MODES, MEMBERS, _steps_as_lines, even_operand_reward

    from grpo_lab import testkit
    from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer

    work = Path(tempfile.mkdtemp())
    model = testkit.save_tiny_model(work / "model", hidden_size=64, num_heads=2)
    tokenizer, dataset = testkit.build_char_tokenizer(), testkit.arithmetic_dataset(256, seed=0)
    print(
        "| member | IS mode | engine calls | spliced rows | max gap, TRL rows | max gap, spliced rows | IS ratio mean "
        "(min-max over batches) | finite losses |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for i, (name, cfg) in enumerate(MEMBERS.items()):
        mode = IS_MODES[i % len(IS_MODES)]
        kwargs = {"step_reward_funcs": [_steps_as_lines]} if cfg.get("advantage_estimator") == "prm" else {}
        args = GRPOExtConfig(
            **{**VLLM_ARGS, "output_dir": str(work / str(i)), "vllm_importance_sampling_mode": mode, **cfg}
        )
        trainer = GRPOExtTrainer(
            model=model,
            reward_funcs=[testkit.digit_fraction_reward, even_operand_reward],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            **kwargs,
        )
        monkeypatch = pytest.MonkeyPatch()
        probe = Probe(trainer, monkeypatch)
        trainer.train()
        monkeypatch.undo()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        own = max(b.rows_gap(b.own_rows) for b in probe.batches)
        spliced = [b.rows_gap(b.spliced) for b in probe.batches if b.spliced]
        ratios = [float(b.out["importance_sampling_ratio"].mean()) for b in probe.batches]
        print(
            f"| {name} | {mode} | {len(probe.calls)} | {sum(len(b.spliced) for b in probe.batches)} | {own:.1e} | "
            f"{f'{max(spliced):.1e}' if spliced else '-'} | {min(ratios):.4f}-{max(ratios):.4f} | "
            f"{all(map(math.isfinite, losses))} |"
        )


if __name__ == "__main__":
    main()
