"""Seeing collapse: diversity and entropy metrics and a collapse alarm, as one TrainerCallback.

Works with TRL's ``GRPOTrainer`` and with :class:`~trl_grpo_ext.GRPOExtTrainer` (which wires it from the config
field ``diversity_metrics``). Callbacks do not receive the trainer, so it is passed in::

    trainer = GRPOTrainer(...)
    trainer.add_callback(CollapseMonitor(trainer, metrics=["distinct", "self_bleu", "repetition", "entropy"]))

Metrics are computed once per new training generation batch over the completions of all processes (every process
computes the same numbers) and put into the trainer's metric buffer before ``log()`` (reporting callbacks such as wandb
run ``on_log`` before user callbacks). Entropy percentiles come from the per-token entropies of the loss's forward
pass, gathered from all processes (a seeded subsample of at most ``entropy_sample`` tokens per process).

Where the data comes from:
    ``GRPOExtTrainer`` builds the monitor on its :class:`~trl_grpo_ext.families.base.Host` (an observer extension,
    ``trl_grpo_ext.families.observers``) and feeds it the completion token ids of each generation batch
    (:meth:`CollapseMonitor.observe_generation`, the same ids ``kl_control="diversity"`` measures) and the entropies of
    each training loss pass (:meth:`CollapseMonitor.record_entropy`); metrics go through the host. Evaluation batches
    get their own ``eval_diversity/*`` metrics and never reach the alarm.
    With another trainer (TRL's ``GRPOTrainer``) the monitor wraps the trainer's log-prob method for the entropies and
    re-tokenises the completion texts TRL keeps for its completions table; completions logged by an evaluation are
    skipped (``on_evaluate``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence

import torch
from transformers import TrainerCallback

from .adapter.plain import PlainTRLSource
from .checkpoints import rollback_refusal, rollback_target
from .core.diversity import batch_diversity, prompt_information, repetition_rates
from .core.hack_detection import audit_disagreement, audit_inversion, audit_overpaid
from .core.state import state_number
from .detector import INDEPENDENT, CollapseEvent, HackDetector
from .names import ALARM_ACTIONS, DIVERSITY_METRICS

logger = logging.getLogger(__name__)

METRICS = DIVERSITY_METRICS
ACTIONS = ALARM_ACTIONS
#: What a rollback restored, written to ``output_dir`` by the main process.
ROLLBACK_FILE = "collapse_rollback.json"
#: The monitor's state in a plain trainer's checkpoints (GRPOExtTrainer keeps it with its extensions' state).
MONITOR_STATE_FILE = "collapse_monitor.json"


#: What the audits add (with ``collapse_audit_rewards``): the disagreement rate and its two stricter reads (inversion,
#: overpaid), the flagged fraction, and the completions screened (``collapse_action="screen"``).
AUDIT_KEYS = ("audit/disagreement", "audit/inversion", "audit/overpaid", "audit/flagged_frac", "audit/screened")


def monitor_metric_keys(
    metrics=METRICS, ngram_sizes=(1, 2, 3, 4), *, detector: bool = True, audits: bool = True
) -> tuple[str, ...]:
    """Every key :class:`CollapseMonitor` logs with these ``metrics`` and ``ngram_sizes`` (training batches; the
    evaluation batches' diversity keys are the same under ``eval_``), with the hack detector's if ``detector`` and the
    audits' if ``audits``: the one list dashboards and plots read."""
    keys = []
    if "distinct" in metrics:
        keys += [f"diversity/distinct_{n}" for n in ngram_sizes]
        keys += [f"diversity/distinct_{n}_in_group" for n in ngram_sizes]
    if "self_bleu" in metrics:
        keys.append("diversity/self_bleu")
    if "repetition" in metrics:
        keys.append("diversity/repetition")
    if "unique" in metrics:
        keys.append("diversity/unique_frac")
    if "prompt_info" in metrics:
        keys.append("diversity/prompt_info")
    if "entropy" in metrics:
        keys += ["entropy/mean", "entropy/p10", "entropy/p50", "entropy/p90", "entropy/low_frac"]
    return (
        *keys,
        "alarm/collapse",
        *(("alarm/hack", "alarm/hack_score") if detector else ()),
        *(AUDIT_KEYS if audits else ()),
    )


class ExtClock:
    """Wall time spent in the plugin's own code (hooks, extensions, monitor); nested sections count once.

    ``GRPOExtTrainer`` owns one (``trainer.ext_clock``) and :class:`ExtTimingCallback` turns it into the per-step
    metrics ``timing/ext_s`` and ``timing/ext_fraction``: what every feature costs, measured inside the run itself
    rather than by comparing two noisy runs.
    """

    def __init__(self):
        self.seconds = 0.0
        self._depth = 0

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        self._depth += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.seconds += time.perf_counter() - start


_QUANTILES = (0.1, 0.5, 0.9)


def _quantiles(values: torch.Tensor) -> torch.Tensor:
    """``torch.quantile(values, _QUANTILES)`` (linear interpolation), the same floats from one sort and a lerp: about
    a tenth of its time between training steps, where torch.quantile's extra passes wake the thread pool."""
    ranks = torch.tensor(_QUANTILES) * (values.numel() - 1)  # (3,) float32, as torch.quantile computes them
    below = ranks.long()
    ordered = torch.sort(values).values
    return torch.lerp(ordered[below], ordered[ranks.ceil().long()], ranks - below)


def _check_monitor_settings(
    *,
    every,
    ngram_sizes,
    repetition_n,
    entropy_sample,
    alarm_entropy_min,
    alarm_distinct2_drop,
    alarm_repetition_max,
    alarm_entropy_max=None,
    alarm_entropy_rise=None,
) -> None:
    """The monitor's constructor arguments, checked when it is built (a plain-TRL user passes them directly; the
    config checks its fields with field-named errors before they get here): a ``ValueError`` naming the argument and a
    value that works, instead of a failure at step 1 or an alarm that can never fire."""

    def whole(name, value):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"CollapseMonitor: {name}={value!r} must be a whole number >= 1.")

    whole("every", every)
    whole("repetition_n", repetition_n)
    whole("entropy_sample", entropy_sample)
    if not ngram_sizes:
        raise ValueError("CollapseMonitor: ngram_sizes is empty; pass e.g. (1, 2, 3, 4).")
    for n in ngram_sizes:
        whole("ngram_sizes item", n)
    ranges = {  # argument -> (value, low, high, open above, what it is)
        "alarm_entropy_min": (alarm_entropy_min, 0.0, math.inf, False, "an entropy (>= 0)"),
        "alarm_entropy_max": (alarm_entropy_max, 0.0, math.inf, True, "an entropy (> 0)"),
        "alarm_entropy_rise": (alarm_entropy_rise, 0.0, math.inf, True, "a relative rise (> 0; 1.0 = doubled)"),
        "alarm_distinct2_drop": (alarm_distinct2_drop, 0.0, 1.0, True, "a fraction in (0, 1)"),
        "alarm_repetition_max": (
            alarm_repetition_max,
            0.0,
            1.0,
            True,
            "a repetition rate in [0, 1) (it must be exceedable)",
        ),
    }
    for name, (value, low, high, open_high, what) in ranges.items():
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        strict = name in ("alarm_distinct2_drop", "alarm_entropy_max", "alarm_entropy_rise")
        low_ok = number and (value > low if strict else value >= low)
        if not (number and low_ok and (value < high if open_high else value <= high)):
            raise ValueError(f"CollapseMonitor: {name}={value!r} must be {what}, or None (off).")
    if alarm_entropy_min is not None and alarm_entropy_max is not None and alarm_entropy_max <= alarm_entropy_min:
        raise ValueError(
            f"CollapseMonitor: alarm_entropy_max={alarm_entropy_max!r} must lie above alarm_entropy_min="
            f"{alarm_entropy_min!r} (otherwise every entropy alarms)."
        )


def _clock(source):
    """The plugin-time clock of the monitor's source (``MonitorSource.clock``), or nothing to measure with (plain TRL's
    source has None)."""
    return source.clock.measure() if source.clock is not None else contextlib.nullcontext()


class CollapseMonitor(TrainerCallback):
    """Diversity (``diversity/*``), entropy (``entropy/*``) and a collapse alarm (``alarm/*``).

    Args:
        trainer: the GRPO trainer to watch.
        metrics: any of "distinct" (Distinct-1..4 over the batch and mean within groups), "self_bleu", "repetition"
            (repeated n-grams inside one completion), "unique" (distinct completions per group), "prompt_info" (the
            mutual information between a bigram of the batch and its prompt: what the completions say about their
            prompts, :func:`~trl_grpo_ext.core.diversity.prompt_information`), "entropy".
        ngram_sizes: n of the Distinct-N metrics.
        repetition_n: n of the repetition metric.
        low_entropy_threshold: tokens with entropy below it count as "low" (``entropy/low_frac``).
        entropy_sample: tokens per process kept for the entropy percentiles.
        alarm_entropy_min: alarm when the mean token entropy falls below it.
        alarm_entropy_max: alarm when the mean token entropy rises above it (entropy that explodes).
        alarm_entropy_rise: alarm when the mean token entropy rises above (1 + rise) x its first measured value.
        alarm_distinct2_drop: alarm when batch Distinct-2 falls below (1 - drop) x its first measured value.
        alarm_repetition_max: alarm when the mean repetition rate exceeds it.
        alarm_action: what an alarm does besides logging: "warn", "save" (a checkpoint), "stop" (a checkpoint, then
            training ends) or "rollback" (training ends; at its end the weights, optimizer, scheduler and extension
            state are restored from the last checkpoint saved at or before the alarm's onset; ``checkpoint-0`` is
            saved when training starts so there is always one). Stop and rollback act on the first alarm.
        detector: the gold-free hack detector (:class:`~trl_grpo_ext.detector.HackDetector`), fed each step's
            ``completions/mean_length`` (TRL's) and the monitor's diversity; logs ``alarm/hack`` (1.0 at the step it
            fires) and ``alarm/hack_score`` (the largest drift over its threshold: 1.0 fires).
        on_alarm: a callable given each alarm's :class:`~trl_grpo_ext.detector.CollapseEvent`; it may return one of
            the actions for this alarm (None: ``alarm_action``). Settable later: ``monitor.on_alarm = fn``. If it
            raises, the error is logged and ``alarm_action`` is taken (an alarm is never lost to a bug in it); if it
            returns ``"rollback"`` where the run cannot roll back (:func:`~trl_grpo_ext.checkpoints.rollback_refusal`,
            or no checkpoint of this run at or before the onset), ``"stop"`` is taken instead, with an error saying
            why. Set before training, with ``save_strategy="steps"`` and every checkpoint kept, it makes the monitor
            save ``checkpoint-0`` at the start, as ``alarm_action="rollback"`` does.
        every: measure the n-gram metrics and the entropy percentiles at steps 1, 1 + every, 1 + 2 * every, ...
            only (``diversity_every``); the entropy mean and low fraction, and evaluation batches, every time.
        audit_rewards: names of reward functions of the trainer that are audits (weight 0 in ``reward_weights``:
            logged, never trained on); every training batch logs ``audit/disagreement`` and ``audit/flagged_frac``
            (:func:`~trl_grpo_ext.core.hack_detection.audit_disagreement`), which the detector's ``"audit"`` signal
            reads, and ``audit/inversion`` (:func:`~trl_grpo_ext.core.hack_detection.audit_inversion`: the flagged
            completions the reward pays at least as much as all its group's accepted ones) and ``audit/overpaid``
            (:func:`~trl_grpo_ext.core.hack_detection.audit_overpaid`: the flagged completions paid at least the
            median of the batch's favoured accepted ones), which it does not.
        audit_threshold: an audit score below it fails a completion.
        validation_metric: an evaluation metric of held-out gold (``"rewards/strict/mean"``; the ``eval_`` prefix
            optional) fed to the detector's ``"validation"`` signal at each evaluation (``validation/gold``), with
            its standard error (``validation/gold_se``: TRL's ``.../std`` over sqrt(prompts x
            ``num_generations_eval``)) where the detector reads it (``HackDetector(noise={"validation": 3.0})``).
        shape_acts: whether ``alarm_action`` acts on an alarm of the detector's shape signals (length, prompt
            information, repetition) alone; False: such an alarm is logged and warned, and the action waits until an
            independent signal (an audit, validation gold) alarms too (``GRPOExtTrainer``: ``collapse_shape_acts``,
            default False). A detector of shape signals only, with an action other than ``"warn"`` and no
            ``alarm_*`` threshold, needs it.
        rollback_then: after a ``"rollback"``: ``"end"`` (training ends, then the restore) or ``"screen"`` (the
            restore at once, TRL's buffered generation batch dropped, screening on, and training goes on to
            ``max_steps``; once per run: later alarms warn only; needs ``GRPOExtTrainer`` and audits).
    """

    def __init__(
        self,
        trainer,
        *,
        metrics: Sequence[str] = METRICS,
        ngram_sizes: Sequence[int] = (1, 2, 3, 4),
        repetition_n: int = 3,
        low_entropy_threshold: float = 0.1,
        entropy_sample: int = 65536,
        alarm_entropy_min: float | None = None,
        alarm_distinct2_drop: float | None = None,
        alarm_repetition_max: float | None = None,
        alarm_action: str = "warn",
        alarm_entropy_max: float | None = None,
        alarm_entropy_rise: float | None = None,
        detector: HackDetector | None = None,
        on_alarm: Callable[[CollapseEvent], str | None] | None = None,
        every: int = 1,
        audit_rewards: Sequence[str] = (),
        audit_threshold: float = 0.5,
        validation_metric: str | None = None,
        shape_acts: bool = False,
        rollback_then: str = "end",
    ):
        unknown = set(metrics) - set(METRICS)
        if unknown:
            raise ValueError(f"Unknown diversity metric(s) {sorted(unknown)}; choose from {list(METRICS)}.")
        if alarm_action not in ACTIONS:
            raise ValueError(f"alarm_action={alarm_action!r}; choose from {list(ACTIONS)}.")
        _check_monitor_settings(
            every=every,
            ngram_sizes=ngram_sizes,
            repetition_n=repetition_n,
            entropy_sample=entropy_sample,
            alarm_entropy_min=alarm_entropy_min,
            alarm_distinct2_drop=alarm_distinct2_drop,
            alarm_repetition_max=alarm_repetition_max,
            alarm_entropy_max=alarm_entropy_max,
            alarm_entropy_rise=alarm_entropy_rise,
        )
        thresholds = (
            alarm_entropy_min, alarm_distinct2_drop, alarm_repetition_max, alarm_entropy_max, alarm_entropy_rise
        )  # fmt: skip
        if alarm_action != "warn" and detector is None and all(value is None for value in thresholds):
            raise ValueError(
                f"CollapseMonitor: alarm_action={alarm_action!r} but nothing can alarm (no detector and no alarm_* "
                "threshold). Fix: pass detector=HackDetector(...) or an alarm_* threshold, or leave "
                "alarm_action='warn'."
            )
        independent = detector is not None and bool(INDEPENDENT & set(detector.rules))
        if (
            alarm_action != "warn"
            and detector is not None
            and not independent
            and not shape_acts
            and all(value is None for value in thresholds)
        ):
            raise ValueError(
                f"CollapseMonitor: alarm_action={alarm_action!r} acts on the detector's audit or validation alarms, or "
                "on a shape alarm one of them confirms, and this detector reads shape signals only (they also move "
                "when a run learns). Fix: add an 'audit' or 'validation' signal, or pass shape_acts=True to act on "
                "shape alone."
            )
        if alarm_action == "rollback":
            refusal = rollback_refusal(trainer.args.save_strategy, trainer.args.save_total_limit)
            if refusal is not None:
                raise ValueError(f"CollapseMonitor: alarm_action='rollback', but {refusal[0]}. Fix: {refusal[1]}.")
        fed = getattr(trainer, "feeds_collapse_monitor", False)
        if alarm_action == "screen" and not fed:
            raise ValueError(
                "CollapseMonitor: alarm_action='screen' needs GRPOExtTrainer (a plain GRPOTrainer has no hook through "
                "which the monitor may change advantages). Fix: use GRPOExtTrainer with collapse_action='screen', or "
                "another action."
            )
        if alarm_action == "screen" and not audit_rewards:
            raise ValueError("CollapseMonitor: alarm_action='screen' needs audit_rewards (the audits that flag).")
        if rollback_then not in ("end", "screen"):
            raise ValueError(f"CollapseMonitor: rollback_then={rollback_then!r}; choose 'end' or 'screen'.")
        if rollback_then == "screen" and not (fed and audit_rewards):
            raise ValueError(
                "CollapseMonitor: rollback_then='screen' continues with the audits' flagged completions screened, "
                "which needs GRPOExtTrainer and audit_rewards. Fix: name the audits, or rollback_then='end'."
            )
        self.rollback_then = rollback_then
        #: the alarm a rollback that continued answered (then training went on from its onset's checkpoint)
        self.continued_from: CollapseEvent | None = None
        #: every rollback of the run, in order (``rollback``: the last, as written to ``collapse_rollback.json``)
        self.rollbacks: list[dict] = []
        # the Host of a GRPOExtTrainer feeds the monitor (observe_generation, record_entropy); a plain GRPOTrainer is
        # read through its adapter
        self.source = trainer if fed else PlainTRLSource(trainer)
        self.fed_by_trainer = self.source.feeds_collapse_monitor
        self.audit_rewards = tuple(audit_rewards)
        self.audit_threshold = float(audit_threshold)
        self.shape_acts = bool(shape_acts)
        if validation_metric is not None and (detector is None or "validation" not in detector.rules):
            raise ValueError(
                "CollapseMonitor: validation_metric is read by the detector's 'validation' signal, which this detector "
                "lacks. Fix: HackDetector({..., 'validation': 0.2}, gates={'validation': 0.0}, ...)."
            )
        self.validation_key = (
            None
            if validation_metric is None
            else validation_metric
            if validation_metric.startswith("eval_")
            else f"eval_{validation_metric}"
        )
        self._alarm_to_log = False
        self._check_validation_key()
        self._warned_no_error = False
        # the audits' columns of rewards_per_func, their names and weights checked now, not at the first batch
        self._audit_index = self._audit_columns() if self.audit_rewards else []
        #: screening (``alarm_action="screen"``) is on: GRPOExtTrainer zeroes the advantages of ``last_flags``' rows
        self.screening = False
        self.last_flags: torch.Tensor | None = None
        self._audit_stats: list[tuple[float, float, float, float]] = []  # (disagreement, inversion, overpaid, flagged)
        self.metrics = tuple(metrics)
        self.ngram_sizes = tuple(ngram_sizes)
        self.repetition_n = repetition_n
        self.low_entropy_threshold = low_entropy_threshold
        self.entropy_sample = entropy_sample
        self.alarm_entropy_min = alarm_entropy_min
        self.alarm_distinct2_drop = alarm_distinct2_drop
        self.alarm_repetition_max = alarm_repetition_max
        self.alarm_entropy_max = alarm_entropy_max
        self.alarm_entropy_rise = alarm_entropy_rise
        self.alarm_action = alarm_action
        self.detector = detector
        self.on_alarm = on_alarm
        #: the first alarm (threshold or detector) and, after a rollback, what was restored
        self.event: CollapseEvent | None = None
        self.rollback: dict | None = None
        self._rollback_event: CollapseEvent | None = None
        #: the steps this run (and the runs it resumed from) saved checkpoints at: the only ones a rollback restores
        #: (an output_dir may hold another run's)
        self.saved_steps: set[int] = set()
        #: the alarm a resumed checkpoint was saved after (raised again at the first step: its weights are the ones
        #: after the alarm); the last step the threshold alarm measured and did not fire (its onset)
        self._resumed_event: CollapseEvent | None = None
        #: the first alarm that acted (a shape-only alarm waiting for confirmation does not)
        self.action_event: CollapseEvent | None = None
        self._calm_step = 0
        self._can_roll_back = False
        # the trainer's arguments and state at the last callback (a rollback that continues acts inside one)
        self._args = self._state = None
        self._metric_seen: dict[str, tuple[list | None, int]] = {}
        self.every = every
        self.baseline_distinct2: float | None = None
        self.baseline_entropy: float | None = None
        self.last: dict[str, float] = {}
        self.alarms: list[tuple[int, list[str]]] = []
        self._fingerprint = None
        # diversity values of the training batches generated in this optimizer step (several when
        # steps_per_generation < gradient_accumulation_steps), collected at its end
        self._pending: list[concurrent.futures.Future] = []
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._entropy_chunks: list[torch.Tensor] = []
        self._entropy_sums = torch.zeros(3)  # sum, tokens, low tokens
        self._generator = torch.Generator().manual_seed(0)

    # ------------------------------------------------------------------ fed by GRPOExtTrainer
    def observe_generation(self, ids: torch.Tensor, mask: torch.Tensor, group_size: int, mode: str) -> None:
        """One generation batch: (N, T) completion ids and mask of all processes, consecutive groups of
        ``group_size``. Training batches are measured at the next ``on_step_end`` (and feed the alarm); evaluation
        batches are measured now into the trainer's eval metrics (logged as ``eval_diversity/*``)."""
        rates = None
        if "repetition" in self.metrics and self.source.args.log_completions:
            # A column of the completions table TRL logs (wandb / trackio / parquet): one value per row of every
            # batch, so that the rows stay aligned.
            rates = repetition_rates(ids, mask, self.repetition_n)
            self.source.log_column("repetition", rates.tolist())
        if not set(self.metrics) - {"entropy"}:
            return
        if mode == "train" and not self._step_is_measured(self._completed_steps()):
            return  # diversity_every: this step's batch is not measured
        if mode == "train":
            # Computed on a background thread while the step's forward and backward run (torch releases the GIL);
            # the next on_step_end collects it, so the values and the step they are logged at do not change.
            self._pending.append(
                self._background().submit(self.diversity_metrics, ids, mask, group_size=group_size, repetition=rates)
            )
            return
        with _clock(self.source):
            for key, value in self.diversity_metrics(ids, mask, group_size=group_size, repetition=rates).items():
                if math.isfinite(value):
                    self._log("eval", key, value)

    def _validation_error(self, metrics: dict, args, dataloader) -> float:
        """The standard error of this evaluation's validation gold: for a ``.../mean`` metric, TRL's matching
        ``.../std`` (the deviation over the evaluation's completions) / sqrt(completions): the evaluation's prompts
        (its dataloader's dataset) x ``num_generations_eval``. 0 (no noise floor, warned once) where one is unknown."""
        key = self.validation_key or ""
        std = metrics.get(key.removesuffix("/mean") + "/std") if key.endswith("/mean") else None
        dataset = getattr(dataloader, "dataset", None)
        size = len(dataset) if hasattr(dataset, "__len__") else 0
        if std is not None and math.isfinite(std) and size > 0:
            generations = getattr(args, "num_generations_eval", None) or getattr(args, "num_generations", 1) or 1
            return float(std) / math.sqrt(size * generations)
        if not self._warned_no_error:
            self._warned_no_error = True
            logger.warning(
                "Validation gold: the standard error of %r is unknown (it needs a '.../mean' metric with its '.../std' "
                "and an evaluation dataset of known size); its drop is read without a noise floor.",
                key.removeprefix("eval_"),
            )
        return 0.0

    def _check_validation_key(self) -> None:
        """A validation metric of the form ``rewards/<name>/<stat>`` must name a reward function of the trainer (TRL
        names a function by its ``__name__``): otherwise no evaluation would log it and the signal would stay silent."""
        match = re.fullmatch(r"eval_rewards/(.+)/(mean|std)", self.validation_key or "")
        if match is None:
            return
        names = list(self.source.reward_func_names)
        if match.group(1) not in names:
            raise ValueError(
                f"collapse_validation_metric {self.validation_key.removeprefix('eval_')!r} names the reward function "
                f"{match.group(1)!r}, which this trainer does not have (reward_func_names: {names}); no evaluation "
                f"would log it. Fix: pass the strict reward in reward_funcs (at weight 0) and name it as TRL does: "
                f"one of {[f'rewards/{n}/mean' for n in names]}."
            )

    def _audit_columns(self) -> list[int]:
        """The columns of ``rewards_per_func`` that are audits; a name that is not a reward function of the trainer,
        or an audit the trainer trains on (weight not 0), is refused with the fix."""
        names, weights = list(self.source.reward_func_names), list(self.source.reward_weights)
        columns = []
        for name in self.audit_rewards:
            if name not in names:
                raise ValueError(
                    f"collapse_audit_rewards names {name!r}, which is not a reward function of this trainer "
                    f"(reward_func_names: {names}). Fix: pass the audit in reward_funcs (TRL names a function by its "
                    "__name__, a model by its name_or_path) and name it as TRL does."
                )
            index = names.index(name)
            if weights[index] != 0:
                fixed = [0.0 if i == index else w for i, w in enumerate(weights)]
                raise ValueError(
                    f"The audit {name!r} is trained on (reward_weights[{index}] = {weights[index]:g}); an audit is "
                    f"computed and logged, never trained on. Fix: reward_weights={fixed}."
                )
            columns.append(index)
        return columns

    def observe_rewards(
        self, rewards: torch.Tensor, rewards_per_func: torch.Tensor, group_size: int, mode: str
    ) -> torch.Tensor | None:
        """One scored generation batch of all processes: ``rewards`` (N,) the training reward, ``rewards_per_func``
        (N, F) every function's. Returns the rows the audits flag (N,) bool (None without audits); training batches'
        rates are logged at the step's end (and read by the detector), evaluation batches' now (``eval_audit/*``)."""
        if not self.audit_rewards:
            return None
        audits = rewards_per_func[:, self._audit_index].detach().float().cpu()  # (N, A)
        scored = rewards.detach().float().cpu()  # (N,)
        flags, rate = audit_disagreement(
            rewards=scored, audits=audits, group_size=group_size, threshold=self.audit_threshold
        )
        _, inversion = audit_inversion(
            rewards=scored, audits=audits, group_size=group_size, threshold=self.audit_threshold
        )
        _, overpaid = audit_overpaid(
            rewards=scored, audits=audits, group_size=group_size, threshold=self.audit_threshold
        )
        flagged = float(flags.float().mean()) if flags.numel() else 0.0
        if mode == "train":
            self._audit_stats.append((rate, inversion, overpaid, flagged))
            self.last_flags = flags
        else:
            for key, value in (
                ("audit/disagreement", rate),
                ("audit/inversion", inversion),
                ("audit/overpaid", overpaid),
            ):
                if math.isfinite(value):
                    self._log("eval", key, value)
            self._log("eval", "audit/flagged_frac", flagged)
        return flags

    def _audit_metrics(self) -> dict[str, float]:
        stats, self._audit_stats = self._audit_stats, []
        if not stats:
            return {}
        out = {"audit/flagged_frac": statistics.fmean(f for *_, f in stats)}
        for key, column in (("audit/disagreement", 0), ("audit/inversion", 1), ("audit/overpaid", 2)):
            rates = [row[column] for row in stats if math.isfinite(row[column])]
            if rates:
                out[key] = statistics.fmean(rates)
        return out

    def record_entropy(self, values: torch.Tensor) -> None:
        """Per-token entropies (1-D, valid tokens only) of one training forward pass."""
        if "entropy" in self.metrics:
            self._record_entropy(values.float().cpu())

    def _completed_steps(self) -> int:
        """Optimizer steps done so far."""
        return self.source.global_step

    def _step_is_measured(self, completed_steps: int) -> bool:
        """diversity_every: the step after ``completed_steps`` optimizer steps (1-based s = completed + 1) has its
        diversity and entropy percentiles measured when s is 1, 1 + every, ... (the same answer on every process)."""
        return completed_steps % self.every == 0

    def _record_entropy(self, values: torch.Tensor) -> None:
        low = (values < self.low_entropy_threshold).sum()
        self._entropy_sums += torch.stack([values.sum(), torch.tensor(float(values.numel())), low.float()])
        if not self._step_is_measured(self._completed_steps()):
            return  # the percentiles of this step are not logged: keep no sample
        if values.numel() > self.entropy_sample:
            values = values[torch.randperm(values.numel(), generator=self._generator)[: self.entropy_sample]]
        self._entropy_chunks.append(values)

    def _log(self, mode: str, key: str, value: float) -> None:
        self.source.log(mode, key, value)

    def _entropy_metrics(self, percentiles: bool) -> dict[str, float]:
        """Mean and low fraction of the step's token entropies; with ``percentiles`` (a measured step, the same on
        every process) also p10 / p50 / p90 of a sample of them. Plain TRL: the mean of TRL's logged values only."""
        if not self.fed_by_trainer:  # TRL's logged mean entropy of each loss pass, gathered over processes
            values = self._new_metric_values("entropy")
            return {"entropy/mean": statistics.fmean(values)} if values else {}
        sums = self._entropy_sums.clone()
        chunks, self._entropy_chunks, self._entropy_sums = self._entropy_chunks, [], torch.zeros(3)
        local = None
        if percentiles:
            local = torch.cat(chunks) if chunks else torch.zeros(0)
            local = local[torch.randperm(local.numel(), generator=self._generator)[: self.entropy_sample]]
        host = self.source
        sums = host.collectives.all_sum(sums.to(host.device)).cpu()
        if local is not None:
            local = host.collectives.all_cat(local.to(host.device)).cpu()
        if sums[1] == 0:
            return {}
        mean, low_frac = (sums[[0, 2]] / sums[1]).tolist()
        out = {"entropy/mean": mean, "entropy/low_frac": low_frac}
        if local is not None and local.numel():
            out.update(zip(("entropy/p10", "entropy/p50", "entropy/p90"), _quantiles(local).tolist(), strict=True))
        return out

    # ------------------------------------------------------------------ diversity
    def _background(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="collapse-monitor")
        return self._executor

    def on_train_end(self, args, state, control, **kwargs):
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._rollback_event is not None:
            with _clock(self.source):
                self._roll_back(args, state)
            self._rollback_event = None
        return control

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        # TRL's completions table now ends with evaluation completions: mark them seen so that the next training step
        # (which may reuse its generation batch and log no new completions) does not measure them as training data.
        if not self.fed_by_trainer:
            self.source.mark_completions_seen()
        self._args, self._state = args, state
        if self.validation_key is not None and self.detector is not None:
            value = (metrics or {}).get(self.validation_key)
            if value is None:
                logger.warning(
                    "Validation gold: evaluation at step %d logged no %r (its keys: %s); nothing measured.",
                    state.global_step, self.validation_key, sorted(metrics or {}),
                )  # fmt: skip
                return control
            measured = {"validation/gold": float(value)}
            if "validation_se" in self.detector.series:
                measured["validation/gold_se"] = self._validation_error(metrics, args, kwargs.get("eval_dataloader"))
            with _clock(self.source):
                fired = self.detector.observe_all(state.global_step, measured)
                if fired:
                    self._alarm_to_log = True  # this step's training metrics are logged already: the next step's
                    self._act(self._detector_event(state.global_step, fired), control)
        return control

    def diversity_metrics(
        self, ids: torch.Tensor, mask: torch.Tensor, group_size: int, *, repetition: torch.Tensor | None = None
    ) -> dict[str, float]:
        """The diversity values of one batch; ``repetition``: its per-completion repetition rates if already known."""
        values = batch_diversity(
            ids,
            mask,
            group_size,
            ngram_sizes=self.ngram_sizes if "distinct" in self.metrics else (),
            self_bleu_max_n=4 if "self_bleu" in self.metrics else None,
            repetition_n=self.repetition_n if "repetition" in self.metrics and repetition is None else None,
            unique="unique" in self.metrics,
        )
        out = {f"diversity/{key}": value for key, value in values.items() if key != "repetition"}
        if "prompt_info" in self.metrics:
            out["diversity/prompt_info"] = prompt_information(ids, mask, group_size, n=2)
        if "repetition" in self.metrics:
            per_completion = repetition if repetition is not None else values["repetition"]
            out["diversity/repetition"] = float(per_completion.mean())
            if not self.fed_by_trainer:
                # A column of the completions table plain TRL logs (wandb / trackio / parquet) when log_completions is
                # on (GRPOExtTrainer adds it in observe_generation for every batch, so rows stay aligned).
                self.source.log_column("repetition", per_completion.tolist())
        return out

    # ------------------------------------------------------------------ alarm
    def _threshold_reasons(self, values: dict[str, float]) -> list[str]:
        reasons = []
        entropy = values.get("entropy/mean")
        if self.alarm_entropy_min is not None and entropy is not None and entropy < self.alarm_entropy_min:
            reasons.append(f"entropy {entropy:.4f} < {self.alarm_entropy_min}")
        if entropy is not None and self.baseline_entropy is None:
            self.baseline_entropy = entropy
        if self.alarm_entropy_max is not None and entropy is not None and entropy > self.alarm_entropy_max:
            reasons.append(f"entropy {entropy:.4f} > {self.alarm_entropy_max} (rising)")
        if self.alarm_entropy_rise is not None and entropy is not None and self.baseline_entropy:
            ceiling = (1.0 + self.alarm_entropy_rise) * self.baseline_entropy
            if entropy > ceiling:
                reasons.append(f"entropy {entropy:.4f} > {ceiling:.4f} ({self.alarm_entropy_rise:.0%} above its start)")
        d2 = values.get("diversity/distinct_2")
        if d2 is not None and self.baseline_distinct2 is None:
            self.baseline_distinct2 = d2
        if self.alarm_distinct2_drop is not None and d2 is not None and self.baseline_distinct2:
            floor = (1.0 - self.alarm_distinct2_drop) * self.baseline_distinct2
            if d2 < floor:
                reasons.append(f"distinct-2 {d2:.4f} < {floor:.4f} ({self.alarm_distinct2_drop:.0%} below its start)")
        rep = values.get("diversity/repetition")
        if self.alarm_repetition_max is not None and rep is not None and rep > self.alarm_repetition_max:
            reasons.append(f"repetition {rep:.4f} > {self.alarm_repetition_max}")
        return reasons

    def _new_metric_values(self, name: str) -> list[float]:
        """The finite values logged under ``name`` in the training metrics since this monitor last read them. The
        trainer starts a new list at each log; the list last read is kept (not its id, which a new list may reuse)."""
        values = self.source.metric_values("train", name)
        listed, seen = self._metric_seen.get(name, (None, 0))
        start = seen if listed is values else 0
        self._metric_seen[name] = (values, len(values))
        return [float(v) for v in values[start:] if math.isfinite(float(v))]

    def _detect(self, values: dict[str, float], step: int) -> CollapseEvent | None:
        """Feed the detector this step's measurements; log ``alarm/hack`` and ``alarm/hack_score``."""
        inputs = dict(values)
        for key in ("completions/mean_length", "reward"):  # TRL's own metrics (reward: the validation signal's gate)
            logged = self._new_metric_values(key)
            if logged:
                inputs[key] = statistics.fmean(logged)
        fired = self.detector.observe_all(step, inputs)
        score = self.detector.score()
        if score is not None:
            values["alarm/hack_score"] = score
        values["alarm/hack"] = 1.0 if fired or self._alarm_to_log else 0.0
        self._alarm_to_log = False
        return self._detector_event(step, fired) if fired else None

    def _detector_event(self, step: int, fired) -> CollapseEvent:
        """The event of the signals' alarms that fired at ``step``. It acts when an independent signal (an audit,
        validation gold) fired now or before, or with ``shape_acts``; a shape-only alarm before that warns only.
        Its onset is the earliest of every alarm so far (a confirmed shape alarm rolls back to where the shape began to
        move)."""
        reasons = [f"{a.signal} drifted {a.drift:.3f} from its best point (step {a.onset})" for a in fired]
        every = self.detector.alarms.values()
        confirmed = any(a.signal in INDEPENDENT for a in every)
        onset = min(a.onset for a in every)
        return CollapseEvent(
            step=step, onset=onset, source="detector", reasons=reasons, acts=self.shape_acts or confirmed
        )

    def _choose(self, event: CollapseEvent) -> str:
        """The action for ``event``: ``on_alarm``'s choice, else ``alarm_action``. A callable that raises is logged and
        ``alarm_action`` taken; a rollback the run cannot make becomes a stop (a checkpoint at the alarm, then the end),
        with an error saying why."""
        action = self.alarm_action
        if self.on_alarm is not None:
            try:
                chosen = self.on_alarm(event)
            except Exception:
                logger.exception(
                    "on_alarm raised at step %d; taking alarm_action=%r instead.", event.step, self.alarm_action
                )
                chosen = None
            if chosen is not None:
                if chosen not in ACTIONS:
                    raise ValueError(f"on_alarm returned {chosen!r}; return one of {list(ACTIONS)} or None.")
                action = chosen
        if action == "rollback":
            args = self.source.args
            refusal = rollback_refusal(args.save_strategy, args.save_total_limit)
            why = (
                refusal[0] + f" (fix: {refusal[1]})"
                if refusal is not None
                else None
                if self._can_roll_back
                else "no checkpoint was saved when training started (on_alarm was set after train() began)"
            )
            if why is not None:
                logger.error(
                    "Step %d: a rollback was chosen but cannot be made: %s. Stopping instead.", event.step, why
                )
                action = "stop"
        if action == "screen" and not (self.fed_by_trainer and self.audit_rewards):
            why = "no audit rewards are named" if not self.audit_rewards else "a plain GRPOTrainer cannot screen"
            logger.error("Step %d: screening was chosen but cannot be made (%s); warning only.", event.step, why)
            action = "warn"
        return action

    def _act(self, event: CollapseEvent, control) -> None:
        first = self.event is None
        if first:
            self.event = event
        if not event.acts:
            logger.warning(
                "Hack detector at step %d: %s. Warning only: the completions' shape also moves when a run learns, so "
                "collapse_action=%r waits for an audit or validation alarm to confirm it (collapse_shape_acts=True "
                "acts on shape alone).", event.step, "; ".join(event.reasons), self.alarm_action,
            )  # fmt: skip
            return
        if self.continued_from is not None:
            logger.warning(
                "%s at step %d: %s. The run rolled back at step %d and screens what the audits flag since; this alarm "
                "warns only.", "Hack detector" if event.source == "detector" else "Collapse alarm", event.step,
                "; ".join(event.reasons), self.continued_from.step,
            )  # fmt: skip
            return
        if self.action_event is None:
            self.action_event = event
        action = self._choose(event)
        kind = "Hack detector" if event.source == "detector" else "Collapse alarm"
        logger.warning("%s at step %d: %s (action: %s).", kind, event.step, "; ".join(event.reasons), action)
        if action == "save":
            control.should_save = True
        elif action == "stop":
            control.should_save = True
            control.should_training_stop = True
        elif action == "screen":
            if not self.screening:
                logger.warning(
                    "Screening from step %d: the completions an audit flags train with advantage 0.", event.step + 1
                )
            self.screening = True
        elif action == "rollback" and self.rollback_then == "screen":
            # restore now and train on, screening what the audits flag (once per run)
            self._rollback_event = event
            self._roll_back(self._args, self._state, then="screen")
            self._rollback_event = None
            self.continued_from, self.action_event = event, None  # the restored state is before the alarm
            self.screening = True
            self.source.discard_buffered_rollouts()  # TRL's buffered completions are the alarmed policy's
        elif action == "rollback":
            # the state at the alarm is saved too (with the alarm in its monitor state, so resuming from it raises the
            # alarm again instead of training on silently from the hacked weights)
            control.should_save = True
            control.should_training_stop = True
            if self._rollback_event is None:
                self._rollback_event = event

    def on_train_begin(self, args, state, control, **kwargs):
        if not self.fed_by_trainer and state.global_step > 0:
            self._load_plain_state(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))
        if state.global_step > 0:
            self.saved_steps.add(int(state.global_step))  # the checkpoint this run resumed from is of its lineage
        # A rollback needs a checkpoint at or before any onset: the weights training starts from (also when a user's
        # on_alarm may choose a rollback and the run keeps its checkpoints).
        ready = rollback_refusal(args.save_strategy, args.save_total_limit) is None
        self._can_roll_back = ready and (self.alarm_action == "rollback" or self.on_alarm is not None)
        if self._can_roll_back and state.global_step == 0:
            with _clock(self.source):
                self.source.save_checkpoint()
            self.saved_steps.add(0)
        return control

    def on_save(self, args, state, control, **kwargs):
        self.saved_steps.add(int(state.global_step))
        # GRPOExtTrainer saves the monitor's state with its extensions'; on a plain trainer the monitor writes it into
        # the checkpoint itself, and reads it back when a run resumes from a checkpoint of its output_dir.
        if not self.fed_by_trainer and state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(folder):
                with open(os.path.join(folder, MONITOR_STATE_FILE), "w") as f:
                    json.dump(self.state_dict(), f, allow_nan=False)
        return control

    def _load_plain_state(self, folder: str) -> None:
        path = os.path.join(folder, MONITOR_STATE_FILE)
        if not os.path.isfile(path):
            logger.warning(
                "Resumed at step %d without %s: the collapse monitor starts afresh (its baselines and the hack "
                "detector's warm-up begin again).", self.source.global_step, path,
            )  # fmt: skip
            return
        with open(path) as f:
            self.load_state_dict(json.load(f))

    def _roll_back(self, args, state, then: str = "end") -> None:
        """Restore the newest complete checkpoint this run saved at or before the onset (checkpoints.rollback_target);
        one that fails to load is reported and the next earlier one tried. What was restored, what was not and what
        was passed over go to ``output_dir/collapse_rollback.json``."""
        event = self._rollback_event
        record: dict = {"alarm_step": event.step, "onset_step": event.onset, "source": event.source}
        record["reasons"] = event.reasons
        record.update(restored=None, checkpoint_step=None, optimizer_restored=False, skipped={}, then=then)
        saved, before = set(self.saved_steps), event.onset
        while True:
            target = rollback_target(args.output_dir, before=before, own_steps=saved)
            record["skipped"].update(target.skipped)
            if target.folder is None:
                logger.error(
                    "Rollback: no usable checkpoint of this run saved at or before step %d in %s (passed over: %s); "
                    "the weights stay those of step %d.", event.onset, args.output_dir, record["skipped"] or "none",
                    state.global_step,
                )  # fmt: skip
                break
            try:
                self.source.restore_checkpoint(target.folder)
            except Exception as error:  # a file there but unreadable: the next earlier checkpoint
                logger.error(
                    "Rollback: %s could not be loaded (%s); trying an earlier checkpoint.", target.folder, error
                )
                record["skipped"][target.folder] = f"loading it failed: {type(error).__name__}: {error}"
                before = target.step - 1
                continue
            record.update(restored=target.folder, checkpoint_step=target.step, optimizer_restored=target.complete)
            if target.complete:
                logger.warning(
                    "Rollback: alarm at step %d (onset %d); restored weights, optimizer, scheduler and extension "
                    "state from %s (step %d).", event.step, event.onset, target.folder, target.step,
                )  # fmt: skip
            else:
                logger.error(
                    "Rollback: alarm at step %d (onset %d); restored the WEIGHTS ONLY from %s (step %d): %s. The "
                    "optimizer and scheduler are still those of step %d.", event.step, event.onset, target.folder,
                    target.step, target.skipped.get(target.folder, "its optimizer state is incomplete"),
                    state.global_step,
                )  # fmt: skip
            break
        self.saved_steps |= saved  # the restored monitor state's list is the checkpoint's: keep the run's
        self._resumed_event = None  # the restored state is before the alarm
        if self.rollbacks:  # an earlier rollback that continued: the file keeps it
            record["previous"] = [dict(r) for r in self.rollbacks]
        self.rollbacks.append({k: v for k, v in record.items() if k != "previous"})
        self.rollback = record
        if state.is_world_process_zero:
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, ROLLBACK_FILE), "w") as f:
                json.dump(record, f, indent=2)

    def state_dict(self) -> dict:
        """What a resumed run needs: the Distinct-2 and entropy baselines of the alarms, the detector's measurements,
        the steps this run saved (the checkpoints a rollback may restore), the last calm step of the threshold alarm
        and the first alarm (a run resumed from a checkpoint saved after it raises it again) (saved by GRPOExtTrainer's
        checkpoints)."""
        state: dict = {} if self.baseline_distinct2 is None else {"baseline_distinct2": self.baseline_distinct2}
        if self.baseline_entropy is not None:
            state["baseline_entropy"] = self.baseline_entropy
        if self.detector is not None:
            state["detector"] = self.detector.state_dict()
        state["saved_steps"] = sorted(self.saved_steps)
        state["calm_step"] = self._calm_step
        if self.screening:
            state["screening"] = True
        if self.continued_from is not None:
            state["continued_from"] = vars(self.continued_from).copy()
        if self.action_event is not None:
            state["event"] = vars(self.action_event).copy()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved (a resume, or a rollback's restore). The live ``event`` and
        ``rollback`` are kept: they are the record of what this run did."""
        self.baseline_distinct2 = state_number(state, "baseline_distinct2", low=0.0, high=1.0, optional=True)
        self.baseline_entropy = state_number(state, "baseline_entropy", low=0.0, optional=True)
        if self.detector is not None and "detector" in state:
            self.detector.load_state_dict(state["detector"])
        steps = state.get("saved_steps", [])
        if not isinstance(steps, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
            raise ValueError(f"collapse monitor state: 'saved_steps' must be a list of steps, got {steps!r}.")
        self.saved_steps |= set(steps)
        self._calm_step = int(state_number(state, "calm_step", low=0.0, optional=True, integer=True) or 0)
        screening = state.get("screening", False)
        if not isinstance(screening, bool):
            raise ValueError(f"collapse monitor state: 'screening' must be true or false, got {screening!r}.")
        self.screening = screening
        continued = state.get("continued_from")
        if continued is not None:
            try:
                self.continued_from = CollapseEvent(**continued)
            except TypeError as error:
                raise ValueError(f"collapse monitor state: 'continued_from' is damaged ({error}).") from error
        event = state.get("event")
        if event is not None:
            try:
                self._resumed_event = CollapseEvent(**event)
            except TypeError as error:
                raise ValueError(f"collapse monitor state: 'event' is damaged ({error}).") from error

    def on_step_end(self, args, state, control, **kwargs):
        self._args, self._state = args, state  # what a rollback that continues reads (it acts inside this callback)
        with _clock(self.source):
            return self._on_step_end(state, control)

    def _on_step_end(self, state, control):
        values: dict[str, float] = {}
        if self._pending:  # fed by GRPOExtTrainer: the step's batches, computed; their mean when there are several
            batches = [future.result() for future in self._pending]
            self._pending = []
            values.update({key: statistics.fmean(batch[key] for batch in batches) for key in batches[0]})
        measured = self._step_is_measured(state.global_step - 1)
        diversity = bool(set(self.metrics) - {"entropy"}) and not self.fed_by_trainer and measured
        plain_audits = bool(self.audit_rewards) and not self.fed_by_trainer
        batch = self.source.completion_batch() if diversity or plain_audits else None
        if batch is not None:
            ids, mask, group_size = batch
            if diversity:
                values.update(self.diversity_metrics(ids, mask, group_size=group_size))
            if plain_audits:  # the rewards TRL keeps for its completions table, rows aligned with the completions
                per_func = self.source.reward_batch()
                if per_func is not None:
                    weights = torch.tensor(self.source.reward_weights, dtype=per_func.dtype)
                    rewards = (per_func * weights).nansum(dim=1).masked_fill(per_func.isnan().all(dim=1), math.nan)
                    self.observe_rewards(rewards, per_func, group_size, "train")
        values.update(self._audit_metrics())
        if "entropy" in self.metrics:
            values.update(self._entropy_metrics(percentiles=measured))
        event = self._detect(values, state.global_step) if self.detector is not None else None
        # every event of the step is acted on in turn (a warn-only shape alarm must not hide a threshold alarm or the
        # re-raised alarm of a resumed run); the first rollback's onset is the one restored
        events = [] if event is None else [event]
        resumed, self._resumed_event = self._resumed_event, None
        if resumed is not None:
            # resumed from a checkpoint saved after an alarm: its weights are the alarmed ones, and the detector (which
            # fires once per run) would stay silent
            why = (
                f"resumed from a checkpoint saved after the alarm at step {resumed.step} (onset {resumed.onset}): "
                + "; ".join(resumed.reasons)
            )
            events.insert(
                0, CollapseEvent(step=state.global_step, onset=resumed.onset, source=resumed.source, reasons=[why])
            )
            if resumed.source == "detector":
                values["alarm/hack"] = 1.0
        if not values and not events:
            return control
        reasons = self._threshold_reasons(values)
        values["alarm/collapse"] = 1.0 if reasons else 0.0
        if reasons:
            self.alarms.append((state.global_step, reasons))
            if not any(e.acts for e in events):  # the thresholds' alarm; its onset is the last calm step
                events.append(
                    CollapseEvent(step=state.global_step, onset=self._calm_step, source="threshold", reasons=reasons)
                )
        elif values.keys() - {"alarm/collapse", "alarm/hack", "alarm/hack_score"}:
            self._calm_step = state.global_step
        for each in events:
            self._act(each, control)
        self.last = values
        for key, value in values.items():
            if math.isfinite(value):
                self._log("train", key, value)
        return control


class ExtTimingCallback(TrainerCallback):
    """Logs ``timing/ext_s`` (seconds of plugin code in the optimizer step) and ``timing/ext_fraction`` (that over the
    step's wall time, from ``on_step_begin`` to ``on_step_end``). ``1 / (1 - ext_fraction)`` estimates the slowdown
    against ``trl.GRPOTrainer`` caused by the plugin's own work; it leaves out the backward pass through token-clip
    masks (an elementwise product). Per process, not reduced. Added last by ``GRPOExtTrainer`` so the monitor's own
    time is included.
    """

    #: What it logs.
    metrics = ("timing/ext_s", "timing/ext_fraction")

    def __init__(self, clock: ExtClock, log):
        """``clock``: the trainer's :class:`ExtClock`; ``log(mode, key, value)``: the trainer's metric logging."""
        self.clock = clock  # the trainer's clock of plugin time
        self.log = log
        self._start: float | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.seconds = 0.0
        self._start = time.perf_counter()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self._start is None:
            return control
        wall = time.perf_counter() - self._start
        seconds = self.clock.seconds
        seconds_key, fraction_key = self.metrics
        self.log("train", seconds_key, seconds)
        self.log("train", fraction_key, seconds / wall if wall > 0 else 0.0)
        self._start = None
        return control


def metric_groups(keys) -> tuple[str, ...]:
    """The namespaces (``kl``, ``diversity``, ...) of metric keys, in first-seen order."""
    return tuple(dict.fromkeys(key.split("/")[0] for key in keys if "/" in key))


class MetricGroupsCallback(TrainerCallback):
    """Declares the plugin's metric namespaces to wandb (``define_metric``) so every panel plots against the global
    step and dashboards group them by prefix. Does nothing without an active wandb run. ``keys``: the metrics the
    run's members declare (``GRPOExtTrainer`` passes them: ``trl_grpo_ext.families.declared_metrics``)."""

    def __init__(self, keys=()):
        self.groups = metric_groups(keys)

    def on_train_begin(self, args, state, control, **kwargs):
        if not args.report_to or "wandb" not in args.report_to:
            return control
        try:
            import wandb
        except ImportError:
            return control
        if wandb.run is None:
            return control
        wandb.define_metric("train/global_step")
        for group in self.groups:
            wandb.define_metric(f"train/{group}/*", step_metric="train/global_step")
        return control
