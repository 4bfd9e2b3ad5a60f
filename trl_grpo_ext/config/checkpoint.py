"""The config section of one family: Checkpoints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .section import ConfigSection


@dataclass
class CheckpointConfig(ConfigSection):
    r"""
    > Checkpoints

        ext_resume_state (`str`, *optional*, defaults to `"load"`):
            On `resume_from_checkpoint`, `"load"` restores the extensions' state (beta of the KL controllers, AEPO's
            last entropy and temperature, the alarm's Distinct-2 baseline) from the checkpoint's
            `grpo_ext_state.json` and refuses a damaged or out-of-range file with an error naming it; `"ignore"`
            starts them from their initial state (the escape hatch for such a file).
    """

    ext_resume_state: Literal["load", "ignore"] = field(
        default="load",
        metadata={
            "help": "On resume: 'load' restores the extensions' state from grpo_ext_state.json (a damaged file is an "
            "error naming it); 'ignore' starts them from their initial state."
        },
    )
