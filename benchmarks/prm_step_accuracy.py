"""Does GRPO with PRM advantages move a policy toward correct steps? A side-by-side study on the offline task.

    python benchmarks/prm_step_accuracy.py                      # 3 methods x 3 seeds, about 25 minutes on 2 CPU cores
    python benchmarks/prm_step_accuracy.py --seeds 0 --runs grpo prm --batch 64       # a quick look (3 minutes)

1. SFT warm start (TRL SFTTrainer) of a tiny random Llama on two-operation chains, cached in ``--cache``.
2. Greedy step accuracy and answer accuracy on ``--heldout`` held-out problems.
3. GRPO runs from that start, one per method and seed, same data, batch and budget: outcome advantages (``grpo``),
   PRM advantages from the rule-based step reward (``prm``), PRM plus the outcome advantage (``prm+outcome``,
   ``prm_outcome_coef=1``). Every run also logs the sampled completions' step accuracy as a weight-0 reward
   (``rewards/step_accuracy_reward/mean``), so the training curves are comparable across methods.
4. The same held-out measurements after each run: a table of mean +- std over seeds (and the change from the start),
   a JSON file and a plot of the training curves in ``--out``.

Step accuracy = fraction of generated steps that the rule-based step reward scores 1 (on the problem's path, right
arithmetic, or the answer at its place).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
from collapse_setting import chains_warm_start, default_cache, train_chains_setting
from transformers import AutoModelForCausalLM

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtTrainer
from trl_grpo_ext.prm import segment_completion

METHODS = {
    # name: (advantage_estimator, prm_outcome_coef)
    "grpo": ("grpo", 0.0),
    "prm": ("prm", 0.0),
    "prm+outcome": ("prm", 1.0),
}


@torch.no_grad()
def evaluate(model, tok, problems) -> dict[str, float]:
    model.eval()
    enc = tok([r["prompt"] for r in problems], return_tensors="pt", padding=True)
    out = model.generate(
        **enc, max_new_tokens=20, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    completions = out[:, enc["input_ids"].shape[1] :]
    steps = [segment_completion(tok, [i for i in row if i != tok.pad_token_id]).texts for row in completions.tolist()]
    answers = [r["answer"] for r in problems]
    scores = [
        x for row in testkit.arithmetic_step_reward([r["prompt"] for r in problems], None, steps, answers) for x in row
    ]
    texts = tok.batch_decode(completions, skip_special_tokens=True)
    return {
        "step_acc": sum(scores) / max(len(scores), 1),
        "answer_acc": sum(testkit.final_answer_reward(texts, answer=answers)) / len(texts),
        "steps_per_completion": len(scores) / len(texts),
    }


def train_one(method: str, start: str, args, seed: int) -> tuple[GRPOExtTrainer, list[tuple[int, float]]]:
    estimator, outcome_coef = METHODS[method]
    trainer = train_chains_setting(
        start,
        steps=args.steps,
        lr=args.lr,
        seed=seed,
        reward_funcs=[testkit.final_answer_reward, testkit.step_accuracy_reward],
        step_reward_funcs=[testkit.arithmetic_step_reward] if estimator == "prm" else None,
        reward_weights=[1.0, 0.0],  # the step-accuracy reward is logged, never trained on
        per_device_train_batch_size=args.batch,
        num_generations=args.num_generations,
        lr_scheduler_type=args.lr_scheduler,
        temperature=args.temperature,
        logging_steps=10,
        advantage_estimator=estimator,
        prm_outcome_coef=outcome_coef,
    )
    curve = [
        (h["step"], h["rewards/step_accuracy_reward/mean"])
        for h in trainer.state.log_history
        if "rewards/step_accuracy_reward/mean" in h
    ]
    return trainer, curve


def mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values) if len(values) > 1 else 0.0:.3f}"


def plot(results: dict, start: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for method, runs in results.items():
        steps = [s for s, _ in runs[0]["curve"]]
        curves = [[v for _, v in run["curve"]] for run in runs]
        mean = [statistics.mean(c[i] for c in curves) for i in range(len(steps))]
        (line,) = left.plot(steps, mean, label=method)
        for c in curves:
            left.plot(steps, c, color=line.get_color(), alpha=0.25, linewidth=0.8)
    left.set_xlabel("GRPO step")
    left.set_ylabel("step accuracy of sampled completions")
    left.set_title("training (mean of seeds, thin: each seed)")
    left.legend()
    names = ["SFT start", *results]
    for i, key in enumerate(["step_acc", "answer_acc"]):
        values = [[start[key]], *[[run["eval"][key] for run in runs] for runs in results.values()]]
        x = [j + 0.4 * i for j in range(len(names))]
        right.bar(x, [statistics.mean(v) for v in values], width=0.4, label=key.replace("_", " "))
        for xj, v in zip(x, values, strict=True):
            right.scatter([xj] * len(v), v, color="black", s=8, zorder=3)
    right.set_xticks([j + 0.2 for j in range(len(names))], names)
    right.set_ylim(0, 1)
    right.set_title("held-out, greedy (dots: seeds)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--lr_scheduler", default="constant")
    parser.add_argument("--batch", type=int, default=256, help="completions per step (prompts x num_generations)")
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--sft_epochs", type=float, default=5.0)
    parser.add_argument("--sft_seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="GRPO seeds (same warm start)")
    parser.add_argument("--heldout", type=int, default=512)
    parser.add_argument("--cache", default=default_cache(), help="where the SFT warm start is cached")
    parser.add_argument("--out", default="prm_study_out", help="folder for the JSON results and the plot")
    parser.add_argument("--runs", nargs="+", default=list(METHODS), choices=list(METHODS))
    args = parser.parse_args()

    tok = testkit.build_char_tokenizer()
    start_path = chains_warm_start(args.cache, epochs=args.sft_epochs, seed=args.sft_seed)
    heldout = testkit.multistep_dataset(args.heldout, seed=10_000 + args.sft_seed, ops="+")
    start = evaluate(AutoModelForCausalLM.from_pretrained(start_path), tok, heldout)
    results: dict[str, list[dict]] = {method: [] for method in args.runs}
    for seed in args.seeds:  # interleaved: every method once per seed
        for method in args.runs:
            trainer, curve = train_one(method, start_path, args, seed)
            results[method].append({"seed": seed, "eval": evaluate(trainer.model, tok, heldout), "curve": curve})
            print(f"done: {method} seed {seed}: {results[method][-1]['eval']}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "prm_step_accuracy.json"), "w") as f:
        settings = {k: v for k, v in vars(args).items() if k not in ("out", "cache")}  # no local paths
        json.dump({"args": settings, "start": start, "results": results}, f, indent=1)
    plot(results, start, os.path.join(args.out, "prm_step_accuracy.png"))
    print(
        f"\nsteps={args.steps} lr={args.lr} ({args.lr_scheduler}) T={args.temperature} batch={args.batch} "
        f"G={args.num_generations} seeds={args.seeds}; {args.heldout} held-out problems, greedy; mean +- std over seeds"
    )
    print(f"{'run':<14}{'step_acc':>18}{'d step_acc':>12}{'answer_acc':>18}{'d answer_acc':>14}{'train step acc':>16}")
    print(f"{'SFT start':<14}{start['step_acc']:>18.3f}{'':>12}{start['answer_acc']:>18.3f}")
    for method, runs in results.items():
        step = [r["eval"]["step_acc"] for r in runs]
        answer = [r["eval"]["answer_acc"] for r in runs]
        first = statistics.mean(r["curve"][0][1] for r in runs)
        last = statistics.mean(r["curve"][-1][1] for r in runs)
        print(
            f"{method:<14}{mean_std(step):>18}{statistics.mean(step) - start['step_acc']:>+12.3f}"
            f"{mean_std(answer):>18}{statistics.mean(answer) - start['answer_acc']:>+14.3f}"
            f"{f'{first:.2f} -> {last:.2f}':>16}"
        )
    print(os.path.join(args.out, "prm_step_accuracy.png"))


if __name__ == "__main__":
    main()
