"""The names the config validates and the code acting on them uses, in one leaf module (it imports only the registry
class): the config package reads them here instead of importing the families, the monitor or the TRL copies.

- the family registries (:data:`FAMILIES`): empty until ``trl_grpo_ext.families`` registers the built-in members;
  a switch's valid values are its registry's names (the config's parser choices read them);
- what makes a member's ``Args`` field its own parameter (:func:`is_parameter`), which the config composes;
- the collapse monitor's metric names and alarm actions;
- the TRL version the plugin's copies come from, and the loss types whose aggregation they copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal, get_args

from .core.registry import Registry

#: The TRL minor version the copies of ``adapter.compat`` were taken from.
TRL_VERSION = "1.16"
#: Loss types whose aggregation averages over rows (so masked rows dilute the mean).
PER_SEQUENCE_LOSS_TYPES = frozenset({"grpo", "sapo", "luspo", "dr_grpo"})
#: Loss types normalised by the global token count ``num_items_in_batch``.
TOKEN_COUNT_LOSS_TYPES = frozenset({"cispo", "dapo", "vespo"})
#: Every loss type whose aggregation ``adapter.compat.aggregate_like_loss_type`` copies.
KNOWN_LOSS_TYPES = PER_SEQUENCE_LOSS_TYPES | TOKEN_COUNT_LOSS_TYPES | {"bnpo"}


def config_error(field_name: str, value, problem: str, fix: str) -> ValueError:
    """The error for a bad config value, from the config's checks and the members' rules alike: the field, its value,
    what is wrong and the fix."""
    return ValueError(f"GRPOExtConfig.{field_name}={value!r}: {problem}. Fix: {fix}")


#: PKPO's k when ``pkpo_k`` is None: this, or ``num_generations`` when a group is smaller.
PKPO_DEFAULT_K = 4


def pkpo_start_k(pkpo_k: int | None, num_generations: int) -> int:
    """The k ``advantage_estimator="pass_at_k"`` starts from: ``pkpo_k``, or ``min(PKPO_DEFAULT_K, num_generations)``
    when it is None."""
    return min(PKPO_DEFAULT_K, num_generations) if pkpo_k is None else pkpo_k


#: What ``diversity_metrics`` may list (``trl_grpo_ext.callbacks.CollapseMonitor``).
DIVERSITY_METRICS = ("distinct", "self_bleu", "repetition", "unique", "prompt_info", "entropy")
#: What the collapse alarm may do: the type of ``collapse_action`` and the monitor's check, written once.
AlarmAction = Literal["warn", "save", "stop", "rollback", "screen"]
ALARM_ACTIONS: tuple[str, ...] = get_args(AlarmAction)


def is_parameter(f: dataclasses.Field) -> bool:
    """Whether a member's ``Args`` field is its own parameter (it has a default; ``trl_grpo_ext.config.members`` makes
    the package's members' parameters config fields) rather than a config field it reads."""
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def parameter_default(f: dataclasses.Field) -> Any:
    """A dataclass field's default (its factory's value for a ``default_factory``)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]


def in_package(cls: Any) -> bool:
    """Whether a class is defined in this package (a class made by ``exec`` may have no module: not ours)."""
    return (getattr(cls, "__module__", None) or "").startswith(f"{__name__.split('.', 1)[0]}.")


class MemberContractError(ValueError):
    """A member class, or what a member returned, breaks the contract between the trainer and its members."""


def member_contract(family: str) -> Callable[..., None]:
    """The check a family's registry runs on a class before registering it: the class's own ``check_registration``
    (``trl_grpo_ext.families.Extension``'s: the member contract of ``families.registration``); anything else is
    refused. Built into each registry where it is created, so no import order can skip it."""

    def check(obj: Any, *, name: str) -> None:
        contract = getattr(obj, "check_registration", None)
        if not (isinstance(obj, type) and callable(contract)):
            shown = getattr(obj, "__name__", repr(obj))
            raise MemberContractError(
                f"{family}={name!r}: {shown} is not a class derived from trl_grpo_ext.families.Extension (a {family} "
                f"member is an Extension subclass whose hooks the trainer calls). Fix: write class "
                f"{shown.title().replace('_', '')}(Extension) with the hook your function implements (see "
                "docs/index.md, 'Adding a variant')."
            )
        if family == "observer" and name in FAMILIES:  # the run's members are read by switch or observer name
            raise MemberContractError(
                f"observer={name!r}: {name!r} is a family switch; an observer needs a name of its own. Fix: register "
                f"it under another name, e.g. '{name}_watch'."
            )
        contract(family=family, name=name)

    return check


def _registry(family: str, symbol: str) -> Registry[Any]:
    return Registry(family, symbol=symbol, check=member_contract(family))


# The registries, untyped here (this module imports nothing of the families): trl_grpo_ext.families.interfaces
# re-exports each typed by its family's Protocol, the names members register with (mypy checks a class at its
# ``@REGISTRY.register(...)`` line); at run time each registry's check (the member contract) does.
ADVANTAGE_ESTIMATORS = _registry("advantage_estimator", "ADVANTAGE_ESTIMATORS")
ADVANTAGE_WEIGHTINGS = _registry("advantage_weighting", "ADVANTAGE_WEIGHTINGS")
TOKEN_CLIPS = _registry("token_clip", "TOKEN_CLIPS")
SAMPLE_FILTERS = _registry("sample_filter", "SAMPLE_FILTERS")
REFILLS = _registry("refill", "REFILLS")
KL_CONTROLLERS = _registry("kl_control", "KL_CONTROLLERS")
ENTROPY_CONTROLS = _registry("entropy_control", "ENTROPY_CONTROLS")
REFERENCE_UPDATES = _registry("ref_update", "REFERENCE_UPDATES")
OBSERVERS = _registry("observer", "OBSERVERS")

#: config switch -> its family's registry, in the order the trainer runs the members.
FAMILIES: dict[str, Registry[Any]] = {
    "advantage_estimator": ADVANTAGE_ESTIMATORS,
    "refill": REFILLS,
    "advantage_weighting": ADVANTAGE_WEIGHTINGS,
    "sample_filter": SAMPLE_FILTERS,
    "token_clip": TOKEN_CLIPS,
    "kl_control": KL_CONTROLLERS,
    "ref_update": REFERENCE_UPDATES,
    "entropy_control": ENTROPY_CONTROLS,
}


def registry_for(switch: str) -> Registry[Any]:
    """The registry behind a config switch (``advantage_estimator``, ``token_clip``, ``sample_filter``, ...)."""
    return FAMILIES[switch]
