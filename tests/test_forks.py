"""The forks testbed (many right answers): its verifier, solution counts, splits and teacher, checked by hand."""

from __future__ import annotations

import collections
import math
import random

import pytest

from grpo_lab.testbeds import forks


def test_parse_and_write():
    assert forks.parse_prompt("35241628 3:") == ([3, 5, 2, 4, 1, 6, 2, 8], 3)
    assert forks.expression([3, 5, 2], (1, -1)) == "3+5-2"


def test_solutions_by_hand():
    # three minus signs among seven places: C(7, 3) = 35 right answers, each with exactly three "-"
    right = forks.solutions("35241628 3:")
    assert len(right) == 35 == len(set(right))
    assert all(s.count("-") == 3 and s.replace("+", "").replace("-", "") == "35241628" for s in right)
    assert forks.solutions("11111111 0:") == ("1+1+1+1+1+1+1+1",)
    assert forks.solutions("12345678 7:") == ("1-2-3-4-5-6-7-8",)
    assert [len(forks.solutions(f"12345678 {k}:")) for k in range(8)] == [math.comb(7, k) for k in range(8)]


def test_gold_reward_accepts_any_right_answer_and_nothing_else():
    prompt = "35241628 3:"
    completions = [
        "3-5-2-4+1+6+2+8",  # right
        " 3+5+2+4+1-6-2-8 ",  # right, white space around it
        "3-5-2+4+1+6+2+8",  # two minus signs: wrong
        "3-5-2-4+1+6+2+9",  # a digit changed: wrong
        "3-5-2-4+1+6+2",  # a digit missing: wrong
        "",
    ]
    assert forks.gold_reward([prompt] * 6, completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert forks.gold([prompt], [[{"role": "assistant", "content": "3-5-2-4+1+6+2+8"}]]) == [True]  # messages


def test_pool_and_splits_are_fixed():
    pool = forks.pool()
    assert len(pool) == forks.POOL_SIZE == len(set(pool))
    assert pool[:2] == ("17117832 1:", "53917777 5:")  # the same on every machine (seeded, hash-split)
    counts = collections.Counter(forks.split_of(p) for p in pool)
    assert counts["train"] > 4 * (counts["validation"] + counts["test"]) * 0.9
    assert abs(counts["validation"] - counts["test"]) < 0.15 * counts["test"]
    validation = forks.problems(split="validation")["prompt"]
    test = forks.problems(split="test")["prompt"]
    train = set(forks.problems(2000, split="train", seed=0)["prompt"])
    assert not (set(validation) & set(test)) and not (train & (set(validation) | set(test)))
    assert forks.problems(5, split="test", seed=0)["prompt"] == forks.problems(5, split="test", seed=0)["prompt"]
    row = forks.problems(1, split="train", seed=3)[0]
    assert forks.is_right(row["prompt"], row["answer"])
    with pytest.raises(ValueError, match="split must be one of"):
        forks.problems(1, split="heldout")


def test_teacher_is_right_about_half_the_time_with_many_patterns():
    rng = random.Random(0)
    prompt = "35241628 3:"
    answers = [forks.teacher_completion(prompt, rng) for _ in range(4000)]
    right = sum(forks.is_right(prompt, a) for a in answers) / len(answers)
    # right answers: TEACHER_RIGHT, plus a uniformly random pattern that happens to be right (35 / 128 of the rest)
    expected = forks.TEACHER_RIGHT + (1 - forks.TEACHER_RIGHT) * 35 / 128
    assert right == pytest.approx(expected, abs=0.03)
    assert len({a for a in answers if forks.is_right(prompt, a)}) == 35  # every right pattern appears
    rows = forks.sft_dataset(3, seed=1)
    assert all(r["completion"].endswith("<eos>") for r in rows)


def test_grpo_settings_fit_the_completions():
    settings = forks.grpo_settings(max_steps=5)
    assert settings["max_steps"] == 5
    assert settings["max_completion_length"] >= len("3+5-2+4-1+6+2-8") + 1
