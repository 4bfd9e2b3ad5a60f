"""Speed of ``math_accuracy_reward`` on a GRPO-sized batch: serial vs. worker processes, ordinary and hostile answers.

    python benchmarks/math_reward_speed.py --completions 1024 --workers 1 2

Ordinary: about 500 characters of reasoning then a ``\\boxed{}`` answer (half right) against a ``\\frac`` reference.
Hostile: 64 completions that are slow for sympy yet pass the screen (``(x+1)^{999}``, ``\\binom{999999}{499999}``,
nested integrals, long sums). ``workers 1`` is the serial path in the main thread; ``N > 1`` a persistent pool
(timed after a warm-up call that starts it). Median of 3 repeats. "next batch": the ordinary batch again right after
the hostile one, which pays for the pool's restart if the hostile batch ran out of its budget; its accuracy is the
last column (0.5: every answer scored, half right). Last, the time of right answers written in another
form (``(x+1)^2`` against ``x^2+2x+1``, ...): what a lower per-answer bound would start to score 0.0.

    python benchmarks/math_reward_speed.py --startup     # pool start time and worker memory; a script without a guard

``--startup``: for each worker count, the time from a new pool to its first scored answer and the resident memory of
one worker (median of 3 pools); then a 10-line script with its work at the top level (no ``if __name__ ==
"__main__":``) that scores 1,024 ordinary completions with 2 workers, timed as a whole process, with its accuracy.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from diversity_speed import timed

from trl_grpo_ext.rewards import pool
from trl_grpo_ext.rewards.math import math_accuracy, math_accuracy_reward, set_math_reward_workers

HOSTILE = [
    "\\boxed{(x+1)^{999}}",
    "\\boxed{\\binom{999999}{499999}}",
    "\\boxed{\\int_0^1 x^{x^{x}} dx}",
    "\\boxed{\\sum_{n=1}^{999} n^{999}}",
    "\\boxed{" + "\\frac{1}{" * 14 + "2" + "}" * 14 + "}",
    "\\boxed{1000000!}",
]


# Right answers in another form: the slowest of them sets how low the per-answer bound may go without scoring
# correct answers 0.0.
EQUIVALENT = [
    ("\\boxed{(x+1)^2}", "\\boxed{x^2+2x+1}"),
    ("\\boxed{(a+b)^3}", "\\boxed{a^3+3a^2b+3ab^2+b^3}"),
    ("\\boxed{\\frac{x^2-1}{x-1}}", "\\boxed{x+1}"),
    ("\\boxed{2\\sqrt{2}+\\sqrt{8}}", "\\boxed{4\\sqrt{2}}"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\boxed{\\frac{\\sqrt{2}}{2}}"),
    ("\\boxed{\\cos^2 x + \\sin^2 x}", "\\boxed{1}"),
    ("\\boxed{\\tan(\\pi/4)+\\cot(\\pi/4)}", "\\boxed{2}"),
    ("\\boxed{\\log_2 8}", "\\boxed{3}"),
    ("\\boxed{[1, 3)}", "\\boxed{[1,3)}"),
    ("\\boxed{x = 2, 3}", "\\boxed{\\{2, 3\\}}"),
    ("\\boxed{\\sum_{k=1}^{10} k}", "\\boxed{55}"),
    ("\\boxed{e^{i\\pi}}", "\\boxed{-1}"),
]


def equivalent_answer_times() -> list[float]:
    """Seconds of one unbounded math_accuracy call per EQUIVALENT pair, in this process (after one warm-up call)."""
    math_accuracy(*EQUIVALENT[0], timeout_seconds=None)
    return [timed(lambda c=c, g=g: math_accuracy(c, g, timeout_seconds=None), 1) for c, g in EQUIVALENT]


def ordinary(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    completions, solutions = [], []
    for i in range(n):
        a, b = rng.randint(1, 9), rng.randint(2, 9)
        answer = f"\\frac{{{a}}}{{{b}}}" if i % 2 == 0 else f"\\frac{{{a + 1}}}{{{b}}}"
        completions.append("Let us think step by step. " * 19 + f"So the result is \\boxed{{{answer}}}.")
        solutions.append(f"The answer is $\\boxed{{\\frac{{{a}}}{{{b}}}}}$")
    return completions, solutions


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def startup(worker_counts) -> None:
    print(f"{'workers':>8} {'start s':>8} {'worker MiB':>11}")
    for workers in worker_counts:
        starts, memory = [], []
        for _ in range(3):
            scorer_pool = pool.ScorerPool(workers, math_accuracy)
            start = time.perf_counter()
            scorer_pool.score([("\\boxed{7}", "7")])
            starts.append(time.perf_counter() - start)
            memory.append(statistics.mean(rss_mib(w.process.pid) for w in scorer_pool._procs if w is not None))
            scorer_pool.close()
        print(f"{workers:>8} {statistics.median(starts):>8.2f} {statistics.median(memory):>11.0f}", flush=True)
    completions, solutions = ordinary(1024)
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "quick.py")
        with open(script, "w") as f:  # top-level work, no main guard: what spawned workers used to re-run
            f.write(
                "from trl_grpo_ext.rewards import math_accuracy_reward, set_math_reward_workers\n"
                "set_math_reward_workers(2)\n"
                f"scores = math_accuracy_reward({completions!r}, solution={solutions!r})\n"
                "print(sum(s or 0.0 for s in scores) / len(scores))\n"
            )
        start = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        out = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, check=True).stdout
        print(
            f"script without a main guard, 1,024 completions, 2 workers: {time.perf_counter() - start:.1f} s as a "
            f"whole process (interpreter and pool start included), accuracy {float(out):.3f} (half are right)"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--completions", type=int, default=1024)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--answer_timeout", type=float, default=None, help="per-answer bound of the pool (s)")
    parser.add_argument("--startup", action="store_true", help="pool start time, worker memory, a guard-less script")
    args = parser.parse_args()
    if args.startup:
        startup(args.workers)
        return
    if args.answer_timeout is not None:
        pool.ANSWER_TIMEOUT_SECONDS = args.answer_timeout
    completions, solutions = ordinary(args.completions)
    hostile = [HOSTILE[i % len(HOSTILE)] for i in range(64)]
    header = ("workers", "ordinary s", "hostile (64) s", "timeouts", "next batch s", "accuracy")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (8, 11, 15, 9, 13, 9), strict=True)))
    for workers in args.workers:
        set_math_reward_workers(workers)
        math_accuracy_reward(completions[:8], solution=solutions[:8])  # start the pool
        scores = []
        ordinary_s = timed(lambda s=scores: s.append(math_accuracy_reward(completions, solution=solutions)), 3)
        before = pool.timeouts_total()
        hostile_s = timed(lambda: math_accuracy_reward(hostile, solution=["#### 42"] * 64), 1)
        timeouts = pool.timeouts_total() - before
        after_s = timed(lambda s=scores: s.append(math_accuracy_reward(completions, solution=solutions)), 1)
        accuracy = sum(s or 0.0 for s in scores[-1]) / len(scores[-1])
        print(
            f"{workers:>8} {ordinary_s:>11.2f} {hostile_s:>15.2f} {timeouts!s:>9} {after_s:>13.2f} {accuracy:>9.3f}",
            flush=True,
        )
    times = sorted(equivalent_answer_times())
    print(
        f"right answers in another form ({len(times)}): median {times[len(times) // 2] * 1000:.0f} ms, slowest "
        f"{times[-1] * 1000:.0f} ms (the per-answer bound is {pool.ANSWER_TIMEOUT_SECONDS} s)"
    )


if __name__ == "__main__":
    main()
