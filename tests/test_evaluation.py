"""Reward-independent metrics (grpo_lab.evaluation): hand-computed values and properties."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from grpo_lab.evaluation import (
    SampledEvaluationCallback,
    distinct_correct,
    pass_at_k_curve,
    pass_at_k_ks,
    proxy_gold_gap,
    sampled_evaluation,
)


def test_pass_at_k_curve_by_hand():
    # n = 4 samples. Prompt A: 2 correct -> pass@1 = 2/4, pass@2 = 1 - C(2,2)/C(4,2) = 5/6, pass@4 = 1.
    # Prompt B: 0 correct -> 0 everywhere. The curve is the mean over the two prompts.
    curve = pass_at_k_curve([2, 0], 4)
    assert list(curve) == [1, 2, 4]
    assert curve[1] == pytest.approx(0.25)
    assert curve[2] == pytest.approx(5 / 12)
    assert curve[4] == pytest.approx(0.5)


def test_pass_at_k_is_the_probability_that_k_draws_without_replacement_hit():
    """Brute force: over every k-subset of the n samples, the fraction containing a correct one."""
    n = 6
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(samples, k))
            expected = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k_curve([c], n, [k])[k] == pytest.approx(expected)


def test_pass_at_k_ks():
    assert pass_at_k_ks(64) == [1, 2, 4, 8, 16, 32, 64]
    assert pass_at_k_ks(48) == [1, 2, 4, 8, 16, 32, 48]
    assert pass_at_k_ks(1) == [1]
    with pytest.raises(ValueError, match="n >= 1"):
        pass_at_k_ks(0)


def test_distinct_correct_by_hand():
    completions = [["1+2", " 1+2", "2+1", "3+0"], ["x", "y", "x", "z"]]
    correct = [[True, True, True, False], [False, False, False, False]]
    # prompt 0: "1+2" twice (white space stripped) and "2+1" -> 2 distinct; "3+0" is wrong. Prompt 1: none correct.
    assert distinct_correct(completions, correct) == [2, 0]
    # a normalisation that makes the order of the terms irrelevant counts "1+2" and "2+1" as one solution
    assert distinct_correct(completions, correct, normalise=lambda t: tuple(sorted(t.strip().split("+")))) == [1, 0]
    with pytest.raises(ValueError, match="prompt 0: 4 completions but 3"):
        distinct_correct(completions, [[True] * 3, [True] * 4])


def test_proxy_gold_gap_by_hand():
    assert proxy_gold_gap([1.0, 0.5, 1.5], [1.0, 0.0, 1.0]) == pytest.approx(
        {"proxy": 1.0, "gold": 2 / 3, "gap": 1 / 3}
    )
    with pytest.raises(ValueError, match="same, non-zero length"):
        proxy_gold_gap([1.0], [])


def _starts_with_digit(prompts, completions):
    return [c[:1].isdigit() for c in completions]


def test_sampled_evaluation_on_a_tiny_model(tiny_model_path, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    prompts = ["1+2=", "3+4=", "5+5="]
    state = torch.random.get_rng_state()
    result = sampled_evaluation(
        model,
        tokenizer,
        prompts,
        gold=_starts_with_digit,
        samples=16,
        max_new_tokens=4,
        proxy=lambda p, c: [float(len(x)) for x in c],
    )
    assert torch.equal(state, torch.random.get_rng_state())  # the global random state is left as it was
    curve = result["pass_at_k"]
    assert list(curve) == [1, 2, 4, 8, 16]
    assert all(0.0 <= v <= 1.0 for v in curve.values())
    assert all(a <= b + 1e-12 for a, b in zip(curve.values(), list(curve.values())[1:]))  # pass@k grows with k
    assert curve[1] == pytest.approx(result["gold"])  # pass@1 is the mean correctness of the samples
    assert len(result["distinct_correct_per_prompt"]) == 3
    assert all(0 <= d <= 16 for d in result["distinct_correct_per_prompt"])
    assert result["gap"] == pytest.approx(result["proxy"] - result["gold"])
    again = sampled_evaluation(model, tokenizer, prompts, gold=_starts_with_digit, samples=16, max_new_tokens=4)
    assert again["pass_at_k"] == curve  # seeded: the same samples


def test_sampled_evaluation_callback_keeps_results_at_its_steps(tiny_model_path, tokenizer):
    from transformers import AutoModelForCausalLM, TrainerControl, TrainerState

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    callback = SampledEvaluationCallback([2], tokenizer, ["1+2="], gold=_starts_with_digit, samples=4, max_new_tokens=3)
    state = TrainerState()
    for step in (1, 2, 3):
        state.global_step = step
        callback.on_step_end(None, state, TrainerControl(), model=model)
    assert list(callback.results) == [2] and math.isfinite(callback.results[2]["gold"])
