"""Pure tensor functions of trl-grpo-ext: no trainer, no accelerate, no config objects.

Every function takes explicit keyword arguments, a ``torch.Generator`` wherever it draws, and cites its paper.
"""

from .advantages import (
    entropy_shaped_advantages,
    group_relative_advantages,
    nan_std,
    scale_positive_advantages,
    w_reinforce_advantages,
)
from .collectives import LOCAL, Collectives
from .diversity import (
    batch_diversity,
    distinct_n,
    distinct_n_batch,
    pass_at_k,
    prompt_information,
    repetition_rate,
    repetition_rates,
    self_bleu,
    self_bleu_batch,
    unique_fraction,
)
from .hack_detection import DriftAlarm, DriftRule, drift_alarm, drift_from_best, trailing_mean
from .kl_control import AdaptiveKLController, DiversityKLController
from .pkpo import annealed_k, pass_at_k_weights
from .prm import pad_steps, prm_step_advantages
from .registry import Registry
from .sample_filter import SAMPLE_FILTER_STRATEGIES, Strategy, pf_keep_mask, r_squared, rank_filter_strategies
from .token_clip import (
    clip_cov_mask,
    kl_cov_mask,
    kl_cov_penalty,
    num_selected,
    ppo_clipped_mask,
    select_top_k,
    token_covariance,
)

__all__ = [
    "entropy_shaped_advantages",
    "scale_positive_advantages",
    "w_reinforce_advantages",
    "annealed_k",
    "pass_at_k_weights",
    "LOCAL",
    "SAMPLE_FILTER_STRATEGIES",
    "Strategy",
    "AdaptiveKLController",
    "Collectives",
    "DiversityKLController",
    "Registry",
    "DriftAlarm",
    "DriftRule",
    "batch_diversity",
    "drift_alarm",
    "drift_from_best",
    "prompt_information",
    "trailing_mean",
    "clip_cov_mask",
    "distinct_n",
    "distinct_n_batch",
    "group_relative_advantages",
    "kl_cov_mask",
    "kl_cov_penalty",
    "nan_std",
    "num_selected",
    "pass_at_k",
    "pad_steps",
    "pf_keep_mask",
    "ppo_clipped_mask",
    "prm_step_advantages",
    "r_squared",
    "rank_filter_strategies",
    "repetition_rate",
    "repetition_rates",
    "self_bleu",
    "self_bleu_batch",
    "select_top_k",
    "token_covariance",
    "unique_fraction",
]
