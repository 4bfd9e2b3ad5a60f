"""The tiny settings shared by the studies (collapse_demo, aepo_entropy, prm_step_accuracy).

``sums``: a tiny random Llama on single-digit sums with the first-character and digit-fraction shaping rewards, batch
32 (4 prompts x 8 completions), 8 completion tokens: at learning rates of 5e-3 and above vanilla GRPO's token entropy
collapses within tens of steps.

``chains``: a wider tiny Llama (128 x 4 layers) warm-started with TRL's SFTTrainer on two-operation chains
(``"3+4+2="`` -> ``"3+4=7\n7+2=9\n9"``), then GRPO on the final-answer reward: a model that solves about half of the
held-out problems, so accuracy and pass@k can move either way.
"""

from __future__ import annotations

import os
import tempfile

import torch
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer


def chains_warm_start(cache: str, *, epochs: float = 5.0, seed: int = 0) -> str:
    """The SFT warm start of the ``chains`` setting, built once and cached in ``cache``; returns its path."""
    path = os.path.join(cache, f"sft-e{epochs}-s{seed}")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    tok = testkit.build_char_tokenizer()
    torch.manual_seed(seed)
    model = testkit.build_tiny_model(tok, hidden_size=128, num_layers=4, seed=seed)
    rows = testkit.multistep_dataset(4000, seed=seed, ops="+")
    data = Dataset.from_list([{"prompt": r["prompt"], "completion": r["solution"] + tok.eos_token} for r in rows])
    args = SFTConfig(
        output_dir=os.path.join(cache, "sft-tmp"),
        num_train_epochs=epochs,
        learning_rate=3e-3,
        per_device_train_batch_size=64,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=seed,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    trainer.save_model(path)
    tok.save_pretrained(path)
    return path


def default_cache() -> str:
    return os.path.join(tempfile.gettempdir(), "trl_grpo_ext_prm_study")


def train_chains_setting(
    model_path: str,
    *,
    steps: int,
    lr: float,
    seed: int,
    reward_funcs: list | None = None,
    step_reward_funcs: list | None = None,
    **overrides,
) -> GRPOExtTrainer:
    """GRPO from the ``chains`` warm start (batch 64 = 8 x 8, T 0.7, 20 tokens), by default on the final-answer
    reward; ``overrides`` are GRPOExtConfig fields, ``step_reward_funcs`` go to the trainer (PRM)."""
    args = GRPOExtConfig(
        **{
            "output_dir": tempfile.mkdtemp(),
            "per_device_train_batch_size": 64,
            "num_generations": 8,
            "max_completion_length": 20,
            "temperature": 0.7,
            "max_steps": steps,
            "learning_rate": lr,
            "logging_steps": 1,
            "report_to": "none",
            "use_cpu": True,
            "bf16": False,
            "seed": seed,
            "save_strategy": "no",
            "disable_tqdm": True,
            **overrides,
        }
    )
    trainer = GRPOExtTrainer(
        model=model_path,
        reward_funcs=reward_funcs or [testkit.final_answer_reward],
        args=args,
        train_dataset=testkit.multistep_dataset(20_000, seed=1 + seed, ops="+"),
        processing_class=testkit.build_char_tokenizer(),
        step_reward_funcs=step_reward_funcs,
    )
    trainer.train()
    return trainer


def train_collapse_setting(model_path: str, *, steps: int, lr: float, seed: int, **overrides) -> GRPOExtTrainer:
    """Train GRPOExtTrainer in the collapsing setting with ``overrides`` on top; returns the trained trainer."""
    args = GRPOExtConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=8,
        max_steps=steps,
        learning_rate=lr,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=seed,
        save_strategy="no",
        disable_tqdm=True,
        **overrides,
    )
    trainer = GRPOExtTrainer(
        model=model_path,
        reward_funcs=[testkit.first_char_reward, testkit.digit_fraction_reward],
        args=args,
        train_dataset=testkit.arithmetic_dataset(4096, seed=seed),
        processing_class=testkit.build_char_tokenizer(),
    )
    trainer.train()
    return trainer
