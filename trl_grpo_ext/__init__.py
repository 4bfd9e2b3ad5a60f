"""trl-grpo-ext: anti-collapse extensions for TRL's GRPOTrainer.

from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer
"""

from .config import GRPOExtConfig
from .trainer import GRPOExtTrainer

__version__ = "0.1.0"

__all__ = ["GRPOExtConfig", "GRPOExtTrainer", "__version__"]
