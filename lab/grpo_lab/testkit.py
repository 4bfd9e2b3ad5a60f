"""Offline test kit: a character-level tokenizer, a tiny random causal LM and a synthetic arithmetic task.

Nothing here touches the Hugging Face Hub. Tests, recipes and benchmarks build their models with these helpers and save
them to a local folder, because TRL re-loads the reference model from ``config._name_or_path``.

Example:
    >>> from grpo_lab import testkit
    >>> path = testkit.save_tiny_model("/tmp/tiny")             # tokenizer + random tiny Llama, saved locally
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
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every char, newlines too
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )


def tiny_config(
    tokenizer,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_key_value_heads: int | None = None,
    max_position_embeddings: int = 256,
    **kwargs,
):
    """A Llama-architecture config sized for CPU tests (``num_key_value_heads``: grouped-query attention; None: one
    per head).

    Llama rather than Qwen2: transformers 5 forces its own ``Qwen2Tokenizer`` on any folder whose config says
    ``qwen2``, which would silently replace the character tokenizer when TRL or a PRM re-loads it from disk.
    """
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads if num_key_value_heads is None else num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **kwargs,
    )


def build_tiny_model(
    tokenizer,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    max_position_embeddings: int = 256,
):
    """A random causal LM (Llama architecture, about 0.1M parameters at the defaults) for CPU tests.
    ``max_position_embeddings``: raise it for long prompts (a chat template that renders tool schemas)."""
    import torch
    from transformers import LlamaForCausalLM

    config = tiny_config(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
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
        out.append(1.0 if match is not None and match.group(1) == str(ans).strip() else 0.0)  # int columns too
    return out


def first_char_reward(completions, answer, **kwargs) -> list[float]:
    """Shaping reward: 0.5 when the first character of the completion is the first character of the answer."""
    return [0.5 if _text(c)[:1] == str(ans)[:1] else 0.0 for c, ans in zip(completions, answer, strict=True)]


def digit_fraction_reward(completions, **kwargs) -> list[float]:
    """Dense shaping reward: the fraction of characters that are digits (0.0 for an empty completion).

    Gives every group a spread of rewards even under a random policy, so tiny runs get a gradient from step one.
    """
    out = []
    for completion in completions:
        text = _text(completion)
        out.append(sum(ch.isdigit() for ch in text) / len(text) if text else 0.0)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Multi-step arithmetic: one line "a op b=c" per step, the answer alone on the last line.
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_EQUATION = re.compile(r"^\s*(-?\d+)\s*([+\-*])\s*(-?\d+)\s*=\s*(-?\d+)\s*$")


def multistep_dataset(n: int, *, seed: int = 0, num_ops: int = 2, max_operand: int = 9, ops: str = "+-") -> Dataset:
    """Chained problems such as ``"3+4-2="``; columns ``prompt``, ``answer`` and ``solution``.

    The solution writes one step per line, ``"3+4=7\\n7-2=5\\n5"``: each intermediate result feeds the next line and the
    last line is the answer (the format :func:`arithmetic_step_reward` checks).
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        operands = [rng.randint(0, max_operand) for _ in range(num_ops + 1)]
        operators = [rng.choice(ops) for _ in range(num_ops)]
        value, lines = operands[0], []
        for op, b in zip(operators, operands[1:], strict=True):
            result = _OPS[op](value, b)
            lines.append(f"{value}{op}{b}={result}")
            value = result
        prompt = str(operands[0]) + "".join(f"{op}{b}" for op, b in zip(operators, operands[1:], strict=True)) + "="
        rows.append({"prompt": prompt, "answer": str(value), "solution": "\n".join([*lines, str(value)])})
    return Dataset.from_list(rows)


_PROBLEM = re.compile(r"^\s*(-?\d+)((?:[+\-*]\d+)+)\s*=\s*$")
_TERM = re.compile(r"([+\-*])(\d+)")


def solution_lines(prompt: str) -> list[str] | None:
    """The reference steps of a :func:`multistep_dataset` prompt (``"3+4-2="`` -> ``["3+4=7", "7-2=5", "5"]``)."""
    match = _PROBLEM.match(_text(prompt))
    if match is None:
        return None
    value, lines = int(match.group(1)), []
    for op, b in _TERM.findall(match.group(2)):
        result = _OPS[op](value, int(b))
        lines.append(f"{value}{op}{b}={result}")
        value = result
    return [*lines, str(value)]


def arithmetic_step_reward(prompts, completions, steps, answer, **kwargs) -> list[list[float]]:
    """Rule-based step reward of the multi-step task, one score per step.

    Step j scores 1.0 when it is the j-th line of the reference chain: a line ``a op b=c`` whose operands follow the
    problem (``a`` the running value, ``op b`` the next term) and whose arithmetic is right, or, last, the answer alone.
    Anything else scores 0.0, including a correct but off-path equation (a PRM that only checked arithmetic would be
    gamed by repeating one memorised equation) and lines past the end of the chain. Lines are parsed with regular
    expressions; nothing is evaluated.
    """
    out = []
    for prompt, completion_steps, ans in zip(prompts, steps, answer, strict=True):
        reference = solution_lines(prompt) or [ans]
        scores = []
        for j, step in enumerate(completion_steps):
            if j >= len(reference):
                scores.append(0.0)
                continue
            expected = reference[j]
            match = _EQUATION.match(step)
            if match is not None:
                a, op, b, c = match.groups()
                ok = f"{int(a)}{op}{int(b)}={int(c)}" == expected and _OPS[op](int(a), int(b)) == int(c)
            else:
                ok = step.strip() == expected
            scores.append(1.0 if ok else 0.0)
        out.append(scores)
    return out


def step_accuracy_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """Fraction of a completion's lines (steps) that :func:`arithmetic_step_reward` scores 1; 0.0 when empty.

    A sequence-level view of step accuracy, for logging it during training (give it reward weight 0).
    """
    steps = [[line for line in _text(c).split("\n") if line.strip()] for c in completions]
    scores = arithmetic_step_reward([_text(p) for p in prompts], completions, steps, answer)
    return [sum(row) / len(row) if row else 0.0 for row in scores]


def final_answer_reward(completions, answer, **kwargs) -> list[float]:
    """Outcome reward of the multi-step task: 1.0 when the last non-blank line is the answer."""
    out = []
    for completion, ans in zip(completions, answer, strict=True):
        lines = [line.strip() for line in _text(completion).split("\n") if line.strip()]
        out.append(1.0 if lines and lines[-1] == str(ans).strip() else 0.0)  # int columns too
    return out


def build_bpe_tokenizer(corpus: list[str], *, vocab_size: int = 300):
    """A byte-level BPE tokenizer trained offline on ``corpus`` (merges such as ``".\\n"`` happen, like real LLMs)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, padding_side="left")
