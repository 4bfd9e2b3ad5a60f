"""Studies on the learning testbed (``grpo_lab.testbed``): the numbers of docs/results.md come from here.

    python benchmarks/testbed_study.py --suite testbed     # vanilla GRPO learns, then collapses; the default tools
    python benchmarks/testbed_study.py --suite token_clip  # Clip-Cov / KL-Cov ratio sweep, off-policy mini-batches
    python benchmarks/testbed_study.py --suite pf          # PF-PPO filters under a noisy reward, with the R^2 picker
    python benchmarks/testbed_study.py --suite singles     # all on beside each tool alone
    python benchmarks/testbed_study.py --suite ablation    # all on minus each of its members
    python benchmarks/testbed_study.py --suite dppo        # DPPO's trust region vs TRL's clip and clip-higher
    python benchmarks/testbed_study.py --suite lr_reference --set learning_rate=8e-4  # reference reset vs fixed

Setting (``grpo_lab.testbed``): a tiny Llama warm-started by SFT on a careless teacher's answers to ``"47+8="``,
then GRPO with the verifier reward: 32 prompts x 8 completions per generation, 4 optimizer steps of 64 completions
per generation (the PPO clip is active), T 0.7, learning rate 2e-4 decaying linearly to 0, 600 steps. Each seed has
its own warm start (SFT seed = GRPO seed), cached in ``--cache``. Held-out: the 179 held-out prompts greedy
(``answer_acc``), each of them x 8 samples at T 0.7 (``pass_at_1``, ``pass_at_8``, ``entropy``, within-prompt
``distinct_2``).

Every suite prints one table (mean +- std over seeds, methods interleaved per seed), writes the raw runs to
``<out>/testbed_<suite>.json`` and curves to ``<out>/testbed_<suite>.png``. About 45 s per run on one core of a 2-core
CPU machine (AEPO runs: about 55 s); two studies side by side with ``OMP_NUM_THREADS=1`` print the same numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM

from grpo_lab import testbed, testkit
from grpo_lab.stats import cluster_bootstrap, verdict
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer
from trl_grpo_ext.core import rank_filter_strategies

EVAL_KEYS = ["answer_acc", "pass_at_1", "pass_at_8", "entropy", "distinct_2"]
#: Metrics recorded per logged step (when present).
CURVE_KEYS = [
    "entropy",
    "reward",
    "rewards/answer_reward/mean",
    "diversity/distinct_2_in_group",
    "clip_cov/selected_frac",
    "clip_cov/selected_tokens",
    "kl_cov/selected_frac",
    "kl_cov/selected_tokens",
    "kl/beta",
    "kl/value",
    "filter/kept_frac",
    "aepo/temperature",
]


@dataclass
class Method:
    config: dict = field(default_factory=dict)
    #: Standard deviation of the Gaussian noise added to the verifier's score (0: the clean verifier).
    reward_noise: float = 0.0


def noisy_verifier(noise: float, seed: int):
    """The verifier plus N(0, noise^2) on every score: a stand-in for an unreliable reward model (PF-PPO's premise).

    Seeded by the run's seed, so every method of a seed sees the same noise stream given the same completions.
    """
    rng = random.Random(90_001 + seed)

    def noisy_answer_reward(completions, answer, **kwargs):
        return [r + rng.gauss(0.0, noise) for r in testbed.answer_reward(completions, answer)]

    return noisy_answer_reward


#: The fields of the default tools' KL controller (what "tools - adaptive KL" leaves out).
KL_CONTROLLER_FIELDS = ("beta", "kl_control", "kl_target", "kl_horizon", "kl_beta_max")


def suites() -> dict[str, dict[str, Method]]:
    tools = testbed.DEFAULT_TOOLS
    token_clip = {"vanilla": Method()}
    ratios = (2e-4, 2e-3, 2e-2, 2e-1)
    for ratio in ratios:
        token_clip[f"Clip-Cov r={ratio:g}"] = Method({"token_clip": "clip_cov", "clip_cov_ratio": ratio})
    for ratio in ratios:
        token_clip[f"KL-Cov k={ratio:g}"] = Method({"token_clip": "kl_cov", "kl_cov_ratio": ratio})
    token_clip["KL-Cov k=0.2, PPO clip kept"] = Method(
        {"token_clip": "kl_cov", "kl_cov_ratio": 0.2, "kl_cov_ppo_clip": True}
    )
    pf = {}
    for noise in (0.0, 1.0):
        tag = "clean" if noise == 0 else f"noise {noise:g}"
        pf[f"vanilla ({tag})"] = Method(reward_noise=noise)
        for strategy in ("best_of_n", "best_random", "best_worst", "nonzero_std"):
            pf[f"{strategy} ({tag})"] = Method({"sample_filter": strategy}, reward_noise=noise)
    singles = {
        "KL-Cov": {"token_clip": "kl_cov", "kl_cov_ratio": 2e-2},
        "Clip-Cov": {"token_clip": "clip_cov", "clip_cov_ratio": 2e-2},
        "adaptive KL": {"beta": 0.04, "kl_control": "adaptive", "kl_target": 0.1, "kl_horizon": 2000},
        "diversity KL": {"beta": 0.04, "kl_control": "diversity", "kl_diversity_target": 0.3, "kl_horizon": 2000},
        "PF best_worst": {"sample_filter": "best_worst"},
        "AEPO (target 0.2)": {"entropy_control": "aepo", "aepo_target_entropy": 0.2},
    }
    all_on = dict(testbed.ALL_ON)  # every family: the default tools (KL-Cov, adaptive KL, AEPO) + PF best-worst
    single = {"vanilla": Method(), "all on": Method(all_on)}
    for name, cfg in singles.items():
        single[name] = Method(cfg)
    ablation = {"vanilla": Method(), "all on": Method(all_on)}
    for name, cfg in singles.items():
        if name in ("Clip-Cov", "diversity KL"):  # not members of "all on" (one token clip, one KL controller)
            continue
        minus = dict(all_on)
        for key in cfg:
            minus.pop(key, None)
        if "kl_control" not in minus:
            minus.pop("beta", None)
        ablation[f"all on - {name}"] = Method(minus)
    # What rescued learning rate 8e-4 (run with --set learning_rate=8e-4): the tools, the tools without the KL
    # controller, and TRL's own knobs at their documented values.
    lr_rescue = {
        "vanilla": Method(),
        "default tools": Method(dict(tools)),
        "tools - adaptive KL": Method({k: v for k, v in tools.items() if k not in KL_CONTROLLER_FIELDS}),
        "fixed beta 0.3": Method({"beta": 0.3}),
        "epsilon_high=0.28": Method({"epsilon_high": 0.28}),
        "temperature 1.0": Method({"temperature": 1.0}),
    }
    # DPPO's binary trust region (issue 47) on these off-policy mini-batches, against TRL's ratio clip (vanilla) and
    # clip-higher, at prime-rl's bounds and a tighter one.
    dppo = {
        "vanilla": Method(),
        "epsilon_high=0.28": Method({"epsilon_high": 0.28}),
        "DPPO-TV 0.2": Method({"token_clip": "dppo"}),
        "DPPO-TV 0.05": Method({"token_clip": "dppo", "dppo_delta_low": 0.05, "dppo_delta_high": 0.05}),
    }
    # The KL anchor that moves (issue 47), at the beta that rescued learning rate 8e-4 (run with --set
    # learning_rate=8e-4): ProRL's reset and TRL's own mixing every 50 steps against the fixed anchor.
    lr_reference = {
        "vanilla": Method(),
        "fixed beta 0.3": Method({"beta": 0.3}),
        "reference reset every 50": Method({"beta": 0.3, "ref_update": "reset", "ref_reset_steps": 50}),
        "sync_ref_model every 50": Method({"beta": 0.3, "sync_ref_model": True, "ref_model_sync_steps": 50}),
    }
    return {
        "dppo": dppo,
        "lr_reference": lr_reference,
        "lr_rescue": lr_rescue,
        "testbed": {"vanilla": Method(), "default tools": Method(dict(tools))},
        "token_clip": token_clip,
        "pf": pf,
        "singles": single,
        "ablation": ablation,
    }


def run_config(method: Method, common: dict) -> dict:
    """A run's GRPOExtConfig fields beyond the testbed's: the method's, then ``--set``'s over them (it changes every
    run; before, a method's own value silently won)."""
    return {**method.config, **common}


def heldout_numbers(model, tokenizer, heldout, seed: int) -> dict:
    """The held-out numbers a run records (``EVAL_KEYS`` of ``testbed.evaluate``)."""
    end = testbed.evaluate(model, tokenizer, heldout, seed=seed)
    return {k: end[k] for k in EVAL_KEYS}


def train(
    start: str, seed: int, method: Method, steps: int, output_dir: str, common: dict, callbacks=()
) -> GRPOExtTrainer:
    rewards = [testbed.answer_reward]
    weights = None
    if method.reward_noise > 0:  # train on the noisy score, log the true accuracy with weight 0
        rewards = [noisy_verifier(method.reward_noise, seed), testbed.answer_reward]
        weights = [1.0, 0.0]
    config = run_config(method, common)
    args = GRPOExtConfig(
        **testbed.grpo_settings(
            output_dir=output_dir,
            seed=seed,
            max_steps=steps,
            disable_tqdm=True,
            diversity_metrics=["distinct", "entropy"],
            reward_weights=weights,
            **config,
        )
    )
    trainer = GRPOExtTrainer(
        model=start,
        reward_funcs=rewards,
        args=args,
        train_dataset=testbed.addition_problems(40_000, seed=1 + seed),
        processing_class=testkit.build_char_tokenizer(),
        callbacks=list(callbacks),
    )
    trainer.train()
    return trainer


def curves(log_history: list[dict]) -> dict[str, list]:
    out: dict[str, list] = {}
    for key in CURVE_KEYS:
        points = [(h["step"], h[key]) for h in log_history if key in h]
        if points:
            out[key] = points
    return out


def entropy_ratio(curve: list[tuple[int, float]], steps: int) -> float:
    """Mean training entropy of the first 10% of steps over that of the last 10% (how many times it fell)."""
    first = [v for s, v in curve if s <= max(1, steps // 10)]
    last = [v for s, v in curve if s > steps - max(1, steps // 10)]
    if not first or not last:
        return float("nan")
    return statistics.mean(first) / max(statistics.mean(last), 1e-9)


def pf_picker(start: str, seed: int, noise: float) -> list[tuple[str, float]]:
    """PF-PPO's choice (sec. 4.2): R^2 between the noisy score and the truth on the kept samples of a labelled set
    (64 training prompts x 8 warm-start samples)."""
    tok = testkit.build_char_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(start)
    rows = testbed.addition_problems(64, seed=70_000 + seed)
    prompts = [p for p in rows["prompt"] for _ in range(8)]
    answers = [a for a in rows["answer"] for _ in range(8)]
    torch.manual_seed(seed)
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **enc,
        do_sample=True,
        temperature=0.7,
        top_k=0,
        max_new_tokens=testbed.MAX_COMPLETION_LENGTH,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    truth = torch.tensor(testbed.answer_reward(texts, answers))
    scores = torch.tensor(noisy_verifier(noise, seed)(texts, answers))
    generator = torch.Generator().manual_seed(seed)
    return rank_filter_strategies(scores, truth, 8, generator=generator)


def fmt(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "n/a"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} +- {spread:.3f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=list(suites()), default="testbed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=testbed.grpo_settings()["max_steps"])
    parser.add_argument("--methods", nargs="+", default=None, help="default: every method of the suite")
    parser.add_argument("--out", default="testbed_study")
    parser.add_argument("--tag", default="", help="suffix of the output files")
    parser.add_argument(
        "--report",
        nargs="+",
        default=None,
        metavar="JSON",
        help="print the table and plot of a saved run, no training; several files (e.g. one per --grpo_seed_offset): "
        "also the paired comparison of every method against vanilla over all their runs",
    )
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "trl_grpo_ext_testbed"))
    parser.add_argument(
        "--split",
        choices=testbed.HELDOUT_SPLITS,
        default="heldout",
        help="held-out prompts evaluated: 'heldout' (all 179, the earlier studies), 'validation' (for choices) or "
        "'test' (for reported results)",
    )
    parser.add_argument(
        "--grpo_seed_offset",
        type=int,
        default=0,
        help="GRPO seed = seed + this (warm start and held-out samples stay those of the seed): training noise "
        "at a fixed warm start",
    )
    parser.add_argument(
        "--checkpoints_every",
        type=int,
        default=0,
        metavar="K",
        help="also evaluate the held-out set at the last --checkpoints steps K apart, the final model the last (0: "
        "only at the end; the recipe's --eval_checkpoint_every): how much one run's accuracy moves between "
        "checkpoints, and accuracies averaged over them",
    )
    parser.add_argument(
        "--checkpoints",
        type=int,
        default=6,
        metavar="N",
        help="evaluations with --checkpoints_every, the final one too",
    )
    parser.add_argument(
        "--baseline",
        default="vanilla",
        help="with --report: the method every other one is paired with (e.g. 'fixed beta 0.3'; default vanilla)",
    )
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="FIELD=VALUE",
        help="GRPOExtConfig fields for every run, vanilla's too, over the methods' own values (JSON values)",
    )
    args = parser.parse_args()
    if args.report:
        loaded = []
        for path in args.report:
            with open(path) as f:
                saved = json.load(f)
            saved["start"] = {int(k): v for k, v in saved["start"].items()}
            loaded.append(saved)
            print(f"== {path}")
            print(table(saved))
            if saved["suite"] == "testbed":
                print(criteria(saved))
            plot(saved, path.removesuffix(".json") + ".png")
        if any("vanilla" in saved["runs"] and len(saved["runs"]) > 1 for saved in loaded):
            print(paired(loaded, baseline=args.baseline))
        return
    common = {}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            common[key] = json.loads(value)
        except json.JSONDecodeError:
            common[key] = value
    methods = suites()[args.suite]
    names = args.methods or list(methods)
    unknown = sorted(set(names) - set(methods))
    if unknown:
        parser.error(f"unknown method(s) {unknown}; the {args.suite} suite has {list(methods)}")
    os.makedirs(args.out, exist_ok=True)
    tok = testkit.build_char_tokenizer()
    results: dict = {"suite": args.suite, "steps": args.steps, "seeds": args.seeds, "set": common, "start": {}}
    results["grpo_seed_offset"] = args.grpo_seed_offset
    results["split"] = args.split
    results["runs"] = {name: [] for name in names}
    for seed in args.seeds:
        start = testbed.warm_start(args.cache, seed=seed)
        heldout = testbed.addition_problems(split=args.split, seed=seed)
        results["start"][seed] = testbed.evaluate(AutoModelForCausalLM.from_pretrained(start), tok, heldout, seed=seed)
        if args.suite == "pf":
            results.setdefault("picker", {})[seed] = {"noise 1": pf_picker(start, seed, 1.0)}
            print(f"seed {seed} R^2 picker (noise 1): {results['picker'][seed]['noise 1']}", flush=True)
        for name in names:
            began = time.perf_counter()
            steps = (
                testbed.checkpoint_steps(args.steps, args.checkpoints_every, args.checkpoints)[:-1]
                if args.checkpoints_every
                else []
            )
            checkpoints = testbed.CheckpointEvaluator(
                steps, lambda model, heldout=heldout, seed=seed: heldout_numbers(model, tok, heldout, seed)
            )
            with tempfile.TemporaryDirectory() as tmp:
                trainer = train(
                    start, seed + args.grpo_seed_offset, methods[name], args.steps, tmp, common, [checkpoints]
                )
            seconds = time.perf_counter() - began
            end = testbed.evaluate(trainer.model, tok, heldout, seed=seed)
            logged = curves(trainer.state.log_history)
            run = {
                "seed": seed,
                "end": {k: end[k] for k in EVAL_KEYS},
                "samples": end["samples"],
                "seconds": seconds,
                "entropy_ratio": entropy_ratio(logged.get("entropy", []), args.steps),
                "curves": logged,
            }
            if steps:
                run["checkpoints"] = {**checkpoints.results, args.steps: run["end"]}
            results["runs"][name].append(run)
            print(
                f"seed {seed} {name}: acc {results['start'][seed]['answer_acc']:.3f} -> {end['answer_acc']:.3f}, "
                f"pass@1 {end['pass_at_1']:.3f}, pass@8 {end['pass_at_8']:.3f}, entropy {end['entropy']:.3f} "
                f"(training entropy fell {run['entropy_ratio']:.1f}x), distinct-2 {end['distinct_2']:.3f}, "
                f"{seconds:.0f} s",
                flush=True,
            )
    stem = os.path.join(args.out, f"testbed_{args.suite}{args.tag}")
    with open(f"{stem}.json", "w") as f:
        json.dump(results, f)
    print(table(results))
    if args.suite == "testbed":
        print(criteria(results))
    if "vanilla" in results["runs"] and len(results["runs"]) > 1:
        print(paired([results]))
    plot(results, f"{stem}.png")


def table(results: dict) -> str:
    seeds = results["seeds"]
    header = "| method | answer_acc | gain | pass@1 | pass@8 | entropy | distinct_2 | entropy fell (x) | extra |\n"
    header += "|---|---|---|---|---|---|---|---|---|\n"
    start = [results["start"][s] for s in seeds]
    rows = [
        "| (warm start) | "
        + " | ".join(
            [fmt([m["answer_acc"] for m in start]), ""]
            + [fmt([m[k] for m in start]) for k in ("pass_at_1", "pass_at_8", "entropy", "distinct_2")]
            + ["", ""]
        )
        + " |"
    ]
    for name, runs in results["runs"].items():
        gain = [r["end"]["answer_acc"] - results["start"][r["seed"]]["answer_acc"] for r in runs]
        extra = []
        for key, label in (
            ("clip_cov/selected_tokens", "clipped tokens/step"),
            ("kl_cov/selected_tokens", "penalised tokens/step"),
            ("kl/beta", "final beta"),
            ("filter/kept_frac", "kept"),
        ):
            if label == "final beta":
                values = [r["curves"][key][-1][1] for r in runs if key in r["curves"]]
            else:
                values = [v for v in (_mean_curve(r, key) for r in runs) if v is not None]
            if values:
                extra.append(f"{label} {statistics.mean(values):.3g}")
        rows.append(
            f"| {name} | {fmt([r['end']['answer_acc'] for r in runs])} | {fmt(gain)} | "
            + " | ".join(fmt([r["end"][k] for r in runs]) for k in ("pass_at_1", "pass_at_8", "entropy", "distinct_2"))
            + f" | {fmt([r['entropy_ratio'] for r in runs])} | {'; '.join(extra)} |"
        )
    return header + "\n".join(rows) + "\n"


def _mean_curve(run: dict, key: str):
    points = run["curves"].get(key)
    return statistics.mean(v for _, v in points) if points else None


def criteria(results: dict) -> str:
    """Issue 11's testbed checks on the vanilla runs, and the default-run targets on the default tools."""
    lines = []
    vanilla = {r["seed"]: r for r in results["runs"].get("vanilla", [])}
    tools = {r["seed"]: r for r in results["runs"].get("default tools", [])}
    for seed, run in vanilla.items():
        start, end = results["start"][seed], run["end"]
        gain = end["answer_acc"] - start["answer_acc"]
        d1, d8 = end["pass_at_1"] - start["pass_at_1"], end["pass_at_8"] - start["pass_at_8"]
        lines.append(
            f"seed {seed} vanilla: gain {gain:+.3f} ({'ok' if gain >= 0.15 else 'MISS'} >= +0.15), training entropy "
            f"fell {run['entropy_ratio']:.1f}x ({'ok' if run['entropy_ratio'] >= 5 else 'MISS'} >= 5x), pass@8 "
            f"{d8:+.3f} vs pass@1 {d1:+.3f} ({'ok' if d8 <= d1 / 2 else 'MISS'}: pass@8 gains under half), "
            f"distinct-2 {start['distinct_2']:.3f} -> {end['distinct_2']:.3f} "
            f"({'ok' if end['distinct_2'] < start['distinct_2'] else 'MISS'})"
        )
        if seed in tools:
            t = tools[seed]["end"]
            tg = t["answer_acc"] - start["answer_acc"]
            more = t["entropy"] > end["entropy"] or t["distinct_2"] > end["distinct_2"]
            over = ""
            mine, theirs = checkpoint_accuracy(tools[seed]), checkpoint_accuracy(run)
            if mine is not None and theirs is not None:
                over = f" (mean of checkpoints {mine - theirs:+.3f}: {'ok' if mine >= theirs - 0.01 else 'MISS'})"
            lines.append(
                f"seed {seed} tools: gain {tg:+.3f} ({'ok' if tg >= 0.10 else 'MISS'} >= +0.10), vs vanilla "
                f"{t['answer_acc'] - end['answer_acc']:+.3f} "
                f"({'ok' if t['answer_acc'] >= end['answer_acc'] - 0.01 else 'MISS'} >= -0.01){over}, "
                f"entropy {t['entropy']:.3f} vs {end['entropy']:.3f}, distinct-2 {t['distinct_2']:.3f} vs "
                f"{end['distinct_2']:.3f} ({'ok' if more else 'MISS'}: one of them higher)"
            )
    return "\n".join(lines)


def checkpoint_accuracy(run: dict) -> float | None:
    """Mean greedy held-out accuracy over a run's checkpoints (the end included); None without checkpoints."""
    points = run.get("checkpoints") or {}
    return statistics.mean(p["answer_acc"] for p in points.values()) if len(points) > 1 else None


def paired(saved: list[dict], tolerance: float = 0.01, baseline: str = "vanilla") -> str:
    """Every method against vanilla over all runs of one or several saved studies (run by run: same warm start,
    same GRPO seed), e.g. the ``testbed`` suite at ``--grpo_seed_offset`` 0, 100 and 200.

    One row per method: mean +- std of its greedy accuracy and of vanilla's over the paired runs, the difference (in
    points) mean +- std and per run, how many runs end within ``tolerance`` of vanilla or ahead, and in how many its
    held-out entropy, Distinct-2 and pass@8 are above vanilla's (pass@8: above / equal / below). When the runs have
    checkpoints (``--checkpoints_every``), a second row compares the accuracy averaged over a run's checkpoints, and a
    line gives how far one run's accuracy moves between its checkpoints (std, points). ``baseline``: the method in
    vanilla's place (its runs are the ones every other method, vanilla included, is paired with).
    """
    if not any(baseline in results["runs"] for results in saved):
        raise SystemExit(f"--baseline {baseline!r}: no saved study has that method")
    base: dict = {}  # (settings, offset, seed) -> vanilla run
    others: dict = {}  # method label -> {(offset, seed): run}
    settings_of: dict = {}  # method label -> the --set of its study
    for results in saved:
        offset = results.get("grpo_seed_offset") or 0
        settings = ", ".join(f"{k}={v}" for k, v in sorted((results.get("set") or {}).items()))
        for name, runs in results["runs"].items():
            label = f"{name} [{settings}]" if settings and name != baseline else name
            settings_of[label] = settings
            for run in runs:
                if name == baseline:  # the same baseline run in several studies: keep the one with checkpoints
                    known = base.get((settings, offset, run["seed"]))
                    if known is None or (run.get("checkpoints") and not known.get("checkpoints")):
                        base[(settings, offset, run["seed"])] = run
                else:
                    others.setdefault(label, {})[(offset, run["seed"])] = run
    vanillas = [  # each settings' own vanilla runs, taken before any are borrowed below
        (f"{baseline} [{settings}]" if settings else baseline, {k[1:]: r for k, r in base.items() if k[0] == settings})
        for settings in sorted({k[0] for k in base})
    ]
    borrowed = []
    for label, runs in others.items():  # a --set study without vanilla runs pairs with the plain study's vanilla
        settings = settings_of[label]
        if settings and not any(k[0] == settings for k in base):
            borrowed.append(label)
        for key in runs:
            if (settings, *key) not in base and ("", *key) in base:
                base[(settings, *key)] = base[("", *key)]
    base_of = {label: {k[1:]: run for k, run in base.items() if k[0] == settings_of[label]} for label in others}
    header = (
        f"| method | accuracy | runs | method | {baseline} | method - {baseline} (points) | 95% interval (cluster "
        "bootstrap) | verdict | per run (offset/seed) | within a point or ahead | entropy higher | Distinct-2 higher | "
        "pass@8 above / equal / below |\n"
    )
    header += "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    rows = []
    noise = []
    getters = [("final", lambda r: r["end"]["answer_acc"]), ("mean of checkpoints", checkpoint_accuracy)]
    for name, runs in others.items():
        vanilla = base_of[name]
        for label, get in getters:
            keys = sorted(k for k in runs if k in vanilla and get(runs[k]) is not None and get(vanilla[k]) is not None)
            if not keys:
                continue
            mine, theirs = [get(runs[k]) for k in keys], [get(vanilla[k]) for k in keys]
            diffs = [100 * (m - t) for m, t in zip(mine, theirs, strict=True)]
            ends = [(runs[k]["end"], vanilla[k]["end"]) for k in keys]
            above = sum(m["pass_at_8"] > t["pass_at_8"] for m, t in ends)
            equal = sum(m["pass_at_8"] == t["pass_at_8"] for m, t in ends)
            spread = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
            # the warm start is the run's seed (its SFT seed); the GRPO seeds nested in it are the offsets
            by_warm_start: dict[int, list[float]] = {}
            for key, diff in zip(keys, diffs, strict=True):
                by_warm_start.setdefault(key[1], []).append(diff)
            interval = cluster_bootstrap(by_warm_start)
            rows.append(
                f"| {name} | {label} | {len(keys)} | {fmt(mine)} | {fmt(theirs)} | "
                f"{statistics.mean(diffs):+.1f} +- {spread:.1f} | {interval.mean:+.1f} [{interval.low:+.1f}, "
                f"{interval.high:+.1f}] over {interval.warm_starts} warm starts | {verdict(interval)} | "
                + ", ".join(f"{k[0]}/{k[1]}: {d:+.1f}" for k, d in zip(keys, diffs, strict=True))
                + f" | {sum(d >= -100 * tolerance - 1e-9 for d in diffs)} of {len(keys)}"
                f" | {sum(m['entropy'] > t['entropy'] for m, t in ends)} of {len(keys)}"
                f" | {sum(m['distinct_2'] > t['distinct_2'] for m, t in ends)} of {len(keys)}"
                f" | {above} / {equal} / {len(keys) - above - equal} |"
            )
    for name, runs in [*vanillas, *others.items()]:
        spreads = [
            100 * statistics.stdev(p["answer_acc"] for p in r["checkpoints"].values())
            for r in runs.values()
            if len(r.get("checkpoints") or {}) > 1
        ]
        if spreads:
            steps = sorted(int(s) for s in next(r for r in runs.values() if r.get("checkpoints"))["checkpoints"])
            noise.append(
                f"{name}: accuracy across the checkpoints {steps} of one run moves by "
                f"{statistics.mean(spreads):.1f} points (std, mean over {len(spreads)} runs; max {max(spreads):.1f})"
            )
    notes = [
        f"{label}: paired with the vanilla runs of the study without --set (its study has none)" for label in borrowed
    ]
    return header + "\n".join(rows) + "\n" + "".join(line + "\n" for line in noise + notes)


def plot(results: dict, path: str, smooth: int = 3) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("entropy", "token entropy (training batches)"), ("reward", "training reward")]
    if results["suite"] == "pf":
        panels[1] = ("rewards/answer_reward/mean", "true accuracy of the training samples")
    panels.append(("diversity/distinct_2_in_group", "Distinct-2 within a prompt's 8 samples"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for i, (name, runs) in enumerate(results["runs"].items()):
            series = [r["curves"].get(key) for r in runs if r["curves"].get(key)]
            if not series:
                continue
            length = min(len(s) for s in series)
            x = [p[0] for p in series[0][:length]]
            y = [statistics.mean(s[j][1] for s in series) for j in range(length)]
            y = [statistics.mean(y[max(0, j - smooth + 1) : j + 1]) for j in range(len(y))]
            ax.plot(x, y, "-" if i < 10 else "--", label=name, linewidth=2.5 if name.startswith("vanilla") else 1.2)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{label} (mean of {len(results['seeds'])} seeds)")
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[-1].legend(fontsize=7)
    fig.suptitle(f"testbed, suite '{results['suite']}'")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(path)


if __name__ == "__main__":
    main()
