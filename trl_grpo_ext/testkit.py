"""Offline test kit: a character-level tokenizer, a tiny random causal LM and a synthetic arithmetic task.

Nothing here touches the Hugging Face Hub. Tests, recipes and benchmarks build their models with these helpers and save
them to a local folder, because TRL re-loads the reference model from ``config._name_or_path``.

Example:
    >>> from trl_grpo_ext import testkit
    >>> path = testkit.save_tiny_model("/tmp/tiny")             # tokenizer + random Qwen2, saved locally
    >>> train = testkit.arithmetic_dataset(256, seed=0)          # columns: prompt, answer
    >>> rewards = [testkit.exact_match_reward, testkit.first_char_reward]
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from datasets import Dataset

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
#: Characters the tiny tokenizer knows, one token each: digits, operators and what the arithmetic prompts use.
DEFAULT_CHARS = "0123456789+-*=/()?:. \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ,;!_'\"[]{}<>|\\#$%&^@~`"


def build_char_tokenizer(chars: str = DEFAULT_CHARS):
    """A fast character-level tokenizer: one token per character, ``<pad>``, ``<eos>`` and ``<unk>`` specials.

    Built with the ``tokenizers`` library (WordLevel model over single characters), so offsets, ``decode`` and
    ``batch_decode`` behave like any other ``PreTrainedTokenizerFast``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for ch in dict.fromkeys(chars):  # keep order, drop duplicates
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )


def build_tiny_model(tokenizer, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, seed: int = 0):
    """A random Qwen2 causal LM sized for CPU tests (about 0.1M parameters at the defaults)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny_model(path: str | Path, **model_kwargs) -> str:
    """Build the tokenizer and a tiny random model and save both to ``path``; return the path as a string."""
    path = Path(path)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, **model_kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def arithmetic_dataset(n: int, *, seed: int = 0, max_operand: int = 9, ops: str = "+") -> Dataset:
    """Single-operation problems such as ``"3+4="`` with the answer ``"7"``; columns ``prompt`` and ``answer``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append({"prompt": f"{a}{op}{b}=", "answer": str(value)})
    return Dataset.from_list(rows)


def _text(completion) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        return completion[-1]["content"] if completion else ""
    return completion


_LEADING_INT = re.compile(r"\s*(-?\d+)")


def exact_match_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion starts with the correct integer (and nothing but the end follows it), else 0.0."""
    out = []
    for completion, ans in zip(completions, answer, strict=True):
        match = _LEADING_INT.match(_text(completion))
        out.append(1.0 if match is not None and match.group(1) == ans else 0.0)
    return out


def first_char_reward(completions, answer, **kwargs) -> list[float]:
    """Shaping reward: 0.5 when the first character of the completion is the first character of the answer."""
    return [0.5 if _text(c)[:1] == ans[:1] else 0.0 for c, ans in zip(completions, answer, strict=True)]


def digit_fraction_reward(completions, **kwargs) -> list[float]:
    """Dense shaping reward: the fraction of characters that are digits (0.0 for an empty completion).

    Gives every group a spread of rewards even under a random policy, so tiny runs get a gradient from step one.
    """
    out = []
    for completion in completions:
        text = _text(completion)
        out.append(sum(ch.isdigit() for ch in text) / len(text) if text else 0.0)
    return out
