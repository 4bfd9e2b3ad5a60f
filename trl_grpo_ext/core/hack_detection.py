"""A gold-free reward-hack detector: drift of the completions' shape away from the run's healthiest point.

Notation:
    T: measurements of one signal so far (one per training generation batch; a step that reuses its batch adds
        none); x_t their values, s_t the optimizer steps they were measured at.
    m_t: the trailing mean of the last ``window`` values (fewer at the start).
    d: +1 when the signal rises under a hack (completion length, repetition), -1 when it falls (prompt information).

The rule (docs/monitoring.md, "The hack detector"): a reward hack is a behaviour the reward pays for that does not
serve the task, spreading through the batch; while it spreads, the completions' *shape* moves the way learning the
task does not move it. Learning the task makes completions agree on each prompt's answer and drop what the prompt did
not ask for: lengths settle or shrink, nothing repeats, and the completions say more about their prompts. A hack makes
them longer (padding, a keyword, a template), more repetitive, or less about the prompt (shared text, or different
prompts answered alike: :func:`trl_grpo_ext.core.diversity.prompt_information`). For each such signal the detector
tracks the run's best value of ``d * m_t`` so far (from ``warmup`` measurements on) and its drift from it,

    drift_t = d * m_t - min_{warmup <= u <= t} d * m_u                 (absolute), or
    drift_t = (d * m_t - min_u d * m_u) / |min_u d * m_u|             (relative),

and alarms at the first measurement where a signal's drift reaches its threshold. The *onset* it reports is the step
of the last measurement before the alarm whose drift was at most ``onset_fraction`` of the threshold (0: the best
value's step): where the run was still within that much of its healthiest shape, what a rollback returns to.
Signals that move the same way when a run learns (entropy and Distinct-N fall, KL to the reference grows) cannot tell
learning from a hack, and are not used. The thresholds were chosen on validation runs (docs/results.md).

No paper proposes this rule: it is this project's, measured in docs/results.md ("Detecting a hack while it starts").
A drift from the running best is a drawdown, the statistic of one-sided change detection without a known baseline
(compare Page 1954's CUSUM, which needs the pre-change mean this detector does not assume).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch


@dataclass(frozen=True)
class DriftRule:
    """How one signal is read: ``direction`` +1 if it rises under a hack, -1 if it falls; ``threshold`` the drift
    from its best value that alarms; ``relative``: drift as a fraction of the best value (else in the signal's
    units). ``gate`` / ``gate_direction`` / ``slack``: the name of another signal that must not have moved the way
    ``gate_direction`` says since this signal's best point: a measurement may alarm only while
    ``gate_direction * (g_now - g_best) <= slack * |g_best|`` (trailing means). ``gate_direction`` +1: the gate must
    not have risen (length is read only while prompt information has not risen: completions that lengthen because the
    run learns say more about their prompts; padding, a keyword or a template say less); -1: it must not have fallen
    (held-out gold is read only while the training reward has not fallen: a hack raises the reward it games).
    ``window`` / ``warmup``: this signal's own, in place of :func:`drift_alarm`'s (None: those); a signal measured
    rarely and already averaged (held-out gold at each evaluation) is read one measurement at a time. ``noise`` /
    ``noise_z``: the name of a series holding each measurement's standard error (aligned with the signal's); a
    measurement may alarm only while its gap from the best point is at least ``noise_z`` standard errors of that
    difference (:func:`noise_margin`): a mean over few held-out prompts moves by its sampling noise alone."""

    direction: Literal[1, -1]
    threshold: float
    relative: bool
    gate: str | None = None
    gate_direction: Literal[1, -1] = 1
    slack: float = 0.0
    window: int | None = None
    warmup: int | None = None
    noise: str | None = None
    noise_z: float = 0.0


@dataclass(frozen=True)
class DriftAlarm:
    """The detector's first alarm: the ``step`` it fired at, the ``onset`` step (see :func:`drift_alarm`), the
    ``signal`` that fired and its ``drift`` there."""

    step: int
    onset: int
    signal: str
    drift: float


def trailing_mean(values: torch.Tensor, *, window: int) -> torch.Tensor:
    """Mean of the last ``window`` values at each point (of the first t + 1 values while t + 1 < window). (T,) ->
    (T,), float64."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}.")
    values = values.double()  # (T,)
    sums = torch.cat([values.new_zeros(1), values.cumsum(0)])  # (T + 1,)
    ends = torch.arange(1, values.numel() + 1)  # (T,)
    starts = (ends - window).clamp(min=0)  # (T,)
    return (sums[ends] - sums[starts]) / (ends - starts)


def drift_from_best(
    values: torch.Tensor, *, direction: int, window: int, warmup: int, relative: bool, floor: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """The drift of a signal from its best point so far, and the index of that point.

    ``values`` (T,): the signal's measurements in order. ``direction``: +1 if a hack raises it, -1 if it lowers it.
    The best point is the smallest ``direction * trailing_mean`` from index ``warmup - 1`` on (the first trailing mean
    that averages ``warmup`` measurements, or all of them); before it the drift is 0 and the best index is the point
    itself. ``relative``: divide by the best value's magnitude (at least ``floor``). Returns ``(drift (T,), best (T,)
    long)``.
    """
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}.")
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1, got {warmup}.")
    count = values.numel()
    drift = torch.zeros(count, dtype=torch.float64)  # (T,)
    best = torch.arange(count)  # (T,)
    first = warmup - 1
    if count <= first:
        return drift, best
    shaped = direction * trailing_mean(values, window=window)[first:]  # (T - first,)
    lowest, where = torch.cummin(shaped, dim=0)  # (T - first,) twice
    gap = shaped - lowest
    if relative:
        gap = gap / lowest.abs().clamp(min=floor)
    drift[first:] = gap
    best[first:] = where + first
    return drift, best


def noise_margin(
    values: torch.Tensor, errors: torch.Tensor, best: torch.Tensor, *, direction: int, window: int, z: float
) -> torch.Tensor:
    """How far past its noise floor a signal's gap from its best point is, at each measurement. (T,) -> (T,) float64.

    ``values`` (T,) the measurements, ``errors`` (T,) their standard errors, ``best`` (T,) the index of the best
    point at each measurement (:func:`drift_from_best`). With m_t the trailing mean of ``window`` values and
    e_t^2 = mean(se^2 over the same values) / n_t its squared standard error (n_t values, independent), the gap
    g_t = d * (m_t - m_b) and the floor f_t = z * sqrt(e_t^2 + e_b^2) (the standard error of a difference of two
    independent means, b the best index): returns g_t / f_t (+inf where f_t is 0 and g_t > 0, 0 where both are).
    A ratio >= 1 is a gap of at least ``z`` standard errors: a two-sample z-test's, read one-sided."""
    shaped = direction * trailing_mean(values, window=window)  # (T,)
    gap = shaped - shaped[best]  # (T,)
    counts = torch.arange(1, values.numel() + 1, dtype=torch.float64).clamp(max=window)  # (T,)
    squared = trailing_mean(errors.double() ** 2, window=window) / counts  # (T,)
    floor = z * torch.sqrt(squared + squared[best])  # (T,)
    ratio = gap / floor.clamp(min=torch.finfo(torch.float64).tiny)  # (T,)
    return torch.where(floor > 0, ratio, torch.where(gap > 0, torch.inf, 0.0))


def drift_alarm(
    series: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    rules: Mapping[str, DriftRule],
    *,
    window: int,
    warmup: int,
    onset_fraction: float = 0.0,
) -> DriftAlarm | None:
    """The first alarm over several signals, or None.

    ``series``: signal name -> (steps (T,), values (T,)) of its measurements, steps increasing; a signal without a
    rule is ignored, a rule without a series waits. Each signal is read by :func:`drift_from_best`; the alarm is the
    earliest step at which any signal's drift reaches its rule's threshold (ties: the signal first in ``rules``). Its
    onset: the step of the last measurement up to the alarm whose drift is at most ``onset_fraction`` x the
    threshold (0: the best point's). Non-finite values are refused (the caller skips them before they reach a series).
    """
    if not 0.0 <= onset_fraction < 1.0:
        raise ValueError(f"onset_fraction must lie in [0, 1), got {onset_fraction}.")
    found: DriftAlarm | None = None
    for name, rule in rules.items():
        if name not in series:
            continue
        steps, values = series[name]
        if steps.numel() != values.numel():
            raise ValueError(f"series {name!r}: {steps.numel()} steps but {values.numel()} values.")
        if values.numel() and not bool(torch.isfinite(values).all()):
            raise ValueError(f"series {name!r} holds a non-finite value; skip those before they reach the detector.")
        own_window, own_warmup = rule.window or window, rule.warmup or warmup
        drift, best = drift_from_best(
            values, direction=rule.direction, window=own_window, warmup=own_warmup, relative=rule.relative
        )
        reached = drift >= rule.threshold  # (T,)
        if rule.noise is not None and rule.noise_z > 0 and rule.noise in series:
            reached &= _past_noise(name, rule, series, values, best, window=own_window) >= 1.0
        if rule.gate is not None:
            reached &= gate_open(
                steps, best, series.get(rule.gate), window=window, slack=rule.slack, direction=rule.gate_direction
            )
        hits = reached.nonzero()
        if not hits.numel():
            continue
        index = int(hits[0])
        step = int(steps[index])
        if found is None or step < found.step:
            # the best point (drift 0) is among them, so the last is at or after it
            calm = (drift[: index + 1] <= onset_fraction * rule.threshold).nonzero()
            onset = int(steps[int(calm[-1])])
            found = DriftAlarm(step=step, onset=onset, signal=name, drift=float(drift[index]))
    return found


def _past_noise(name: str, rule: DriftRule, series, values, best, *, window: int) -> torch.Tensor:
    noise_steps, errors = series[rule.noise]
    if not torch.equal(noise_steps, series[name][0]):
        raise ValueError(
            f"series {rule.noise!r} (the standard errors of {name!r}) must hold a value at each of its steps."
        )
    return noise_margin(values, errors, best, direction=rule.direction, window=window, z=rule.noise_z)


def gate_open(
    steps: torch.Tensor,
    best: torch.Tensor,
    gate: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    window: int,
    slack: float,
    direction: int = 1,
) -> torch.Tensor:
    """(T,) bool: where ``direction * (g_now - g_best) <= slack * |g_best|``, g the gate signal's trailing mean (its
    latest measurement at or before each step, and at the step of the gated signal's best point). No gate measurement
    yet: closed (the gated signal waits for its gate)."""
    if gate is None or not gate[0].numel():
        return torch.zeros(steps.numel(), dtype=torch.bool)
    gate_steps, gate_values = gate
    means = trailing_mean(gate_values, window=window)  # (G,)
    now = torch.searchsorted(gate_steps, steps, right=True) - 1  # (T,) latest gate index at or before each step
    then = torch.searchsorted(gate_steps, steps[best], right=True) - 1  # (T,) ... at the best point's step
    known = (now >= 0) & (then >= 0)
    at_best = means[then.clamp(min=0)]
    moved = direction * (means[now.clamp(min=0)] - at_best)
    return known & (moved <= slack * at_best.abs())


def _favoured(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rewards`` (N,) in consecutive groups -> ``(grouped (P, G) float64, favoured (P, G) bool)``: a completion is
    favoured when its reward is above its group's mean over the scored (non-NaN) rewards."""
    grouped = rewards.double().view(-1, group_size)  # (P, G)
    scored = ~torch.isnan(grouped)
    counts = scored.sum(1, keepdim=True).clamp(min=1)
    means = torch.where(scored, grouped, torch.zeros_like(grouped)).sum(1, keepdim=True) / counts  # (P, 1)
    return grouped, scored & (grouped > means)  # NaN compares False


def _check_audit_shapes(rewards: torch.Tensor, audits: torch.Tensor, group_size: int) -> None:
    if rewards.dim() != 1 or audits.dim() != 2 or audits.size(0) != rewards.numel():
        raise ValueError(
            f"rewards must be (N,) and audits (N, A); got {tuple(rewards.shape)} and {tuple(audits.shape)}."
        )
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}.")


def audit_disagreement(
    *, rewards: torch.Tensor, audits: torch.Tensor, group_size: int, threshold: float
) -> tuple[torch.Tensor, float]:
    """Where an audit disagrees with the training reward, and how often.

    ``rewards`` (N,): the training reward of N completions in consecutive groups of ``group_size`` (NaN: unscored);
    ``audits`` (N, A): the scores of A audit rewards (computed and logged, never trained on; NaN: unscored). A
    completion is *favoured* when its training reward is above its group's mean (its GRPO advantage is positive: the
    update makes it likelier), and *flagged* when it is favoured and some audit scores it below ``threshold``.
    Returns ``(flagged (N,) bool, rate)``: rate = flagged / favoured over the batch (NaN when nothing is favoured).
    A hack spreading through the batch raises the rate: the completions the policy is pushed toward are the ones the
    audit refuses; an audit's own blind spot adds a level that stays (the detector reads its rise, not its level).
    No paper: this project's signal, measured in docs/results.md ("Telling learning from hacking").
    """
    _check_audit_shapes(rewards, audits, group_size)
    _, favoured = _favoured(rewards, group_size)  # (P, G)
    failed = (audits < threshold).any(dim=1)  # (N,) NaN audits compare False: not failed
    flagged = favoured.view(-1) & failed
    total = int(favoured.sum())
    return flagged, (int(flagged.sum()) / total if total else float("nan"))


def audit_inversion(
    *, rewards: torch.Tensor, audits: torch.Tensor, group_size: int, threshold: float
) -> tuple[torch.Tensor, float]:
    """Where the training reward ranks what an audit refuses at the top of its group, and how often.

    Shapes and flags as :func:`audit_disagreement`. A flagged completion is *inverted* when its group holds a
    completion that every audit passes (scores at least ``threshold``) and the flagged one's training reward is at
    least that of every such completion: the reward prefers, or ties, what the audit refuses over all the audit
    accepts. A hack that pays as much as the right answer or more (padding or a keyword on top of it, two candidates
    where one is right, a better-paid wrong answer) is inverted; a lenient grader's partial credit, paid less than a
    right answer beside it, is flagged but not inverted. Returns ``(inverted (N,) bool, rate)``: rate = inverted /
    favoured over the batch (NaN when nothing is favoured), so it never exceeds :func:`audit_disagreement`'s.
    No paper: this project's signal, measured in docs/results.md ("Telling learning from hacking").
    """
    _check_audit_shapes(rewards, audits, group_size)
    grouped, favoured = _favoured(rewards, group_size)  # (P, G) twice
    failed = (audits < threshold).any(dim=1).view_as(grouped)  # (P, G) NaN audits compare False: not failed
    passed = ~torch.isnan(grouped) & (audits >= threshold).all(dim=1).view_as(grouped)  # (P, G) NaN audits: no
    best = torch.where(passed, grouped, torch.full_like(grouped, -torch.inf)).amax(1, keepdim=True)  # (P, 1)
    inverted = favoured & failed & passed.any(1, keepdim=True) & (grouped >= best)  # (P, G)
    total = int(favoured.sum())
    return inverted.view(-1), (int(inverted.sum()) / total if total else float("nan"))


def audit_overpaid(
    *, rewards: torch.Tensor, audits: torch.Tensor, group_size: int, threshold: float
) -> tuple[torch.Tensor, float]:
    """Where the training reward pays what an audit refuses as much as what the audit accepts, and how often.

    Shapes and flags as :func:`audit_disagreement`. A flagged completion is *overpaid* when its training reward is at
    least the median training reward of the batch's favoured completions that every audit passes (scores at least
    ``threshold``): it is paid like a typical answer the reward pushes up and the audit accepts, on the training
    reward's own scale. Where the batch holds no such completion every flagged one counts. A hack pays as much as the
    right answer or more wherever it stands in its group (a hack that fills whole groups is still compared with the
    batch's accepted answers, where :func:`audit_inversion` has nothing to rank it against); a lenient grader's
    partial credit, paid less than a typical accepted answer, is flagged but not overpaid. Returns
    ``(overpaid (N,) bool, rate)``: rate = overpaid / favoured over the batch (NaN when nothing is favoured), never
    above :func:`audit_disagreement`'s. No paper: this project's signal, measured in docs/results.md.
    """
    _check_audit_shapes(rewards, audits, group_size)
    grouped, favoured = _favoured(rewards, group_size)  # (P, G) twice
    flat = grouped.view(-1)  # (N,)
    failed = (audits < threshold).any(dim=1)  # (N,) NaN audits compare False: not failed
    accepted = favoured.view(-1) & (audits >= threshold).all(dim=1)  # (N,) favoured: a scored reward
    flagged = favoured.view(-1) & failed  # (N,)
    overpaid = flagged & (flat >= flat[accepted].median()) if bool(accepted.any()) else flagged  # (N,)
    total = int(favoured.sum())
    return overpaid, (int(overpaid.sum()) / total if total else float("nan"))


__all__ = [
    "DriftAlarm",
    "DriftRule",
    "audit_disagreement",
    "audit_inversion",
    "audit_overpaid",
    "drift_alarm",
    "drift_from_best",
    "gate_open",
    "noise_margin",
    "trailing_mean",
]
