"""Validation of checkpointed state values (``grpo_ext_state.json``): a damaged or edited file must not train on.

A loaded number that is missing, of the wrong type, NaN / infinite or out of range raises ``ValueError`` naming the
key; the trainer adds the file and the way out (``ext_resume_state="ignore"``).
"""

from __future__ import annotations

import math
from typing import Any


def state_number(
    state: Any,
    key: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    optional: bool = False,
    integer: bool = False,
) -> float | int | None:
    """``state[key]`` as a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``).

    ``optional``: a missing key or ``None`` gives ``None``. ``integer``: the value must be a whole number (an int, or
    a float such as ``3.0``). Booleans are refused (``True`` is not a beta).
    """
    if not isinstance(state, dict):
        raise ValueError(f"expected a JSON object with {key!r}, got {type(state).__name__}")
    value = state.get(key)
    if value is None:
        if optional:
            return None
        raise ValueError(f"{key!r} is missing" if key not in state else f"{key!r} is null")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key!r} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{key!r} must be finite, got {value!r}")
    if integer:
        if value != int(value):
            raise ValueError(f"{key!r} must be a whole number, got {value!r}")
        value = int(value)
    below = low is not None and (value <= low if low_open else value < low)
    if below or (high is not None and value > high):
        left = "(" if low_open else "["
        raise ValueError(f"{key!r} = {value!r} is outside {left}{low}, {high}]")
    return value
