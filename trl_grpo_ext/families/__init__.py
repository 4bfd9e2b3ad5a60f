"""The anti-collapse families the trainer composes, one registry each.

A family member is an :class:`Extension` subclass registered under the name its config switch takes. The trainer
builds one member per family from the config into its typed slot (:class:`~.slots.Slots`) and calls each through its
family's hooks only, in a fixed order (advantage estimator, refill, advantage weighting, sample filter, token clip,
KL control, reference update, entropy control, then the observers), so any combination runs in one training step. To
add a variant, subclass the family's base (:mod:`.interfaces`: the family's Protocol, its typed outputs, its base
class; the registry is typed by the Protocol), register it, and select it by name; the trainer needs no change::

    from trl_grpo_ext.families import TOKEN_CLIPS
    from trl_grpo_ext.families.interfaces import TokenClipBase

    @TOKEN_CLIPS.register("my_clip")
    class MyClip(TokenClipBase):
        def modify_logps(self, logps, ctx):
            ...

(A switch's values are its registry's names: ``--help``, the command line and YAML configs read them when the parser
is built, so a variant registered before parsing is listed and accepted like a built-in one.)
"""

from __future__ import annotations

import importlib
import pkgutil

from ..callbacks import ExtTimingCallback
from .base import (
    FAMILIES,
    Extension,
    GenerationBatch,
    Host,
    LossContext,
    Off,
)
from .base import registry_for as registry_for
from .interfaces import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_WEIGHTINGS,
    ENTROPY_CONTROLS,
    KL_CONTROLLERS,
    REFILLS,
    SAMPLE_FILTERS,
    TOKEN_CLIPS,
)
from .observers import OBSERVERS
from .registration import check_selection

# Every registry checks a class against the member contract where the registry is created (names.member_contract:
# the class's Extension.check_registration), built-in and user alike. GRPOExtConfig.validate runs the selected
# members' rules (check_selection): the config imports this package, so they hold whatever is imported first.

# Every module of this folder registers its members when imported: a method added here as a module is a member of
# its family with no line elsewhere in the package (docs/index.md, "Adding a variant", says what else it needs).
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

#: Metrics the trainer logs itself (not a member's): math answers stopped by a time bound.
TRAINER_METRICS = ("rewards/timeouts",)


def declared_metrics(members=None) -> dict[str, tuple[str, ...]]:
    """The one source of the plugin's metric names: owner -> the keys it declares, for ``members`` (classes or
    instances; default: every registered family member and observer), the timing callback and the trainer itself.
    Dashboards, plots, wandb's metric groups and the tests read it; a new member's ``metrics`` appear everywhere."""
    if members is None:
        members = [reg.get(name) for reg in (*FAMILIES.values(), OBSERVERS) for name in reg.names()]
    members = list(members)
    named = [(member if isinstance(member, type) else type(member)).__name__ for member in members]
    keys = [tuple(member.metrics) + tuple(getattr(member, "optional_metrics", ())) for member in members]
    return {
        **{name: key for name, key in zip(named, keys, strict=True) if key},
        "ExtTimingCallback": ExtTimingCallback.metrics,
        "GRPOExtTrainer": TRAINER_METRICS,
    }


__all__ = [
    "TRAINER_METRICS",
    "declared_metrics",
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_WEIGHTINGS",
    "ENTROPY_CONTROLS",
    "FAMILIES",
    "KL_CONTROLLERS",
    "OBSERVERS",
    "REFILLS",
    "SAMPLE_FILTERS",
    "TOKEN_CLIPS",
    "Extension",
    "GenerationBatch",
    "Host",
    "LossContext",
    "Off",
    "check_selection",
    "registry_for",
]
