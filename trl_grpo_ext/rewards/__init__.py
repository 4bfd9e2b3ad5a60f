"""Reward functions by name, for recipes and YAML configs (``reward_funcs: [math_accuracy, boxed_format]``).

Names load on first use (PEP 562): ``trl_grpo_ext.rewards.math`` and the scoring workers of
:mod:`trl_grpo_ext.rewards.pool` import neither torch nor transformers. The library registers its math rewards; the
project's lab registers its offline tasks' rewards (``grpo_lab.offline.register()``, which the recipe calls), and a
user registers their own the same way (``REWARD_FUNCS.register("name")(func)``).
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.registry import Registry
    from .math import boxed_format_reward, math_accuracy_reward, set_math_reward_workers

    REWARD_FUNCS: Registry
    STEP_REWARD_FUNCS: Registry

__all__ = [
    "REWARD_FUNCS",
    "STEP_REWARD_FUNCS",
    "boxed_format_reward",
    "math_accuracy_reward",
    "set_math_reward_workers",
]

_MATH = ("boxed_format_reward", "math_accuracy_reward", "set_math_reward_workers")
_LOCK = threading.Lock()


def _registries() -> None:
    """Build ``REWARD_FUNCS`` (outcome rewards: one float or None per completion) and ``STEP_REWARD_FUNCS`` (one list
    of floats per completion, one per step) once."""
    from ..core.registry import Registry
    from .math import boxed_format_reward, math_accuracy_reward

    rewards = Registry("reward_func", symbol="REWARD_FUNCS")
    steps = Registry("step_reward_func", symbol="STEP_REWARD_FUNCS")
    rewards.register("math_accuracy")(math_accuracy_reward)
    rewards.register("boxed_format")(boxed_format_reward)
    globals().update(REWARD_FUNCS=rewards, STEP_REWARD_FUNCS=steps)


def __getattr__(name: str):
    if name in _MATH:
        value = getattr(importlib.import_module(".math", __name__), name)
        globals()[name] = value
        return value
    if name in ("REWARD_FUNCS", "STEP_REWARD_FUNCS"):
        with _LOCK:  # built once, even when two threads ask first
            if name not in globals():
                _registries()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
