"""The config section of one family: KL control (Ziegler et al. 2019)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .section import ConfigSection, _fail, bounds, family_switch


@dataclass
class KLControlConfig(ConfigSection):
    r"""
    > KL control (Ziegler et al. 2019)

        kl_control (`str`, *optional*, defaults to `"fixed"`):
            `"fixed"`: TRL's constant `beta`. `"adaptive"`: beta follows `kl_target` (Ziegler's proportional
            controller on the global per-token mean KL of each optimizer step); needs `beta > 0` as its start.
        kl_target (`float`, *optional*, defaults to `0.1`):
            Target per-token mean KL (k3 estimate) of the adaptive controller.
        kl_horizon (`float`, *optional*, defaults to `10000`):
            Horizon of the adaptive controller, in completions (Ziegler: 10000).
        kl_beta_min (`float`, *optional*, defaults to `1e-4`):
            Lower clamp of beta (> 0: TRL cannot switch the KL term back on once beta is 0).
        kl_beta_max (`float`, *optional*, defaults to `1.0`):
            Upper clamp of beta.
        kl_diversity_n (`int`, *optional*, defaults to `2`):
            n of the Distinct-N that `kl_control="diversity"` steers (over each generation batch, all processes).
        kl_diversity_target (`float`, *optional*, defaults to `0.5`):
            Distinct-N target of `kl_control="diversity"`: beta rises while diversity is below it.
        ref_update (`str`, *optional*, defaults to `"none"`):
            `"reset"`: the reference model becomes the current policy every `ref_reset_steps` optimizer steps and/or
            when the step's KL term `beta x KL` exceeds `ref_reset_kl_term` (ProRL's reference reset; slime's
            `--ref-update-interval`). `"none"`: TRL's fixed reference (and its `sync_ref_model`, which this refuses
            beside a reset).
        ref_reset_steps (`int`, *optional*):
            Reset the reference every this many optimizer steps.
        ref_reset_kl_term (`float`, *optional*):
            Reset the reference when an optimizer step's KL term, beta x the per-token mean KL to it (every process),
            exceeds this.
        ref_reset_optimizer (`bool`, *optional*, defaults to `False`):
            At a reset, also zero the optimizer's moments and step counts (slime's `--reset-optimizer-states`).
    """

    switches = ("kl_control", "ref_update")

    #: Finite but absurd values refused: field -> (lowest, highest, why, example) (config.section.bounds).
    field_bounds = {
        "kl_target": bounds(0.0, 100.0, "a per-token mean KL target above 100 nats is never a target", "kl_target=0.1"),
        "kl_horizon": bounds(
            1.0,
            1000000000.0,
            "the horizon counts completions; below one, beta jumps many-fold per step",
            "kl_horizon=10000",
        ),
        "kl_beta_min": bounds(
            0.0, 100.0, "beta is clamped to [kl_beta_min, kl_beta_max], at most 100", "kl_beta_min=1e-4"
        ),
        "kl_beta_max": bounds(
            0.0, 100.0, "beta is clamped to [kl_beta_min, kl_beta_max], at most 100", "kl_beta_max=1.0"
        ),
    }

    kl_control: str = family_switch(
        "kl_control",
        default="fixed",
        help="'fixed': TRL's constant beta. 'adaptive': Ziegler's controller steers beta to kl_target. "
        "'diversity': beta rises while Distinct-N (kl_diversity_n) is under kl_diversity_target.",
    )
    kl_target: float = field(
        default=0.1,
        metadata={
            "help": "Target per-token mean KL of the adaptive controller.",
        },
    )
    kl_horizon: float = field(
        default=10000.0,
        metadata={
            "help": "Controller horizon, in completions (Ziegler: 10000).",
        },
    )
    kl_beta_min: float = field(
        default=1e-4,
        metadata={
            "help": "Lower clamp of beta (> 0).",
        },
    )
    kl_beta_max: float = field(
        default=1.0,
        metadata={
            "help": "Upper clamp of beta.",
        },
    )
    kl_diversity_n: int = field(default=2, metadata={"help": "n of the Distinct-N that kl_control='diversity' steers."})
    kl_diversity_target: float = field(
        default=0.5, metadata={"help": "Distinct-N target of kl_control='diversity' (beta rises below it)."}
    )

    ref_update: str = family_switch(
        "ref_update",
        default="none",
        help="'reset': the reference becomes the current policy every ref_reset_steps steps and/or when "
        "beta x KL exceeds ref_reset_kl_term (ProRL). 'none': TRL's fixed reference.",
    )
    ref_reset_steps: int | None = field(
        default=None, metadata={"help": "Reset the reference every this many optimizer steps."}
    )
    ref_reset_kl_term: float | None = field(
        default=None, metadata={"help": "Reset the reference when a step's KL term beta x KL exceeds this."}
    )
    ref_reset_optimizer: bool = field(
        default=False, metadata={"help": "At a reset, also zero the optimizer's moments (slime)."}
    )

    def check(self) -> None:
        if self.ref_reset_steps is not None and self.ref_reset_steps < 1:
            _fail("ref_reset_steps", self.ref_reset_steps, "must be >= 1 (optimizer steps)", "e.g. ref_reset_steps=200")
        if self.ref_reset_kl_term is not None and not self.ref_reset_kl_term > 0:
            _fail("ref_reset_kl_term", self.ref_reset_kl_term, "must be > 0", "e.g. ref_reset_kl_term=0.05")
        if self.ref_update == "reset" and self.ref_reset_steps is None and self.ref_reset_kl_term is None:
            _fail(
                "ref_update",
                self.ref_update,
                "a reset needs a trigger, and none is set",
                "set ref_reset_steps (every K steps) and/or ref_reset_kl_term (when beta x KL exceeds it)",
            )
        for name in ("ref_reset_steps", "ref_reset_kl_term", "ref_reset_optimizer"):
            if self.ref_update == "none" and getattr(self, name) not in (None, False):
                _fail(name, getattr(self, name), "is read by ref_update='reset' only", "set ref_update='reset'")
        if not (math.isfinite(self.kl_beta_min) and self.kl_beta_min > 0):
            _fail(
                "kl_beta_min",
                self.kl_beta_min,
                "must be > 0: TRL builds no reference model when beta reaches 0 and cannot restart the KL term",
                "e.g. kl_beta_min=1e-4",
            )
        if not self.kl_beta_max >= self.kl_beta_min:
            _fail("kl_beta_max", self.kl_beta_max, f"must be >= kl_beta_min={self.kl_beta_min}", "raise kl_beta_max")
        if not (math.isfinite(self.kl_target) and self.kl_target > 0):
            _fail("kl_target", self.kl_target, "must be a finite KL > 0", "e.g. kl_target=0.1 (per-token mean KL)")
        if not (math.isfinite(self.kl_horizon) and self.kl_horizon > 0):
            _fail("kl_horizon", self.kl_horizon, "must be > 0", "e.g. kl_horizon=10000 (completions)")
        if not 0 < self.kl_diversity_target <= 1:
            _fail("kl_diversity_target", self.kl_diversity_target, "Distinct-N lies in (0, 1]", "e.g. 0.5")
        if self.kl_diversity_n < 1:
            _fail("kl_diversity_n", self.kl_diversity_n, "must be >= 1", "e.g. kl_diversity_n=2")
