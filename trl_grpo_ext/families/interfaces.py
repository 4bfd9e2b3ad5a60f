"""One typed interface per family: what the trainer gives a member, what it may give back, and the base to build on.

Each family has

* a ``Protocol`` (:class:`AdvantageEstimator`, :class:`Refill`, :class:`AdvantageWeighting`, :class:`SampleFilter`,
  :class:`TokenClip`, :class:`KLController`, :class:`EntropyControl`, :class:`Observer`): the hooks the trainer calls
  on it, with typed inputs (:class:`~.base.GenerationBatch`, :class:`~.base.LossContext`, tensors) and the family's
  own output type; the family's registry is typed by it (``Registry[type[TokenClip]]``), so mypy checks a class at
  its ``@REGISTRY.register(...)`` line, and the registry checks it again when the line runs
  (:data:`FAMILY_INTERFACES`: the hooks, which of them a member must implement, the parameters each takes);
* an output type for ``on_generation``: :class:`AdvantageUpdate` (estimators, weightings: advantages only),
  :class:`RefillUpdate` (refills: new groups put in place of others, at once), :class:`FilterUpdate` (sample
  filters: the rows that train), :class:`SpliceUpdate` (entropy control's rollout augmenters: rows put in place of
  others), ``None`` (KL controllers, observers: they act through their services). The trainer refuses, naming the
  member, the hook and the step, an update its family may not return (a filter's advantages, an estimator's keep
  flags);
* a base class (:class:`AdvantageEstimatorBase`, ...): :class:`~.base.Extension` with the family's ``on_generation``
  narrowed to its output type; derive a member from it.

Notation: N rows of every process in a generation batch, B rows of a micro-batch, T completion tokens, T' the
longest completion of the batch.
"""

from __future__ import annotations

from ..api import (  # noqa: F401  (the family vocabulary, re-exported: trl_grpo_ext.families.interfaces.TokenClip, ...)
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_WEIGHTINGS,
    ENTROPY_CONTROLS,
    FAMILY_INTERFACES,
    KL_CONTROLLERS,
    OBSERVERS,
    REFERENCE_UPDATES,
    REFILLS,
    SAMPLE_FILTERS,
    TOKEN_CLIPS,
    AdvantageEstimator,
    AdvantageUpdate,
    AdvantageWeighting,
    EntropyControl,
    FamilyInterface,
    FilterUpdate,
    KLController,
    Member,
    Metrics,
    Observer,
    Out,
    ReferenceUpdate,
    Refill,
    RefillUpdate,
    SampleFilter,
    SpliceUpdate,
    TokenClip,
)
from ..names import config_error
from .base import BetaControl, Callbacks, Extension, GenerationBatch, Host, ReferenceModel


# ---------------------------------------------------------------------------------------------------- bases
class AdvantageEstimatorBase(Extension):
    """Base of an advantage estimator (:class:`AdvantageEstimator`)."""

    def on_generation(self, batch: GenerationBatch) -> Out[AdvantageUpdate | None]:
        return None


class AdvantageWeightingBase(Extension):
    """Base of an advantage weighting (:class:`AdvantageWeighting`)."""

    def on_generation(self, batch: GenerationBatch) -> Out[AdvantageUpdate | None]:
        return None


class RefillBase(Extension):
    """Base of a refill (:class:`Refill`)."""

    @classmethod
    def check_combination(cls, args, members) -> None:
        """Every refill splices new rows with advantages of their own, which ``normalize_then_sum`` cannot have."""
        if args.multi_objective_aggregation != "sum_then_normalize":
            raise config_error(
                "multi_objective_aggregation",
                args.multi_objective_aggregation,
                f"refill={args.refill!r} splices new groups with advantages of their own, but "
                "normalize_then_sum divides every row's summed per-function z-scores by the standard deviation of "
                "the whole batch: new rows change that deviation, so every other row's advantage would have to "
                "change with them (TRL computes it once, before the members run)",
                "set multi_objective_aggregation='sum_then_normalize', or use refill='none' with normalize_then_sum",
            )

    def on_generation(self, batch: GenerationBatch) -> Out[RefillUpdate | None]:
        return None


class SampleFilterBase(Extension):
    """Base of a sample filter (:class:`SampleFilter`)."""

    def on_generation(self, batch: GenerationBatch) -> Out[FilterUpdate | None]:
        return None


class TokenClipBase(Extension):
    """Base of a token clip (:class:`TokenClip`): its hooks are all in the loss, so nothing is narrowed."""


class ReferenceUpdateBase(Extension):
    """Base of a reference update (:class:`ReferenceUpdate`): it moves TRL's reference model (the ``reference``
    service) at step ends (the ``callbacks`` service)."""

    def __init__(self, args: Extension.Args, host: Host, *, reference: ReferenceModel, callbacks: Callbacks):
        super().__init__(args, host)
        self.reference = reference
        self.callbacks = callbacks


class KLControllerBase(Extension):
    """Base of a KL controller (:class:`KLController`): it sets beta through the ``beta_control`` service."""

    def __init__(self, args: Extension.Args, host: Host, *, beta_control: BetaControl):
        super().__init__(args, host)
        self.beta_control = beta_control

    def on_generation(self, batch: GenerationBatch) -> Out[None]:
        return None


class EntropyControlBase(Extension):
    """Base of an entropy control (:class:`EntropyControl`)."""

    def on_generation(self, batch: GenerationBatch) -> Out[SpliceUpdate | None]:
        return None


class ObserverBase(Extension):
    """Base of an observer (:class:`Observer`); ``enabled(args)`` says whether a run builds it."""

    def on_generation(self, batch: GenerationBatch) -> Out[None]:
        return None

    @staticmethod
    def enabled(args) -> bool:
        return False


__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_WEIGHTINGS",
    "ENTROPY_CONTROLS",
    "FAMILY_INTERFACES",
    "KL_CONTROLLERS",
    "OBSERVERS",
    "REFERENCE_UPDATES",
    "REFILLS",
    "SAMPLE_FILTERS",
    "TOKEN_CLIPS",
    "AdvantageEstimator",
    "AdvantageEstimatorBase",
    "AdvantageUpdate",
    "AdvantageWeighting",
    "AdvantageWeightingBase",
    "EntropyControl",
    "EntropyControlBase",
    "FamilyInterface",
    "FilterUpdate",
    "KLController",
    "KLControllerBase",
    "Member",
    "Metrics",
    "Observer",
    "Out",
    "ObserverBase",
    "ReferenceUpdate",
    "ReferenceUpdateBase",
    "Refill",
    "RefillBase",
    "RefillUpdate",
    "SampleFilter",
    "SampleFilterBase",
    "SpliceUpdate",
    "TokenClip",
    "TokenClipBase",
]
