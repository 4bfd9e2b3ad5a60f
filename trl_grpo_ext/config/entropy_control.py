"""The config section of one family: Entropy control (AEPO, arXiv 2510.08141; entropy-shaped advantages,
arXiv 2506.14758)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from .section import ConfigSection, _fail, bounds, family_switch

#: AEPO's fields as trl_grpo_ext 0.1.0 ran it (a separate unclipped term over the whole batch regenerated, with
#: 0.1.0's rules: see ``aepo_mode``); the defaults are the reference code's.
#: ``GRPOExtConfig(entropy_control="aepo", **AEPO_0_1_0)``.
AEPO_0_1_0 = {"aepo_mode": "term", "aepo_regenerate_fraction": 1.0}


@dataclass
class EntropyControlConfig(ConfigSection):
    r"""
    > Entropy control (AEPO, arXiv 2510.08141)

        entropy_control (`str`, *optional*, defaults to `"none"`):
            `"aepo"`: each generation batch is generated again at a temperature chosen by the entropy (T_high under
            target, T_low above); the positive-advantage samples add a REINFORCE term that steers entropy to target.
            Not TRL's entropy bonus (`entropy_coef`), which it replaces. (Entropy-shaped advantages, here until
            0.2.0, are `advantage_weighting="entropy_advantage"`.)
        aepo_target_entropy (`float`, *optional*, defaults to `0.5`):
            Mean token entropy to hold (reference implementation: 0.5).
        aepo_temperature_high (`float`, *optional*, defaults to `1.2`):
            Sampling temperature when entropy is below target.
        aepo_temperature_low (`float`, *optional*, defaults to `0.8`):
            Sampling temperature when entropy is at or above target.
        aepo_coef (`float`, *optional*, defaults to `1.0`):
            Weight alpha of the REINFORCE term.
        aepo_max_samples (`int`, *optional*, defaults to `60`):
            Most reinforced samples per generation batch (half when entropy is above target).
        aepo_adv_threshold (`float`, *optional*, defaults to `0.05`):
            Group advantage above which a temperature-T sample is reinforced.
        aepo_mode (`str`, *optional*, defaults to `"splice"`):
            How the reinforced samples train, and by which rules. `"splice"` (the reference code's): they replace the
            first rows of the training batch (batch size unchanged) with advantage `aepo_coef` and go through TRL's
            own loss (same PPO clip, loss type and every other family); the reference's rules: the first batch, with
            nothing measured, takes T_high and the full cap; entropy exactly at the target counts as below it (`<=`);
            above the target `min(aepo_max_samples, n) // 2` samples train, the first ones in batch order; the
            entropy steered on is `-log p` of the trained (sampled) tokens, which reads above the policy's own on hot
            samples. `"term"` (0.1.0's): a separate, unclipped REINFORCE term `aepo_coef * mean(-exp(logp -
            old_logp))` over the samples, added to TRL's untouched loss; 0.1.0's rules: the first batch counts as
            above the target, the target itself too, above it `min(n, aepo_max_samples // 2)` samples train, drawn
            uniformly (a generator seeded alike on every process), and the entropy steered on is the
            full-distribution entropy at each trained position. Until 0.2.0 each rule was a field of its own
            (`aepo_first_step`, `aepo_at_target`, `aepo_cap_rule`, `aepo_sample_order`, `aepo_entropy_estimator`;
            CHANGELOG.md).
        aepo_regenerate_fraction (`float`, *optional*, defaults to `0.25`):
            Fraction of the batch's prompt groups generated again at T (reference: the first quarter). Each process
            regenerates its first `floor(fraction x its groups)` groups (at least one); a process whose rows split a
            group regenerates all its rows. `1.0` regenerates every prompt.

        Up to version 0.1.0 the behaviour was `aepo_mode="term"`, `aepo_regenerate_fraction=1.0`
        (`trl_grpo_ext.config.AEPO_0_1_0`).
    """

    switches = ("entropy_control",)

    #: Finite but absurd values refused: field -> (lowest, highest, why, example) (config.section.bounds).
    field_bounds = {
        "aepo_target_entropy": bounds(
            0.0, 20.0, "token entropy is at most ln(vocabulary size), under 20 nats", "aepo_target_entropy=0.5"
        ),
        "aepo_temperature_high": bounds(
            0.0, 10.0, "a sampling temperature above 10 samples noise", "aepo_temperature_high=1.2"
        ),
        "aepo_temperature_low": bounds(
            0.0, 10.0, "a sampling temperature above 10 samples noise", "aepo_temperature_low=0.8"
        ),
        "aepo_coef": bounds(0.0, 1000.0, "a weight above 1000 leaves only the AEPO term in the loss", "aepo_coef=1.0"),
    }

    entropy_control: str = family_switch(
        "entropy_control",
        default="none",
        help="'aepo': hold the policy's entropy at aepo_target_entropy (arXiv 2510.08141).",
    )
    aepo_target_entropy: float = field(
        default=0.5,
        metadata={
            "help": "Mean token entropy AEPO holds.",
        },
    )
    aepo_temperature_high: float = field(
        default=1.2,
        metadata={
            "help": "AEPO temperature below target entropy.",
        },
    )
    aepo_temperature_low: float = field(
        default=0.8,
        metadata={
            "help": "AEPO temperature at/above target entropy.",
        },
    )
    aepo_coef: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the AEPO REINFORCE term.",
        },
    )
    aepo_max_samples: int = field(default=60, metadata={"help": "Most AEPO samples per generation batch."})
    aepo_adv_threshold: float = field(default=0.05, metadata={"help": "Group advantage above which a sample counts."})
    aepo_mode: Literal["splice", "term"] = field(
        default="splice",
        metadata={
            "help": "'splice' (reference): the reinforced samples replace the first training rows at advantage "
            "aepo_coef, through TRL's clipped loss. 'term': a separate unclipped REINFORCE term."
        },
    )
    aepo_regenerate_fraction: float = field(
        default=0.25, metadata={"help": "Fraction of the prompt groups generated again at T (reference: 0.25)."}
    )

    def check(self) -> None:
        if not (math.isfinite(self.aepo_target_entropy) and self.aepo_target_entropy > 0):
            _fail("aepo_target_entropy", self.aepo_target_entropy, "must be a finite entropy > 0", "e.g. 0.5 (nats)")
        if not 0 < self.aepo_temperature_low < self.aepo_temperature_high:
            _fail(
                "aepo_temperature_low",
                self.aepo_temperature_low,
                f"needs 0 < aepo_temperature_low < aepo_temperature_high ({self.aepo_temperature_high})",
                "e.g. 0.8 and 1.2 (paper)",
            )
        if not (math.isfinite(self.aepo_coef) and self.aepo_coef > 0):
            _fail("aepo_coef", self.aepo_coef, "must be a finite number > 0", "e.g. aepo_coef=1.0")
        if self.aepo_max_samples < 1:
            _fail("aepo_max_samples", self.aepo_max_samples, "must be >= 1", "e.g. 60 (paper)")
        if not 0 < self.aepo_regenerate_fraction <= 1:
            _fail(
                "aepo_regenerate_fraction",
                self.aepo_regenerate_fraction,
                "must lie in (0, 1] (a fraction of the prompt groups)",
                "e.g. 0.25 (reference) or 1.0 for every prompt",
            )
