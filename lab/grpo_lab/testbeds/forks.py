"""The "forks" testbed: a task with many right answers, where collapse onto one of them is a loss.

Task: copy eight given digits with a ``+`` or ``-`` between each two, using exactly the asked number of minus signs.
The prompt ``"35241628 3:"`` asks for completions such as ``"3+5-2+4-1+6+2-8"``: 15 characters and the end token, of
which the 8 digits and the end are copied from the prompt (near-determined tokens) and the 7 signs are the decisions
(the "fork" tokens of Cui et al. 2025). A prompt asking for k minus signs has C(7, k) right answers (1 to 35, 16 on
average; :func:`solutions`); the verifier (:func:`gold_reward`) accepts any of them.

Problems: a fixed pool of :data:`POOL_SIZE` distinct prompts (random digits, k uniform in 0..7), the same on every
machine. A hash of the prompt puts one in five in the held-out split, which a second hash cuts in two halves:
``validation`` (every choice: defaults, ratios, targets, learning rates) and ``test`` (reported only).

Warm start: a tiny random Llama fine-tuned by TRL's ``SFTTrainer`` on a *careless teacher* who writes a uniformly
random right answer half the time and a uniformly random sign pattern otherwise (:data:`TEACHER_RIGHT`): the warm start
writes well-formed expressions with many different sign patterns, some of them right.

What the tools are for, on this task: GRPO rewards whichever right pattern a prompt's samples find; vanilla GRPO can
narrow onto one pattern per prompt although every right one scores the same. Measured with
:func:`grpo_lab.evaluation.sampled_evaluation` on held-out prompts: pass@k for k up to 64, distinct right
answers per prompt, greedy accuracy.

Example:
    >>> from grpo_lab.testbeds import forks
    >>> path = forks.warm_start("/tmp/forks", seed=0)                  # cached after the first call
    >>> train = forks.problems(20_000, split="train", seed=1)          # columns: prompt, answer (one right pattern)
    >>> trainer = GRPOExtTrainer(model=path, reward_funcs=[forks.gold_reward],
    ...                          args=GRPOExtConfig(**forks.grpo_settings(), output_dir="out"), train_dataset=train)
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from typing import Any

from datasets import Dataset

from .. import testbed, testkit

#: Digits per problem (the completion writes all of them, with a sign between two consecutive ones).
NUM_DIGITS = 8
#: Problems in the fixed pool (about 80% train, 10% validation, 10% test).
POOL_SIZE = 6000
#: The careless teacher writes a uniformly random right pattern with this probability, else a uniformly random one.
TEACHER_RIGHT = 0.5
#: Longest completion: 8 digits, 7 signs, the end token, and a margin of two.
MAX_COMPLETION_LENGTH = 2 * NUM_DIGITS + 2
SPLITS = ("train", "validation", "test")


def _digest(text: str, salt: str) -> int:
    return int(hashlib.sha1(f"{salt}|{text}".encode()).hexdigest()[:8], 16)


def split_of(prompt: str) -> str:
    """``"train"`` (four in five prompts), ``"validation"`` or ``"test"`` (one in ten each), by a hash of the prompt:
    the same split on every machine."""
    if _digest(prompt, "heldout") % 5:
        return "train"
    return "validation" if _digest(prompt, "half") % 2 == 0 else "test"


def parse_prompt(prompt: str) -> tuple[list[int], int]:
    """``"35241628 3:"`` -> ([3, 5, 2, 4, 1, 6, 2, 8], 3): the digits and the number of minus signs asked for."""
    digits, minus = prompt.rstrip(":").split(" ")
    return [int(d) for d in digits], int(minus)


def expression(digits: list[int], signs: tuple[int, ...]) -> str:
    """The completion for ``signs`` (+1 / -1 before each digit after the first): ``"3+5-2..."``."""
    return str(digits[0]) + "".join(("+" if s > 0 else "-") + str(d) for s, d in zip(signs, digits[1:], strict=True))


@functools.cache
def solutions(prompt: str) -> tuple[str, ...]:
    """Every right completion of ``prompt`` (the sign patterns with the asked number of minus signs), in a fixed
    order."""
    digits, minus = parse_prompt(prompt)
    return tuple(
        expression(digits, signs)
        for signs in itertools.product((1, -1), repeat=len(digits) - 1)
        if signs.count(-1) == minus
    )


@functools.cache
def pool() -> tuple[str, ...]:
    """The :data:`POOL_SIZE` prompts, distinct, in a fixed order (seeded generator, identical everywhere)."""
    rng = random.Random(20_261_205)
    prompts: dict[str, None] = {}
    while len(prompts) < POOL_SIZE:
        digits = "".join(str(rng.randint(1, 9)) for _ in range(NUM_DIGITS))
        prompts[f"{digits} {rng.randint(0, NUM_DIGITS - 1)}:"] = None
    return tuple(prompts)


def problems(n: int | None = None, *, split: str = "train", seed: int = 0) -> Dataset:
    """Rows with ``prompt`` and ``answer`` (the first right completion; the verifier accepts any right one).

    ``split="train"``: ``n`` prompts drawn with replacement from the training pool (a stream for GRPO).
    ``split="validation"`` / ``"test"``: the held-out prompts of that half in a seeded order, all or the first ``n``.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    prompts = [p for p in pool() if split_of(p) == split]
    rng = random.Random(seed)
    if split == "train":
        if n is None:
            raise ValueError("problems(split='train') needs n, the number of rows to draw.")
        chosen = [rng.choice(prompts) for _ in range(n)]
    else:
        rng.shuffle(prompts)
        chosen = prompts if n is None else prompts[:n]
    return Dataset.from_list([{"prompt": p, "answer": solutions(p)[0]} for p in chosen])


def _text(completion: Any) -> str:
    if isinstance(completion, list):  # conversational
        return completion[-1]["content"] if completion else ""
    return completion


def is_right(prompt: str, completion: str) -> bool:
    """Whether ``completion`` (white space stripped) is one of the right sign patterns of ``prompt``."""
    return _text(completion).strip() in solutions(prompt)


def gold_reward(prompts, completions, **kwargs) -> list[float]:
    """The verifier, as a TRL reward function: 1.0 for any right sign pattern, else 0.0."""
    return [1.0 if is_right(p, c) else 0.0 for p, c in zip(prompts, completions, strict=True)]


def gold(prompts: list[str], completions: list[str]) -> list[bool]:
    """The verifier for :func:`grpo_lab.evaluation.sampled_evaluation`."""
    return [is_right(p, c) for p, c in zip(prompts, completions, strict=True)]


def teacher_completion(prompt: str, rng: random.Random) -> str:
    """One answer of the careless teacher (:data:`TEACHER_RIGHT`)."""
    if rng.random() < TEACHER_RIGHT:
        return rng.choice(solutions(prompt))
    digits, _ = parse_prompt(prompt)
    return expression(digits, tuple(rng.choice((1, -1)) for _ in range(len(digits) - 1)))


def sft_dataset(n: int, *, seed: int = 0, eos_token: str = testkit.EOS) -> Dataset:
    """``n`` prompt-completion rows for TRL's ``SFTTrainer``: training prompts, the careless teacher's answers."""
    rng = random.Random(30_011 + seed)
    prompts = problems(n, split="train", seed=seed)["prompt"]
    return Dataset.from_list([{"prompt": p, "completion": teacher_completion(p, rng) + eos_token} for p in prompts])


def warm_start(
    cache_dir: str,
    *,
    seed: int = 0,
    examples: int = 40_000,
    learning_rate: float = 2e-3,
    batch_size: int = 64,
    hidden_size: int = 128,
    num_layers: int = 4,
    use_cpu: bool = True,
    log=print,
) -> str:
    """The SFT warm start for ``seed``, built once into ``cache_dir`` and reused; returns its path (as
    :func:`grpo_lab.testbed.warm_start`, on this task's teacher)."""
    return testbed.sft_warm_start(
        cache_dir,
        kind="forks",
        dataset=sft_dataset,
        seed=seed,
        examples=examples,
        learning_rate=learning_rate,
        batch_size=batch_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        use_cpu=use_cpu,
        log=lambda path: log(
            f"[forks] SFT warm start (seed {seed}, {examples} careless-teacher rows), cached in {path}"
        ),
    )


def grpo_settings(**overrides) -> dict[str, Any]:
    """The addition testbed's GRPO budget and sampling (:func:`grpo_lab.testbed.grpo_settings`: 32 prompts x 8
    completions per generation batch in 4 optimizer steps of 64, temperature 0.7, learning rate 2e-4 decaying linearly
    to 0) with room for the 16-token completions and 250 steps (by then vanilla has narrowed onto few answers per
    prompt on the validation prompts); ``overrides`` on top."""
    return testbed.grpo_settings(**{"max_completion_length": MAX_COMPLETION_LENGTH, "max_steps": 250, **overrides})


__all__ = [
    "MAX_COMPLETION_LENGTH",
    "NUM_DIGITS",
    "POOL_SIZE",
    "SPLITS",
    "TEACHER_RIGHT",
    "expression",
    "gold",
    "gold_reward",
    "grpo_settings",
    "is_right",
    "parse_prompt",
    "pool",
    "problems",
    "sft_dataset",
    "solutions",
    "split_of",
    "teacher_completion",
    "warm_start",
]
