"""The run's members, one typed slot per family (None while the family is off) and the observers by name.

The trainer calls each slot only through its own family's hooks (:data:`~trl_grpo_ext.api.FAMILY_INTERFACES`):
the estimator's ``on_generation`` / ``group_advantages``, the weighting's ``shape_advantages``, the sample filter's
``loss_scale``, the token clip's ``select_tokens``, and so on; registration refuses a member overriding a hook outside
its family's interface, which no slot would call. :class:`Slots` is also a mapping (family switch or observer name ->
member, in hook order) for reading the run's members and for swapping one in a test.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping

from ..api import (
    AdvantageEstimator,
    AdvantageWeighting,
    EntropyControl,
    KLController,
    Observer,
    ReferenceUpdate,
    SampleFilter,
    TokenClip,
)
from ..names import FAMILIES

#: A member with an ``on_generation`` hook.
Generating = AdvantageEstimator | AdvantageWeighting | SampleFilter | KLController | EntropyControl | Observer


class Slots(MutableMapping):
    """One member per family (the order of ``names.FAMILIES``: the order the hooks run in), then the observers."""

    advantage_estimator: AdvantageEstimator | None
    advantage_weighting: AdvantageWeighting | None
    sample_filter: SampleFilter | None
    token_clip: TokenClip | None
    kl_control: KLController | None
    ref_update: ReferenceUpdate | None
    entropy_control: EntropyControl | None
    observers: dict[str, Observer]

    def __init__(self) -> None:
        for switch in FAMILIES:
            setattr(self, switch, None)
        self.observers = {}

    # ------------------------------------------------------------------ the mapping
    def __getitem__(self, key: str):
        member = getattr(self, key) if key in FAMILIES else self.observers[key]
        if member is None:
            raise KeyError(key)
        return member

    def __setitem__(self, key: str, member) -> None:
        if key in FAMILIES:
            setattr(self, key, member)
        else:
            self.observers[key] = member

    def __delitem__(self, key: str) -> None:
        self[key]  # noqa: B018  (KeyError when empty)
        if key in FAMILIES:
            setattr(self, key, None)
        else:
            del self.observers[key]

    def __iter__(self) -> Iterator[str]:
        yield from (switch for switch in FAMILIES if getattr(self, switch) is not None)
        yield from self.observers

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"Slots({', '.join(f'{key}={type(member).__name__}' for key, member in self.items())})"

    # ------------------------------------------------------------------ hook order, per hook
    def generating(self) -> list[tuple[str, Generating]]:
        """(family, member) of the members with an ``on_generation`` hook, in hook order: estimator, weighting, sample
        filter, KL control, entropy control, observers (a token clip and a reference update have none)."""
        switches = ("advantage_estimator", "advantage_weighting", "sample_filter", "kl_control", "entropy_control")
        slots = [(switch, getattr(self, switch)) for switch in switches]
        return [(f, m) for f, m in (*slots, *(("observer", m) for m in self.observers.values())) if m is not None]

    def logp_modifiers(self) -> list[TokenClip | EntropyControl]:
        """``modify_logps``: the token clip, then the entropy control."""
        return [m for m in (self.token_clip, self.entropy_control) if m is not None]

    def loss_terms(self) -> list[SampleFilter | TokenClip | EntropyControl]:
        """``extra_loss``: the sample filter, the token clip, the entropy control."""
        return [m for m in (self.sample_filter, self.token_clip, self.entropy_control) if m is not None]

    def after_loss(self) -> list[KLController | ReferenceUpdate | EntropyControl | Observer]:
        """``after_loss``: the KL control, the reference update, the entropy control, the observers."""
        slots = (self.kl_control, self.ref_update, self.entropy_control)
        return [m for m in (*slots, *self.observers.values()) if m is not None]


__all__ = ["Slots"]
