"""What each tool costs: the same tiny training with trl.GRPOTrainer and with GRPOExtTrainer per feature and all on.

    python benchmarks/overhead.py --repeats 3 --steps 12          # trainer overhead, interleaved subprocess runs
    python benchmarks/overhead.py --micro                          # core functions at B=512, T=4096

Each run is a fresh subprocess (so peak RSS is its own): fixed seed, tiny random Llama, batch 16 (4 prompts x 4;
``--batch``), ``steps`` optimizer steps. Two measurements per feature:

- **A/B time ratio**: the median wall time of a whole optimizer step (between consecutive ``on_step_end``: generation,
  loss, backward, optimizer, callbacks) after the first two steps, divided by the matching ``trl.GRPOTrainer``
  baseline (same beta and num_iterations) of the same repeat; the table shows the median over repeats. Runs are
  interleaved (every config once per repeat) so drift hits all alike, but two processes on a busy 2-core machine
  still differ by +-10-30%.
- **in-run ratio**: ``1 / (1 - f)`` with ``f`` the median ``timing/ext_fraction`` the trainer logs, the share of each
  step spent in the plugin's own code, timed inside the same run (no second run, so no run-to-run noise). It leaves
  out the backward pass through token-clip masks (an elementwise product).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from trl_grpo_ext.config import AEPO_0_1_0

CONFIGS = {
    # name: (baseline it is divided by, overrides, runs trl.GRPOTrainer)
    "trl": ("trl", {}, True),
    "trl beta=0.04": ("trl beta=0.04", {"beta": 0.04}, True),
    "trl num_iterations=2": ("trl num_iterations=2", {"num_iterations": 2}, True),
    "ext, all off": ("trl", {}, False),
    "population std": ("trl", {"advantage_std": "population"}, False),
    "Clip-Cov": ("trl", {"token_clip": "clip_cov", "clip_cov_lb": -100.0, "clip_cov_ratio": 0.01}, False),
    "KL-Cov": ("trl num_iterations=2", {"token_clip": "kl_cov", "num_iterations": 2}, False),
    "PF best-worst": ("trl", {"sample_filter": "best_worst"}, False),
    "adaptive KL": ("trl beta=0.04", {"beta": 0.04, "kl_control": "adaptive"}, False),
    "diversity KL": ("trl beta=0.04", {"beta": 0.04, "kl_control": "diversity"}, False),
    "PRM (step function)": ("trl", {"advantage_estimator": "prm"}, False),
    "monitor (all metrics)": (
        "trl",
        {"diversity_metrics": ["distinct", "self_bleu", "repetition", "unique", "entropy"]},
        False,
    ),
    "monitor (every 4th)": (
        "trl",
        {"diversity_metrics": ["distinct", "self_bleu", "repetition", "unique", "entropy"], "diversity_every": 4},
        False,
    ),
    "monitor (repetition)": ("trl", {"diversity_metrics": ["repetition"]}, False),
    # an audit reward (weight 0, logged and compared, never trained on): its cost against the same monitor without it,
    # the audit function's own scoring included (the exact-match grader beside the training reward)
    "monitor + audit": (
        "monitor (repetition)",
        {
            "diversity_metrics": ["repetition"],
            "reward_weights": [1.0, 0.0],
            "collapse_audit_rewards": ["exact_match_reward"],
        },
        False,
    ),
    "AEPO": ("trl", {"entropy_control": "aepo"}, False),
    "AEPO (0.1.0 term)": ("trl", {"entropy_control": "aepo", **AEPO_0_1_0}, False),
    "all on": (
        "trl beta=0.04",
        {
            "beta": 0.04,
            "kl_control": "adaptive",
            "token_clip": "clip_cov",
            "clip_cov_lb": -100.0,
            "sample_filter": "best_worst",
            "advantage_estimator": "prm",
            "diversity_metrics": ["distinct", "repetition", "entropy"],
            "entropy_control": "aepo",
        },
        False,
    ),
}

CHILD = r"""
import json, resource, statistics, sys, tempfile, time
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer
from grpo_lab import testkit
overrides, is_trl, steps = json.loads(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
hidden, layers, length, batch = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
d = tempfile.mkdtemp()
common = dict(output_dir=d + "/o", per_device_train_batch_size=batch, num_generations=4, max_completion_length=length,
              max_steps=steps, learning_rate=1e-3, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
              seed=0, save_strategy="no", disable_tqdm=True)
def steps_fn(prompts, completions, steps, **kw):
    return [[(len(s) % 3) / 2 for s in row] for row in steps]
if is_trl:
    args, cls, extra = GRPOConfig(**common, **overrides), GRPOTrainer, {}
else:
    args, cls = GRPOExtConfig(**common, **overrides), GRPOExtTrainer
    extra = {"step_reward_funcs": [steps_fn]} if overrides.get("advantage_estimator") == "prm" else {}
model = testkit.save_tiny_model(d + "/m", hidden_size=hidden, num_layers=layers)
audits = [testkit.exact_match_reward] if overrides.get("collapse_audit_rewards") else []
trainer = cls(model=model, reward_funcs=[testkit.digit_fraction_reward, *audits], args=args,
              train_dataset=testkit.arithmetic_dataset(1024), processing_class=testkit.build_char_tokenizer(), **extra)
class StepClock(TrainerCallback):
    ends = []
    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())
trainer.add_callback(StepClock())  # last: times the whole step, callbacks included
trainer.train()
walls = [b - a for a, b in zip(StepClock.ends, StepClock.ends[1:])][2:]
fractions = [h["timing/ext_fraction"] for h in trainer.state.log_history if "timing/ext_fraction" in h][2:]
print("RESULT", json.dumps({"step_time": statistics.median(walls),
                            "ext_fraction": statistics.median(fractions) if fractions else None,
                            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_child(overrides: dict, steps: int, *, trl: bool, size: tuple[int, int, int, int]) -> dict:
    argv = [json.dumps(overrides), "1" if trl else "0", str(steps), *map(str, size)]
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=600)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(line[0][len("RESULT ") :])


def trainer_overhead(repeats: int, steps: int, size: tuple[int, int, int, int], only: list[str] | None = None) -> None:
    names = [n for n in CONFIGS if only is None or n in only or any(CONFIGS[o][0] == n for o in only)]
    results: dict[str, list[dict]] = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            _, overrides, is_trl = CONFIGS[name]
            results[name].append(run_child(overrides, steps, trl=is_trl, size=size))
    print(
        f"\nmodel hidden={size[0]} layers={size[1]}, {size[2]} completion tokens, batch {size[3]} "
        f"({size[3] // 4} x 4), {steps} steps, {repeats} "
        "interleaved repeats; A/B ratios against the matching trl.GRPOTrainer run, in-run = 1/(1 - timing/ext_fraction)"
    )
    print(
        f"{'config':<24}{'step time ms':>14}{'A/B ratio':>11}{'ext frac':>10}{'in-run ratio':>14}"
        f"{'peak RSS MB':>13}{'RSS ratio':>11}"
    )
    for name in names:
        baseline = CONFIGS[name][0]
        t = [r["step_time"] / b["step_time"] for r, b in zip(results[name], results[baseline], strict=True)]
        m = [r["peak_rss_mb"] / b["peak_rss_mb"] for r, b in zip(results[name], results[baseline], strict=True)]
        ms = statistics.median(r["step_time"] for r in results[name]) * 1000
        rss = statistics.median(r["peak_rss_mb"] for r in results[name])
        fractions = [r["ext_fraction"] for r in results[name] if r["ext_fraction"] is not None]
        frac, in_run = ("", "")
        if fractions:
            f = statistics.median(fractions)
            frac, in_run = f"{f:.3f}", f"{1 / (1 - f):.3f}"
        print(
            f"{name:<24}{ms:>14.1f}{statistics.median(t):>11.3f}{frac:>10}{in_run:>14}{rss:>13.0f}"
            f"{statistics.median(m):>11.3f}"
        )


def micro(repeats: int = 5) -> None:
    import torch
    from diversity_speed import timed as timed_median

    from trl_grpo_ext.core import (
        clip_cov_mask,
        group_relative_advantages,
        kl_cov_mask,
        prm_step_advantages,
        token_covariance,
    )

    b, t, g = 512, 4096, 8
    gen = torch.Generator().manual_seed(0)
    logps = -torch.rand(b, t, generator=gen) * 5
    adv = torch.randn(b, generator=gen)
    mask = torch.ones(b, t)
    rewards = torch.rand(b, generator=gen)
    ends = torch.sort(torch.randint(0, t, (b, 16), generator=gen), dim=1).values
    step_rewards = torch.rand(b, 16, generator=gen)

    base = timed_median(lambda: ((logps - logps.mean()) * (adv.unsqueeze(1) - adv.mean()) * mask).sum(), repeats)
    rows = [
        ("plain pass: one centred product over (B, T)", lambda: None),
        ("token_covariance", lambda: token_covariance(logps, adv, mask)),
        (
            "clip_cov_mask (r=2e-4)",
            lambda: clip_cov_mask(
                logps, adv, mask, ratio=2e-4, lb=-1e9, ub=1e9, generator=torch.Generator().manual_seed(0)
            ),
        ),
        ("kl_cov_mask (k=2e-3)", lambda: kl_cov_mask(logps, adv, mask, ratio=2e-3)),
        ("prm_step_advantages (16 steps)", lambda: prm_step_advantages(step_rewards, ends, g, t)),
        ("group_relative_advantages", lambda: group_relative_advantages(rewards, g)),
    ]
    print(f"\ncore functions at B={b}, T={t} ({b * t / 1e6:.1f}M tokens), torch threads {torch.get_num_threads()}")
    print(f"{'function':<46}{'ms':>10}{'vs plain pass':>15}")
    for name, fn in rows:
        seconds = base if name.startswith("plain") else timed_median(fn, repeats)
        print(f"{name:<46}{seconds * 1000:>10.1f}{seconds / base:>14.1f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=64, help="width of the random Llama")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--completion_length", type=int, default=12)
    parser.add_argument("--batch", type=int, default=16, help="completions per step (groups of 4)")
    parser.add_argument("--micro", action="store_true", help="only the core micro-benchmarks")
    parser.add_argument("--only", nargs="+", choices=list(CONFIGS), help="these configs (and their baselines) only")
    args = parser.parse_args()
    if args.micro:
        micro()
    else:
        size = (args.hidden, args.layers, args.completion_length, args.batch)
        trainer_overhead(args.repeats, args.steps, size, args.only)


if __name__ == "__main__":
    main()
