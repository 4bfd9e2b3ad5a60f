"""The config section of one family: Token-level clipping (Cui et al. 2025, arXiv 2505.22617)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Literal

from .section import ConfigSection, _fail, bounds, family_switch

#: A token-clip ratio above this is more likely a percentage pasted as a fraction (0.2 for 0.2%) than intended.
PERCENT_TRAP_RATIO = 0.05


@dataclass
class TokenClipConfig(ConfigSection):
    r"""
    > Token-level clipping (Cui et al. 2025, arXiv 2505.22617) and trust regions (DPPO, Qi et al. 2026, arXiv
    > 2602.04879)

        token_clip (`str`, *optional*, defaults to `"none"`):
            `"clip_cov"` removes the gradient of a few random high-covariance tokens; `"kl_cov"` adds a KL penalty
            `kl_cov_coef * |logp - old_logp|` on the highest-covariance tokens; `"dppo"` replaces TRL's ratio clip
            with DPPO's binary trust region (a token whose probability moved more than `dppo_delta_*` from the
            rollout policy's, the way its advantage pushes, loses its policy gradient). `"none"` disables them.
        token_clip_scope (`str`, *optional*, defaults to `"local"`):
            `"local"`: tokens are chosen within each process's micro-batch (the reference implementation);
            `"global"`: the covariance means, counts and selection thresholds span all processes.
        clip_cov_ratio (`float`, *optional*, defaults to `2e-4`):
            Fraction of valid tokens Clip-Cov detaches (paper and verl; a value above 0.05 warns).
        clip_cov_lb (`float`, *optional*, defaults to `1.0`):
            Lower covariance bound of Clip-Cov candidates.
        clip_cov_ub (`float`, *optional*, defaults to `5.0`):
            Upper covariance bound of Clip-Cov candidates.
        kl_cov_ratio (`float`, *optional*, defaults to `2e-3`):
            Fraction of valid tokens KL-Cov penalises (paper: 2e-3 for 7B, 2e-4 for 32B; a fraction, not percent:
            a value above 0.05 warns).
        kl_cov_coef (`float`, *optional*, defaults to `1.0`):
            Coefficient of the KL-Cov penalty (paper scripts: 1.0; verl's config default: 0.1).
        kl_cov_ppo_clip (`bool`, *optional*, defaults to `False`):
            Keep TRL's PPO ratio clip (`epsilon`, `epsilon_high`) under KL-Cov. The paper and verl drop it (False).
            With False, a clip you asked for (`epsilon_high`, or `loss_type="cispo"`, whose cap is `epsilon_high`) is
            refused rather than silently dropped: set `kl_cov_ppo_clip=True` to keep it.
    """

    switches = ("token_clip",)
    #: Finite but absurd values refused: field -> (lowest, highest, why, example) (config.section.bounds).
    field_bounds = {
        "kl_cov_coef": bounds(
            0.0, 1000.0, "a weight above 1000 leaves only the KL-Cov penalty in the loss", "kl_cov_coef=1.0"
        ),
    }

    token_clip: str = family_switch(
        "token_clip",
        default="none",
        help="Token-level stabilisation: 'clip_cov' detaches a few random high-covariance tokens, 'kl_cov' "
        "penalises the top-covariance tokens with |logp - old_logp| (Cui et al. 2025); 'dppo' replaces TRL's "
        "ratio clip with DPPO's binary trust region (Qi et al. 2026).",
    )
    token_clip_scope: Literal["local", "global"] = field(
        default="local",
        metadata={
            "help": "'local': pick tokens within each process's micro-batch (reference implementation); 'global': "
            "covariance means and selection thresholds span all processes."
        },
    )
    clip_cov_ratio: float = field(default=2e-4, metadata={"help": "Fraction of valid tokens Clip-Cov detaches."})
    clip_cov_lb: float = field(default=1.0, metadata={"help": "Lower covariance bound of Clip-Cov candidates."})
    clip_cov_ub: float = field(default=5.0, metadata={"help": "Upper covariance bound of Clip-Cov candidates."})
    kl_cov_ratio: float = field(
        default=2e-3,
        metadata={"help": "Fraction of valid tokens KL-Cov penalises (paper: 2e-3 for 7B, 2e-4 for 32B)."},
    )
    kl_cov_coef: float = field(
        default=1.0,
        metadata={
            "help": "Coefficient of the KL-Cov penalty |logp - old_logp|.",
        },
    )
    kl_cov_ppo_clip: bool = field(
        default=False,
        metadata={"help": "Keep TRL's PPO ratio clip under KL-Cov (the paper and verl drop it)."},
    )

    def check(self) -> None:
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value <= 1):
                _fail(name, value, "must be a fraction in (0, 1]", f"e.g. {name}=2e-4 (write 0.02% as 2e-4, not 0.02)")
        if not self.clip_cov_lb < self.clip_cov_ub:
            _fail(
                "clip_cov_lb",
                self.clip_cov_lb,
                f"must be below clip_cov_ub={self.clip_cov_ub}",
                "use a window such as clip_cov_lb=1, clip_cov_ub=5",
            )
        if not (math.isfinite(self.kl_cov_coef) and self.kl_cov_coef > 0):
            _fail("kl_cov_coef", self.kl_cov_coef, "must be a finite number > 0", "e.g. kl_cov_coef=1.0 (paper)")
        if self.token_clip == "none":
            return
        name = f"{self.token_clip}_ratio"
        if getattr(self, name, 0.0) > PERCENT_TRAP_RATIO:
            # PRIME-RL's scripts write k_percent=0.2 meaning 0.2% of tokens; pasted here it means 20%.
            warnings.warn(
                f"{name}={getattr(self, name)} selects {getattr(self, name):.0%} of the valid tokens: the value is a "
                "fraction, not a percentage (the paper uses 2e-4 to 2e-3; PRIME-RL's scripts write 0.2 for 0.2%, "
                f"which is {name}=2e-3 here). Ignore this if you meant it.",
                UserWarning,
                stacklevel=4,
            )
