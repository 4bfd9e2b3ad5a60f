"""The config section of one family: Seeing collapse (diversity, entropy, alarm)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Literal

from ..checkpoints import rollback_refusal
from ..names import DIVERSITY_METRICS, AlarmAction
from .section import ConfigSection, _fail, bounds


@dataclass
class MonitorConfig(ConfigSection):
    r"""
    > Seeing collapse (diversity, entropy, alarm)

        diversity_metrics (`list[str]`, *optional*, defaults to `[]`):
            Metrics of the `CollapseMonitor` callback: any of `distinct`, `self_bleu`, `repetition`, `unique`,
            `prompt_info` (what the completions say about their prompts, a detector signal), `entropy`. Empty: off.
        diversity_ngram_sizes (`list[int]`, *optional*, defaults to `[1, 2, 3, 4]`):
            n of the `diversity/distinct_n` metrics.
        diversity_repetition_n (`int`, *optional*, defaults to `3`):
            n of `diversity/repetition` (repeated n-grams inside one completion).
        diversity_low_entropy_threshold (`float`, *optional*, defaults to `0.1`):
            Tokens with entropy below it count in `entropy/low_frac`.
        diversity_every (`int`, *optional*, defaults to `1`):
            Measure the n-gram metrics (`distinct`, `self_bleu`, `repetition`, `unique`) and the entropy percentiles
            on the training generation batch of every k-th step only: steps 1, 1 + k, 1 + 2k, ..., each logged at its
            own step (all processes agree, and a resumed run keeps the pattern). `entropy/mean`, `entropy/low_frac`
            and evaluation batches are measured every time. Raise it when the monitor shows in `timing/ext_fraction`
            on a very short step.
        collapse_entropy_min (`float`, *optional*):
            Collapse alarm when the mean token entropy falls below it.
        collapse_entropy_max (`float`, *optional*):
            Alarm when the mean token entropy rises above it (entropy that explodes: clip-higher runs climbing to 2
            nats, verl #2738), in nats of the sampling distribution (TRL's `entropy`).
        collapse_entropy_rise (`float`, *optional*):
            Alarm when the mean token entropy rises above (1 + rise) x its first measured value (1.0: doubled).
        collapse_distinct2_drop (`float`, *optional*):
            Collapse alarm when Distinct-2 falls below (1 - drop) x its first value (e.g. 0.5).
        collapse_repetition_max (`float`, *optional*):
            Collapse alarm when the mean repetition rate exceeds it.
        collapse_detector (`str`, *optional*, defaults to `"none"`):
            `"drift"`: the gold-free hack detector (docs/monitoring.md): alarms (`alarm/hack`) when a signal of the
            completions' shape drifts from its best value of the run the way a hack moves it and learning does not:
            completion length up (`collapse_length_rise`), prompt information down (`collapse_prompt_info_drop`,
            needs `prompt_info` in `diversity_metrics`), repetition up (`collapse_repetition_rise`, needs
            `repetition`). `"none"`: off.
        collapse_detector_window (`int`, *optional*, defaults to `2`):
            Measurements (training generation batches) in each signal's trailing mean. The defaults of the detector's
            fields were chosen on validation runs of two kinds of hack and measured on a third (docs/results.md).
        collapse_detector_warmup (`int`, *optional*, defaults to `2`):
            Measurements before the detector tracks a signal's best value.
        collapse_onset_fraction (`float`, *optional*, defaults to `0.75`):
            The onset the detector reports (where `rollback` returns to): the last measurement before the alarm whose
            drift was at most this fraction of the threshold. 0: the signal's best point of the run (earlier).
        collapse_length_rise (`float`, *optional*, defaults to `0.1`):
            Detector: alarm when the mean completion length rises this fraction above its lowest point. `None`: not
            read.
        collapse_prompt_info_drop (`float`, *optional*, defaults to `0.15`):
            Detector: alarm when `diversity/prompt_info` falls this fraction below its highest point. `None`: not read.
        collapse_repetition_rise (`float`, *optional*, defaults to `0.03`):
            Detector: alarm when `diversity/repetition` rises this much (absolute) above its lowest point. `None`: not
            read.
        collapse_length_info_gate (`float`, *optional*, defaults to `0.05`):
            Detector: the length signal alarms only while `diversity/prompt_info` is at most (1 + this) x its value at
            length's lowest point: completions that lengthen because the run learns (a scratchpad, whole answers
            where truncated ones were) say more about their prompts, padding and keywords say less
            (docs/monitoring.md). Needs `prompt_info` in `diversity_metrics`. `None`: length alarms alone.
        collapse_audit_rewards (`list[str]`, *optional*, defaults to `[]`):
            Audit rewards: names of reward functions (TRL's `reward_func_names`) that the trainer computes and logs
            but does not train on (their `reward_weights` entry must be 0): a strict grader beside a lenient one, a
            second reward model, a format check. The monitor logs `audit/disagreement`, the fraction of the
            completions the training reward favours (above their group's mean) that an audit scores below
            `collapse_audit_threshold`, and `audit/flagged_frac`; the detector reads its rise
            (`collapse_audit_rise`) and `collapse_action="screen"` acts on it. It also logs two stricter reads,
            which the detector does not read (docs/monitoring.md): `audit/inversion` (only what the reward pays at
            least as much as every completion of its group the audits accept) and `audit/overpaid` (only what it
            pays at least the median of the batch's favoured completions the audits accept).
        collapse_audit_threshold (`float`, *optional*, defaults to `0.5`):
            An audit score below it fails a completion (0.5: a 0/1 grader's fail).
        collapse_audit_rise (`float`, *optional*, defaults to `0.2`):
            Detector: alarm when `audit/disagreement` rises this much (absolute) above its lowest point (with
            `collapse_audit_rewards`). `None`: not read.
        collapse_validation_metric (`str`, *optional*):
            Validation gold: an evaluation metric the detector reads at every evaluation (`eval_strategy`, an
            `eval_dataset` of held-out labelled prompts), e.g. `"rewards/strict/mean"`: the mean of a strict reward
            function passed in `reward_funcs` with `reward_weights` 0 (TRL computes and logs it at evaluation; it can
            be the audit too). Alarms when it falls `collapse_validation_drop` below its best value while the training
            reward has not fallen since (a hack raises the reward it games). The same key in `metric_for_best_model`
            with `load_best_model_at_end=True` makes `train()` end on the best checkpoint by it. `None`: off.
        collapse_validation_drop (`float`, *optional*, defaults to `0.2`):
            Detector: relative fall of `collapse_validation_metric` from its best value that alarms.
        collapse_validation_z (`float`, *optional*, defaults to `3.0`):
            Detector: the fall must also exceed this many standard errors of the difference between the best
            evaluation and this one, each evaluation's standard error being the metric's `.../std` (TRL logs it beside
            `.../mean`) over sqrt(evaluation prompts x `num_generations_eval`). A mean over few prompts moves by its
            sampling noise alone, and the best of many evaluations is the luckiest one. `0`: no noise floor.
        collapse_shape_acts (`bool`, *optional*, defaults to `False`):
            Whether `collapse_action` acts on an alarm of the detector's shape signals (length, prompt information,
            repetition) alone. False: a shape alarm is logged (`alarm/hack`) and warned, and the action waits until an
            independent signal (`collapse_audit_rewards`, `collapse_validation_metric`) alarms too, then rolls back to
            the earliest onset. Shape moves the same way when a run learns (a scratchpad, whole answers where
            truncated ones were: docs/results.md), so acting on it alone can throw a healthy run's learning away.
        collapse_rollback_then (`str`, *optional*, defaults to `"end"`):
            After `collapse_action="rollback"`: `"end"` (training ends, then the restore) or `"screen"` (the restore
            at once, and training goes on to `max_steps` from the onset's checkpoint with the completions the audits
            flag screened, as `collapse_action="screen"` does; once per run: later alarms warn only). Needs
            `collapse_audit_rewards`. The scheduler is restored with the weights, so the learning rate resumes from
            the checkpoint's point of the schedule while the step count goes on.
        collapse_action (`str`, *optional*, defaults to `"warn"`):
            What an alarm (the thresholds' `alarm/collapse` or the detector's `alarm/hack`) does besides logging:
            `"warn"`, `"save"` (a checkpoint), `"stop"` (a checkpoint, then training ends) or `"rollback"` (a checkpoint
            of the alarmed state, training ends, and the weights, optimizer, scheduler and extension state are restored
            from the newest complete checkpoint this run saved at or before the alarm's onset (the detector's onset, or
            the threshold alarm's last calm step); another run's folders in `output_dir`, damaged ones and ones without
            optimizer state are passed over; needs `save_strategy="steps"` and `save_total_limit=None`, and saves
            `checkpoint-0` at the start; `output_dir/collapse_rollback.json` says what was restored and what was passed
            over). Resuming from a checkpoint saved after an alarm raises it again at the first step. `"screen"` (with
            `collapse_audit_rewards`): from the alarm on, the completions an audit flags (favoured by the training
            reward, failed by the audit) train with advantage 0 and leave their group (the others' advantages are
            computed again without them), batch by batch (`audit/screened`); training goes on. The action to leave on:
            in the project's study every hacked run ended with >= 99% of vanilla's best held-out gold and every healthy
            run with all of its own, where a rollback cost a false alarm up to 23% (docs/monitoring.md). A callable
            `trainer.collapse_monitor.on_alarm(event)` may choose per alarm.
        eval_pass_at_k (`list[int]`, *optional*, defaults to `[]`):
            k values of the unbiased pass@k (Chen et al. 2021) logged at evaluation from the sampled completions
            (`num_generations_eval` per prompt). Empty: off.
        eval_pass_threshold (`float`, *optional*, defaults to `1.0`):
            A completion counts as correct when its (weighted) reward is at least this.
        eval_pass_greedy (`bool`, *optional*, defaults to `True`):
            With `eval_pass_at_k`, also decode each eval prompt greedily once and log `pass@k/greedy` (its accuracy).
    """

    #: Finite but absurd values refused: field -> (lowest, highest, why, example) (config.section.bounds).
    field_bounds = {
        "diversity_low_entropy_threshold": bounds(
            0.0, None, "an entropy is never negative", "diversity_low_entropy_threshold=0.1"
        ),
        "collapse_entropy_min": bounds(0.0, None, "an entropy is never negative", "collapse_entropy_min=0.1"),
        "collapse_repetition_max": bounds(0.0, 1.0, "a repetition rate is a fraction", "collapse_repetition_max=0.5"),
    }

    diversity_metrics: list[str] = field(
        default_factory=list,
        metadata={
            "help": "CollapseMonitor metrics: distinct, self_bleu, repetition, unique, prompt_info, entropy "
            "(empty: off)."
        },
    )
    diversity_ngram_sizes: list[int] = field(
        default_factory=lambda: [1, 2, 3, 4], metadata={"help": "n of the diversity/distinct_n metrics."}
    )
    diversity_repetition_n: int = field(default=3, metadata={"help": "n of diversity/repetition."})
    diversity_low_entropy_threshold: float = field(
        default=0.1,
        metadata={
            "help": "Tokens with entropy below it count in entropy/low_frac.",
        },
    )
    diversity_every: int = field(
        default=1,
        metadata={"help": "Measure n-gram diversity and entropy percentiles at steps 1, 1 + k, 1 + 2k, ... only."},
    )
    collapse_entropy_min: float | None = field(
        default=None,
        metadata={
            "help": "Collapse alarm when the mean token entropy falls below it.",
        },
    )
    collapse_entropy_max: float | None = field(
        default=None, metadata={"help": "Alarm when the mean token entropy rises above it (entropy that explodes)."}
    )
    collapse_entropy_rise: float | None = field(
        default=None,
        metadata={"help": "Alarm when the mean token entropy rises above (1 + rise) x its first value (1.0: doubled)."},
    )
    collapse_distinct2_drop: float | None = field(
        default=None, metadata={"help": "Collapse alarm when Distinct-2 falls below (1 - drop) x its first value."}
    )
    collapse_repetition_max: float | None = field(
        default=None,
        metadata={
            "help": "Collapse alarm when the mean repetition rate exceeds it.",
        },
    )
    collapse_detector: Literal["none", "drift"] = field(
        default="none", metadata={"help": "The gold-free hack detector (alarm/hack): drift or none."}
    )
    collapse_detector_window: int = field(
        default=2, metadata={"help": "Detector: measurements in each signal's trailing mean."}
    )
    collapse_detector_warmup: int = field(
        default=2, metadata={"help": "Detector: measurements before a signal's best value is tracked."}
    )
    collapse_onset_fraction: float = field(
        default=0.75, metadata={"help": "Detector: onset = last measurement within this fraction of the threshold."}
    )
    collapse_length_rise: float | None = field(
        default=0.1, metadata={"help": "Detector: relative rise of the mean completion length that alarms."}
    )
    collapse_prompt_info_drop: float | None = field(
        default=0.15, metadata={"help": "Detector: relative fall of diversity/prompt_info that alarms."}
    )
    collapse_repetition_rise: float | None = field(
        default=0.03, metadata={"help": "Detector: absolute rise of diversity/repetition that alarms."}
    )
    collapse_length_info_gate: float | None = field(
        default=0.05,
        metadata={"help": "Detector: length alarms only while prompt_info is at most (1 + this) x its value then."},
    )
    collapse_audit_rewards: list[str] = field(
        default_factory=list,
        metadata={"help": "Reward functions (reward_weights 0) logged and compared, never trained on (audits)."},
    )
    collapse_audit_threshold: float = field(
        default=0.5, metadata={"help": "An audit score below it fails a completion."}
    )
    collapse_audit_rise: float | None = field(
        default=0.2, metadata={"help": "Detector: absolute rise of audit/disagreement that alarms."}
    )
    collapse_validation_metric: str | None = field(
        default=None,
        metadata={
            "help": "Detector: an eval metric of held-out gold (e.g. rewards/strict/mean); alarms when it falls."
        },
    )
    collapse_validation_drop: float = field(
        default=0.2, metadata={"help": "Detector: relative fall of collapse_validation_metric that alarms."}
    )
    collapse_validation_z: float = field(
        default=3.0,
        metadata={"help": "Detector: standard errors of the evaluation the validation drop must also exceed (0: off)."},
    )
    collapse_shape_acts: bool = field(
        default=False,
        metadata={
            "help": "Act on a shape-only alarm (length, prompt_info, repetition); False: it warns until confirmed."
        },
    )
    collapse_rollback_then: Literal["end", "screen"] = field(
        default="end",
        metadata={"help": "After a rollback: end (training ends) or screen (restore now, go on screening flags)."},
    )
    collapse_action: AlarmAction = field(
        default="warn", metadata={"help": "What an alarm does besides logging: warn, save, stop, rollback or screen."}
    )
    eval_pass_at_k: list[int] = field(
        default_factory=list, metadata={"help": "k values of pass@k logged at evaluation (empty: off)."}
    )
    eval_pass_threshold: float = field(
        default=1.0, metadata={"help": "Reward at or above which an eval completion counts as correct."}
    )
    eval_pass_greedy: bool = field(
        default=True, metadata={"help": "With eval_pass_at_k, also log the greedy accuracy (pass@k/greedy)."}
    )

    def check(self) -> None:
        unknown = sorted(set(self.diversity_metrics) - set(DIVERSITY_METRICS))
        if unknown:
            _fail(
                "diversity_metrics",
                self.diversity_metrics,
                f"unknown metric(s) {unknown}",
                f"use {list(DIVERSITY_METRICS)}",
            )
        if not self.diversity_ngram_sizes or any(int(n) < 1 for n in self.diversity_ngram_sizes):
            _fail("diversity_ngram_sizes", self.diversity_ngram_sizes, "needs integers >= 1", "e.g. [1, 2, 3, 4]")
        if self.diversity_repetition_n < 1:
            _fail("diversity_repetition_n", self.diversity_repetition_n, "must be >= 1", "e.g. 3")
        if self.diversity_every < 1:
            _fail("diversity_every", self.diversity_every, "must be >= 1 (1: every step)", "e.g. diversity_every=4")
        for name in ("collapse_entropy_max", "collapse_entropy_rise"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                _fail(name, value, "must be > 0 (an entropy, or a relative rise)", f"e.g. {name}=1.0, or None (off)")
        low, high = self.collapse_entropy_min, self.collapse_entropy_max
        if low is not None and high is not None and high <= low:
            _fail(
                "collapse_entropy_max",
                high,
                f"must lie above collapse_entropy_min={low}: every entropy would alarm",
                f"e.g. collapse_entropy_max={max(2 * low, 1.0):g}",
            )
        if self.collapse_distinct2_drop is not None and not 0 < self.collapse_distinct2_drop < 1:
            _fail("collapse_distinct2_drop", self.collapse_distinct2_drop, "must be a fraction in (0, 1)", "e.g. 0.5")
        if self.collapse_repetition_max is not None and self.collapse_repetition_max >= 1.0:
            _fail(
                "collapse_repetition_max",
                self.collapse_repetition_max,
                "can never be exceeded: a repetition rate is at most 1.0",
                "e.g. collapse_repetition_max=0.5, or None (off)",
            )
        if any(int(k) < 1 for k in self.eval_pass_at_k):
            _fail("eval_pass_at_k", self.eval_pass_at_k, "k must be >= 1", "e.g. [1, 4, 8]")
        needs = {  # alarm field -> the diversity metric it reads
            "collapse_entropy_min": "entropy",
            "collapse_entropy_max": "entropy",
            "collapse_entropy_rise": "entropy",
            "collapse_distinct2_drop": "distinct",
            "collapse_repetition_max": "repetition",
        }
        if self.collapse_detector != "none":
            if not self.diversity_metrics:
                _fail(
                    "collapse_detector",
                    self.collapse_detector,
                    "the detector runs in the collapse monitor, which diversity_metrics switches on",
                    "set diversity_metrics=['repetition', 'prompt_info'] (or more)",
                )
            for name in ("collapse_detector_window", "collapse_detector_warmup"):
                if getattr(self, name) < 1:
                    _fail(name, getattr(self, name), "must be >= 1 (measurements)", f"e.g. {name}=3")
            if not 0 <= self.collapse_onset_fraction < 1:
                _fail(
                    "collapse_onset_fraction",
                    self.collapse_onset_fraction,
                    "must lie in [0, 1) (a fraction of the threshold)",
                    "e.g. 0.5, or 0 for the signal's best point",
                )
            thresholds = (
                "collapse_length_rise",
                "collapse_prompt_info_drop",
                "collapse_repetition_rise",
                *(("collapse_audit_rise",) if self.collapse_audit_rewards else ()),
            )
            if all(getattr(self, name) is None for name in thresholds):
                _fail("collapse_detector", self.collapse_detector, "every signal's threshold is None", "set one")
            for name in thresholds:
                value = getattr(self, name)
                if value is not None and not value > 0:
                    _fail(name, value, "must be > 0 (a drift that alarms) or None", f"e.g. {name}=0.2")
            reachable = {  # the largest drift the signal can show (detector.REACHABLE)
                "collapse_prompt_info_drop": "prompt information, never negative, falls by at most all of it (1.0)",
                "collapse_repetition_rise": "a repetition rate is a fraction: it rises by at most 1.0",
                "collapse_audit_rise": "audit/disagreement is a fraction: it rises by at most 1.0",
            }
            for name, why in reachable.items():
                value = getattr(self, name)
                if value is not None and value > 1.0:
                    _fail(name, value, f"can never be reached: {why}", f"e.g. {name}=0.2, or None to not read it")
            needs.update(collapse_prompt_info_drop="prompt_info", collapse_repetition_rise="repetition")
        if self.collapse_audit_rewards:
            if not self.diversity_metrics:
                _fail(
                    "collapse_audit_rewards",
                    self.collapse_audit_rewards,
                    "audits are read by the collapse monitor, which diversity_metrics switches on",
                    "set diversity_metrics (e.g. ['repetition', 'prompt_info'])",
                )
            if len(set(self.collapse_audit_rewards)) != len(self.collapse_audit_rewards):
                _fail("collapse_audit_rewards", self.collapse_audit_rewards, "names a reward twice", "name each once")
            if not math.isfinite(self.collapse_audit_threshold):
                _fail("collapse_audit_threshold", self.collapse_audit_threshold, "must be finite", "e.g. 0.5")
        if self.collapse_validation_metric is not None:
            if self.collapse_detector == "none":
                _fail(
                    "collapse_validation_metric",
                    self.collapse_validation_metric,
                    "validation gold is a signal of the hack detector, which is off",
                    "set collapse_detector='drift'",
                )
            if not (math.isfinite(self.collapse_validation_drop) and self.collapse_validation_drop > 0):
                _fail("collapse_validation_drop", self.collapse_validation_drop, "must be a finite number > 0", "0.2")
            if not (math.isfinite(self.collapse_validation_z) and self.collapse_validation_z >= 0):
                _fail("collapse_validation_z", self.collapse_validation_z, "must be a finite number >= 0", "3.0")
        if self.collapse_rollback_then == "screen" and not self.collapse_audit_rewards:
            _fail(
                "collapse_rollback_then",
                self.collapse_rollback_then,
                "a rollback that continues screens the completions an audit flags, and no audit is named",
                "name the audit reward functions in collapse_audit_rewards, or collapse_rollback_then='end'",
            )
        if self.collapse_action == "screen" and not self.collapse_audit_rewards:
            _fail(
                "collapse_action",
                self.collapse_action,
                "screening zeroes the advantages of the completions an audit flags, and no audit is named",
                "name the audit reward functions in collapse_audit_rewards (with reward_weights 0 for them)",
            )
        for name, metric in needs.items():
            value = getattr(self, name)
            if value is not None and metric not in self.diversity_metrics:
                _fail(
                    name,
                    value,
                    f"the alarm reads the '{metric}' metric, which diversity_metrics does not compute",
                    f"add '{metric}' to diversity_metrics",
                )
        if self.collapse_detector != "none":
            gate = self.collapse_length_info_gate
            if gate is not None and not (math.isfinite(gate) and gate >= 0):
                _fail("collapse_length_info_gate", gate, "must be a finite number >= 0, or None", "e.g. 0.05")
            if (
                gate is not None
                and self.collapse_length_rise is not None
                and "prompt_info" not in self.diversity_metrics
            ):
                _fail(
                    "collapse_length_info_gate",
                    gate,
                    "the length signal's gate reads the 'prompt_info' metric, which diversity_metrics does not compute",
                    "add 'prompt_info' to diversity_metrics, or set collapse_length_info_gate=None (length alarms "
                    "alone, also when completions lengthen because the run learns)",
                )

    def check_across(self) -> None:
        if self.collapse_action == "rollback":
            refusal = rollback_refusal(self.save_strategy, self.save_total_limit)
            if refusal is not None:
                _fail("collapse_action", self.collapse_action, *refusal)
        alarms = (
            "collapse_entropy_min",
            "collapse_entropy_max",
            "collapse_entropy_rise",
            "collapse_distinct2_drop",
            "collapse_repetition_max",
        )
        independent = bool(self.collapse_audit_rewards or self.collapse_validation_metric)
        if (
            self.collapse_action != "warn"
            and self.diversity_metrics
            and self.collapse_detector != "none"
            and not independent
            and not self.collapse_shape_acts
            and all(getattr(self, name) is None for name in alarms)
        ):
            _fail(
                "collapse_action",
                self.collapse_action,
                "it acts on the detector's audit or validation alarms, or on a shape alarm one of them confirms, and "
                "neither is configured: the shape signals alone only warn (they also move when a run learns)",
                "name an audit (collapse_audit_rewards, with reward_weights 0) or a validation metric "
                "(collapse_validation_metric), or set collapse_shape_acts=True to act on shape alone",
            )
        if (
            self.collapse_action != "warn"
            and self.diversity_metrics
            and self.collapse_detector == "none"
            and all(getattr(self, name) is None for name in alarms)
        ):
            _fail(
                "collapse_action",
                self.collapse_action,
                "nothing can alarm: collapse_detector is 'none' and no collapse_* threshold is set, so the action "
                "never happens",
                "set collapse_detector='drift' (or a collapse_* threshold), or leave collapse_action='warn'",
            )
        if self.collapse_detector != "none" and self.max_steps > 0:
            # the detector tracks a best point from its warmup-th measurement on and alarms at a later one; with
            # diversity_every = k the diversity signals are measured every k steps
            # a warning, not an error: a short smoke run of a real config is legitimate, it just cannot alarm
            needed = self.collapse_detector_warmup * self.diversity_every
            if needed >= self.max_steps:
                warnings.warn(
                    f"GRPOExtConfig.collapse_detector_warmup={self.collapse_detector_warmup}: the hack detector needs "
                    f"more than {needed} steps (warm-up {self.collapse_detector_warmup} measurements x "
                    f"diversity_every={self.diversity_every}) before it can alarm, but max_steps is {self.max_steps}: "
                    f"it cannot fire in this run. Fix: lower it (collapse_detector_warmup="
                    f"{max(1, (self.max_steps - 1) // self.diversity_every)} at most here) or raise max_steps above "
                    f"{needed}.",
                    UserWarning,
                    stacklevel=2,
                )
        if self.collapse_detector != "none" and self.collapse_length_rise is not None:
            most = float(self.max_completion_length or 0) - 1.0  # mean length from >= 1 token to <= max
            if self.max_completion_length and self.collapse_length_rise > most:
                _fail(
                    "collapse_length_rise",
                    self.collapse_length_rise,
                    f"can never be reached: the mean completion length can rise at most {most:g}x above its lowest "
                    f"point (from 1 token to max_completion_length={self.max_completion_length})",
                    "e.g. collapse_length_rise=0.1, or None to not read length",
                )
        strategy = getattr(self.eval_strategy, "value", self.eval_strategy)
        if self.collapse_validation_metric is not None and strategy == "no":
            _fail(
                "collapse_validation_metric",
                self.collapse_validation_metric,
                "it is measured at evaluation, and eval_strategy is 'no'",
                "set eval_strategy='steps' and eval_steps (e.g. 25), and pass an eval_dataset of held-out prompts",
            )
        if self.collapse_action == "rollback" and not self.diversity_metrics:
            _fail(
                "collapse_action",
                self.collapse_action,
                "the collapse monitor that acts is off (diversity_metrics is empty)",
                "set diversity_metrics and collapse_detector='drift' (or a collapse_* threshold)",
            )
        group = self.num_generations_eval or self.num_generations  # pass@k of the eval groups
        if self.eval_pass_at_k and max(self.eval_pass_at_k) > group:
            _fail(
                "eval_pass_at_k",
                self.eval_pass_at_k,
                f"k cannot exceed the {group} samples per eval prompt",
                "lower k or raise num_generations_eval",
            )
