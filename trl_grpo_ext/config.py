"""``GRPOExtConfig``: TRL's ``GRPOConfig`` plus one switch per anti-collapse family and its prefixed parameters."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
import warnings
from dataclasses import dataclass, field
from typing import Literal

from trl import GRPOConfig

from .names import (
    DIVERSITY_METRICS,
    FAMILIES,
    KNOWN_LOSS_TYPES,
    SELECTION_CHECKS,
    TRL_VERSION,
    config_error,
    registry_for,
)

#: AEPO's fields as trl_grpo_ext 0.1.0 ran it (a separate unclipped term over the whole batch regenerated, with
#: 0.1.0's rules: see ``aepo_mode``); the defaults are the reference code's.
#: ``GRPOExtConfig(entropy_control="aepo", **AEPO_0_1_0)``.
AEPO_0_1_0 = {"aepo_mode": "term", "aepo_regenerate_fraction": 1.0}

#: A token-clip ratio above this is more likely a percentage pasted as a fraction (0.2 for 0.2%) than intended.
PERCENT_TRAP_RATIO = 0.05

#: Finite but absurd values, refused: field -> (lowest, highest, why, example). A huge KL cap with a short horizon
#: drove beta to 2.6e8 and the loss to 1.9e7; a reward weight of 1e30 made TRL's reward std inf and every advantage 0;
#: a temperature of 1e6 samples noise. The bounds sit orders of magnitude beyond any published setting.
SANE_BOUNDS: dict[str, tuple[float, float, str, str]] = {
    "beta": (0.0, 100.0, "a KL coefficient above 100 leaves only the KL term in the loss", "beta=0.04"),
    "kl_beta_min": (0.0, 100.0, "beta is clamped to [kl_beta_min, kl_beta_max], at most 100", "kl_beta_min=1e-4"),
    "kl_beta_max": (0.0, 100.0, "beta is clamped to [kl_beta_min, kl_beta_max], at most 100", "kl_beta_max=1.0"),
    "kl_target": (0.0, 100.0, "a per-token mean KL target above 100 nats is never a target", "kl_target=0.1"),
    "kl_horizon": (
        1.0,
        1e9,
        "the horizon counts completions; below one, beta jumps many-fold per step",
        "kl_horizon=10000",
    ),
    "reward_weights": (
        -1e6,
        1e6,
        "weights beyond 1e6 overflow TRL's float32 reward statistics",
        "reward_weights=[1.0]",
    ),
    "aepo_temperature_high": (0.0, 10.0, "a sampling temperature above 10 samples noise", "aepo_temperature_high=1.2"),
    "aepo_temperature_low": (0.0, 10.0, "a sampling temperature above 10 samples noise", "aepo_temperature_low=0.8"),
    "aepo_target_entropy": (
        0.0,
        20.0,
        "token entropy is at most ln(vocabulary size), under 20 nats",
        "aepo_target_entropy=0.5",
    ),
    "aepo_coef": (0.0, 1e3, "a weight above 1000 leaves only the AEPO term in the loss", "aepo_coef=1.0"),
    "kl_cov_coef": (0.0, 1e3, "a weight above 1000 leaves only the KL-Cov penalty in the loss", "kl_cov_coef=1.0"),
    "prm_outcome_coef": (-1e3, 1e3, "a weight beyond 1000 drowns the step advantages", "prm_outcome_coef=1.0"),
    "w_reinforce_lambda": (
        0.0,
        1e3,
        "the positive samples' weight against the negatives' 1; above 1000 the negatives vanish",
        "w_reinforce_lambda=0.1",
    ),
    "entropy_adv_alpha": (
        0.0,
        1e3,
        "an entropy weight above 1000 makes the bonus always hit its |A| / kappa cap",
        "entropy_adv_alpha=0.4",
    ),
    "entropy_adv_kappa": (1.0, 1e6, "kappa >= 1 keeps the advantages' signs; above 1e6 the bonus is 0", "kappa=2.0"),
    "dynamic_sampling_max_rounds": (
        0,
        100,
        "each round generates up to a batch of new groups; beyond 100 a step can run for hours on a task the policy "
        "has solved",
        "dynamic_sampling_max_rounds=3",
    ),
}


def _fail(field_name: str, value, problem: str, fix: str) -> None:
    raise config_error(field_name, value, problem, fix)


def _type_name(annotation) -> str:
    """``"float"``, ``"int|None"``, ``"list[int]"``, ...: a field's type, whether still the annotation string or already
    resolved (transformers' argument parser replaces ``field.type`` with the resolved type in place)."""
    if isinstance(annotation, str):
        return annotation.replace(" ", "")
    args = typing.get_args(annotation)
    if annotation in (int, float, bool, str):
        return annotation.__name__
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return "|".join(names) + ("|None" if type(None) in args else "")
    if typing.get_origin(annotation) is list and args:
        return f"list[{_type_name(args[0])}]"
    return str(annotation).replace(" ", "")


def _check_number(field_name: str, value, *, integer: bool = False, whole=None) -> None:
    """``value`` is a finite int (or float when not ``integer``); booleans and strings are refused."""
    shown = value if whole is None else whole
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = " (a YAML value in quotes is a string: drop the quotes)" if isinstance(value, str) else ""
        _fail(field_name, shown, f"must be {'an integer' if integer else 'a number'}{hint}", "write a plain number")
    if integer and not isinstance(value, int):
        problem = "must hold integers" if whole is not None else "must be an integer"
        _fail(field_name, shown, problem, "write whole numbers")
    if not math.isfinite(value):
        _fail(field_name, shown, "must be finite", "write a finite number")


class ConfigSection:
    """One family's part of :class:`GRPOExtConfig`: its fields, its docstring section and its :meth:`check`."""

    def check(self) -> None:
        """Cross-field checks of this section; a bad value raises ``ValueError`` naming the field and the fix."""


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
            Reweighting of the estimator's advantages by sign. `"w_reinforce"`: W-REINFORCE (Zhu et al. 2025, arXiv
            2506.01347), positive samples weighted by `w_reinforce_lambda`, negative ones fully.
        w_reinforce_lambda (`float`, *optional*, defaults to `0.1`):
            Weight of the positive samples (the paper's lambda; 0 trains on negative samples only).
        w_reinforce_baseline (`str`, *optional*, defaults to `"none"`):
            `"none"` (the paper): advantage `w_reinforce_lambda` for a sample whose reward exceeds
            `w_reinforce_threshold`, -1 for any other, no group baseline (only with `advantage_estimator="grpo"`,
            whose advantage it replaces). `"group"`: the estimator's own advantages, positive entries times
            `w_reinforce_lambda` (any estimator).
        w_reinforce_threshold (`float`, *optional*, defaults to `0.5`):
            With `w_reinforce_baseline="none"`: rewards above it count as positive (0.5 for 0/1 accuracy rewards).
    """

    advantage_estimator: Literal["grpo", "prm", "pass_at_k"] = field(
        default="grpo",
        metadata={
            "help": "How advantages are computed. 'grpo': TRL's group-normalised outcome reward. 'prm': process "
            "supervision from step rewards (DeepSeekMath sec. 4.1.3). 'pass_at_k': PKPO, the gradient of pass@k."
        },
    )
    pkpo_k: int | None = field(
        default=None,
        metadata={"help": "k of pass@k for advantage_estimator='pass_at_k'; None: min(4, num_generations)."},
    )
    pkpo_estimator: Literal["loo_minus_one", "s"] = field(
        default="loo_minus_one",
        metadata={"help": "PKPO weights: 'loo_minus_one' (baselined, lowest variance) or 's' (plain, unbiased)."},
    )
    pkpo_anneal_fraction: float = field(
        default=0.0, metadata={"help": "Anneal k from pkpo_k to 1 over this fraction of training (0: constant)."}
    )
    advantage_weighting: Literal["none", "w_reinforce"] = field(
        default="none",
        metadata={"help": "'w_reinforce': W-REINFORCE, positive samples down-weighted (arXiv 2506.01347)."},
    )
    w_reinforce_lambda: float = field(default=0.1, metadata={"help": "W-REINFORCE's weight of positive samples."})
    w_reinforce_baseline: Literal["none", "group"] = field(
        default="none",
        metadata={"help": "'none': +lambda / -1 by reward, no baseline (paper). 'group': the estimator's advantages."},
    )
    w_reinforce_threshold: float = field(
        default=0.5, metadata={"help": "Reward above which a sample is positive (w_reinforce_baseline='none')."}
    )
    advantage_std: Literal["sample", "population"] = field(
        default="sample",
        metadata={
            "help": "Std used to normalise rewards within a group: 'sample' (n-1, TRL's default) or 'population' "
            "(n, DeepSeekMath and the seed document)."
        },
    )

    def check(self) -> None:
        if not 0.0 <= self.pkpo_anneal_fraction <= 1.0:
            _fail("pkpo_anneal_fraction", self.pkpo_anneal_fraction, "a fraction of training, in [0, 1]", "e.g. 0.5")
        if self.w_reinforce_lambda < 0:
            _fail(
                "w_reinforce_lambda",
                self.w_reinforce_lambda,
                "must be >= 0 (a weight of the positive samples; 0 trains on negative samples only)",
                "e.g. 0.1 (paper)",
            )


@dataclass
class PRMConfig(ConfigSection):
    r"""
    > Process reward (`advantage_estimator="prm"`)

        prm_step_separator (`str`, *optional*, defaults to `"\n"`):
            Text that ends a step (TRL's PRM `step_separator`). Blank steps are skipped; a completion without it is one
            step; the last step ends at the completion's last token.
        prm_step_separator_token_id (`int`, *optional*):
            Cut steps after each occurrence of this token id instead of splitting the text.
        prm_std (`str`, *optional*, defaults to `"population"`):
            Std used to normalise the step rewards of a group (`"population"` or `"sample"`).
        prm_outcome_coef (`float`, *optional*, defaults to `0.0`):
            Adds `prm_outcome_coef * A_outcome` (the group-normalised outcome advantage) to every token.
        prm_model_name_or_path (`str`, *optional*):
            A PRM scoring the steps: a token-classification model in TRL's PRMTrainer format, or a causal LM scoring a
            step tag (see `prm_model_type`). Runs on the trainer's device without gradients.
        prm_model_type (`str`, *optional*, defaults to `"token_classification"`):
            `"token_classification"` (P(correct) at each step's last token) or `"causal_lm"` (Math-Shepherd style:
            P(good) / (P(good) + P(bad)) at each step tag).
        prm_batch_size (`int`, *optional*, defaults to `8`):
            Sequences per PRM forward pass.
        prm_causal_step_tag (`str`, *optional*, defaults to `"ки"`):
            Step tag of a causal-LM PRM (one token).
        prm_causal_good_token (`str`, *optional*, defaults to `"+"`):
            Token meaning "good step" for a causal-LM PRM.
        prm_causal_bad_token (`str`, *optional*, defaults to `"-"`):
            Token meaning "bad step" for a causal-LM PRM.
    """

    prm_step_separator: str = field(default="\n", metadata={"help": "Text that ends a step (TRL's PRM convention)."})
    prm_step_separator_token_id: int | None = field(
        default=None, metadata={"help": "Cut steps after this token id instead of splitting the text."}
    )
    prm_std: Literal["population", "sample"] = field(
        default="population", metadata={"help": "Std used to normalise the step rewards of a group."}
    )
    prm_outcome_coef: float = field(
        default=0.0, metadata={"help": "Adds prm_outcome_coef * the outcome advantage to every token."}
    )
    prm_model_name_or_path: str | None = field(
        default=None, metadata={"help": "PRM model scoring the steps (token-classification or causal LM)."}
    )
    prm_model_type: Literal["token_classification", "causal_lm"] = field(
        default="token_classification",
        metadata={"help": "'token_classification' (TRL PRMTrainer format) or 'causal_lm' (Math-Shepherd step tag)."},
    )
    prm_batch_size: int = field(default=8, metadata={"help": "Sequences per PRM forward pass."})
    prm_causal_step_tag: str = field(default="ки", metadata={"help": "Step tag of a causal-LM PRM (one token)."})
    prm_causal_good_token: str = field(default="+", metadata={"help": "'Good step' token of a causal-LM PRM."})
    prm_causal_bad_token: str = field(default="-", metadata={"help": "'Bad step' token of a causal-LM PRM."})

    def check(self) -> None:
        if self.prm_causal_good_token == self.prm_causal_bad_token:
            _fail(
                "prm_causal_bad_token",
                self.prm_causal_bad_token,
                "equals prm_causal_good_token: every step would score 0.5",
                "use the PRM's two label tokens, e.g. prm_causal_good_token='+', prm_causal_bad_token='-'",
            )
        if self.prm_step_separator_token_id is None and not self.prm_step_separator:
            _fail(
                "prm_step_separator",
                self.prm_step_separator,
                "steps need a separator",
                "set prm_step_separator (e.g. '\\n') or prm_step_separator_token_id",
            )
        if not (isinstance(self.prm_batch_size, int) and self.prm_batch_size >= 1):
            _fail("prm_batch_size", self.prm_batch_size, "must be an integer >= 1", "e.g. prm_batch_size=8")
        if not math.isfinite(self.prm_outcome_coef):
            _fail("prm_outcome_coef", self.prm_outcome_coef, "must be finite", "e.g. prm_outcome_coef=0.5")


@dataclass
class TokenClipConfig(ConfigSection):
    r"""
    > Token-level clipping (Cui et al. 2025, arXiv 2505.22617)

        token_clip (`str`, *optional*, defaults to `"none"`):
            `"clip_cov"` removes the gradient of a few random high-covariance tokens; `"kl_cov"` adds a KL penalty
            `kl_cov_coef * |logp - old_logp|` on the highest-covariance tokens. `"none"` disables both.
        token_clip_scope (`str`, *optional*, defaults to `"local"`):
            `"local"`: tokens are chosen within each process's micro-batch (the reference implementation);
            `"global"`: the covariance means, counts and selection thresholds span all processes.
        clip_cov_ratio (`float`, *optional*, defaults to `2e-4`):
            Fraction of valid tokens Clip-Cov detaches (paper and verl; a value above 0.05 warns).
        clip_cov_lb (`float`, *optional*, defaults to `1.0`):
            Lower covariance bound of Clip-Cov candidates.
        clip_cov_ub (`float`, *optional*, defaults to `5.0`):
            Upper covariance bound of Clip-Cov candidates.
        kl_cov_ratio (`float`, *optional*, defaults to `2e-3`):
            Fraction of valid tokens KL-Cov penalises (paper: 2e-3 for 7B, 2e-4 for 32B; a fraction, not percent:
            a value above 0.05 warns).
        kl_cov_coef (`float`, *optional*, defaults to `1.0`):
            Coefficient of the KL-Cov penalty (paper scripts: 1.0; verl's config default: 0.1).
        kl_cov_ppo_clip (`bool`, *optional*, defaults to `False`):
            Keep TRL's PPO ratio clip (`epsilon`, `epsilon_high`) under KL-Cov. The paper and verl drop it (False).
            With False, a clip you asked for (`epsilon_high`, or `loss_type="cispo"`, whose cap is `epsilon_high`) is
            refused rather than silently dropped: set `kl_cov_ppo_clip=True` to keep it.
    """

    token_clip: Literal["none", "clip_cov", "kl_cov"] = field(
        default="none",
        metadata={
            "help": "Covariance-based token stabilisation (Cui et al. 2025): 'clip_cov' detaches a few random "
            "high-covariance tokens, 'kl_cov' penalises the top-covariance tokens with |logp - old_logp|."
        },
    )
    token_clip_scope: Literal["local", "global"] = field(
        default="local",
        metadata={
            "help": "'local': pick tokens within each process's micro-batch (reference implementation); 'global': "
            "covariance means and selection thresholds span all processes."
        },
    )
    clip_cov_ratio: float = field(default=2e-4, metadata={"help": "Fraction of valid tokens Clip-Cov detaches."})
    clip_cov_lb: float = field(default=1.0, metadata={"help": "Lower covariance bound of Clip-Cov candidates."})
    clip_cov_ub: float = field(default=5.0, metadata={"help": "Upper covariance bound of Clip-Cov candidates."})
    kl_cov_ratio: float = field(
        default=2e-3,
        metadata={"help": "Fraction of valid tokens KL-Cov penalises (paper: 2e-3 for 7B, 2e-4 for 32B)."},
    )
    kl_cov_coef: float = field(default=1.0, metadata={"help": "Coefficient of the KL-Cov penalty |logp - old_logp|."})
    kl_cov_ppo_clip: bool = field(
        default=False,
        metadata={"help": "Keep TRL's PPO ratio clip under KL-Cov (the paper and verl drop it)."},
    )

    def check(self) -> None:
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value <= 1):
                _fail(name, value, "must be a fraction in (0, 1]", f"e.g. {name}=2e-4 (write 0.02% as 2e-4, not 0.02)")
        if not self.clip_cov_lb < self.clip_cov_ub:
            _fail(
                "clip_cov_lb",
                self.clip_cov_lb,
                f"must be below clip_cov_ub={self.clip_cov_ub}",
                "use a window such as clip_cov_lb=1, clip_cov_ub=5",
            )
        if not (math.isfinite(self.kl_cov_coef) and self.kl_cov_coef > 0):
            _fail("kl_cov_coef", self.kl_cov_coef, "must be a finite number > 0", "e.g. kl_cov_coef=1.0 (paper)")
        if self.token_clip == "none":
            return
        name = f"{self.token_clip}_ratio"
        if getattr(self, name, 0.0) > PERCENT_TRAP_RATIO:
            # PRIME-RL's scripts write k_percent=0.2 meaning 0.2% of tokens; pasted here it means 20%.
            warnings.warn(
                f"{name}={getattr(self, name)} selects {getattr(self, name):.0%} of the valid tokens: the value is a "
                "fraction, not a percentage (the paper uses 2e-4 to 2e-3; PRIME-RL's scripts write 0.2 for 0.2%, "
                f"which is {name}=2e-3 here). Ignore this if you meant it.",
                UserWarning,
                stacklevel=4,
            )


@dataclass
class SampleFilterConfig(ConfigSection):
    r"""
    > Sample filtering (PF-PPO, arXiv 2409.06957)

        sample_filter (`str`, *optional*, defaults to `"none"`):
            Which completions of each prompt group train: `"best_of_n"`, `"best_random"`, `"best_worst"`,
            `"nonzero_std"` (drop groups whose rewards are all equal), `"dynamic_sampling"` (DAPO, arXiv 2503.14476:
            replace the groups whose rewards are all equal by new groups with signal, generated from `train_dataset`),
            or `"none"`. Filtered rows are masked out of the loss; advantages are still computed over the full group.
        pf_rescale (`bool`, *optional*, defaults to `True`):
            For loss types that average per sequence (`grpo`, `sapo`, `luspo`, `dr_grpo`), rescale each micro-batch so
            the loss equals the loss over its kept rows alone, instead of being diluted by the masked ones.
        pf_filter_eval (`bool`, *optional*, defaults to `False`):
            Also filter evaluation batches. Off by default, so `eval_loss` is computed on every completion and stays
            comparable with a `GRPOTrainer` run.
        dynamic_sampling_max_rounds (`int`, *optional*, defaults to `3`):
            With `sample_filter="dynamic_sampling"`: at most this many extra generation rounds per generation batch,
            each generating as many new prompt groups as the process with most groups without signal still needs
            (0: no refill, the groups are only masked, as `"nonzero_std"`).
        dynamic_sampling_fill (`str`, *optional*, defaults to `"filter"`):
            What the groups still without signal after the last round become: `"filter"` (DAPO) masks them out of
            the loss; `"replace"` (Polaris) fills them with copies of this process's groups with signal.
    """

    sample_filter: Literal["none", "best_of_n", "best_random", "best_worst", "nonzero_std", "dynamic_sampling"] = field(
        default="none",
        metadata={
            "help": "PF-PPO filtering per prompt group: 'best_of_n', 'best_random', 'best_worst', 'nonzero_std', "
            "'dynamic_sampling' (DAPO: refill the groups without signal with new ones), or 'none'. Filtered "
            "completions are masked out of the loss."
        },
    )
    pf_rescale: bool = field(
        default=True,
        metadata={
            "help": "For per-sequence loss types (grpo, sapo, luspo, dr_grpo), rescale each micro-batch's loss to "
            "the mean over its kept rows instead of diluting it with the masked ones."
        },
    )
    pf_filter_eval: bool = field(
        default=False,
        metadata={"help": "Also filter evaluation batches (off: eval_loss uses every completion, as GRPOTrainer)."},
    )
    dynamic_sampling_max_rounds: int = field(
        default=3,
        metadata={
            "help": "sample_filter='dynamic_sampling': the most extra generation rounds per generation batch (0: "
            "mask the groups without signal, no refill)."
        },
    )
    dynamic_sampling_fill: Literal["filter", "replace"] = field(
        default="filter",
        metadata={
            "help": "Groups still without signal after the last round: 'filter' (DAPO) masks them, 'replace' "
            "(Polaris) fills them with copies of this process's groups with signal."
        },
    )

    def check(self) -> None:
        if self.dynamic_sampling_max_rounds < 0:
            _fail("dynamic_sampling_max_rounds", self.dynamic_sampling_max_rounds, "must be >= 0", "e.g. 3")


@dataclass
class KLControlConfig(ConfigSection):
    r"""
    > KL control (Ziegler et al. 2019)

        kl_control (`str`, *optional*, defaults to `"fixed"`):
            `"fixed"`: TRL's constant `beta`. `"adaptive"`: beta follows `kl_target` (Ziegler's proportional
            controller on the global per-token mean KL of each optimizer step); needs `beta > 0` as its start.
        kl_target (`float`, *optional*, defaults to `0.1`):
            Target per-token mean KL (k3 estimate) of the adaptive controller.
        kl_horizon (`float`, *optional*, defaults to `10000`):
            Horizon of the adaptive controller, in completions (Ziegler: 10000).
        kl_beta_min (`float`, *optional*, defaults to `1e-4`):
            Lower clamp of beta (> 0: TRL cannot switch the KL term back on once beta is 0).
        kl_beta_max (`float`, *optional*, defaults to `1.0`):
            Upper clamp of beta.
        kl_diversity_n (`int`, *optional*, defaults to `2`):
            n of the Distinct-N that `kl_control="diversity"` steers (over each generation batch, all processes).
        kl_diversity_target (`float`, *optional*, defaults to `0.5`):
            Distinct-N target of `kl_control="diversity"`: beta rises while diversity is below it.
    """

    kl_control: Literal["fixed", "adaptive", "diversity"] = field(
        default="fixed",
        metadata={
            "help": "'fixed': TRL's constant beta. 'adaptive': Ziegler's controller steers beta to kl_target. "
            "'diversity': beta rises while Distinct-N (kl_diversity_n) is under kl_diversity_target."
        },
    )
    kl_target: float = field(default=0.1, metadata={"help": "Target per-token mean KL of the adaptive controller."})
    kl_horizon: float = field(
        default=10000.0, metadata={"help": "Controller horizon, in completions (Ziegler: 10000)."}
    )
    kl_beta_min: float = field(default=1e-4, metadata={"help": "Lower clamp of beta (> 0)."})
    kl_beta_max: float = field(default=1.0, metadata={"help": "Upper clamp of beta."})
    kl_diversity_n: int = field(default=2, metadata={"help": "n of the Distinct-N that kl_control='diversity' steers."})
    kl_diversity_target: float = field(
        default=0.5, metadata={"help": "Distinct-N target of kl_control='diversity' (beta rises below it)."}
    )

    def check(self) -> None:
        if not (math.isfinite(self.kl_beta_min) and self.kl_beta_min > 0):
            _fail(
                "kl_beta_min",
                self.kl_beta_min,
                "must be > 0: TRL builds no reference model when beta reaches 0 and cannot restart the KL term",
                "e.g. kl_beta_min=1e-4",
            )
        if not self.kl_beta_max >= self.kl_beta_min:
            _fail("kl_beta_max", self.kl_beta_max, f"must be >= kl_beta_min={self.kl_beta_min}", "raise kl_beta_max")
        if not (math.isfinite(self.kl_target) and self.kl_target > 0):
            _fail("kl_target", self.kl_target, "must be a finite KL > 0", "e.g. kl_target=0.1 (per-token mean KL)")
        if not (math.isfinite(self.kl_horizon) and self.kl_horizon > 0):
            _fail("kl_horizon", self.kl_horizon, "must be > 0", "e.g. kl_horizon=10000 (completions)")
        if not 0 < self.kl_diversity_target <= 1:
            _fail("kl_diversity_target", self.kl_diversity_target, "Distinct-N lies in (0, 1]", "e.g. 0.5")
        if self.kl_diversity_n < 1:
            _fail("kl_diversity_n", self.kl_diversity_n, "must be >= 1", "e.g. kl_diversity_n=2")


@dataclass
class EntropyControlConfig(ConfigSection):
    r"""
    > Entropy control (AEPO, arXiv 2510.08141; entropy-shaped advantages, arXiv 2506.14758)

        entropy_control (`str`, *optional*, defaults to `"none"`):
            `"aepo"`: each generation batch is generated again at a temperature chosen by the entropy (T_high under
            target, T_low above); the positive-advantage samples add a REINFORCE term that steers entropy to target.
            Not TRL's entropy bonus (`entropy_coef`), which it replaces. `"entropy_advantage"`: each token's
            advantage gains a capped bonus from the policy's entropy there (`entropy_adv_*`).
        aepo_target_entropy (`float`, *optional*, defaults to `0.5`):
            Mean token entropy to hold (reference implementation: 0.5).
        aepo_temperature_high (`float`, *optional*, defaults to `1.2`):
            Sampling temperature when entropy is below target.
        aepo_temperature_low (`float`, *optional*, defaults to `0.8`):
            Sampling temperature when entropy is at or above target.
        aepo_coef (`float`, *optional*, defaults to `1.0`):
            Weight alpha of the REINFORCE term.
        aepo_max_samples (`int`, *optional*, defaults to `60`):
            Most reinforced samples per generation batch (half when entropy is above target).
        aepo_adv_threshold (`float`, *optional*, defaults to `0.05`):
            Group advantage above which a temperature-T sample is reinforced.
        aepo_mode (`str`, *optional*, defaults to `"splice"`):
            How the reinforced samples train, and by which rules. `"splice"` (the reference code's): they replace the
            first rows of the training batch (batch size unchanged) with advantage `aepo_coef` and go through TRL's
            own loss (same PPO clip, loss type and every other family); the reference's rules: the first batch, with
            nothing measured, takes T_high and the full cap; entropy exactly at the target counts as below it (`<=`);
            above the target `min(aepo_max_samples, n) // 2` samples train, the first ones in batch order; the
            entropy steered on is `-log p` of the trained (sampled) tokens, which reads above the policy's own on hot
            samples. `"term"` (0.1.0's): a separate, unclipped REINFORCE term `aepo_coef * mean(-exp(logp -
            old_logp))` over the samples, added to TRL's untouched loss; 0.1.0's rules: the first batch counts as
            above the target, the target itself too, above it `min(n, aepo_max_samples // 2)` samples train, drawn
            uniformly (a generator seeded alike on every process), and the entropy steered on is the
            full-distribution entropy at each trained position. Until 0.2.0 each rule was a field of its own
            (`aepo_first_step`, `aepo_at_target`, `aepo_cap_rule`, `aepo_sample_order`, `aepo_entropy_estimator`;
            CHANGELOG.md).
        aepo_regenerate_fraction (`float`, *optional*, defaults to `0.25`):
            Fraction of the batch's prompt groups generated again at T (reference: the first quarter). Each process
            regenerates its first `floor(fraction x its groups)` groups (at least one); a process whose rows split a
            group regenerates all its rows. `1.0` regenerates every prompt.

        entropy_adv_alpha (`float`, *optional*, defaults to `0.4`):
            With `entropy_control="entropy_advantage"` (Cheng et al. 2025, arXiv 2506.14758): every trained token's
            advantage gains `min(entropy_adv_alpha * H_t, |A_t| / entropy_adv_kappa)`, `H_t` the policy's detached
            entropy at the token; no entropy loss.
        entropy_adv_kappa (`float`, *optional*, defaults to `2.0`):
            Cap of the entropy bonus as a fraction `1 / kappa` of `|A_t|`; `kappa >= 1` keeps every advantage's sign.

        Up to version 0.1.0 the behaviour was `aepo_mode="term"`, `aepo_regenerate_fraction=1.0`
        (`trl_grpo_ext.config.AEPO_0_1_0`).
    """

    entropy_control: Literal["none", "aepo", "entropy_advantage"] = field(
        default="none",
        metadata={
            "help": "'aepo': hold the policy's entropy at aepo_target_entropy (arXiv 2510.08141). "
            "'entropy_advantage': add a capped entropy bonus to each token's advantage (arXiv 2506.14758)."
        },
    )
    aepo_target_entropy: float = field(default=0.5, metadata={"help": "Mean token entropy AEPO holds."})
    aepo_temperature_high: float = field(default=1.2, metadata={"help": "AEPO temperature below target entropy."})
    aepo_temperature_low: float = field(default=0.8, metadata={"help": "AEPO temperature at/above target entropy."})
    aepo_coef: float = field(default=1.0, metadata={"help": "Weight of the AEPO REINFORCE term."})
    aepo_max_samples: int = field(default=60, metadata={"help": "Most AEPO samples per generation batch."})
    aepo_adv_threshold: float = field(default=0.05, metadata={"help": "Group advantage above which a sample counts."})
    aepo_mode: Literal["splice", "term"] = field(
        default="splice",
        metadata={
            "help": "'splice' (reference): the reinforced samples replace the first training rows at advantage "
            "aepo_coef, through TRL's clipped loss. 'term': a separate unclipped REINFORCE term."
        },
    )
    aepo_regenerate_fraction: float = field(
        default=0.25, metadata={"help": "Fraction of the prompt groups generated again at T (reference: 0.25)."}
    )
    entropy_adv_alpha: float = field(
        default=0.4, metadata={"help": "entropy_advantage: bonus alpha * H_t per token (capped at |A| / kappa)."}
    )
    entropy_adv_kappa: float = field(
        default=2.0, metadata={"help": "entropy_advantage: the bonus is at most |A| / kappa (kappa >= 1)."}
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
        if not (math.isfinite(self.aepo_target_entropy) and self.aepo_target_entropy > 0):
            _fail("aepo_target_entropy", self.aepo_target_entropy, "must be a finite entropy > 0", "e.g. 0.5 (nats)")
        if not 0 < self.aepo_temperature_low < self.aepo_temperature_high:
            _fail(
                "aepo_temperature_low",
                self.aepo_temperature_low,
                f"needs 0 < aepo_temperature_low < aepo_temperature_high ({self.aepo_temperature_high})",
                "e.g. 0.8 and 1.2 (paper)",
            )
        if not (math.isfinite(self.aepo_coef) and self.aepo_coef > 0):
            _fail("aepo_coef", self.aepo_coef, "must be a finite number > 0", "e.g. aepo_coef=1.0")
        if self.aepo_max_samples < 1:
            _fail("aepo_max_samples", self.aepo_max_samples, "must be >= 1", "e.g. 60 (paper)")
        if not 0 < self.aepo_regenerate_fraction <= 1:
            _fail(
                "aepo_regenerate_fraction",
                self.aepo_regenerate_fraction,
                "must lie in (0, 1] (a fraction of the prompt groups)",
                "e.g. 0.25 (reference) or 1.0 for every prompt",
            )


@dataclass
class MonitorConfig(ConfigSection):
    r"""
    > Seeing collapse (diversity, entropy, alarm)

        diversity_metrics (`list[str]`, *optional*, defaults to `[]`):
            Metrics of the `CollapseMonitor` callback: any of `distinct`, `self_bleu`, `repetition`, `unique`,
            `prompt_info` (what the completions say about their prompts, a detector signal), `entropy`. Empty: off.
        diversity_ngram_sizes (`list[int]`, *optional*, defaults to `[1, 2, 3, 4]`):
            n of the `diversity/distinct_n` metrics.
        diversity_repetition_n (`int`, *optional*, defaults to `3`):
            n of `diversity/repetition` (repeated n-grams inside one completion).
        diversity_low_entropy_threshold (`float`, *optional*, defaults to `0.1`):
            Tokens with entropy below it count in `entropy/low_frac`.
        diversity_every (`int`, *optional*, defaults to `1`):
            Measure the n-gram metrics (`distinct`, `self_bleu`, `repetition`, `unique`) and the entropy percentiles
            on the training generation batch of every k-th step only: steps 1, 1 + k, 1 + 2k, ..., each logged at its
            own step (all processes agree, and a resumed run keeps the pattern). `entropy/mean`, `entropy/low_frac`
            and evaluation batches are measured every time. Raise it when the monitor shows in `timing/ext_fraction`
            on a very short step.
        collapse_entropy_min (`float`, *optional*):
            Collapse alarm when the mean token entropy falls below it.
        collapse_distinct2_drop (`float`, *optional*):
            Collapse alarm when Distinct-2 falls below (1 - drop) x its first value (e.g. 0.5).
        collapse_repetition_max (`float`, *optional*):
            Collapse alarm when the mean repetition rate exceeds it.
        collapse_detector (`str`, *optional*, defaults to `"none"`):
            `"drift"`: the gold-free hack detector (docs/monitoring.md): alarms (`alarm/hack`) when a signal of the
            completions' shape drifts from its best value of the run the way a hack moves it and learning does not:
            completion length up (`collapse_length_rise`), prompt information down (`collapse_prompt_info_drop`,
            needs `prompt_info` in `diversity_metrics`), repetition up (`collapse_repetition_rise`, needs
            `repetition`). `"none"`: off.
        collapse_detector_window (`int`, *optional*, defaults to `2`):
            Measurements (training generation batches) in each signal's trailing mean. The defaults of the detector's
            fields were chosen on validation runs of two kinds of hack and measured on a third (docs/results.md).
        collapse_detector_warmup (`int`, *optional*, defaults to `2`):
            Measurements before the detector tracks a signal's best value.
        collapse_onset_fraction (`float`, *optional*, defaults to `0.75`):
            The onset the detector reports (where `rollback` returns to): the last measurement before the alarm whose
            drift was at most this fraction of the threshold. 0: the signal's best point of the run (earlier).
        collapse_length_rise (`float`, *optional*, defaults to `0.1`):
            Detector: alarm when the mean completion length rises this fraction above its lowest point. `None`: not
            read.
        collapse_prompt_info_drop (`float`, *optional*, defaults to `0.15`):
            Detector: alarm when `diversity/prompt_info` falls this fraction below its highest point. `None`: not read.
        collapse_repetition_rise (`float`, *optional*, defaults to `0.03`):
            Detector: alarm when `diversity/repetition` rises this much (absolute) above its lowest point. `None`: not
            read.
        collapse_action (`str`, *optional*, defaults to `"warn"`):
            What an alarm (the thresholds' `alarm/collapse` or the detector's `alarm/hack`) does besides logging:
            `"warn"`, `"save"` (a checkpoint), `"stop"` (a checkpoint, then training ends) or `"rollback"` (training
            ends and the weights, optimizer, scheduler and extension state are restored from the last checkpoint
            saved at or before the detector's onset step; needs `save_strategy="steps"` and
            `save_total_limit=None`, and saves `checkpoint-0` at the start; `output_dir/collapse_rollback.json` says
            what was restored). A callable `trainer.collapse_monitor.on_alarm(event)` may choose per alarm.
        eval_pass_at_k (`list[int]`, *optional*, defaults to `[]`):
            k values of the unbiased pass@k (Chen et al. 2021) logged at evaluation from the sampled completions
            (`num_generations_eval` per prompt). Empty: off.
        eval_pass_threshold (`float`, *optional*, defaults to `1.0`):
            A completion counts as correct when its (weighted) reward is at least this.
        eval_pass_greedy (`bool`, *optional*, defaults to `True`):
            With `eval_pass_at_k`, also decode each eval prompt greedily once and log `pass@k/greedy` (its accuracy).
    """

    diversity_metrics: list[str] = field(
        default_factory=list,
        metadata={
            "help": "CollapseMonitor metrics: distinct, self_bleu, repetition, unique, prompt_info, entropy "
            "(empty: off)."
        },
    )
    diversity_ngram_sizes: list[int] = field(
        default_factory=lambda: [1, 2, 3, 4], metadata={"help": "n of the diversity/distinct_n metrics."}
    )
    diversity_repetition_n: int = field(default=3, metadata={"help": "n of diversity/repetition."})
    diversity_low_entropy_threshold: float = field(
        default=0.1, metadata={"help": "Tokens with entropy below it count in entropy/low_frac."}
    )
    diversity_every: int = field(
        default=1,
        metadata={"help": "Measure n-gram diversity and entropy percentiles at steps 1, 1 + k, 1 + 2k, ... only."},
    )
    collapse_entropy_min: float | None = field(
        default=None, metadata={"help": "Collapse alarm when the mean token entropy falls below it."}
    )
    collapse_distinct2_drop: float | None = field(
        default=None, metadata={"help": "Collapse alarm when Distinct-2 falls below (1 - drop) x its first value."}
    )
    collapse_repetition_max: float | None = field(
        default=None, metadata={"help": "Collapse alarm when the mean repetition rate exceeds it."}
    )
    collapse_detector: Literal["none", "drift"] = field(
        default="none", metadata={"help": "The gold-free hack detector (alarm/hack): drift or none."}
    )
    collapse_detector_window: int = field(
        default=2, metadata={"help": "Detector: measurements in each signal's trailing mean."}
    )
    collapse_detector_warmup: int = field(
        default=2, metadata={"help": "Detector: measurements before a signal's best value is tracked."}
    )
    collapse_onset_fraction: float = field(
        default=0.75, metadata={"help": "Detector: onset = last measurement within this fraction of the threshold."}
    )
    collapse_length_rise: float | None = field(
        default=0.1, metadata={"help": "Detector: relative rise of the mean completion length that alarms."}
    )
    collapse_prompt_info_drop: float | None = field(
        default=0.15, metadata={"help": "Detector: relative fall of diversity/prompt_info that alarms."}
    )
    collapse_repetition_rise: float | None = field(
        default=0.03, metadata={"help": "Detector: absolute rise of diversity/repetition that alarms."}
    )
    collapse_action: Literal["warn", "save", "stop", "rollback"] = field(
        default="warn", metadata={"help": "What an alarm does besides logging: warn, save, stop or rollback."}
    )
    eval_pass_at_k: list[int] = field(
        default_factory=list, metadata={"help": "k values of pass@k logged at evaluation (empty: off)."}
    )
    eval_pass_threshold: float = field(
        default=1.0, metadata={"help": "Reward at or above which an eval completion counts as correct."}
    )
    eval_pass_greedy: bool = field(
        default=True, metadata={"help": "With eval_pass_at_k, also log the greedy accuracy (pass@k/greedy)."}
    )

    def check(self) -> None:
        unknown = sorted(set(self.diversity_metrics) - set(DIVERSITY_METRICS))
        if unknown:
            _fail(
                "diversity_metrics",
                self.diversity_metrics,
                f"unknown metric(s) {unknown}",
                f"use {list(DIVERSITY_METRICS)}",
            )
        if not self.diversity_ngram_sizes or any(int(n) < 1 for n in self.diversity_ngram_sizes):
            _fail("diversity_ngram_sizes", self.diversity_ngram_sizes, "needs integers >= 1", "e.g. [1, 2, 3, 4]")
        if self.diversity_repetition_n < 1:
            _fail("diversity_repetition_n", self.diversity_repetition_n, "must be >= 1", "e.g. 3")
        if self.diversity_every < 1:
            _fail("diversity_every", self.diversity_every, "must be >= 1 (1: every step)", "e.g. diversity_every=4")
        if self.collapse_distinct2_drop is not None and not 0 < self.collapse_distinct2_drop < 1:
            _fail("collapse_distinct2_drop", self.collapse_distinct2_drop, "must be a fraction in (0, 1)", "e.g. 0.5")
        if any(int(k) < 1 for k in self.eval_pass_at_k):
            _fail("eval_pass_at_k", self.eval_pass_at_k, "k must be >= 1", "e.g. [1, 4, 8]")
        needs = {  # alarm field -> the diversity metric it reads
            "collapse_entropy_min": "entropy",
            "collapse_distinct2_drop": "distinct",
            "collapse_repetition_max": "repetition",
        }
        if self.collapse_detector != "none":
            if not self.diversity_metrics:
                _fail(
                    "collapse_detector",
                    self.collapse_detector,
                    "the detector runs in the collapse monitor, which diversity_metrics switches on",
                    "set diversity_metrics=['repetition', 'prompt_info'] (or more)",
                )
            for name in ("collapse_detector_window", "collapse_detector_warmup"):
                if getattr(self, name) < 1:
                    _fail(name, getattr(self, name), "must be >= 1 (measurements)", f"e.g. {name}=3")
            if not 0 <= self.collapse_onset_fraction < 1:
                _fail(
                    "collapse_onset_fraction",
                    self.collapse_onset_fraction,
                    "must lie in [0, 1) (a fraction of the threshold)",
                    "e.g. 0.5, or 0 for the signal's best point",
                )
            thresholds = ("collapse_length_rise", "collapse_prompt_info_drop", "collapse_repetition_rise")
            if all(getattr(self, name) is None for name in thresholds):
                _fail("collapse_detector", self.collapse_detector, "every signal's threshold is None", "set one")
            for name in thresholds:
                value = getattr(self, name)
                if value is not None and not value > 0:
                    _fail(name, value, "must be > 0 (a drift that alarms) or None", f"e.g. {name}=0.2")
            needs.update(collapse_prompt_info_drop="prompt_info", collapse_repetition_rise="repetition")
        for name, metric in needs.items():
            value = getattr(self, name)
            if value is not None and metric not in self.diversity_metrics:
                _fail(
                    name,
                    value,
                    f"the alarm reads the '{metric}' metric, which diversity_metrics does not compute",
                    f"add '{metric}' to diversity_metrics",
                )


@dataclass
class CheckpointConfig(ConfigSection):
    r"""
    > Checkpoints

        ext_resume_state (`str`, *optional*, defaults to `"load"`):
            On `resume_from_checkpoint`, `"load"` restores the extensions' state (beta of the KL controllers, AEPO's
            last entropy and temperature, the alarm's Distinct-2 baseline) from the checkpoint's
            `grpo_ext_state.json` and refuses a damaged or out-of-range file with an error naming it; `"ignore"`
            starts them from their initial state (the escape hatch for such a file).
    """

    ext_resume_state: Literal["load", "ignore"] = field(
        default="load",
        metadata={
            "help": "On resume: 'load' restores the extensions' state from grpo_ext_state.json (a damaged file is an "
            "error naming it); 'ignore' starts them from their initial state."
        },
    )


#: The families' config sections, in the order GRPOExtConfig's docstring and checks list them.
SECTIONS = (
    AdvantageConfig,
    PRMConfig,
    TokenClipConfig,
    SampleFilterConfig,
    KLControlConfig,
    EntropyControlConfig,
    MonitorConfig,
    CheckpointConfig,
)


# The base order decides the positional order of the fields: dataclasses collect fields along the reversed MRO, so
# GRPOConfig goes last here and its fields come first, in its own order (``GRPOExtConfig("out")`` is
# ``output_dir="out"``, as for ``GRPOConfig``); the sections follow, from AdvantageConfig to CheckpointConfig.
@dataclass
class GRPOExtConfig(
    CheckpointConfig,
    MonitorConfig,
    EntropyControlConfig,
    KLControlConfig,
    SampleFilterConfig,
    TokenClipConfig,
    PRMConfig,
    AdvantageConfig,
    GRPOConfig,
):
    r"""
    Configuration for [`GRPOExtTrainer`]: every [`~trl.GRPOConfig`] field plus the anti-collapse families below. With
    every family at its default the trainer is TRL's `GRPOTrainer`.

    Each family has one switch; its parameters carry the family's prefix. Values are checked in `__post_init__`; a bad
    value raises `ValueError` naming the field and the fix. All fields parse with `TrlParser` (command line and
    `--config file.yaml`).

    Each family's fields, docs and checks live in one section class (`AdvantageConfig`, `PRMConfig`, ...); this class
    composes them and runs every section's `check` in `__post_init__`. Parameters, by section:
    """

    #: The switches that change training; :meth:`without_extensions` sets each to its off value.
    FAMILY_SWITCHES = (
        "advantage_estimator",
        "advantage_weighting",
        "advantage_std",
        "token_clip",
        "sample_filter",
        "kl_control",
        "entropy_control",
    )

    def without_extensions(self, **overrides) -> GRPOExtConfig:
        """This configuration with every family switched off: vanilla GRPO with the same TRL settings.

        Every switch in :attr:`FAMILY_SWITCHES` goes back to its default (TRL's own behaviour). A KL controller owned
        ``beta``, so ``beta`` goes back to TRL's default too (no KL term); a fixed ``beta`` the user set is TRL's and
        stays. The collapse monitor (``diversity_metrics``, ``collapse_*``) observes and stays. ``overrides`` (any
        fields, e.g. ``output_dir``) apply on top. Used by ``recipes/math_grpo.py`` to train the vanilla baseline.
        """
        defaults = {f.name: f.default for f in dataclasses.fields(GRPOExtConfig)}
        changes = {name: defaults[name] for name in self.FAMILY_SWITCHES}
        if self.kl_control != "fixed":
            changes["beta"] = defaults["beta"]
        # TRL derives generation_batch_size from steps_per_generation in __post_init__ and refuses both at once.
        changes["generation_batch_size"] = None
        changes.update(overrides)
        return dataclasses.replace(self, **changes)

    def __post_init__(self):
        super().__post_init__()
        self.validate()

    def validate(self) -> None:
        """Every check of the extension fields (and of TRL's ``beta`` and ``reward_weights``, which the families read),
        with the messages of construction. ``__post_init__`` runs it, and ``GRPOExtTrainer`` again when it is built and
        when training starts, so a field changed after construction gets the same clear error."""
        self._check_numbers()
        self._check_switches()
        for section in SECTIONS:  # each family's own checks, in the order of the sections
            section.check(self)
        self._check_combinations()
        self._check_members()

    def _check_members(self) -> None:
        """The selected members' rules: what each needs of the others and of TRL's settings, declared on the member
        classes (built-in and registered alike; ``trl_grpo_ext.families.contracts.check_selection``, registered in
        ``trl_grpo_ext.names.SELECTION_CHECKS`` when the families are imported)."""
        if not SELECTION_CHECKS:
            return  # the families are not imported: the trainer imports them and validates again
        members = {switch: registry_for(switch).get(getattr(self, switch)) for switch in FAMILIES}
        for check in SELECTION_CHECKS:
            check(self, members)

    # ------------------------------------------------------------------ across sections
    def _check_combinations(self) -> None:
        """Every check that reads fields of more than one section, or TRL's own: what one family needs of another
        family or of TRL's settings. The sections' own ``check`` methods read their own fields only
        (``tests/test_config.py`` holds them to it)."""
        # Rules about which member runs with which (and with TRL's settings) are the members' own, by their class and
        # capabilities: trl_grpo_ext.families.contracts.check_selection (run by validate). What stays here reads
        # fields only.
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
        if self.collapse_action == "rollback" and self.save_strategy != "steps":
            _fail(
                "collapse_action",
                self.collapse_action,
                f"a rollback returns to a checkpoint saved before the alarm's onset, but save_strategy is "
                f"{str(self.save_strategy)!r}",
                "set save_strategy='steps' and save_steps (e.g. 25), or use collapse_action='stop'",
            )
        if self.collapse_action == "rollback" and self.save_total_limit is not None:
            _fail(
                "collapse_action",
                self.collapse_action,
                f"save_total_limit={self.save_total_limit} deletes older checkpoints, and the one saved before the "
                "alarm's onset may be among them (a rollback then finds nothing to return to)",
                "set save_total_limit=None (keep every checkpoint), or use collapse_action='stop'",
            )
        if self.collapse_action == "rollback" and not self.diversity_metrics:
            _fail(
                "collapse_action",
                self.collapse_action,
                "the collapse monitor that acts is off (diversity_metrics is empty)",
                "set diversity_metrics and collapse_detector='drift' (or a collapse_* threshold)",
            )
        # monitor: pass@k of the eval groups
        group = self.num_generations_eval or self.num_generations
        if self.eval_pass_at_k and max(self.eval_pass_at_k) > group:
            _fail(
                "eval_pass_at_k",
                self.eval_pass_at_k,
                f"k cannot exceed the {group} samples per eval prompt",
                "lower k or raise num_generations_eval",
            )

    @property
    def is_off_policy(self) -> bool:
        """Whether a generation batch is reused across optimizer steps (TRL then computes old log-probs)."""
        generate_every = self.steps_per_generation * self.num_iterations
        return self.gradient_accumulation_steps % generate_every != 0

    def _check_numbers(self) -> None:
        """Every numeric extension field is a finite number of its type (not a string from YAML, not a boolean, not
        NaN / inf), and TRL's `beta` and `reward_weights`, which the families read, are finite too."""
        trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
        for f in dataclasses.fields(self):
            if f.name in trl_fields:
                continue
            kind = _type_name(f.type)
            value = getattr(self, f.name)
            if kind in ("float", "int", "float|None", "int|None"):
                # transformers' parser strips `| None` from field.type in place: the class annotations say it too.
                if value is None and (kind.endswith("|None") or f.default is None or f.name in _optional_fields()):
                    continue
                _check_number(f.name, value, integer=kind.startswith("int"))
            elif kind == "list[int]":
                if not isinstance(value, (list, tuple)):
                    _fail(f.name, value, "must be a list of integers", f"e.g. {f.name}=[1, 2]")
                for item in value:
                    _check_number(f.name, item, integer=True, whole=value)
        _check_number("beta", self.beta)
        if self.beta < 0:
            _fail("beta", self.beta, "must be >= 0 (a KL coefficient)", "e.g. beta=0.04, or 0 for no KL term")
        for weight in self.reward_weights or []:
            _check_number("reward_weights", weight, whole=self.reward_weights)
        for name, (low, high, why, example) in SANE_BOUNDS.items():
            values = getattr(self, name)
            for value in values if isinstance(values, (list, tuple)) else [] if values is None else [values]:
                if not low <= value <= high:
                    _fail(name, values, f"outside [{low:g}, {high:g}]: {why}", f"e.g. {example}")
        for name, low, high, example in (
            ("collapse_entropy_min", 0.0, None, 0.1),
            ("collapse_repetition_max", 0.0, 1.0, 0.5),
            ("diversity_low_entropy_threshold", 0.0, None, 0.1),
        ):
            value = getattr(self, name)
            if value is not None and (value < low or (high is not None and value > high)):
                bounds = f"[{low}, {high}]" if high is not None else f">= {low}"
                _fail(name, value, f"must lie in {bounds}", f"e.g. {name}={example}")

    # The built-in names (the switches' Literal types) and the registries (user-registered variants).
    def _check_switches(self) -> None:
        registry_switches = tuple(FAMILIES)  # every family's switch
        for name in registry_switches:
            value = getattr(self, name)
            if not isinstance(value, str) or value not in switch_names(name):
                _fail(name, value, "unknown value (one name, a string)", f"use one of {switch_names(name)}")

        defaults = {f.name: f.default for f in dataclasses.fields(GRPOExtConfig)}
        active = [f"{s}={getattr(self, s)!r}" for s in self.FAMILY_SWITCHES if getattr(self, s) != defaults[s]]
        if active and self.loss_type not in KNOWN_LOSS_TYPES:
            _fail(
                "loss_type",
                self.loss_type,
                f"{', '.join(active)} add loss terms aggregated like TRL {TRL_VERSION}'s loss types "
                f"{sorted(KNOWN_LOSS_TYPES)}, and this one is not among them (they would be aggregated wrongly)",
                "use one of those loss types, or switch the families off (plain GRPOTrainer)",
            )
        for name, allowed in _literal_fields().items():  # every other Literal field: its annotation is the list
            value = getattr(self, name)
            if name not in registry_switches and value not in allowed:
                _fail(name, value, "unknown value", f"use one of {list(allowed)}")


#: Every field the plugin adds to GRPOConfig (its sections'), in declaration order.
PLUGIN_FIELDS = tuple(f.name for section in SECTIONS for f in dataclasses.fields(section))


def switch_names(switch: str) -> list[str]:
    """The valid values of a family switch: the built-in members its ``Literal`` lists and every name registered in
    its registry (``trl_grpo_ext.names``; a user's variant is there once registered)."""
    return sorted(set(_literal_fields()[switch]) | set(registry_for(switch).names()))


@functools.cache
def _optional_fields() -> frozenset[str]:
    """Every section field whose annotation admits None (read from the annotations, which the argument parser leaves
    alone)."""
    return frozenset(
        name
        for section in SECTIONS
        for name, hint in typing.get_type_hints(section).items()
        if type(None) in typing.get_args(hint)
    )


@functools.cache
def _literal_fields() -> dict[str, tuple]:
    """Every section field typed ``Literal[...]`` -> its values, read from the annotations (resolved once)."""
    fields = {}
    for section in SECTIONS:
        for name, hint in typing.get_type_hints(section).items():
            if typing.get_origin(hint) is Literal:
                fields[name] = typing.get_args(hint)
    return fields


# The docstring that documents every field (TRL's style), assembled from the sections.
GRPOExtConfig.__doc__ = (GRPOExtConfig.__doc__ or "") + "".join(
    "\n" + (section.__doc__ or "").strip("\n") + "\n" for section in SECTIONS
)
