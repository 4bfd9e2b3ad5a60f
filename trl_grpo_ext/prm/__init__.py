"""Process reward models: step segmentation, step reward sources, and a PRM training helper."""

from .segmentation import Steps, char_ends_to_tokens, segment_completion, split_steps
from .sources import CausalLMPRM, TokenClassificationPRM, call_step_function, sum_step_rewards

__all__ = [
    "CausalLMPRM",
    "Steps",
    "TokenClassificationPRM",
    "call_step_function",
    "char_ends_to_tokens",
    "segment_completion",
    "split_steps",
    "sum_step_rewards",
]
