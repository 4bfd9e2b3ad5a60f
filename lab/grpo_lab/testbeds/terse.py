"""The "terse" testbed: a second *healthy* setting whose completions lengthen because the policy learns, by another
mechanism than :mod:`~grpo_lab.testbeds.scratchpad` (no work shown: answers completed).

Task: the addition testbed's (``"47+8="`` -> ``"55"``). Warm start: the careless teacher, who one time in
:data:`TERSE` writes only the last digit of its answer (``"5"``). Training on the exact reward teaches the policy to
write whole sums: the mean completion grows by about a quarter (in tokens with the end token: from about 2.4 towards
3) while gold rises, which is the drift the length signal of the detector alarms on. Nothing is gamed: a negative
control.

Rewards: ``gold_reward`` and ``proxy_reward`` are the exact grader; the audit is
:func:`~grpo_lab.testbeds.audit.tolerant_audit`.
"""

from __future__ import annotations

import random

from .. import testbed
from .audit import tolerant_audit
from .length_bias import SPLITS, gold_reward, problems

#: How often the careless teacher writes only the last digit of its answer.
TERSE = 0.6
MAX_COMPLETION_LENGTH = testbed.MAX_COMPLETION_LENGTH
MAX_STEPS = 300

proxy_reward = gold_reward
audit_reward = tolerant_audit


def terse_answer(prompt: str, rng: random.Random) -> str:
    """The careless teacher's answer, cut to its last digit with probability :data:`TERSE`."""
    answer = testbed.careless_answer(prompt, rng)
    return answer[-1] if rng.random() < TERSE else answer


sft_dataset, warm_start, grpo_settings = testbed.teacher_testbed(
    "terse",
    kind=f"terse{TERSE:g}",
    salt=92_017,
    answer=terse_answer,
    max_completion_length=MAX_COMPLETION_LENGTH,
    max_steps=MAX_STEPS,
)


__all__ = [
    "MAX_COMPLETION_LENGTH",
    "MAX_STEPS",
    "SPLITS",
    "TERSE",
    "audit_reward",
    "gold_reward",
    "grpo_settings",
    "problems",
    "proxy_reward",
    "sft_dataset",
    "terse_answer",
    "warm_start",
]
