# Copyright 2026 The trl-grpo-ext authors. Apache-2.0.
"""GRPO on math with trl-grpo-ext's anti-collapse tools.

Usage:

    # The embedded default: fully offline, CPU, about 4 minutes. The length-biased reward (grpo_lab.testbeds.
    # length_bias): a tiny Llama warm-started on a careless, sometimes chatty teacher's answers to "47+8=", then GRPO
    # on a proxy reward that a policy can game (a lenient grader plus a bonus for length), twice from the same start
    # with the same budget and seed: vanilla, and with the KL term driven by diversity (kl_control: diversity). Prints
    # the held-out gold accuracy (greedy and sampled), the proxy, their gap, length, repetition, entropy and
    # Distinct-2 side by side, and when the collapse alarm fired.
    accelerate launch recipes/math_grpo.py
    accelerate launch recipes/math_grpo.py --compare_vanilla false     # the tools' run only

    # The other offline tasks: the addition testbed with the default tools (one right answer per prompt), and the
    # many-answers task (pass@k up to 64, distinct right answers):
    accelerate launch recipes/math_grpo.py --config recipes/configs/addition.yaml
    accelerate launch recipes/math_grpo.py --config recipes/configs/forks.yaml

    # One tool at a time, or all of them (offline configs; PRM runs on the multi-step chains task):
    accelerate launch recipes/math_grpo.py --config recipes/configs/clip_cov.yaml
    accelerate launch recipes/math_grpo.py --config recipes/configs/all_on.yaml

    # Real scale (GPUs, the Hub, vLLM; see the configs for the paper each value comes from):
    accelerate launch --config_file recipes/accelerate/zero3.yaml recipes/math_grpo.py \
        --config recipes/configs/qwen2.5-math-7b_math_kl_cov.yaml

Every GRPOExtConfig / GRPOConfig field can be set on the command line (``--token_clip clip_cov``) or in the YAML.
Flags given without ``--config`` apply on top of the embedded default (``--max_steps 20`` shortens it); with
``--config`` the YAML file is the whole configuration.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib
import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Literal

from accelerate import PartialState
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
from trl import ModelConfig, TrlParser

# The offline tasks are the project's lab (lab/ in the repository, `pip install -e lab`; not in the library's wheel):
# it registers its rewards and the "synthetic" dataset under the names the configs use.
from grpo_lab import offline, testbed, testkit
from grpo_lab.evaluation import GoldRecorder, evaluate_multistep, gold_peak, greedy_accuracy, sampled_evaluation
from grpo_lab.testbeds import forks, length_bias
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer
from trl_grpo_ext.data import load_math_dataset
from trl_grpo_ext.plot import plot_pass_at_k, plot_runs
from trl_grpo_ext.rewards import REWARD_FUNCS, STEP_REWARD_FUNCS, set_math_reward_workers

offline.register()

TINY_MODEL = "tiny"
#: What the side-by-side table shows, in this order (held-out numbers; see grpo_lab.testbed.evaluate).
SUMMARY_KEYS = ("answer_acc", "pass_at_1", "pass_at_8", "entropy", "distinct_2")


@dataclass
class MathScriptArguments:
    """Recipe arguments (besides GRPOExtConfig and ModelConfig)."""

    dataset_name: str = field(
        default="synthetic",
        metadata={"help": "'synthetic' (offline, see synthetic_task), a Hub dataset id, or a local json/parquet."},
    )
    synthetic_task: Literal["addition", "chains", "forks", "length_bias"] = field(
        default="length_bias",
        metadata={
            "help": 'Offline task of dataset_name=synthetic. \'addition\': the learning testbed ("47+8=" -> "55", '
            "a careless-teacher warm start; grpo_lab.testbed). 'chains': multi-step sums written one step per "
            'line ("3+4+2=" -> "3+4=7\\n7+2=9\\n9"), for PRM step rewards. \'forks\': many right answers '
            '("35241628 3:" -> any "3+5-2..." with three minus signs; grpo_lab.testbeds.forks), evaluated by '
            "pass@k up to 64 and distinct right answers. 'length_bias': the addition task trained on a gameable "
            "proxy reward (reward_funcs [length_proxy]; grpo_lab.testbeds.length_bias), evaluated by the gold "
            "score (exact answer) beside the proxy."
        },
    )
    eval_split: Literal["test", "validation"] = field(
        default="test",
        metadata={
            "help": "Held-out half the 'forks' and 'length_bias' tasks are evaluated on: 'test' for results, "
            "'validation' for choosing settings."
        },
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration (e.g. 'main')."})
    dataset_format: str | None = field(
        default=None, metadata={"help": "Row format: gsm8k, math, dapo or plain (default: guessed from the name)."}
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Training split."})
    num_train_examples: int | None = field(default=None, metadata={"help": "Subsample the training set."})
    synthetic_num_ops: int = field(default=2, metadata={"help": "Operations per 'chains' problem."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["exact_answer"],
        metadata={"help": "Outcome rewards by name (exact_answer, final_answer, math_accuracy, boxed_format, ...)."},
    )
    math_reward_workers: int | None = field(
        default=None,
        metadata={
            "help": "Processes that score math_accuracy: 1 = serial in the main thread, N > 1 = a persistent pool with "
            "per-answer and per-batch time bounds; default: the cores divided among the local training processes."
        },
    )
    step_reward_funcs: list[str] = field(
        default_factory=lambda: ["arithmetic_steps"],
        metadata={"help": "Step rewards by name, used when advantage_estimator=prm."},
    )
    compare_vanilla: bool = field(
        default=True,
        metadata={
            "help": "Also train vanilla GRPO (the same config with every trl_grpo_ext family off, "
            "GRPOExtConfig.without_extensions) from the same start, budget and seed, and print both side by side."
        },
    )
    eval_num_problems: int | None = field(
        default=None,
        metadata={"help": "Held-out problems for the summary (default: all 179 for addition, 128 for chains)."},
    )
    eval_checkpoints: int = field(
        default=6,
        metadata={
            "help": "Held-out evaluations at the end of training, the final model the last of them, every "
            "eval_checkpoint_every steps: the summary adds their greedy accuracies and mean (answer_acc_last_mean), "
            "and whether the run has settled (on the testbed, with its decaying learning rate, one run's accuracy "
            "moves by about 0.7 points between checkpoints 20 steps apart; 2-3 at a constant rate). 1: the final "
            "model only."
        },
    )
    eval_checkpoint_every: int = field(default=20, metadata={"help": "Steps between those held-out evaluations."})
    eval_sampled_problems: int | None = field(
        default=None,
        metadata={"help": "Held-out problems sampled 8 times each for pass@k, entropy and Distinct-2 (default: all)."},
    )
    tiny_hidden_size: int = field(default=128, metadata={"help": "Width of the tiny model (model 'tiny')."})
    tiny_num_layers: int = field(default=4, metadata={"help": "Layers of the tiny model (model 'tiny')."})
    sft_num_examples: int | None = field(
        default=None,
        metadata={
            "help": "SFT rows of the tiny warm start (default: 40000 careless-teacher rows, one epoch, for addition; "
            "4000 worked solutions for chains)."
        },
    )
    sft_warm_start_epochs: float = field(
        default=5.0, metadata={"help": "SFT epochs of the 'chains' warm start (0: none). Addition: one epoch."}
    )
    cache_dir: str = field(
        default=os.path.join(os.path.expanduser("~"), ".cache", "trl_grpo_ext"),
        metadata={"help": "Where the tiny model and its SFT warm start are cached."},
    )
    ext_import: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Python modules imported before the arguments are parsed: modules registering family members of "
            "your own (@TOKEN_CLIPS.register('my_clip'), ...), whose names are then valid switch values "
            "(--ext_import my_pkg.clips --token_clip my_clip; in a YAML config, ext_import: [my_pkg.clips])."
        },
    )


def _flags(config: dict) -> list[str]:
    out = []
    for key, value in config.items():
        values = value if isinstance(value, list) else [value]
        out += [f"--{key}", *[str(v).lower() if isinstance(v, bool) else str(v) for v in values]]
    return out


#: The embedded default run (what `accelerate launch recipes/math_grpo.py` does with no arguments); the same values
#: as recipes/configs/default.yaml (tested). The task where a tool helps (docs/results.md): the length-biased reward,
#: with its GRPO settings, its tool and its monitor from the testbed, in one place.
DEFAULT_CONFIG: dict = {
    "output_dir": "outputs/math_grpo_default",
    "model_name_or_path": TINY_MODEL,
    "synthetic_task": "length_bias",
    # the proxy it trains on; an audit (a second grader, logged, never trained on); the exact answer, logged at weight
    # 0 so that evaluation on the held-out validation prompts logs held-out gold (eval_rewards/exact_answer/mean)
    "reward_funcs": ["length_proxy", "tolerant_audit", "exact_answer"],
    "reward_weights": [1.0, 0.0, 0.0],
    "seed": 0,
    **length_bias.grpo_settings(),
    **length_bias.TOOLS,
    **length_bias.MONITOR,
    "collapse_audit_rewards": ["tolerant_audit"],
    "collapse_validation_metric": "rewards/answer_reward/mean",  # TRL names a reward function by its __name__
    "eval_strategy": "steps",
    "eval_steps": 25,
    "per_device_eval_batch_size": 64,
}
DEFAULT_ARGS = _flags(DEFAULT_CONFIG)


def make_parser() -> TrlParser:
    return TrlParser((MathScriptArguments, GRPOExtConfig, ModelConfig))


def _cache_key(*parts) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def prepare_chains_model(script_args, training_args, state: PartialState) -> str:
    """The tiny model of the 'chains' task and its SFT warm start, cached; every process returns the same path."""
    tok = testkit.build_char_tokenizer()
    examples = script_args.sft_num_examples or 4000
    key = _cache_key(
        script_args.tiny_hidden_size,
        script_args.tiny_num_layers,
        script_args.sft_warm_start_epochs,
        examples,
        script_args.synthetic_num_ops,
        training_args.seed,
        "v1",
    )
    base = os.path.join(script_args.cache_dir, f"tiny-{key}")
    init_path, sft_path = os.path.join(base, "init"), os.path.join(base, "sft")
    with state.main_process_first():
        if not os.path.exists(os.path.join(init_path, "config.json")) and state.is_main_process:
            model = testkit.build_tiny_model(
                tok,
                hidden_size=script_args.tiny_hidden_size,
                num_layers=script_args.tiny_num_layers,
                seed=training_args.seed,
            )
            model.save_pretrained(init_path)
            tok.save_pretrained(init_path)
    if script_args.sft_warm_start_epochs <= 0:
        return init_path
    if not os.path.exists(os.path.join(sft_path, "config.json")):
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        rows = testkit.multistep_dataset(
            examples, seed=training_args.seed, ops="+", num_ops=script_args.synthetic_num_ops
        )
        data = Dataset.from_list([{"prompt": r["prompt"], "completion": r["solution"] + tok.eos_token} for r in rows])
        sft = SFTTrainer(
            model=init_path,
            args=SFTConfig(
                output_dir=os.path.join(base, "sft-run"),
                num_train_epochs=script_args.sft_warm_start_epochs,
                learning_rate=3e-3,
                per_device_train_batch_size=64 // state.num_processes,
                use_cpu=training_args.use_cpu,
                bf16=training_args.bf16,
                report_to="none",
                save_strategy="no",
                seed=training_args.seed,
                logging_steps=25,
            ),
            train_dataset=data,
            processing_class=tok,
        )
        if state.is_main_process:
            print(f"[math_grpo] SFT warm start ({script_args.sft_warm_start_epochs} epochs), cached in {sft_path}")
        sft.train()
        sft.save_model(sft_path)
        if state.is_main_process:
            tok.save_pretrained(sft_path)
    state.wait_for_everyone()
    return sft_path


def prepare_addition_model(script_args, training_args, state: PartialState) -> str:
    """The testbed's careless-teacher warm start (trained by every process, written by the main one, cached)."""
    kwargs = dict(
        seed=training_args.seed,
        hidden_size=script_args.tiny_hidden_size,
        num_layers=script_args.tiny_num_layers,
        use_cpu=training_args.use_cpu,
        log=lambda message: print(f"[math_grpo] {message}"),
    )
    if script_args.sft_num_examples is not None:
        kwargs["examples"] = script_args.sft_num_examples
    return testbed.warm_start(script_args.cache_dir, **kwargs)


def prepare_length_bias_model(script_args, training_args, state: PartialState) -> str:
    """The length-biased testbed's chatty careless-teacher warm start (trained by every process, written by the main
    one, cached)."""
    return length_bias.warm_start(
        script_args.cache_dir,
        seed=training_args.seed,
        examples=script_args.sft_num_examples or 40_000,
        use_cpu=training_args.use_cpu,
        log=lambda message: print(f"[math_grpo] {message}"),
    )


def prepare_forks_model(script_args, training_args, state: PartialState) -> str:
    """The forks testbed's careless-teacher warm start (trained by every process, written by the main one, cached)."""
    return forks.warm_start(
        script_args.cache_dir,
        seed=training_args.seed,
        examples=script_args.sft_num_examples or 40_000,
        hidden_size=script_args.tiny_hidden_size,
        num_layers=script_args.tiny_num_layers,
        use_cpu=training_args.use_cpu,
        log=lambda message: print(f"[math_grpo] {message}"),
    )


#: Samples per held-out prompt of the 'forks' task: pass@k for k = 1, 2, 4, ..., 64 and distinct right answers.
FORKS_SAMPLES = 64


def forks_evaluator(script_args, training_args, tokenizer):
    """``evaluate(model) -> dict`` on the forks task's held-out prompts: greedy accuracy (``answer_acc``), pass@k from
    64 samples at temperature 1 (``pass_at_1`` ... ``pass_at_64`` and the curve ``pass_at_k``), distinct right answers
    per prompt (``distinct_correct``); and ``quick(model)``, the greedy accuracy alone (for checkpoints)."""
    prompts = forks.problems(script_args.eval_num_problems or 128, split=script_args.eval_split, seed=0)["prompt"]
    length = training_args.max_completion_length

    def quick(model) -> float:
        return greedy_accuracy(model, tokenizer, prompts, gold=forks.gold, max_new_tokens=length)

    def evaluate(model) -> dict:
        sampled = sampled_evaluation(
            model, tokenizer, prompts, gold=forks.gold, samples=FORKS_SAMPLES, temperature=1.0, max_new_tokens=length,
            seed=training_args.seed,
        )  # fmt: skip
        curve = sampled["pass_at_k"]
        return {
            "answer_acc": quick(model),
            **{f"pass_at_{k}": curve[k] for k in curve},
            "distinct_correct": sampled["distinct_correct"],
            "pass_at_k": {str(k): v for k, v in curve.items()},
        }

    return evaluate, quick


def heldout_evaluator(script_args, training_args, tokenizer):
    """``evaluate(model) -> dict`` on the synthetic task's held-out problems, or None for other datasets."""
    if script_args.dataset_name != "synthetic":
        return None
    if script_args.synthetic_task == "forks":
        return forks_evaluator(script_args, training_args, tokenizer)[0]
    seed = training_args.seed
    common = dict(
        temperature=training_args.temperature,
        seed=seed,
        sampled_problems=script_args.eval_sampled_problems,
        max_new_tokens=training_args.max_completion_length,
    )
    if script_args.synthetic_task == "addition":
        problems = testbed.addition_problems(script_args.eval_num_problems, split="heldout", seed=seed)

        def evaluate(model) -> dict:
            return testbed.evaluate(model, tokenizer, problems, **common)

        return evaluate
    if script_args.synthetic_task == "length_bias":
        problems = length_bias.problems(script_args.eval_split)
        if script_args.eval_num_problems:
            problems = problems.select(range(min(script_args.eval_num_problems, len(problems))))

        def evaluate_gold_and_proxy(model) -> dict:
            return testbed.evaluate(
                model, tokenizer, problems, reward=length_bias.gold_reward, proxy=length_bias.proxy_reward, **common
            )

        return evaluate_gold_and_proxy
    problems = load_math_dataset(
        "synthetic",
        split="test",
        num_examples=script_args.eval_num_problems or 128,
        seed=seed,
        synthetic_num_ops=script_args.synthetic_num_ops,
    )

    def evaluate_chains(model) -> dict:
        result = testbed.evaluate(model, tokenizer, problems, reward=testkit.final_answer_reward, **common)
        steps = evaluate_multistep(model, tokenizer, problems, max_new_tokens=training_args.max_completion_length)
        return {**result, "step_acc": steps["step_acc"]}

    return evaluate_chains


def train_once(
    model_path, args: GRPOExtConfig, reward_funcs, train, tokenizer, step_funcs, callbacks=(), eval_dataset=None
) -> GRPOExtTrainer:
    set_seed(args.seed)
    trainer = GRPOExtTrainer(
        model=model_path,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=train,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        step_reward_funcs=step_funcs if args.advantage_estimator == "prm" else None,
        callbacks=list(callbacks),
    )
    trainer.train()
    trainer.save_model(args.output_dir)
    trainer.save_state()  # trainer_state.json, which `python -m trl_grpo_ext.plot` reads
    return trainer


def checkpoint_evaluator(script_args, training_args, evaluate, tokenizer=None):
    """Held-out evaluations before the final model's (``eval_checkpoints``, greedy accuracy), or None."""
    if evaluate is None or script_args.eval_checkpoints <= 1 or training_args.max_steps <= 0:
        return None
    steps = testbed.checkpoint_steps(
        training_args.max_steps, script_args.eval_checkpoint_every, script_args.eval_checkpoints
    )
    if len(steps) < 2:  # a run shorter than one interval: the final model only
        return None
    if script_args.dataset_name == "synthetic" and script_args.synthetic_task == "forks":
        return testbed.CheckpointEvaluator(steps[:-1], forks_evaluator(script_args, training_args, tokenizer)[1])
    return testbed.CheckpointEvaluator(steps[:-1], lambda model: evaluate(model)["answer_acc"])


def with_checkpoints(final: dict, checkpoints, steps: int) -> dict:
    """The final model's numbers plus the greedy accuracies of the checkpoints before it and their mean."""
    if checkpoints is None:
        return final
    accuracies = {str(step): acc for step, acc in sorted(checkpoints.results.items())}
    accuracies[str(steps)] = final["answer_acc"]
    return {**final, "answer_acc_checkpoints": accuracies, "answer_acc_last_mean": statistics.mean(accuracies.values())}


def sharded_parameters(model) -> str:
    """How many of the policy's parameter tensors this process holds only a part of (FSDP2 ``DTensor`` shards,
    DeepSpeed ZeRO-3 partitions), e.g. "14 of 20"; "0 of 20" under DDP or one process."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    # ZeRO-3: ``ds_tensor`` is this process's partition (``p`` itself may be gathered at the moment)
    split = sum(
        isinstance(p, DTensor) or getattr(p, "ds_tensor", p).numel() < getattr(p, "ds_numel", 0) for p in params
    )
    return f"{split} of {len(params)}"


def switched_on(args: GRPOExtConfig) -> dict:
    """The families that differ from vanilla, for the printout."""
    vanilla = args.without_extensions()
    return {name: getattr(args, name) for name in args.FAMILY_SWITCHES if getattr(args, name) != getattr(vanilla, name)}


def main(script_args: MathScriptArguments, training_args: GRPOExtConfig, model_args: ModelConfig) -> dict:
    state = PartialState()
    set_seed(training_args.seed)
    set_math_reward_workers(script_args.math_reward_workers)
    tiny = model_args.model_name_or_path in (None, TINY_MODEL)
    synthetic = script_args.dataset_name == "synthetic"
    if tiny and not synthetic:
        raise ValueError(
            "model_name_or_path 'tiny' is the offline test model and only knows dataset_name=synthetic; pass a real "
            "model (e.g. Qwen/Qwen2.5-Math-1.5B) for Hub or local datasets."
        )
    if tiny:
        prepare = {
            "addition": prepare_addition_model,
            "chains": prepare_chains_model,
            "forks": prepare_forks_model,
            "length_bias": prepare_length_bias_model,
        }
        model_path = prepare[script_args.synthetic_task](script_args, training_args, state)
    else:
        model_path = model_args.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    if synthetic and script_args.synthetic_task in ("addition", "length_bias"):
        train = testbed.addition_problems(script_args.num_train_examples or 40_000, seed=training_args.seed + 1)
    elif synthetic and script_args.synthetic_task == "forks":
        train = forks.problems(script_args.num_train_examples or 40_000, split="train", seed=training_args.seed + 1)
    else:
        train = load_math_dataset(
            script_args.dataset_name,
            split=script_args.dataset_train_split,
            config=script_args.dataset_config,
            dataset_format=script_args.dataset_format,
            num_examples=script_args.num_train_examples,
            seed=training_args.seed,
            synthetic_num_ops=script_args.synthetic_num_ops,
        )
    evaluate = heldout_evaluator(script_args, training_args, tokenizer)
    # TRL's own evaluation (eval_strategy): the held-out validation prompts of the synthetic tasks that have them
    eval_dataset = None
    if str(getattr(training_args.eval_strategy, "value", training_args.eval_strategy)) != "no":
        if not (synthetic and script_args.synthetic_task == "length_bias"):
            raise ValueError(
                "eval_strategy is set, but this recipe has held-out evaluation prompts for synthetic_task=length_bias "
                "only. Fix: set eval_strategy='no' (the recipe's own held-out evaluation still runs), or use "
                "synthetic_task=length_bias."
            )
        eval_dataset = length_bias.problems("validation")
    summary: dict = {"task": script_args.synthetic_task if synthetic else script_args.dataset_name}
    # Every process evaluates, the main one keeps the numbers: under FSDP / ZeRO-3 a forward is a collective.
    if evaluate is not None:
        start = AutoModelForCausalLM.from_pretrained(model_path)
        with testbed.whole_parameters(start):  # loaded under a ZeRO-3 config: partitioned, gathered here
            summary["start"] = evaluate(start)
        del start

    reward_funcs = [REWARD_FUNCS.get(name) for name in script_args.reward_funcs]
    step_funcs = None
    if training_args.advantage_estimator == "prm":
        step_funcs = [STEP_REWARD_FUNCS.get(name) for name in script_args.step_reward_funcs]
    model_init_kwargs = {"dtype": model_args.dtype} if model_args.dtype not in (None, "auto") else {}
    training_args.model_init_kwargs = training_args.model_init_kwargs or model_init_kwargs or None
    histories = {}
    train_info: dict = {"num_processes": state.num_processes, "tools": switched_on(training_args)}

    # A proxy reward's task: the gold of the training completions is kept aside (never seen by the trainer), to place
    # gold's peak beside the hack detector's alarm in the summary.
    gold = length_bias.gold_reward if synthetic and script_args.synthetic_task == "length_bias" else None

    def rewards_of(run: str) -> list:
        if gold is None:
            return reward_funcs
        recorders[run] = GoldRecorder(gold)
        return [recorders[run].wrap(reward_funcs[0]), *reward_funcs[1:]]

    recorders: dict[str, GoldRecorder] = {}
    if script_args.compare_vanilla:
        vanilla_args = training_args.without_extensions(output_dir=os.path.join(training_args.output_dir, "vanilla"))
        checkpoints = checkpoint_evaluator(script_args, vanilla_args, evaluate, tokenizer)
        vanilla = train_once(
            model_path, vanilla_args, rewards_of("vanilla"), train, tokenizer, step_funcs,
            [checkpoints] if checkpoints else (), eval_dataset,
        )  # fmt: skip
        histories["vanilla"] = vanilla.state.log_history
        train_info["vanilla_final_entropy"] = _last(vanilla.state.log_history, "entropy")
        train_info["vanilla_alarm_steps"] = alarm_steps(vanilla)
        train_info["vanilla_hack_alarm"] = hack_alarm(vanilla)
        if evaluate is not None:
            summary["vanilla"] = with_checkpoints(evaluate(vanilla.model), checkpoints, vanilla.state.global_step)
        del vanilla
        gc.collect()
        if state.distributed_type == DistributedType.DEEPSPEED:
            # accelerate 1.16 refuses a second Accelerator with a DeepSpeed plugin in one process ("You cannot pass in
            # a `deepspeed_plugin` when creating a second `Accelerator`"): the vanilla run is over and its engine
            # released, so the tools' Trainer starts accelerate's state afresh (the process group stays).
            AcceleratorState._reset_state()

    checkpoints = checkpoint_evaluator(script_args, training_args, evaluate, tokenizer)
    trainer = train_once(
        model_path, training_args, rewards_of("tools"), train, tokenizer, step_funcs,
        [checkpoints] if checkpoints else (), eval_dataset,
    )  # fmt: skip
    histories["tools"] = trainer.state.log_history
    if evaluate is not None:
        summary["final"] = with_checkpoints(evaluate(trainer.model), checkpoints, trainer.state.global_step)
    if state.is_main_process:
        train_info.update(
            engine=trainer.accelerator.distributed_type.value,
            sharded_parameters=sharded_parameters(trainer.model),
            steps=trainer.state.global_step,
            final_entropy=_last(trainer.state.log_history, "entropy"),
            final_beta=trainer.beta,
            final_reward=_last(trainer.state.log_history, "reward"),
            alarm_steps=alarm_steps(trainer),
            hack_alarm=hack_alarm(trainer),
        )
        for run, recorder in recorders.items():  # this process's share of the training completions
            if recorder.per_step:
                step, value, halving = gold_peak(recorder.means())
                train_info["gold_peak" if run == "tools" else "vanilla_gold_peak"] = {
                    "step": step, "gold": value, "halved_at": halving,
                }  # fmt: skip
        summary["train"] = train_info
        plot_runs(histories, os.path.join(training_args.output_dir, "plots"))
        runs = [run for run in ("start", "vanilla", "final") if "pass_at_k" in summary.get(run, {})]
        curves = {run: summary[run]["pass_at_k"] for run in runs}
        if curves:  # start / vanilla / tools, in the colours of the other plots
            labels = {"start": "start (SFT)", "vanilla": "vanilla GRPO", "final": "GRPO + tools"}
            plot_pass_at_k(
                {labels[run]: curve for run, curve in curves.items()},
                os.path.join(training_args.output_dir, "plots", "pass_at_k.png"),
                title=f"held-out pass@k ({summary['task']})",
            )
        with open(os.path.join(training_args.output_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        print_summary(summary, training_args.output_dir)
    state.wait_for_everyone()
    return summary


def alarm_steps(trainer: GRPOExtTrainer) -> list[int]:
    """The steps at which the collapse monitor's alarm fired (``collapse_*`` thresholds; empty without them)."""
    return [step for step, _ in trainer.collapse_monitor.alarms] if trainer.collapse_monitor is not None else []


def hack_alarm(trainer: GRPOExtTrainer) -> dict | None:
    """The hack detector's first alarm (``collapse_detector``): its step, onset and signal, each signal's first alarm
    (``signals``) and the first alarm the action would act on (``acted``: an audit or validation alarm, or a shape
    alarm they confirmed; see docs/monitoring.md); None if it never fired or is off."""
    monitor = trainer.collapse_monitor
    alarm = monitor.detector.alarm if monitor is not None and monitor.detector is not None else None
    if alarm is None:
        return None
    acted = monitor.action_event
    return {
        "step": alarm.step, "onset": alarm.onset, "signal": alarm.signal,
        "signals": {name: {"step": a.step, "onset": a.onset} for name, a in sorted(monitor.detector.alarms.items())},
        "acted": None if acted is None else {"step": acted.step, "onset": acted.onset},
    }  # fmt: skip


def _last(history: list[dict], key: str):
    values = [h[key] for h in history if key in h]
    return values[-1] if values else None


def print_checkpoints(v: dict, t: dict) -> None:
    """The mean greedy accuracy of the last checkpoints of vanilla and tools, and how one run moves between them."""
    if "answer_acc_last_mean" not in v or "answer_acc_last_mean" not in t:
        return
    steps = list(t["answer_acc_checkpoints"])

    def moves(run: dict) -> float:
        return 100 * statistics.stdev(run["answer_acc_checkpoints"].values())

    print(
        f"held-out accuracy, mean of the last {len(steps)} checkpoints (steps {steps[0]}-{steps[-1]}): "
        f"vanilla {v['answer_acc_last_mean']:.3f}, tools {t['answer_acc_last_mean']:.3f} "
        f"({100 * (t['answer_acc_last_mean'] - v['answer_acc_last_mean']):+.1f} points); between them one "
        f"run moves by {moves(v):.1f} / {moves(t):.1f} points (std)"
    )


def print_table(rows: list, keys, width: int) -> None:
    """The side-by-side table: one column per key, one row per run (start, vanilla, tools)."""
    print(f"{'':<14}" + "".join(f"{k:>{width}}" for k in keys))
    for label, m in rows:
        print(f"{label:<14}" + "".join(f"{m[k]:>{width}.3f}" for k in keys))


def trained_runs(summary: dict):
    """(name, numbers) of the trained runs in the summary: vanilla, then the tools'."""
    for key, name in (("vanilla", "vanilla GRPO"), ("final", "GRPO + tools")):
        if key in summary:
            yield name, summary[key]


#: What the forks task's table shows: greedy accuracy, pass@k at k = 1, 16, 64 of 64 samples, distinct right answers.
FORKS_KEYS = ("answer_acc", "pass_at_1", "pass_at_16", "pass_at_64", "distinct_correct")


def print_forks_summary(summary: dict, rows: list) -> None:
    print_table(rows, FORKS_KEYS, 17)
    start = summary["start"]
    for name, run in trained_runs(summary):
        print(
            f"{name}: greedy accuracy {100 * start['answer_acc']:.1f}% -> {100 * run['answer_acc']:.1f}%, pass@1 "
            f"{start['pass_at_1']:.3f} -> {run['pass_at_1']:.3f}, pass@64 {start['pass_at_64']:.3f} -> "
            f"{run['pass_at_64']:.3f}, distinct right answers per prompt {start['distinct_correct']:.2f} -> "
            f"{run['distinct_correct']:.2f} (of {FORKS_SAMPLES} samples)"
        )
    if "vanilla" in summary and "final" in summary:
        v, t = summary["vanilla"], summary["final"]
        print(
            f"tools vs vanilla: distinct right answers {t['distinct_correct']:.2f} vs {v['distinct_correct']:.2f} per "
            f"prompt, pass@1 {100 * (t['pass_at_1'] - v['pass_at_1']):+.1f} points, greedy accuracy "
            f"{100 * (t['answer_acc'] - v['answer_acc']):+.1f} points"
        )
        print_checkpoints(v, t)


#: What the length-biased task's table shows: gold (greedy, sampled), the proxy, their gap, and what the proxy rewards.
LENGTH_KEYS = ("answer_acc", "pass_at_1", "proxy", "gap", "length", "repetition", "entropy", "distinct_2")


def print_length_summary(summary: dict, rows: list) -> None:
    print("answer_acc: gold, greedy; pass_at_1: gold, sampled; proxy: the training reward; gap: proxy - pass_at_1")
    print_table(rows, LENGTH_KEYS, 11)
    start = summary["start"]
    for name, run in trained_runs(summary):
        print(
            f"{name}: gold {100 * start['answer_acc']:.1f}% -> {100 * run['answer_acc']:.1f}% (greedy), proxy "
            f"{start['proxy']:.3f} -> {run['proxy']:.3f}, length {start['length']:.1f} -> {run['length']:.1f} "
            f"characters, repetition {start['repetition']:.3f} -> {run['repetition']:.3f}"
        )
    if "vanilla" in summary and "final" in summary:
        v, t = summary["vanilla"], summary["final"]
        print(
            f"tools vs vanilla: gold {100 * (t['answer_acc'] - v['answer_acc']):+.1f} points (greedy), "
            f"{100 * (t['pass_at_1'] - v['pass_at_1']):+.1f} (sampled); proxy - gold gap {t['gap']:.3f} vs "
            f"{v['gap']:.3f}; repetition {t['repetition']:.3f} vs {v['repetition']:.3f}"
        )
        print_checkpoints(v, t)
    train = summary["train"]
    if "alarm_steps" in train:

        def fired(steps: list[int]) -> str:
            return f"first at step {steps[0]}" if steps else "never"

        alarms = f"tools {fired(train['alarm_steps'])}"
        if "vanilla_alarm_steps" in train:
            alarms = f"vanilla {fired(train['vanilla_alarm_steps'])}, {alarms}"
        print(f"collapse alarm (repetition / Distinct-2 of the training batches): {alarms}")
    for prefix, name in (("vanilla_", "vanilla"), ("", "tools")):
        if f"{prefix}hack_alarm" not in train:
            continue
        alarm, peak = train[f"{prefix}hack_alarm"], train.get(f"{prefix}gold_peak")
        signals = (alarm or {}).get("signals", {})
        shape = {k: v for k, v in signals.items() if k not in ("audit", "validation")}
        first = min(shape.items(), key=lambda item: item[1]["step"]) if shape else None
        fired = f"step {first[1]['step']} ({first[0]}, onset step {first[1]['onset']})" if first else "never"
        independent = ", ".join(
            f"{what} at step {signals[key]['step']}" if key in signals else f"{what} never"
            for key, what in (("audit", "audit"), ("validation", "held-out gold"))
        )
        acted = (alarm or {}).get("acted")
        acts = f"collapse_action acts at step {acted['step']} (onset {acted['onset']})" if acted else "no action"
        where = ""
        if peak is not None:
            halved = f", under half of it from step {peak['halved_at']}" if peak["halved_at"] else ", never halved"
            where = f"; gold of its training batches peaked at step {peak['step']} ({peak['gold']:.2f}{halved})"
        print(f"hack detector ({name}): shape (gold-free) {fired}; {independent}; {acts}{where}")


def print_summary(summary: dict, output_dir: str) -> None:
    print(f"\n=== math_grpo summary (task: {summary['task']}, held-out problems) ===")
    rows = [
        (label, summary[key])
        for key, label in (("start", "start (SFT)"), ("vanilla", "vanilla GRPO"), ("final", "GRPO + tools"))
        if key in summary
    ]
    many_answers = rows and "distinct_correct" in rows[0][1]  # the forks task: reward-independent metrics
    if many_answers:
        print_forks_summary(summary, rows)
    elif rows and "gap" in rows[0][1]:  # a proxy reward: gold beside it
        print_length_summary(summary, rows)
    elif rows:
        keys = [k for k in SUMMARY_KEYS if k in rows[0][1]] + (["step_acc"] if "step_acc" in rows[0][1] else [])
        print_table(rows, keys, 12)
        start = summary["start"]

        def gain(name: str, run: dict) -> None:
            print(
                f"{name}: held-out accuracy {100 * start['answer_acc']:.1f}% -> {100 * run['answer_acc']:.1f}% "
                f"({100 * (run['answer_acc'] - start['answer_acc']):+.1f} points), pass@1 {start['pass_at_1']:.3f} -> "
                f"{run['pass_at_1']:.3f}, pass@8 {start['pass_at_8']:.3f} -> {run['pass_at_8']:.3f}"
            )

        for name, run in trained_runs(summary):
            gain(name, run)
        if "vanilla" in summary and "final" in summary:
            v, t = summary["vanilla"], summary["final"]
            print(
                f"tools vs vanilla: accuracy {100 * (t['answer_acc'] - v['answer_acc']):+.1f} points, entropy "
                f"{t['entropy']:.3f} vs {v['entropy']:.3f} nats, Distinct-2 {t['distinct_2']:.3f} vs "
                f"{v['distinct_2']:.3f}"
            )
            print_checkpoints(v, t)
        for sample in rows[-1][1]["samples"]:
            print("  ", sample)
    t = summary["train"]
    tools = ", ".join(f"{k}={v}" for k, v in t["tools"].items()) or "none (vanilla settings)"
    entropy = "n/a" if t["final_entropy"] is None else f"{t['final_entropy']:.3f}"
    print(
        f"GRPO: {t['steps']} steps on {t['num_processes']} process(es), tools: {tools}; final training entropy "
        f"{entropy}, beta {t['final_beta']:.4g}"
    )
    pass_at_k = ", pass_at_k.png" if many_answers else ""
    print(
        f"plots: {os.path.join(output_dir, 'plots')}/ (training.png, collapse.png, families.png{pass_at_k}); summary: "
        f"{os.path.join(output_dir, 'summary.json')}"
    )


def import_extensions(argv: list[str]) -> list[str]:
    """Import the modules ``--ext_import`` names, on the command line or in the ``--config`` YAML, before the parser
    reads the switches (a switch's valid values are the names registered when it parses). Returns their names."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # the two flags alone; the rest parses later
    early.add_argument("--ext_import", "--ext-import", nargs="*", action="extend", default=[])
    early.add_argument("--config")
    known, _ = early.parse_known_args(argv)
    names: list[str] = list(known.ext_import)
    if known.config:
        import yaml

        with open(known.config, encoding="utf-8") as f:
            listed = (yaml.safe_load(f) or {}).get("ext_import") or []
        names += [listed] if isinstance(listed, str) else list(listed)
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise SystemExit(
                f"--ext_import {name}: cannot import it ({error}). Fix: put the module on PYTHONPATH (or pip install "
                "its package), and name it as Python imports it (my_pkg.clips, not my_pkg/clips.py)."
            ) from error
    return names


def resolve_argv(argv: list[str]) -> list[str]:
    """No arguments: the embedded default. Flags without ``--config``: the default with those flags on top (later
    flags win). With ``--config``: the YAML alone, plus any flags (a real-scale config must not inherit tiny values)."""
    if "--config" in argv:
        return argv
    return DEFAULT_ARGS + argv


if __name__ == "__main__":
    import_extensions(sys.argv[1:])  # members of the user's own, registered before the switches are parsed
    parser = make_parser()
    script_args, training_args, model_args = parser.parse_args_and_config(resolve_argv(sys.argv[1:]))
    main(script_args, training_args, model_args)
