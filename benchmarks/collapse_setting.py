"""The collapsing tiny setting shared by the studies (collapse_demo, aepo_entropy, anti_collapse_study).

A tiny random Llama on single-digit sums with the first-character and digit-fraction shaping rewards, batch 32
(4 prompts x 8 completions), 8 completion tokens: at learning rates of 5e-3 and above vanilla GRPO's token entropy
collapses within tens of steps.
"""

from __future__ import annotations

import tempfile

from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer, testkit


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
