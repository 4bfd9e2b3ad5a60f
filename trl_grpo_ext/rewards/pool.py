"""Math answers scored in worker processes: the same scores from any script, thread, notebook or process, bounded in
time, and never a stall or a poisoned caller.

math-verify bounds its parsing with ``signal.alarm``, which only works in a process's main thread. Every score is
computed in the main thread of a *scoring worker* (:mod:`trl_grpo_ext.rewards._worker`): a fresh interpreter started
with ``subprocess`` that imports only the scorer (math-verify and sympy: no torch, transformers or datasets, and never
the caller's main script, so a script without ``if __name__ == "__main__":``, a notebook, a thread, asyncio, a
``fork`` / ``spawn`` / ``forkserver`` pool worker and an ``os.fork()`` child all get the same scores). Bounds:

- **per answer**: an interval timer in the worker stops one answer after ``answer_timeout`` seconds (score 0.0,
  counted as a timeout);
- **per batch**: the caller waits at most ``batch_budget`` seconds (:func:`batch_budget_seconds`); answers not scored
  by then score 0.0 (timeouts) and the busy workers are killed and replaced (a worker stuck in C code cannot block
  training).

A worker that dies is replaced and its answers are sent again, one at a time if it dies twice: an answer that kills
its worker scores 0.0 alone, the rest of the batch is scored. Where no process can be started, scoring falls back to
the calling thread with one warning (bounded per answer in a main thread; only by the screen elsewhere). Workers are
capped at the cores this process may use and at :data:`MAX_WORKERS`. Nothing from a completion is executed: workers
only run the screen and math-verify.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from ._worker import score_chunk

logger = logging.getLogger(__name__)

#: Seconds one answer may take (ordinary answers: about 10 ms; hostile ones several seconds unbounded).
ANSWER_TIMEOUT_SECONDS = 1.0
#: A batch's time budget: ``BATCH_SECONDS_PER_ANSWER`` x answers / workers, at least ``BATCH_MIN_SECONDS`` and at
#: most ``BATCH_BUDGET_SECONDS``; answers still unscored at its end score 0.0. Ordinary answers take 10-40 ms and right
#: answers in an odd form up to about 0.2 s, so an ordinary batch never reaches it, while a batch of answers that each
#: run into the per-answer bound returns after about 0.2 s per answer and worker.
BATCH_SECONDS_PER_ANSWER = 0.2
BATCH_MIN_SECONDS = 2.0
BATCH_BUDGET_SECONDS = 60.0
#: Seconds new workers may take to start and import their scorer (about 1 s for math-verify here).
STARTUP_TIMEOUT_SECONDS = 120.0
#: The most scoring workers a pool may have (and never more than the cores this process may use).
MAX_WORKERS = 64


def batch_budget_seconds(answers: int, workers: int) -> float:
    """Seconds a batch of ``answers`` scored by ``workers`` processes may take (module constants read at call time)."""
    return min(BATCH_BUDGET_SECONDS, max(BATCH_MIN_SECONDS, answers * BATCH_SECONDS_PER_ANSWER / workers))


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def max_workers() -> int:
    """The most workers a pool may have here: the cores this process may use, at most :data:`MAX_WORKERS` (scoring is
    CPU-bound: more processes than cores only cost memory and start-up time)."""
    return min(MAX_WORKERS, default_workers())


def check_workers(workers, what: str = "math reward workers") -> int:
    """``workers`` if it is an integer in [1, :func:`max_workers`]; a ``ValueError`` naming the bound otherwise."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"{what}={workers!r}: must be an integer >= 1 (e.g. the number of cores).")
    if workers > max_workers():
        raise ValueError(
            f"{what}={workers}: at most {max_workers()} here (the {default_workers()} cores this process may use, "
            f"and never more than MAX_WORKERS={MAX_WORKERS}). Fix: use fewer workers; scoring is CPU-bound."
        )
    return workers


def _target(score_fn) -> str:
    """``"module:qualname"`` of a module-level function a worker can import by name."""
    module, name = getattr(score_fn, "__module__", None), getattr(score_fn, "__qualname__", "")
    if module in (None, "__main__") or "<" in name:
        raise ValueError(
            f"The scorer {score_fn!r} must be a module-level function of an importable module (workers import it by "
            "name and never re-import the caller's main script); move it into a module."
        )
    return f"{module}:{name}"


class _StartError(RuntimeError):
    pass


class _Worker:
    """One scoring process: requests on its stdin, JSON-line answers on a pipe of its own."""

    def __init__(self, target: str):
        read_fd, write_fd = os.pipe()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = [root, *sys.path]  # the scorer's module imports as it does here; the caller's script is never run
        code = f"import sys; sys.path[:0] = {path!r}; from trl_grpo_ext.rewards._worker import main; main()"
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code, target, str(write_fd)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                pass_fds=(write_fd,),
                close_fds=True,
            )
        finally:
            os.close(write_fd)
        self.fd = read_fd
        self.buffer = b""
        self.pid = os.getpid()  # the process that owns these pipes

    def send(self, message: dict) -> None:
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        self.process.stdin.flush()

    def read_lines(self) -> list[dict] | None:
        """The complete messages available now; None when the worker is gone (end of its pipe)."""
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            return None
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line]

    def kill(self) -> None:
        if self.pid != os.getpid():  # inherited through fork: the parent's worker, only our copies of its pipes go
            self.forget()
            return
        try:
            self.process.kill()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.forget()

    def forget(self) -> None:
        for close in (lambda: os.close(self.fd), self.process.stdin.close):
            try:
                close()
            except (OSError, ValueError):
                pass


class ScorerPool:
    """A persistent pool of ``workers`` processes scoring (completion, gold) pairs with ``score_fn``.

    ``score_fn(completion, gold, *, timeout_seconds)`` must be a module-level function (workers import it by name);
    it is called with ``timeout_seconds=None``: the pool's timer bounds it. :func:`trl_grpo_ext.rewards.math.
    math_accuracy` is the one the math reward uses.
    """

    def __init__(self, workers: int, score_fn):
        self.workers = check_workers(workers)
        self.score_fn = score_fn
        self.target = _target(score_fn)
        self._procs: list[_Worker | None] = [None] * self.workers
        self._lock = threading.RLock()
        self._serial = False  # no process could be started here: score in the calling thread
        self.timeouts = 0  # answers scored 0.0 because a bound expired, since the pool was made
        self.replaced = 0  # workers that died (or were killed at a batch's budget) and were started again

    # ------------------------------------------------------------------ workers
    def _start(self, slots: list[int]) -> None:
        """Start the workers of ``slots`` together and wait until each has imported its scorer."""
        started = {}
        try:
            for slot in slots:
                started[slot] = _Worker(self.target)
        except OSError as error:
            for worker in started.values():
                worker.kill()
            raise _StartError(f"cannot start a scoring process ({error})") from error
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        waiting = dict(started)
        while waiting:
            ready, _, _ = select.select([w.fd for w in waiting.values()], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                for worker in started.values():
                    worker.kill()
                raise _StartError(f"scoring processes not ready after {STARTUP_TIMEOUT_SECONDS:.0f} s")
            for slot, worker in list(waiting.items()):
                if worker.fd not in ready:
                    continue
                messages = worker.read_lines()
                if messages is None or any("error" in m for m in messages):
                    reason = next((m["error"] for m in messages or [] if "error" in m), "it exited at start")
                    for other in started.values():
                        other.kill()
                    raise RuntimeError(
                        f"A scoring worker could not load {self.target}: {reason}. Fix: install what it needs (the "
                        "math reward needs math-verify: pip install 'trl-grpo-ext[math]')."
                    )
                if messages:
                    del waiting[slot]
        for slot, worker in started.items():
            self._procs[slot] = worker

    def _forked(self) -> bool:
        return any(w is not None and w.pid != os.getpid() for w in self._procs)

    def close(self) -> None:
        with self._lock:
            procs, self._procs = self._procs, [None] * self.workers
            for worker in procs:
                if worker is not None:
                    worker.kill()

    # ------------------------------------------------------------------ scoring
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
        with self._lock:
            if self._forked():  # an os.fork() child: the parent's workers are not ours to use or stop
                for worker in self._procs:
                    if worker is not None:
                        worker.forget()
                self._procs = [None] * self.workers
            missing = [i for i, w in enumerate(self._procs) if w is None]
            if missing and not self._serial:
                try:
                    self._start(missing)
                except _StartError as error:
                    self._serial = True
                    logger.warning("Math reward: %s; scoring in the calling thread from now on.", error)
            if self._serial:
                scores, timeouts = _score_here(self.score_fn, pairs, answer_timeout, batch_budget)
            else:
                scores, timeouts = self._score_in_workers(list(pairs), answer_timeout, batch_budget)
        if timeouts:
            self.timeouts += timeouts
            record_timeouts(getattr(self.score_fn, "__name__", "score_fn"), timeouts, len(pairs))
        return scores

    def _score_in_workers(self, pairs, answer_timeout, batch_budget) -> tuple[list[float | None], int]:
        size = max(1, -(-len(pairs) // (4 * self.workers)))  # about 4 chunks per worker: balance vs. messages
        queue = [(list(range(i, min(i + size, len(pairs)))), 0) for i in range(0, len(pairs), size)]
        scores: list[float | None] = [None] * len(pairs)
        done = [False] * len(pairs)
        busy: dict[int, tuple[list[int], int]] = {}  # slot -> (indices, attempt)
        timeouts = 0
        deadline = time.monotonic() + batch_budget

        def dispatch(slot: int) -> None:
            indices, attempt = queue.pop(0)
            busy[slot] = (indices, attempt)
            try:
                self._procs[slot].send({"pairs": [pairs[i] for i in indices], "timeout": answer_timeout})
            except (BrokenPipeError, OSError):  # it died: the end of its pipe comes next, and the death path below
                pass

        for slot in range(self.workers):
            if queue:
                dispatch(slot)
        while busy:
            fds = {self._procs[slot].fd: slot for slot in busy}
            ready, _, _ = select.select(list(fds), [], [], max(0.0, deadline - time.monotonic()))
            if not ready:  # the batch's budget is spent: what is left scores 0.0
                for slot in busy:
                    self._procs[slot].kill()
                    self._procs[slot] = None
                    self.replaced += 1
                left = [i for i in range(len(pairs)) if not done[i]]
                for i in left:
                    scores[i] = 0.0
                timeouts += len(left)
                logger.warning("Math reward batch over its %.1f s budget: %d answers 0.0.", batch_budget, len(left))
                break
            for fd in ready:
                slot = fds[fd]
                messages = self._procs[slot].read_lines()
                if messages is None:  # the worker died: replace it, send its answers again (one by one the 2nd time)
                    indices, attempt = busy.pop(slot)
                    self._procs[slot].kill()
                    self._procs[slot] = None
                    self.replaced += 1
                    if attempt == 0:
                        queue.insert(0, (indices, 1))
                    elif len(indices) > 1:
                        queue[:0] = [([i], 1) for i in indices]
                    else:
                        scores[indices[0]], done[indices[0]] = 0.0, True
                        logger.warning("Math reward: answer %d killed its scoring process twice: 0.0.", indices[0])
                    try:
                        self._start([slot])
                    except (_StartError, RuntimeError) as error:
                        logger.warning("Math reward: a scoring process could not be replaced (%s).", error)
                        continue
                    if queue:
                        dispatch(slot)
                    continue
                for message in messages:
                    indices, _ = busy.pop(slot)
                    for i, (score, timed_out) in zip(indices, message["scores"], strict=True):
                        scores[i], done[i] = score, True
                        timeouts += bool(timed_out)
                    if queue:
                        dispatch(slot)
            if not busy and queue:  # every worker died and none could be replaced: score the rest here
                rest = [i for indices, _ in queue for i in indices]
                queue.clear()
                here, late = _score_here(
                    self.score_fn, [pairs[i] for i in rest], answer_timeout, max(0.0, deadline - time.monotonic())
                )
                for i, score in zip(rest, here, strict=True):
                    scores[i], done[i] = score, True
                timeouts += late
        return scores, timeouts


def _score_here(score_fn, pairs, answer_timeout, batch_budget) -> tuple[list[float | None], int]:
    """Scores in the calling thread, within ``batch_budget`` (answers left after it score 0.0). In a main thread each
    answer is bounded by the interval timer; elsewhere by the screen only (signals need the main thread)."""
    main = threading.current_thread() is threading.main_thread()
    deadline = time.monotonic() + batch_budget
    scores: list[float | None] = []
    timeouts = 0
    for pair in pairs:
        if time.monotonic() >= deadline:
            scores.append(0.0)
            timeouts += 1
            continue
        ((score, timed_out),) = score_chunk(score_fn, [pair], answer_timeout if main else None)
        scores.append(score)
        timeouts += timed_out
    return scores, timeouts


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


def score_serially(score_fn, pairs) -> list[float | None]:
    """The serial path (one worker asked for, called from a main thread): in the calling thread, each answer bounded by
    ``ANSWER_TIMEOUT_SECONDS`` like a worker's, the batch by :func:`batch_budget_seconds`."""
    scores, timeouts = _score_here(score_fn, pairs, ANSWER_TIMEOUT_SECONDS, batch_budget_seconds(len(pairs), 1))
    if timeouts:
        record_timeouts(getattr(score_fn, "__name__", "score_fn"), timeouts, len(pairs))
    return scores


def _after_fork_in_child() -> None:
    """In an ``os.fork()`` child the pools (and a lock another thread may have held) are the parent's: start afresh,
    leaving the parent's workers running for the parent."""
    global _POOLS_LOCK
    _POOLS_LOCK = threading.Lock()
    for pool in list(_POOLS.values()):
        pool._lock = threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _close_pools() -> None:
    for pool in list(_POOLS.values()):
        pool.close()
