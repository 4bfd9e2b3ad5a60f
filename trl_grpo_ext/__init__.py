"""trl-grpo-ext: anti-collapse extensions for TRL's GRPOTrainer.

from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer

The two names load on first use (PEP 562), so ``import trl_grpo_ext.core`` (the pure tensor functions) does not
import TRL or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import GRPOExtConfig
    from .trainer import GRPOExtTrainer

__version__ = "0.2.0"

__all__ = ["GRPOExtConfig", "GRPOExtTrainer", "__version__"]

_LAZY = {"GRPOExtConfig": ".config", "GRPOExtTrainer": ".trainer"}


def __getattr__(name: str):
    if name in _LAZY:
        # the families register the members (and their rules, which GRPOExtConfig.validate runs) with the config
        importlib.import_module(".families", __name__)
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
