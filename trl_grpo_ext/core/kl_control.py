"""KL-coefficient controllers: beta follows a target instead of staying fixed.

Notation:
    beta: the KL coefficient TRL multiplies into the per-token k3 KL estimate (``GRPOConfig.beta``).
    KL: the measured KL of the policy to the reference, here the masked per-token mean over an optimizer step (the
        convention of verl and OpenRLHF; Ziegler et al. use the per-sequence sum, so their target 6 is not comparable).
"""

from __future__ import annotations

import math
from typing import Any

from .state import state_number


class AdaptiveKLController:
    """Proportional controller of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences", sec. 2.2).

    ``e = clip(KL / target - 1, -0.2, 0.2)`` and ``beta <- beta * (1 + e * n_steps / horizon)``, then clamped to
    ``[beta_min, beta_max]``. The floor keeps beta strictly positive: TRL 1.16 builds the reference model only when
    beta starts non-zero and cannot switch the KL term back on later.

    Args:
        init_beta: starting beta, inside ``[beta_min, beta_max]``.
        target: KL the controller steers to (> 0).
        horizon: how many samples (``n_steps`` units) a full 20% correction takes (> 0; Ziegler: 10000).
        beta_min, beta_max: clamp, ``0 < beta_min <= beta_max``.

    Example:
        >>> ctl = AdaptiveKLController(0.1, target=0.05, horizon=100, beta_min=1e-3, beta_max=1.0)
        >>> round(ctl.update(0.10, n_steps=10), 4)  # KL twice the target: e = 0.2, beta * (1 + 0.02)
        0.102
    """

    def __init__(self, init_beta: float, target: float, horizon: float, *, beta_min: float, beta_max: float):
        if not beta_min > 0:
            raise ValueError(f"beta_min must be > 0 (a zero beta switches TRL's KL term off for good), got {beta_min}.")
        if beta_max < beta_min:
            raise ValueError(f"beta_max ({beta_max}) must be >= beta_min ({beta_min}).")
        if not beta_min <= init_beta <= beta_max:
            raise ValueError(f"init_beta ({init_beta}) must lie in [beta_min, beta_max] = [{beta_min}, {beta_max}].")
        if not target > 0:
            raise ValueError(f"target must be > 0, got {target}.")
        if not horizon > 0:
            raise ValueError(f"horizon must be > 0, got {horizon}.")
        self.value = float(init_beta)
        self.target = float(target)
        self.horizon = float(horizon)
        self.beta_min = float(beta_min)
        self.beta_max = float(beta_max)
        self.num_updates = 0
        self.last_error = 0.0

    def error(self, measured: float) -> float:
        """Relative error in [-0.2, 0.2]: positive raises beta (KL above target)."""
        return min(max(measured / self.target - 1.0, -0.2), 0.2)

    def update(self, kl: float, n_steps: int) -> float:
        """Move beta after observing ``kl`` over ``n_steps`` samples; a non-finite kl leaves beta unchanged."""
        if not math.isfinite(kl):
            return self.value
        error = self.error(kl)
        self.value = min(max(self.value * (1.0 + error * n_steps / self.horizon), self.beta_min), self.beta_max)
        self.num_updates += 1
        self.last_error = error
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "target": self.target,
            "horizon": self.horizon,
            "beta_min": self.beta_min,
            "beta_max": self.beta_max,
            "num_updates": self.num_updates,
            "last_error": self.last_error,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore beta and the update count; raises ``ValueError`` naming the key on a missing, non-finite or
        non-positive value. A beta outside this run's ``[beta_min, beta_max]`` (the clamp was changed between runs)
        is clamped into it: the caller can compare :attr:`value` with ``state["value"]`` to report it."""
        value = state_number(state, "value", low=0.0, low_open=True)
        num_updates = state_number(state, "num_updates", low=0, optional=True, integer=True)
        last_error = state_number(state, "last_error", low=-0.2, high=0.2, optional=True)
        assert value is not None  # not optional: state_number raised otherwise
        self.value = min(max(float(value), self.beta_min), self.beta_max)
        self.num_updates = int(num_updates or 0)
        self.last_error = float(last_error or 0.0)


class DiversityKLController(AdaptiveKLController):
    """Beta driven by diversity: raised when Distinct-N falls under its target, relaxed when above.

    The seed design document (sec. 9.4) asks to monitor Distinct-N and tune beta from it: a collapsing policy (its
    completions repeating each other) is pulled back toward the reference. Same proportional law, clip and clamps as
    :class:`AdaptiveKLController`, with the error ``clip((target - d) / target, -0.2, 0.2)``.

    Example:
        >>> ctl = DiversityKLController(0.1, target=0.5, horizon=100, beta_min=1e-3, beta_max=1.0)
        >>> round(ctl.update(0.25, n_steps=10), 4)  # diversity half the target: e = 0.2 (clipped), beta * 1.02
        0.102
    """

    def error(self, measured: float) -> float:
        return min(max((self.target - measured) / self.target, -0.2), 0.2)
