"""Reliability: resume continues identically, bad inputs give a clear error or a finite loss."""

import json
import math

import pytest
from conftest import last_logs

from grpo_lab import testkit

ALL_ON = dict(
    advantage_std="population",
    token_clip="clip_cov",
    clip_cov_lb=-100.0,
    clip_cov_ratio=0.05,
    sample_filter="best_worst",
    refill="dynamic_sampling",  # its draws are seeded per step: a resumed run refills as the full one did
    dynamic_sampling_max_rounds=1,
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


KL_RESUME = dict(
    kl_control="adaptive", beta=0.04, kl_target=0.01, kl_horizon=50, max_steps=3, save_strategy="steps", save_steps=1
)


def test_kill_while_saving_extension_state_resumes_from_the_last_complete_checkpoint(
    make_trainer, tiny_model_path, tmp_path
):
    """Issue 16: a kill inside the state write used to leave a checkpoint that resume_from_checkpoint=True picked and
    died on (raw JSONDecodeError)."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "out"
    worker = Path(__file__).with_name("kill_worker.py")
    proc = subprocess.run(
        [sys.executable, str(worker), str(tiny_model_path), str(out), json.dumps(KL_RESUME)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]  # SIGKILL, inside the write
    killed = out / "checkpoint-2"
    assert not (killed / "grpo_ext_state.json").exists()  # never half a file under the real name
    assert [p.name for p in killed.iterdir() if p.name.endswith(".tmp")]  # the half-written temporary is all there is
    assert not (killed / "trainer_state.json").exists()

    resumed = make_trainer(**KL_RESUME)
    resumed.train(resume_from_checkpoint=True)  # takes checkpoint-1, skips the interrupted checkpoint-2
    full = make_trainer(**{**KL_RESUME, "output_dir": str(tmp_path / "full")})
    full.train()
    assert [h["kl/beta"] for h in last_logs(resumed)][-2:] == pytest.approx(
        [h["kl/beta"] for h in last_logs(full)][-2:], rel=1e-6
    )
    assert resumed.beta == pytest.approx(full.beta, rel=1e-6)


def _saved_checkpoint(make_trainer, tmp_path, **fields):
    make_trainer(**{**KL_RESUME, "max_steps": 2, **fields}).train()
    return tmp_path / "out" / "checkpoint-2"


#: (file content, what the error names) for a damaged grpo_ext_state.json (counted in docs/reliability.md)
DAMAGED_STATE = [
    ('{"kl_control": {"val', "cannot be read"),  # truncated
    ("", "cannot be read"),  # empty
    (b"\x80\x81\xfe", "cannot be read"),  # binary
    ("[1, 2]", "must map family names"),
    ('{"kl_control": 0.5}', "must map family names"),
    ('{"kl_control": {}}', "'value' is missing"),
    ('{"kl_control": {"value": NaN}}', "'value' must be finite"),
    ('{"kl_control": {"value": -1.0}}', "'value' = -1.0 is outside"),
    ('{"kl_control": {"value": "0.1"}}', "'value' must be a number"),
    ('{"kl_control": {"value": true}}', "'value' must be a number"),
    ('{"kl_control": {"value": 0.1, "num_updates": 2.5}}', "'num_updates' must be a whole number"),
]


@pytest.mark.parametrize("content, key", DAMAGED_STATE)
def test_damaged_extension_state_is_an_error_naming_the_file_and_key(make_trainer, tmp_path, content, key):
    checkpoint = _saved_checkpoint(make_trainer, tmp_path)
    path = checkpoint / "grpo_ext_state.json"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    resumed = make_trainer(**KL_RESUME)
    with pytest.raises(ValueError) as info:
        resumed.train(resume_from_checkpoint=str(checkpoint))
    message = str(info.value)
    assert str(path) in message and key in message and "ext_resume_state='ignore'" in message


#: (families on, a state entry out of range) refused on resume
DAMAGED_FAMILY_STATE = [
    (dict(entropy_control="aepo"), {"entropy_control": {"last_entropy": 0.5, "temperature": "hot"}}),
    (dict(entropy_control="aepo"), {"entropy_control": {"last_entropy": -1.0, "temperature": 1.2}}),
    (dict(diversity_metrics=["distinct"]), {"collapse_monitor": {"baseline_distinct2": 2.0}}),
]


@pytest.mark.parametrize("fields, entry", DAMAGED_FAMILY_STATE)
def test_damaged_aepo_and_monitor_state_is_refused(make_trainer, tmp_path, fields, entry):
    checkpoint = _saved_checkpoint(make_trainer, tmp_path, **fields)
    path = checkpoint / "grpo_ext_state.json"
    state = json.loads(path.read_text())
    state.update(entry)
    path.write_text(json.dumps(state))
    with pytest.raises(ValueError, match=rf"entry '{next(iter(entry))}'"):
        make_trainer(**KL_RESUME, **fields).train(resume_from_checkpoint=str(checkpoint))


def test_ext_resume_state_ignore_starts_the_extensions_afresh(make_trainer, tmp_path, caplog):
    checkpoint = _saved_checkpoint(make_trainer, tmp_path)
    (checkpoint / "grpo_ext_state.json").write_text('{"kl_control": {"val')
    resumed = make_trainer(**KL_RESUME, ext_resume_state="ignore")
    with caplog.at_level("WARNING"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert "ext_resume_state='ignore'" in caplog.text
    assert last_logs(resumed)[0]["kl/beta"] == pytest.approx(0.04)  # the initial beta, not the checkpoint's


def test_checkpointed_beta_above_a_new_clamp_is_clamped_and_said(make_trainer, tmp_path, caplog):
    checkpoint = _saved_checkpoint(make_trainer, tmp_path)
    path = checkpoint / "grpo_ext_state.json"
    state = json.loads(path.read_text())
    state["kl_control"]["value"] = 0.5
    path.write_text(json.dumps(state))
    resumed = make_trainer(**KL_RESUME, kl_beta_max=0.1)
    with caplog.at_level("WARNING"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert "outside this run's [kl_beta_min, kl_beta_max]" in caplog.text
    assert last_logs(resumed)[0]["kl/beta"] <= 0.1


#: damaged trainer_state.json contents (transformers writes it in place: a kill can truncate it)
DAMAGED_TRAINER_STATE = ['{"global_step": 2, "log_hist', "", "\x00\x01"]


@pytest.mark.parametrize("content", DAMAGED_TRAINER_STATE, ids=["truncated", "empty", "binary"])
def test_a_damaged_trainer_state_is_skipped_or_named(make_trainer, tmp_path, caplog, content):
    """Issue 26: resume_from_checkpoint=True picked a checkpoint whose trainer_state.json a kill had truncated, then
    died on a raw JSONDecodeError. Now the previous complete checkpoint is taken, with a warning naming the file; an
    explicit path to the damaged one is an error naming it."""
    make_trainer(**{**KL_RESUME, "max_steps": 2}).train()
    damaged = tmp_path / "out" / "checkpoint-2"
    (damaged / "trainer_state.json").write_text(content)
    resumed = make_trainer(**KL_RESUME)
    with caplog.at_level("WARNING"):
        resumed.train(resume_from_checkpoint=True)
    assert f"Skipping {damaged}: trainer_state.json is damaged" in caplog.text
    assert resumed.state.global_step == 3  # resumed at checkpoint-1, trained to the end
    (damaged / "trainer_state.json").write_text(content)  # the resumed run saved checkpoint-2 again
    with pytest.raises(ValueError, match=r"checkpoint-2'?: trainer_state\.json is damaged .*Fix: resume from an"):
        make_trainer(**KL_RESUME).train(resume_from_checkpoint=str(damaged))


@pytest.mark.parametrize(
    "content, message",
    [('{"log_hist', "is not valid JSON"), ('{"global_step": 3}', "has no 'log_history' list"), ("[]", "has no")],
    ids=["truncated", "no log_history", "a list"],
)
def test_plot_names_a_damaged_trainer_state(tmp_path, content, message):
    import subprocess
    import sys

    (tmp_path / "trainer_state.json").write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "trl_grpo_ext.plot", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"error: {tmp_path / 'trainer_state.json'}" in proc.stderr and message in proc.stderr


def test_resume_true_without_a_complete_checkpoint_is_a_clear_error(make_trainer, tmp_path):
    (tmp_path / "out" / "checkpoint-5").mkdir(parents=True)
    with pytest.raises(ValueError, match="no complete checkpoint"):
        make_trainer(**KL_RESUME).train(resume_from_checkpoint=True)


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
