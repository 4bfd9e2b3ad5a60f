# Copyright 2026 The trl-grpo-ext authors. Apache-2.0.
"""GRPO on math with trl-grpo-ext's anti-collapse tools.

Usage:

    # The embedded default: fully offline, CPU, a few minutes. A tiny Llama built locally, a short SFT warm start
    # (TRL SFTTrainer, cached), then GRPO with PRM step advantages, Clip-Cov and adaptive KL on the synthetic
    # multi-step arithmetic task; prints accuracy before / after and writes plots to the output folder.
    accelerate launch recipes/math_grpo.py

    # One tool at a time, or all of them (offline configs):
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

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field

from accelerate import PartialState
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
from trl import ModelConfig, TrlParser

from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer, testkit
from trl_grpo_ext.data import load_math_dataset
from trl_grpo_ext.evaluation import evaluate_multistep
from trl_grpo_ext.plot import plot_runs
from trl_grpo_ext.rewards import REWARD_FUNCS, STEP_REWARD_FUNCS

TINY_MODEL = "tiny"


@dataclass
class MathScriptArguments:
    """Recipe arguments (besides GRPOExtConfig and ModelConfig)."""

    dataset_name: str = field(
        default="synthetic",
        metadata={"help": "'synthetic' (offline multi-step arithmetic), a Hub dataset id, or a local json/parquet."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration (e.g. 'main')."})
    dataset_format: str | None = field(
        default=None, metadata={"help": "Row format: gsm8k, math, dapo or plain (default: guessed from the name)."}
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Training split."})
    num_train_examples: int | None = field(default=None, metadata={"help": "Subsample the training set."})
    synthetic_num_ops: int = field(default=2, metadata={"help": "Operations per synthetic problem."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["final_answer"],
        metadata={"help": "Outcome rewards by name (math_accuracy, boxed_format, final_answer, ...)."},
    )
    step_reward_funcs: list[str] = field(
        default_factory=lambda: ["arithmetic_steps"],
        metadata={"help": "Step rewards by name, used when advantage_estimator=prm."},
    )
    eval_num_problems: int = field(default=128, metadata={"help": "Held-out synthetic problems for the summary."})
    tiny_hidden_size: int = field(default=128, metadata={"help": "Width of the tiny model (model 'tiny')."})
    tiny_num_layers: int = field(default=4, metadata={"help": "Layers of the tiny model (model 'tiny')."})
    sft_warm_start_epochs: float = field(
        default=5.0, metadata={"help": "SFT epochs on synthetic solutions before GRPO (tiny model only; 0: none)."}
    )
    sft_num_examples: int = field(default=4000, metadata={"help": "Synthetic solutions for the SFT warm start."})
    cache_dir: str = field(
        default=os.path.join(os.path.expanduser("~"), ".cache", "trl_grpo_ext"),
        metadata={"help": "Where the tiny model and its SFT warm start are cached."},
    )


#: The embedded default run (what `accelerate launch recipes/math_grpo.py` does with no arguments).
DEFAULT_ARGS = [  # fmt: skip
    "--output_dir",
    "outputs/math_grpo_default",
    "--model_name_or_path",
    TINY_MODEL,
    "--use_cpu",
    "true",
    "--bf16",
    "false",
    "--max_steps",
    "100",
    "--learning_rate",
    "5e-5",
    "--lr_scheduler_type",
    "constant",
    "--per_device_train_batch_size",
    "64",
    "--num_generations",
    "8",
    "--max_completion_length",
    "20",
    "--temperature",
    "0.7",
    "--logging_steps",
    "5",
    "--save_strategy",
    "no",
    "--report_to",
    "none",
    "--seed",
    "0",
    "--advantage_estimator",
    "prm",
    "--prm_outcome_coef",
    "1.0",
    "--token_clip",
    "clip_cov",
    "--beta",
    "0.02",
    "--kl_control",
    "adaptive",
    "--kl_target",
    "0.02",
    "--kl_horizon",
    "2000",
    "--diversity_metrics",
    "distinct",
    "self_bleu",
    "repetition",
    "unique",
    "entropy",
]


def make_parser() -> TrlParser:
    return TrlParser((MathScriptArguments, GRPOExtConfig, ModelConfig))


def _cache_key(*parts) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def prepare_tiny_model(script_args, training_args, state: PartialState) -> str:
    """Build the tiny model (and its SFT warm start) once, cached; every process returns the same path."""
    tok = testkit.build_char_tokenizer()
    key = _cache_key(
        script_args.tiny_hidden_size,
        script_args.tiny_num_layers,
        script_args.sft_warm_start_epochs,
        script_args.sft_num_examples,
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
    done = os.path.exists(os.path.join(sft_path, "config.json"))
    if not done:
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        rows = testkit.multistep_dataset(
            script_args.sft_num_examples, seed=training_args.seed, ops="+", num_ops=script_args.synthetic_num_ops
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


def main(script_args: MathScriptArguments, training_args: GRPOExtConfig, model_args: ModelConfig) -> dict:
    state = PartialState()
    set_seed(training_args.seed)
    tiny = model_args.model_name_or_path in (None, TINY_MODEL)
    if tiny:
        model_path = prepare_tiny_model(script_args, training_args, state)
        init_path = os.path.join(os.path.dirname(model_path), "init")
    else:
        model_path = init_path = model_args.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    train = load_math_dataset(
        script_args.dataset_name,
        split=script_args.dataset_train_split,
        config=script_args.dataset_config,
        dataset_format=script_args.dataset_format,
        num_examples=script_args.num_train_examples,
        seed=training_args.seed,
        synthetic_num_ops=script_args.synthetic_num_ops,
    )
    synthetic = script_args.dataset_name == "synthetic"
    heldout = load_math_dataset(
        "synthetic",
        split="test",
        num_examples=script_args.eval_num_problems,
        seed=training_args.seed,
        synthetic_num_ops=script_args.synthetic_num_ops,
    )

    summary: dict = {}
    if synthetic and state.is_main_process:
        summary["init"] = evaluate_multistep(AutoModelForCausalLM.from_pretrained(init_path), tokenizer, heldout)
        if model_path != init_path:
            summary["sft"] = evaluate_multistep(AutoModelForCausalLM.from_pretrained(model_path), tokenizer, heldout)

    reward_funcs = [REWARD_FUNCS.get(name) for name in script_args.reward_funcs]
    step_funcs = None
    if training_args.advantage_estimator == "prm":
        step_funcs = [STEP_REWARD_FUNCS.get(name) for name in script_args.step_reward_funcs]
    model_init_kwargs = {"dtype": model_args.dtype} if model_args.dtype not in (None, "auto") else {}
    training_args.model_init_kwargs = training_args.model_init_kwargs or model_init_kwargs or None
    trainer = GRPOExtTrainer(
        model=model_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train,
        processing_class=tokenizer,
        step_reward_funcs=step_funcs,
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)

    if state.is_main_process:
        if synthetic:
            summary["final"] = evaluate_multistep(trainer.model, tokenizer, heldout)
        logs = [h for h in trainer.state.log_history if "loss" in h]
        summary["train"] = {
            "steps": trainer.state.global_step,
            "num_processes": state.num_processes,
            "final_entropy": logs[-1].get("entropy") if logs else None,
            "final_beta": trainer.beta,
            "final_reward": logs[-1].get("reward") if logs else None,
        }
        os.makedirs(training_args.output_dir, exist_ok=True)
        trainer.save_state()  # trainer_state.json, which `python -m trl_grpo_ext.plot` reads
        plot_runs({"default": trainer.state.log_history}, os.path.join(training_args.output_dir, "plots"))
        with open(os.path.join(training_args.output_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        print_summary(summary, training_args.output_dir)
    state.wait_for_everyone()
    return summary


def print_summary(summary: dict, output_dir: str) -> None:
    print("\n=== math_grpo summary ===")
    rows = [(name, summary[name]) for name in ("init", "sft", "final") if name in summary]
    if rows:
        print(f"{'model':<8}{'answer_acc':>11}{'step_acc':>10}{'distinct_2':>12}")
        for name, m in rows:
            print(f"{name:<8}{m['answer_acc']:>11.3f}{m['step_acc']:>10.3f}{m['distinct_2']:>12.3f}")

        def change(name: str, a: dict, b: dict) -> None:
            print(
                f"{name}: held-out answer accuracy {100 * a['answer_acc']:.1f}% -> {100 * b['answer_acc']:.1f}% "
                f"({100 * (b['answer_acc'] - a['answer_acc']):+.1f} points), step accuracy "
                f"{100 * a['step_acc']:.1f}% -> {100 * b['step_acc']:.1f}% "
                f"({100 * (b['step_acc'] - a['step_acc']):+.1f})"
            )

        if "sft" in summary:
            change("SFT warm start", summary["init"], summary["sft"])
        change("GRPO", rows[-2][1], rows[-1][1])  # the change GRPO itself made, from its own start
        for sample in rows[-1][1]["samples"]:
            print("  ", sample)
    t = summary["train"]
    entropy = "n/a" if t["final_entropy"] is None else f"{t['final_entropy']:.3f}"
    print(
        f"GRPO: {t['steps']} steps on {t['num_processes']} process(es); final entropy {entropy}, "
        f"beta {t['final_beta']:.4g}"
    )
    print(
        f"plots: {os.path.join(output_dir, 'plots')}/ (training.png, collapse.png); summary: "
        f"{os.path.join(output_dir, 'summary.json')}"
    )


def resolve_argv(argv: list[str]) -> list[str]:
    """No arguments: the embedded default. Flags without ``--config``: the default with those flags on top (later
    flags win). With ``--config``: the YAML alone, plus any flags (a real-scale config must not inherit tiny values)."""
    if "--config" in argv:
        return argv
    return DEFAULT_ARGS + argv


if __name__ == "__main__":
    parser = make_parser()
    script_args, training_args, model_args = parser.parse_args_and_config(resolve_argv(sys.argv[1:]))
    main(script_args, training_args, model_args)
