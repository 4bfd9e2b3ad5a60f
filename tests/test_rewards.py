import os
import subprocess
import sys

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
    reward = math_accuracy_reward([HOSTILE[name]], solution=["#### 42"])  # bounded: the per-answer timer (tested below)
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
    from grpo_lab import offline

    assert boxed_format_reward(["work... \\boxed{3}", "no box", "\\boxed{1} \\boxed{2}"]) == [1.0, 0.0, 0.0]
    assert {"math_accuracy", "boxed_format"} <= set(REWARD_FUNCS.names())
    offline.register()
    offline.register()  # again: a no-op
    assert {"final_answer", "length_proxy", "tolerant_audit"} <= set(REWARD_FUNCS.names())


def test_the_library_alone_names_its_own_rewards_and_points_to_the_lab():
    """Without the lab the registries hold the library's math rewards, and the lab's offline dataset is refused with
    the way to it (a fresh interpreter: this session may have registered the lab already)."""
    import subprocess
    import sys

    code = (
        "from trl_grpo_ext.rewards import REWARD_FUNCS\n"
        "from trl_grpo_ext.data import load_math_dataset\n"
        "print(sorted(REWARD_FUNCS.names()))\n"
        "try:\n    load_math_dataset('synthetic')\nexcept ValueError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0] == "['boxed_format', 'math_accuracy']"
    assert "grpo_lab.offline.register()" in out


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


def _score_in_child(workers, conn):
    conn.send(_score(workers))
    conn.close()


@pytest.mark.slow  # starts fork, spawn and forkserver pools: about 40 s
@pytest.mark.parametrize("workers", [1, 2])
def test_math_reward_is_the_same_from_any_thread_and_process(workers):
    """Issue 15: from a worker thread math-verify's signal timeouts failed and every answer scored 0.0, silently.
    Issue 26: inside a daemonic ``fork`` pool worker the pool could not start ("daemonic processes are not allowed to
    have children"), and in an ``os.fork()`` child it raised while the parent's next call hung."""
    import asyncio
    import concurrent.futures
    import multiprocessing
    import threading

    expected = CASES[2]
    assert _score(workers) == expected  # main thread (with workers=2 the pool starts here, before the forks below)
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("scores", _score(workers)))
    thread.start()
    thread.join(timeout=120)
    assert out["scores"] == expected  # a plain worker thread
    assert asyncio.run(asyncio.to_thread(_score, workers)) == expected  # an async reward wrapper
    for method in ("fork", "spawn", "forkserver"):  # inside a (daemonic) pool worker of every start method
        context = multiprocessing.get_context(method)
        with context.Pool(1) as pool:
            assert pool.apply_async(_score, (workers,)).get(timeout=120) == expected, method
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as executor:
            assert executor.submit(_score, workers).result(timeout=120) == expected, method
    read, write = multiprocessing.Pipe(duplex=False)
    pid = os.fork()  # a bare os.fork() child scores, then the parent scores again
    if pid == 0:
        try:
            _score_in_child(workers, write)
        finally:
            os._exit(0)
    assert read.poll(120) and read.recv() == expected
    os.waitpid(pid, 0)
    assert _score(workers) == expected


def test_a_script_without_a_main_guard_scores_at_once(tmp_path):
    """Issue 26: a top-level script (no ``if __name__ == "__main__":``) scoring 1,024 completions stalled ~300 s and
    then scored right answers 0.0, because spawned workers re-imported it. Workers never import the caller's script."""
    script = tmp_path / "quick.py"
    script.write_text(
        "from trl_grpo_ext.rewards import math_accuracy_reward, set_math_reward_workers\n"
        "set_math_reward_workers(2)\n"
        "completions = [f'so \\\\boxed{{{i % 50}}}' for i in range(1024)]\n"
        "scores = math_accuracy_reward(completions, solution=[f'#### {i % 50}' for i in range(1024)])\n"
        "print('SCORES', sum(s == 1.0 for s in scores), len(scores))\n"
        "open('side_effect', 'a').write('x')\n"  # the script's own top-level work, done once
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SCORES 1024 1024" in proc.stdout
    assert (tmp_path / "side_effect").read_text() == "x"  # no worker re-ran the script


def test_workers_import_neither_torch_nor_the_callers_packages():
    """A worker is a fresh interpreter with the scorer's imports only (math-verify, sympy): it starts in about a
    second and costs little memory, where a spawned child of a training script imported torch and transformers."""
    from trl_grpo_ext.rewards.pool import _Worker

    worker = _Worker("scorers:exact")
    try:
        ready = None
        while ready is None:
            ready = worker.read_lines()
        worker.send({"pairs": [["a", "a"], ["a", "b"]], "timeout": 1.0})
        answer = []
        while not answer:
            answer = worker.read_lines()
        assert answer[0]["scores"] == [[1.0, False], [0.0, False]]
        modules = subprocess.run(
            ["cat", f"/proc/{worker.process.pid}/maps"], capture_output=True, text=True, check=False
        ).stdout
        assert "torch" not in modules and "transformers" not in modules
    finally:
        worker.kill()


def test_math_reward_pool_bounds_each_answer_and_each_batch():
    from trl_grpo_ext.rewards.math import math_accuracy
    from trl_grpo_ext.rewards.pool import ScorerPool

    pool = ScorerPool(2, math_accuracy)
    try:
        # Each takes seconds in sympy and passes the screen: only the bounds stop them (counted as timeouts).
        slow = [
            ("\\boxed{1000000!}", "3"),
            ("\\boxed{\\binom{999999}{499999}}", "2"),
            ("\\boxed{\\sum_{n=1}^{999} n^{999}}", "5"),
            ("\\boxed{(x+1)^{999}}", "x^{999}+1"),
        ]
        ordinary = [("\\boxed{7}", "7"), ("\\boxed{8}", "7")]
        # the plain answers under bounds no load reaches (a busy machine must not turn them into timeouts)
        assert pool.score(ordinary, answer_timeout=600, batch_budget=600) == [1.0, 0.0]
        assert pool.score(slow, answer_timeout=0.05) == [0.0] * len(slow) and pool.timeouts == len(slow)
        pool.timeouts = 0
        scores = pool.score(slow * 4, answer_timeout=30, batch_budget=0.2)  # the batch returns at its budget
        assert scores == [0.0] * len(slow) * 4 and pool.timeouts == len(slow) * 4
        assert pool.replaced == 2  # the two stuck workers were killed ...
        assert pool.score(ordinary) == [1.0, 0.0]  # ... and replaced
    finally:
        pool.close()


def test_a_worker_that_dies_is_replaced_and_only_its_killer_scores_zero():
    import scorers

    from trl_grpo_ext.rewards.pool import ScorerPool

    pool = ScorerPool(2, scorers.dies_on_poison)
    try:
        pairs = [(str(i), str(i if i % 3 else -1)) for i in range(10)]
        pairs.insert(4, ("poison", "poison"))
        scores = pool.score(pairs, batch_budget=60)
        expected = [1.0 if c == g else 0.0 for c, g in pairs]
        expected[4] = 0.0  # the answer that killed its worker (twice): 0.0 alone
        assert scores == expected
        assert pool.replaced >= 2
        assert pool.score([("a", "a")]) == [1.0]  # the pool goes on
    finally:
        pool.close()


def test_no_process_can_start_scores_in_the_calling_thread(monkeypatch, caplog):
    import scorers

    from trl_grpo_ext.rewards import pool as pool_module

    def refuse(*args, **kwargs):
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(pool_module.subprocess, "Popen", refuse)
    pool = pool_module.ScorerPool(2, scorers.exact)
    with caplog.at_level("WARNING"):
        assert pool.score([("a", "a"), ("a", "b")]) == [1.0, 0.0]
        assert pool.score([("b", "b")]) == [1.0]
    assert sum("scoring in the calling thread" in r.message for r in caplog.records) == 1  # one warning


def test_batch_budget_scales_with_the_batch(monkeypatch):
    """The default budget: 0.2 s per answer and worker, within [2 s, 60 s]; a batch of slow answers returns at it."""
    import scorers

    from trl_grpo_ext.rewards import pool as pool_module

    budget = pool_module.batch_budget_seconds
    assert (budget(64, 2), budget(4, 2), budget(4096, 2), budget(1024, 16)) == (6.4, 2.0, 60.0, 12.8)
    monkeypatch.setattr(pool_module, "BATCH_SECONDS_PER_ANSWER", 0.05)
    monkeypatch.setattr(pool_module, "BATCH_MIN_SECONDS", 0.1)
    pool = pool_module.ScorerPool(2, scorers.sleeps)
    try:
        assert pool.score([("a", "b")] * 16, answer_timeout=30) == [0.0] * 16  # budget 16 x 0.05 / 2 = 0.4 s
        assert pool.timeouts == 16
    finally:
        pool.close()


def test_serial_math_reward_bounds_each_answer_and_the_batch(monkeypatch):
    """workers=1 in the main thread: each answer under the same interval timer as a worker's (a hostile answer took
    2 s, math-verify's own limit, twice), and answers left when the batch budget runs out score 0.0."""
    from trl_grpo_ext.rewards import pool, set_math_reward_workers

    completions, solutions = ["\\boxed{7}", "\\boxed{8}"] * 3, ["#### 7"] * 6
    set_math_reward_workers(1)
    try:
        # budgets no load can exhaust for the plain answers (a busy machine once ran out of the default batch budget)
        monkeypatch.setattr(pool, "BATCH_MIN_SECONDS", 600.0)
        monkeypatch.setattr(pool, "ANSWER_TIMEOUT_SECONDS", 600.0)
        assert math_accuracy_reward(completions, solution=solutions) == [1.0, 0.0] * 3
        monkeypatch.setattr(pool, "ANSWER_TIMEOUT_SECONDS", 0.01)
        before = pool.timeouts_total()
        assert math_accuracy_reward(["\\boxed{1000000!}"], solution=["#### 3"]) == [0.0]
        assert pool.timeouts_total() - before == 1  # stopped by the per-answer timer, not by math-verify's 2 s
        monkeypatch.setattr(pool, "BATCH_MIN_SECONDS", 0.0)
        monkeypatch.setattr(pool, "BATCH_SECONDS_PER_ANSWER", 0.0)
        before = pool.timeouts_total()
        assert math_accuracy_reward(completions, solution=solutions) == [0.0] * 6
        assert pool.timeouts_total() - before == 6
    finally:
        set_math_reward_workers(None)


def test_math_reward_workers_are_validated(monkeypatch):
    from trl_grpo_ext.rewards import set_math_reward_workers
    from trl_grpo_ext.rewards.math import math_accuracy, math_reward_workers
    from trl_grpo_ext.rewards.pool import MAX_WORKERS, ScorerPool, max_workers

    for bad in (0, -1, 1.5, True, "2", 10**6, max_workers() + 1):
        with pytest.raises(ValueError, match="workers"):
            set_math_reward_workers(bad)
        with pytest.raises(ValueError, match="workers"):
            ScorerPool(bad, math_accuracy)
    with pytest.raises(ValueError, match=f"at most {max_workers()} here .*MAX_WORKERS={MAX_WORKERS}"):
        set_math_reward_workers(max_workers() + 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "abc")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='abc' is not an integer"):
        math_reward_workers()
    with pytest.raises(ValueError, match="module-level function"):
        ScorerPool(1, lambda c, g, timeout_seconds=None: 1.0)


def test_math_reward_inputs_are_named():
    with pytest.raises(TypeError, match="completion 0 is int 42"):
        math_accuracy_reward([42], solution=["#### 42"])
    with pytest.raises(ValueError, match="2 completions but 1 references"):
        math_accuracy_reward(["a", "b"], solution=["#### 1"])


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
