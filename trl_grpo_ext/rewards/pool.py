"""Math answers scored in worker processes: correct from any thread, parallel, and bounded in time.

math-verify bounds its parsing with ``signal.alarm``, which only works in a process's main thread: called from a worker
thread (a thread pool, ``asyncio.to_thread``, an async reward wrapper) it used to fail on every answer, and the reward
silently scored correct answers 0.0. Here every score is computed in the main thread of a worker process, so the
bounds hold wherever the reward is called from:

- **per answer**: an interval timer in the worker stops one answer after ``answer_timeout`` seconds (score 0.0, counted
  as a timeout);
- **per batch**: the caller waits at most ``batch_budget`` seconds; answers not scored by then score 0.0 (timeouts) and
  the pool is replaced (a worker stuck in C code cannot block training).

The pool is persistent (started on first use with the ``spawn`` method, safe with CUDA; ``fork`` when the main
program is not a re-importable file; as with any spawned worker, a script must keep its top-level work under
``if __name__ == "__main__":``, as the recipes do), keeps the order of the batch
and the ``None`` of unusable references, and is rebuilt after a worker crash. Nothing from a completion is executed:
workers only run the screen and math-verify, as the serial path does.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

logger = logging.getLogger(__name__)

#: Seconds one answer may take in a worker (ordinary answers: about 10 ms; hostile ones up to 3 s unbounded).
ANSWER_TIMEOUT_SECONDS = 1.0
#: A batch's time budget: ``BATCH_SECONDS_PER_ANSWER`` x answers / workers, at least ``BATCH_MIN_SECONDS`` and at
#: most ``BATCH_BUDGET_SECONDS``; answers still unscored at its end score 0.0 (and the pool restarts). Ordinary answers
#: take 10-40 ms and right answers in an odd form up to about 0.2 s, so an ordinary batch never reaches it, while a
#: batch of answers that each run into the per-answer bound returns after about 0.2 s per answer and worker.
BATCH_SECONDS_PER_ANSWER = 0.2
BATCH_MIN_SECONDS = 2.0
BATCH_BUDGET_SECONDS = 60.0


def batch_budget_seconds(answers: int, workers: int) -> float:
    """Seconds a batch of ``answers`` scored by ``workers`` processes may take (module constants read at call time)."""
    return min(BATCH_BUDGET_SECONDS, max(BATCH_MIN_SECONDS, answers * BATCH_SECONDS_PER_ANSWER / workers))


class _AnswerTimeout(BaseException):  # not an Exception: a scorer's own fallback (math_accuracy's) must not catch it
    pass


def _on_alarm(signum, frame):
    raise _AnswerTimeout


#: Seconds a new pool may take to start its workers and import their scorer's dependencies (sympy, math-verify).
STARTUP_TIMEOUT_SECONDS = 300.0


def _worker_init(score_fn, ready) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    try:  # import the scorer's dependencies now, so that no batch's budget pays for them
        score_fn("\\boxed{1}", "1", timeout_seconds=None)
    except Exception:  # a scorer that refuses this call is warmed by its first batch instead
        pass
    finally:
        ready.release()


def _score_chunk(score_fn, pairs: list[tuple[str, str]], answer_timeout: float) -> list[tuple[float | None, bool]]:
    """In a worker's main thread: (score, timed out) per (completion, gold)."""
    out = []
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        for completion, gold in pairs:
            # The timer is armed and disarmed inside the try: a one-shot alarm firing at any point is caught here
            # (outside it, it would kill the worker). math-verify's own alarms would reset this timer, so they are off.
            try:
                signal.setitimer(signal.ITIMER_REAL, answer_timeout)
                score, timed_out = score_fn(completion, gold, timeout_seconds=None), False
                signal.setitimer(signal.ITIMER_REAL, 0)
            except _AnswerTimeout:
                score, timed_out = 0.0, True
            out.append((score, timed_out))
    finally:
        signal.signal(signal.SIGALRM, previous)
    return out


def _start_method() -> str:
    """``spawn`` (a fresh interpreter: safe with CUDA and threads), unless the main program is not a file it can
    re-import (code read from stdin), where only ``fork`` can start workers."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is not None and not os.path.exists(main_file) and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class ScorerPool:
    """A persistent pool of ``workers`` processes scoring (completion, gold) pairs with ``score_fn``.

    ``score_fn(completion, gold, *, timeout_seconds)`` must be a module-level function (workers import it by name);
    it is called with ``timeout_seconds=None``: the pool's timer bounds it. :func:`trl_grpo_ext.rewards.math.
    math_accuracy` is the one the math reward uses.
    """

    def __init__(self, workers: int, score_fn):
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"math reward workers={workers!r}: must be an integer >= 1 (e.g. the number of cores).")
        self.workers = workers
        self.score_fn = score_fn
        self._pool = None
        self._lock = threading.Lock()
        self.timeouts = 0  # answers scored 0.0 because a bound expired, since the pool was made

    def _get(self):
        with self._lock:
            if self._pool is None:
                context = multiprocessing.get_context(_start_method())
                ready = context.Semaphore(0)
                self._pool = context.Pool(self.workers, initializer=_worker_init, initargs=(self.score_fn, ready))
                deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
                for _ in range(self.workers):  # the batch budget starts once every worker is ready
                    if not ready.acquire(timeout=max(0.0, deadline - time.monotonic())):
                        logger.warning("Math reward workers not ready after %.0f s.", STARTUP_TIMEOUT_SECONDS)
                        break
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.terminate()
            pool.join()

    def score(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        answer_timeout: float | None = None,
        batch_budget: float | None = None,
    ) -> list[float | None]:
        """Scores in the order of ``pairs``; the bounds default to the module's ``ANSWER_TIMEOUT_SECONDS`` and
        :func:`batch_budget_seconds` (read at call time, so a user may change them)."""
        answer_timeout = ANSWER_TIMEOUT_SECONDS if answer_timeout is None else answer_timeout
        batch_budget = batch_budget_seconds(len(pairs), self.workers) if batch_budget is None else batch_budget
        if not pairs:
            return []
        pool = self._get()
        size = max(1, -(-len(pairs) // (4 * self.workers)))  # about 4 chunks per worker: balance vs. messages
        chunks = [list(pairs[i : i + size]) for i in range(0, len(pairs), size)]
        pending = [pool.apply_async(_score_chunk, (self.score_fn, chunk, answer_timeout)) for chunk in chunks]
        deadline = time.monotonic() + batch_budget
        scores: list[float | None] = []
        timeouts, broken = 0, False
        for chunk, result in zip(chunks, pending, strict=True):
            try:
                if broken:
                    raise multiprocessing.TimeoutError
                for score, timed_out in result.get(timeout=max(0.0, deadline - time.monotonic())):
                    scores.append(score)
                    timeouts += timed_out
            except multiprocessing.TimeoutError:
                broken = True
                scores.extend([0.0] * len(chunk))
                timeouts += len(chunk)
        if broken:  # a stuck or dead worker: start afresh next batch rather than wait for it
            logger.warning("Math reward batch over its %.0f s budget: the pool is restarted.", batch_budget)
            self.close()
        if timeouts:
            self.timeouts += timeouts
            record_timeouts(getattr(self.score_fn, "__name__", "score_fn"), timeouts, len(pairs))
        return scores


_POOLS: dict[tuple, ScorerPool] = {}
_POOLS_LOCK = threading.Lock()
_TIMEOUTS_TOTAL = 0


def record_timeouts(name: str, timeouts: int, answers: int) -> None:
    """Count ``timeouts`` answers of a batch of ``answers`` scored 0.0 by a time bound (``rewards/timeouts``)."""
    global _TIMEOUTS_TOTAL
    with _POOLS_LOCK:
        _TIMEOUTS_TOTAL += timeouts
    logger.warning("%s: %d of %d answers hit a time bound and scored 0.0.", name, timeouts, answers)


def timeouts_total() -> int:
    """Answers scored 0.0 by a time bound in this process so far (all pools); the trainer logs its increase per
    generation batch as ``rewards/timeouts``."""
    return _TIMEOUTS_TOTAL


def shared_pool(workers: int, score_fn) -> ScorerPool:
    """The process-wide pool of ``workers`` processes for ``score_fn`` (made on first use, closed at exit)."""
    key = (workers, getattr(score_fn, "__module__", ""), getattr(score_fn, "__qualname__", repr(score_fn)))
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = ScorerPool(workers, score_fn)
        return _POOLS[key]


@atexit.register
def _close_pools() -> None:
    for pool in list(_POOLS.values()):
        pool.close()
