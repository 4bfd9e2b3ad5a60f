"""Telling learning from hacking (docs/results.md): each signal family of the hack detector replayed alone and
combined on the hack study's saved runs (benchmarks/hack_study.py), with a PyPI peer (rlwatch 0.5.1, its defaults) and
the detector as shipped before the length gate, on every kind of hack and on the healthy settings whose completions
lengthen because they learn.

    python benchmarks/signal_report.py            # the table (trains nothing)
    python benchmarks/signal_report.py --write    # ... into docs/results.md

Arms (each replays the function the trainer calls on the values the trainer logged):

- ``shape, ungated``: length, prompt information and repetition at the previous defaults (length alarms alone);
- ``shape``: the same with the length signal gated by prompt information (``collapse_length_info_gate``);
- ``audit``: ``audit/disagreement`` alone (the runs' weight-0 audit,
  :func:`grpo_lab.testbeds.audit.tolerant_audit`; runs trained before audits existed have none: "-");
- ``validation``: held-out gold on the validation prompts, measured every 25 steps as an evaluation would, gated by
  the training reward (``collapse_validation_metric``);
- ``all``: shape + audit + validation, as a user with an audit and validation prompts runs it (any alarm: what is
  logged and warned);
- ``acting``: what ``collapse_action`` acts on at the shipped defaults (``collapse_shape_acts`` False): the first
  audit or validation alarm, rolled back to the earliest onset of every alarm so far (a shape alarm before it only
  warned);
- ``rlwatch``: rlwatch's ``DetectorSuite`` at its defaults fed what its TRL callback reads from the logs (entropy, kl,
  reward, reward_std), any alert (its reward-hacking detectors alone: ``rlwatch, hacking``).

Per setting: recall (hacked vanilla runs alarmed), alarm - gold's peak (median, range), false alarms (runs that held
gold: every run of a healthy setting, and the tool / clean runs of the hacked settings that held it), and the gold a
rollback to the onset keeps: of the hacked runs' best checkpoint, and of the healthy runs' final gold. All numbers on
the test prompts; the settings were chosen on validation prompts of length_bias and keyword_bias (docs/results.md).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import hack_report as hr  # noqa: E402
import hack_study as hs  # noqa: E402

from trl_grpo_ext.core.hack_detection import drift_alarm, trailing_mean  # noqa: E402
from trl_grpo_ext.detector import GATES, SIGNALS, drift_rules  # noqa: E402

HACKED = ("length_bias", "keyword_bias", "round_bias", "restate_bias", "carry_bias", "hedge_bias")
HEALTHY = ("scratchpad", "terse", "gym_chain_sum")
VALIDATION_EVERY = 25
#: the validation prompts of each setting (the held-out half the study evaluated every 25 steps, 8 samples each)
VALIDATION_PROMPTS = {name: 91 for name in (*HACKED, *HEALTHY)} | {"gym_chain_sum": 20}


def settings() -> dict:
    """The shipped detector fields (GRPOExtConfig's defaults): the shape detector's (hack_report) and the audit's and
    validation's thresholds."""
    import dataclasses

    from trl_grpo_ext import GRPOExtConfig

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOExtConfig)}
    return {
        **hr.shipped_settings(),
        "audit": defaults["collapse_audit_rise"],
        "validation": defaults["collapse_validation_drop"],
        "validation_z": defaults["collapse_validation_z"],
    }


def series(run: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Every signal of a run as the trainer fed it; validation gold from the held-out checkpoints (step > 0)."""
    out = {}
    for name, (key, _, _) in SIGNALS.items():
        points = sorted((int(s), v[key]) for s, v in run["steps_log"].items() if key in v)
        if points:
            out[name] = (
                torch.tensor([p[0] for p in points]),
                torch.tensor([p[1] for p in points], dtype=torch.float64),
            )
    gold = sorted((int(s), r["validation"]["gold"]) for s, r in run["heldout"].items() if int(s) > 0)
    steps = torch.tensor([p[0] for p in gold])
    out["validation"] = (steps, torch.tensor([p[1] for p in gold], dtype=torch.float64))
    # each evaluation's standard error, as the monitor computes it (the reward's standard deviation over the
    # evaluation's completions, / sqrt(completions)); gold is 0 / 1 per completion, so its deviation is sqrt(p (1 - p))
    samples = VALIDATION_PROMPTS[run["testbed"]] * hs.EVAL_SAMPLES
    out["validation_se"] = (steps, torch.tensor([math.sqrt(p[1] * (1 - p[1]) / samples) for p in gold]))
    # the audit's stricter reads (core.hack_detection.audit_inversion, audit_overpaid), logged by runs trained since
    # each existed
    for name, key in STRICTER.values():
        points = sorted((int(s), v[key]) for s, v in run["steps_log"].items() if key in v)
        if points:
            out[name] = (
                torch.tensor([p[0] for p in points]),
                torch.tensor([p[1] for p in points], dtype=torch.float64),
            )
    return out


#: The audit's stricter reads, each replayed with the audit's own rule in its place: arm -> (series, logged metric).
#: ``audit/inversion``: what an audit refuses and the reward pays at least as much as all its group's accepted
#: completions; ``audit/overpaid``: what it refuses and the reward pays at least the median of the batch's favoured
#: accepted ones.
STRICTER = {
    "audit, inversion": ("audit_inversion", "audit/inversion"),
    "audit, overpaid": ("audit_overpaid", "audit/overpaid"),
}


ARMS = {
    "shape, ungated": (("length", "prompt_info", "repetition"), False),
    "shape": (("length", "prompt_info", "repetition"), True),
    "audit": (("audit",), True),
    "validation": (("validation",), True),
    "all": (("length", "prompt_info", "repetition", "audit", "validation"), True),
}


def replay(run: dict, arm: str, s: dict):
    """The arm's first alarm on ``run`` (an object with ``step`` and ``onset``), or None; ``"missing"`` when the run
    lacks every signal the arm reads."""
    if arm.startswith("rlwatch"):
        return rlwatch_alarm(run, hacking_only=arm == "rlwatch, hacking")
    if arm == "acting":
        return acting_alarm(run, s)
    if arm in STRICTER:
        data = run.setdefault("_signals", series(run))
        name = STRICTER[arm][0]
        if name not in data or s.get("audit") is None:
            return "missing"
        rules = drift_rules({"audit": s["audit"]})
        return drift_alarm({"audit": data[name]}, rules, window=s["window"], warmup=s["warmup"],
                           onset_fraction=s["onset"])  # fmt: skip
    names, gated = ARMS[arm]
    data = run.setdefault("_signals", series(run))
    thresholds = {n: s[n] for n in names if n in data and s.get(n) is not None}
    if not thresholds:
        return "missing"
    gates = {}
    if gated and "length" in thresholds and s["gate"] is not None:
        gates["length"] = s["gate"]
    noise = {}
    if "validation" in thresholds:
        gates["validation"] = 0.0
        noise["validation"] = s["validation_z"]
    rules = drift_rules(thresholds, gates, noise)
    return drift_alarm(data, rules, window=s["window"], warmup=s["warmup"], onset_fraction=s["onset"])


def acting_alarm(run: dict, s: dict):
    """The first alarm of an independent signal (audit, validation), with the earliest onset of every signal's alarm
    up to it (as :meth:`trl_grpo_ext.callbacks.CollapseMonitor._detector_event` acts)."""
    every = {name: replay(run, name_arm, s) for name, name_arm in (("audit", "audit"), ("validation", "validation"))}
    independent = [a for a in every.values() if a not in (None, "missing")]
    if not independent:
        return "missing" if all(a == "missing" for a in every.values()) else None
    first = min(independent, key=lambda a: a.step)
    data = run.setdefault("_signals", series(run))
    onsets = [first.onset]
    for name in ("length", "prompt_info", "repetition"):
        if name not in data or s.get(name) is None:
            continue
        gates = {"length": s["gate"]} if name == "length" and s["gate"] is not None else {}
        shape = drift_alarm(data, drift_rules({name: s[name]}, gates), window=s["window"], warmup=s["warmup"],
                            onset_fraction=s["onset"])  # fmt: skip
        if shape is not None and shape.step <= first.step:
            onsets.append(shape.onset)
    alarm = _Alarm(first.step)
    alarm.onset = min(onsets)
    return alarm


class _Alarm:
    def __init__(self, step: int):
        self.step = self.onset = step


def rlwatch_alarm(run: dict, *, hacking_only: bool):
    from rlwatch.config import RLWatchConfig
    from rlwatch.detectors import DetectorSuite

    suite = DetectorSuite(RLWatchConfig())
    for step, values in sorted(run["steps_log"].items(), key=lambda item: int(item[0])):
        alerts = suite.check_step(
            int(step), entropy=values.get("entropy"), kl_divergence=values.get("kl"),
            reward_mean=values.get("reward"), reward_std=values.get("reward_std"),
        )  # fmt: skip
        if hacking_only:
            alerts = [a for a in alerts if a.detector in ("reward_hacking", "reward_mean_drift")]
        if alerts:
            alarm = _Alarm(int(step))
            alarm.onset = max(0, int(step) - 1)  # rlwatch reports no onset: the step before
            return alarm
    return None


def kept(run: dict, alarm, *, healthy: bool) -> float:
    """Held-out test gold a rollback to the onset's checkpoint keeps: of the run's best checkpoint (hacked runs) or of
    its final gold (healthy runs, where a false alarm throws learning away); 1.0 without an alarm on a healthy run."""
    gold = hr.heldout(run, "test")
    final, best = gold[max(gold)], max(gold.values())
    if alarm is None:
        return 1.0 if healthy else final / best
    back = hr.rollback_gold(run, alarm.onset, "test")
    return back / (final if healthy else best) if (final if healthy else best) > 0 else 1.0


def table(runs, s: dict) -> list[str]:
    lines = [
        "| setting | arm | recall (hacked vanilla runs; rate [95% CI, clustered by warm start]) | alarm - gold's peak: "
        "median (range) | false alarms (held gold; rate [95% CI]) | kept by rollback: mean (min) |",
        "|---|---|---|---|---|---|",
    ]
    arms = [*ARMS, *STRICTER, "acting", "rlwatch", "rlwatch, hacking"]
    for setting in (*HACKED, *HEALTHY):
        healthy = setting in HEALTHY
        arms_runs = {arm: runs.get((setting, arm), {}) for arm in hr.ARMS}
        if not any(arms_runs.values()):
            continue
        for arm in arms:
            # per warm start (the cluster of hack_report.rate_line's bootstrap interval)
            hits: dict[int, list[float]] = {}
            falses: dict[int, list[float]] = {}
            lags, keeps, missing = [], [], 0
            for study_arm, group in arms_runs.items():
                for (warm_start, _), run in group.items():
                    alarm = replay(run, arm, s)
                    if alarm == "missing":
                        missing += 1
                        continue
                    outcome = hr.outcome(run, "test")
                    if not healthy and study_arm == "vanilla" and outcome == "hacked":
                        hits.setdefault(warm_start, []).append(float(alarm is not None))
                        if alarm is not None:
                            lags.append(alarm.step - hr.peak_and_halving(run)[0])
                        keeps.append(kept(run, alarm, healthy=False))
                    elif outcome == "held" or healthy:
                        falses.setdefault(warm_start, []).append(float(alarm is not None))
                        if healthy:
                            keeps.append(kept(run, alarm, healthy=True))
            if not hits and not falses:
                continue
            if arm in STRICTER and missing:
                continue  # a setting only some of whose runs log it: the sweep table counts them
            recall, lag, false = hr.rate_line(hits), hr.lag_line(lags), hr.rate_line(falses)
            keep = f"{statistics.fmean(keeps):.0%} ({min(keeps):.0%})" if keeps else "-"
            note = f" ({missing} runs without the signal)" if missing else ""
            lines.append(
                f"| {setting}{' (healthy)' if healthy else ''} | {arm}{note} | {recall} | {lag} | {false} | {keep} |"
            )
    return lines


#: The actions that train on, trained for real (benchmarks/hack_study.py --arms screen,rollback_screen).
ACTING_ARMS = ("screen", "rollback_screen")


def acting_lines(runs) -> list[str]:
    """Held-out test gold at the end of the runs trained with an action that goes on training, against vanilla's run
    of the same (warm start, seed): on a hacked setting against its best checkpoint (what a user would want to keep)
    beside the clean-reward run's final gold (trained on gold: the ceiling), on a healthy one against its final gold
    (what a false alarm must not cost)."""
    lines = [
        "| setting | arm | runs | acted in | final test gold: mean (min) | vanilla's final | vanilla's best | "
        "clean reward's final | kept: of vanilla's best (hacked) or final (healthy), mean (min) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def final_gold(run: dict) -> float:
        gold = hr.heldout(run, "test")
        return (run.get("final_heldout") or {}).get("test", {}).get("gold", gold[max(gold)])

    for setting in (*HACKED, *HEALTHY):
        healthy = setting in HEALTHY
        clean = [final_gold(r) for r in runs.get((setting, "clean"), {}).values()]
        for arm in ACTING_ARMS:
            rows = []
            for key, run in sorted(runs.get((setting, arm), {}).items()):
                vanilla = runs.get((setting, "vanilla"), {}).get(key)
                if vanilla is None:
                    continue
                theirs = hr.heldout(vanilla, "test")
                acted = run.get("screening", False) or run.get("continued_from") is not None
                rows.append((final_gold(run), theirs[max(theirs)], max(theirs.values()), acted))
            if not rows:
                continue
            finals, last, best = ([r[i] for r in rows] for i in range(3))
            kept = [f / (v if healthy else b) for f, v, b, _ in rows if (v if healthy else b) > 0]
            ceiling = f"{statistics.fmean(clean):.3f}" if clean and not healthy else "-"
            lines.append(
                f"| {setting}{' (healthy)' if healthy else ''} | {arm} | {len(rows)} | {sum(r[3] for r in rows)} | "
                f"{statistics.fmean(finals):.3f} ({min(finals):.3f}) | {statistics.fmean(last):.3f} | "
                f"{statistics.fmean(best):.3f} | {ceiling} | {statistics.fmean(kept):.0%} ({min(kept):.0%}) |"
            )
    return lines if len(lines) > 2 else []


#: Noise floors of validation gold (``collapse_validation_z``) replayed side by side.
VALIDATION_ZS = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)


def validation_z_table(runs, s: dict) -> list[str]:
    """Validation gold alone, and the acting rule, at each noise floor: hacked vanilla runs alarmed, the median lag
    after gold's peak, and false alarms on the runs that held gold (healthy settings apart)."""
    lines = [
        "| collapse_validation_z | validation: recall (hacked) | median lag | false alarms: hacked settings' runs that "
        "held gold | scratchpad | terse | gym_chain_sum | acting: false alarms, gym_chain_sum |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for z in VALIDATION_ZS:
        at = {**s, "validation_z": z}
        hits = total = held_false = held = 0
        lags = []
        healthy = {name: [0, 0] for name in HEALTHY}
        acting = [0, 0]
        for setting in (*HACKED, *HEALTHY):
            for study_arm in hr.ARMS:
                for run in runs.get((setting, study_arm), {}).values():
                    alarm = replay(run, "validation", at)
                    outcome = hr.outcome(run, "test")
                    if setting in HEALTHY:
                        healthy[setting][0] += alarm is not None
                        healthy[setting][1] += 1
                        if setting == "gym_chain_sum":
                            acting[0] += replay(run, "acting", at) not in (None, "missing")
                            acting[1] += 1
                    elif study_arm == "vanilla" and outcome == "hacked":
                        total += 1
                        hits += alarm is not None
                        if alarm is not None:
                            lags.append(alarm.step - hr.peak_and_halving(run)[0])
                    elif outcome == "held":
                        held += 1
                        held_false += alarm is not None
        lag = f"+{statistics.median(lags):.0f}" if lags else "-"
        cells = " | ".join(f"{a}/{n}" for a, n in healthy.values())
        lines.append(f"| {z:g} | {hits}/{total} | {lag} | {held_false}/{held} | {cells} | {acting[0]}/{acting[1]} |")
    return lines


#: The audit's rise (``collapse_audit_rise``) and the detector's window (``collapse_detector_window``) replayed: how
#: early the audit can alarm, and what it costs in false alarms. A sweep to read, not a choice.
AUDIT_RISES = (0.08, 0.1, 0.15, 0.2)
AUDIT_WINDOWS = (2, 3, 4, 8)


def _sweep_header(first: str, second: str) -> list[str]:
    return [
        f"| {first} | {second} | median alarm - gold's peak: "
        + ", ".join(HACKED)
        + " | false alarms: hacked settings' runs that held gold | "
        + " | ".join(HEALTHY)
        + " |",
        "|---|---|---|---|" + "---|" * len(HEALTHY),
    ]


def _sweep_cells(runs, alarm_step) -> str:
    """One row's cells: ``alarm_step(run)`` (the step of a run's alarm, None, or ``"missing"`` when the run lacks the
    signal) over every run: the median lag after gold's peak on each kind of hack [alarmed / hacked vanilla runs], and
    the false alarms on the runs that held gold (hacked settings, every arm) and on each healthy setting. Runs without
    the signal are left out of every count."""
    lags: dict[str, list[int]] = {name: [] for name in HACKED}
    hacked = dict.fromkeys(HACKED, 0)
    false = {name: [0, 0] for name in ("held", *HEALTHY)}
    for setting in (*HACKED, *HEALTHY):
        for study_arm in hr.ARMS:
            for run in runs.get((setting, study_arm), {}).values():
                step = alarm_step(run)
                if step == "missing":
                    continue
                outcome = "held" if setting in HEALTHY else hr.outcome(run, "test")
                if setting in HACKED and study_arm == "vanilla" and outcome == "hacked":
                    hacked[setting] += 1
                    if step is not None:
                        lags[setting].append(step - hr.peak_and_halving(run)[0])
                elif outcome == "held":
                    pool = false[setting if setting in HEALTHY else "held"]
                    pool[0] += step is not None
                    pool[1] += 1
    medians = ", ".join(
        (f"{statistics.median(lags[name]):+.0f}" if lags[name] else "-") + f" [{len(lags[name])}/{hacked[name]}]"
        for name in HACKED
    )
    return f"{medians} | " + " | ".join(f"{a}/{n}" for a, n in false.values())


def audit_rise_table(runs, s: dict, arm: str = "audit") -> list[str]:
    """The audit alone (``arm``: ``"audit"`` reads ``audit/disagreement``, an arm of :data:`STRICTER` its metric)
    at each (rise, window), in :func:`_sweep_cells`' columns."""
    lines = _sweep_header("collapse_audit_rise", "collapse_detector_window")
    for rise in AUDIT_RISES:
        for window in AUDIT_WINDOWS:
            at = {**s, "audit": rise, "window": window}

            def step(run, at=at):
                alarm = replay(run, arm, at)
                return alarm if alarm in ("missing", None) else alarm.step

            lines.append(f"| {rise:g} | {window} | {_sweep_cells(runs, step)} |")
    return lines


#: The CUSUM read of the audit (Page 1954): slack k and limit h, in disagreement units.
CUSUM_SLACKS = (0.02, 0.04, 0.06)
CUSUM_LIMITS = (0.15, 0.25, 0.4, 0.6)
#: Measurements the CUSUM's reference (the lowest trailing mean so far) averages.
CUSUM_REFERENCE = 8


def cusum_alarm(steps: torch.Tensor, values: torch.Tensor, *, slack: float, limit: float) -> int | None:
    """The step at which Page's one-sided CUSUM of ``values`` (the audit disagreement, one per measurement) first
    reaches ``limit``: S_t = max(0, S_{t-1} + x_t - b_t - slack), with b_t the lowest trailing mean of
    :data:`CUSUM_REFERENCE` measurements so far (the run's healthiest level: the detector's drawdown reference, as no
    pre-change mean is known), from the :data:`CUSUM_REFERENCE`-th measurement on; None if it never does. A persistent
    rise accumulates, a lone spike does not: the change detector a reader would try before a threshold on a
    trailing mean."""
    reference = torch.cummin(trailing_mean(values, window=CUSUM_REFERENCE), dim=0).values  # (T,)
    total = 0.0
    for t in range(CUSUM_REFERENCE - 1, values.numel()):
        total = max(0.0, total + float(values[t] - reference[t]) - slack)
        if total >= limit:
            return int(steps[t])
    return None


def audit_cusum_table(runs) -> list[str]:
    """The audit (``audit/disagreement``) read by :func:`cusum_alarm` at each (slack, limit), in
    :func:`_sweep_cells`' columns."""
    lines = _sweep_header("slack k", "limit h")
    for slack in CUSUM_SLACKS:
        for limit in CUSUM_LIMITS:

            def step(run, slack=slack, limit=limit):
                data = run.setdefault("_signals", series(run))
                return cusum_alarm(*data["audit"], slack=slack, limit=limit) if "audit" in data else "missing"

            lines.append(f"| {slack:g} | {limit:g} | {_sweep_cells(runs, step)} |")
    return lines


#: Relative rises of the entropy alarm (``collapse_entropy_rise``) replayed for false alarms.
ENTROPY_RISES = (0.25, 0.5, 1.0)


def entropy_rise_table(runs) -> list[str]:
    """The entropy-rise alarm replayed on every saved run (TRL's logged ``entropy``, the value the monitor's
    ``entropy/mean`` measures): how far entropy climbed above its first measurement, and the runs each relative rise
    would alarm: false alarms (runs of a healthy setting, and runs that held gold) apart from alarms in hacked runs
    (runs that partly hacked are in neither)."""
    lines = [
        "| setting | runs | highest entropy / first: median (max) | "
        + " | ".join(f"rise {r:g}: false alarms, hacked runs alarmed" for r in ENTROPY_RISES)
        + " |",
        "|---|---|---|" + "---|" * len(ENTROPY_RISES),
    ]
    for setting in (*HACKED, *HEALTHY):
        ratios, held, hacked = [], [], []
        for arm in hr.ARMS:
            for run in runs.get((setting, arm), {}).values():
                entropy = [v["entropy"] for _, v in sorted(run["steps_log"].items(), key=lambda kv: int(kv[0]))
                           if "entropy" in v]  # fmt: skip
                if not entropy or entropy[0] <= 0:
                    continue
                ratio = max(entropy) / entropy[0]
                ratios.append(ratio)
                outcome = "held" if setting in HEALTHY else hr.outcome(run, "test")
                {"held": held, "hacked": hacked}.get(outcome, []).append(ratio)
        if not ratios:
            continue
        cells = " | ".join(
            f"{sum(r > 1 + rise for r in held)}/{len(held)}, {sum(r > 1 + rise for r in hacked)}/{len(hacked)}"
            if hacked
            else f"{sum(r > 1 + rise for r in held)}/{len(held)}"
            for rise in ENTROPY_RISES
        )
        lines.append(
            f"| {setting}{' (healthy)' if setting in HEALTHY else ''} | {len(ratios)} | "
            f"{statistics.median(ratios):.2f} ({max(ratios):.2f}) | {cells} |"
        )
    return lines


def report(out: Path) -> str:
    runs = hr.load(out)
    s = settings()
    shown = {k: v for k, v in s.items()}
    return "\n".join(
        [
            f"Shipped detector settings: {shown}; gates: {GATES}.",
            "",
            *table(runs, s),
            "",
            "Validation gold's noise floor (`collapse_validation_z`: a drop must also exceed this many standard errors "
            "of the difference from the best evaluation; each evaluation's from its gold and its 91 or 20 prompts x 8 "
            "samples) replayed at several values, the rest as shipped:",
            "",
            *validation_z_table(runs, s),
            "",
            "The audit's rise and the detector's window replayed (`collapse_audit_rise` x `collapse_detector_window`, "
            "the audit alone; shipped: 0.2 and 2; [hacked vanilla runs alarmed / hacked]), a sweep to read, not a "
            "choice:",
            "",
            *audit_rise_table(runs, s),
            "",
            "The same for the audit's stricter read, `audit/inversion` (an audit-refused completion counts only where "
            "the reward pays it at least as much as every completion of its group the audit accepts), on the runs "
            "that log it (trained since it exists: the reasoning-gym, hedging and round-answer settings, a warm start "
            "of two others):",
            "",
            *audit_rise_table(runs, s, arm="audit, inversion"),
            "",
            "The same for `audit/overpaid` (an audit-refused completion counts only where the reward pays it at least "
            "the median of the batch's favoured completions the audit accepts, wherever it stands in its group), on "
            "the runs that log it (the vanilla runs of six settings, retrained with it):",
            "",
            *audit_rise_table(runs, s, arm="audit, overpaid"),
            "",
            "The audit read by a CUSUM instead (Page 1954: S_t = max(0, S_{t-1} + x_t - b_t - k), alarm at S_t >= h, "
            f"b_t the lowest trailing mean of {CUSUM_REFERENCE} measurements so far), a sweep to read, not a choice: "
            "a persistent rise accumulates where a lone spike does not, the change detector one would try before a "
            "threshold on a trailing mean:",
            "",
            *audit_cusum_table(runs),
            "",
            *(
                [
                    "The actions that go on training, trained for real at the shipped acting rule (the audit here; "
                    "`python benchmarks/hack_study.py --arms screen,rollback_screen`): `screen` from the alarm on, "
                    "`rollback_screen` (`collapse_action: rollback`, `collapse_rollback_then: screen`) restoring the "
                    "onset's checkpoint at once and screening to the end. *Acted in*: runs whose action fired.",
                    "",
                    *acting,
                    "",
                ]
                if (acting := acting_lines(runs))
                else []
            ),
            "The entropy-rise alarm (`collapse_entropy_rise`) replayed on the same runs, every arm: false alarms "
            "(healthy runs and runs that held gold) and hacked runs alarmed (no setting here makes entropy explode; "
            "hedged answers raise it a little):",
            "",
            *entropy_rise_table(runs),
        ]
    )


START, END = "<!-- signal families: benchmarks/signal_report.py --write -->", "<!-- /signal families -->"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "evidence"))
    parser.add_argument("--write", action="store_true", help="rewrite the block of docs/results.md")
    args = parser.parse_args(argv)
    text = report(Path(args.out))
    if args.write:
        results = ROOT / "docs" / "results.md"
        page = results.read_text()
        if START not in page:
            raise SystemExit(f"{results} lacks the markers {START} ... {END}")
        head, rest = page.split(START, 1)
        _, tail = rest.split(END, 1)
        results.write_text(f"{head}{START}\n{text}\n{END}{tail}")
    print(text)


if __name__ == "__main__":
    main()
