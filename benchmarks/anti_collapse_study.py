"""The anti-collapse study: every tool against vanilla GRPO under a setting that collapses it, several seeds.

    python benchmarks/anti_collapse_study.py --seeds 0 1 2 --out docs/images --table docs/results_table.md
    python benchmarks/anti_collapse_study.py --setting chains --seeds 0 1 2 --out docs/images

Settings (``benchmarks/collapse_setting.py``):

- ``sums`` (default): the tiny random Llama on single-digit sums with the first-character and digit-fraction rewards,
  batch 32 (4 prompts x 8), learning rate 5e-3 (linear decay), 60 steps: vanilla GRPO's token entropy collapses.
  Accuracy stays 0 (shaping rewards do not teach exact sums): it measures collapse, not learning.
- ``chains``: the SFT warm start on two-operation chains (about half the held-out problems solved), GRPO on the
  final-answer reward at learning rate 2e-4 (linear decay), batch 64 (8 x 8), T 0.7, 100 steps: vanilla GRPO's
  reward collapses and the model unlearns the task. Entropy targets are 0.3 (the warm start samples at about 0.15).

Per run: final entropy (mean of the last 10 steps), area under the entropy curve (mean over all steps), final training
reward (last 10 steps), held-out accuracy (greedy, 128 problems), pass@1 and pass@8 (8 samples for 32 problems at the
setting's sampling temperature, the unbiased estimator), Distinct-2 and repetition of the training samples (last 10
steps). Reported as mean +- std over seeds. CPU, about 20-40 minutes for 10 methods x 3 seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import torch
from collapse_setting import chains_warm_start, default_cache, train_chains_setting, train_collapse_setting
from datasets import Dataset

from trl_grpo_ext import testkit
from trl_grpo_ext.core import pass_at_k


def methods(entropy_target: float) -> dict[str, dict]:
    """The compared methods; ``entropy_target`` is the target of TRL's adaptive entropy bonus and of AEPO."""
    return {
        "vanilla": {},
        "clip-higher (eps_high 0.28)": {"epsilon_high": 0.28},
        "TRL adaptive entropy bonus": {
            "entropy_coef": 0.01,
            "use_adaptive_entropy": True,
            "entropy_target": entropy_target,
        },
        "Clip-Cov": {"token_clip": "clip_cov"},
        "KL-Cov (num_iterations 2)": {"token_clip": "kl_cov", "num_iterations": 2},
        "PF best-worst": {"sample_filter": "best_worst", "loss_type": "grpo"},
        "adaptive KL": {"beta": 0.04, "kl_control": "adaptive", "kl_target": 0.05, "kl_horizon": 2000},
        "diversity KL": {"beta": 0.04, "kl_control": "diversity", "kl_diversity_target": 0.5, "kl_horizon": 2000},
        f"AEPO (target {entropy_target})": {"entropy_control": "aepo", "aepo_target_entropy": entropy_target},
        "all on": {
            "token_clip": "clip_cov",
            "sample_filter": "best_worst",
            "loss_type": "grpo",
            "beta": 0.04,
            "kl_control": "adaptive",
            "kl_target": 0.05,
            "kl_horizon": 2000,
            "entropy_control": "aepo",
            "aepo_target_entropy": entropy_target,
        },
    }


@dataclass(frozen=True)
class Setting:
    problems: Callable[..., Dataset]  # (n, seed=...) -> held-out rows with prompt and answer
    reward: Callable[..., list[float]]  # correctness of a completion, for accuracy and pass@k
    max_new_tokens: int
    temperature: float  # sampling temperature of pass@k (the setting's training temperature)
    lr: float
    steps: int
    entropy_target: float  # of TRL's adaptive entropy bonus and AEPO


SETTINGS = {
    "sums": Setting(testkit.arithmetic_dataset, testkit.exact_match_reward, 8, 1.0, 5e-3, 60, 1.0),
    "chains": Setting(
        lambda n, seed: testkit.multistep_dataset(n, seed=seed, ops="+"),
        testkit.final_answer_reward,
        max_new_tokens=20,
        temperature=0.7,
        lr=2e-4,
        steps=100,
        entropy_target=0.3,
    ),
}


@torch.no_grad()
def held_out(model, tok, seed: int, setting: str) -> dict[str, float]:
    spec = SETTINGS[setting]
    reward, max_new_tokens = spec.reward, spec.max_new_tokens
    model.eval()
    problems = spec.problems(128, seed=50_000 + seed)
    enc = tok(list(problems["prompt"]), return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **enc,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    accuracy = sum(reward(texts, answer=list(problems["answer"]))) / len(texts)
    sub = problems.select(range(32))
    torch.manual_seed(seed)
    enc = tok([p for p in sub["prompt"] for _ in range(8)], return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **enc,
        max_new_tokens=max_new_tokens,
        do_sample=True,
        temperature=spec.temperature,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    correct = reward(texts, answer=[a for a in sub["answer"] for _ in range(8)])
    counts = [int(sum(correct[i * 8 : (i + 1) * 8])) for i in range(32)]
    return {
        "accuracy": accuracy,
        "pass@1": statistics.mean(pass_at_k(8, c, 1) for c in counts),
        "pass@8": statistics.mean(pass_at_k(8, c, 8) for c in counts),
    }


def run(model_path: str, method: dict, seed: int, steps: int, lr: float, setting: str) -> dict:
    train = train_collapse_setting if setting == "sums" else train_chains_setting
    trainer = train(
        model_path, steps=steps, lr=lr, seed=seed, diversity_metrics=["distinct", "repetition", "entropy"], **method
    )
    logs = [h for h in trainer.state.log_history if "entropy" in h]
    last = logs[-10:]
    rewards = [h["reward"] for h in logs if "reward" in h]  # generation steps only (num_iterations > 1 reuses)
    result = {
        "steps": [h["step"] for h in logs],
        "entropy_curve": [h["entropy"] for h in logs],
        "reward_steps": [h["step"] for h in logs if "reward" in h],
        "reward_curve": rewards,
        "final_entropy": statistics.mean(h["entropy"] for h in last),
        "auc_entropy": statistics.mean(h["entropy"] for h in logs),
        "final_reward": statistics.mean(rewards[-10:]),
        "distinct_2": statistics.mean(h["diversity/distinct_2"] for h in last if "diversity/distinct_2" in h),
        "repetition": statistics.mean(h["diversity/repetition"] for h in last if "diversity/repetition" in h),
    }
    result.update(held_out(trainer.model, testkit.build_char_tokenizer(), seed, setting))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--setting", choices=list(SETTINGS), default="sums")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="default: 60 (sums), 100 (chains)")
    parser.add_argument("--lr", type=float, default=None, help="default: 5e-3 (sums), 2e-4 (chains)")
    parser.add_argument("--methods", nargs="+", default=None, help="default: all")
    parser.add_argument("--out", default="anti_collapse_study")
    parser.add_argument("--table", default=None, help="also write the markdown table to this file")
    parser.add_argument("--cache", default=default_cache(), help="where the chains warm start is cached")
    args = parser.parse_args()
    spec = SETTINGS[args.setting]
    args.lr = spec.lr if args.lr is None else args.lr
    args.steps = spec.steps if args.steps is None else args.steps
    compared = methods(spec.entropy_target)
    args.methods = args.methods or list(compared)
    unknown = set(args.methods) - set(compared)
    if unknown:
        parser.error(f"unknown method(s) {sorted(unknown)}; choose from {list(compared)}")
    os.makedirs(args.out, exist_ok=True)
    tok = testkit.build_char_tokenizer()
    if args.setting == "sums":
        model_path = testkit.save_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"))
    else:
        model_path = chains_warm_start(args.cache)
    results: dict[str, list[dict]] = {m: [] for m in args.methods}
    for seed in args.seeds:  # interleaved: every method once per seed
        for name in args.methods:
            results[name].append(run(model_path, compared[name], seed, args.steps, args.lr, args.setting))
            r = results[name][-1]
            print(
                f"seed {seed} {name}: final entropy {r['final_entropy']:.3f}, reward {r['final_reward']:.3f}, "
                f"accuracy {r['accuracy']:.3f}",
                flush=True,
            )
    prefix = "anti_collapse" if args.setting == "sums" else f"anti_collapse_{args.setting}"
    with open(os.path.join(args.out, f"{prefix}_results.json"), "w") as f:
        json.dump(results, f)
    keys = [
        "final_entropy",
        "auc_entropy",
        "final_reward",
        "accuracy",
        "pass@1",
        "pass@8",
        "distinct_2",
        "repetition",
    ]
    header = "| method | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys) + "\n"
    rows = []
    for name, runs in results.items():
        cells = []
        for key in keys:
            values = [r[key] for r in runs]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.3f} +- {spread:.3f}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    if args.setting == "chains":  # the warm start on the same held-out problems, for reference
        from transformers import AutoModelForCausalLM

        start = [
            held_out(AutoModelForCausalLM.from_pretrained(model_path), tok, seed, args.setting) for seed in args.seeds
        ]
        cells = []
        for key in keys:
            values = [r[key] for r in start] if key in start[0] else None
            cells.append(
                f"{statistics.mean(values):.3f} +- {statistics.stdev(values) if len(values) > 1 else 0.0:.3f}"
                if values
                else ""
            )
        rows.insert(0, "| (SFT warm start, no GRPO) | " + " | ".join(cells) + " |")
    table = header + "\n".join(rows) + "\n"
    print(f"\nsetting={args.setting} lr={args.lr} steps={args.steps} seeds={args.seeds}\n" + table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table)

    path = os.path.join(args.out, f"{prefix}_entropy.png")
    plot_curves(results, path, title=f"Anti-collapse tools vs vanilla GRPO ({args.setting}, lr {args.lr})")
    print(path)


def plot_curves(results: dict[str, list[dict]], path: str, *, title: str, smooth: int = 5) -> None:
    """Entropy and training reward per method (mean of seeds, rolling mean over ``smooth`` logged points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def rolling(values: list[float]) -> list[float]:
        return [statistics.mean(values[max(0, i - smooth + 1) : i + 1]) for i in range(len(values))]

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for (x_key, key), ax in zip([("steps", "entropy_curve"), ("reward_steps", "reward_curve")], axes, strict=True):
        for i, (name, runs) in enumerate(results.items()):
            curve = torch.tensor([r[key] for r in runs]).mean(0).tolist()
            style = "-" if i < 10 else "--"
            width = 2.5 if name == "vanilla" else 1.2
            x = runs[0].get(x_key, list(range(1, len(curve) + 1)))  # older result files have no step lists
            ax.plot(x, rolling(curve), style, label=name, linewidth=width)
        ax.set_xlabel("step")
        what = "mean token entropy" if key == "entropy_curve" else "training reward"
        ax.set_ylabel(f"{what} (mean of {len(next(iter(results.values())))} seeds, rolling {smooth})")
        ax.grid(alpha=0.3)
    axes[0].set_title(title)
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
