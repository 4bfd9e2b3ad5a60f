"""Datasets for the math recipe: the offline synthetic task, Hub datasets, or local files, in one prompt format.

Every loader returns rows with ``prompt`` (a string for the synthetic task, chat messages otherwise) and
``solution`` (the reference the rewards read; GSM8K ``#### n`` and MATH ``\\boxed{}`` are understood).
"""

from __future__ import annotations

import os
from typing import Any

from datasets import Dataset, load_dataset

from .core.registry import Registry

SYSTEM_PROMPT = (
    "Solve the problem step by step, one step per line, and put the final answer in \\boxed{} on the last line."
)

#: Offline datasets by ``dataset_name``: ``builder(n, *, split, seed, num_ops) -> Dataset`` in recipe format. The
#: library ships none; the project's lab registers ``"synthetic"`` (``grpo_lab.offline.register()``, which the recipe
#: calls), and a user registers their own the same way.
OFFLINE_DATASETS: Registry = Registry("offline_dataset", symbol="OFFLINE_DATASETS")
#: Row formatters by name: raw dataset row -> {"prompt": ..., "solution": ...}.
FORMATTERS: Registry = Registry("dataset_format", symbol="FORMATTERS")
#: Which formatter a known Hub dataset uses.
KNOWN_DATASETS = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "BytedTsinghua-SIA/DAPO-Math-17k": "dapo",
}


def _chat(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


@FORMATTERS.register("gsm8k")
def _gsm8k(row: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": _chat(row["question"]), "solution": row["answer"]}


@FORMATTERS.register("math")
def _math(row: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": _chat(row["problem"]), "solution": row.get("solution") or row["answer"]}


@FORMATTERS.register("dapo")
def _dapo(row: dict[str, Any]) -> dict[str, Any]:
    prompt = row["prompt"]
    return {
        "prompt": prompt if isinstance(prompt, list) else _chat(prompt),
        "solution": row["reward_model"]["ground_truth"],
    }


@FORMATTERS.register("plain")
def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """Rows that already hold ``prompt`` and ``solution`` (or ``answer``)."""
    if "prompt" not in row or not ({"solution", "answer"} & set(row)):
        raise ValueError(
            f"A 'plain' dataset row needs 'prompt' and 'solution' (or 'answer') columns, got {sorted(row)}. Set "
            f"dataset_format to one of {FORMATTERS.names()} or rename the columns."
        )
    return {"prompt": row["prompt"], "solution": row.get("solution", row.get("answer"))}


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false") or os.environ.get(
        "HF_DATASETS_OFFLINE", "0"
    ) not in ("0", "", "false")


def load_math_dataset(
    name: str,
    *,
    split: str = "train",
    config: str | None = None,
    dataset_format: str | None = None,
    num_examples: int | None = None,
    seed: int = 0,
    synthetic_num_ops: int = 2,
) -> Dataset:
    """Load ``name`` (a registered offline dataset such as the lab's ``"synthetic"``, a local json/jsonl/parquet/csv
    file, or a Hub dataset id) in recipe format."""
    if name in OFFLINE_DATASETS:
        return OFFLINE_DATASETS.get(name)(num_examples, split=split, seed=seed, num_ops=synthetic_num_ops)
    if name == "synthetic":
        raise ValueError(
            "dataset_name='synthetic' is the project's offline task, which its lab registers: call "
            "grpo_lab.offline.register() first (recipes/math_grpo.py does), or register your own in "
            "trl_grpo_ext.data.OFFLINE_DATASETS."
        )
    ext = name.rsplit(".", 1)[-1].lower() if "." in os.path.basename(name) else ""
    builder = {"jsonl": "json", "json": "json", "parquet": "parquet", "csv": "csv"}.get(ext)
    if builder is not None and not os.path.isfile(name):
        raise ValueError(f"dataset_name={name!r}: no such file. Fix the path (relative to {os.getcwd()!r}).")
    if os.path.isfile(name):
        if builder is None:
            raise ValueError(f"dataset_name={name!r}: local files must be .json, .jsonl, .parquet or .csv.")
        if os.path.getsize(name) == 0:
            raise ValueError(f"dataset_name={name!r}: the file is empty. Write one row per problem.")
        try:
            data = load_dataset(builder, data_files=name, split="train")
        except Exception as error:  # datasets wraps parse errors in its own types
            problem = f"{type(error).__name__}: {error}"
            raise ValueError(f"dataset_name={name!r}: cannot be read as {ext} ({problem}).") from error
    else:
        if _offline():
            raise RuntimeError(
                f"dataset_name={name!r} is a Hugging Face Hub dataset, but the Hub is switched off (HF_HUB_OFFLINE / "
                "HF_DATASETS_OFFLINE is set). Download it while online, pass a local file (json/jsonl/parquet/csv), "
                "or use dataset_name=synthetic for the offline task."
            )
        try:
            data = load_dataset(name, config, split=split)
        except (ConnectionError, OSError) as error:
            raise RuntimeError(
                f"Could not load dataset {name!r} (config {config!r}, split {split!r}) from the Hugging Face Hub: "
                f"{error}. Check the network, or pass a local file, or use dataset_name=synthetic."
            ) from error
    if len(data) == 0:
        raise ValueError(f"dataset_name={name!r} (split {split!r}) has no rows.")
    fmt = dataset_format or KNOWN_DATASETS.get(name, "plain")
    formatter = FORMATTERS.get(fmt)
    if num_examples is not None:
        if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
            raise ValueError(f"num_train_examples={num_examples!r}: must be an integer >= 1 (or unset for all rows).")
        data = data.shuffle(seed=seed).select(range(min(num_examples, len(data))))
    try:
        data = data.map(formatter, remove_columns=data.column_names)
    except KeyError as error:
        raise ValueError(
            f"dataset_name={name!r}: dataset_format={fmt!r} needs the column {error}, but the rows have "
            f"{sorted(data.column_names)}. Set dataset_format to one of {FORMATTERS.names()} or rename the columns."
        ) from error
    _check_prompts(data["prompt"], name)
    return data


def _check_prompts(prompts: list, name: str) -> None:
    """Every prompt is a non-empty string or a non-empty list of chat messages."""
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            ok = bool(prompt.strip())
        elif isinstance(prompt, list):
            ok = bool(prompt) and all(isinstance(m, dict) and "content" in m for m in prompt)
        else:
            ok = False
        if not ok:
            raise ValueError(
                f"dataset_name={name!r}: row {i} has prompt {prompt!r:.80}; a prompt must be a non-empty string or a "
                "non-empty list of chat messages ({'role': ..., 'content': ...})."
            )
