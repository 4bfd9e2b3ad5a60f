"""Held-out evaluation of a policy on the synthetic multi-step task: answer accuracy, step accuracy, Distinct-2."""

from __future__ import annotations

import torch

from . import testkit
from .core.diversity import distinct_n
from .prm.segmentation import segment_completion


@torch.no_grad()
def evaluate_multistep(model, tokenizer, problems, *, max_new_tokens: int = 20, batch_size: int = 128) -> dict:
    """Greedy completions for ``problems`` (rows with ``prompt`` and ``answer``) scored by the rule-based rewards.

    Returns ``answer_acc`` (last line is the answer), ``step_acc`` (fraction of steps the step reward scores 1),
    ``steps_per_completion``, ``distinct_2`` (over the completions' tokens) and three ``samples``.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    texts, steps, token_rows = [], [], []
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        prompts = chunk["prompt"] if isinstance(chunk, dict) else [r["prompt"] for r in chunk]
        side = tokenizer.padding_side
        tokenizer.padding_side = "left"
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        tokenizer.padding_side = side
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            ids = [t for t in row if t != tokenizer.pad_token_id]
            token_rows.append([t for t in ids if t != tokenizer.eos_token_id])
            texts.append(tokenizer.decode(ids, skip_special_tokens=True))
            steps.append(segment_completion(tokenizer, ids).texts)
    answers = [r["answer"] for r in problems]
    prompts = [r["prompt"] for r in problems]
    scores = [x for row in testkit.arithmetic_step_reward(prompts, None, steps, answers) for x in row]
    model.train(was_training)
    return {
        "answer_acc": sum(testkit.final_answer_reward(texts, answer=answers)) / max(len(texts), 1),
        "step_acc": sum(scores) / max(len(scores), 1),
        "steps_per_completion": len(scores) / max(len(texts), 1),
        "distinct_2": distinct_n(token_rows, 2),
        "samples": [f"{p} -> {t!r}" for p, t in zip(prompts[:3], texts[:3])],
    }
