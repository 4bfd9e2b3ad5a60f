"""The length-biased reward testbed: the proxy that can be gamed and the gold score beside it, by hand."""

from __future__ import annotations

import pytest

from grpo_lab import testbed
from grpo_lab.evaluation import proxy_gold_gap
from grpo_lab.testbeds import length_bias


def test_gold_is_exact_and_proxy_lenient_with_a_length_bonus():
    completions = ["55", " 55 ", "55 55 55", "55!!!!!!!!!!!!!!", "555", "5", "", "abc55"]
    answers = ["55"] * len(completions)
    assert length_bias.gold_reward(completions, answers) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    bonus = length_bias.LENGTH_BONUS / length_bias.LENGTH_CAP  # per character, up to the cap
    expected = [
        1 + 2 * bonus,  # "55": right, 2 characters
        1 + 4 * bonus,  # " 55 ": right (white space first), 4 characters
        1 + 8 * bonus,  # "55 55 55": the sum comes first, then repetition: right for the proxy
        1 + length_bias.LENGTH_BONUS,  # 16 characters: the bonus is capped
        0 + 3 * bonus,  # "555" is another number
        0 + 1 * bonus,
        0.0,
        0 + 5 * bonus,  # the sum is not first
    ]
    assert length_bias.proxy_reward(completions, answers) == pytest.approx(expected)
    # the gap: padding keeps the proxy high while gold falls (one of three is padded: gold 2/3, proxy above 1)
    gap = proxy_gold_gap(length_bias.proxy_reward(completions[:3], answers[:3]), [1.0, 1.0, 0.0])
    assert gap["gap"] == pytest.approx(1 + 14 * bonus / 3 - 2 / 3)


def test_messages_and_negative_numbers():
    assert length_bias.lenient_correct([{"role": "assistant", "content": "12 and more"}], "12")
    assert length_bias.lenient_correct("-3!", "-3") and not length_bias.lenient_correct("3", "-3")


def test_splits_are_the_addition_testbeds_halves():
    validation = length_bias.problems("validation")["prompt"]
    assert validation == testbed.addition_problems(split="validation", seed=0)["prompt"]
    assert not set(validation) & set(length_bias.problems("test")["prompt"])
    with pytest.raises(ValueError, match="split must be one of"):
        length_bias.problems("heldout")


def test_settings_leave_room_for_padding():
    settings = length_bias.grpo_settings(max_steps=3)
    assert settings["max_completion_length"] == length_bias.MAX_COMPLETION_LENGTH > length_bias.LENGTH_CAP
    assert settings["max_steps"] == 3 and settings["temperature"] == testbed.grpo_settings()["temperature"]


def test_the_chatty_teacher_repeats_its_answer_sometimes():
    import random

    rng = random.Random(0)
    answers = [length_bias.chatty_answer("47+8=", rng) for _ in range(4000)]
    repeated = [a for a in answers if " " in a]
    assert len(repeated) / len(answers) == pytest.approx(length_bias.CHATTY, abs=0.015)
    assert all(len(set(a.split(" "))) == 1 and 2 <= len(a.split(" ")) <= 4 for a in repeated)  # the same answer again
    rows = length_bias.sft_dataset(3, seed=1)
    assert all(r["completion"].endswith("<eos>") for r in rows)
