"""``GRPOExtConfig``: TRL's ``GRPOConfig`` plus one switch per anti-collapse family and its prefixed parameters.

One module per family section (``advantage``, ``prm``, ``token_clip``, ``sample_filter``, ``kl_control``,
``entropy_control``, ``monitor``, ``checkpoint``): its fields with their defaults, ``help`` and ``bounds`` metadata, its
docstring section, its switches, its own checks and its rules across sections. :data:`SECTIONS` lists them once;
``fields.GRPOExtFields`` composes them into the flat config with every check that reads the config alone. This module
adds the last layer: the selected members' own rules (``trl_grpo_ext.families.check_selection``), so that a config
is validated alike whatever was imported first. The members are typed against ``GRPOExtFields`` and never import
this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..families import check_selection  # imports every member: .fields composes the package's members' parameters
from ..names import FAMILIES, registry_for
from .fields import *  # noqa: F403  (the flat fields, the sections and their helpers: fields.__all__)
from .fields import GRPOExtFields
from .fields import __all__ as _FIELDS_ALL

__all__ = [*_FIELDS_ALL, "GRPOExtConfig"]


@dataclass
class GRPOExtConfig(GRPOExtFields):
    __doc__ = GRPOExtFields.__doc__

    def _check_members(self) -> None:
        """The selected members' rules: what each needs of the others and of TRL's settings, declared on the member
        classes (built-in and registered alike; ``trl_grpo_ext.families.registration.check_selection``)."""
        check_selection(self, {switch: registry_for(switch).get(getattr(self, switch)) for switch in FAMILIES})
