"""A scoring worker: a fresh interpreter that imports only its scorer (math-verify and sympy for the math reward; no
torch, transformers or datasets, and never the caller's main script), then scores (completion, gold) pairs sent as
JSON lines on its stdin, each in its main thread under a per-answer interval timer, and answers on the file descriptor
it was given. Started by :class:`trl_grpo_ext.rewards.pool.ScorerPool`; it exits when its stdin closes (the caller
closed it, or died).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys

#: Seconds the first call (which imports the scorer's dependencies) may take before the worker says it is ready.
WARM_UP_SECONDS = 10.0


class AnswerTimeout(BaseException):  # not an Exception: a scorer's own fallback (math_accuracy's) must not catch it
    pass


def _on_alarm(signum, frame):
    raise AnswerTimeout


def score_chunk(score_fn, pairs, answer_timeout: float | None) -> list[tuple[float | None, bool]]:
    """(score, timed out) per (completion, gold), in the calling (main) thread, each bounded by ``answer_timeout``
    seconds of an interval timer (None: unbounded). The scorer is called with ``timeout_seconds=None``: math-verify's
    own alarms would reset this timer."""
    out = []
    previous = signal.signal(signal.SIGALRM, _on_alarm) if answer_timeout else None
    try:
        for completion, gold in pairs:
            # Armed and disarmed inside the try: a one-shot alarm firing at any point is caught here.
            try:
                if answer_timeout:
                    signal.setitimer(signal.ITIMER_REAL, answer_timeout)
                score, timed_out = score_fn(completion, gold, timeout_seconds=None), False
                if answer_timeout:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except AnswerTimeout:
                score, timed_out = 0.0, True
            out.append((score, timed_out))
    finally:
        if answer_timeout:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return out


def load(target: str):
    """The function named ``"module:qualname"``."""
    module, _, name = target.partition(":")
    value = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    target, out_fd = sys.argv[1], int(sys.argv[2])
    out = os.fdopen(out_fd, "w", encoding="utf-8")

    def send(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    try:
        score_fn = load(target)
    except Exception as error:  # reported to the caller, which names it in its error
        send({"error": f"{type(error).__name__}: {error}"})
        return
    # Import the scorer's dependencies now, so that no batch's budget pays for them (bounded: a scorer that takes
    # long, or refuses this call, is warmed by its first batch instead).
    try:
        score_chunk(score_fn, [("\\boxed{1}", "1")], WARM_UP_SECONDS)
    except Exception:
        pass
    send({"ready": os.getpid()})
    for line in sys.stdin:
        request = json.loads(line)
        send({"scores": score_chunk(score_fn, request["pairs"], request["timeout"])})


if __name__ == "__main__":
    main()
