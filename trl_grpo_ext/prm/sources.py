"""Where step rewards come from: Python step functions, token-classification PRMs, causal-LM PRMs.

Every source is called like a step reward function::

    source(prompts=[...], completions=[...], steps=[[step text, ...], ...], **dataset_columns) -> [[score, ...], ...]

returning one list per completion with one score per step (None or NaN for a step it cannot score).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..core.advantages import MAX_ABS_REWARD


def _text(message) -> str:
    if isinstance(message, list):  # conversational: the last message's content
        return message[-1]["content"] if message else ""
    return message


def _as_score(score) -> float | None:
    """A step score as a float (None -> NaN; a 0-d tensor or numpy scalar is a number), or None if it is not one (a
    string, a boolean, a list)."""
    if score is None:
        return math.nan
    if isinstance(score, (bool, str, bytes)):
        return None
    try:
        return float(score)
    except (TypeError, ValueError):
        return None


def call_step_function(
    fn: Callable[..., Any], name: str, prompts: list, completions: list, steps: list[list[str]], **kwargs
) -> list[list[float]]:
    """Call a step reward source and check its output: one list per completion, one float (or None) per step.

    None for a whole completion means "cannot score any step" (every step NaN). Wrong counts raise a ``ValueError``
    naming the source, the completion and the fix.
    """
    shape = "Return one list per completion, one float (or None) per step (steps[i] lists the steps of completion i)"
    try:
        out = fn(prompts=prompts, completions=completions, steps=steps, **kwargs)
    except Exception as error:
        raise RuntimeError(f"Step reward source '{name}' raised {type(error).__name__}: {error}") from error
    if out is not None and not isinstance(out, (list, tuple)):
        try:
            out = list(out)  # a generator, a tensor, a numpy array
        except TypeError:
            kind = type(out).__name__
            raise ValueError(f"Step reward source '{name}' returned {kind} {out!r:.80}. {shape}.") from None
    if out is None or len(out) != len(steps):
        got = "None" if out is None else f"{len(out)} lists"
        raise ValueError(
            f"Step reward source '{name}' returned {got} for {len(steps)} completions. Return one list per completion "
            "with one score per step (steps[i] lists the steps of completion i)."
        )
    result = []
    for i, (scores, completion_steps) in enumerate(zip(out, steps, strict=True)):
        if scores is None:
            result.append([math.nan] * len(completion_steps))
            continue
        if isinstance(scores, (str, bytes)) or not hasattr(scores, "__len__"):
            raise ValueError(
                f"Step reward source '{name}' returned {type(scores).__name__} {scores!r:.80} for completion {i}. "
                f"{shape}."
            )
        if len(scores) != len(completion_steps):
            raise ValueError(
                f"Step reward source '{name}' returned {len(scores)} scores for completion {i}, which has "
                f"{len(completion_steps)} steps ({completion_steps!r}). Return exactly one score per step, or None "
                "for a step (or a whole completion) it cannot score."
            )
        row = []
        for score in scores:
            value = _as_score(score)
            if value is None:
                raise ValueError(
                    f"Step reward source '{name}' returned {score!r:.80} as a step score of completion {i}. {shape}."
                )
            if math.isinf(value):
                raise ValueError(
                    f"Step reward source '{name}' returned an infinite score for completion {i}; return finite floats "
                    "or None for an unscorable step."
                )
            if abs(value) > MAX_ABS_REWARD:
                raise ValueError(
                    f"Step reward source '{name}' returned {value:.3g} for completion {i}, above {MAX_ABS_REWARD:g} in "
                    "absolute value: the group statistics (float32) would overflow and every advantage would be 0. "
                    "Rescale the step scores."
                )
            row.append(value)
        result.append(row)
    return result


def _load(model_or_path, auto_cls, tokenizer, device, dtype):
    from transformers import AutoTokenizer

    if isinstance(model_or_path, str):
        if model_or_path.startswith((".", "/", "~")) and not os.path.isdir(os.path.expanduser(model_or_path)):
            raise ValueError(
                f"prm_model_name_or_path={model_or_path!r}: no such folder. Fix the path, or give a Hub id."
            )
        model, info = auto_cls.from_pretrained(model_or_path, dtype=dtype, output_loading_info=True)
        fresh = list(info.get("missing_keys", []))
        if fresh:
            # e.g. a causal-LM checkpoint loaded as a token-classification PRM: its head would be random.
            raise ValueError(
                f"prm_model_name_or_path={model_or_path!r} has no weights for {sorted(fresh)[:4]} of "
                f"{auto_cls.__name__}: that head would be randomly initialised and score steps at random. Use a PRM "
                "trained for this head, or set prm_model_type to match the checkpoint (token_classification / "
                "causal_lm)."
            )
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_or_path)
    else:
        model = model_or_path
        if tokenizer is None:
            raise ValueError("Pass the PRM's tokenizer along with a PRM model object.")
    model.eval().requires_grad_(False)
    if device is not None:
        model.to(device)
    return model, tokenizer


def _single_token(tokenizer, text: str, field: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(
            f"{field}={text!r} is {len(ids)} tokens for this PRM's tokenizer ({ids}); it must be exactly one token. "
            f"Pick the tag / label tokens the PRM was trained with."
        )
    return ids[0]


def _batched_scores(model, sequences: list[list[int]], positions: list[list[int]], pad_id: int, batch_size: int, fn):
    """Run ``model`` on right-padded batches and collect ``fn(logits)`` (B, L) at the given positions."""
    device = next(model.parameters()).device
    scores: list[list[float]] = [[] for _ in sequences]
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # similar lengths together
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = max(len(sequences[i]) for i in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
            attn[row, : len(sequences[i])] = 1
        with torch.inference_mode():
            logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits.float()
        values = fn(logits)  # (b, L)
        for row, i in enumerate(chunk):
            scores[i] = values[row, positions[i]].tolist() if positions[i] else []
    return scores


class TokenClassificationPRM:
    """A token-classification PRM in TRL's PRMTrainer format, scored at each step's last token.

    Input layout (TRL's ``PRMTrainer.tokenize_row``, removed from TRL in 1.14; :mod:`trl_grpo_ext.prm.training`
    reproduces it): ``[bos] + prompt + step_1 + separator + step_2 + separator + ...``, each piece tokenized on its own,
    the label on the last token of each ``step + separator``. The step reward is the probability of the "correct" label
    (``positive_label``, 1) there.

    Args:
        model: a path or an ``AutoModelForTokenClassification``.
        tokenizer: required with a model object.
        separator: the ``step_separator`` the PRM was trained with.
        batch_size: sequences per forward pass.
        device: where to run it (the trainer's device).
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        separator: str = "\n",
        batch_size: int = 8,
        device=None,
        dtype=None,
        positive_label: int = 1,
    ):
        from transformers import AutoModelForTokenClassification

        self.model, self.tokenizer = _load(model, AutoModelForTokenClassification, tokenizer, device, dtype)
        self.separator_ids = self.tokenizer.encode(separator, add_special_tokens=False)
        self.batch_size = batch_size
        self.positive_label = positive_label
        self.__name__ = "prm_model"

    def __call__(self, prompts, completions, steps, **kwargs) -> list[list[float]]:
        tok = self.tokenizer
        sequences, positions = [], []
        for prompt, completion_steps in zip(prompts, steps, strict=True):
            ids = ([tok.bos_token_id] if tok.bos_token_id is not None else []) + tok.encode(
                _text(prompt), add_special_tokens=False
            )
            pos = []
            for step in completion_steps:
                ids += tok.encode(step, add_special_tokens=False) + self.separator_ids
                pos.append(len(ids) - 1)
            sequences.append(ids)
            positions.append(pos)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        return _batched_scores(
            self.model,
            sequences,
            positions,
            pad,
            self.batch_size,
            lambda logits: logits.softmax(-1)[..., self.positive_label],
        )


class CausalLMPRM:
    """A causal-LM PRM that scores a step tag by P(good token) vs P(bad token) (Math-Shepherd style).

    Wang et al. 2024, "Math-Shepherd" (arXiv 2312.08935): the input is ``prompt step_1 <tag>\\n step_2 <tag>\\n ...``
    and the step reward is ``p(good) / (p(good) + p(bad))`` of the next-token distribution at each tag.

    Args:
        model: a path or an ``AutoModelForCausalLM``.
        tokenizer: required with a model object.
        step_tag, good_token, bad_token: each must be a single token of the PRM's tokenizer.
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        step_tag: str = "ки",
        good_token: str = "+",
        bad_token: str = "-",
        batch_size: int = 8,
        device=None,
        dtype=None,
    ):
        from transformers import AutoModelForCausalLM

        self.model, self.tokenizer = _load(model, AutoModelForCausalLM, tokenizer, device, dtype)
        self.tag_id = _single_token(self.tokenizer, step_tag, "prm_causal_step_tag")
        self.good_id = _single_token(self.tokenizer, good_token, "prm_causal_good_token")
        self.bad_id = _single_token(self.tokenizer, bad_token, "prm_causal_bad_token")
        self.newline_ids = self.tokenizer.encode("\n", add_special_tokens=False)
        self.batch_size = batch_size
        self.__name__ = "prm_causal_lm"

    def __call__(self, prompts, completions, steps, **kwargs) -> list[list[float]]:
        tok = self.tokenizer
        sequences, positions = [], []
        for prompt, completion_steps in zip(prompts, steps, strict=True):
            ids = tok.encode(_text(prompt) + " ", add_special_tokens=False)
            pos = []
            for step in completion_steps:
                ids += tok.encode(step + " ", add_special_tokens=False)
                pos.append(len(ids))
                ids += [self.tag_id] + self.newline_ids
            sequences.append(ids)
            positions.append(pos)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        pair = [self.good_id, self.bad_id]
        return _batched_scores(
            self.model, sequences, positions, pad, self.batch_size, lambda logits: logits[..., pair].softmax(-1)[..., 0]
        )


def source_name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def sum_step_rewards(per_source: Sequence[list[list[float]]]) -> list[list[float]]:
    """Sum the sources step by step, NaN-aware like TRL sums reward functions (NaN only where every source is NaN)."""
    total = []
    for rows in zip(*per_source, strict=True):
        steps = []
        for values in zip(*rows, strict=True):
            finite = [v for v in values if not math.isnan(v)]
            steps.append(sum(finite) if finite else math.nan)
        total.append(steps)
    return total
