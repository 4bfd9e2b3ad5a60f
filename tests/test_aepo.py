"""AEPO: temperature switch, sample selection, loss term, and the trainer integration."""

import json
import math

import pytest
import torch
from conftest import last_logs

from trl_grpo_ext import testkit
from trl_grpo_ext.core.aepo import aepo_per_token_loss, aepo_select, aepo_temperature


def test_temperature_switch():
    kw = dict(target=0.5, temperature_high=1.2, temperature_low=0.8)
    assert aepo_temperature(0.3, **kw) == 1.2  # entropy under target: sample hotter
    assert aepo_temperature(0.5, **kw) == 0.8 and aepo_temperature(0.9, **kw) == 0.8
    assert aepo_temperature(None, **kw) == 0.8  # nothing measured yet


def test_selection_threshold_and_cap():
    # Group 1: rewards 0, 1, 1, 0 -> advantages -0.866, +0.866, +0.866, -0.866 (sample std); group 2 flat.
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    keep = aepo_select(rewards, 4, adv_threshold=0.05, max_samples=10)
    assert keep.tolist() == [False, True, True, False, False, False, False, False]
    capped = aepo_select(rewards, 4, adv_threshold=0.05, max_samples=1, generator=torch.Generator().manual_seed(0))
    assert int(capped.sum()) == 1 and (capped <= keep).all()
    # A tiny positive advantage under the threshold does not count.
    near = aepo_select(torch.tensor([0.0, 0.0, 0.0, 1e-3]), 4, adv_threshold=2.0, max_samples=5)
    assert not near.any()


def test_loss_term_value_and_gradient():
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.5]])
    loss = aepo_per_token_loss(logps, old)
    torch.testing.assert_close(loss.detach(), torch.tensor([[-1.0, -math.exp(0.5)]]))
    loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.0, -math.exp(0.5)]]))  # REINFORCE at ratio 1: -1


def test_aepo_training_run_and_state(make_trainer, tmp_path):
    trainer = make_trainer(
        entropy_control="aepo",
        aepo_target_entropy=4.6,
        max_steps=4,
        steps_per_generation=2,
        save_strategy="steps",
        save_steps=2,
        reward_funcs=[testkit.digit_fraction_reward],
    )
    trainer.train()
    logs = last_logs(trainer)
    gen_logs = [h for h in logs if "aepo/temperature" in h]
    assert gen_logs[0]["aepo/temperature"] == 0.8  # no measurement before the first batch
    assert gen_logs[1]["aepo/temperature"] == 1.2  # entropy ~4.57 < 4.6: hotter
    assert all("aepo/loss" in h and math.isfinite(h["loss"]) for h in logs)
    assert all(h["aepo/extra_gen_time"] > 0 for h in gen_logs)
    # TRL's completion metrics describe the policy's own samples only.
    assert all(h["completions/mean_length"] <= trainer.max_completion_length for h in gen_logs)
    state = json.loads((tmp_path / "out" / "checkpoint-4" / "grpo_ext_state.json").read_text())
    assert state["entropy_control"]["last_entropy"] == pytest.approx(trainer.extensions["entropy_control"].last_entropy)


def test_aepo_composes_with_every_family(make_trainer):
    def steps(prompts, completions, steps, **kwargs):
        return [[(len(s) % 3) / 2 for s in row] for row in steps]

    trainer = make_trainer(
        entropy_control="aepo",
        advantage_estimator="prm",
        token_clip="clip_cov",
        clip_cov_lb=-100.0,
        clip_cov_ratio=0.05,
        sample_filter="best_worst",
        loss_type="grpo",
        kl_control="adaptive",
        beta=0.04,
        kl_horizon=50,
        max_steps=3,
        max_completion_length=8,
        diversity_metrics=["distinct", "entropy"],
        reward_funcs=[testkit.digit_fraction_reward],
        trainer_kwargs={"step_reward_funcs": [steps]},
    )
    trainer.train()
    logs = last_logs(trainer)
    assert len(logs) == 3 and all(math.isfinite(h["loss"]) for h in logs)
    for key in (
        "aepo/samples_used",
        "prm/adv_abs_mean",
        "clip_cov/selected_frac",
        "filter/kept_frac",
        "kl/beta",
        "diversity/distinct_2",
    ):
        assert any(key in h for h in logs), key


def test_aepo_refuses_the_entropy_bonus(make_trainer):
    with pytest.raises(ValueError, match="GRPOExtConfig.entropy_control='aepo'.*entropy_coef=0"):
        make_trainer(entropy_control="aepo", entropy_coef=0.01)
    with pytest.raises(ValueError, match="aepo_temperature_low"):
        make_trainer(entropy_control="aepo", aepo_temperature_low=1.5)
