"""Math answer rewards: math-verify for GSM8K / MATH-style answers, a format reward, hardened against hostile output.

Model output is never executed or ``eval``-ed. Before anything reaches sympy (through math-verify) the completion is
cut to its last ``MAX_TAIL_CHARS`` characters and screened: exponent towers, giant integers and deep nesting are scored
0.0 at once (a policy that learns to emit ``9**9**9**9`` must not stall training). math-verify's own timeouts use
``signal.alarm`` and only work in a process's main thread, so :func:`math_accuracy_reward` scores in the calling thread
only when that is the main thread and one worker is asked for (each answer bounded by an interval timer, as in a
worker); otherwise (any other thread, or several workers) it scores in worker processes with a per-answer and a
per-batch time bound (:mod:`trl_grpo_ext.rewards.pool`).
"""

from __future__ import annotations

import logging
import os
import re
import threading

logger = logging.getLogger(__name__)

#: Only the end of a completion is parsed: answers come last, and 1 MB strings must not reach the parser.
MAX_TAIL_CHARS = 1000
#: Longest run of digits accepted in an answer.
MAX_DIGITS = 100
#: Deepest bracket nesting accepted.
MAX_NESTING = 30
#: Seconds math-verify may spend parsing / comparing one answer.
TIMEOUT_SECONDS = 2

_TOWER = re.compile(r"(\*\*|\^)\s*[{(]?\s*[\d.]+\s*[})]?\s*(\*\*|\^)")  # a ** b ** c, a^{b^{c}}, ...
_BIG_EXPONENT = re.compile(r"(\*\*|\^)\s*[{(]?\s*\d{4,}")  # a ** 12345
_DIGITS = re.compile(rf"\d{{{MAX_DIGITS + 1},}}")
_BOXED = "\\boxed{"


def _text(completion):
    if isinstance(completion, list):
        return completion[-1]["content"] if completion else ""
    return "" if completion is None else completion


def _max_nesting(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch in "({[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")}]":
            depth = max(depth - 1, 0)
    return deepest


def screen(text: str) -> str | None:
    """Why ``text`` is refused before parsing (a short reason), or None if it may be parsed."""
    if _TOWER.search(text) or _BIG_EXPONENT.search(text):
        return "exponent tower or huge exponent"
    if _DIGITS.search(text):
        return f"a number longer than {MAX_DIGITS} digits"
    if _max_nesting(text) > MAX_NESTING:
        return f"brackets nested deeper than {MAX_NESTING}"
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces), or None."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def gold_answer(solution: str) -> str:
    """The reference answer of a GSM8K (``#### 42``), MATH (``\\boxed{...}``) or plain-answer solution string."""
    solution = str(solution)
    if "####" in solution:
        return solution.rsplit("####", 1)[1].strip().replace(",", "")
    boxed = last_boxed(solution)
    return boxed if boxed is not None else solution.strip()


def _parse(text: str, timeout_seconds: int | None):
    from math_verify import parse

    return parse(text, parsing_timeout=timeout_seconds)


def math_accuracy(completion: str, gold: str | None, *, timeout_seconds: int | None = TIMEOUT_SECONDS) -> float | None:
    """1.0 when the completion's final answer equals ``gold`` (math-verify), 0.0 otherwise; None if gold is missing or
    unusable (TRL then leaves the completion out of the group statistics).

    ``timeout_seconds`` bounds math-verify's parsing and comparison with ``signal.alarm`` (main thread only); None
    turns those timers off, for a caller that bounds the whole call itself (the worker pool).
    """
    from math_verify import verify

    if gold is None or not str(gold).strip():
        return None
    mv_logger = logging.getLogger("math_verify")
    previous = mv_logger.level
    mv_logger.setLevel(logging.CRITICAL)  # it logs whole inputs on timeouts
    try:
        gold_parsed = _parse(f"${gold}$", timeout_seconds) if screen(gold) is None else []
        if not gold_parsed:
            return None
        tail = completion[-MAX_TAIL_CHARS:]
        candidate = last_boxed(tail)
        candidate = tail if candidate is None else f"${candidate}$"
        if screen(candidate) is not None:
            return 0.0
        answer = _parse(candidate, timeout_seconds)
        return 1.0 if answer and verify(gold_parsed, answer, timeout_seconds=timeout_seconds) else 0.0
    except Exception as error:  # math-verify / sympy on adversarial input: score 0, never crash training
        logger.debug("math_accuracy: %s on %r", type(error).__name__, completion[-80:])
        return 0.0
    finally:
        mv_logger.setLevel(previous)


def math_accuracy_reward(completions, solution=None, answer=None, **kwargs) -> list[float | None]:
    """TRL reward function: math-verify accuracy against the ``solution`` (or ``answer``) column.

    GSM8K ``#### n`` and MATH ``\\boxed{}`` references are understood; the completion's last ``\\boxed{}`` is compared,
    or its tail when it has none. None (TRL: unscorable) when the reference itself cannot be parsed. Scored in worker
    processes (:mod:`trl_grpo_ext.rewards.pool`), or in the calling thread when one worker is asked for and this is a
    main thread.
    """
    references = solution if solution is not None else answer
    if references is None:
        raise ValueError("math_accuracy_reward needs a 'solution' or 'answer' column in the dataset.")
    completions, references = list(completions), list(references)
    if len(completions) != len(references):
        raise ValueError(
            f"math_accuracy_reward got {len(completions)} completions but {len(references)} references (the "
            "'solution' / 'answer' column): pass one reference per completion."
        )
    pairs = []
    for i, (completion, reference) in enumerate(zip(completions, references, strict=True)):
        text = _text(completion)
        if not isinstance(text, str):
            raise TypeError(
                f"math_accuracy_reward: completion {i} is {type(completion).__name__} {completion!r:.60}; expected "
                "text (str) or chat messages (a list of {'role': ..., 'content': str} dicts)."
            )
        pairs.append((text, None if reference is None else gold_answer(reference)))
    workers = math_reward_workers()
    from .pool import score_serially, shared_pool

    if workers == 1 and threading.current_thread() is threading.main_thread():
        return score_serially(math_accuracy, pairs)
    return shared_pool(workers, math_accuracy).score(pairs)


_workers: int | None = None


def set_math_reward_workers(workers: int | None) -> None:
    """Processes that score :func:`math_accuracy_reward`. ``1``: in the calling thread when it is the main thread (a
    single worker process otherwise); ``N > 1``: a persistent pool of N processes, at most the cores this process
    may use (:func:`trl_grpo_ext.rewards.pool.max_workers`); ``None`` (default): this machine's cores divided among the
    local training processes (``LOCAL_WORLD_SIZE``)."""
    if workers is not None:
        from .pool import check_workers

        check_workers(workers)
    global _workers
    _workers = workers


def math_reward_workers() -> int:
    """The number of scoring processes :func:`math_accuracy_reward` uses now (see :func:`set_math_reward_workers`)."""
    if _workers is not None:
        return _workers
    from .pool import default_workers

    local = os.environ.get("LOCAL_WORLD_SIZE", "1")
    try:
        processes = int(local)
    except ValueError:
        raise ValueError(
            f"LOCAL_WORLD_SIZE={local!r} is not an integer (the launcher sets it to the training processes on this "
            "machine). Fix: unset it or set it to a whole number, or call set_math_reward_workers(N)."
        ) from None
    return max(1, default_workers() // max(1, processes))


def boxed_format_reward(completions, **kwargs) -> list[float]:
    """1.0 when the completion ends its reasoning with one well-formed ``\\boxed{...}`` answer, else 0.0."""
    out = []
    for completion in completions:
        tail = _text(completion)[-MAX_TAIL_CHARS:]
        out.append(1.0 if last_boxed(tail) is not None and tail.count(_BOXED) == 1 else 0.0)
    return out
