"""Bad inputs, table-driven (issue 16): each row is one hostile or mistaken value and the class of answer it gets.

Rows of ``CONFIG_ERRORS``: a clear ``ValueError`` whose message names ``GRPOExtConfig.<field>=`` and says ``Fix:``.
A new field or family adds rows here.
"""

import math
import os

import pytest
import yaml
from trl import TrlParser

from trl_grpo_ext import GRPOExtConfig

BASE = dict(
    output_dir="unused", use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=8, num_generations=4
)
NAN, INF = float("nan"), float("inf")
ADAPTIVE = dict(kl_control="adaptive", beta=0.04)
AEPO = dict(entropy_control="aepo")
KL_COV = dict(token_clip="kl_cov", num_iterations=2)

# (field named in the error, overrides)
CONFIG_ERRORS = [
    # non-finite numbers
    ("kl_beta_max", dict(ADAPTIVE, kl_beta_max=INF)),
    ("kl_beta_min", dict(ADAPTIVE, kl_beta_min=NAN)),
    ("kl_target", dict(ADAPTIVE, kl_target=NAN)),
    ("kl_horizon", dict(ADAPTIVE, kl_horizon=INF)),
    ("kl_diversity_target", dict(kl_control="diversity", beta=0.04, kl_diversity_target=NAN)),
    ("aepo_temperature_high", dict(AEPO, aepo_temperature_high=INF)),
    ("aepo_adv_threshold", dict(AEPO, aepo_adv_threshold=NAN)),
    ("aepo_target_entropy", dict(AEPO, aepo_target_entropy=NAN)),
    ("aepo_coef", dict(AEPO, aepo_coef=INF)),
    ("collapse_entropy_min", dict(diversity_metrics=["entropy"], collapse_entropy_min=NAN)),
    ("collapse_entropy_min", dict(diversity_metrics=["entropy"], collapse_entropy_min=-INF)),
    ("collapse_distinct2_drop", dict(diversity_metrics=["distinct"], collapse_distinct2_drop=NAN)),
    ("eval_pass_threshold", dict(eval_pass_at_k=[1], eval_pass_threshold=NAN)),
    ("diversity_low_entropy_threshold", dict(diversity_low_entropy_threshold=NAN)),
    ("clip_cov_lb", dict(token_clip="clip_cov", clip_cov_lb=NAN)),
    ("clip_cov_ub", dict(token_clip="clip_cov", clip_cov_ub=INF)),
    ("kl_cov_coef", dict(KL_COV, kl_cov_coef=NAN)),
    ("prm_outcome_coef", dict(prm_outcome_coef=INF)),
    ("reward_weights", dict(reward_weights=[NAN])),
    ("reward_weights", dict(reward_weights=[INF])),
    ("beta", dict(beta=NAN)),
    # out of range
    ("beta", dict(beta=-0.1)),
    ("collapse_repetition_max", dict(diversity_metrics=["repetition"], collapse_repetition_max=-1.0)),
    ("collapse_repetition_max", dict(diversity_metrics=["repetition"], collapse_repetition_max=1.5)),
    ("collapse_entropy_min", dict(diversity_metrics=["entropy"], collapse_entropy_min=-0.5)),
    ("collapse_distinct2_drop", dict(diversity_metrics=["distinct"], collapse_distinct2_drop=1.5)),
    ("diversity_low_entropy_threshold", dict(diversity_low_entropy_threshold=-1.0)),
    ("aepo_temperature_low", dict(AEPO, aepo_temperature_low=0.0)),
    ("aepo_max_samples", dict(AEPO, aepo_max_samples=0)),
    ("clip_cov_ratio", dict(token_clip="clip_cov", clip_cov_ratio=0.0)),
    ("kl_cov_ratio", dict(KL_COV, kl_cov_ratio=2.0)),
    ("kl_diversity_n", dict(kl_control="diversity", beta=0.04, kl_diversity_n=0)),
    ("diversity_repetition_n", dict(diversity_metrics=["repetition"], diversity_repetition_n=0)),
    ("diversity_every", dict(diversity_metrics=["distinct"], diversity_every=0)),
    ("diversity_ngram_sizes", dict(diversity_metrics=["distinct"], diversity_ngram_sizes=[0])),
    ("eval_pass_at_k", dict(eval_pass_at_k=[0])),
    ("prm_batch_size", dict(advantage_estimator="prm", prm_batch_size=0)),
    ("prm_causal_bad_token", dict(prm_causal_good_token="+", prm_causal_bad_token="+")),
    # wrong types: booleans, strings (a quoted YAML value), floats where integers belong
    ("clip_cov_ratio", dict(token_clip="clip_cov", clip_cov_ratio=True)),
    ("kl_cov_coef", dict(KL_COV, kl_cov_coef=True)),
    ("kl_target", dict(ADAPTIVE, kl_target="0.1")),
    ("aepo_max_samples", dict(AEPO, aepo_max_samples=2.5)),
    ("diversity_ngram_sizes", dict(diversity_metrics=["distinct"], diversity_ngram_sizes=[1.5])),
    ("diversity_ngram_sizes", dict(diversity_metrics=["distinct"], diversity_ngram_sizes=[True])),
    ("kl_horizon", dict(ADAPTIVE, kl_horizon="long")),
    # unknown switch values
    ("token_clip", dict(token_clip="clip_cow")),
    ("sample_filter", dict(sample_filter="best")),
    ("kl_control", dict(kl_control="pid")),
    ("entropy_control", dict(entropy_control="bonus")),
    ("advantage_estimator", dict(advantage_estimator="gae")),
    ("ext_resume_state", dict(ext_resume_state="skip")),
    ("advantage_std", dict(advantage_std="unbiased")),
    ("token_clip_scope", dict(token_clip="clip_cov", token_clip_scope="world")),
    ("prm_std", dict(advantage_estimator="prm", prm_std="biased")),
    ("prm_model_type", dict(advantage_estimator="prm", prm_model_type="seq2seq")),
    ("diversity_metrics", dict(diversity_metrics=["distinct", "perplexity"])),
    ("collapse_action", dict(diversity_metrics=["entropy"], collapse_action="email")),
    # more out of range
    ("kl_beta_max", dict(ADAPTIVE, kl_beta_min=0.1, kl_beta_max=0.01)),
    ("kl_beta_min", dict(ADAPTIVE, kl_beta_min=0.0)),
    ("kl_target", dict(ADAPTIVE, kl_target=0.0)),
    ("kl_target", dict(ADAPTIVE, kl_target=-0.1)),
    ("kl_horizon", dict(ADAPTIVE, kl_horizon=0)),
    ("kl_diversity_target", dict(kl_control="diversity", beta=0.04, kl_diversity_target=0.0)),
    ("kl_diversity_target", dict(kl_control="diversity", beta=0.04, kl_diversity_target=1.5)),
    ("aepo_target_entropy", dict(AEPO, aepo_target_entropy=0.0)),
    ("aepo_target_entropy", dict(AEPO, aepo_target_entropy=-1.0)),
    ("aepo_temperature_low", dict(AEPO, aepo_temperature_low=1.5, aepo_temperature_high=1.2)),
    ("aepo_coef", dict(AEPO, aepo_coef=0.0)),
    ("aepo_coef", dict(AEPO, aepo_coef=-1.0)),
    ("aepo_regenerate_fraction", dict(AEPO, aepo_regenerate_fraction=0.0)),
    ("aepo_regenerate_fraction", dict(AEPO, aepo_regenerate_fraction=1.5)),
    ("aepo_regenerate_fraction", dict(AEPO, aepo_regenerate_fraction=25)),  # a percentage
    ("aepo_mode", dict(AEPO, aepo_mode="reference")),
    ("clip_cov_ratio", dict(token_clip="clip_cov", clip_cov_ratio=-0.1)),
    ("clip_cov_ratio", dict(token_clip="clip_cov", clip_cov_ratio=NAN)),
    ("kl_cov_ratio", dict(KL_COV, kl_cov_ratio=0.0)),
    ("clip_cov_lb", dict(token_clip="clip_cov", clip_cov_lb=5.0, clip_cov_ub=1.0)),
    ("kl_cov_coef", dict(KL_COV, kl_cov_coef=0.0)),
    ("eval_pass_at_k", dict(eval_pass_at_k=[1, 8], num_generations=4)),
    # combinations that cannot work, or would silently do nothing
    ("beta", dict(kl_control="adaptive", beta=0.0)),
    ("beta", dict(kl_control="adaptive", beta=2.0)),
    ("beta", dict(kl_control="diversity", beta=0.0)),
    ("token_clip", dict(token_clip="kl_cov")),  # on-policy: |logp - old_logp| is 0
    ("token_clip", dict(token_clip="clip_cov", importance_sampling_level="sequence")),
    ("kl_cov_ppo_clip", dict(KL_COV, epsilon_high=0.28)),
    ("kl_cov_ppo_clip", dict(KL_COV, loss_type="cispo")),
    ("advantage_std", dict(advantage_std="population", scale_rewards="none")),
    ("advantage_std", dict(advantage_std="population", multi_objective_aggregation="normalize_then_sum")),
    ("prm_model_name_or_path", dict(prm_model_name_or_path="some/prm")),
    ("prm_step_separator", dict(advantage_estimator="prm", prm_step_separator="")),
    ("entropy_control", dict(AEPO, entropy_coef=0.01)),
    ("entropy_control", dict(AEPO, use_adaptive_entropy=True)),
    ("collapse_entropy_min", dict(diversity_metrics=["distinct"], collapse_entropy_min=0.1)),
    ("collapse_distinct2_drop", dict(diversity_metrics=["entropy"], collapse_distinct2_drop=0.5)),
    ("collapse_repetition_max", dict(diversity_metrics=["distinct"], collapse_repetition_max=0.5)),
    # more wrong types
    ("prm_step_separator_token_id", dict(advantage_estimator="prm", prm_step_separator_token_id=1.5)),
    ("prm_step_separator_token_id", dict(advantage_estimator="prm", prm_step_separator_token_id=True)),
    ("prm_batch_size", dict(advantage_estimator="prm", prm_batch_size=True)),
    ("diversity_repetition_n", dict(diversity_metrics=["repetition"], diversity_repetition_n=2.5)),
    ("diversity_every", dict(diversity_metrics=["distinct"], diversity_every=2.5)),
    ("kl_diversity_n", dict(kl_control="diversity", beta=0.04, kl_diversity_n=True)),
    ("reward_weights", dict(reward_weights=["1.0"])),
    ("eval_pass_at_k", dict(eval_pass_at_k=["1"])),
    ("eval_pass_at_k", dict(eval_pass_at_k=4)),
    ("aepo_max_samples", dict(AEPO, aepo_max_samples="60")),
    ("kl_beta_max", dict(ADAPTIVE, kl_beta_max=None)),
    ("beta", dict(beta=None)),  # `beta: null` in YAML
    ("sample_filter", dict(sample_filter=["best_of_n"])),  # a list where one name belongs
    ("kl_control", dict(kl_control=["adaptive"])),
    ("token_clip", dict(token_clip=None)),
    ("loss_type", dict(token_clip="clip_cov", loss_type="grpo_v2")),  # a TRL loss type this release does not know
    ("loss_type", dict(sample_filter="best_of_n", loss_type="new_loss")),
    ("sample_filter", dict(sample_filter="none ")),
    # pass@k advantages
    ("pkpo_k", dict(advantage_estimator="pass_at_k", pkpo_k=0)),
    ("pkpo_k", dict(advantage_estimator="pass_at_k", pkpo_k=5)),  # more than the 4 samples of a prompt
    ("pkpo_k", dict(advantage_estimator="pass_at_k", pkpo_k=2.5)),
    ("pkpo_estimator", dict(advantage_estimator="pass_at_k", pkpo_estimator="loo")),
    ("pkpo_anneal_fraction", dict(advantage_estimator="pass_at_k", pkpo_anneal_fraction=1.5)),
    # W-REINFORCE and entropy-shaped advantages
    ("w_reinforce_lambda", dict(advantage_weighting="w_reinforce", w_reinforce_lambda=-0.1)),
    ("w_reinforce_lambda", dict(advantage_weighting="w_reinforce", w_reinforce_lambda=float("nan"))),
    ("w_reinforce_baseline", dict(advantage_weighting="w_reinforce", w_reinforce_baseline="mean")),
    ("w_reinforce_baseline", dict(advantage_weighting="w_reinforce", advantage_estimator="pass_at_k", pkpo_k=2)),
    ("w_reinforce_threshold", dict(advantage_weighting="w_reinforce", w_reinforce_threshold="0.5")),
    ("advantage_weighting", dict(advantage_weighting="w-reinforce")),
    ("entropy_adv_alpha", dict(advantage_weighting="entropy_advantage", entropy_adv_alpha=0.0)),
    ("entropy_adv_kappa", dict(advantage_weighting="entropy_advantage", entropy_adv_kappa=0.5)),
    ("entropy_adv_kappa", dict(advantage_weighting="entropy_advantage", entropy_adv_kappa=float("inf"))),
    # dynamic sampling
    ("dynamic_sampling_max_rounds", dict(refill="dynamic_sampling", dynamic_sampling_max_rounds=-1)),
    ("dynamic_sampling_max_rounds", dict(refill="dynamic_sampling", dynamic_sampling_max_rounds=10**6)),
    ("dynamic_sampling_max_rounds", dict(refill="dynamic_sampling", dynamic_sampling_max_rounds=2.5)),
    ("dynamic_sampling_fill", dict(refill="dynamic_sampling", dynamic_sampling_fill="duplicate")),
    ("advantage_estimator", dict(refill="dynamic_sampling", advantage_estimator="prm")),
    ("w_reinforce_baseline", dict(refill="dynamic_sampling", advantage_weighting="w_reinforce")),
    # finite but absurd (issue 26: beta reached 2.6e8 with kl_beta_max=1e300; a weight of 1e30 zeroed every advantage)
    ("kl_beta_max", dict(ADAPTIVE, kl_beta_max=1e300, kl_horizon=1)),
    ("reward_weights", dict(reward_weights=[1e30])),
    ("aepo_temperature_high", dict(AEPO, aepo_temperature_high=1e6)),
    ("kl_horizon", dict(ADAPTIVE, kl_horizon=1e-3)),
    ("beta", dict(beta=1e5)),
    ("kl_target", dict(ADAPTIVE, kl_target=1e9)),
    ("aepo_coef", dict(AEPO, aepo_coef=1e9)),
    ("aepo_target_entropy", dict(AEPO, aepo_target_entropy=1e3)),
    ("kl_cov_coef", dict(KL_COV, kl_cov_coef=1e9)),
    ("prm_outcome_coef", dict(prm_outcome_coef=-1e9)),
]


@pytest.mark.parametrize("field, overrides", CONFIG_ERRORS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(CONFIG_ERRORS)])
def test_bad_config_value_is_a_clear_error(field, overrides):
    with pytest.raises(ValueError) as info:
        GRPOExtConfig(**{**BASE, **overrides})
    message = str(info.value)
    assert f"GRPOExtConfig.{field}=" in message and "Fix:" in message, message


def test_quoted_yaml_number(tmp_path):
    """Through TrlParser a quoted YAML number is converted by the field's type; built directly, it is named."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**BASE, **ADAPTIVE, "kl_target": "0.1"}))
    (args,) = TrlParser((GRPOExtConfig,)).parse_args_and_config(["--config", str(path)])
    assert args.kl_target == 0.1 and isinstance(args.kl_target, float)
    with pytest.raises(ValueError, match=r"GRPOExtConfig\.kl_target='0\.1'.*drop the quotes"):
        GRPOExtConfig(**{**BASE, **ADAPTIVE, "kl_target": "0.1"})


def test_every_numeric_extension_field_refuses_nan():
    """Sweep: a new numeric field is covered without a new row (NaN is never a valid setting)."""
    import dataclasses

    from trl import GRPOConfig

    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    from trl_grpo_ext.config.section import _type_name

    TrlParser((GRPOExtConfig,))  # resolves field.type in place: the check must not depend on it being a string
    numeric = [
        f.name
        for f in dataclasses.fields(GRPOExtConfig)
        if f.name not in trl_fields and _type_name(f.type) in ("float", "float|None")
    ]
    assert len(numeric) >= 20, numeric
    for name in numeric:
        with pytest.raises(ValueError, match=rf"GRPOExtConfig\.{name}=nan"):
            GRPOExtConfig(**{**BASE, name: math.nan})


# ------------------------------------------------------------------ reward outputs at run time
def _huge(completions, **kwargs):
    return [1e20 if i % 2 else 0.0 for i in range(len(completions))]


def _huge_steps(prompts, completions, steps, **kwargs):
    return [[-1e20] * len(s) for s in steps]


# (what the error says, make_trainer keyword arguments); each used to train silently with every advantage 0
def _big(completions, **kwargs):
    return [1e12] * len(completions)


REWARD_ERRORS = [
    (r"\['_huge'\] returned a reward above 1e\+15", dict(reward_funcs=[_huge])),
    (
        r"weighted reward sum reaches 1e\+16 \(reward_weights=\[10000\.0\]\)",
        dict(reward_funcs=[_big], reward_weights=[1e4]),
    ),
    (
        r"'_huge_steps' returned -1e\+20 for completion 0, above 1e\+15",
        dict(advantage_estimator="prm", max_completion_length=8, trainer_kwargs={"step_reward_funcs": [_huge_steps]}),
    ),
]


# (what the error says, what an outcome reward function returns); before: raw TypeError / ValueError /
# RuntimeError from TRL's conversion, naming no function
REWARD_OUTPUT_ERRORS = [
    (r"'f' returned '1\.0' \(str\) for completion 0", ["1.0", 0.0]),
    (r"'f' returned NoneType None\. Return a list", None),
    (r"'f' returned float 0\.5\. Return a list", 0.5),
    (r"'f' returned str '10'\. Return a list", "10"),
    (r"'f' returned \[1\.0\] \(list\) for completion 1", [0.0, [1.0]]),
    (r"'f' returned dict", {"a": 1.0}),
    (r"'f' returned 'nan' \(str\) for completion 0", ["nan", 1.0]),
]


def _reward_returning(result):
    from trl_grpo_ext.trainer import _with_context

    def f(completions, **kwargs):
        return result() if callable(result) else result

    return _with_context(f)


@pytest.mark.parametrize(
    "message, result", REWARD_OUTPUT_ERRORS, ids=[str(i) for i in range(len(REWARD_OUTPUT_ERRORS))]
)
def test_malformed_reward_output_is_named(message, result):
    with pytest.raises(ValueError, match=message):
        _reward_returning(result)(completions=["a", "b"])


def test_reward_outputs_trl_accepts_pass_unchanged():
    import numpy as np
    import torch

    for result in ([1.0, None], [True, False], [np.float32(0.5), torch.tensor(1.0)], torch.ones(2), np.ones(2)):
        assert _reward_returning(result)(completions=["a", "b"]) is result
    assert _reward_returning(lambda: (x for x in [1.0, 0.0]))(completions=["a", "b"]) == [1.0, 0.0]  # a generator


def test_malformed_reward_output_is_named_in_training(make_trainer):
    def strings(completions, **kwargs):
        return ["1"] * len(completions)

    with pytest.raises(ValueError, match=r"Reward function 'strings' returned '1' \(str\) for completion 0"):
        make_trainer(reward_funcs=[strings], max_steps=1).train()


@pytest.mark.parametrize("message, kwargs", REWARD_ERRORS, ids=["outcome", "weighted", "step"])
def test_reward_that_would_overflow_the_group_statistics_is_refused(make_trainer, message, kwargs):
    trainer = make_trainer(max_steps=1, **kwargs)
    with pytest.raises(ValueError, match=message):
        trainer.train()


def test_large_finite_rewards_still_train():
    """The bound sits far above realistic scales: 1e6-scale rewards give the same advantages as 1-scale ones."""
    import torch

    from trl_grpo_ext.core import group_relative_advantages

    rewards = torch.tensor([0.0, 1.0, 0.5, 1.0])
    scaled = group_relative_advantages(rewards * 1e6, group_size=4, eps=0.0)  # eps aside, the scale cancels
    torch.testing.assert_close(scaled, group_relative_advantages(rewards, group_size=4, eps=0.0))
    # the statistics run in float64: rewards up to the float32 maximum give the same advantages (they were all 0)
    for scale in (1e20, 3e38):
        torch.testing.assert_close(
            group_relative_advantages(rewards * scale, group_size=4, eps=0.0),
            group_relative_advantages(rewards, group_size=4, eps=0.0),
        )
    assert group_relative_advantages(rewards * 3e38, group_size=4).dtype == torch.float32


# ------------------------------------------------------------------ step reward sources (PRM), called directly
def _source(result):
    def source(prompts, completions, steps, **kwargs):
        if isinstance(result, Exception):
            raise result
        return result() if callable(result) else result

    return source


STEPS = [["a", "b"], ["c"]]
# (what the error says, what the source returns or raises); before, raw TypeError / KeyError naming nothing
STEP_ERRORS = [
    (RuntimeError, r"'src' raised KeyError: 'x'", KeyError("x")),
    (ValueError, r"'src' returned float 0\.5\. Return one list per completion", 0.5),
    (ValueError, r"'src' returned 3 lists for 2 completions", "abc"),
    (ValueError, r"'src' returned str 'ab' for completion 0", ["ab", [1.0]]),
    (ValueError, r"'src' returned float 1\.0 for completion 0", [1.0, [1.0]]),
    (ValueError, r"'src' returned 'high' as a step score of completion 0", [["high", 0.0], [1.0]]),
    (ValueError, r"'src' returned \[1\.0\] as a step score of completion 1", [[1.0, 0.0], [[1.0]]]),
    (ValueError, r"'src' returned True as a step score of completion 0", [[True, 0.0], [1.0]]),
    (ValueError, r"'src' returned None for 2 completions", None),
]


@pytest.mark.parametrize("error, message, result", STEP_ERRORS, ids=[str(i) for i in range(len(STEP_ERRORS))])
def test_bad_step_reward_output_is_named(error, message, result):
    from trl_grpo_ext.prm import call_step_function

    with pytest.raises(error, match=message):
        call_step_function(_source(result), "src", ["p", "p"], ["x", "y"], STEPS)


def test_step_scores_as_generators_tensors_and_numpy_are_accepted():
    import numpy as np
    import torch

    from trl_grpo_ext.prm import call_step_function

    expected = [[1.0, 0.0], [0.5]]
    for result in (
        lambda: (row for row in expected),  # a generator of rows
        [torch.tensor([1.0, 0.0]), np.array([0.5])],  # tensors / arrays per completion
        [[torch.tensor(1.0), np.float32(0.0)], [np.float64(0.5)]],  # 0-d tensors and numpy scalars
    ):
        assert call_step_function(_source(result), "src", ["p", "p"], ["x", "y"], STEPS) == expected


def test_step_reward_source_given_by_name_is_named(make_trainer):
    with pytest.raises(TypeError, match=r"step_reward_funcs\[0\]='arithmetic_steps' is not callable"):
        make_trainer(advantage_estimator="prm", trainer_kwargs={"step_reward_funcs": ["arithmetic_steps"]})


# ------------------------------------------------------------------ diversity metrics at the edges
def _batch(rows):
    import torch

    width = max(1, max((len(r) for r in rows), default=1))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


def _diversity_calls():
    from trl_grpo_ext.core import diversity as d

    two = _batch([[1, 2, 3], [1, 2, 4]])
    three = _batch([[1, 2], [3, 4], [5, 6]])
    return [
        # (what the error names, call); before: 0.8 for n=0, NaN for max_n=0, raw errors or silent ragged groups
        ("repetition_rate: n must be an integer >= 1", lambda: d.repetition_rate([1, 2, 3, 1, 2], 0)),
        ("repetition_rates: n must be an integer >= 1", lambda: d.repetition_rates(*two, 0)),
        ("distinct_n: n must be an integer >= 1", lambda: d.distinct_n([[1, 2]], 0)),
        ("distinct_n_batch: n must be an integer >= 1", lambda: d.distinct_n_batch(*two, 1.5)),
        ("distinct_n_batch: group_size must be an integer >= 1", lambda: d.distinct_n_batch(*two, 2, group_size=0)),
        ("distinct_n_batch: 3 rows do not split into groups", lambda: d.distinct_n_batch(*three, 2, group_size=2)),
        ("unique_fraction: group_size must be an integer >= 1", lambda: d.unique_fraction(*two, 0)),
        ("unique_fraction: 3 rows do not split", lambda: d.unique_fraction(*three, 2)),
        ("self_bleu: max_n must be an integer >= 1", lambda: d.self_bleu([[1, 2, 3], [1, 2, 4]], max_n=0)),
        ("self_bleu_batch: max_n must be an integer >= 1", lambda: d.self_bleu_batch(*two, 2, max_n=0)),
        ("self_bleu_batch: 3 rows do not split", lambda: d.self_bleu_batch(*three, 2)),
        ("batch_diversity: ngram_sizes must be an integer >= 1", lambda: d.batch_diversity(*two, 2, ngram_sizes=[0])),
        ("batch_diversity: self_bleu_max_n must be", lambda: d.batch_diversity(*two, 2, self_bleu_max_n=0)),
        ("batch_diversity: repetition_n must be", lambda: d.batch_diversity(*two, 2, repetition_n=1.5)),
        ("batch_diversity: 3 rows do not split", lambda: d.batch_diversity(*three, 2)),
        # float token ids were cast to integers silently (Distinct-2 0.0625 from logits)
        ("distinct_n_batch: token ids must be an integer tensor", lambda: d.distinct_n_batch(two[0] * 0.3, two[1], 2)),
        ("batch_diversity: token ids must be an integer tensor", lambda: d.batch_diversity(two[0] * 0.3, two[1], 2)),
        ("self_bleu_batch: token ids must be an integer tensor", lambda: d.self_bleu_batch(two[0] * 0.5, two[1], 2)),
    ]


@pytest.mark.parametrize("index", range(18))
def test_diversity_metric_bad_arguments_are_named(index):
    message, call = _diversity_calls()[index]
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_diversity_metrics_on_empty_batches_and_strings():
    import torch

    from trl_grpo_ext.core import diversity as d

    empty = torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, 4, dtype=torch.long)
    assert d.unique_fraction(*empty, 4) == 0.0 and d.self_bleu_batch(*empty, 4) == 0.0
    assert d.distinct_n_batch(*empty, 2) == 0.0 and d.repetition_rates(*empty, 2).numel() == 0
    # strings are sequences of characters, as the module says: the same value as the same tokens as ids
    assert d.self_bleu(["abcd", "abce"]) == d.self_bleu([[0, 1, 2, 3], [0, 1, 2, 4]]) > 0
    assert d.self_bleu([["the", "cat"], ["the", "dog"]]) == d.self_bleu([[0, 1], [0, 2]])


def test_diversity_kl_with_n_longer_than_the_completions_leaves_beta(make_trainer, caplog):
    """Before: completions shorter than n gave Distinct-N 0, read as collapse, and beta rose every step."""
    trainer = make_trainer(
        kl_control="diversity", beta=0.04, kl_diversity_n=50, kl_diversity_target=0.5, kl_horizon=8, max_steps=3
    )
    with caplog.at_level("WARNING"):
        trainer.train()
    assert "Distinct-50 is undefined" in caplog.text
    assert trainer.beta == pytest.approx(0.04)
    logged = [h["kl/diversity"] for h in trainer.state.log_history if "kl/diversity" in h]
    assert logged and all(v is None or math.isnan(v) for v in logged)  # undefined, not 0


# ------------------------------------------------------------------ dataset values the rewards receive
def test_integer_answer_columns_score_like_strings():
    """Before: a dataset with an int `answer` column made exact_match / final_answer score 0 on every right answer."""
    from grpo_lab import testbed, testkit

    assert testkit.exact_match_reward(["12", "13"], answer=[12, 12]) == [1.0, 0.0]
    assert testkit.final_answer_reward(["5+7=12\n12", "12\n13"], answer=[12, 12]) == [1.0, 0.0]
    assert testkit.first_char_reward(["12"], answer=[12]) == [0.5]
    assert testbed.answer_reward(["55"], answer=[55]) == [1.0]


def test_missing_math_reference_is_unscorable_not_wrong():
    """Before: solution=None was parsed as the text 'None' and every completion scored 0.0."""
    from trl_grpo_ext.rewards import math_accuracy_reward

    assert math_accuracy_reward(["\\boxed{3}", "\\boxed{3}", "\\boxed{3}"], solution=[None, "", "#### 3"]) == [
        None,
        None,
        1.0,
    ]


DATASET_ERRORS = [
    # (file content, dataset_format, what the error says); before: StopIteration, KeyError, silent int/empty prompts
    ("", None, "the file is empty"),
    ('{"q": "1+1?", "a": "2"}\n', "gsm8k", r"dataset_format='gsm8k' needs the column 'question'"),
    ('{"q": "1+1?", "a": "2"}\n', None, r"A 'plain' dataset row needs 'prompt'"),
    ('{"prompt": 5, "answer": "5"}\n', None, "row 0 has prompt 5"),
    ('{"prompt": "  ", "answer": "5"}\n', None, "row 0 has prompt '  '"),
    ('{"prompt": "fine", "answer": "5"}\n{"prompt": "", "answer": "6"}\n', None, "row 1 has prompt ''"),
    ("not json at all\n", None, "cannot be read as jsonl"),
]


@pytest.mark.parametrize("content, fmt, message", DATASET_ERRORS, ids=[str(i) for i in range(len(DATASET_ERRORS))])
def test_bad_dataset_file_is_named(tmp_path, content, fmt, message):
    from trl_grpo_ext.data import load_math_dataset

    path = tmp_path / "data.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_math_dataset(str(path), dataset_format=fmt)


def test_missing_local_file_is_not_looked_up_on_the_hub(tmp_path):
    from trl_grpo_ext.data import load_math_dataset

    with pytest.raises(ValueError, match="no such file"):
        load_math_dataset(str(tmp_path / "missing.jsonl"))
    path = tmp_path / "ok.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    with pytest.raises(ValueError, match="num_train_examples=0"):
        load_math_dataset(str(path), num_examples=0)
    assert load_math_dataset(str(path))["solution"] == ["2"]


@pytest.mark.parametrize("rows", [0, 1])
def test_dataset_smaller_than_one_generation_batch_is_an_error(
    tiny_model_path, tokenizer, train_dataset, tmp_path, rows
):
    """Before: 1 prompt with 2 per generation batch trained 0 steps and returned normally."""
    from conftest import TINY_ARGS

    from grpo_lab import testkit
    from trl_grpo_ext import GRPOExtTrainer

    with pytest.raises(ValueError, match=rf"train_dataset has {rows} prompt\(s\), but one generation batch takes 2"):
        GRPOExtTrainer(
            model=tiny_model_path,
            reward_funcs=[testkit.exact_match_reward],
            args=GRPOExtConfig(**{**TINY_ARGS, "output_dir": str(tmp_path)}),
            train_dataset=train_dataset.select(range(rows)),
            processing_class=tokenizer,
        )


def test_causal_lm_folder_as_token_classification_prm_is_refused(tiny_model_path):
    """Before: the classification head was silently random and the PRM scored steps at random."""
    from trl_grpo_ext.prm import TokenClassificationPRM

    with pytest.raises(ValueError, match=r"has no weights for \[.*'score\.weight'\].*randomly initialised"):
        TokenClassificationPRM(str(tiny_model_path))


def test_missing_prm_folder_is_named(tmp_path):
    from trl_grpo_ext.prm import CausalLMPRM

    with pytest.raises(ValueError, match="no such folder"):
        CausalLMPRM(str(tmp_path / "no-prm-here"), step_tag="#")


# ------------------------------------------------------------------ trainer construction
def _env_factory():
    return object()


# (what the error says, make_trainer keyword arguments)
TRAINER_ERRORS = [
    (
        r"entropy_control='aepo' cannot run with environment_factory",
        dict(entropy_control="aepo", trainer_kwargs={"environment_factory": _env_factory}),
    ),
    (
        r"step_reward_funcs are used only with advantage_estimator='prm'",
        dict(trainer_kwargs={"step_reward_funcs": [lambda prompts, completions, steps, **kw: []]}),
    ),
    (r"advantage_estimator='prm' needs step rewards", dict(advantage_estimator="prm")),
    (
        r"step_reward_funcs\[0\]=42 is not callable",
        dict(advantage_estimator="prm", trainer_kwargs={"step_reward_funcs": [42]}),
    ),
]


@pytest.mark.parametrize("message, kwargs", TRAINER_ERRORS, ids=[str(i) for i in range(len(TRAINER_ERRORS))])
def test_bad_trainer_arguments_are_named(make_trainer, message, kwargs):
    with pytest.raises((ValueError, TypeError), match=message):
        make_trainer(**kwargs)


# (field, value): set after the config was built (issue 26: inf trained at temperature inf; NaN failed later naming no
# field), refused with the construction message when the trainer is built, and when training starts
LATE_CHANGES = [
    ("aepo_temperature_high", INF),
    ("kl_target", NAN),
    ("kl_beta_max", 1e300),
    ("token_clip", "clip_cow"),
]


@pytest.mark.parametrize("field, value", LATE_CHANGES, ids=[f for f, _ in LATE_CHANGES])
def test_a_field_changed_after_construction_gets_the_same_error(make_trainer, field, value, monkeypatch):
    from trl_grpo_ext import GRPOExtConfig as Config

    fields = dict(entropy_control="aepo", kl_control="adaptive", beta=0.04)
    original = Config.__post_init__

    def change_after(self):  # the user's `args.<field> = value` right after construction
        original(self)
        setattr(self, field, value)

    monkeypatch.setattr(Config, "__post_init__", change_after)
    with pytest.raises(ValueError, match=rf"GRPOExtConfig\.{field}=.*Fix:"):
        make_trainer(**fields)  # built after the change
    monkeypatch.setattr(Config, "__post_init__", original)
    trainer = make_trainer(**fields, max_steps=1)
    setattr(trainer.args, field, value)  # changed once the trainer exists
    with pytest.raises(ValueError, match=rf"GRPOExtConfig\.{field}=.*Fix:"):
        trainer.train()


# (what the error says, the training rows); before: raw KeyError 'prompt', IndexError, tokenizer errors naming no row
PROMPT_ERRORS = [
    (
        r"train_dataset has no 'prompt' column \(columns: \['question', 'answer'\]\)",
        [{"question": "1+1=", "answer": "2"}],
    ),
    (
        r"train_dataset\['prompt'\]\[1\] = '' \(str\)",
        [{"prompt": "1+1=", "answer": "2"}, {"prompt": "", "answer": "0"}],
    ),
    (r"train_dataset\['prompt'\]\[0\] = 42 \(int\)", [{"prompt": 42, "answer": "2"}]),
    (r"train_dataset\['prompt'\]\[0\] = \[\] \(list\)", [{"prompt": [], "answer": "2"}]),
]


@pytest.mark.parametrize("message, rows", PROMPT_ERRORS, ids=[str(i) for i in range(len(PROMPT_ERRORS))])
def test_bad_prompts_are_named_with_their_row(tiny_model_path, tokenizer, tmp_path, message, rows):
    from conftest import TINY_ARGS
    from datasets import Dataset

    from grpo_lab import testkit
    from trl_grpo_ext import GRPOExtTrainer

    dataset = Dataset.from_list(rows * 16)
    with pytest.raises(ValueError, match=message):
        GRPOExtTrainer(
            model=tiny_model_path,
            reward_funcs=testkit.exact_match_reward,
            args=GRPOExtConfig(**{**TINY_ARGS, "output_dir": str(tmp_path)}),
            train_dataset=dataset,
            processing_class=tokenizer,
        )


def test_an_async_reward_that_raises_is_named():
    """Before: the naming wrapper skipped coroutine functions, and TRL surfaced a raw KeyError."""
    import asyncio
    import inspect

    from trl_grpo_ext.trainer import _with_context

    async def lookup(completions, **kwargs):
        return [{"a": 1.0}[c] for c in completions]

    wrapped = _with_context(lookup)
    assert inspect.iscoroutinefunction(wrapped)  # TRL still awaits it with the other async rewards
    assert asyncio.run(wrapped(completions=["a"])) == [1.0]
    with pytest.raises(RuntimeError, match=r"Reward function 'lookup' raised KeyError: 'b'"):
        asyncio.run(wrapped(completions=["b"]))


# (error type, what it says, the call); before: TypeError 'int' object is not subscriptable, zip() length errors,
# invalid literal for int(), 16 workers accepted on 2 cores (77 s, 8.4 GiB to start)
def _math_calls():
    from trl_grpo_ext.rewards import math_accuracy_reward, set_math_reward_workers
    from trl_grpo_ext.rewards.math import math_reward_workers

    def bad_local_world_size():
        old = os.environ.get("LOCAL_WORLD_SIZE")
        os.environ["LOCAL_WORLD_SIZE"] = "abc"
        try:
            return math_reward_workers()
        finally:
            os.environ.pop("LOCAL_WORLD_SIZE") if old is None else os.environ.update(LOCAL_WORLD_SIZE=old)

    return [
        (TypeError, r"completion 0 is int 42", lambda: math_accuracy_reward([42], solution=["#### 42"])),
        (ValueError, r"2 completions but 1 references", lambda: math_accuracy_reward(["a", "b"], solution=["1"])),
        (ValueError, r"LOCAL_WORLD_SIZE='abc' is not an integer", bad_local_world_size),
        (ValueError, r"math reward workers=1000000: at most", lambda: set_math_reward_workers(10**6)),
    ]


@pytest.mark.parametrize("index", range(4))
def test_math_reward_inputs_are_named(index):
    error, message, call = _math_calls()[index]
    with pytest.raises(error, match=message):
        call()


# ------------------------------------------------------------------ documented fallbacks of the pure functions
def diversity_module():
    from trl_grpo_ext.core import diversity

    return diversity


def _fallbacks():
    import torch

    from grpo_lab import testkit
    from trl_grpo_ext.adapter.compat import vllm_importance_sampling_ratio
    from trl_grpo_ext.core import (
        AdaptiveKLController,
        DiversityKLController,
        clip_cov_mask,
        distinct_n_batch,
        group_relative_advantages,
        kl_cov_mask,
        prm_step_advantages,
        repetition_rates,
        self_bleu_batch,
        unique_fraction,
    )
    from trl_grpo_ext.core.aepo import aepo_candidates, aepo_pick, high_entropy_mask
    from trl_grpo_ext.prm.segmentation import segment_completion
    from trl_grpo_ext.rewards import math_accuracy_reward

    tok = testkit.build_char_tokenizer()

    def steps(text):
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return segment_completion(tok, ids, separator="\n").texts

    empty = torch.zeros(0, 4, dtype=torch.long)
    nothing = torch.zeros(2, 3)
    controller = AdaptiveKLController(0.04, 0.1, 1000, beta_min=1e-4, beta_max=1.0)
    diversity = DiversityKLController(0.04, 0.5, 1000, beta_min=1e-4, beta_max=1.0)
    return [
        # (input, what it does, callable giving the value, the documented value)
        (
            "a None / NaN reward in a group",
            "left out of the group statistics, advantage 0",
            lambda: group_relative_advantages(torch.tensor([1.0, NAN, 0.0, 1.0]), 4)[1].item(),
            0.0,
        ),
        (
            "every reward of a group None",
            "advantages 0",
            lambda: group_relative_advantages(torch.tensor([NAN] * 4), 4).tolist(),
            [0.0] * 4,
        ),
        (
            "self-BLEU of groups of one completion",
            "0.0 (no reference), as the list API gives",
            lambda: diversity_module().self_bleu_batch(torch.tensor([[1, 2, 3], [1, 2, 4]]), torch.ones(2, 3), 1),
            0.0,
        ),
        (
            "equal rewards in a group",
            "advantages 0 (no signal), not NaN",
            lambda: group_relative_advantages(torch.ones(4), 4).tolist(),
            [0.0] * 4,
        ),
        (
            "a None / NaN step score",
            "counts 0 in the step sums (the other steps keep their advantage)",
            lambda: prm_step_advantages([[NAN, 1.0], [0.0, 1.0]], [[1, 2], [1, 2]], 2, 3)[0, 0].item(),
            pytest.approx(0.7070, abs=1e-3),
        ),
        ("a completion without the separator", "one step", lambda: steps("1+1=2"), ["1+1=2"]),
        ("an empty completion (EOS only)", "no step (advantage 0)", lambda: steps(""), []),
        ("a completion of separators only", "no step", lambda: steps("\n\n\n"), []),
        ("blank steps between separators", "skipped", lambda: steps("a\n\nb\n"), ["a", "b"]),
        (
            "characters the tokenizer does not know",
            "dropped from the step text; a step left blank is skipped",
            lambda: steps("é漢\nab"),
            ["ab"],
        ),
        (
            "kl_control=adaptive with no valid token in a step (NaN KL)",
            "beta unchanged",
            lambda: controller.update(NAN, n_steps=8),
            0.04,
        ),
        (
            "kl_control=diversity with Distinct-N undefined (NaN)",
            "beta unchanged",
            lambda: diversity.update(NAN, n_steps=8),
            0.04,
        ),
        (
            "AEPO samples with equal rewards",
            "none reinforced",
            lambda: int(aepo_pick(aepo_candidates(torch.ones(4), 4, adv_threshold=0.05), 60).sum()),
            0,
        ),
        (
            "KL-Cov on a micro-batch without valid tokens",
            "no token selected, no penalty",
            lambda: bool(kl_cov_mask(nothing, torch.ones(2), nothing, ratio=0.5).any()),
            False,
        ),
        (
            "Clip-Cov with no token inside [clip_cov_lb, clip_cov_ub]",
            "no token selected",
            lambda: bool(clip_cov_mask(nothing, torch.ones(2), torch.ones(2, 3), ratio=0.5, lb=1.0, ub=5.0).any()),
            False,
        ),
        (
            "top_entropy_quantile on AEPO samples without valid tokens",
            "no token trains",
            lambda: bool(high_entropy_mask(torch.ones(2, 3), torch.zeros(2, 3), quantile=0.2).any()),
            False,
        ),
        (
            "a vLLM sampling log-prob that is NaN",
            "importance-sampling ratio 1 for that token (TRL's rule)",
            lambda: vllm_importance_sampling_ratio(
                torch.tensor([[-1.0]]),
                torch.tensor([[NAN]]),
                torch.ones(1, 1),
                mode="token_mask",
                clip_min=None,
                clip_max=3.0,
            ).item(),
            1.0,
        ),
        ("diversity metrics of an empty batch", "0.0", lambda: distinct_n_batch(empty, empty, 2), 0.0),
        ("self-BLEU of an empty batch", "0.0", lambda: self_bleu_batch(empty, empty, 4), 0.0),
        ("unique fraction of an empty batch", "0.0", lambda: unique_fraction(empty, empty, 4), 0.0),
        (
            "a completion shorter than the repetition n-gram",
            "repetition 0",
            lambda: repetition_rates(torch.tensor([[1, 2]]), torch.ones(1, 2, dtype=torch.long), 3).tolist(),
            [0.0],
        ),
        (
            "a completion with no parsable answer",
            "math reward 0.0",
            lambda: math_accuracy_reward(["no answer here"], solution=["3"]),
            [0.0],
        ),
        (
            "a reference answer that is None or empty",
            "math reward None (unscorable, advantage 0)",
            lambda: math_accuracy_reward(["\\boxed{3}", "\\boxed{3}"], solution=[None, ""]),
            [None, None],
        ),
    ]


FALLBACK_NAMES = [row[0] for row in _fallbacks()]


@pytest.mark.parametrize("index", range(len(FALLBACK_NAMES)), ids=FALLBACK_NAMES)
def test_documented_fallback_value(index):
    _, _, value, expected = _fallbacks()[index]
    assert value() == expected


# ------------------------------------------------------------------ the catalogue behind docs/reliability.md
def catalogue():
    """(group, clear errors, documented fallbacks, test names) for every table-driven bad-input case in the suite."""
    from test_reliability import DAMAGED_FAMILY_STATE, DAMAGED_STATE, DAMAGED_TRAINER_STATE

    here, reliability = "test_bad_inputs.py", "test_reliability.py"
    return [
        ("config values and combinations", len(CONFIG_ERRORS), 0, here, ["test_bad_config_value_is_a_clear_error"]),
        (
            "trainer arguments, dataset size",
            len(TRAINER_ERRORS) + 3,
            0,
            here,
            [
                "test_bad_trainer_arguments_are_named",
                "test_dataset_smaller_than_one_generation_batch_is_an_error",
                "test_step_reward_source_given_by_name_is_named",
            ],
        ),
        (
            "outcome and step reward outputs",
            len(REWARD_ERRORS) + len(REWARD_OUTPUT_ERRORS) + len(STEP_ERRORS),
            3 + 6,
            here,
            [
                "test_reward_that_would_overflow_the_group_statistics_is_refused",
                "test_malformed_reward_output_is_named",
                "test_reward_outputs_trl_accepts_pass_unchanged",
                "test_bad_step_reward_output_is_named",
                "test_step_scores_as_generators_tensors_and_numpy_are_accepted",
            ],
        ),
        (
            "changed after construction",
            len(LATE_CHANGES),
            0,
            here,
            ["test_a_field_changed_after_construction_gets_the_same_error"],
        ),
        (
            "prompts and reward functions",
            len(PROMPT_ERRORS) + 1 + len(_math_calls()),
            0,
            here,
            [
                "test_bad_prompts_are_named_with_their_row",
                "test_an_async_reward_that_raises_is_named",
                "test_math_reward_inputs_are_named",
            ],
        ),
        (
            "diversity metric arguments",
            len(_diversity_calls()),
            0,
            here,
            ["test_diversity_metric_bad_arguments_are_named"],
        ),
        (
            "dataset files",
            len(DATASET_ERRORS) + 2,
            0,
            here,
            ["test_bad_dataset_file_is_named", "test_missing_local_file_is_not_looked_up_on_the_hub"],
        ),
        (
            "PRM model folders",
            2,
            0,
            here,
            ["test_causal_lm_folder_as_token_classification_prm_is_refused", "test_missing_prm_folder_is_named"],
        ),
        (
            "checkpointed extension state",
            len(DAMAGED_STATE) + len(DAMAGED_FAMILY_STATE),
            0,
            reliability,
            [
                "test_damaged_extension_state_is_an_error_naming_the_file_and_key",
                "test_damaged_aepo_and_monitor_state_is_refused",
            ],
        ),
        (
            "damaged trainer_state.json (resume, plot)",
            len(DAMAGED_TRAINER_STATE) + 3,
            len(DAMAGED_TRAINER_STATE),
            reliability,
            ["test_a_damaged_trainer_state_is_skipped_or_named", "test_plot_names_a_damaged_trainer_state"],
        ),
        (
            "degenerate data (rewards, steps, batches, answers)",
            0,
            len(FALLBACK_NAMES),
            here,
            ["test_documented_fallback_value"],
        ),
    ]


def summary_table() -> str:
    """The counts block of docs/reliability.md (``python tests/test_bad_inputs.py`` prints it)."""
    rows = catalogue()
    lines = ["| group | clear error | documented fallback | tests |", "|---|---|---|---|"]
    for group, errors, fallbacks, module, tests in rows:
        where = ", ".join([f"`{module}::{tests[0]}`", *(f"`::{name}`" for name in tests[1:])])
        lines.append(f"| {group} | {errors} | {fallbacks} | {where} |")
    errors, fallbacks = sum(r[1] for r in rows), sum(r[2] for r in rows)
    lines.append(f"| **total: {errors + fallbacks} cases** | **{errors}** | **{fallbacks}** | |")
    return "\n".join(lines)


def test_reliability_doc_counts_match_the_suite():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "reliability.md").read_text()
    block = text[
        text.index("<!-- bad-input-counts -->") + len("<!-- bad-input-counts -->") : text.index(
            "<!-- /bad-input-counts -->"
        )
    ]
    assert block.strip() == summary_table(), "regenerate with: python tests/test_bad_inputs.py"
    assert fallback_table() in text
    # every test the catalogue names exists in its module: a count never refers to a renamed or deleted test
    import importlib

    for _group, _errors, _fallbacks, module, tests in catalogue():
        loaded = importlib.import_module(module.removesuffix(".py"))
        assert all(callable(getattr(loaded, name, None)) for name in tests), (module, tests)


FALLBACK_TABLE_HEADER = "| input | what happens |"


def fallback_table() -> str:
    lines = [FALLBACK_TABLE_HEADER, "|---|---|"]
    lines += [f"| {name} | {what} |" for name, what, _, _ in _fallbacks()]
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    print(summary_table())
    print()
    print(fallback_table())
