"""Reliability: resume continues identically, bad inputs give a clear error or a finite loss."""

import json
import math

import pytest
from conftest import last_logs

from trl_grpo_ext import testkit

ALL_ON = dict(
    advantage_std="population",
    token_clip="clip_cov",
    clip_cov_lb=-100.0,
    clip_cov_ratio=0.05,
    sample_filter="best_worst",
    loss_type="grpo",
    beta=0.04,
    kl_control="adaptive",
    kl_target=0.01,
    kl_horizon=50,
    entropy_control="aepo",
    aepo_target_entropy=4.6,
    reward_funcs=[testkit.exact_match_reward, testkit.digit_fraction_reward],
)


def test_resume_continues_identically(make_trainer, tmp_path):
    keys = ("loss", "kl/beta", "entropy", "aepo/temperature", "aepo/samples_used", "filter/kept_frac", "reward")
    full = make_trainer(max_steps=4, save_strategy="steps", save_steps=2, **ALL_ON)
    full.train()
    resumed = make_trainer(max_steps=4, save_strategy="steps", save_steps=2, **ALL_ON)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    a, b = last_logs(full)[2:], last_logs(resumed)[-2:]
    assert [h["step"] for h in a] == [h["step"] for h in b] == [3, 4]
    for x, y in zip(a, b):
        for key in keys:
            assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-7), key
    assert resumed.beta == pytest.approx(full.beta, rel=1e-6)
    aepo_a, aepo_b = full.extensions["entropy_control"], resumed.extensions["entropy_control"]
    assert aepo_b.last_entropy == pytest.approx(aepo_a.last_entropy, rel=1e-5)


def test_resume_keeps_the_collapse_alarm_baseline(make_trainer, tmp_path):
    """The alarm compares Distinct-2 with the run's first value; a resumed run must not take a later one instead."""
    fields = dict(max_steps=4, save_strategy="steps", save_steps=2, diversity_metrics=["distinct"])
    full = make_trainer(**fields)
    full.train()
    saved = json.loads((tmp_path / "out" / "checkpoint-2" / "grpo_ext_state.json").read_text())
    assert saved["collapse_monitor"]["baseline_distinct2"] == full.collapse_monitor.baseline_distinct2
    resumed = make_trainer(**fields)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert resumed.collapse_monitor.baseline_distinct2 == full.collapse_monitor.baseline_distinct2


def test_none_and_nan_rewards_give_finite_loss(make_trainer):
    def flaky(completions, **kwargs):
        return [None if i % 3 == 0 else (float("nan") if i % 3 == 1 else 1.0) for i in range(len(completions))]

    trainer = make_trainer(
        max_steps=2,
        reward_funcs=[flaky, testkit.digit_fraction_reward],
        **{k: v for k, v in ALL_ON.items() if k != "reward_funcs"},
    )
    trainer.train()
    assert all(math.isfinite(h["loss"]) for h in last_logs(trainer))


def test_every_reward_none_gives_zero_advantage_and_finite_loss(make_trainer):
    def nothing(completions, **kwargs):
        return [None] * len(completions)

    trainer = make_trainer(max_steps=2, reward_funcs=[nothing], sample_filter="best_worst", advantage_std="population")
    trainer.train()
    assert all(math.isfinite(h["loss"]) for h in last_logs(trainer))
    assert all(a == 0.0 for a in trainer._logs["advantages"])


def test_empty_and_all_padding_completions(make_trainer, monkeypatch):
    def steps(prompts, completions, steps, **kwargs):
        return [[1.0] * len(s) for s in steps]

    trainer = make_trainer(
        max_steps=2,
        advantage_estimator="prm",
        prm_outcome_coef=1.0,
        token_clip="clip_cov",
        clip_cov_lb=-100.0,
        sample_filter="nonzero_std",
        beta=0.04,
        kl_control="adaptive",
        diversity_metrics=["distinct", "repetition", "entropy"],
        reward_funcs=[testkit.digit_fraction_reward],
        trainer_kwargs={"step_reward_funcs": [steps]},
    )
    original = trainer._generate

    tok = trainer._tokenizer

    def half_empty(prompts):
        # Row 4k: only EOS (an empty answer); row 4k+2: only padding tokens; odd rows: real samples.
        out = list(original(prompts))
        blank = {0: [tok.eos_token_id], 2: [tok.pad_token_id] * 3}
        completion_ids = [blank.get(i % 4, ids) for i, ids in enumerate(out[1])]
        out[1] = completion_ids
        out[3] = [trainer._tokenizer.decode(ids, skip_special_tokens=True) for ids in completion_ids]
        return tuple(out)

    monkeypatch.setattr(trainer, "_generate", half_empty)
    trainer.train()
    logs = last_logs(trainer)
    assert all(math.isfinite(h["loss"]) for h in logs)
    assert all(h["prm/no_step_frac"] >= 0.5 for h in logs)


def test_reward_function_that_raises_is_named(make_trainer):
    def broken_reward(completions, **kwargs):
        raise KeyError("answer_key")

    trainer = make_trainer(max_steps=1, reward_funcs=[broken_reward])
    with pytest.raises(RuntimeError, match=r"Reward function 'broken_reward' raised KeyError: 'answer_key'"):
        trainer.train()


def test_one_completion_per_group_is_refused(make_trainer):
    with pytest.raises(ValueError, match="at least 2 generations"):
        make_trainer(num_generations=1)


def test_wrong_reward_count_is_refused(make_trainer):
    def short(completions, **kwargs):
        return [0.0]

    trainer = make_trainer(max_steps=1, reward_funcs=[short])
    with pytest.raises(ValueError, match="returned 1 rewards"):
        trainer.train()


def test_inf_step_reward_is_refused(make_trainer):
    def steps(prompts, completions, steps, **kwargs):
        return [[math.inf] * len(s) for s in steps]

    trainer = make_trainer(
        max_steps=1, advantage_estimator="prm", max_completion_length=8, trainer_kwargs={"step_reward_funcs": [steps]}
    )
    with pytest.raises(ValueError, match="infinite score"):
        trainer.train()
