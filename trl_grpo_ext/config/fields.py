"""``GRPOExtFields``: TRL's ``GRPOConfig`` plus one switch per anti-collapse family and its prefixed parameters, with
every check that reads only the config (``GRPOExtConfig``, in ``trl_grpo_ext.config``, adds the selected members'
rules; the members are typed against this class, so the families never import the config that runs their rules).

One module per family section (``advantage``, ``prm``, ``token_clip``, ``sample_filter``, ``kl_control``,
``entropy_control``, ``monitor``, ``checkpoint``): its fields with their defaults, ``help`` and ``bounds`` metadata, its
docstring section, its switches, its own checks and its rules across sections. :data:`SECTIONS` lists them once; the
flat config, its switch list (``FAMILY_SWITCHES``), its docstring and ``PLUGIN_FIELDS`` are made from it.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Literal

from trl import GRPOConfig

from ..names import FAMILIES, KNOWN_LOSS_TYPES, OBSERVERS, TRL_VERSION, registry_for
from .advantage import AdvantageConfig
from .checkpoint import CheckpointConfig
from .entropy_control import AEPO_0_1_0, EntropyControlConfig
from .kl_control import KLControlConfig
from .members import parameters_section
from .monitor import MonitorConfig
from .prm import PRMConfig
from .sample_filter import SampleFilterConfig
from .section import ConfigSection, _check_number, _fail, _type_name, bounds
from .token_clip import PERCENT_TRAP_RATIO, TokenClipConfig

__all__ = [
    "AEPO_0_1_0",
    "PERCENT_TRAP_RATIO",
    "PLUGIN_FIELDS",
    "SECTIONS",
    "TRL_FIELD_BOUNDS",
    "AdvantageConfig",
    "CheckpointConfig",
    "ConfigSection",
    "EntropyControlConfig",
    "GRPOExtFields",
    "KLControlConfig",
    "MemberParametersConfig",
    "MonitorConfig",
    "PRMConfig",
    "SampleFilterConfig",
    "TokenClipConfig",
    "bounds",
    "switch_names",
]

#: Bounds of the TRL fields the families read (the sections declare their own fields' bounds in their metadata):
#: field -> (lowest, highest, why, example). A huge KL coefficient leaves only the KL term; a reward weight of 1e30
#: made TRL's reward std inf and every advantage 0. The bounds sit orders of magnitude beyond any published setting.
TRL_FIELD_BOUNDS: dict[str, tuple] = {
    "beta": (0.0, 100.0, "a KL coefficient above 100 leaves only the KL term in the loss", "beta=0.04"),
    "reward_weights": (
        -1e6,
        1e6,
        "weights beyond 1e6 overflow TRL's float32 reward statistics",
        "reward_weights=[1.0]",
    ),
}

#: The families' sections, each in its module of this package.
_FAMILY_SECTIONS = (
    AdvantageConfig,
    PRMConfig,
    TokenClipConfig,
    SampleFilterConfig,
    KLControlConfig,
    EntropyControlConfig,
    MonitorConfig,
    CheckpointConfig,
)

#: The built-in members' own parameters (config.members): one field per ``Args`` field with a default and help. The
#: registries hold the package's members here: this module is imported through ``trl_grpo_ext.config``, whose
#: ``__init__`` imports ``trl_grpo_ext.families`` (every member module) first.
MemberParametersConfig = parameters_section(
    (
        (f'{switch}="{name}"', registry.get(name))
        for switch, registry in {**FAMILIES, "observer": OBSERVERS}.items()
        for name in registry.names()
    ),
    taken={f.name for section in _FAMILY_SECTIONS for f in dataclasses.fields(section)}
    | {f.name for f in dataclasses.fields(GRPOConfig)},
)

#: The config sections, in the order GRPOExtConfig's docstring and checks list them: the families', then the
#: built-in members' parameters.
SECTIONS = (*_FAMILY_SECTIONS, MemberParametersConfig)


# The base order decides the positional order of the fields: dataclasses collect fields along the reversed MRO, so
# GRPOConfig goes last here and its fields come first, in its own order (``GRPOExtConfig("out")`` is
# ``output_dir="out"``, as for ``GRPOConfig``); the sections follow, from AdvantageConfig to CheckpointConfig, then
# the members' parameters.
@dataclass
class GRPOExtFields(
    MemberParametersConfig,  # type: ignore[valid-type,misc]  (made from the members' Args, config.members)
    CheckpointConfig,
    MonitorConfig,
    EntropyControlConfig,
    KLControlConfig,
    SampleFilterConfig,
    TokenClipConfig,
    PRMConfig,
    AdvantageConfig,
    GRPOConfig,
):
    r"""
    Configuration for [`GRPOExtTrainer`]: every [`~trl.GRPOConfig`] field plus the anti-collapse families below. With
    every family at its default the trainer is TRL's `GRPOTrainer`.

    Each family has one switch; its parameters carry the family's prefix. Values are checked in `__post_init__`; a bad
    value raises `ValueError` naming the field and the fix. All fields parse with `TrlParser` (command line and
    `--config file.yaml`).

    Each family's fields, docs and checks live in one section class (`AdvantageConfig`, `PRMConfig`, ...); this class
    composes them and runs every section's `check` in `__post_init__`. Parameters, by section:
    """

    #: The switches that change training; :meth:`without_extensions` sets each to its off value.
    FAMILY_SWITCHES = tuple(switch for section in SECTIONS for switch in section.switches)

    def without_extensions(self, **overrides) -> GRPOExtFields:
        """This configuration with every family switched off: vanilla GRPO with the same TRL settings.

        Every switch in :attr:`FAMILY_SWITCHES` goes back to its default (TRL's own behaviour). A KL controller owned
        ``beta``, so ``beta`` goes back to TRL's default too (no KL term); a fixed ``beta`` the user set is TRL's and
        stays. The collapse monitor (``diversity_metrics``, ``collapse_*``) observes and stays. ``overrides`` (any
        fields, e.g. ``output_dir``) apply on top. Used by ``recipes/math_grpo.py`` to train the vanilla baseline.
        """
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        changes = {name: defaults[name] for name in self.FAMILY_SWITCHES}
        if self.kl_control != "fixed":
            changes["beta"] = defaults["beta"]
        # TRL derives generation_batch_size from steps_per_generation in __post_init__ and refuses both at once.
        changes["generation_batch_size"] = None
        changes.update(overrides)
        return dataclasses.replace(self, **changes)

    def __post_init__(self):
        super().__post_init__()
        self.validate()

    def validate(self) -> None:
        """Every check of the extension fields (and of TRL's ``beta`` and ``reward_weights``, which the families read),
        with the messages of construction. ``__post_init__`` runs it, and ``GRPOExtTrainer`` again when it is built and
        when training starts, so a field changed after construction gets the same clear error."""
        self._check_numbers()
        self._check_switches()
        for section in SECTIONS:  # each family's own checks, in the order of the sections
            section.check(self)
        for section in SECTIONS:  # then each section's rules that read another section's or TRL's fields
            section.check_across(self)
        self._check_members()

    def _check_members(self) -> None:
        """The selected members' rules: ``GRPOExtConfig`` runs them (the members' classes live in the families)."""

    @property
    def is_off_policy(self) -> bool:
        """Whether a generation batch is reused across optimizer steps (TRL then computes old log-probs)."""
        generate_every = self.steps_per_generation * self.num_iterations
        return self.gradient_accumulation_steps % generate_every != 0

    def _check_numbers(self) -> None:
        """Every numeric extension field is a finite number of its type (not a string from YAML, not a boolean, not
        NaN / inf), and TRL's `beta` and `reward_weights`, which the families read, are finite too."""
        trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
        for f in dataclasses.fields(self):
            if f.name in trl_fields:
                continue
            kind = _type_name(f.type)
            value = getattr(self, f.name)
            if kind in ("float", "int", "float|None", "int|None"):
                # transformers' parser strips `| None` from field.type in place: the class annotations say it too.
                if value is None and (kind.endswith("|None") or f.default is None or f.name in _optional_fields()):
                    continue
                _check_number(f.name, value, integer=kind.startswith("int"))
            elif kind == "list[int]":
                if not isinstance(value, (list, tuple)):
                    _fail(f.name, value, "must be a list of integers", f"e.g. {f.name}=[1, 2]")
                for item in value:
                    _check_number(f.name, item, integer=True, whole=value)
        _check_number("beta", self.beta)
        if self.beta < 0:
            _fail("beta", self.beta, "must be >= 0 (a KL coefficient)", "e.g. beta=0.04, or 0 for no KL term")
        for weight in self.reward_weights or []:
            _check_number("reward_weights", weight, whole=self.reward_weights)
        for name, (low, high, why, example) in _bounds().items():
            values = getattr(self, name)
            for value in values if isinstance(values, (list, tuple)) else [] if values is None else [values]:
                if not (low <= value and (high is None or value <= high)):
                    shown = f"[{low:g}, {high:g}]" if high is not None else f"[{low:g}, inf)"
                    _fail(name, values, f"outside {shown}: {why}", f"e.g. {example}")

    # Each family switch names a member of its registry (built-in or registered by the user).
    def _check_switches(self) -> None:
        registry_switches = tuple(FAMILIES)  # every family's switch
        for name in registry_switches:
            value = getattr(self, name)
            moved = MOVED.get((name, value)) if isinstance(value, str) else None
            if moved is not None and value not in switch_names(name):
                _fail(name, value, f"this member moved to {moved[0]} in 0.2.0", f"set {moved[0]}={moved[1]!r}")
            if not isinstance(value, str) or value not in switch_names(name):
                _fail(name, value, "unknown value (one name, a string)", f"use one of {switch_names(name)}")

        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        active = [f"{s}={getattr(self, s)!r}" for s in self.FAMILY_SWITCHES if getattr(self, s) != defaults[s]]
        if active and self.loss_type not in KNOWN_LOSS_TYPES:
            _fail(
                "loss_type",
                self.loss_type,
                f"{', '.join(active)} add loss terms aggregated like TRL {TRL_VERSION}'s loss types "
                f"{sorted(KNOWN_LOSS_TYPES)}, and this one is not among them (they would be aggregated wrongly)",
                "use one of those loss types, or switch the families off (plain GRPOTrainer)",
            )
        for name, allowed in _literal_fields().items():  # every Literal field: its annotation is the list
            value = getattr(self, name)
            if value not in allowed:
                _fail(name, value, "unknown value", f"use one of {list(allowed)}")


#: Members that changed family: (old switch, value) -> (its switch now, its value there); the old spelling is refused
#: with the new one (their other fields kept their names).
MOVED: dict[tuple[str, str], tuple[str, str]] = {
    ("entropy_control", "entropy_advantage"): ("advantage_weighting", "entropy_advantage"),
    ("sample_filter", "dynamic_sampling"): ("refill", "dynamic_sampling"),
}

#: Every field the plugin adds to GRPOConfig (its sections'), in declaration order.
PLUGIN_FIELDS = tuple(f.name for section in SECTIONS for f in dataclasses.fields(section))


def switch_names(switch: str) -> list[str]:
    """The valid values of a family switch: every name registered in its registry (``trl_grpo_ext.names``; the
    built-in members, and a user's variant once registered)."""
    return registry_for(switch).names()


@functools.cache
def _bounds() -> dict[str, tuple]:
    """Field -> (lowest, highest or None, why, example): the sections' ``field_bounds`` and
    :data:`TRL_FIELD_BOUNDS`."""
    declared = {}
    for section in SECTIONS:
        declared.update(section.__dict__.get("field_bounds", {}))
    return {**TRL_FIELD_BOUNDS, **declared}


@functools.cache
def _optional_fields() -> frozenset[str]:
    """Every section field whose annotation admits None (read from the annotations, which the argument parser leaves
    alone)."""
    return frozenset(
        name
        for section in SECTIONS
        for name, hint in typing.get_type_hints(section).items()
        if type(None) in typing.get_args(hint)
    )


@functools.cache
def _literal_fields() -> dict[str, tuple]:
    """Every section field typed ``Literal[...]`` -> its values, read from the annotations (resolved once)."""
    fields = {}
    for section in SECTIONS:
        for name, hint in typing.get_type_hints(section).items():
            if typing.get_origin(hint) is Literal:
                fields[name] = typing.get_args(hint)
    return fields


# The docstring that documents every field (TRL's style), assembled from the sections.
GRPOExtFields.__doc__ = (GRPOExtFields.__doc__ or "") + "".join(
    "\n" + (section.__doc__ or "").strip("\n") + "\n" for section in SECTIONS
)
