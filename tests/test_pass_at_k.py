"""advantage_estimator='pass_at_k' (PKPO) in the trainer: the advantages it writes, k's schedule, evaluation left to
TRL, and a tiny training run."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import last_logs, scored_batch

from grpo_lab import testkit
from trl_grpo_ext.core.pkpo import pass_at_k_weights


def lengths(completions, **kwargs):
    """Varies within a group of random completions: the length of the completion."""
    return [float(len(str(c))) for c in completions]


@pytest.mark.parametrize("estimator", ["loo_minus_one", "s"])
def test_advantages_are_the_scaled_pkpo_weights_of_the_rewards(make_trainer, train_dataset, estimator):
    trainer = make_trainer(
        advantage_estimator="pass_at_k",
        pkpo_k=2,
        pkpo_estimator=estimator,
        reward_funcs=[lengths],
        max_completion_length=8,
    )
    out = scored_batch(trainer, train_dataset, num_prompts=2)
    rewards = torch.tensor(list(trainer._logs["rewards"]["lengths"])[-8:], dtype=torch.float32)
    expected = pass_at_k_weights(rewards, 4, 2, estimator=estimator) * (4 / 2)
    torch.testing.assert_close(out["advantages"], expected.float())
    assert rewards.unique().numel() > 1  # the check had rewards that differ


def test_evaluation_keeps_trls_advantages(make_trainer, train_dataset):
    trainer = make_trainer(advantage_estimator="pass_at_k", pkpo_k=2, reward_funcs=[lengths], max_completion_length=8)
    out = scored_batch(trainer, train_dataset, num_prompts=2, mode="eval")
    rewards = torch.tensor(list(trainer._logs["rewards"]["lengths"])[-8:])
    grouped = rewards.view(-1, 4)
    trl = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
    torch.testing.assert_close(out["advantages"], trl)


def test_k_anneals_and_training_runs(make_trainer):
    trainer = make_trainer(
        advantage_estimator="pass_at_k",
        pkpo_k=4,
        pkpo_anneal_fraction=0.5,
        max_steps=4,
        reward_funcs=[lengths, testkit.exact_match_reward],
    )
    trainer.train()
    logs = last_logs(trainer)
    assert [h["pkpo/k"] for h in logs] == [4, 2, 1, 1]  # steps 0..3 of 4: k from 4 down to 1 over the first half
    assert all(math.isfinite(h["loss"]) and h["pkpo/adv_abs_mean"] >= 0 for h in logs)
