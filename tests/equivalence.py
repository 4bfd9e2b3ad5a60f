"""Shared by test_distributed.py and dist_worker.py: one generation batch with fixed completions, run on one process
or split over two, must give the same deterministic quantities (PRM advantages, filter masks, beta after a step)."""

from __future__ import annotations

import os

import torch

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer

#: One prompt, G = 8 fixed completions: with two processes the group spans both.
TEXTS = ["1+2=3\n3", "4\n5", "12\n\n7", "x\ny\nz", "99", "3+3=6\n6", "7\n", "2\n2\n2"]


def length_steps(prompts, completions, steps, **kwargs):
    return [[(sum(map(ord, s)) % 7) / 6 for s in row] for row in steps]


def build_trainer(model_path: str, out_dir: str, per_device: int) -> GRPOExtTrainer:
    args = GRPOExtConfig(
        output_dir=out_dir,
        per_device_train_batch_size=per_device,
        num_generations=8,
        max_completion_length=12,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        advantage_estimator="prm",
        prm_outcome_coef=0.5,
        advantage_std="population",
        sample_filter="best_worst",
        loss_type="grpo",
        beta=0.04,
        kl_control="adaptive",
        kl_target=0.01,
        kl_horizon=8,
    )
    trainer = GRPOExtTrainer(
        model=model_path,
        reward_funcs=[testkit.digit_fraction_reward],
        args=args,
        train_dataset=testkit.arithmetic_dataset(8),
        processing_class=testkit.build_char_tokenizer(),
        step_reward_funcs=[length_steps],
    )
    with torch.no_grad():  # move the policy away from the reference the same way everywhere: a non-zero KL
        gen = torch.Generator().manual_seed(123)
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return trainer


def deterministic_quantities(trainer: GRPOExtTrainer) -> dict:
    """This process's rows of the batch: advantages (trimmed to each completion), keep flags, and beta after a step."""
    tok = trainer._tokenizer
    rank = trainer.accelerator.process_index

    def fixed_generate(prompts):
        start = rank * len(prompts)
        completion_ids = [
            tok.encode(TEXTS[start + i], add_special_tokens=False) + [tok.eos_token_id] for i in range(len(prompts))
        ]
        prompt_ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
        texts = [TEXTS[start + i] for i in range(len(prompts))]
        return prompt_ids, completion_ids, None, texts, None, {}, None, None

    trainer._generate = fixed_generate
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    row = testkit.arithmetic_dataset(1, seed=3)[0]
    per_device = trainer.args.per_device_train_batch_size
    out = trainer._generate_and_score_completions([row] * per_device)
    trainer._compute_loss(trainer.model, out)
    lengths = out["completion_mask"].sum(1).tolist()
    return {
        "advantages": [out["advantages"][i, : lengths[i]].tolist() for i in range(len(lengths))],
        "keep": out["ext_keep"].tolist(),
        "beta": trainer.beta,
        "num_items_in_batch": int(out["num_items_in_batch"]),
    }


def model_dir(out_dir: str) -> str:
    return os.path.join(out_dir, "model")
