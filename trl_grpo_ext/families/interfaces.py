"""One typed interface per family: what the trainer gives a member, what it may give back, and the base to build on.

Each family has

* a ``Protocol`` (:class:`AdvantageEstimator`, :class:`AdvantageWeighting`, :class:`SampleFilter`, :class:`TokenClip`,
  :class:`KLController`, :class:`EntropyControl`, :class:`Observer`): the hooks the trainer calls on it, with typed
  inputs (:class:`~.base.GenerationBatch`, :class:`~.base.LossContext`, tensors) and the family's own output type;
  the family's registry is typed by it (``Registry[type[TokenClip]]``), so mypy checks a class at its
  ``@REGISTRY.register(...)`` line, and the registry checks it again when the line runs (:data:`FAMILY_INTERFACES`:
  the hooks, which of them a member must implement, the parameters each takes);
* an output type for ``on_generation``: :class:`AdvantageUpdate` (estimators, weightings: advantages only),
  :class:`FilterUpdate` (sample filters: the rows that train, and groups put in place of others),
  :class:`SpliceUpdate` (entropy control's rollout augmenters: rows put in place of others), ``None`` (KL
  controllers, observers: they act through ``host.beta`` or callbacks). The trainer refuses, naming the member, the
  hook and the step, an update its family may not return (a filter's advantages, an estimator's keep flags);
* a base class (:class:`AdvantageEstimatorBase`, ...): :class:`~.base.Extension` with the family's ``on_generation``
  narrowed to its output type; derive a member from it.

Notation: N rows of every process in a generation batch, B rows of a micro-batch, T completion tokens, T' the
longest completion of the batch.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..adapter.rollouts import Splice
from .base import Extension, GenerationBatch, GenerationUpdate, LossContext


# ---------------------------------------------------------------------------------------------------- outputs
@dataclass(kw_only=True)
class AdvantageUpdate(GenerationUpdate):
    """An advantage estimator's or weighting's ``on_generation`` result: (N,) per-row or (N, T') per-token
    advantages of every process's rows (finite floats; the trainer keeps this process's rows)."""

    advantages: torch.Tensor = field()  # field(): required (the base's None default would be inherited)
    keep: None = field(default=None, init=False)
    splice: None = field(default=None, init=False)


@dataclass(kw_only=True)
class FilterUpdate(GenerationUpdate):
    """A sample filter's ``on_generation`` result: (N,) bool ``keep``, the rows that train, and optionally groups
    generated in place of dropped ones (``splice``, dynamic sampling)."""

    keep: torch.Tensor = field()
    splice: Splice | None = None
    advantages: None = field(default=None, init=False)


@dataclass(kw_only=True)
class SpliceUpdate(GenerationUpdate):
    """A rollout augmenter's ``on_generation`` result (AEPO): rows generated outside TRL's batch, put in place of
    this process's first rows after every member ran."""

    splice: Splice = field()
    advantages: None = field(default=None, init=False)
    keep: None = field(default=None, init=False)


# ---------------------------------------------------------------------------------------------------- protocols
class Member(Protocol):
    """What every member has: checkpointed state (the trainer saves it with each checkpoint)."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class AdvantageEstimator(Member, Protocol):
    """``advantage_estimator``: the batch's advantages from its rewards (``on_generation``), and whole groups'
    advantages from their rewards alone (``group_advantages``: dynamic sampling's new groups; None where rewards are
    not enough, as for PRM)."""

    def on_generation(self, batch: GenerationBatch) -> AdvantageUpdate | None: ...
    def group_advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor | None: ...


class AdvantageWeighting(Member, Protocol):
    """``advantage_weighting``: reweights the advantages the estimator wrote, in the batch (``on_generation``) or per
    micro-batch inside the loss (``shape_advantages``: (B,) or (B, T) in, the same shape out)."""

    def on_generation(self, batch: GenerationBatch) -> AdvantageUpdate | None: ...
    def shape_advantages(self, advantages: torch.Tensor, ctx: LossContext) -> torch.Tensor: ...


class SampleFilter(Member, Protocol):
    """``sample_filter``: the rows that train (``on_generation``), a factor for a micro-batch's per-sequence loss
    (``loss_scale``) and a loss term (``extra_loss``, e.g. a zero term that keeps a fully filtered micro-batch in the
    graph)."""

    def on_generation(self, batch: GenerationBatch) -> FilterUpdate | None: ...
    def loss_scale(self, inputs: dict[str, Any], mode: str) -> float: ...
    def extra_loss(self, ctx: LossContext) -> torch.Tensor | None: ...


class TokenClip(Member, Protocol):
    """``token_clip``: inside the loss, the (B, T) bool tokens it acts on (``select_tokens``), the log-probs the loss
    uses (``modify_logps``: (B, T) in and out, differentiable) and a 0-d term (``extra_loss``)."""

    def select_tokens(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor | None: ...
    def modify_logps(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor: ...
    def extra_loss(self, ctx: LossContext) -> torch.Tensor | None: ...


class KLController(Member, Protocol):
    """``kl_control``: measures in ``on_generation`` / ``after_loss`` and sets ``host.beta`` (capability
    ``set_beta``; checked finite and >= 0); its ``on_generation`` returns nothing."""

    def on_generation(self, batch: GenerationBatch) -> None: ...
    def after_loss(self, ctx: LossContext) -> None: ...


class EntropyControl(Member, Protocol):
    """``entropy_control``: rows generated at another temperature (``on_generation`` returns a
    :class:`SpliceUpdate`), shaped advantages, modified log-probs or a loss term inside the loss, statistics after it.
    """

    def on_generation(self, batch: GenerationBatch) -> SpliceUpdate | None: ...
    def shape_advantages(self, advantages: torch.Tensor, ctx: LossContext) -> torch.Tensor: ...
    def modify_logps(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor: ...
    def extra_loss(self, ctx: LossContext) -> torch.Tensor | None: ...
    def after_loss(self, ctx: LossContext) -> None: ...


class Observer(Member, Protocol):
    """An observer (``OBSERVERS``): watches generation batches and loss passes and changes neither."""

    def on_generation(self, batch: GenerationBatch) -> None: ...
    def after_loss(self, ctx: LossContext) -> None: ...


# ---------------------------------------------------------------------------------------------------- bases
class AdvantageEstimatorBase(Extension):
    """Base of an advantage estimator (:class:`AdvantageEstimator`)."""

    def on_generation(self, batch: GenerationBatch) -> AdvantageUpdate | None:
        return None


class AdvantageWeightingBase(Extension):
    """Base of an advantage weighting (:class:`AdvantageWeighting`)."""

    def on_generation(self, batch: GenerationBatch) -> AdvantageUpdate | None:
        return None


class SampleFilterBase(Extension):
    """Base of a sample filter (:class:`SampleFilter`)."""

    def on_generation(self, batch: GenerationBatch) -> FilterUpdate | None:
        return None


class TokenClipBase(Extension):
    """Base of a token clip (:class:`TokenClip`): its hooks are all in the loss, so nothing is narrowed."""


class KLControllerBase(Extension):
    """Base of a KL controller (:class:`KLController`): it sets ``host.beta``."""

    host_capabilities = ("set_beta",)

    def on_generation(self, batch: GenerationBatch) -> None:
        return None


class EntropyControlBase(Extension):
    """Base of an entropy control (:class:`EntropyControl`)."""

    def on_generation(self, batch: GenerationBatch) -> SpliceUpdate | None:
        return None


class ObserverBase(Extension):
    """Base of an observer (:class:`Observer`); ``enabled(args)`` says whether a run builds it."""

    def on_generation(self, batch: GenerationBatch) -> None:
        return None

    @staticmethod
    def enabled(args) -> bool:
        return False


# ---------------------------------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class FamilyInterface:
    """A family's interface as data, for the registry's check and the trainer's.

    Attributes:
        protocol: the family's ``Protocol``.
        required: the hooks of which a member implements at least one; ``why``: the reason, for the error.
        update_fields: the ``GenerationUpdate`` fields its ``on_generation`` may set; ``update_type``: the type to
            return them in (None: it returns nothing).
    """

    protocol: type
    required: tuple[str, ...]
    why: str
    update_fields: frozenset[str]
    update_type: type | None

    @property
    def hooks(self) -> tuple[str, ...]:
        """The protocol's hooks (its methods but the common :class:`Member` ones)."""
        return tuple(
            name for name in vars(self.protocol) if not name.startswith("_") and callable(vars(self.protocol)[name])
        )

    def parameters(self, hook: str) -> list[str]:
        """The hook's parameter names, ``self`` excluded."""
        return list(inspect.signature(getattr(self.protocol, hook)).parameters)[1:]


#: family switch (and "observer") -> its interface.
FAMILY_INTERFACES: dict[str, FamilyInterface] = {
    "advantage_estimator": FamilyInterface(
        AdvantageEstimator,
        ("on_generation", "group_advantages"),
        "an advantage estimator writes the batch's advantages (on_generation) and/or gives whole groups' advantages "
        "from their rewards (group_advantages: what dynamic sampling's new groups get)",
        frozenset({"advantages"}),
        AdvantageUpdate,
    ),
    "advantage_weighting": FamilyInterface(
        AdvantageWeighting,
        ("on_generation", "shape_advantages"),
        "an advantage weighting rewrites the batch's advantages (on_generation) or the loss's (shape_advantages)",
        frozenset({"advantages"}),
        AdvantageUpdate,
    ),
    "sample_filter": FamilyInterface(
        SampleFilter,
        ("on_generation",),
        "a sample filter returns the rows that train from on_generation",
        frozenset({"keep", "splice"}),
        FilterUpdate,
    ),
    "token_clip": FamilyInterface(
        TokenClip,
        ("select_tokens", "modify_logps", "extra_loss"),
        "a token clip acts on the policy's log-probs inside the loss (select_tokens chooses the tokens, modify_logps "
        "and extra_loss act on them)",
        frozenset(),
        None,
    ),
    "kl_control": FamilyInterface(
        KLController,
        ("on_generation", "after_loss"),
        "a KL controller sets host.beta from what on_generation or after_loss measured",
        frozenset(),
        None,
    ),
    "entropy_control": FamilyInterface(
        EntropyControl,
        ("on_generation", "shape_advantages", "modify_logps", "extra_loss", "after_loss"),
        "an entropy control acts through at least one hook",
        frozenset({"splice"}),
        SpliceUpdate,
    ),
    "observer": FamilyInterface(
        Observer,
        ("on_generation", "after_loss"),
        "an observer watches generation batches (on_generation) or loss passes (after_loss)",
        frozenset(),
        None,
    ),
}

__all__ = [
    "FAMILY_INTERFACES",
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
    "Observer",
    "ObserverBase",
    "SampleFilter",
    "SampleFilterBase",
    "SpliceUpdate",
    "TokenClip",
    "TokenClipBase",
]
