"""The gold-free hack detector: its core on hand-computed series, its running state, and the collapse actions (stop,
rollback, a user's callable) in tiny runs of GRPOExtTrainer and of a plain trl.GRPOTrainer."""

from __future__ import annotations

import json
import math
import os
import re
import statistics

import pytest
import torch
from conftest import TINY_ARGS, last_logs
from transformers import TrainerCallback

from grpo_lab import testkit
from trl_grpo_ext.checkpoints import rollback_target
from trl_grpo_ext.core.diversity import prompt_information
from trl_grpo_ext.core.hack_detection import DriftRule, drift_alarm, drift_from_best, trailing_mean
from trl_grpo_ext.detector import CollapseEvent, HackDetector

# ---------------------------------------------------------------------------------------------------------------- core


def test_trailing_mean_by_hand():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert trailing_mean(values, window=2).tolist() == [1.0, 1.5, 2.5, 3.5, 4.5]
    assert trailing_mean(values, window=3).tolist() == [1.0, 1.5, 2.0, 3.0, 4.0]
    assert trailing_mean(values, window=1).tolist() == values.tolist()
    with pytest.raises(ValueError, match="window"):
        trailing_mean(values, window=0)


def test_drift_from_best_by_hand():
    values = torch.tensor([3.0, 3.0, 2.0, 2.0, 3.0, 4.0])
    drift, best = drift_from_best(values, direction=1, window=1, warmup=1, relative=True)
    # running min 3 3 2 2 2 2 (ties: the latest); drift (x - min) / min
    assert drift.tolist() == pytest.approx([0, 0, 0, 0, 0.5, 1.0])
    assert best.tolist() == [0, 1, 2, 3, 3, 3]
    absolute, _ = drift_from_best(values, direction=1, window=1, warmup=1, relative=False)
    assert absolute.tolist() == pytest.approx([0, 0, 0, 0, 1.0, 2.0])
    # direction -1: falls are the drift, from the running max
    down, best = drift_from_best(torch.tensor([2.0, 4.0, 3.0, 1.0]), direction=-1, window=1, warmup=1, relative=True)
    assert down.tolist() == pytest.approx([0, 0, 0.25, 0.75])
    assert best.tolist() == [0, 1, 1, 1]
    # warmup 3: the first two points are never the best, and have no drift
    late, best = drift_from_best(torch.tensor([1.0, 1.0, 3.0, 6.0]), direction=1, window=1, warmup=3, relative=True)
    assert late.tolist() == pytest.approx([0, 0, 0, 1.0])
    assert best.tolist() == [0, 1, 2, 2]
    # window 2: trailing means 1, 1, 2, 4.5 -> from index 1 on: min 1, drift (2 - 1) / 1, (4.5 - 1) / 1
    smooth, _ = drift_from_best(torch.tensor([1.0, 1.0, 3.0, 6.0]), direction=1, window=2, warmup=2, relative=True)
    assert smooth.tolist() == pytest.approx([0, 0, 1.0, 3.5])


def test_drift_alarm_takes_the_earliest_signal_and_reports_its_onset():
    rules = {
        "up": DriftRule(direction=1, threshold=0.5, relative=True),
        "down": DriftRule(direction=-1, threshold=0.2, relative=True),
    }
    series = {
        "up": (torch.tensor([4, 8, 12, 16]), torch.tensor([2.0, 2.0, 2.5, 3.0])),  # drift 0.5 at step 16
        "down": (torch.tensor([4, 8, 12, 16]), torch.tensor([1.0, 1.1, 0.85, 0.8])),  # (1.1 - .85) / 1.1 = .23 at 12
    }
    alarm = drift_alarm(series, rules, window=1, warmup=1)
    assert (alarm.step, alarm.onset, alarm.signal) == (12, 8, "down")
    assert alarm.drift == pytest.approx(0.25 / 1.1)
    # without the falling signal, the rising one fires at 16 from its best at step 8 (ties: the latest)
    alarm = drift_alarm({"up": series["up"]}, rules, window=1, warmup=1)
    assert (alarm.step, alarm.onset, alarm.signal) == (16, 8, "up")
    assert drift_alarm({"up": series["up"]}, {"up": DriftRule(1, 0.6, True)}, window=1, warmup=1) is None
    assert drift_alarm({}, rules, window=1, warmup=1) is None  # nothing measured yet
    with pytest.raises(ValueError, match="non-finite"):
        drift_alarm({"up": (torch.tensor([1]), torch.tensor([math.nan]))}, rules, window=1, warmup=1)
    with pytest.raises(ValueError, match="2 steps but 1 values"):
        drift_alarm({"up": (torch.tensor([1, 2]), torch.tensor([1.0]))}, rules, window=1, warmup=1)


def test_onset_is_the_last_point_within_a_fraction_of_the_threshold():
    rules = {"up": DriftRule(direction=1, threshold=0.5, relative=True)}
    series = {"up": (torch.tensor([4, 8, 12, 16, 20]), torch.tensor([2.0, 2.0, 2.2, 2.5, 3.0]))}  # drift 0 0 .1 .25 .5
    onsets = {f: drift_alarm(series, rules, window=1, warmup=1, onset_fraction=f).onset for f in (0.0, 0.25, 0.5, 0.9)}
    assert onsets == {0.0: 8, 0.25: 12, 0.5: 16, 0.9: 16}  # never the alarm's own step: its drift reached 1.0 x
    with pytest.raises(ValueError, match="onset_fraction"):
        drift_alarm(series, rules, window=1, warmup=1, onset_fraction=1.0)


def test_prompt_information_by_hand():
    mask = torch.ones(4, 3, dtype=torch.long)
    # each group one answer, the two answers share no bigram: I = H(X) = log 2
    apart = torch.tensor([[1, 2, 3], [1, 2, 3], [4, 5, 6], [4, 5, 6]])
    assert prompt_information(apart, mask, 2) == pytest.approx(math.log(2))
    # every completion the same: nothing about the prompt
    assert prompt_information(torch.tensor([[1, 2, 3]] * 4), mask, 2) == pytest.approx(0.0)
    # half of each completion shared by both groups (bigrams (1,2) twice per row... by hand):
    # group 0 bigrams: (7,8),(8,1) x2 rows; group 1: (7,8),(8,4) x2 rows -> X over 8 bigrams: (7,8) 4, (8,1) 2, (8,4) 2
    shared = torch.tensor([[7, 8, 1], [7, 8, 1], [7, 8, 4], [7, 8, 4]])
    h_x = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    h_x_given_p = math.log(2)  # each group: (7,8) and its own bigram, half each
    assert prompt_information(shared, mask, 2) == pytest.approx(h_x - h_x_given_p)
    # padding (mask 0) is not counted: the same rows padded give the same value
    padded = torch.cat([apart, torch.zeros(4, 2, dtype=torch.long)], 1)
    assert prompt_information(padded, torch.cat([mask, torch.zeros(4, 2, dtype=torch.long)], 1), 2) == pytest.approx(
        math.log(2)
    )
    assert prompt_information(torch.zeros(4, 1, dtype=torch.long), torch.ones(4, 1), 2) == 0.0  # no bigram


def test_detector_alarms_once_skips_repeats_and_round_trips_its_state():
    detector = HackDetector({"length": 0.5}, window=1, warmup=1)
    assert detector.observe(1, {"completions/mean_length": 4.0}) is None
    assert detector.observe(1, {"completions/mean_length": 99.0}) is None  # step seen: skipped
    assert detector.observe(2, {"completions/mean_length": math.nan, "other": 1.0}) is None
    assert detector.score() == 0.0
    saved = detector.state_dict()
    alarm = detector.observe(3, {"completions/mean_length": 6.0})
    assert (alarm.step, alarm.onset, alarm.signal, alarm.drift) == (3, 1, "length", 0.5)
    assert detector.score() == pytest.approx(1.0)
    assert detector.observe(4, {"completions/mean_length": 9.0}) is None  # fires once
    resumed = HackDetector({"length": 0.5}, window=1, warmup=1)
    resumed.load_state_dict(json.loads(json.dumps(saved)))
    assert resumed.observe(3, {"completions/mean_length": 6.0}) == alarm
    again = HackDetector({"length": 0.5}, window=1, warmup=1)
    again.load_state_dict(json.loads(json.dumps(detector.state_dict())))
    assert again.alarm == alarm
    with pytest.raises(ValueError, match="Unknown detector signal"):
        HackDetector({"gold": 0.1}, window=1, warmup=1)
    with pytest.raises(ValueError, match="damaged"):
        again.load_state_dict({"series": {"length": [[1, 2], [1.0]]}})


def _checkpoint(root, step, *, state="{}", weights=True, optimizer=True, scheduler=True):
    folder = root / f"checkpoint-{step}"
    folder.mkdir()
    if state is not None:
        (folder / "trainer_state.json").write_text(state)
    for wanted, name in ((weights, "model.safetensors"), (optimizer, "optimizer.pt"), (scheduler, "scheduler.pt")):
        if wanted:
            (folder / name).write_bytes(b"x")
    return str(folder)


def test_rollback_target_is_this_runs_newest_complete_checkpoint_at_or_before_the_onset(tmp_path):
    """One scanner: the newest checkpoint at or before the onset that this run saved and whose weights, optimizer and
    scheduler are all there; a foreign, damaged or incomplete one is passed over with its reason."""
    from trl_grpo_ext.checkpoints import last_complete_checkpoint

    for step in (0, 10):
        _checkpoint(tmp_path, step)
    no_optimizer = _checkpoint(tmp_path, 20, optimizer=False)
    truncated = _checkpoint(tmp_path, 22, state='{"global_st')
    unsaved = _checkpoint(tmp_path, 25, state=None)
    foreign = _checkpoint(tmp_path, 26)  # an earlier run's, in the same output_dir
    _checkpoint(tmp_path, 30)
    own = {0, 10, 20, 22, 25, 30}
    target = rollback_target(str(tmp_path), before=27, own_steps=own)
    assert (target.step, target.complete) == (10, True)
    assert set(target.skipped) == {no_optimizer, truncated, unsaved, foreign}
    assert "optimizer" in target.skipped[no_optimizer] and "damaged" in target.skipped[truncated]
    assert "no trainer_state.json" in target.skipped[unsaved] and "another run" in target.skipped[foreign]
    assert rollback_target(str(tmp_path), before=27, own_steps=None).step == 26  # no lineage given: any folder
    assert rollback_target(str(tmp_path), before=10, own_steps=own).step == 10  # at the onset itself
    # nothing complete: the newest with weights, marked incomplete (the caller reports the optimizer not restored)
    only = tmp_path / "only"
    only.mkdir()
    _checkpoint(only, 5, scheduler=False)
    _checkpoint(only, 3, weights=False)
    target = rollback_target(str(only), before=9, own_steps={3, 5})
    assert (target.step, target.complete) == (5, False) and "scheduler.pt" in target.skipped[str(only / "checkpoint-5")]
    assert rollback_target(str(tmp_path / "none"), before=10, own_steps=None).folder is None
    # the resume scanner is the same one (trainer_state.json and the extension state must parse)
    assert last_complete_checkpoint(str(tmp_path)).endswith("checkpoint-30")
    skipped = []
    assert last_complete_checkpoint(str(tmp_path / "only"), log=lambda f, why: skipped.append(f)).endswith("-5")


def test_the_checkpoint_names_are_transformers_own():
    from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    from trl_grpo_ext import checkpoints

    assert (checkpoints.TRAINER_STATE, checkpoints.SCHEDULER) == (TRAINER_STATE_NAME, SCHEDULER_NAME)
    assert checkpoints.PREFIX == PREFIX_CHECKPOINT_DIR and OPTIMIZER_NAME.startswith("optimizer")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(thresholds={"length": math.nan}), "'length' threshold nan must be a finite number > 0"),
        (dict(thresholds={"repetition": 2.0}), "'repetition' threshold 2.0 can never be reached"),
        (dict(thresholds={"prompt_info": 1.5}), "'prompt_info' threshold 1.5 can never be reached"),
        (dict(thresholds={"length": -0.1}), "must be a finite number > 0"),
        (dict(thresholds={}), "no signal to read"),
        (dict(window=0), "window=0 must be a whole number >= 1"),
        (dict(warmup=2.5), "warmup=2.5 must be a whole number >= 1"),
        (dict(onset_fraction=math.nan), "onset_fraction=nan must lie in"),
    ],
)
def test_the_plain_trl_detector_refuses_settings_that_cannot_alarm(kwargs, match):
    settings = {"thresholds": {"length": 0.1}, "window": 2, "warmup": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        HackDetector(settings.pop("thresholds"), **settings)


def _stub_trainer(**args):
    from types import SimpleNamespace

    fields = {"save_strategy": "steps", "save_total_limit": None, "log_completions": False, **args}
    return SimpleNamespace(
        args=SimpleNamespace(**fields), state=SimpleNamespace(global_step=0), _logs={"completion": []},
        reward_func_names=["proxy", "strict"], reward_weights=torch.tensor([1.0, 0.0]),
    )  # fmt: skip


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(every=0), "every=0 must be a whole number >= 1"),
        (dict(ngram_sizes=()), "ngram_sizes is empty"),
        (dict(alarm_repetition_max=1.0), "alarm_repetition_max=1.0 must be a repetition rate in"),
        (dict(alarm_entropy_min=math.nan), "alarm_entropy_min=nan must be an entropy"),
        (dict(alarm_distinct2_drop=0.0), "alarm_distinct2_drop=0.0 must be a fraction"),
        (dict(alarm_action="stop"), "alarm_action='stop' but nothing can alarm"),
    ],
)
def test_the_monitor_refuses_settings_that_fail_later_or_never_alarm(kwargs, match):
    from trl_grpo_ext.callbacks import CollapseMonitor

    with pytest.raises(ValueError, match=match):
        CollapseMonitor(_stub_trainer(), metrics=["repetition"], **kwargs)


def test_a_plain_trl_rollback_is_refused_where_it_cannot_work():
    """The same rule as the config's collapse_action (checkpoints.rollback_refusal), on a plain trainer's args."""
    from trl_grpo_ext.callbacks import CollapseMonitor

    detector = HackDetector({"length": 0.1}, window=2, warmup=2)
    with pytest.raises(ValueError, match="save_total_limit=2 deletes older checkpoints.*save_total_limit=None"):
        CollapseMonitor(_stub_trainer(save_total_limit=2), metrics=["repetition"], alarm_action="rollback",
                        detector=detector, shape_acts=True)  # fmt: skip
    with pytest.raises(ValueError, match="save_strategy is 'epoch'"):
        CollapseMonitor(_stub_trainer(save_strategy="epoch"), metrics=["repetition"], alarm_action="rollback",
                        detector=detector, shape_acts=True)  # fmt: skip
    CollapseMonitor(
        _stub_trainer(), metrics=["repetition"], alarm_action="rollback", detector=detector, shape_acts=True
    )
    with pytest.raises(ValueError, match="alarm_action='rollback' acts on the detector's audit or validation alarms"):
        CollapseMonitor(_stub_trainer(), metrics=["repetition"], alarm_action="rollback", detector=detector)


def test_an_on_alarm_that_raises_or_asks_an_impossible_rollback_does_not_lose_the_alarm(caplog):
    """A bug in the user's callable is logged and the configured action taken; a rollback the run cannot make (no
    checkpoint kept, or none saved at the start) becomes a stop (a checkpoint, then the end) with an error."""
    from types import SimpleNamespace

    from trl_grpo_ext.callbacks import CollapseMonitor

    detector = HackDetector({"length": 0.1}, window=2, warmup=2)
    monitor = CollapseMonitor(
        _stub_trainer(), metrics=["repetition"], alarm_action="stop", detector=detector, shape_acts=True
    )
    event = CollapseEvent(step=7, onset=4, source="detector", reasons=["length drifted"])

    def broken(event):
        raise KeyError("oops")

    monitor.on_alarm = broken
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    with caplog.at_level("ERROR"):
        monitor._act(event, control)
    assert control.should_training_stop and control.should_save and monitor.event is event
    assert "on_alarm raised at step 7" in caplog.text
    # warn, with a callable asking for a rollback the run was not prepared for (no checkpoint-0 saved)
    warn = CollapseMonitor(_stub_trainer(save_total_limit=3), metrics=["repetition"], detector=detector)
    warn.on_alarm = lambda event: "rollback"
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    caplog.clear()
    with caplog.at_level("ERROR"):
        warn._act(event, control)
    assert control.should_training_stop and control.should_save and warn._rollback_event is None
    assert "a rollback was chosen but cannot be made: save_total_limit=3" in caplog.text
    ready = CollapseMonitor(_stub_trainer(), metrics=["repetition"], detector=detector)
    ready.on_alarm = lambda event: "rollback"
    caplog.clear()
    with caplog.at_level("ERROR"):
        ready._act(event, SimpleNamespace(should_save=False, should_training_stop=False))
    assert "no checkpoint was saved when training started" in caplog.text and ready._rollback_event is None
    ready._can_roll_back = True  # what on_train_begin sets when it saved checkpoint-0
    ready._act(event, SimpleNamespace(should_save=False, should_training_stop=False))
    assert ready._rollback_event is event


# ------------------------------------------------------------------------------------------------------------- config


def test_config_refuses_what_cannot_work():
    from trl_grpo_ext import GRPOExtConfig

    base = dict(TINY_ARGS, output_dir="never-written")  # only validated, nothing is saved
    with pytest.raises(ValueError, match="collapse_detector.*diversity_metrics"):
        GRPOExtConfig(**base, collapse_detector="drift")
    with pytest.raises(ValueError, match="collapse_prompt_info_drop.*add 'prompt_info'"):
        GRPOExtConfig(**base, collapse_detector="drift", diversity_metrics=["repetition"])
    with pytest.raises(ValueError, match="collapse_length_rise.*> 0"):
        GRPOExtConfig(**base, collapse_detector="drift", diversity_metrics=["repetition", "prompt_info"],
                      collapse_length_rise=0.0)  # fmt: skip
    with pytest.raises(ValueError, match="collapse_action.*save_strategy='steps'"):
        GRPOExtConfig(**base, collapse_action="rollback", diversity_metrics=["repetition"])
    rollback = {**base, "save_strategy": "steps", "collapse_action": "rollback"}
    with pytest.raises(ValueError, match="collapse_action.*save_total_limit=2 deletes older.*save_total_limit=None"):
        GRPOExtConfig(**rollback, save_total_limit=2, diversity_metrics=["repetition"])
    with pytest.raises(ValueError, match="collapse_action.*the collapse monitor that acts is off"):
        GRPOExtConfig(**rollback)
    # an action with nothing that can fire, and thresholds no signal can reach
    with pytest.raises(ValueError, match="collapse_action.*nothing can alarm.*collapse_detector='drift'"):
        GRPOExtConfig(**base, collapse_action="stop", diversity_metrics=["repetition"])
    drift = {**base, "collapse_detector": "drift", "diversity_metrics": ["repetition", "prompt_info"]}
    with pytest.raises(ValueError, match="collapse_repetition_rise.*can never be reached.*at most 1.0"):
        GRPOExtConfig(**drift, collapse_repetition_rise=2.0)
    with pytest.raises(ValueError, match="collapse_prompt_info_drop.*can never be reached"):
        GRPOExtConfig(**drift, collapse_prompt_info_drop=1.5)
    # a run too short for the warm-up: a warning (a smoke run of a real config is legitimate), naming the fix
    with pytest.warns(UserWarning, match="collapse_detector_warmup.*max_steps is 10: it cannot fire in this run"):
        GRPOExtConfig(**{**drift, "max_steps": 10}, collapse_detector_warmup=10**6)
    with pytest.warns(UserWarning, match="collapse_detector_warmup=9 at most here"):
        GRPOExtConfig(**{**drift, "max_steps": 10}, collapse_detector_warmup=10)
    with pytest.warns(UserWarning, match="collapse_detector_warmup.*diversity_every=4"):
        GRPOExtConfig(**{**drift, "max_steps": 10}, collapse_detector_warmup=3, diversity_every=4)
    with pytest.raises(ValueError, match="collapse_length_rise.*can never be reached.*max_completion_length=8"):
        GRPOExtConfig(**{**drift, "max_completion_length": 8}, collapse_length_rise=7.5)
    with pytest.raises(ValueError, match="collapse_repetition_max.*can never be exceeded"):
        GRPOExtConfig(**base, diversity_metrics=["repetition"], collapse_repetition_max=1.0)
    # the length signal's gate reads prompt information; audits and screening need their names
    with pytest.raises(ValueError, match="collapse_length_info_gate.*'prompt_info'.*collapse_length_info_gate=None"):
        GRPOExtConfig(**base, collapse_detector="drift", diversity_metrics=["entropy"], collapse_prompt_info_drop=None,
                      collapse_repetition_rise=None)  # fmt: skip
    with pytest.raises(ValueError, match="collapse_action.*no audit is named.*collapse_audit_rewards"):
        GRPOExtConfig(**drift, collapse_action="screen")
    with pytest.raises(ValueError, match="collapse_audit_rise.*can never be reached"):
        GRPOExtConfig(**drift, collapse_audit_rewards=["strict"], collapse_audit_rise=1.5)
    with pytest.raises(ValueError, match="collapse_audit_rewards.*diversity_metrics switches on"):
        GRPOExtConfig(**base, collapse_audit_rewards=["strict"])
    # the signals the user leaves out are not needed
    GRPOExtConfig(
        **base, collapse_detector="drift", diversity_metrics=["entropy"], collapse_prompt_info_drop=None,
        collapse_repetition_rise=None, collapse_length_info_gate=None,
    )  # fmt: skip
    GRPOExtConfig(**drift, collapse_audit_rewards=["strict"], collapse_action="screen")


# ----------------------------------------------------------------------------------------------------------- training


def fixed_text_reward(completions, **kwargs) -> list[float]:
    """A hack to find: pays for writing '7' whatever the prompt (the completions stop depending on their prompts)."""
    return [testkit._text(c).count("7") / 4 for c in completions]


HACK = dict(
    per_device_train_batch_size=16,
    num_generations=4,
    max_completion_length=8,
    max_steps=16,
    learning_rate=3e-2,
    diversity_metrics=["repetition", "prompt_info"],
    collapse_detector="drift",
    collapse_shape_acts=True,  # these runs test the actions on the gold-free detector alone
)


def hack_step(trainer) -> int | None:
    fired = [h["step"] for h in last_logs(trainer) if h.get("alarm/hack") == 1.0]
    return fired[0] if fired else None


@pytest.mark.slow
def test_detector_fires_on_a_hack_and_not_on_a_healthy_run(make_trainer):
    hacked = make_trainer(reward_funcs=[fixed_text_reward], **HACK)
    hacked.train()
    event = hacked.collapse_monitor.event
    assert event is not None and event.source == "detector" and event.onset < event.step
    assert hack_step(hacked) == event.step
    assert all("alarm/hack_score" in h for h in last_logs(hacked) if "diversity/prompt_info" in h)
    assert hacked.state.global_step == 16  # warn: training goes on
    healthy = make_trainer(reward_funcs=[testkit.exact_match_reward], **{**HACK, "learning_rate": 1e-4})
    healthy.train()
    assert healthy.collapse_monitor.event is None and hack_step(healthy) is None


@pytest.mark.slow
def test_stop_ends_training_at_the_alarm_with_a_checkpoint(make_trainer, tmp_path):
    trainer = make_trainer(reward_funcs=[fixed_text_reward], collapse_action="stop", **HACK)
    trainer.train()
    step = trainer.collapse_monitor.event.step
    assert trainer.state.global_step == step < 16
    assert os.path.isdir(os.path.join(trainer.args.output_dir, f"checkpoint-{step}"))


@pytest.mark.slow
def test_rollback_restores_the_checkpoint_before_the_onset(make_trainer):
    from safetensors.torch import load_file

    trainer = make_trainer(
        reward_funcs=[fixed_text_reward], collapse_action="rollback", save_strategy="steps", save_steps=2, **HACK
    )
    trainer.train()
    monitor = trainer.collapse_monitor
    event, record = monitor.event, monitor.rollback
    assert trainer.state.global_step == event.step < 16  # training ended at the alarm
    assert record["checkpoint_step"] == max(s for s in range(0, event.step + 1, 2) if s <= event.onset)
    out = trainer.args.output_dir
    assert json.load(open(os.path.join(out, "collapse_rollback.json"))) == record
    assert os.path.isdir(os.path.join(out, "checkpoint-0"))  # saved at the start
    saved = load_file(os.path.join(record["restored"], "model.safetensors"))
    live = trainer.model.state_dict()
    assert all(torch.equal(live[name], tensor) for name, tensor in saved.items())
    # the optimizer and scheduler are the checkpoint's too
    scheduler = torch.load(os.path.join(record["restored"], "scheduler.pt"), weights_only=False)
    assert trainer.lr_scheduler.state_dict()["last_epoch"] == scheduler["last_epoch"] == record["checkpoint_step"]
    optimizer = torch.load(os.path.join(record["restored"], "optimizer.pt"), weights_only=False)
    steps = {s["step"].item() for s in trainer.optimizer.state_dict()["state"].values()}
    assert steps == {s["step"].item() for s in optimizer["state"].values()} or record["checkpoint_step"] == 0


@pytest.mark.slow
def test_on_alarm_callable_chooses_the_action(make_trainer):
    trainer = make_trainer(reward_funcs=[fixed_text_reward], **HACK)
    seen: list[CollapseEvent] = []
    trainer.collapse_monitor.on_alarm = lambda event: seen.append(event) or "stop"
    trainer.train()
    assert seen and trainer.state.global_step == seen[0].step < 16
    bad = make_trainer(reward_funcs=[fixed_text_reward], **HACK)
    bad.collapse_monitor.on_alarm = lambda event: "explode"
    with pytest.raises(ValueError, match="on_alarm returned 'explode'"):
        bad.train()


@pytest.mark.slow
def test_a_resumed_run_keeps_the_detectors_measurements(make_trainer, tmp_path):
    """The detector's measurements are in the checkpoint: a run resumed at step 4 judges steps 5.. against the best
    point of steps 1..4 (a fresh detector would start its warm-up again and alarm later or never)."""
    cut = make_trainer(
        reward_funcs=[fixed_text_reward], save_strategy="steps", save_steps=4, output_dir=str(tmp_path / "cut"),
        **{**HACK, "max_steps": 4},
    )  # fmt: skip
    cut.train()
    before = {name: (list(s), list(v)) for name, (s, v) in cut.collapse_monitor.detector.series.items()}
    assert before["prompt_info"][0] == [1, 2, 3, 4]
    resumed = make_trainer(reward_funcs=[fixed_text_reward], output_dir=str(tmp_path / "cut"), **HACK)
    resumed.train(resume_from_checkpoint=str(tmp_path / "cut" / "checkpoint-4"))
    steps, values = resumed.collapse_monitor.detector.series["prompt_info"]
    assert steps[:4] == [1, 2, 3, 4] and values[:4] == before["prompt_info"][1]
    assert steps[4:] == list(range(5, 5 + len(steps) - 4))
    assert resumed.collapse_monitor.event is not None and resumed.collapse_monitor.event.step > 4


@pytest.mark.slow
def test_plain_trl_detector_alarms_where_the_plugin_does(make_trainer):
    """All families off, the plugin trains exactly as trl.GRPOTrainer: the detector on the length signal (TRL's own
    metric in both) fires at the same step and onset, and a plain-TRL rollback restores the same checkpoint."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_grpo_ext.callbacks import CollapseMonitor

    def long_reward(completions, **kwargs):
        return [len(testkit._text(c)) / 16 for c in completions]

    settings = {**HACK, "max_completion_length": 16, "diversity_metrics": ["repetition"]}
    settings.update(collapse_prompt_info_drop=None, collapse_repetition_rise=None, collapse_length_rise=0.05)
    settings.update(collapse_length_info_gate=None)  # length alone
    plugin = make_trainer(reward_funcs=[long_reward], **settings)
    plugin.train()
    event = plugin.collapse_monitor.event
    assert event is not None
    trl_fields = {k: v for k, v in settings.items() if not k.startswith(("collapse_", "diversity_"))}
    plain = make_trainer(
        cls=GRPOTrainer, config_cls=GRPOConfig, reward_funcs=[long_reward], save_strategy="steps", save_steps=2,
        **trl_fields,
    )  # fmt: skip
    from trl_grpo_ext.detector import detector_from_config

    monitor = CollapseMonitor(
        plain,
        metrics=["repetition"],
        detector=detector_from_config(plugin.args),
        alarm_action="rollback",
        shape_acts=True,
    )  # the plugin's detector: length only, at 0.05
    plain.add_callback(monitor)
    plain.train()
    assert (monitor.event.step, monitor.event.onset) == (event.step, event.onset)
    assert plain.state.global_step == event.step
    assert monitor.rollback["checkpoint_step"] == max(s for s in range(0, event.step + 1, 2) if s <= event.onset)


def _hack_worker(out, *mode: str) -> None:
    """tests/hack_worker.py under torchrun, 2 gloo processes, writing its JSON into ``out``; fails with its stderr."""
    import subprocess
    import sys
    from pathlib import Path

    from conftest import free_port

    worker = Path(__file__).with_name("hack_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(worker), str(out), *mode]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow
def test_two_processes_alarm_and_roll_back_alike(tmp_path):
    """torchrun, 2 processes: every rank sees the same alarm (the detector reads global values), stops at the same step
    and restores the same checkpoint, under GRPOExtTrainer and under a plain trl.GRPOTrainer with the monitor."""
    _hack_worker(tmp_path)
    result = json.loads((tmp_path / "result.json").read_text())
    for mode in ("plugin", "plain"):
        ranks = result[mode]
        assert ranks[0] == ranks[1], (mode, ranks)
        view = ranks[0]
        assert view["event"] is not None and view["event"][2] == "detector"
        step, onset = view["event"][:2]
        assert view["global_step"] == step < 16
        assert view["checkpoint_step"] == max(s for s in range(0, step + 1, 2) if s <= onset)
        assert view["equals_checkpoint"]
        # the audit (weight 0): logged at every step alike on both ranks, and read by the detector
        assert len(view["audit"]) == step and any(v is not None for v in view["audit"])
        assert view["audit_series"] is not None and view["audit_series"][0]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["fsdp2", "zero3"])
def test_a_rollback_that_continues_with_sharded_parameters(engine, tmp_path, request):
    """collapse_rollback_then='screen' under FSDP2 and DeepSpeed ZeRO-3 with the parameters split across 2 gloo
    processes (tests/engines.py): both ranks alarm alike, the whole weights right after the restore equal the restored
    checkpoint's when it was saved (checksums of the gathered parameters), and the run trains on to max_steps with
    the audit's flagged completions screened."""
    if engine == "zero3":
        request.getfixturevalue("deepspeed_ops")
    _hack_worker(tmp_path, engine)
    ranks = json.loads((tmp_path / f"{engine}.json").read_text())
    assert ranks[0] == ranks[1], ranks
    view = ranks[0]
    assert view["sharded"], view  # the parameters really were split
    alarm_step, checkpoint_step, then = view["record"]
    assert then == "screen" and view["answered"][0] == alarm_step and checkpoint_step <= view["answered"][1]
    assert checkpoint_step < alarm_step  # something was rolled back
    assert view["step_end"][str(alarm_step)] == view["saved"][str(checkpoint_step)]  # restored, bit for bit
    assert (
        view["step_end"][str(alarm_step - 1)] != view["saved"][str(checkpoint_step)]
        or alarm_step - 1 == checkpoint_step
    )
    assert view["global_step"] == 16 and view["screened_after"] and max(view["screened_after"]) > 0


@pytest.mark.slow
def test_plain_trl_monitor_state_survives_a_resume(make_trainer, tmp_path):
    """A plain trl.GRPOTrainer's monitor writes its state into each checkpoint and reads it back on resume: the
    detector keeps the measurements of the steps before the checkpoint."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_grpo_ext.callbacks import MONITOR_STATE_FILE, CollapseMonitor

    trl_fields = {k: v for k, v in HACK.items() if not k.startswith(("collapse_", "diversity_"))}

    def build(max_steps):
        trainer = make_trainer(
            cls=GRPOTrainer, config_cls=GRPOConfig, reward_funcs=[fixed_text_reward], save_strategy="steps",
            save_steps=4, output_dir=str(tmp_path / "plain"), **{**trl_fields, "max_steps": max_steps},
        )  # fmt: skip
        monitor = CollapseMonitor(
            trainer, metrics=["repetition", "prompt_info"], detector=HackDetector({"prompt_info": 0.15}, window=3,
            warmup=3),
        )  # fmt: skip
        trainer.add_callback(monitor)
        return trainer, monitor

    cut, cut_monitor = build(4)
    cut.train()
    assert (tmp_path / "plain" / "checkpoint-4" / MONITOR_STATE_FILE).is_file()
    before = list(cut_monitor.detector.series["prompt_info"][1])
    resumed, monitor = build(HACK["max_steps"])
    resumed.train(resume_from_checkpoint=str(tmp_path / "plain" / "checkpoint-4"))
    steps, values = monitor.detector.series["prompt_info"]
    assert steps[:4] == [1, 2, 3, 4] and values[:4] == before and steps[4] == 5


# ------------------------------------------------------------------------------------------ actions a user can trust
ROLLBACK = dict(collapse_action="rollback", save_strategy="steps", save_steps=2)


@pytest.mark.slow
def test_a_rollback_never_restores_another_runs_checkpoint(make_trainer, tmp_path):
    """An output_dir reused from an earlier run holds its checkpoints; the rollback takes only the steps this run
    saved, even where another run's checkpoint lies nearer the onset."""
    out = str(tmp_path / "shared")
    earlier = make_trainer(reward_funcs=[testkit.exact_match_reward], output_dir=out, save_strategy="steps",
                           save_steps=1, **{**HACK, "learning_rate": 1e-4, "max_steps": 9})  # fmt: skip
    earlier.train()
    trainer = make_trainer(reward_funcs=[fixed_text_reward], output_dir=out, **{**ROLLBACK, "save_steps": 4}, **HACK)
    trainer.train()
    monitor = trainer.collapse_monitor
    record, event = monitor.rollback, monitor.event
    assert record["checkpoint_step"] == max(s for s in range(0, event.step + 1, 4) if s <= event.onset)
    foreign = [s for s in range(1, min(event.onset, 9) + 1) if s % 4 and s > record["checkpoint_step"]]
    assert foreign, f"the test needs an earlier run's checkpoint nearer the onset {event.onset}"
    for step in foreign:
        assert "another run" in record["skipped"][os.path.join(out, f"checkpoint-{step}")]


@pytest.mark.slow
def test_a_threshold_alarm_rolls_back_before_the_alarm_step(make_trainer):
    """The threshold alarm has no onset of its own: its onset is the last step it measured without firing, so a
    rollback never restores the checkpoint saved at the alarm (which would roll nothing back)."""
    settings = {**HACK, "collapse_detector": "none", "collapse_repetition_max": 0.0}
    settings["diversity_metrics"] = ["repetition"]
    trainer = make_trainer(reward_funcs=[fixed_text_reward], **{**ROLLBACK, "save_steps": 1}, **settings)
    trainer.train()
    event, record = trainer.collapse_monitor.event, trainer.collapse_monitor.rollback
    assert event.source == "threshold" and event.onset < event.step
    assert record["checkpoint_step"] == event.onset < event.step


class _Damage(TrainerCallback):
    """Damages each checkpoint after it is saved: odd steps lose optimizer.pt, even steps get a truncated weights file
    (a file there, but unreadable)."""

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if state.global_step % 2:
            os.remove(os.path.join(folder, "optimizer.pt"))
        else:
            with open(os.path.join(folder, "model.safetensors"), "r+b") as f:
                f.truncate(64)
        return control


@pytest.mark.slow
def test_a_rollback_passes_over_incomplete_and_unreadable_checkpoints(make_trainer):
    """A checkpoint without its optimizer is not reported as restored, and one whose weights fail to load makes the
    rollback try the previous one (not an exception at the end of train()): here everything after checkpoint-0 is
    damaged, so the run ends on checkpoint-0, complete, with each damaged one named."""
    trainer = make_trainer(reward_funcs=[fixed_text_reward], **{**ROLLBACK, "save_steps": 1}, **HACK)
    trainer.add_callback(_Damage())
    trainer.train()
    record = trainer.collapse_monitor.rollback
    onset = trainer.collapse_monitor.event.onset
    assert onset >= 2, "the test needs damaged checkpoints of both kinds before the onset"
    assert (record["checkpoint_step"], record["optimizer_restored"]) == (0, True)
    out = trainer.args.output_dir
    for step in range(1, onset + 1):
        why = record["skipped"][os.path.join(out, f"checkpoint-{step}")]
        assert ("optimizer" in why) if step % 2 else ("loading it failed" in why), (step, why)
    assert json.load(open(os.path.join(out, "collapse_rollback.json"))) == record


@pytest.mark.slow
def test_resuming_past_an_alarm_raises_it_again(make_trainer, tmp_path):
    """A stop saves the alarmed state; resuming from it (or from the checkpoint a rollback saved at its alarm) must not
    train on silently from the hacked weights with the detector, which fires once per run, quiet."""
    out = str(tmp_path / "run")
    stopped = make_trainer(reward_funcs=[fixed_text_reward], output_dir=out, collapse_action="stop", **HACK)
    stopped.train()
    first = stopped.collapse_monitor.event
    resumed = make_trainer(reward_funcs=[fixed_text_reward], output_dir=out, collapse_action="stop", **HACK)
    resumed.train(resume_from_checkpoint=True)
    again = resumed.collapse_monitor.event
    assert resumed.state.global_step == again.step == first.step + 1  # stopped again at its first step
    assert (again.onset, again.source) == (first.onset, "detector") and "resumed from a checkpoint" in again.reasons[0]
    assert [h["step"] for h in last_logs(resumed) if h.get("alarm/hack") == 1.0] == [first.step, first.step + 1]
    # after a rollback: its alarm step was saved too; resuming from it rolls back to the same checkpoint
    out = str(tmp_path / "rolled")
    rolled = make_trainer(reward_funcs=[fixed_text_reward], output_dir=out, **ROLLBACK, **HACK)
    rolled.train()
    alarm = rolled.collapse_monitor.event.step
    assert os.path.isdir(os.path.join(out, f"checkpoint-{alarm}"))
    again = make_trainer(reward_funcs=[fixed_text_reward], output_dir=out, **ROLLBACK, **HACK)
    again.train(resume_from_checkpoint=True)
    assert again.collapse_monitor.rollback["checkpoint_step"] == rolled.collapse_monitor.rollback["checkpoint_step"]


# -------------------------------------------------------------------------------------- telling learning from hacking
def test_audit_disagreement_by_hand():
    from trl_grpo_ext.core.hack_detection import audit_disagreement

    # two groups of 3; group means 1/3 and 0.5 (NaN row left out of its group's mean and never favoured)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, math.nan, 0.0])
    audits = torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    flags, rate = audit_disagreement(rewards=rewards, audits=audits, group_size=3, threshold=0.5)
    # favoured: rows 0 and 3; row 0 fails the first audit, row 3 passes both
    assert flags.tolist() == [True, False, False, False, False, False] and rate == 0.5
    flags, rate = audit_disagreement(rewards=torch.zeros(4), audits=torch.zeros(4, 1), group_size=2, threshold=0.5)
    assert not flags.any() and math.isnan(rate)  # nothing favoured: no rate (the detector skips NaN)
    nan_audit = audit_disagreement(rewards=torch.tensor([1.0, 0.0]), audits=torch.tensor([[math.nan], [0.0]]),
                                   group_size=2, threshold=0.5)  # fmt: skip
    assert nan_audit[1] == 0.0  # an unscored audit does not fail a completion
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        audit_disagreement(rewards=torch.zeros(6), audits=torch.zeros(6, 1), group_size=4, threshold=0.5)
    with pytest.raises(ValueError, match=r"audits \(N, A\)"):
        audit_disagreement(rewards=torch.zeros(4), audits=torch.zeros(4), group_size=2, threshold=0.5)


def test_audit_inversion_by_hand():
    from trl_grpo_ext.core.hack_detection import audit_disagreement, audit_inversion

    # five groups of 4 (audit: 1 passes, 0 refuses):
    #   partial credit 0.67 beside a right answer (1.0): flagged, not inverted (the reward ranks it below the right one)
    #   a bonus on top (1.2) beside a right answer: inverted
    #   partial credit 0.67 where the only accepted completion scores 0: inverted (nothing accepted is paid more)
    #   a tie (1.0, two candidates) beside a right answer: inverted
    #   nothing accepted in the group: flagged, not inverted (no accepted completion to be ranked against)
    rewards = torch.tensor([1.0, 0.67, 0.0, 0.0, 1.2, 1.0, 0.0, 0.0, 0.67, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0,
                            1.0, 0.0, 0.0, 0.0])  # fmt: skip
    audits = torch.tensor([1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0], dtype=torch.float32)[:, None]
    flags, rate = audit_disagreement(rewards=rewards, audits=audits, group_size=4, threshold=0.5)
    inverted, inversion = audit_inversion(rewards=rewards, audits=audits, group_size=4, threshold=0.5)
    # favoured: rows 0, 1 | 4, 5 | 8 | 12, 13 | 16 (8 in all); flagged: 1, 4, 8, 12, 16
    assert flags.nonzero().view(-1).tolist() == [1, 4, 8, 12, 16] and rate == 5 / 8
    assert inverted.nonzero().view(-1).tolist() == [4, 8, 12] and inversion == 3 / 8
    # a second audit that refuses the right answer (row 0) leaves row 2 (0.0) the first group's only accepted
    # completion: the reward pays both refused favoured rows more, both inverted; a NaN reward is never favoured nor
    # accepted; a NaN audit neither fails nor passes a completion
    two = torch.cat([audits, torch.tensor([[0.0], [1.0], [1.0], [1.0]] + [[1.0]] * 16)], dim=1)
    first = audit_inversion(rewards=rewards, audits=two, group_size=4, threshold=0.5)[0][:4]
    assert first.tolist() == [True, True, False, False]
    one = torch.tensor([[0.0], [1.0], [math.nan], [1.0]])
    nan = audit_inversion(rewards=torch.tensor([1.0, math.nan, 0.0, 0.5]), audits=one, group_size=4, threshold=0.5)
    # mean 0.5 over the scored rows: only row 0 is favoured; accepted: row 3 only (0.5 <= 1.0)
    assert nan[0].tolist() == [True, False, False, False] and nan[1] == 1.0
    flags, rate = audit_inversion(rewards=torch.zeros(4), audits=torch.zeros(4, 1), group_size=2, threshold=0.5)
    assert not flags.any() and math.isnan(rate)
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        audit_inversion(rewards=torch.zeros(6), audits=torch.zeros(6, 1), group_size=4, threshold=0.5)


def test_audit_overpaid_by_hand():
    from trl_grpo_ext.core.hack_detection import audit_disagreement, audit_overpaid

    # the five groups of test_audit_inversion_by_hand; the favoured completions the audit accepts are rows 0, 5 and 13
    # (each 1.0): their median, 1.0, is the reference. Flagged: 1 (0.67), 4 (1.2), 8 (0.67), 12 (1.0), 16 (1.0).
    # Overpaid: paid at least 1.0, wherever they stand in their group: the bonus on top (4), the tie (12) and the
    # completion of the group with nothing accepted (16); partial credit (1, 8) is flagged, not overpaid, even where
    # its group's only accepted completion scores 0 (8).
    rewards = torch.tensor([1.0, 0.67, 0.0, 0.0, 1.2, 1.0, 0.0, 0.0, 0.67, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0,
                            1.0, 0.0, 0.0, 0.0])  # fmt: skip
    audits = torch.tensor([1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0], dtype=torch.float32)[:, None]
    overpaid, rate = audit_overpaid(rewards=rewards, audits=audits, group_size=4, threshold=0.5)
    assert overpaid.nonzero().view(-1).tolist() == [4, 12, 16] and rate == 3 / 8
    flags, _ = audit_disagreement(rewards=rewards, audits=audits, group_size=4, threshold=0.5)
    assert not (overpaid & ~flags).any()  # a subset of the flagged completions
    # the reference is the median (the lower middle value of an even count): favoured accepted rewards 0.5, 2.0
    # -> 0.5, so a flagged 0.6 counts
    rewards = torch.tensor([2.0, 0.0, 0.6, 0.0, 0.5, 0.0])
    audits = torch.tensor([[1.0], [1.0], [0.0], [1.0], [1.0], [1.0]])
    assert audit_overpaid(rewards=rewards, audits=audits, group_size=2, threshold=0.5)[0].tolist() == [
        False, False, True, False, False, False,
    ]  # fmt: skip
    # no favoured completion the audit accepts in the batch: every flagged one counts
    rewards, audits = torch.tensor([1.0, 0.0, 0.3, 0.0]), torch.tensor([[0.0], [1.0], [0.0], [1.0]])
    overpaid, rate = audit_overpaid(rewards=rewards, audits=audits, group_size=2, threshold=0.5)
    assert overpaid.tolist() == [True, False, True, False] and rate == 1.0
    # NaN rewards are never favoured; a NaN audit neither fails nor passes; nothing favoured: NaN
    one = torch.tensor([[0.0], [1.0], [math.nan], [1.0]])
    nan = audit_overpaid(rewards=torch.tensor([1.0, math.nan, 0.0, 0.5]), audits=one, group_size=4, threshold=0.5)
    assert nan[0].tolist() == [True, False, False, False] and nan[1] == 1.0
    flags, rate = audit_overpaid(rewards=torch.zeros(4), audits=torch.zeros(4, 1), group_size=2, threshold=0.5)
    assert not flags.any() and math.isnan(rate)
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        audit_overpaid(rewards=torch.zeros(6), audits=torch.zeros(6, 1), group_size=4, threshold=0.5)


def test_the_length_gate_spares_lengthening_that_says_more_about_the_prompt():
    """Length alarms only while prompt information has not risen above (1 + slack) x its value at length's best
    point: the same length series alarms beside a flat prompt information and not beside a rising one."""
    steps = torch.arange(1, 7)
    length = (steps, torch.tensor([4.0, 4.0, 4.2, 4.6, 5.0, 5.4]))  # +10% at step 4 (best at step 2)
    flat = (steps, torch.tensor([2.0, 2.0, 2.0, 2.0, 2.0, 2.0]))
    rising = (steps, torch.tensor([2.0, 2.0, 2.1, 2.3, 2.5, 2.7]))
    gated = {"length": DriftRule(1, 0.1, True, gate="prompt_info", gate_direction=1, slack=0.05)}
    assert drift_alarm({"length": length, "prompt_info": flat}, gated, window=1, warmup=1).step == 4
    assert drift_alarm({"length": length, "prompt_info": rising}, gated, window=1, warmup=1) is None
    # within the slack: 2.0 -> 2.1 at step 4 is +5%, still open
    slight = (steps, torch.tensor([2.0, 2.0, 2.05, 2.1, 2.5, 2.7]))
    assert drift_alarm({"length": length, "prompt_info": slight}, gated, window=1, warmup=1).step == 4
    assert drift_alarm({"length": length}, gated, window=1, warmup=1) is None  # no gate measured yet: waits
    # the validation gate points the other way: gold's fall counts only while the training reward has not fallen
    gold = (torch.tensor([2, 4, 6]), torch.tensor([0.5, 0.5, 0.3]))  # -40% at step 6
    rules = {"validation": DriftRule(-1, 0.2, True, gate="reward", gate_direction=-1)}
    rising_reward = (steps, torch.tensor([1.0, 1.0, 1.1, 1.2, 1.3, 1.4]))
    falling_reward = (steps, torch.tensor([1.0, 1.0, 1.0, 1.0, 0.9, 0.8]))
    assert drift_alarm({"validation": gold, "reward": rising_reward}, rules, window=1, warmup=1).step == 6
    assert drift_alarm({"validation": gold, "reward": falling_reward}, rules, window=1, warmup=1) is None


def test_the_noise_floor_by_hand():
    """A drop must also exceed z standard errors of the difference between the best measurement and this one."""
    from trl_grpo_ext.core.hack_detection import drift_from_best, noise_margin
    from trl_grpo_ext.detector import drift_rules

    values = torch.tensor([0.5, 0.6, 0.4], dtype=torch.float64)
    errors = torch.tensor([0.05, 0.05, 0.05], dtype=torch.float64)
    _, best = drift_from_best(values, direction=-1, window=1, warmup=1, relative=True)
    assert best.tolist() == [0, 1, 1]
    # gaps 0, 0, 0.2; floor 2 x sqrt(0.05^2 + 0.05^2) = 0.1414: ratios 0, 0, 1.414
    margin = noise_margin(values, errors, best, direction=-1, window=1, z=2.0)
    assert margin.tolist() == pytest.approx([0.0, 0.0, 0.2 / (2 * math.sqrt(0.005))])
    # a trailing mean of 2: its squared error is the mean of the squares / 2; the best (index 1) mean 0.55
    both = noise_margin(values, errors, torch.tensor([0, 1, 1]), direction=-1, window=2, z=1.0)
    assert both[2] == pytest.approx((0.55 - 0.5) / math.sqrt(0.0025 / 2 + 0.0025 / 2))
    assert noise_margin(values, torch.zeros(3), best, direction=-1, window=1, z=2.0).tolist() == [0.0, 0.0, math.inf]
    steps = torch.tensor([25, 50, 75])
    series = {"validation": (steps, values), "validation_se": (steps, errors)}
    for z, fires in ((0.0, True), (2.0, True), (2.8, True), (2.9, False), (3.0, False)):  # 0.2 / 0.0707 = 2.83
        rules = drift_rules({"validation": 0.2}, noise={"validation": z})
        assert (rules["validation"].noise is not None) == (z > 0)
        assert (drift_alarm(series, rules, window=1, warmup=1) is not None) == fires, z
    with pytest.raises(ValueError, match="must hold a value at each of its steps"):
        drift_alarm({**series, "validation_se": (steps[:2], errors[:2])}, drift_rules({"validation": 0.2},
                    noise={"validation": 2.0}), window=1, warmup=1)  # fmt: skip
    for bad in (-1.0, math.nan, True):
        with pytest.raises(ValueError, match="noise multiple"):
            drift_rules({"validation": 0.2}, noise={"validation": bad})
    with pytest.raises(ValueError, match="has no noise series"):
        drift_rules({"length": 0.2}, noise={"length": 2.0})
    # the detector: the score is the smaller of the drift's and the noise's ratios (1.0 alarms)
    detector = HackDetector({"validation": 0.2}, window=1, warmup=1, noise={"validation": 3.0})
    assert set(detector.series) == {"validation", "validation_se"}
    for step, value, error in zip(steps.tolist(), values.tolist(), errors.tolist(), strict=True):
        assert detector.observe(step, {"validation/gold": value, "validation/gold_se": error}) is None
    assert detector.score() == pytest.approx(0.2 / (3 * math.sqrt(0.005)))
    # a measurement without its standard error has none (0), an error without its measurement is dropped, and a
    # checkpoint of a version that kept no errors loads with 0 at its steps: the series stay aligned, never a crash
    detector = HackDetector({"validation": 0.2}, window=1, warmup=1, noise={"validation": 3.0})
    detector.observe(25, {"validation/gold": 0.5})
    detector.observe(50, {"validation/gold": 0.6, "validation/gold_se": 0.05})
    detector.observe(60, {"validation/gold_se": 0.05})
    assert detector.series["validation_se"] == ([25, 50], [0.0, 0.05])
    detector.load_state_dict({"series": {"validation": [[25, 50, 75], [0.5, 0.6, 0.3]]}})
    assert detector.series["validation_se"] == ([25, 50, 75], [0.0, 0.0, 0.0])
    assert detector.observe(100, {"validation/gold": 0.3, "validation/gold_se": 0.01}).step == 75


def test_the_detector_measures_its_gates_and_keeps_them_in_its_state():
    detector = HackDetector({"length": 0.1}, window=1, warmup=1, gates={"length": 0.05})
    assert set(detector.series) == {"length", "prompt_info"}  # the gate is measured without a threshold of its own
    for step, (length, info) in enumerate([(4.0, 2.0), (4.0, 2.0), (4.6, 2.4)], start=1):
        assert detector.observe(step, {"completions/mean_length": length, "diversity/prompt_info": info}) is None
    assert detector.score() == 0.0  # length drifted 15% but its gate is closed
    again = HackDetector({"length": 0.1}, window=1, warmup=1, gates={"length": 0.05})
    again.load_state_dict(json.loads(json.dumps(detector.state_dict())))
    assert again.series == detector.series
    alarm = again.observe(4, {"completions/mean_length": 5.0, "diversity/prompt_info": 2.0})  # information back down
    assert (alarm.step, alarm.signal) == (4, "length")
    with pytest.raises(ValueError, match="'repetition' signal has no gate"):
        HackDetector({"repetition": 0.1}, window=1, warmup=1, gates={"repetition": 0.0})
    with pytest.raises(ValueError, match="gate's slack nan"):
        HackDetector({"length": 0.1}, window=1, warmup=1, gates={"length": math.nan})


def sevens_audit(completions, **kwargs) -> list[float]:
    """The tiny runs' audit: refuses a completion that writes '7' (what fixed_text_reward pays for)."""
    return [0.0 if "7" in testkit._text(c) else 1.0 for c in completions]


AUDITED = dict(HACK, reward_weights=[1.0, 0.0], collapse_audit_rewards=["sevens_audit"])


@pytest.mark.slow
def test_audits_are_logged_never_trained_on_and_read_by_the_detector(make_trainer):
    """An audit (weight 0) changes no advantage; audit/disagreement is the core function's value on the batch TRL
    kept for its completions table, as are audit/inversion and audit/overpaid; the detector reads the disagreement's
    rise."""
    from trl_grpo_ext.core.hack_detection import audit_disagreement, audit_inversion, audit_overpaid

    trainer = make_trainer(reward_funcs=[fixed_text_reward, sevens_audit], **AUDITED)
    trainer.train()
    logs = last_logs(trainer)
    assert all("audit/flagged_frac" in h for h in logs) and len(logs) == HACK["max_steps"]
    rewards = torch.tensor(list(trainer._logs["rewards"]["fixed_text_reward"]))
    audit = torch.tensor(list(trainer._logs["rewards"]["sevens_audit"]))
    flags, rate = audit_disagreement(rewards=rewards, audits=audit[:, None], group_size=4, threshold=0.5)
    assert logs[-1]["audit/flagged_frac"] == pytest.approx(flags.float().mean().item())
    # the rate is logged where something was favoured (NaN otherwise: skipped), and is what the detector read
    assert logs[-1].get("audit/disagreement", math.nan) == pytest.approx(rate, nan_ok=True)
    _, inversion = audit_inversion(rewards=rewards, audits=audit[:, None], group_size=4, threshold=0.5)
    assert logs[-1].get("audit/inversion", math.nan) == pytest.approx(inversion, nan_ok=True)
    assert all(h["audit/inversion"] <= h["audit/disagreement"] for h in logs if "audit/inversion" in h)
    _, overpaid = audit_overpaid(rewards=rewards, audits=audit[:, None], group_size=4, threshold=0.5)
    assert logs[-1].get("audit/overpaid", math.nan) == pytest.approx(overpaid, nan_ok=True)
    assert all(h["audit/overpaid"] <= h["audit/disagreement"] for h in logs if "audit/overpaid" in h)
    steps, values = trainer.collapse_monitor.detector.series["audit"]
    logged = {h["step"]: h["audit/disagreement"] for h in logs if "audit/disagreement" in h}
    assert steps == sorted(logged) and values == pytest.approx([logged[s] for s in steps]) and steps

    # the audit is not trained on: an audit of other values leaves every advantage as it was
    def sevens_audit_inverted(completions, **kwargs) -> list[float]:
        return [1.0 - v for v in sevens_audit(completions)]

    runs = []
    for audit in (sevens_audit, sevens_audit_inverted):
        run = make_trainer(reward_funcs=[fixed_text_reward, audit], **{**AUDITED, "max_steps": 3,
                           "collapse_audit_rewards": [audit.__name__]})  # fmt: skip
        run.train()
        runs.append(run)
    assert list(runs[0]._logs["rewards"]["sevens_audit"]) != list(runs[1]._logs["rewards"]["sevens_audit_inverted"])
    assert list(runs[0]._logs["advantages"]) == list(runs[1]._logs["advantages"])


def test_a_misnamed_or_trained_on_audit_is_refused(make_trainer):
    with pytest.raises(ValueError, match="names 'strict', which is not a reward function.*sevens_audit"):
        make_trainer(
            reward_funcs=[fixed_text_reward, sevens_audit], **{**AUDITED, "collapse_audit_rewards": ["strict"]}
        )
    with pytest.raises(ValueError, match=r"audit 'sevens_audit' is trained on.*reward_weights=\[1.0, 0.0\]"):
        make_trainer(reward_funcs=[fixed_text_reward, sevens_audit], **{**AUDITED, "reward_weights": [1.0, 1.0]})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("settings", "regroup"),
    [
        ({}, True),
        ({"advantage_weighting": "w_reinforce", "w_reinforce_baseline": "group"}, True),  # shapes in the loss
        ({"advantage_weighting": "w_reinforce", "w_reinforce_baseline": "none"}, False),  # its own, groupless ones
        ({"no_group_advantages": True}, False),
    ],
)
def test_screen_drops_flagged_completions_from_their_group_after_the_alarm(
    make_trainer, monkeypatch, settings, regroup
):
    """collapse_action='screen': from the alarm on, every training batch's rows the audit flags train with advantage 0
    (and show 0 in TRL's table), and the others' advantages are their group's over its unflagged rewards (TRL's
    formula with the flagged rewards left out), so an honest row is not measured against the hacked rewards; so too
    under a weighting that shapes in the loss (W-REINFORCE's group baseline). Where the estimator gives no group
    advantages from rewards (PRM; here the GRPO estimator made to say so), or a weighting replaced them with its own
    (W-REINFORCE without a baseline: nothing to regroup), the flagged rows are only zeroed. Training goes on. (The
    weighted runs screen from their first step, as a run resumed while screening does: W-REINFORCE's down-weighting
    slows this tiny hack past the alarm.)"""
    from trl_grpo_ext.core.advantages import group_relative_advantages

    settings = dict(settings)
    no_group = settings.pop("no_group_advantages", False)
    trainer = make_trainer(reward_funcs=[fixed_text_reward, sevens_audit], collapse_action="screen",
                           **{**AUDITED, "collapse_audit_rise": 0.05, **settings})  # fmt: skip
    if no_group:
        monkeypatch.setattr(type(trainer.extensions["advantage_estimator"]), "gives_group_advantages", False)
    weighted = bool(settings)
    trainer.collapse_monitor.screening = weighted
    seen = []
    original = trainer._screen

    def watched(output, batch, **kwargs):
        before = output["advantages"].clone()
        original(output, batch, **kwargs)
        monitor = trainer.collapse_monitor
        if monitor.screening and batch.mode == "train":
            seen.append((before, batch.output["advantages"].clone(), monitor.last_flags.clone(), batch.rewards.clone()))

    trainer._screen = watched
    trainer.train()
    event = trainer.collapse_monitor.event
    assert trainer.state.global_step == HACK["max_steps"]  # screening does not stop training
    assert event is not None or weighted
    assert seen, "no batch was screened after the alarm"
    flagged_any = changed = False
    for before, after, flags, rewards in seen:
        assert torch.equal(after[flags], torch.zeros_like(after[flags]))
        if regroup and flags.any():
            screened = rewards.masked_fill(flags, float("nan"))
            expected = group_relative_advantages(screened, trainer.num_generations).masked_fill(flags, 0.0)
            torch.testing.assert_close(after, expected.to(after.dtype))
            changed |= not torch.allclose(after[~flags], before[~flags])
        else:
            assert torch.equal(after[~flags], before[~flags])
        flagged_any |= bool(flags.any())
    assert flagged_any
    assert changed or not regroup  # leaving the hacked rewards out moved some honest row's advantage
    screened = [h["audit/screened"] for h in last_logs(trainer) if "audit/screened" in h]
    start = event.step if event is not None and not weighted else 0
    assert screened and all(h["step"] > start for h in last_logs(trainer) if "audit/screened" in h)
    table = torch.tensor(list(trainer._logs["advantages"]))
    last_after, last_flags = seen[-1][1], seen[-1][2]
    assert torch.equal(table[last_flags], torch.zeros(int(last_flags.sum())))
    torch.testing.assert_close(table[-last_after.numel() :], last_after.float())


@pytest.mark.slow
def test_plain_trl_logs_the_same_audit_disagreement(make_trainer):
    """The plain-TRL monitor reads the rewards TRL keeps for its completions table: the same values as the plugin's."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_grpo_ext.callbacks import CollapseMonitor

    settings = {**AUDITED, "max_steps": 4}
    plugin = make_trainer(reward_funcs=[fixed_text_reward, sevens_audit], **settings)
    plugin.train()
    trl_fields = {k: v for k, v in settings.items() if not k.startswith(("collapse_", "diversity_"))}
    plain = make_trainer(cls=GRPOTrainer, config_cls=GRPOConfig, reward_funcs=[fixed_text_reward, sevens_audit],
                         **trl_fields)  # fmt: skip
    plain.add_callback(CollapseMonitor(plain, metrics=["repetition"], audit_rewards=["sevens_audit"]))
    plain.train()
    for key in ("audit/flagged_frac", "audit/disagreement", "audit/inversion", "audit/overpaid"):
        ours = [h.get(key) for h in last_logs(plugin)]
        theirs = [h.get(key) for h in last_logs(plain)]
        assert len(ours) == 4 and theirs == pytest.approx(ours), key
    assert any(h.get("audit/disagreement") is not None for h in last_logs(plain))
    with pytest.raises(ValueError, match="alarm_action='screen' needs GRPOExtTrainer"):
        CollapseMonitor(plain, metrics=["repetition"], audit_rewards=["sevens_audit"], alarm_action="screen",
                        detector=HackDetector({"audit": 0.2}, window=2, warmup=2))  # fmt: skip


def test_validation_gold_alarms_when_it_falls_while_the_reward_rises():
    """The monitor feeds the eval metric to the detector at each evaluation (gated by the training reward)."""
    from types import SimpleNamespace

    from trl_grpo_ext.callbacks import CollapseMonitor

    def monitor():
        detector = HackDetector({"validation": 0.2}, window=1, warmup=1, gates={"validation": 0.0})
        return CollapseMonitor(_stub_trainer(), metrics=["repetition"], detector=detector,
                               validation_metric="rewards/strict/mean")  # fmt: skip

    control = SimpleNamespace(should_save=False, should_training_stop=False)
    for rewards, fires in (([1.0, 1.2, 1.4], True), ([1.0, 0.9, 0.8], False)):
        watched = monitor()
        for step, (reward, gold) in enumerate(zip(rewards, [0.6, 0.6, 0.4], strict=True), start=1):
            watched.detector.observe(step, {"reward": reward})
            state = SimpleNamespace(global_step=step)
            watched.on_evaluate(None, state, control, metrics={"eval_rewards/strict/mean": gold, "eval_loss": 0.0})
        assert (watched.event is not None) == fires
        if fires:
            assert (watched.event.step, watched.event.onset, watched.event.source) == (3, 2, "detector")
    with pytest.raises(ValueError, match=r"names the reward function 'exact'.*\['rewards/proxy/mean'"):
        detector = HackDetector({"validation": 0.2}, window=1, warmup=1, gates={"validation": 0.0})
        CollapseMonitor(_stub_trainer(), metrics=["repetition"], detector=detector,
                        validation_metric="rewards/exact/mean")  # fmt: skip
    with pytest.raises(ValueError, match="lacks.*'validation'"):
        CollapseMonitor(_stub_trainer(), metrics=["repetition"], validation_metric="rewards/strict/mean",
                        detector=HackDetector({"length": 0.1}, window=1, warmup=1))  # fmt: skip


def test_validation_gold_is_read_against_its_evaluations_standard_error(caplog):
    """The monitor feeds each evaluation's standard error (TRL's .../std over sqrt(prompts x num_generations_eval)):
    the same 0.6 -> 0.4 fall alarms on an evaluation of 200 prompts x 4 samples and not on one of 5 x 2."""
    from types import SimpleNamespace

    from trl_grpo_ext.callbacks import CollapseMonitor

    control = SimpleNamespace(should_save=False, should_training_stop=False)
    args = SimpleNamespace(num_generations_eval=None, num_generations=4)
    for prompts, generations, fires in ((200, None, True), (5, 2, False)):
        args.num_generations_eval = generations
        detector = HackDetector({"validation": 0.2}, window=1, warmup=1, gates={"validation": 0.0},
                                noise={"validation": 3.0})  # fmt: skip
        watched = CollapseMonitor(_stub_trainer(), metrics=["repetition"], detector=detector,
                                  validation_metric="rewards/strict/mean")  # fmt: skip
        loader = SimpleNamespace(dataset=list(range(prompts)))
        for step, gold in enumerate([0.6, 0.6, 0.4], start=1):
            watched.detector.observe(step, {"reward": 1.0 + step})
            metrics = {"eval_rewards/strict/mean": gold, "eval_rewards/strict/std": 0.49}
            watched.on_evaluate(args, SimpleNamespace(global_step=step), control, metrics=metrics,
                                eval_dataloader=loader)  # fmt: skip
        samples = prompts * (generations or 4)
        assert detector.series["validation_se"][1] == pytest.approx([0.49 / math.sqrt(samples)] * 3)
        assert (watched.event is not None) == fires
    # no .../std logged: no noise floor (0), said once
    detector = HackDetector({"validation": 0.2}, window=1, warmup=1, noise={"validation": 3.0})
    watched = CollapseMonitor(_stub_trainer(), metrics=["repetition"], detector=detector,
                              validation_metric="rewards/strict/mean")  # fmt: skip
    with caplog.at_level("WARNING"):
        for step in (1, 2):
            watched.on_evaluate(args, SimpleNamespace(global_step=step), control,
                                metrics={"eval_rewards/strict/mean": 0.5})  # fmt: skip
    assert caplog.text.count("is read without a noise floor") == 1
    assert detector.series["validation_se"][1] == [0.0, 0.0]


def test_validation_gold_on_too_few_prompts_is_warned_about(make_trainer, train_dataset, caplog):
    """Validation gold's drop trips on sampling noise with a small evaluation set (the reasoning-gym setting of the
    study: 6 false alarms in 12 with 20 prompts): the trainer says so when it is built, and not for a large one."""

    def strict(completions, answer, **kwargs) -> list[float]:
        return testkit.exact_match_reward(completions, answer)

    fields = dict(
        reward_funcs=[fixed_text_reward, strict], **{**HACK, "max_steps": 1}, reward_weights=[1.0, 0.0],
        collapse_validation_metric="rewards/strict/mean", eval_strategy="steps", eval_steps=1,
        per_device_eval_batch_size=8,
    )  # fmt: skip
    with caplog.at_level("WARNING"):
        make_trainer(trainer_kwargs={"eval_dataset": train_dataset.select(range(8))}, **fields)
    assert "reads an evaluation of 8 prompt(s)" in caplog.text and "Evaluate on 50 or more prompts" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        make_trainer(trainer_kwargs={"eval_dataset": train_dataset.select(range(64))}, **fields)
    assert "reads an evaluation of" not in caplog.text


@pytest.mark.slow
def test_validation_gold_picks_the_checkpoint_train_ends_on(make_trainer, train_dataset):
    """A weight-0 strict reward is computed at evaluation (eval_rewards/<name>/mean), the detector reads it, and
    metric_for_best_model on it makes train() end on the best checkpoint by held-out gold."""
    from safetensors.torch import load_file

    def strict(completions, answer, **kwargs) -> list[float]:
        return testkit.exact_match_reward(completions, answer)

    trainer = make_trainer(
        reward_funcs=[fixed_text_reward, strict], trainer_kwargs={"eval_dataset": train_dataset.select(range(8))},
        **{**HACK, "max_steps": 8}, reward_weights=[1.0, 0.0], collapse_validation_metric="rewards/strict/mean",
        eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, load_best_model_at_end=True,
        metric_for_best_model="rewards/strict/mean", greater_is_better=True, per_device_eval_batch_size=8,
    )  # fmt: skip
    trainer.train()
    evals = {
        h["step"]: h["eval_rewards/strict/mean"] for h in trainer.state.log_history if "eval_rewards/strict/mean" in h
    }
    assert sorted(evals) == [2, 4, 6, 8]
    steps, values = trainer.collapse_monitor.detector.series["validation"]
    assert steps == [2, 4, 6, 8] and values == pytest.approx([evals[s] for s in steps])
    # each evaluation's standard error: TRL's logged deviation over sqrt(8 prompts x the eval generations)
    stds = {
        h["step"]: h["eval_rewards/strict/std"] for h in trainer.state.log_history if "eval_rewards/strict/std" in h
    }
    samples = 8 * (trainer.args.num_generations_eval or trainer.args.num_generations)
    se_steps, errors = trainer.collapse_monitor.detector.series["validation_se"]
    assert se_steps == steps and errors == pytest.approx([stds[s] / math.sqrt(samples) for s in steps])
    best = max(evals.values())
    assert trainer.state.best_metric == pytest.approx(best)
    assert evals[int(trainer.state.best_model_checkpoint.rsplit("-", 1)[1])] == pytest.approx(best)
    saved = load_file(os.path.join(trainer.state.best_model_checkpoint, "model.safetensors"))
    live = trainer.model.state_dict()
    assert all(torch.equal(live[name], tensor) for name, tensor in saved.items())


@pytest.mark.slow
@pytest.mark.parametrize("plain", [False, True])
def test_audits_and_validation_gold_survive_a_resume(make_trainer, train_dataset, tmp_path, plain):
    """Resumed from a checkpoint, the monitor's detector holds the audit's disagreement and the evaluations before it
    (restored from the checkpoint's monitor state) and adds the later ones: the same series as the run that never
    stopped (GRPOExtTrainer, and a plain trl.GRPOTrainer with the CollapseMonitor)."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_grpo_ext.callbacks import CollapseMonitor
    from trl_grpo_ext.detector import detector_from_config

    def digits(completions, **kwargs) -> list[float]:  # validation gold
        return testkit.digit_fraction_reward(completions)

    def dense(completions, **kwargs) -> list[float]:  # trained on: favours digits from the first step
        return testkit.digit_fraction_reward(completions)

    settings = {k: v for k, v in HACK.items() if not k.startswith(("collapse_", "diversity_"))}
    settings.update(max_steps=6, reward_weights=[1.0, 0.0, 0.0], eval_strategy="steps", eval_steps=2,
                    save_strategy="steps", save_steps=2, per_device_eval_batch_size=8)  # fmt: skip
    monitor_fields = dict(diversity_metrics=["repetition", "prompt_info"], collapse_detector="drift",
                          collapse_validation_metric="rewards/digits/mean",
                          collapse_audit_rewards=["sevens_audit"])  # fmt: skip

    def build(out):
        kwargs = dict(reward_funcs=[dense, digits, sevens_audit], output_dir=str(out), **settings,
                      trainer_kwargs={"eval_dataset": train_dataset.select(range(8))})  # fmt: skip
        if not plain:
            trainer = make_trainer(**kwargs, **monitor_fields)
            return trainer, trainer.collapse_monitor
        trainer = make_trainer(cls=GRPOTrainer, config_cls=GRPOConfig, **kwargs)
        config = make_trainer(**{**kwargs, "output_dir": str(tmp_path / "unused")}, **monitor_fields).args
        monitor = CollapseMonitor(trainer, metrics=["repetition", "prompt_info"], detector=detector_from_config(config),
                                  validation_metric="rewards/digits/mean", audit_rewards=["sevens_audit"])  # fmt: skip
        trainer.add_callback(monitor)
        return trainer, monitor

    whole, whole_monitor = build(tmp_path / "whole")
    whole.train()
    resumed, resumed_monitor = build(tmp_path / "whole")  # the same folder: resume from its checkpoint-4
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-4"))
    for name in ("validation", "validation_se", "audit"):
        steps, values = resumed_monitor.detector.series[name]
        assert steps == whole_monitor.detector.series[name][0] and min(steps) <= 4 < max(steps), name  # both sides
        assert values == pytest.approx(whole_monitor.detector.series[name][1]), name
    assert resumed_monitor.detector.series["validation"][0] == [2, 4, 6]
    assert any(v > 0 for v in whole_monitor.detector.series["validation"][1])


@pytest.mark.slow
def test_validation_gold_on_two_processes_with_both_trainers(tmp_path):
    """Validation gold under 2 gloo processes, GRPOExtTrainer and a plain trl.GRPOTrainer with the CollapseMonitor:
    every rank's detector holds each evaluation's gathered gold as TRL logged it and its standard error (TRL's
    deviation over sqrt(16 prompts x the eval generations)), alike on both ranks and both trainers."""
    _hack_worker(tmp_path, "validation")
    result = json.loads((tmp_path / "validation.json").read_text())
    for mode in ("plugin", "plain"):
        ranks = result[mode]
        assert ranks[0] == ranks[1], (mode, ranks)
        logged, (steps, values), (se_steps, errors) = ranks[0]["logged"], ranks[0]["series"], ranks[0]["se"]
        assert steps == se_steps == [2, 4, 6] == [step for step, _, _ in logged]
        assert values == pytest.approx([mean for _, mean, _ in logged]) and any(v > 0 for v in values)
        assert errors == pytest.approx([std / math.sqrt(result["samples"]) for _, _, std in logged])
    assert result["plugin"][0] == result["plain"][0]  # the same seed, the same evaluations


def test_a_shape_alarm_warns_until_an_independent_signal_confirms_it(caplog):
    """By default a shape-only alarm logs and warns; the action waits for an audit (or validation) alarm, then acts
    with the earliest onset of the alarms so far."""
    from types import SimpleNamespace

    from trl_grpo_ext.callbacks import CollapseMonitor

    detector = HackDetector({"length": 0.1, "audit": 0.2}, window=1, warmup=1)
    monitor = CollapseMonitor(_stub_trainer(), metrics=["repetition"], alarm_action="stop", detector=detector)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    for step, (length, audit) in enumerate([(4.0, 0.1), (4.0, 0.1), (5.0, 0.1)], start=1):
        fired = detector.observe_all(step, {"completions/mean_length": length, "audit/disagreement": audit})
    assert [a.signal for a in fired] == ["length"]
    with caplog.at_level("WARNING"):
        monitor._act(monitor._detector_event(3, fired), control)
    assert not control.should_training_stop and monitor.event.step == 3 and monitor.action_event is None
    assert "Warning only" in caplog.text
    fired = detector.observe_all(4, {"completions/mean_length": 5.0, "audit/disagreement": 0.5})
    monitor._act(monitor._detector_event(4, fired), control)
    assert control.should_training_stop and monitor.action_event.step == 4
    assert monitor.action_event.onset == 2  # the length alarm's onset, earlier than the audit's (3)
    assert "event" in monitor.state_dict() and monitor.state_dict()["event"]["step"] == 4


def exact_echo(prompts, completions, **kwargs) -> list[float]:
    """The healthy task of the tiny lengthening run: write the problem back ("6+6" for "6+6="), graded exactly."""
    return [float(testkit._text(c).strip() == p.rstrip("=")) for p, c in zip(prompts, completions, strict=True)]


def format_audit(completions, **kwargs) -> list[float]:
    """The audit beside it: a format check (digits and '+' only), blind to which digits."""
    return [float(bool(re.fullmatch(r"[0-9+]+", testkit._text(c).strip()))) for c in completions]


@pytest.fixture(scope="session")
def terse_echo_start(tmp_path_factory):
    """A tiny model fine-tuned (TRL's SFTTrainer, about 5 s) on a teacher that writes back only the first character
    of the problem four times in five: GRPO on echo_reward then lengthens its completions as it learns."""
    import random

    from datasets import Dataset

    from grpo_lab import testbed

    def rows(n, *, seed=0, eos_token=testkit.EOS):
        rng = random.Random(seed)
        problems = [r["prompt"] for r in testkit.arithmetic_dataset(n, seed=seed)]
        terse = [p.rstrip("=") if rng.random() < 0.2 else p[0] for p in problems]
        return Dataset.from_list(
            [{"prompt": p, "completion": t + eos_token} for p, t in zip(problems, terse, strict=True)]
        )

    return testbed.sft_warm_start(
        str(tmp_path_factory.mktemp("terse_echo")), kind="terse_echo", dataset=rows, seed=0, examples=4000,
        learning_rate=3e-3, batch_size=32, hidden_size=64, num_layers=2, use_cpu=True,
    )  # fmt: skip


@pytest.mark.slow
def test_a_healthy_run_that_lengthens_as_it_learns_runs_to_the_end_under_rollback(terse_echo_start, tmp_path):
    """No hack exists (the reward is the task's grader); completions lengthen because the run learns to write the
    whole problem, and the length signal drifts past its threshold. With collapse_action='rollback' and a format audit
    at the shipped defaults the run trains to its last step (the shape alarm only warns; the audit, which agrees with
    the learning, never alarms). The old behaviour (collapse_shape_acts=True) throws the learning away."""
    from transformers import AutoTokenizer

    from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer

    def train(out, **overrides):
        args = GRPOExtConfig(**{
            **TINY_ARGS, "per_device_train_batch_size": 16, "num_generations": 4, "max_completion_length": 6,
            "max_steps": 40, "learning_rate": 1e-3, "temperature": 1.0, "output_dir": str(tmp_path / out),
            "reward_weights": [1.0, 0.0], "diversity_metrics": ["repetition", "prompt_info"],
            "collapse_detector": "drift", "collapse_audit_rewards": ["format_audit"], "collapse_action": "rollback",
            "save_strategy": "steps", "save_steps": 4, **overrides,
        })  # fmt: skip
        trainer = GRPOExtTrainer(
            model=terse_echo_start, reward_funcs=[exact_echo, format_audit], args=args,
            train_dataset=testkit.arithmetic_dataset(512, seed=1),
            processing_class=AutoTokenizer.from_pretrained(terse_echo_start),
        )  # fmt: skip
        trainer.train()
        return trainer

    healthy = train("defaults")
    logs = last_logs(healthy)
    first, last = logs[:4], logs[-10:]
    mean = lambda rows, key: statistics.fmean(r[key] for r in rows)  # noqa: E731
    assert mean(last, "completions/mean_length") > 1.2 * mean(first, "completions/mean_length")  # lengthens
    assert mean(last, "reward") > mean(first, "reward") + 0.1  # ... as it learns
    monitor = healthy.collapse_monitor
    assert "length" in monitor.detector.alarms  # the shape signal drifted past its threshold: a warning
    assert monitor.action_event is None and monitor.rollback is None and healthy.state.global_step == 40
    assert not os.path.exists(os.path.join(healthy.args.output_dir, "collapse_rollback.json"))
    # the same run acting on shape alone rolls back to a checkpoint before the lengthening
    old = train("shape_acts", collapse_shape_acts=True)
    assert old.collapse_monitor.rollback is not None and old.state.global_step < 40


@pytest.mark.slow
def test_a_rollback_that_continues_restores_at_the_alarm_and_trains_on_screening(make_trainer):
    """collapse_rollback_then='screen': at the acting alarm the onset's checkpoint is restored at once (weights equal
    to it at that step), TRL's buffered batch is dropped, and training goes on to max_steps with the audit's flagged
    completions screened; the record says so, and a later resume does not raise the answered alarm again."""
    from safetensors.torch import load_file

    class Compare(TrainerCallback):  # added after the monitor: sees the weights right after its restore
        equal_at_alarm = None

        def on_step_end(self, args, state, control, model=None, **kwargs):
            record = trainer.collapse_monitor.rollback
            if (
                record
                and record["restored"]
                and self.equal_at_alarm is None
                and state.global_step == record["alarm_step"]
            ):
                saved = load_file(os.path.join(record["restored"], "model.safetensors"))
                live = model.state_dict()
                self.equal_at_alarm = all(torch.equal(live[k], v) for k, v in saved.items())

    settings = AUDITED  # the shape alarm acts (collapse_shape_acts, as in the other action tests); the audit screens
    trainer = make_trainer(
        reward_funcs=[fixed_text_reward, sevens_audit], collapse_action="rollback", collapse_rollback_then="screen",
        save_strategy="steps", save_steps=2, **settings,
    )  # fmt: skip
    compare = Compare()
    trainer.add_callback(compare)
    trainer.train()
    monitor = trainer.collapse_monitor
    first, answered = monitor.rollbacks[0], monitor.continued_from
    assert answered is not None and first["then"] == "screen" and first["alarm_step"] == answered.step
    assert first["checkpoint_step"] <= answered.onset < answered.step
    assert compare.equal_at_alarm is True
    assert trainer.state.global_step == HACK["max_steps"] and monitor.screening  # trained on to the end, screening
    assert len(monitor.rollbacks) == 1  # once per run: later alarms only warn
    after = [h for h in last_logs(trainer) if h["step"] > answered.step]
    assert after and any(h.get("audit/screened", 0) > 0 for h in after)
    saved = json.load(open(os.path.join(trainer.args.output_dir, "collapse_rollback.json")))
    assert saved == monitor.rollback == first and saved["then"] == "screen"
    assert "event" not in monitor.state_dict()  # a resume does not raise the answered alarm again


@pytest.mark.slow
def test_a_threshold_alarm_acts_beside_warn_only_shape_alarms(make_trainer):
    """collapse_shape_acts False and no audit: the shape alarms only warn, the threshold alarm (repetition above 0.0)
    still stops the run at its own first step, whatever the shape signals did that step."""
    settings = {**HACK, "collapse_shape_acts": False, "collapse_repetition_max": 0.0}
    trainer = make_trainer(reward_funcs=[fixed_text_reward], collapse_action="stop", **settings)
    trainer.train()
    monitor = trainer.collapse_monitor
    first = next(h["step"] for h in last_logs(trainer) if h.get("alarm/collapse") == 1.0)
    assert trainer.state.global_step == first == monitor.action_event.step
    assert monitor.action_event.source == "threshold"
