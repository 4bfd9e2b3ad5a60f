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


# ------------------------------------------------------------------ any thread, worker processes, time bounds
CASES = (
    ["\\boxed{42}", "\\boxed{\\frac{1}{2}}", "\\boxed{41}", "\\boxed{9**9**9**9}", "\\boxed{3}"],
    ["#### 42", "\\boxed{0.5}", "#### 42", "#### 42", "9**9**9**9"],
    [1.0, 1.0, 0.0, 0.0, None],  # right, right (another form), wrong, hostile (screened), unusable reference
)


def _score(workers):
    from trl_grpo_ext.rewards import set_math_reward_workers

    set_math_reward_workers(workers)
    try:
        return math_accuracy_reward(CASES[0], solution=CASES[1])
    finally:
        set_math_reward_workers(None)


@pytest.mark.parametrize("workers", [1, 2])
def test_math_reward_is_the_same_from_any_thread_and_process(workers):
    """Issue 15: from a worker thread math-verify's signal timeouts failed and every answer scored 0.0, silently."""
    import asyncio
    import concurrent.futures
    import multiprocessing
    import threading

    expected = CASES[2]
    assert _score(workers) == expected  # main thread
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("scores", _score(workers)))
    thread.start()
    thread.join(timeout=120)
    assert out["scores"] == expected  # a plain worker thread
    assert asyncio.run(asyncio.to_thread(_score, workers)) == expected  # an async reward wrapper
    if workers == 1:  # called in a worker process's main thread: the serial path, its own timeouts work
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as executor:
            assert executor.submit(_score, workers).result(timeout=120) == expected


def test_math_reward_pool_bounds_each_answer_and_each_batch():
    from trl_grpo_ext.rewards.math import math_accuracy
    from trl_grpo_ext.rewards.pool import ScorerPool

    pool = ScorerPool(2, math_accuracy)
    try:
        # Each takes about 2 s in sympy (math-verify's own limit) and passes the screen.
        slow = [
            ("\\boxed{1000000!}", "3"),
            ("\\boxed{\\binom{999999}{499999}}", "2"),
            ("\\boxed{\\sum_{n=1}^{999} n^{999}}", "5"),
            ("\\boxed{(x+1)^{999}}", "x^{999}+1"),
        ]
        ordinary = [("\\boxed{7}", "7"), ("\\boxed{8}", "7")]
        assert pool.score(ordinary) == [1.0, 0.0]
        start = time.perf_counter()
        scores = pool.score(slow, answer_timeout=0.05)
        assert scores == [0.0] * len(slow) and pool.timeouts == len(slow)
        assert time.perf_counter() - start < 6  # 4 x 2 s = 8 s unbounded; slack for a loaded machine
        pool.timeouts = 0
        start = time.perf_counter()
        scores = pool.score(slow * 4, answer_timeout=30, batch_budget=0.2)
        assert time.perf_counter() - start < 5  # the batch returns at its budget, not when sympy finishes
        assert scores == [0.0] * len(slow) * 4 and pool.timeouts == len(slow) * 4
        assert pool.score(ordinary) == [1.0, 0.0]  # a fresh pool after the stuck one was replaced
    finally:
        pool.close()


def test_batch_budget_scales_with_the_batch(monkeypatch):
    """The default budget: 0.2 s per answer and worker, within [2 s, 60 s]; a batch of slow answers returns at it."""
    from trl_grpo_ext.rewards import pool as pool_module
    from trl_grpo_ext.rewards.math import math_accuracy

    budget = pool_module.batch_budget_seconds
    assert (budget(64, 2), budget(4, 2), budget(4096, 2), budget(1024, 16)) == (6.4, 2.0, 60.0, 12.8)
    monkeypatch.setattr(pool_module, "BATCH_SECONDS_PER_ANSWER", 0.05)
    monkeypatch.setattr(pool_module, "BATCH_MIN_SECONDS", 0.1)
    pool = pool_module.ScorerPool(2, math_accuracy)
    try:
        assert pool.score([("\\boxed{7}", "7")], batch_budget=60) == [1.0]  # start the workers
        slow = [("\\boxed{1000000!}", "3"), ("\\boxed{(x+1)^{999}}", "x^{999}+1")] * 8
        start = time.perf_counter()
        assert pool.score(slow, answer_timeout=30) == [0.0] * 16  # budget 16 x 0.05 / 2 = 0.4 s
        assert time.perf_counter() - start < 5 and pool.timeouts == 16
    finally:
        pool.close()


def test_serial_math_reward_has_the_batch_budget_too(monkeypatch):
    """workers=1 in the main thread: answers left when the batch budget runs out score 0.0 and are counted."""
    from trl_grpo_ext.rewards import pool, set_math_reward_workers

    completions, solutions = ["\\boxed{7}", "\\boxed{8}"] * 3, ["#### 7"] * 6
    set_math_reward_workers(1)
    try:
        assert math_accuracy_reward(completions, solution=solutions) == [1.0, 0.0] * 3
        monkeypatch.setattr(pool, "BATCH_MIN_SECONDS", 0.0)
        monkeypatch.setattr(pool, "BATCH_SECONDS_PER_ANSWER", 0.0)
        before = pool.timeouts_total()
        assert math_accuracy_reward(completions, solution=solutions) == [0.0] * 6
        assert pool.timeouts_total() - before == 6
    finally:
        set_math_reward_workers(None)


def test_math_reward_workers_are_validated():
    from trl_grpo_ext.rewards import set_math_reward_workers
    from trl_grpo_ext.rewards.math import math_accuracy
    from trl_grpo_ext.rewards.pool import ScorerPool

    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="workers"):
            set_math_reward_workers(bad)
        with pytest.raises(ValueError, match="workers"):
            ScorerPool(bad, math_accuracy)


def test_reward_timeouts_are_logged_by_the_trainer(make_trainer, monkeypatch):
    from conftest import last_logs

    from trl_grpo_ext.rewards import pool, set_math_reward_workers

    monkeypatch.setattr(pool, "ANSWER_TIMEOUT_SECONDS", 1e-6)  # every answer hits the bound
    set_math_reward_workers(2)
    try:
        trainer = make_trainer(max_steps=2, reward_funcs=[math_accuracy_reward])
        trainer.train()
    finally:
        set_math_reward_workers(None)
    logs = last_logs(trainer)
    assert [h["rewards/timeouts"] for h in logs] == [8.0, 8.0]  # 8 completions per step, all stopped
    assert all(h["rewards/math_accuracy_reward/mean"] == 0.0 for h in logs)
