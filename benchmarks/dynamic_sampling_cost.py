"""What dynamic sampling costs a step: median step time against no filter, side by side in one process.

    python benchmarks/dynamic_sampling_cost.py [--steps 12] [--repeats 3]

The CPU testkit's tiny model, 8 prompts x 4 samples per step, two rewards: "a third flat" (the prompts whose digit sum
is divisible by 3 get the same reward for every sample, the others the completion's length: about a third of the
groups have no signal) and "all flat" (every group without signal: the worst case, every round runs and finds
nothing). Arms: ``sample_filter`` none, ``nonzero_std``, and ``dynamic_sampling`` at 1 and 3 rounds. Prints, per
reward and arm, the median step time (TRL's ``step_time``, over the steps after the first, then the median over
repeats), its ratio to no filter, the median extra generation time per step, the rounds and the fraction of groups
with signal before / after. Markdown, for docs/dynamic_sampling.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch

ARMS = {
    "none": {},
    "nonzero_std": {"sample_filter": "nonzero_std"},
    "dynamic_sampling, 1 round": {"refill": "dynamic_sampling", "dynamic_sampling_max_rounds": 1},
    "dynamic_sampling, 3 rounds": {"refill": "dynamic_sampling", "dynamic_sampling_max_rounds": 3},
}


def a_third_flat(prompts, completions, **kwargs):
    flat = [sum(int(ch) for ch in p if ch.isdigit()) % 3 == 0 for p in prompts]
    return [1.0 if f else float(len(c)) for f, c in zip(flat, completions, strict=True)]


def all_flat(prompts, completions, **kwargs):
    return [1.0] * len(completions)


REWARDS = {"a third flat": a_third_flat, "all flat": all_flat}


def run(model: str, reward, arm: dict, steps: int, seed: int) -> list[dict]:
    from grpo_lab import testkit
    from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer

    with tempfile.TemporaryDirectory() as out:
        args = GRPOExtConfig(
            output_dir=out,
            per_device_train_batch_size=32,
            num_generations=4,
            max_completion_length=16,
            max_steps=steps,
            learning_rate=1e-3,
            logging_steps=1,
            report_to="none",
            use_cpu=True,
            bf16=False,
            seed=seed,
            save_strategy="no",
            disable_tqdm=True,
            **arm,
        )
        trainer = GRPOExtTrainer(
            model=model,
            reward_funcs=[reward],
            args=args,
            train_dataset=testkit.arithmetic_dataset(512, seed=0),
            processing_class=testkit.build_char_tokenizer(),
        )
        trainer.train()
        return [h for h in trainer.state.log_history if "loss" in h]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    cli = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    from grpo_lab import testkit

    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = f"{tmp}/model"
        testkit.save_tiny_model(model)
        seen: dict[tuple[str, str], list[dict]] = {}
        for repeat in range(cli.repeats):  # arms interleaved within each repeat: the machine's drift hits them alike
            for reward_name, reward in REWARDS.items():
                for arm_name, arm in ARMS.items():
                    logs = run(model, reward, arm, cli.steps, seed=repeat)[1:]  # the first step warms up
                    seen.setdefault((reward_name, arm_name), []).append(
                        {
                            "step": statistics.median(h["step_time"] for h in logs),
                            "extra": statistics.median(h.get("dynamic/extra_gen_time", 0.0) for h in logs),
                            "rounds": statistics.median(h.get("dynamic/rounds", 0.0) for h in logs),
                            "before": statistics.mean(h.get("dynamic/signal_frac_before", 0.0) for h in logs),
                            "after": statistics.mean(h.get("dynamic/signal_frac_after", 0.0) for h in logs),
                        }
                    )
        print(f"{cli.repeats} repeats x {cli.steps} steps, medians")
        print("| reward | arm | step time (s) | vs none | extra generation (s/step) | rounds | signal before -> after")
        print("|---|---|---|---|---|---|---")
        for reward_name in REWARDS:
            base = statistics.median(r["step"] for r in seen[(reward_name, "none")])
            for arm_name in ARMS:
                runs = seen[(reward_name, arm_name)]
                median = statistics.median(r["step"] for r in runs)
                signal = ""
                if "dynamic" in arm_name:
                    before = statistics.mean(r["before"] for r in runs)
                    signal = f"{before:.2f} -> {statistics.mean(r['after'] for r in runs):.2f}"
                print(
                    f"| {reward_name} | {arm_name} | {median:.3f} | {median / base:.2f}x | "
                    f"{statistics.median(r['extra'] for r in runs):.3f} | "
                    f"{statistics.median(r['rounds'] for r in runs):g} | {signal}"
                )


if __name__ == "__main__":
    main()
