"""Studies that can tell whether a tool helps, by the project's evidence standard (docs/results.md,
grpo_lab.stats).

    python benchmarks/evidence_study.py --study forks_tools     # the tools vs vanilla on the many-answers task
    python benchmarks/evidence_study.py --study forks_tools2    # more tools, same task and vanilla runs
    python benchmarks/evidence_study.py --study forks_cov       # Clip-Cov / KL-Cov at the paper's and 10x ratios
    python benchmarks/evidence_study.py --study forks_knobs     # TRL's own knobs vs vanilla on the same task
    python benchmarks/evidence_study.py --study forks_knobs2    # two more of TRL's knobs
    python benchmarks/evidence_study.py --study forks_frontier  # vanilla stopped earlier: the trade-off for free
    python benchmarks/evidence_study.py --study forks_pkpo      # pass@k advantages (PKPO) on the same task
    python benchmarks/evidence_study.py --study forks_explore   # W-REINFORCE and entropy-shaped advantages
    python benchmarks/evidence_study.py --study forks_dynamic   # dynamic sampling (DAPO's refill)
    python benchmarks/evidence_study.py --study forks_dppo      # DPPO's trust region against TRL's ratio clip
    python benchmarks/evidence_study.py --study forks_entropy   # TRL's adaptive entropy bonus (AEPO's baseline)
    python benchmarks/evidence_study.py --study length_kl       # KL control vs a length-biased proxy reward
    python benchmarks/evidence_study.py --study length_adaptive # the default tools' KL controller alone there
    python benchmarks/evidence_study.py --study length_other    # PF-PPO's filter and the default tools there
    python benchmarks/evidence_study.py --study length_clean    # trained on the clean reward (the alarm's false alarms)
    python benchmarks/evidence_study.py --study forks_tools --report   # the table from the saved runs only
    python benchmarks/evidence_study.py --picker                # PF-PPO's R^2 picker on the length-biased reward

Every run is one (warm start, GRPO seed, arm): the warm start is the SFT seed (its own model and data order), the GRPO
seed is nested in it. Every arm is paired with vanilla on the same warm start, GRPO seed, budget and evaluation
samples. Defaults (6 warm starts x 2 GRPO seeds, the ``test`` half of the held-out prompts) make a headline study;
``--split validation`` is for choosing settings (and says so in its table). Runs are saved one file each under
``<out>/runs/<testbed>/<split>/<arm>/w<warm start>-g<seed>.json`` and reused: vanilla runs are shared by every study,
and an interrupted study resumes. ``--workers 2`` trains two runs at a time (one thread each; a run's numbers do not
depend on what runs beside it).

The report gives, per arm and metric, the mean paired difference (arm - vanilla) with its 95% two-stage cluster
bootstrap interval (warm starts, then seeds within them; 10,000 resamples) and the verdict (helps / hurts / no effect
shown, "exploratory" below 6 x 2), plus the evaluation's own noise: the binomial standard error of one model's pass@1
on the evaluation prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: How many evaluation prompts and samples per prompt a run is scored on (pass@k up to k = SAMPLES).
EVAL_PROMPTS = 128
SAMPLES = 64


@dataclass(frozen=True)
class Arm:
    """One configuration: GRPOExtConfig fields on top of the testbed's GRPO settings; ``reward``: which of the
    testbed's rewards trains it (the length-biased testbed's ``proxy``, or its ``gold`` for the clean runs)."""

    config: dict = field(default_factory=dict)
    note: str = ""
    reward: str = "default"


#: study -> the testbed it runs on
TESTBED_OF = {
    "forks_tools": "forks",
    "forks_tools2": "forks",
    "forks_cov": "forks",
    "forks_knobs": "forks",
    "forks_knobs2": "forks",
    "forks_frontier": "forks",
    "forks_pkpo": "forks",
    "forks_explore": "forks",
    "forks_dynamic": "forks",
    "forks_dppo": "forks",
    "forks_entropy": "forks",
    "length_kl": "length_bias",
    "length_adaptive": "length_bias",
    "length_other": "length_bias",
    "length_clean": "length_bias",
    "length_reference": "length_bias",
}


def studies() -> dict[str, dict[str, Arm]]:
    from grpo_lab import testbed
    from grpo_lab.testbeds import length_bias

    tools = dict(testbed.DEFAULT_TOOLS)
    return {
        # Two arms a study (24 runs, under 30 minutes on 2 cores); an arm's runs are stored once and shared.
        "forks_tools": {
            "default tools": Arm(tools, "KL-Cov k 2e-2 + adaptive KL (cap 0.3) + AEPO target 0.2"),
            "KL-Cov k=2e-3": Arm({"token_clip": "kl_cov", "kl_cov_ratio": 2e-3}, "the paper's ratio for 7B"),
        },
        "forks_tools2": {
            "AEPO (target 0.2)": Arm({"entropy_control": "aepo", "aepo_target_entropy": 0.2}),
            "adaptive KL": Arm({k: tools[k] for k in ("beta", "kl_control", "kl_target", "kl_horizon", "kl_beta_max")}),
        },
        "forks_cov": {
            "Clip-Cov r=2e-4": Arm({"token_clip": "clip_cov", "clip_cov_ratio": 2e-4}, "the paper's ratio"),
            "KL-Cov k=2e-2": Arm({"token_clip": "kl_cov", "kl_cov_ratio": 2e-2}, "ten times the paper's"),
        },
        "forks_knobs": {
            "epsilon_high=0.28": Arm({"epsilon_high": 0.28}, "clip-higher (DAPO)"),
            "fixed beta 0.04": Arm({"beta": 0.04}, "TRL's KL term, constant"),
        },
        "forks_knobs2": {
            "temperature 1.0": Arm({"temperature": 1.0}, "rollout temperature"),
            "top_entropy_quantile=0.2": Arm({"top_entropy_quantile": 0.2}, "train on the top-20% entropy tokens"),
        },
        # Is "more distinct right answers" more than "trained less"? Vanilla stopped earlier (its own schedule, so the
        # learning rate still decays to 0) traces the accuracy / diversity trade-off a user gets for free.
        "forks_frontier": {
            "vanilla, 100 steps": Arm({"max_steps": 100}, "vanilla with 100 instead of 250 steps"),
            "vanilla, 150 steps": Arm({"max_steps": 150}, "vanilla with 150 instead of 250 steps"),
        },
        # PKPO (advantage_estimator="pass_at_k"): the gradient of pass@k instead of pass@1 (exploratory: issue 28).
        "forks_pkpo": {
            "PKPO k=4": Arm({"advantage_estimator": "pass_at_k", "pkpo_k": 4}, "s^(loo-1) weights, k = 4 of 8"),
            "PKPO k=8": Arm({"advantage_estimator": "pass_at_k", "pkpo_k": 8}, "s^(loo-1) weights, k = 8 of 8"),
        },
        # W-REINFORCE and entropy-shaped advantages at their papers' settings (exploratory: issue 28).
        "forks_explore": {
            "W-REINFORCE lambda=0.1": Arm(
                {"advantage_weighting": "w_reinforce", "w_reinforce_lambda": 0.1}, "+0.1 right / -1 wrong, no baseline"
            ),
            "entropy-shaped advantages": Arm(
                {"advantage_weighting": "entropy_advantage", "entropy_adv_alpha": 0.4, "entropy_adv_kappa": 2.0},
                "A + min(0.4 H, |A| / 2) per token",
            ),
        },
        # Dynamic sampling (DAPO): late in training most groups are all right, so refilling them keeps the batch's
        # signal (exploratory: issue 28); its cost is each run's time against vanilla's.
        "forks_dynamic": {
            "dynamic sampling": Arm(
                {"refill": "dynamic_sampling", "dynamic_sampling_max_rounds": 3},
                "groups without signal refilled, up to 3 rounds",
            ),
        },
        # DPPO's binary trust region in place of TRL's ratio clip (vanilla: TRL's clip 0.2; clip-higher: forks_knobs)
        # on the off-policy mini-batches of this task (steps_per_generation 4), at prime-rl's bound and a tighter one.
        "forks_dppo": {
            "DPPO-TV 0.2": Arm({"token_clip": "dppo"}, "binary TV, bounds 0.2 (prime-rl's default)"),
            "DPPO-TV 0.05": Arm(
                {"token_clip": "dppo", "dppo_delta_low": 0.05, "dppo_delta_high": 0.05}, "binary TV, bounds 0.05"
            ),
        },
        # TRL 1.16's adaptive entropy bonus (Skywork-OR1) at AEPO's target (forks_tools2's "AEPO (target 0.2)") and
        # TRL's defaults otherwise: the baseline a user compares AEPO and entropy-shaped advantages with.
        "forks_entropy": {
            "TRL adaptive entropy (target 0.2)": Arm(
                {"use_adaptive_entropy": True, "entropy_target": 0.2}, "entropy_coef moved by 0.005 a step"
            ),
        },
        "length_kl": {
            "fixed beta 0.04": Arm({"beta": 0.04}, "TRL's KL term, constant"),
            "diversity KL": Arm(dict(length_bias.TOOLS), "beta rises while Distinct-2 is under 0.3"),
        },
        "length_adaptive": {
            "adaptive KL": Arm({k: tools[k] for k in ("beta", "kl_control", "kl_target", "kl_horizon", "kl_beta_max")}),
        },
        "length_other": {
            "PF best_worst": Arm({"sample_filter": "best_worst"}, "PF-PPO's best-worst filter"),
            "default tools": Arm(tools, "KL-Cov k 2e-2 + adaptive KL (cap 0.3) + AEPO target 0.2"),
        },
        # The KL anchor that moves (beside length_kl's fixed beta 0.04): ProRL's reset and TRL's own mixing, every 50
        # steps at the same beta.
        "length_reference": {
            "reference reset every 50": Arm(
                {"beta": 0.04, "ref_update": "reset", "ref_reset_steps": 50}, "the reference becomes the policy"
            ),
            "sync_ref_model every 50": Arm(
                {"beta": 0.04, "sync_ref_model": True, "ref_model_sync_steps": 50}, "TRL's mixing, alpha 0.6"
            ),
        },
        # The clean-reward runs: the alarm's false alarms.
        "length_clean": {
            "vanilla, clean reward": Arm(reward="gold", note="trained on the gold reward: the alarm's false alarms"),
        },
    }


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", name).strip("_")


# ---------------------------------------------------------------------------------------------------------------- runs
def run_one(job: dict) -> dict:
    """Train one (warm start, seed, arm) and evaluate it; runs in a worker process (one thread)."""
    import torch

    torch.set_num_threads(1)
    return {"forks": run_forks, "length_bias": run_length_bias}[job["testbed"]](job)


def run_forks(job: dict) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    from grpo_lab.evaluation import sampled_evaluation
    from grpo_lab.testbeds import forks
    from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer

    start = time.time()
    path = forks.warm_start(job["cache"], seed=job["warm_start"], log=lambda *_: None)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = forks.problems(EVAL_PROMPTS, split=job["split"], seed=0)["prompt"]

    def evaluate(model) -> dict:
        sampled = sampled_evaluation(
            model,
            tokenizer,
            prompts,
            gold=forks.gold,
            samples=SAMPLES,
            temperature=1.0,
            max_new_tokens=forks.MAX_COMPLETION_LENGTH,
            seed=job["warm_start"],
        )
        # greedy, as sampling at T = 1e-6 (the argmax but for exact ties)
        greedy = sampled_evaluation(
            model, tokenizer, prompts, gold=forks.gold, samples=1, temperature=1e-6,
            max_new_tokens=forks.MAX_COMPLETION_LENGTH, seed=0,
        )  # fmt: skip
        return {
            "pass_at_k": {str(k): v for k, v in sampled["pass_at_k"].items()},
            "distinct_correct": sampled["distinct_correct"],
            "greedy_accuracy": greedy["gold"],
        }

    if job["arm"] == "start":
        result = evaluate(AutoModelForCausalLM.from_pretrained(path))
        return {**job, "eval": result, "seconds": time.time() - start}
    grpo_seed = job["warm_start"] + 100 * job["seed"]
    config = forks.grpo_settings(**{"seed": grpo_seed, "max_steps": job["steps"], **job["config"]})
    args = GRPOExtConfig(**config, output_dir=os.path.join(job["cache"], "runs", f"{os.getpid()}"), disable_tqdm=True)
    set_seed(grpo_seed)
    train = forks.problems(job["steps"] * 16, split="train", seed=grpo_seed + 1)
    trainer = GRPOExtTrainer(
        model=path, reward_funcs=[forks.gold_reward], args=args, train_dataset=train, processing_class=tokenizer
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    curves = {
        key: [(h["step"], h[key]) for h in logs if key in h]
        for key in ("reward", "entropy", "kl", "kl/beta", "aepo/temperature")
    }
    return {**job, "eval": evaluate(trainer.model), "curves": curves, "seconds": time.time() - start}


#: Held-out evaluation of the length-biased testbed: samples per prompt (T as in training) and the checkpoint spacing.
LENGTH_SAMPLES = 8
LENGTH_EVERY = 25


def run_length_bias(job: dict) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    from grpo_lab import testbed
    from grpo_lab.evaluation import (
        SampledEvaluationCallback,
        greedy_accuracy,
        proxy_gold_gap,
        sample_completions,
    )
    from grpo_lab.testbeds import length_bias
    from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer
    from trl_grpo_ext.core.diversity import repetition_rate

    start = time.time()
    path = length_bias.warm_start(job["cache"], seed=job["warm_start"], log=lambda *_: None)
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = length_bias.problems(job["split"])
    prompts, answers = list(rows["prompt"]), dict(zip(rows["prompt"], rows["answer"], strict=True))

    def gold(p, c):
        return [x == 1.0 for x in length_bias.gold_reward(c, [answers[q] for q in p])]

    def proxy(p, c):
        return length_bias.proxy_reward(c, [answers[q] for q in p])

    settings = length_bias.grpo_settings()
    common = dict(
        gold=gold, proxy=proxy, samples=LENGTH_SAMPLES, temperature=settings["temperature"],
        max_new_tokens=length_bias.MAX_COMPLETION_LENGTH, seed=0,
    )  # fmt: skip

    def evaluate(model) -> dict:
        texts = sample_completions(
            model, tokenizer, prompts, samples=LENGTH_SAMPLES, temperature=settings["temperature"],
            max_new_tokens=length_bias.MAX_COMPLETION_LENGTH, seed=0,
        )  # fmt: skip
        flat_prompts = [p for p in prompts for _ in range(LENGTH_SAMPLES)]
        flat = [t for row in texts for t in row]
        gap = proxy_gold_gap(proxy(flat_prompts, flat), [float(x) for x in gold(flat_prompts, flat)])
        return {
            "greedy_gold": greedy_accuracy(
                model, tokenizer, prompts, gold=gold, max_new_tokens=length_bias.MAX_COMPLETION_LENGTH
            ),
            "gold": gap["gold"],
            "proxy": gap["proxy"],
            "gap": gap["gap"],
            "length": statistics.fmean(len(t) for t in flat),
            "repetition": statistics.fmean(repetition_rate(list(t), 3) for t in flat),
        }

    if job["arm"] == "start":
        result = evaluate(AutoModelForCausalLM.from_pretrained(path))
        return {**job, "eval": result, "seconds": time.time() - start}
    grpo_seed = job["warm_start"] + 100 * job["seed"]
    config = length_bias.grpo_settings(
        **{"seed": grpo_seed, "max_steps": job["steps"], **length_bias.MONITOR, **job["config"]}
    )
    args = GRPOExtConfig(**config, output_dir=os.path.join(job["cache"], "runs", f"{os.getpid()}"), disable_tqdm=True)
    set_seed(grpo_seed)
    reward = length_bias.gold_reward if job["reward"] == "gold" else length_bias.proxy_reward
    train = testbed.addition_problems(job["steps"] * 16, split="train", seed=grpo_seed + 1)
    checkpoints = SampledEvaluationCallback(
        range(LENGTH_EVERY, job["steps"] + 1, LENGTH_EVERY), tokenizer, prompts, **common
    )
    trainer = GRPOExtTrainer(
        model=path, reward_funcs=[reward], args=args, train_dataset=train, processing_class=tokenizer,
        callbacks=[checkpoints],
    )  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    curves = {
        key: [(h["step"], h[key]) for h in logs if key in h]
        for key in ("reward", "entropy", "kl", "kl/beta", "diversity/repetition", "diversity/distinct_2")
    }
    curves["gold"] = [(step, r["gold"]) for step, r in sorted(checkpoints.results.items())]
    curves["proxy"] = [(step, r["proxy"]) for step, r in sorted(checkpoints.results.items())]
    alarms = [step for step, _ in trainer.collapse_monitor.alarms]
    return {
        **job,
        "eval": evaluate(trainer.model),
        "curves": curves,
        "alarm_steps": alarms,
        "seconds": time.time() - start,
    }


#: PF-PPO's picker (sec. 4.2) on the length-biased testbed: labelled training prompts x samples of each warm start.
PICKER_PROMPTS = 64
PICKER_SAMPLES = 8


def length_picker(cache: str, warm_start: int) -> list[tuple[str, float]]:
    """PF-PPO's choice of filter where the reward is the length-biased proxy: the R^2 between proxy and gold on the
    kept samples of :data:`PICKER_PROMPTS` training prompts (not the evaluation halves) x :data:`PICKER_SAMPLES`
    samples of the warm start at the training temperature, per strategy, best first (``none``: no filter)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_lab import testbed
    from grpo_lab.evaluation import sample_completions
    from grpo_lab.testbeds import length_bias
    from trl_grpo_ext.core import rank_filter_strategies

    torch.set_num_threads(1)
    path = length_bias.warm_start(cache, seed=warm_start, log=lambda *_: None)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    rows = testbed.addition_problems(PICKER_PROMPTS, seed=70_000 + warm_start, split="train")
    temperature = length_bias.grpo_settings()["temperature"]
    texts = sample_completions(
        model, tokenizer, rows["prompt"], samples=PICKER_SAMPLES, temperature=temperature,
        max_new_tokens=length_bias.MAX_COMPLETION_LENGTH, seed=warm_start,
    )  # fmt: skip
    flat = [t for row in texts for t in row]
    answers = [a for a in rows["answer"] for _ in range(PICKER_SAMPLES)]
    proxy = torch.tensor(length_bias.proxy_reward(flat, answers))
    gold = torch.tensor(length_bias.gold_reward(flat, answers))
    generator = torch.Generator().manual_seed(warm_start)
    return rank_filter_strategies(proxy, gold, PICKER_SAMPLES, generator=generator)


def picker_path(out: Path) -> Path:
    return out / "runs" / "length_bias" / "picker.json"


def picker_lines(out: Path, warm_starts) -> list[str]:
    """The picker's ranking per warm start (from ``--picker``'s saved file), and how often each strategy won."""
    path = picker_path(out)
    if not path.exists():
        return []
    saved = {int(w): ranking for w, ranking in json.loads(path.read_text()).items() if int(w) in warm_starts}
    if not saved:
        return []
    wins = statistics.multimode(ranking[0][0] for ranking in saved.values())
    lines = [
        "",
        f"PF-PPO's R^2 picker (`--picker`: proxy vs gold on {PICKER_PROMPTS} training prompts x {PICKER_SAMPLES} "
        f"samples of each warm start; `none` = no filter): first choice {' / '.join(wins)} on "
        f"{sum(r[0][0] in wins for r in saved.values())} of {len(saved)} warm starts.",
    ]
    for w, ranking in sorted(saved.items()):
        lines.append(f"- warm start {w}: " + ", ".join(f"{name} {r2:.3f}" for name, r2 in ranking))
    return lines


def run_path(out: Path, split: str, arm: str, warm_start: int, seed: int, testbed: str = "forks") -> Path:
    return out / "runs" / testbed / split / slug(arm) / f"w{warm_start}-g{seed}.json"


def collect(out: Path, split: str, arm: str, warm_starts, seeds, testbed: str = "forks") -> dict[tuple[int, int], dict]:
    found = {}
    for w in warm_starts:
        for g in seeds:
            path = run_path(out, split, arm, w, g, testbed)
            if path.exists():
                found[(w, g)] = json.loads(path.read_text())
    return found


# -------------------------------------------------------------------------------------------------------------- report
#: testbed -> (metric key, label, scale, format) of the report
METRICS = {
    "forks": (
        ("distinct_correct", "distinct right answers / prompt", 1.0, "{:+.2f}"),
        ("pass@1", "pass@1 (points)", 100.0, "{:+.1f}"),
        ("pass@64", "pass@64 (points)", 100.0, "{:+.1f}"),
        ("greedy_accuracy", "greedy accuracy (points)", 100.0, "{:+.1f}"),
    ),
    "length_bias": (
        ("greedy_gold", "gold, greedy (points)", 100.0, "{:+.1f}"),
        ("gold", "gold, sampled (points)", 100.0, "{:+.1f}"),
        ("proxy", "proxy reward", 1.0, "{:+.3f}"),
        ("gap", "proxy - gold (less is better)", 1.0, "{:+.3f}"),
        ("repetition", "repetition, 3-grams (less is better)", 1.0, "{:+.3f}"),
    ),
}


#: Metrics where less is better (the verdict's words swap), and metrics that get no verdict (the training reward).
LOWER_IS_BETTER = {"gap", "repetition"}
NO_VERDICT = {"proxy"}


def judged(interval, key: str) -> str:
    """The verdict of ``interval`` for metric ``key`` (see :data:`LOWER_IS_BETTER`, :data:`NO_VERDICT`)."""
    from grpo_lab.stats import verdict

    if key in NO_VERDICT:
        return "(the training reward: no verdict)"
    return verdict(interval, higher_is_better=key not in LOWER_IS_BETTER)


def metric(run: dict, name: str) -> float:
    evaluation = run["eval"]
    if name.startswith("pass@"):
        return evaluation["pass_at_k"][name[5:]]
    return evaluation[name]


def summary(runs: list[dict], testbed: str = "forks") -> str:
    """Means of the report's metrics over some runs."""
    return ", ".join(
        f"{label.split(' (')[0]} {statistics.mean(metric(r, key) for r in runs):.3f}"
        for key, label, *_ in METRICS[testbed]
    )


def collapse_step(gold: list) -> int | None:
    """The first checkpoint after the gold peak where held-out gold is under half the peak (None: it never fell so)."""
    peak_at = max(range(len(gold)), key=lambda i: gold[i][1])
    peak = gold[peak_at][1]
    return next((step for step, value in gold[peak_at:] if value < peak / 2), None)


def when(lead: float) -> str:
    """A signed lead in steps as words: 30 -> "30 steps before", -12 -> "12 steps after"."""
    return f"{lead:.0f} steps before" if lead >= 0 else f"{-lead:.0f} steps after"


def alarm_lines(runs_by_arm: dict[str, dict]) -> list[str]:
    """The collapse alarm on the length-biased testbed: per arm, the runs where it fired, its lead over the gold
    peak (the checkpoint of highest held-out gold) and over the collapse (gold under half its peak); positive: the
    alarm came first. Held-out gold is measured every 25 steps, so leads are within 25 steps."""
    lines = []
    for name, runs in runs_by_arm.items():
        if not runs:
            continue
        fired, peak_leads, collapse_leads, collapsed = 0, [], [], 0
        for run in runs.values():
            gold = run.get("curves", {}).get("gold") or []
            fall = collapse_step(gold) if gold else None
            collapsed += fall is not None
            if not run.get("alarm_steps"):
                continue
            fired += 1
            if gold:
                peak_leads.append(max(gold, key=lambda point: point[1])[0] - run["alarm_steps"][0])
            if fall is not None:
                collapse_leads.append(fall - run["alarm_steps"][0])
        text = f"- {name}: gold fell under half its peak in {collapsed} of {len(runs)} runs; the alarm fired in {fired}"
        if peak_leads:
            text += f", {when(statistics.median(peak_leads))} the gold peak (median)"
        if collapse_leads:
            text += (
                f", {when(statistics.median(collapse_leads))} the collapse (median over the {len(collapse_leads)} "
                f"runs with both; leads from {min(collapse_leads):+d} to {max(collapse_leads):+d} steps)"
            )
        lines.append(text)
    return lines


def report(out: Path, study: str, split: str, warm_starts, seeds) -> str:
    from grpo_lab.stats import cluster_bootstrap, paired_differences

    testbed = TESTBED_OF[study]
    arms = studies()[study]
    vanilla = collect(out, split, "vanilla", warm_starts, seeds, testbed)
    start = {w: run for (w, _), run in collect(out, split, "start", warm_starts, [0], testbed).items()}
    how = {
        "forks": f"{EVAL_PROMPTS} prompts x {SAMPLES} samples at T 1.0; greedy accuracy on the same prompts",
        "length_bias": f"every prompt of the half x {LENGTH_SAMPLES} samples at T 0.7, and greedy",
    }[testbed]
    lines = [
        f"Study `{study}` on the {testbed} testbed, `{split}` prompts ({how}). Paired with vanilla run by run; 95% "
        f"two-stage cluster bootstrap interval (warm starts, then GRPO seeds), 10,000 resamples. {len(arms)} arms in "
        "this table."
    ]
    if split != "test":
        lines.append("**Validation prompts: for choosing settings, not a reported result.**")
    if vanilla:
        runs = list(vanilla.values())
        lines.append(f"vanilla ({len(runs)} runs): {summary(runs, testbed)}")
        if testbed == "forks":
            p1 = statistics.mean(metric(r, "pass@1") for r in runs)
            lines.append(
                f"evaluation noise: pass@1 of one model on {EVAL_PROMPTS} prompts has a binomial standard error of at "
                f"most {100 * math.sqrt(p1 * (1 - p1) / EVAL_PROMPTS):.1f} points (one sample per prompt; {SAMPLES} "
                "samples lower it)"
            )
    if start:
        lines.append(f"warm starts ({len(start)}): {summary(list(start.values()), testbed)}")
    lines += ["", "| arm | metric | arm | vanilla | arm - vanilla [95% interval] | verdict | runs (warm starts) |"]
    lines.append("|---|---|---|---|---|---|---|")
    runs_by_arm = {"vanilla": vanilla}
    for name in arms:
        runs = collect(out, split, name, warm_starts, seeds, testbed)
        runs_by_arm[name] = runs
        for key, label, scale, form in METRICS[testbed]:
            mine = {k: scale * metric(r, key) for k, r in runs.items()}
            theirs = {k: scale * metric(r, key) for k, r in vanilla.items()}
            diffs = paired_differences(mine, theirs)
            if not diffs:
                continue
            interval = cluster_bootstrap(diffs)
            keys = sorted(set(mine) & set(theirs))
            lines.append(
                f"| {name} | {label} | {statistics.mean(mine[k] for k in keys):.2f} | "
                f"{statistics.mean(theirs[k] for k in keys):.2f} | {form.format(interval.mean)} "
                f"[{form.format(interval.low)}, {form.format(interval.high)}] | {judged(interval, key)} | "
                f"{interval.runs} ({interval.warm_starts}) |"
            )
    costs = []
    for name, runs in runs_by_arm.items():
        ratios = [runs[k]["seconds"] / vanilla[k]["seconds"] for k in runs if k in vanilla and name != "vanilla"]
        if ratios:
            costs.append(f"{name} {statistics.median(ratios):.2f}x")
    if costs:
        lines += [
            "",
            "Wall time of a run (training and evaluation), arm / vanilla, median of paired runs: "
            + ", ".join(costs)
            + ". Runs train two at a time on 2 cores, and a study's runs and its vanilla runs may have been trained "
            "at different times beside different loads: only a ratio that the method's own work explains (dynamic "
            "sampling's extra generation) is a cost; benchmarks/dynamic_sampling_cost.py measures that side by side.",
        ]
    if testbed == "length_bias":
        from grpo_lab.testbeds.length_bias import MONITOR

        alarm = ", ".join(f"{k}={v}" for k, v in MONITOR.items() if k.startswith("collapse_"))
        lines += ["", f"Collapse alarm ({alarm}):", *alarm_lines(runs_by_arm)]
        if any(arm.config.get("sample_filter") for arm in arms.values()):
            lines += picker_lines(out, warm_starts)
    return "\n".join(lines)


#: The claim each testbed's verdicts are about: testbed -> [(metric key, what it says, scale, format)].
HEADLINE = {
    "forks": [
        ("distinct_correct", "more distinct right answers per prompt", 1.0, "{:+.2f}"),
        ("pass@1", "pass@1 (points)", 100.0, "{:+.1f}"),
        ("greedy_accuracy", "greedy accuracy (points)", 100.0, "{:+.1f}"),
    ],
    "length_bias": [
        ("greedy_gold", "gold accuracy at the end, greedy (points)", 100.0, "{:+.1f}"),
        ("gap", "proxy - gold gap (less is better)", 1.0, "{:+.3f}"),
    ],
}


def verdict_rows(out: Path, split: str, warm_starts, seeds, baseline: str = "vanilla") -> list[str]:
    """One row per (study arm, headline metric) over every study with saved runs: the verdict table of
    docs/results.md (``--verdicts``). ``baseline``: the arm every other is paired with (``--against``: vanilla, or
    a knob such as "fixed beta 0.04", where its runs exist on the same warm starts and seeds)."""
    from grpo_lab.stats import cluster_bootstrap, paired_differences

    rows = [f"| tool | metric | setting | arm - {baseline} [95% interval] | verdict |", "|---|---|---|---|---|"]
    listed = set()  # an arm shared by two studies (the clean-reward runs) is one row per metric
    for study, arms in studies().items():
        testbed = TESTBED_OF[study]
        vanilla = collect(out, split, baseline, warm_starts, seeds, testbed)
        for name in arms:
            if name == baseline or (testbed, name) in listed:
                continue
            listed.add((testbed, name))
            runs = collect(out, split, name, warm_starts, seeds, testbed)
            for key, label, scale, form in HEADLINE[testbed]:
                diffs = paired_differences(
                    {k: scale * metric(r, key) for k, r in runs.items()},
                    {k: scale * metric(r, key) for k, r in vanilla.items()},
                )
                if not diffs:
                    continue
                interval = cluster_bootstrap(diffs)
                setting = f"{testbed}, {split}, {interval.runs} runs / {interval.warm_starts} warm starts"
                rows.append(
                    f"| {name} | {label} | {setting} | {form.format(interval.mean)} [{form.format(interval.low)}, "
                    f"{form.format(interval.high)}] | {judged(interval, key)} |"
                )
    return rows


def plot(out: Path, study: str, split: str, warm_starts, seeds) -> Path:
    """``<out>/<study>.png``: forks: the pass@k curve (mean over runs) and the training entropy of each arm;
    length_bias: held-out gold and proxy over training (mean over runs) of each arm. Colours as
    :func:`trl_grpo_ext.plot.run_color`, vanilla first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trl_grpo_ext.plot import run_color

    testbed = TESTBED_OF[study]
    names = ["vanilla", *studies()[study]]
    runs = {name: list(collect(out, split, name, warm_starts, seeds, testbed).values()) for name in names}
    start = list(collect(out, split, "start", warm_starts, [0], testbed).values())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))

    def mean_curve(series: list[list]) -> tuple[list, list]:
        length = min(len(c) for c in series)
        return [c[0] for c in series[0][:length]], [statistics.mean(c[j][1] for c in series) for j in range(length)]

    if testbed == "forks":
        ks = [int(k) for k in (start or runs["vanilla"])[0]["eval"]["pass_at_k"]]
        if start:
            axes[0].plot(
                ks, [statistics.mean(r["eval"]["pass_at_k"][str(k)] for r in start) for k in ks], "k--", label="start"
            )
        for i, (name, rs) in enumerate(runs.items()):
            if rs:
                ys = [statistics.mean(r["eval"]["pass_at_k"][str(k)] for r in rs) for k in ks]
                axes[0].plot(ks, ys, color=run_color(i), marker="o", label=f"{name} ({len(rs)} runs)")
        axes[0].set_xscale("log", base=2)
        axes[0].set_xlabel("k (of 64 samples)")
        axes[0].set_ylabel("held-out pass@k")
        key, label = "entropy", "training token entropy"
    else:
        for i, (name, rs) in enumerate(runs.items()):
            series = [r["curves"]["gold"] for r in rs if r.get("curves", {}).get("gold")]
            if series:
                x, y = mean_curve(series)
                axes[0].plot(x, y, color=run_color(i), label=f"{name} ({len(series)} runs)")
        axes[0].set_xlabel("step")
        axes[0].set_ylabel("held-out gold (sampled, T 0.7)")
        key, label = "proxy", "held-out proxy reward"
    for i, (name, rs) in enumerate(runs.items()):
        series = [r["curves"][key] for r in rs if r.get("curves", {}).get(key)]
        if series:
            x, y = mean_curve(series)
            axes[1].plot(x, y, color=run_color(i), label=name)
    axes[1].set_xlabel("step")
    axes[1].set_ylabel(label)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{study} ({testbed} testbed, {split} prompts; means over runs)")
    fig.tight_layout()
    path = out / f"{study}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------------------- main
def parse_list(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += list(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", choices=sorted(studies()), help="required unless --verdicts")
    parser.add_argument("--split", default="test", choices=("validation", "test"))
    parser.add_argument("--warm_starts", default="0-5", help="SFT seeds, e.g. 0-5 or 0,2")
    parser.add_argument("--seeds", default="0,1", help="GRPO seeds per warm start")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: forks 250, length_bias 300)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "evidence"))
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/trl_grpo_ext"), help="warm starts, per testbed")
    parser.add_argument("--report", action="store_true", help="print the table from the saved runs, train nothing")
    parser.add_argument("--verdicts", action="store_true", help="print the verdict table of every study, train nothing")
    parser.add_argument("--against", default="vanilla", help="--verdicts: the arm others are paired with (a knob)")
    parser.add_argument(
        "--picker", action="store_true", help="PF-PPO's R^2 picker on the length-biased warm starts, no training"
    )
    args = parser.parse_args(argv)
    out, warm_starts, seeds = Path(args.out), parse_list(args.warm_starts), parse_list(args.seeds)
    if args.picker:
        path = picker_path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        cache = os.path.join(args.cache, "length_bias")
        path.write_text(json.dumps({w: length_picker(cache, w) for w in warm_starts}, indent=1))
        print("\n".join(picker_lines(out, warm_starts)))
        return
    if args.verdicts:
        print("\n".join(verdict_rows(out, args.split, warm_starts, seeds, baseline=args.against)))
        return
    if args.study is None:
        parser.error("--study is required (or --verdicts)")
    if not args.report:
        testbed = TESTBED_OF[args.study]
        from grpo_lab.testbeds import forks, length_bias

        steps = args.steps or {"forks": forks, "length_bias": length_bias}[testbed].grpo_settings()["max_steps"]
        cache = os.path.join(args.cache, testbed)
        arms = {"vanilla": Arm(), **studies()[args.study]}
        jobs = [
            dict(arm="start", config={}, reward="default", warm_start=w, seed=0, split=args.split, steps=0)
            for w in warm_starts
        ]
        jobs += [
            dict(arm=name, config=arm.config, reward=arm.reward, warm_start=w, seed=g, split=args.split, steps=steps)
            for w in warm_starts
            for g in seeds
            for name, arm in arms.items()
        ]
        jobs = [{**j, "testbed": testbed, "cache": cache} for j in jobs]
        jobs = [
            j for j in jobs if not run_path(out, j["split"], j["arm"], j["warm_start"], j["seed"], testbed).exists()
        ]
        print(f"{len(jobs)} runs to do", flush=True)
        # warm starts first, one per worker, so that two workers never build the same one
        with ProcessPoolExecutor(args.workers) as pool:
            starts = [j for j in jobs if j["arm"] == "start"]
            rest = [j for j in jobs if j["arm"] != "start"]
            for result in pool.map(run_one, starts):
                _save(out, result)
            for result in pool.map(run_one, rest):
                _save(out, result)
    print(report(out, args.study, args.split, warm_starts, seeds))
    print(plot(out, args.study, args.split, warm_starts, seeds))


def _save(out: Path, result: dict) -> None:
    path = run_path(out, result["split"], result["arm"], result["warm_start"], result["seed"], result["testbed"])
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {k: v for k, v in result.items() if k != "cache"}
    path.write_text(json.dumps(result, indent=1))
    print(f"{result['arm']} w{result['warm_start']} g{result['seed']}: {result['eval']} ({result['seconds']:.0f} s)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
