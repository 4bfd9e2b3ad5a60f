"""The hack detector's running state and the collapse actions' bookkeeping (the collapse monitor owns both).

:class:`HackDetector` keeps, for every signal, the measurements of the run so far and asks
:func:`trl_grpo_ext.core.hack_detection.drift_alarm` after each new one; the same function replays a saved run
(benchmarks/hack_study.py), so a run's online alarm and its replay agree. Its state (the measurements) is saved in
checkpoints, so a resumed run alarms where an uninterrupted one does.

:class:`CollapseEvent` is what an alarm hands to the action (``collapse_action`` or a user's ``on_alarm``); the
checkpoint a ``rollback`` returns to is :func:`trl_grpo_ext.checkpoints.rollback_target`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .core.hack_detection import DriftAlarm, DriftRule, drift_alarm, drift_from_best, gate_open, noise_margin

#: signal -> (the metric it reads, its direction: +1 if a hack raises it, -1 if a hack lowers it, relative drift?)
SIGNALS: dict[str, tuple[str, int, bool]] = {
    "length": ("completions/mean_length", 1, True),
    "prompt_info": ("diversity/prompt_info", -1, True),
    "repetition": ("diversity/repetition", 1, False),
    "audit": ("audit/disagreement", 1, False),
    # held-out gold (``collapse_validation_metric``, measured at each evaluation; the monitor feeds it under this key)
    "validation": ("validation/gold", -1, True),
    # TRL's training reward: read as the validation signal's gate (it has no threshold of its own)
    "reward": ("reward", 1, True),
}
#: Signals read against their measurements' noise: signal -> (the series of each measurement's standard error, the
#: metric it is fed under). Held-out gold's is the evaluation's sampling error (the monitor computes it from TRL's
#: ``rewards/<name>/std`` and the evaluation's size); a drop must exceed ``collapse_validation_z`` of them.
NOISE: dict[str, tuple[str, str]] = {"validation": ("validation_se", "validation/gold_se")}
#: series name -> the metric key it reads (the signals' and the noise series')
METRIC_KEYS: dict[str, str] = {name: key for name, (key, _, _) in SIGNALS.items()} | dict(NOISE.values())
#: The largest drift each signal can reach (None: unbounded): a repetition rate and the audit disagreement are
#: fractions (an absolute rise of at most 1), and prompt information, never negative, can fall by at most all of it (a
#: relative fall of at most 1). A threshold above it would never alarm.
REACHABLE: dict[str, float | None] = {
    "length": None,
    "prompt_info": 1.0,
    "repetition": 1.0,
    "audit": 1.0,
    "validation": None,  # the relative fall of a score that may be negative is unbounded
    "reward": None,
}
#: The gated signals: signal -> (its gate, the direction the gate must not have moved in since the signal's best
#: point; :class:`~trl_grpo_ext.core.hack_detection.DriftRule`). Length is read only while prompt information has not
#: risen (healthy lengthening says more about the prompt), held-out gold only while the training reward has not fallen
#: (a hack raises the reward it games).
GATES: dict[str, tuple[str, int]] = {"length": ("prompt_info", 1), "validation": ("reward", -1)}
#: Signals independent of the completions' shape: a second grader (the audit) and held-out gold. Their alarms are
#: what ``collapse_action`` acts on by default; a shape signal's alarm warns until one of them confirms it
#: (``collapse_shape_acts``): shape moves the same way when a run learns (docs/results.md, "Telling learning from
#: hacking").
INDEPENDENT: frozenset[str] = frozenset({"audit", "validation"})
#: Signals read one measurement at a time (window and warm-up 1, whatever the detector's): held-out gold is measured
#: at evaluations only (tens of steps apart) and is already a mean over the evaluation prompts.
SINGLE: frozenset[str] = frozenset({"validation"})


def check_detector_settings(*, window, warmup, onset_fraction) -> None:
    """``window`` and ``warmup`` whole numbers >= 1, ``onset_fraction`` in [0, 1); a ``ValueError`` naming the one that
    is not (the config has its own field-named checks; this guards the plain-TRL constructor)."""
    for name, value in (("window", window), ("warmup", warmup)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"HackDetector: {name}={value!r} must be a whole number >= 1 (measurements), e.g. 3.")
    if not (isinstance(onset_fraction, (int, float)) and 0.0 <= onset_fraction < 1.0):
        raise ValueError(
            f"HackDetector: onset_fraction={onset_fraction!r} must lie in [0, 1) (a fraction of the threshold), "
            "e.g. 0.75."
        )


def drift_rules(
    thresholds: Mapping[str, float],
    gates: Mapping[str, float] | None = None,
    noise: Mapping[str, float] | None = None,
) -> dict[str, DriftRule]:
    """signal name (:data:`SIGNALS`) -> threshold, as the rules :func:`~trl_grpo_ext.core.hack_detection.drift_alarm`
    reads (each signal's direction and relative / absolute drift from :data:`SIGNALS`). A threshold must be a finite
    number > 0 that the signal can reach (:data:`REACHABLE`): NaN compares false with every drift and would never
    alarm. ``gates``: gated signal -> its gate's slack (:data:`GATES`), e.g. ``{"length": 0.05}``. ``noise``: signal
    (:data:`NOISE`) -> how many standard errors its drop must also exceed, e.g. ``{"validation": 2.0}`` (0: none)."""
    gates, noise = dict(gates or {}), dict(noise or {})
    unknown = sorted((set(thresholds) | set(gates) | set(noise)) - set(SIGNALS))
    if unknown:
        raise ValueError(f"Unknown detector signal(s) {unknown}; choose from {sorted(SIGNALS)}.")
    if not thresholds:
        raise ValueError(
            "HackDetector: no signal to read (thresholds is empty); give at least one, e.g. {'length': 0.1}."
        )
    for name, value in thresholds.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"HackDetector: the {name!r} threshold {value!r} must be a finite number > 0, e.g. 0.1.")
        reachable = REACHABLE[name]
        if reachable is not None and value > reachable:
            raise ValueError(
                f"HackDetector: the {name!r} threshold {value!r} can never be reached (its drift is at most "
                f"{reachable:g}); use a value in (0, {reachable:g}]."
            )
    for name, slack in gates.items():
        if name not in GATES:
            raise ValueError(f"HackDetector: the {name!r} signal has no gate; gated signals: {sorted(GATES)}.")
        if isinstance(slack, bool) or not isinstance(slack, (int, float)) or not math.isfinite(slack) or slack < 0:
            raise ValueError(
                f"HackDetector: the {name!r} gate's slack {slack!r} must be a finite number >= 0, e.g. 0.05."
            )
    for name, z in noise.items():
        if name not in NOISE:
            raise ValueError(
                f"HackDetector: the {name!r} signal has no noise series; signals with one: {sorted(NOISE)}."
            )
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not math.isfinite(z) or z < 0:
            raise ValueError(
                f"HackDetector: the {name!r} noise multiple {z!r} must be a finite number >= 0 (standard errors), "
                "e.g. 2.0."
            )
    rules = {}
    for name, value in thresholds.items():
        gate, gate_direction = GATES[name] if name in gates else (None, 1)
        rules[name] = DriftRule(
            direction=SIGNALS[name][1], threshold=float(value), relative=SIGNALS[name][2], gate=gate,
            gate_direction=gate_direction, slack=float(gates.get(name, 0.0)),
            window=1 if name in SINGLE else None, warmup=1 if name in SINGLE else None,
            noise=NOISE[name][0] if noise.get(name) else None, noise_z=float(noise.get(name) or 0.0),
        )  # fmt: skip
    return rules


class HackDetector:
    """Per-signal measurements and the first alarm (:class:`~trl_grpo_ext.core.hack_detection.DriftAlarm`).

    Args:
        thresholds: signal name (:data:`SIGNALS`) -> drift that alarms (relative for ``length`` and ``prompt_info``,
            absolute for ``repetition``); a signal left out is not read.
        window: measurements in each trailing mean.
        warmup: measurements before a best point is tracked.
        onset_fraction: the onset is the last measurement before the alarm within this fraction of the threshold
            (0: the signal's best point).
        gates: gated signal -> slack (:data:`GATES`): ``{"length": 0.05}`` reads length only while prompt
            information is at most 5% above its value at length's lowest point; ``{"validation": 0.0}`` reads
            held-out gold only while the training reward has not fallen. A gate signal is measured even without a
            threshold of its own.
        noise: signal -> standard errors its drop must also exceed (:data:`NOISE`): ``{"validation": 2.0}`` reads
            held-out gold against its evaluation's sampling error (fed as ``validation/gold_se``).
    """

    def __init__(
        self,
        thresholds: Mapping[str, float],
        *,
        window: int,
        warmup: int,
        onset_fraction: float = 0.0,
        gates: Mapping[str, float] | None = None,
        noise: Mapping[str, float] | None = None,
    ):
        check_detector_settings(window=window, warmup=warmup, onset_fraction=onset_fraction)
        self.rules = drift_rules(thresholds, gates, noise)
        self.window = window
        self.warmup = warmup
        self.onset_fraction = onset_fraction
        read = list(self.rules) + [r.gate for r in self.rules.values() if r.gate and r.gate not in self.rules]
        read += [r.noise for r in self.rules.values() if r.noise]
        #: every signal read: those with a threshold and the gates
        self.series: dict[str, tuple[list[int], list[float]]] = {name: ([], []) for name in read}
        #: each signal's first alarm
        self.alarms: dict[str, DriftAlarm] = {}

    @property
    def alarm(self) -> DriftAlarm | None:
        """The run's first alarm, whichever signal fired (ties: the first in the rules' order)."""
        if not self.alarms:
            return None
        order = list(self.rules)
        return min(self.alarms.values(), key=lambda a: (a.step, order.index(a.signal)))

    def observe(self, step: int, values: Mapping[str, float]) -> DriftAlarm | None:
        """Add this step's measurements (metric key -> value; keys the detector does not read, and non-finite values,
        are skipped) and return the run's first alarm when it fires now (once per run); :meth:`observe_all` returns
        every signal's first alarm as it fires."""
        first = self.alarm
        self.observe_all(step, values)
        now = self.alarm
        return now if first is None and now is not None else None

    def observe_all(self, step: int, values: Mapping[str, float]) -> list[DriftAlarm]:
        """Add this step's measurements (see :meth:`observe`) and return the signals' first alarms that fire now."""
        noises = {rule.noise: name for name, rule in self.rules.items() if rule.noise}  # noise series -> its signal
        for name in self.series:
            if name in noises:
                continue
            value = values.get(METRIC_KEYS[name])
            if value is None or not math.isfinite(value):
                continue
            steps, measured = self.series[name]
            if steps and steps[-1] >= step:
                continue  # a step measured twice (a resumed run replaying its last step) counts once
            steps.append(int(step))
            measured.append(float(value))
        for noise, signal in noises.items():  # one standard error per measurement of its signal: 0 (no floor) if none
            self._align(noise, signal, values.get(METRIC_KEYS[noise]))
        waiting = {name: rule for name, rule in self.rules.items() if name not in self.alarms}
        if not waiting:
            return []
        series, fired = self.tensors(), []
        for name, rule in waiting.items():
            found = drift_alarm(
                series, {name: rule}, window=self.window, warmup=self.warmup, onset_fraction=self.onset_fraction
            )
            if found is not None:
                self.alarms[name] = found
                fired.append(found)
        return fired

    def score(self) -> float | None:
        """The largest drift over its threshold among the signals at their newest measurement (1.0 alarms), a gated
        signal counted only while its gate is open; None before any signal has one."""
        scores = []
        series = self.tensors()
        for name, (steps, values) in series.items():
            if not steps.numel() or name not in self.rules:
                continue
            rule = self.rules[name]
            drift, best = drift_from_best(
                values, direction=rule.direction, window=rule.window or self.window,
                warmup=rule.warmup or self.warmup, relative=rule.relative,
            )  # fmt: skip
            if rule.gate is not None:
                is_open = gate_open(
                    steps, best, series.get(rule.gate), window=self.window, slack=rule.slack,
                    direction=rule.gate_direction,
                )  # fmt: skip
                if not bool(is_open[-1]):
                    scores.append(0.0)
                    continue
            score = float(drift[-1]) / rule.threshold
            if rule.noise is not None and rule.noise_z > 0 and rule.noise in series:
                errors = series[rule.noise][1]
                if errors.numel() == values.numel():
                    margin = noise_margin(
                        values, errors, best, direction=rule.direction, window=rule.window or self.window,
                        z=rule.noise_z,
                    )  # fmt: skip
                    score = min(score, float(margin[-1]))
            scores.append(score)
        return max(scores) if scores else None

    def tensors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {
            name: (torch.tensor(steps, dtype=torch.long), torch.tensor(values, dtype=torch.float64))
            for name, (steps, values) in self.series.items()
        }

    def state_dict(self) -> dict:
        state: dict = {"series": {name: [list(s), list(v)] for name, (s, v) in self.series.items()}}
        if self.alarms:
            state["alarms"] = {name: vars(alarm).copy() for name, alarm in self.alarms.items()}
        return state

    def _align(self, noise: str, signal: str, value: float | None = None) -> None:
        """Give the noise series a value at each step of its signal's: ``value`` (a finite number >= 0) at the newest
        step, 0 (no noise floor) at any step without one (a checkpoint of a version that did not record it)."""
        steps, _ = self.series[signal]
        known = dict(zip(*self.series[noise], strict=True))
        if value is not None and math.isfinite(value) and value >= 0 and steps and steps[-1] not in known:
            known[steps[-1]] = float(value)
        self.series[noise] = (list(steps), [known.get(s, 0.0) for s in steps])

    def load_state_dict(self, state: Mapping) -> None:
        series = state.get("series", {})
        if not isinstance(series, Mapping):
            raise ValueError(f"detector state: 'series' must be a mapping, got {type(series).__name__}.")
        for name in self.series:
            steps, values = series.get(name, [[], []])
            if len(steps) != len(values) or not all(math.isfinite(float(v)) for v in values):
                raise ValueError(f"detector state: series {name!r} is damaged (lengths or non-finite values).")
            self.series[name] = ([int(s) for s in steps], [float(v) for v in values])
        for name, rule in self.rules.items():
            if rule.noise:
                self._align(rule.noise, name)
        alarms = dict(state.get("alarms") or {})
        if state.get("alarm"):  # a checkpoint of an earlier version: the first alarm only
            alarms.setdefault(state["alarm"]["signal"], state["alarm"])
        try:
            self.alarms = {name: DriftAlarm(**alarm) for name, alarm in alarms.items() if name in self.rules}
        except TypeError as error:
            raise ValueError(f"detector state: 'alarms' is damaged ({error}).") from error


#: signal -> the config field holding its threshold
THRESHOLD_FIELDS = {
    "length": "collapse_length_rise",
    "prompt_info": "collapse_prompt_info_drop",
    "repetition": "collapse_repetition_rise",
    "audit": "collapse_audit_rise",
    "validation": "collapse_validation_drop",
}


def detector_from_config(args) -> HackDetector | None:
    """The detector ``collapse_detector`` asks for (None when it is ``"none"``): each signal whose threshold field is
    set, ``collapse_detector_window``, ``collapse_detector_warmup``, ``collapse_onset_fraction``."""
    if args.collapse_detector == "none":
        return None
    thresholds = {
        name: getattr(args, field_name)
        for name, field_name in THRESHOLD_FIELDS.items()
        if getattr(args, field_name) is not None
        and (name != "audit" or args.collapse_audit_rewards)
        and (name != "validation" or args.collapse_validation_metric)
    }
    gates = {"validation": 0.0} if "validation" in thresholds else {}
    noise = {"validation": args.collapse_validation_z} if "validation" in thresholds else {}
    if args.collapse_length_info_gate is not None and "length" in thresholds:
        gates["length"] = args.collapse_length_info_gate
    return HackDetector(
        thresholds,
        window=args.collapse_detector_window,
        warmup=args.collapse_detector_warmup,
        onset_fraction=args.collapse_onset_fraction,
        gates=gates,
        noise=noise,
    )


@dataclass
class CollapseEvent:
    """One alarm, as an action sees it: the ``step`` it fired at, the ``onset`` step (the detector's; for the
    threshold alarm the last step it measured without firing, 0 if none: always before ``step``, so a rollback never
    restores the checkpoint saved at the alarm), which ``source`` fired (``"detector"`` or ``"threshold"``) and the
    ``reasons`` in words. A run resumed from a checkpoint saved after an alarm raises it again at its first step, with
    the first alarm's onset and source."""

    step: int
    onset: int
    source: str
    reasons: list[str] = field(default_factory=list)
    #: False for a shape-only alarm the action waits on (logged and warned; ``collapse_shape_acts`` acts on it)
    acts: bool = True


__all__ = [
    "GATES",
    "INDEPENDENT",
    "METRIC_KEYS",
    "NOISE",
    "REACHABLE",
    "SIGNALS",
    "THRESHOLD_FIELDS",
    "CollapseEvent",
    "HackDetector",
    "check_detector_settings",
    "detector_from_config",
    "drift_rules",
]
