"""What a collapse looks like on the monitoring metrics: a healthy and a collapsing tiny run, side by side.

    python benchmarks/collapse_demo.py --out docs/images

Same tiny random Llama, data, rewards and seed; only the learning rate differs (1e-4 vs 3e-2, the latter collapses
entropy within ~10 steps). Writes ``training.png`` and ``collapse.png`` with both runs overlaid, and prints when the
collapse alarm fired. CPU, under a minute.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from collapse_setting import train_collapse_setting

from grpo_lab import testkit
from trl_grpo_ext.plot import plot_runs


def run(model_path: str, lr: float, steps: int, seed: int):
    return train_collapse_setting(
        model_path,
        steps=steps,
        lr=lr,
        seed=seed,
        diversity_metrics=["distinct", "self_bleu", "repetition", "unique", "entropy"],
        collapse_entropy_min=0.5,
        collapse_distinct2_drop=0.5,
        collapse_repetition_max=0.5,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="collapse_demo")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model_path = testkit.save_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"))
    runs = {}
    for label, lr in (("healthy lr=1e-4", 1e-4), ("collapsing lr=3e-2", 3e-2)):
        trainer = run(model_path, lr, args.steps, args.seed)
        runs[label] = trainer.state.log_history
        alarms = trainer.collapse_monitor.alarms
        first = f"first alarm at step {alarms[0][0]}: {'; '.join(alarms[0][1])}" if alarms else "no alarm"
        last = [h for h in trainer.state.log_history if "entropy/mean" in h][-1]
        print(
            f"{label:>20}: {first}; final entropy {last['entropy/mean']:.3f}, distinct-2 "
            f"{last['diversity/distinct_2']:.3f}, self-BLEU {last['diversity/self_bleu']:.3f}, "
            f"repetition {last['diversity/repetition']:.3f}"
        )
    for path in plot_runs(runs, args.out):
        print(path)


if __name__ == "__main__":
    main()
