"""advantage_weighting='w_reinforce' and 'entropy_advantage' in the trainer: the advantages TRL's loss
uses (checked against the same loss with hand-made advantages), evaluation left to TRL, the buffered batch left alone,
and tiny training runs alone and with every other family."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import LogpProbe, last_logs, scored_batch

from grpo_lab import testkit
from trl_grpo_ext.core.advantages import entropy_shaped_advantages, scale_positive_advantages


def lengths(completions, **kwargs):
    """Varies within a group of random completions: the length of the completion."""
    return [float(len(str(c))) for c in completions]


def test_w_reinforce_replaces_the_group_advantage_by_plus_lambda_minus_one(make_trainer, train_dataset):
    trainer = make_trainer(
        advantage_weighting="w_reinforce",
        w_reinforce_lambda=0.1,
        w_reinforce_threshold=10.0,
        reward_funcs=[lengths],
        max_completion_length=8,
    )
    out = scored_batch(trainer, train_dataset, num_prompts=2)
    rewards = torch.tensor(list(trainer._logs["rewards"]["lengths"])[-8:], dtype=torch.float32)
    expected = torch.where(rewards > 10.0, torch.tensor(0.1), torch.tensor(-1.0))
    torch.testing.assert_close(out["advantages"], expected)
    assert {0.1, -1.0} <= set(out["advantages"].tolist()) or (rewards > 10).all() or (rewards <= 10).all()
    frac = trainer._metrics["train"]["w_reinforce/positive_frac"][-1]
    assert frac == float((rewards > 10.0).float().mean())


def test_w_reinforce_leaves_evaluation_to_trl(make_trainer, train_dataset):
    trainer = make_trainer(advantage_weighting="w_reinforce", reward_funcs=[lengths], max_completion_length=8)
    out = scored_batch(trainer, train_dataset, num_prompts=2, mode="eval")
    rewards = torch.tensor(list(trainer._logs["rewards"]["lengths"])[-8:]).view(-1, 4)
    trl = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).view(-1)
    torch.testing.assert_close(out["advantages"], trl)


def _loss_and_grad(trainer, probe, inputs):
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), probe.logps.grad.clone()


def test_w_reinforce_group_scales_positive_advantages_in_the_loss(make_trainer, train_dataset):
    trainer = make_trainer(
        advantage_weighting="w_reinforce",
        w_reinforce_baseline="group",
        w_reinforce_lambda=0.25,
        beta=0.1,
        reward_funcs=[lengths],
        max_completion_length=8,
    )
    probe = LogpProbe().install(trainer)
    inputs = scored_batch(trainer, train_dataset)
    before = inputs["advantages"].clone()
    assert (before > 0).any() and (before < 0).any()
    loss, grad = _loss_and_grad(trainer, probe, inputs)
    torch.testing.assert_close(inputs["advantages"], before)  # the buffered batch is not edited
    trainer.extensions.pop("advantage_weighting")
    weighted = scale_positive_advantages(before, positive_weight=0.25)
    ref_loss, ref_grad = _loss_and_grad(trainer, probe, {**inputs, "advantages": weighted})
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)


def test_entropy_advantage_is_the_capped_bonus_on_the_loss_advantages(make_trainer, train_dataset):
    trainer = make_trainer(
        advantage_weighting="entropy_advantage",
        entropy_adv_alpha=0.4,
        entropy_adv_kappa=2.0,
        beta=0.1,
        loss_type="bnpo",
    )
    probe = LogpProbe().install(trainer)
    inputs = scored_batch(trainer, train_dataset)
    inputs["advantages"] = torch.randn(inputs["advantages"].shape, generator=torch.Generator().manual_seed(0))
    before = inputs["advantages"].clone()
    captured = {}
    member = trainer.extensions["advantage_weighting"]
    original = member.shape_advantages

    def capture(advantages, ctx):
        captured["entropies"] = ctx.entropies.detach().clone()
        return original(advantages, ctx)

    member.shape_advantages = capture
    loss, grad = _loss_and_grad(trainer, probe, inputs)
    torch.testing.assert_close(inputs["advantages"], before)  # the buffered batch is not edited
    bonus = trainer._metrics["train"]["entropy_adv/bonus_mean"][-1]
    assert bonus > 0
    trainer.extensions.pop("advantage_weighting")
    mask = inputs["completion_mask"]
    token_adv = before.unsqueeze(1).expand_as(mask)
    shaped = entropy_shaped_advantages(token_adv, captured["entropies"], alpha=0.4, kappa=2.0)
    ref_loss, ref_grad = _loss_and_grad(trainer, probe, {**inputs, "advantages": shaped})
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    valid = mask.bool()
    assert math.isclose(bonus, float((shaped - token_adv)[valid].mean()), rel_tol=1e-5)
    assert not torch.allclose(shaped, token_adv)  # the check had a non-zero bonus
    # capped: tokens whose bonus hit |A| / kappa, a token of advantage 0 (no bonus at all) not counted
    capped = (0.4 * captured["entropies"] > token_adv.abs() / 2.0) & (token_adv != 0) & valid
    expected = float(capped.sum() / valid.sum())
    assert math.isclose(trainer._metrics["train"]["entropy_adv/capped_frac"][-1], expected, rel_tol=1e-6)
    zero = {**inputs, "advantages": torch.zeros_like(before)}
    trainer.extensions["advantage_weighting"] = member
    member.shape_advantages = original
    _loss_and_grad(trainer, probe, zero)
    assert trainer._metrics["train"]["entropy_adv/capped_frac"][-1] == 0.0  # advantage 0 everywhere: nothing capped
    assert trainer._metrics["train"]["entropy_adv/bonus_mean"][-1] == 0.0


def test_w_reinforce_group_logs_what_it_does_to_the_batch(make_trainer, train_dataset):
    """positive_frac: the rows TRL gave a positive advantage (those the weighting scales); adv_mean: the batch's
    advantages after the weighting. A flat group's rows (advantage 0) are not positive."""

    def first_prompt_varies(prompts, completions, **kwargs):  # the other groups are flat: advantage 0
        return [float(len(str(c))) if p == prompts[0] else 1.0 for p, c in zip(prompts, completions, strict=True)]

    trainer = make_trainer(
        advantage_weighting="w_reinforce",
        w_reinforce_baseline="group",
        w_reinforce_lambda=0.25,
        reward_funcs=[first_prompt_varies],
        max_completion_length=8,
    )
    inputs = scored_batch(trainer, train_dataset)
    advantages = inputs["advantages"]
    assert (advantages == 0).sum() >= 4 and (advantages > 0).any()
    metrics = trainer._metrics["train"]
    assert metrics["w_reinforce/positive_frac"][-1] == float((advantages > 0).float().mean())
    weighted = scale_positive_advantages(advantages, positive_weight=0.25)
    assert math.isclose(metrics["w_reinforce/adv_mean"][-1], float(weighted.mean()), rel_tol=1e-5, abs_tol=1e-7)


@pytest.mark.parametrize(
    "weighting",
    [
        dict(advantage_weighting="w_reinforce", w_reinforce_baseline="group"),
        dict(advantage_weighting="entropy_advantage"),
    ],
    ids=["w_reinforce", "entropy_advantage"],
)
def test_each_trains_with_every_other_family(make_trainer, weighting):
    trainer = make_trainer(
        advantage_estimator="pass_at_k",
        pkpo_k=2,
        pkpo_anneal_fraction=0.5,  # k reaches 1: PKPO's advantages get both signs, so W-REINFORCE's weighting acts
        **weighting,
        token_clip="clip_cov",
        sample_filter="best_worst",
        kl_control="adaptive",
        beta=0.04,
        num_iterations=2,
        max_steps=3,
        reward_funcs=[lengths, testkit.exact_match_reward],
    )
    trainer.train()
    logs = last_logs(trainer)
    entropy_adv = weighting["advantage_weighting"] == "entropy_advantage"
    generation = ("pkpo/k", "filter/kept_frac") + (() if entropy_adv else ("w_reinforce/positive_frac",
                                                                          "w_reinforce/adv_mean"))  # fmt: skip
    loss_side = ("clip_cov/selected_frac", "kl/beta") + (
        ("entropy_adv/bonus_mean", "entropy_adv/capped_frac") if entropy_adv else ()
    )
    assert sum("pkpo/k" in h for h in logs) == 2  # steps 0 and 2 generate; step 1 reuses (num_iterations=2)
    for h in logs:
        keys = loss_side + (generation if "pkpo/k" in h else ())
        assert math.isfinite(h["loss"]) and all(math.isfinite(h[k]) for k in keys)
    assert not entropy_adv or any(h["entropy_adv/bonus_mean"] > 0 for h in logs)


def test_w_reinforce_paper_form_trains(make_trainer):
    trainer = make_trainer(advantage_weighting="w_reinforce", max_steps=2, reward_funcs=[testkit.exact_match_reward])
    trainer.train()
    logs = last_logs(trainer)
    assert all(math.isfinite(h["loss"]) and -1.0 <= h["w_reinforce/adv_mean"] <= 0.1 for h in logs)
