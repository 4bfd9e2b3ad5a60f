"""The run's members, one typed slot per family (None while the family is off) and the observers by name.

The trainer calls each slot only through its own family's hooks (:data:`~trl_grpo_ext.api.FAMILY_INTERFACES`):
the estimator's ``on_generation`` / ``group_advantages``, the refill's and the sample filter's ``on_generation``,
the weighting's ``shape_advantages``, the token clip's ``select_tokens``, and so on; registration refuses a member
overriding a hook outside its family's interface, which no slot would call. :class:`Slots` is also a mapping (family
switch or observer name -> member, in hook order) for reading the run's members and for swapping one in a test.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

from ..api import (
    FAMILY_INTERFACES,
    AdvantageEstimator,
    AdvantageWeighting,
    EntropyControl,
    KLController,
    Observer,
    ReferenceUpdate,
    Refill,
    SampleFilter,
    TokenClip,
)
from ..names import FAMILIES


class Slots(MutableMapping):
    """One member per family (the order of ``names.FAMILIES``: the order the hooks run in), then the observers."""

    advantage_estimator: AdvantageEstimator | None
    refill: Refill | None
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
    def having(self, hook: str) -> list[tuple[str, Any]]:
        """(family, member) of the members whose family's interface has ``hook`` (``api.FAMILY_INTERFACES``), in hook
        order: ``on_generation`` is the estimator's, refill's, weighting's, sample filter's, KL control's, entropy
        control's and the observers' (a token clip and a reference update have none); ``modify_logps`` the token
        clip's, then the entropy control's; and so on."""
        pairs = ((key if key in FAMILIES else "observer", member) for key, member in self.items())
        return [(family, member) for family, member in pairs if hook in FAMILY_INTERFACES[family].hooks]


__all__ = ["Slots"]
