"""The hack-detection study (docs/results.md, "Detecting a hack while it starts"): per-step training signals and gold
of runs on six kinds of reward hack, saved for the detector to be replayed on, and the report.

    python benchmarks/hack_study.py --testbed length_bias --arms vanilla,clean,tools     # train (resumes)
    python benchmarks/hack_study.py --report                                            # the tables, trains nothing
    python benchmarks/hack_study.py --testbed length_bias,gym_chain_sum --arms screen,rollback_screen  # acting for real

Every run is one (testbed, arm, warm start, GRPO seed), 6 warm starts x 2 seeds by default, as in
benchmarks/evidence_study.py (the same GRPO settings, seeds and training prompts). Arms: ``vanilla`` (the proxy
reward), ``tools`` (the testbed's default tools, on the proxy), ``clean`` (trained on gold: no hack to find). A run
saves, per optimizer step, what the trainer logs (the detector's inputs: completion length, the collapse monitor's
diversity, entropy, reward statistics) and the gold of the step's own training completions (never shown to the
trainer: a side computation in the reward function), plus sampled gold on the held-out validation and test prompts
every :data:`EVAL_EVERY` steps and at step 0. The detector (:mod:`trl_grpo_ext.core.hack_detection`) is then replayed
on the saved signals: the same function the trainer calls each step, on the same values.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTBEDS = ("length_bias", "keyword_bias", "round_bias", "restate_bias", "carry_bias", "hedge_bias")
#: Settings with no hack (the proxy is the gold): runs whose completions lengthen because they learn, the detector's
#: negative controls.
HEALTHY = ("scratchpad", "terse", "gym_chain_sum")
ARMS = ("vanilla", "tools", "clean")
#: What acting on the detector gives, trained for real (not part of the default arms): vanilla with
#: ``collapse_action: rollback`` and a checkpoint every :data:`EVAL_EVERY` steps; its final model (the restored one) is
#: evaluated, to check that the report's rollback numbers (read off the vanilla runs' checkpoints) are what a run gets.
ROLLBACK = {
    "collapse_action": "rollback",
    "collapse_shape_acts": True,  # what hack_report reads off the vanilla runs' checkpoints: acting on shape alone
    "save_strategy": "steps",
    "save_steps": 25,
    "save_total_limit": None,
}
#: The actions that train on (issue 45), trained for real at the shipped acting rule (an audit or validation alarm, or a
#: shape alarm one confirms; here the audit, the study's validation gold being the report's): ``screen`` zeroes the
#: advantages of the completions the audit flags from the alarm on; ``rollback_screen`` restores the checkpoint at the
#: onset at once, then trains on to the end, screening. Neither is part of the default arms.
SCREEN = {"collapse_action": "screen"}
ROLLBACK_SCREEN = {**ROLLBACK, "collapse_shape_acts": False, "collapse_rollback_then": "screen"}
#: Held-out evaluation: samples per prompt (at the training temperature) and the checkpoint spacing (also the
#: spacing of the checkpoints a rollback can return to).
EVAL_SAMPLES = 8
EVAL_EVERY = 25
#: What a run keeps of each step's logged metrics (the detector's inputs and what the report plots).
KEPT = (
    "reward",
    "reward_std",
    "completions/mean_length",
    "entropy",
    "kl",
    "frac_reward_zero_std",
    "diversity/distinct_2",
    "diversity/repetition",
    "diversity/prompt_info",
    "alarm/collapse",
    "audit/disagreement",
    "audit/inversion",
    "audit/overpaid",
    "audit/flagged_frac",
)


def testbed_module(name: str):
    import importlib

    return importlib.import_module(f"grpo_lab.testbeds.{name}")


def run_path(out: Path, testbed: str, arm: str, warm_start: int, seed: int) -> Path:
    return out / "runs" / "hack" / testbed / arm / f"w{warm_start}-g{seed}.json"


def run_one(job: dict) -> dict:
    """Train and evaluate one run (in a worker process, one thread)."""
    import torch

    torch.set_num_threads(1)
    from transformers import AutoTokenizer, TrainerCallback, set_seed

    from grpo_lab import testbed
    from grpo_lab.evaluation import GoldRecorder, sample_completions
    from grpo_lab.testbeds import length_bias
    from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer

    start = time.time()
    bed = testbed_module(job["testbed"])
    path = bed.warm_start(job["cache"], seed=job["warm_start"], log=lambda *_: None)
    tokenizer = AutoTokenizer.from_pretrained(path)
    halves = {split: bed.problems(split) for split in ("validation", "test")}
    settings = bed.grpo_settings()

    def heldout(model) -> dict:
        out = {}
        for split, rows in halves.items():
            texts = sample_completions(
                model, tokenizer, list(rows["prompt"]), samples=EVAL_SAMPLES, temperature=settings["temperature"],
                max_new_tokens=bed.MAX_COMPLETION_LENGTH, seed=0,
            )  # fmt: skip
            flat = [t for row in texts for t in row]
            answers = [a for a in rows["answer"] for _ in range(EVAL_SAMPLES)]
            prompts = [p for p in rows["prompt"] for _ in range(EVAL_SAMPLES)]
            out[split] = {
                "gold": statistics.fmean(bed.gold_reward(flat, answers)),
                "proxy": statistics.fmean(bed.proxy_reward(flat, answers, prompts=prompts)),
            }
        return out

    class Checkpoints(TrainerCallback):
        def __init__(self):
            self.results: dict[int, dict] = {}

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.results[0] = heldout(model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % EVAL_EVERY == 0:
                self.results[state.global_step] = heldout(model)

    gold = GoldRecorder(bed.gold_reward)  # the gold of the batch the trainer scores, kept aside

    grpo_seed = job["warm_start"] + 100 * job["seed"]
    arm = {
        "vanilla": {}, "clean": {}, "tools": dict(testbed.DEFAULT_TOOLS), "rollback": ROLLBACK, "screen": SCREEN,
        "rollback_screen": ROLLBACK_SCREEN,
    }[job["arm"]]  # fmt: skip
    config = bed.grpo_settings(
        **{
            "seed": grpo_seed,
            "max_steps": job["steps"],
            **length_bias.MONITOR,
            "diversity_metrics": ["distinct", "repetition", "prompt_info", "entropy"],
            "logging_steps": 1,
            **arm,
        }
    )
    os.makedirs(os.path.join(job["cache"], "runs"), exist_ok=True)
    output_dir = tempfile.mkdtemp(dir=os.path.join(job["cache"], "runs"))  # a rollback reads its own checkpoints only
    set_seed(grpo_seed)
    reward = bed.gold_reward if job["arm"] == "clean" else bed.proxy_reward
    # the audit: computed and logged, never trained on (weight 0), with a blind spot of its own (lab.testbeds.audit)
    from grpo_lab.testbeds.audit import tolerant_audit

    # a testbed on another task names its training stream (the addition task's otherwise)
    stream = getattr(bed, "train_problems", None)
    # the rollback arm checks hack_report's reading of the shape detector alone: the audit is computed (the same
    # trajectory) but not named to the detector there
    audits = [] if job["arm"] == "rollback" else ["tolerant_audit"]
    config = {**config, "reward_weights": [1.0, 0.0], "collapse_audit_rewards": audits}
    args = GRPOExtConfig(**config, output_dir=output_dir, disable_tqdm=True)
    if stream is None:
        train = testbed.addition_problems(job["steps"] * 16, split="train", seed=grpo_seed + 1)
    else:
        train = stream(job["steps"] * 16, seed=grpo_seed + 1)
    checkpoints = Checkpoints()
    trainer = GRPOExtTrainer(
        model=path, reward_funcs=[gold.wrap(reward), tolerant_audit], args=args, train_dataset=train,
        processing_class=tokenizer,
        callbacks=[checkpoints],
    )  # fmt: skip
    trainer.train()
    shutil.rmtree(output_dir, ignore_errors=True)
    monitor = trainer.collapse_monitor
    steps: dict[int, dict] = {}
    for record in trainer.state.log_history:
        if "step" in record and "loss" in record:
            kept = {key: round(record[key], 6) for key in KEPT if key in record}
            steps.setdefault(record["step"], {}).update(kept)
    return {
        **job,
        "steps_log": {str(step): values for step, values in sorted(steps.items())},
        "train_gold": {str(step): value for step, value in gold.means().items()},
        "heldout": {str(step): r for step, r in sorted(checkpoints.results.items())},
        "old_alarm_steps": [step for step, _ in trainer.collapse_monitor.alarms],
        "rollback": trainer.collapse_monitor.rollback,
        "first_alarm": None if monitor.event is None else monitor.event.step,
        "screening": monitor.screening,
        "continued_from": None if monitor.continued_from is None else monitor.continued_from.step,
        "final_heldout": heldout(trainer.model) if job["arm"] in ("rollback", "rollback_screen") else None,
        "seconds": time.time() - start,
    }


def train(args) -> None:
    out = Path(args.out)
    jobs = []
    for testbed in args.testbed.split(","):
        for arm in args.arms.split(","):
            for w in parse_range(args.warm_starts):
                for g in parse_range(args.seeds):
                    path = run_path(out, testbed, arm, w, g)
                    if path.exists():
                        continue
                    cache = os.path.join(args.cache, testbed if testbed == "length_bias" else f"hack_{testbed}")
                    jobs.append(dict(testbed=testbed, arm=arm, warm_start=w, seed=g, steps=args.steps, cache=cache))
    print(f"{len(jobs)} runs to train", flush=True)
    # warm starts first, one per (testbed, warm start), so that two workers never build the same folder
    first = {}
    for job in jobs:
        first.setdefault((job["testbed"], job["warm_start"]), job)
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        list(pool.map(build_warm_start, first.values()))
        for result in pool.map(run_one, jobs):
            path = run_path(out, result["testbed"], result["arm"], result["warm_start"], result["seed"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({k: v for k, v in result.items() if k != "cache"}, separators=(",", ":")))
            gold = result["train_gold"]
            print(
                f"{result['testbed']} {result['arm']} w{result['warm_start']}-g{result['seed']}: "
                f"{result['seconds']:.0f} s, held-out test gold "
                + " ".join(f"{s}:{r['test']['gold']:.2f}" for s, r in result["heldout"].items())
                + f", train gold last {list(gold.values())[-1]:.2f}",
                flush=True,
            )


def build_warm_start(job: dict) -> str:
    import torch

    torch.set_num_threads(1)
    return testbed_module(job["testbed"]).warm_start(job["cache"], seed=job["warm_start"], log=lambda *_: None)


def parse_range(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(x) for x in text.split(",")]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--testbed", default=",".join(TESTBEDS), help="comma-separated testbeds")
    parser.add_argument(
        "--arms", default=",".join(ARMS), help="comma-separated arms (and 'rollback', 'screen', 'rollback_screen')"
    )
    parser.add_argument("--warm_starts", default="0-5")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "evidence"))
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/trl_grpo_ext"))
    parser.add_argument("--report", action="store_true", help="the tables from the saved runs; trains nothing")
    args = parser.parse_args(argv)
    if args.report:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from hack_report import report

        print(report(Path(args.out)))
        return
    train(args)


if __name__ == "__main__":
    main()
