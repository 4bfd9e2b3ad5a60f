"""A member whose hooks break the interface: mypy must refuse it (tests/test_typing.py)."""

from __future__ import annotations

import torch

from trl_grpo_ext.families import Extension, LossContext


class WrongHooks(Extension):
    def select_tokens(self, logps: torch.Tensor, ctx: LossContext) -> list[int]:  # a mask, not a list
        return []

    def extra_loss(self, ctx: LossContext) -> float:  # a tensor, not a float
        return 0.0
