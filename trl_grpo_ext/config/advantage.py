"""The config section of one family: Advantage estimation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..core.advantages import StdKind
from ..core.pkpo import Estimator
from .section import ConfigSection, _fail, bounds, family_switch


@dataclass
class AdvantageConfig(ConfigSection):
    r"""
    > Advantage estimation

        advantage_estimator (`str`, *optional*, defaults to `"grpo"`):
            How advantages are computed. `"grpo"`: TRL's group-normalised outcome reward. `"prm"`: process
            supervision (DeepSeekMath sec. 4.1.3): step rewards normalised over the group, token advantage = sum of the
            normalised rewards of the steps ending at or after the token. Step rewards come from
            `GRPOExtTrainer(step_reward_funcs=...)` and/or the PRM model `prm_model_name_or_path`. `"pass_at_k"`: PKPO
            (Walder & Karkhanis 2025): reward transformations whose gradient estimates the gradient of pass@k (binary
            rewards) or of the best reward of k samples (continuous rewards), see `pkpo_*`.
        advantage_std (`str`, *optional*, defaults to `"sample"`):
            Standard deviation used to normalise rewards in a group: `"sample"` (n - 1, TRL's default) or
            `"population"` (n, as written in DeepSeekMath and the seed document).
        pkpo_k (`int` or `None`, *optional*, defaults to `None`):
            The k of pass@k that `advantage_estimator="pass_at_k"` optimises, 1 <= k <= num_generations. `None`:
            `min(4, num_generations)` (logged as `pkpo/k`), so the default works with any group size.
        pkpo_estimator (`str`, *optional*, defaults to `"loo_minus_one"`):
            `"loo_minus_one"`: PKPO's k-1 leave-one-out baselined weights (lowest variance; a wrong binary sample gets
            0; at k = 1 the leave-one-out baseline, RLOO); `"s"`: the plain unbiased weights (no baseline).
        pkpo_anneal_fraction (`float`, *optional*, defaults to `0.0`):
            Anneal k linearly from `pkpo_k` down to 1 over this fraction of training (0: constant k), as PKPO does to
            end on pass@1.
        advantage_weighting (`str`, *optional*, defaults to `"none"`):
            Reweighting of the estimator's advantages. `"w_reinforce"`: W-REINFORCE (Zhu et al. 2025, arXiv
            2506.01347), positive samples weighted by `w_reinforce_lambda`, negative ones fully. `"entropy_advantage"`:
            entropy-shaped advantages (Cheng et al. 2025, arXiv 2506.14758), each token's advantage plus a capped
            bonus from the policy's entropy there (`entropy_adv_*`; `entropy_control` until 0.2.0).
        w_reinforce_lambda (`float`, *optional*, defaults to `0.1`):
            Weight of the positive samples (the paper's lambda; 0 trains on negative samples only).
        w_reinforce_baseline (`str`, *optional*, defaults to `"none"`):
            `"none"` (the paper): advantage `w_reinforce_lambda` for a sample whose reward exceeds
            `w_reinforce_threshold`, -1 for any other, no group baseline (only with `advantage_estimator="grpo"`,
            whose advantage it replaces). `"group"`: the estimator's own advantages, positive entries times
            `w_reinforce_lambda` (any estimator).
        w_reinforce_threshold (`float`, *optional*, defaults to `0.5`):
            With `w_reinforce_baseline="none"`: rewards above it count as positive (0.5 for 0/1 accuracy rewards).
        entropy_adv_alpha (`float`, *optional*, defaults to `0.4`):
            With `advantage_weighting="entropy_advantage"`: every trained token's advantage gains
            `min(entropy_adv_alpha * H_t, |A_t| / entropy_adv_kappa)`, `H_t` the policy's detached entropy at the
            token; no entropy loss.
        entropy_adv_kappa (`float`, *optional*, defaults to `2.0`):
            Cap of the entropy bonus as a fraction `1 / kappa` of `|A_t|`; `kappa >= 1` keeps every advantage's sign.
    """

    switches = ("advantage_estimator", "advantage_weighting", "advantage_std")

    #: Finite but absurd values refused: field -> (lowest, highest, why, example) (config.section.bounds).
    field_bounds = {
        "w_reinforce_lambda": bounds(
            0.0,
            1000.0,
            "the positive samples' weight against the negatives' 1; above 1000 the negatives vanish",
            "w_reinforce_lambda=0.1",
        ),
        "entropy_adv_alpha": bounds(
            0.0,
            1000.0,
            "an entropy weight above 1000 makes the bonus always hit its |A| / kappa cap",
            "entropy_adv_alpha=0.4",
        ),
        "entropy_adv_kappa": bounds(
            1.0, 1000000.0, "kappa >= 1 keeps the advantages' signs; above 1e6 the bonus is 0", "kappa=2.0"
        ),
    }

    advantage_estimator: str = family_switch(
        "advantage_estimator",
        default="grpo",
        help="How advantages are computed. 'grpo': TRL's group-normalised outcome reward. 'prm': process "
        "supervision from step rewards (DeepSeekMath sec. 4.1.3). 'pass_at_k': PKPO, the gradient of pass@k.",
    )
    pkpo_k: int | None = field(
        default=None,
        metadata={"help": "k of pass@k for advantage_estimator='pass_at_k'; None: min(4, num_generations)."},
    )
    pkpo_estimator: Estimator = field(
        default="loo_minus_one",
        metadata={"help": "PKPO weights: 'loo_minus_one' (baselined, lowest variance) or 's' (plain, unbiased)."},
    )
    pkpo_anneal_fraction: float = field(
        default=0.0, metadata={"help": "Anneal k from pkpo_k to 1 over this fraction of training (0: constant)."}
    )
    advantage_weighting: str = family_switch(
        "advantage_weighting",
        default="none",
        help="'w_reinforce': W-REINFORCE, positive samples down-weighted (arXiv 2506.01347). "
        "'entropy_advantage': a capped entropy bonus on each token's advantage (arXiv 2506.14758).",
    )
    w_reinforce_lambda: float = field(
        default=0.1,
        metadata={
            "help": "W-REINFORCE's weight of positive samples.",
        },
    )
    w_reinforce_baseline: Literal["none", "group"] = field(
        default="none",
        metadata={"help": "'none': +lambda / -1 by reward, no baseline (paper). 'group': the estimator's advantages."},
    )
    w_reinforce_threshold: float = field(
        default=0.5, metadata={"help": "Reward above which a sample is positive (w_reinforce_baseline='none')."}
    )
    entropy_adv_alpha: float = field(
        default=0.4, metadata={"help": "entropy_advantage: bonus alpha * H_t per token (capped at |A| / kappa)."}
    )
    entropy_adv_kappa: float = field(
        default=2.0, metadata={"help": "entropy_advantage: the bonus is at most |A| / kappa (kappa >= 1)."}
    )
    advantage_std: StdKind = field(
        default="sample",
        metadata={
            "help": "Std used to normalise rewards within a group: 'sample' (n-1, TRL's default) or 'population' "
            "(n, DeepSeekMath and the seed document)."
        },
    )

    def check(self) -> None:
        if not self.entropy_adv_alpha > 0:
            _fail("entropy_adv_alpha", self.entropy_adv_alpha, "must be > 0 (the entropy bonus's weight)", "e.g. 0.4")
        if not self.entropy_adv_kappa >= 1:
            _fail(
                "entropy_adv_kappa",
                self.entropy_adv_kappa,
                "must be >= 1: the bonus is capped at |A| / kappa, and a smaller kappa lets it flip a negative "
                "advantage's sign",
                "e.g. 2.0",
            )
        if not 0.0 <= self.pkpo_anneal_fraction <= 1.0:
            _fail("pkpo_anneal_fraction", self.pkpo_anneal_fraction, "a fraction of training, in [0, 1]", "e.g. 0.5")
        if self.w_reinforce_lambda < 0:
            _fail(
                "w_reinforce_lambda",
                self.w_reinforce_lambda,
                "must be >= 0 (a weight of the positive samples; 0 trains on negative samples only)",
                "e.g. 0.1 (paper)",
            )

    def check_across(self) -> None:
        if self.advantage_std == "population" and self.multi_objective_aggregation != "sum_then_normalize":
            _fail(
                "advantage_std",
                self.advantage_std,
                f"it recomputes the sum_then_normalize advantages, but multi_objective_aggregation is "
                f"{self.multi_objective_aggregation!r}",
                "set multi_objective_aggregation='sum_then_normalize' or keep advantage_std='sample'",
            )
        if self.advantage_std == "population" and self.scale_rewards == "none":
            _fail(
                "advantage_std",
                self.advantage_std,
                "it changes the standard deviation rewards are divided by, but scale_rewards='none' divides by none "
                "(advantages are reward - group mean), so it would do nothing",
                "keep advantage_std='sample', or set scale_rewards='group' (or 'batch')",
            )
