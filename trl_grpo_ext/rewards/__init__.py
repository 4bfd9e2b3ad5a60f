"""Reward functions by name, for recipes and YAML configs (``reward_funcs: [math_accuracy, boxed_format]``)."""

from __future__ import annotations

from .. import testbed, testkit
from ..core.registry import Registry
from .math import boxed_format_reward, math_accuracy_reward, set_math_reward_workers

#: Outcome reward functions (TRL signature: one float or None per completion).
REWARD_FUNCS = Registry("reward_func")
#: Step reward functions (one list of floats per completion, one per step).
STEP_REWARD_FUNCS = Registry("step_reward_func")

REWARD_FUNCS.register("math_accuracy")(math_accuracy_reward)
REWARD_FUNCS.register("boxed_format")(boxed_format_reward)
REWARD_FUNCS.register("exact_answer")(testbed.answer_reward)
REWARD_FUNCS.register("final_answer")(testkit.final_answer_reward)
REWARD_FUNCS.register("exact_match")(testkit.exact_match_reward)
REWARD_FUNCS.register("digit_fraction")(testkit.digit_fraction_reward)
STEP_REWARD_FUNCS.register("arithmetic_steps")(testkit.arithmetic_step_reward)

__all__ = [
    "REWARD_FUNCS",
    "STEP_REWARD_FUNCS",
    "boxed_format_reward",
    "math_accuracy_reward",
    "set_math_reward_workers",
]
