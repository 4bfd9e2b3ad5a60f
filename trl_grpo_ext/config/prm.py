"""The config section of one family: Process reward (`advantage_estimator="prm"`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ..core.advantages import StdKind
from .section import ConfigSection, _fail, bounds


@dataclass
class PRMConfig(ConfigSection):
    r"""
    > Process reward (`advantage_estimator="prm"`)

        prm_step_separator (`str`, *optional*, defaults to `"\n"`):
            Text that ends a step (TRL's PRM `step_separator`). Blank steps are skipped; a completion without it is one
            step; the last step ends at the completion's last token.
        prm_step_separator_token_id (`int`, *optional*):
            Cut steps after each occurrence of this token id instead of splitting the text.
        prm_std (`str`, *optional*, defaults to `"population"`):
            Std used to normalise the step rewards of a group (`"population"` or `"sample"`).
        prm_outcome_coef (`float`, *optional*, defaults to `0.0`):
            Adds `prm_outcome_coef * A_outcome` (the group-normalised outcome advantage) to every token.
        prm_model_name_or_path (`str`, *optional*):
            A PRM scoring the steps: a token-classification model in TRL's PRMTrainer format, or a causal LM scoring a
            step tag (see `prm_model_type`). Runs on the trainer's device without gradients.
        prm_model_type (`str`, *optional*, defaults to `"token_classification"`):
            `"token_classification"` (P(correct) at each step's last token) or `"causal_lm"` (Math-Shepherd style:
            P(good) / (P(good) + P(bad)) at each step tag).
        prm_batch_size (`int`, *optional*, defaults to `8`):
            Sequences per PRM forward pass.
        prm_causal_step_tag (`str`, *optional*, defaults to `"ки"`):
            Step tag of a causal-LM PRM (one token).
        prm_causal_good_token (`str`, *optional*, defaults to `"+"`):
            Token meaning "good step" for a causal-LM PRM.
        prm_causal_bad_token (`str`, *optional*, defaults to `"-"`):
            Token meaning "bad step" for a causal-LM PRM.
    """

    #: Finite but absurd values refused: field -> (lowest, highest, why, example) (config.section.bounds).
    field_bounds = {
        "prm_outcome_coef": bounds(
            -1000.0, 1000.0, "a weight beyond 1000 drowns the step advantages", "prm_outcome_coef=1.0"
        ),
    }

    prm_step_separator: str = field(default="\n", metadata={"help": "Text that ends a step (TRL's PRM convention)."})
    prm_step_separator_token_id: int | None = field(
        default=None, metadata={"help": "Cut steps after this token id instead of splitting the text."}
    )
    prm_std: StdKind = field(
        default="population", metadata={"help": "Std used to normalise the step rewards of a group."}
    )
    prm_outcome_coef: float = field(
        default=0.0,
        metadata={
            "help": "Adds prm_outcome_coef * the outcome advantage to every token.",
        },
    )
    prm_model_name_or_path: str | None = field(
        default=None, metadata={"help": "PRM model scoring the steps (token-classification or causal LM)."}
    )
    prm_model_type: Literal["token_classification", "causal_lm"] = field(
        default="token_classification",
        metadata={"help": "'token_classification' (TRL PRMTrainer format) or 'causal_lm' (Math-Shepherd step tag)."},
    )
    prm_batch_size: int = field(default=8, metadata={"help": "Sequences per PRM forward pass."})
    prm_causal_step_tag: str = field(default="ки", metadata={"help": "Step tag of a causal-LM PRM (one token)."})
    prm_causal_good_token: str = field(default="+", metadata={"help": "'Good step' token of a causal-LM PRM."})
    prm_causal_bad_token: str = field(default="-", metadata={"help": "'Bad step' token of a causal-LM PRM."})

    def check(self) -> None:
        if self.prm_causal_good_token == self.prm_causal_bad_token:
            _fail(
                "prm_causal_bad_token",
                self.prm_causal_bad_token,
                "equals prm_causal_good_token: every step would score 0.5",
                "use the PRM's two label tokens, e.g. prm_causal_good_token='+', prm_causal_bad_token='-'",
            )
        if self.prm_step_separator_token_id is None and not self.prm_step_separator:
            _fail(
                "prm_step_separator",
                self.prm_step_separator,
                "steps need a separator",
                "set prm_step_separator (e.g. '\\n') or prm_step_separator_token_id",
            )
        if not (isinstance(self.prm_batch_size, int) and self.prm_batch_size >= 1):
            _fail("prm_batch_size", self.prm_batch_size, "must be an integer >= 1", "e.g. prm_batch_size=8")
        if not math.isfinite(self.prm_outcome_coef):
            _fail("prm_outcome_coef", self.prm_outcome_coef, "must be finite", "e.g. prm_outcome_coef=0.5")
