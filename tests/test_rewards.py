import os
import time

import pytest

from trl_grpo_ext.rewards import REWARD_FUNCS, boxed_format_reward, math_accuracy_reward
from trl_grpo_ext.rewards.math import gold_answer, last_boxed, screen


@pytest.mark.parametrize(
    "completion, solution, expected",
    [
        ("so the total is \\boxed{42}", "#### 42", 1.0),
        ("\\boxed{\\frac{1}{2}}", "The answer is $\\boxed{0.5}$", 1.0),
        ("\\boxed{\\dfrac{3}{4}}", "\\boxed{\\frac34}", 1.0),
        ("It is 1,234 dollars. \\boxed{1234}", "#### 1,234", 1.0),
        ("\\boxed{2\\sqrt{2}}", "\\boxed{\\sqrt{8}}", 1.0),
        ("\\boxed{41}", "#### 42", 0.0),
        ("the answer is 7", "7", 1.0),
        ("", "7", 0.0),
    ],
)
def test_math_accuracy(completion, solution, expected):
    assert math_accuracy_reward([completion], solution=[solution]) == [expected]


def test_conversational_completion_and_unparsable_gold():
    assert math_accuracy_reward([[{"role": "assistant", "content": "\\boxed{3}"}]], answer=["3"]) == [1.0]
    assert math_accuracy_reward(["\\boxed{3}"], answer=["9**9**9**9"]) == [None]
    with pytest.raises(ValueError, match="'solution' or 'answer'"):
        math_accuracy_reward(["1"])


def test_gold_and_boxed_helpers():
    assert gold_answer("blah\n#### 1,000") == "1000"
    assert gold_answer("so $\\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{a} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{unclosed") is None


HOSTILE = {
    "power tower": "\\boxed{9**9**9**9}",
    "latex tower": "\\boxed{9^{9^{9^{9}}}}",
    "huge exponent": "\\boxed{2^{99999999}}",
    "1 MB string": "1" * 1_000_000,
    "1 MB of text then answer": "a" * 1_000_000 + "\\boxed{42}",
    "deep brackets": "(" * 5000 + "1" + ")" * 5000,
    "latex bomb": "\\boxed{" + "\\frac{1}{" * 2000 + "1" + "}" * 2001,
    "code injection": "__import__('os').system('touch INJECTED') \\boxed{exec('import os')}",
    "giant integer": "\\boxed{" + "9" * 5000 + "}",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_completion_is_bounded_and_executes_nothing(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    reward = math_accuracy_reward([HOSTILE[name]], solution=["#### 42"])
    elapsed = time.perf_counter() - start
    assert elapsed < 6.0, f"{name} took {elapsed:.1f}s"
    assert reward[0] in (0.0, 1.0)
    assert not os.path.exists(tmp_path / "INJECTED")
    assert boxed_format_reward([HOSTILE[name]])[0] in (0.0, 1.0)


def test_screen_reasons():
    assert screen("9**9**9") is not None and screen("2^{12345}") is not None
    assert screen("(" * 40) is not None and screen("1" * 200) is not None
    assert screen("\\frac{1}{2} + 3^2") is None


def test_long_text_answer_still_found():
    assert math_accuracy_reward(["a" * 1_000_000 + "\\boxed{42}"], solution=["#### 42"]) == [1.0]


def test_format_reward_and_registry():
    assert boxed_format_reward(["work... \\boxed{3}", "no box", "\\boxed{1} \\boxed{2}"]) == [1.0, 0.0, 0.0]
    assert {"math_accuracy", "boxed_format", "final_answer"} <= set(REWARD_FUNCS.names())
