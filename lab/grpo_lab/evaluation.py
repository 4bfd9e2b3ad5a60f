"""Held-out evaluation that does not depend on the training reward.

Reward-independent metrics (docs/results.md reports them; ``../shared/spec/EVIDENCE.md`` says why):

- :func:`pass_at_k_curve`: the unbiased pass@k of Chen et al. 2021 (eq. 1) for k = 1, 2, 4, ..., n from n samples per
  prompt, the curve rather than one point (collapse shows at large k);
- :func:`distinct_correct`: per prompt, the number of *different* correct completions among the n samples (after a
  normalisation that says when two completions are the same solution);
- :func:`proxy_gold_gap`: where the training reward is a proxy, the gold score beside it and their gap;
- :func:`sampled_evaluation`: all three from a model's sampled completions on held-out prompts, and
  :class:`SampledEvaluationCallback`, the same at chosen training steps; :func:`greedy_accuracy`;
- :func:`evaluate_multistep`: greedy answer and step accuracy on the synthetic multi-step task.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import TrainerCallback

from trl_grpo_ext.core.diversity import distinct_n, pass_at_k
from trl_grpo_ext.prm.segmentation import segment_completion

from . import testkit


def pass_at_k_ks(n: int) -> list[int]:
    """k = 1, 2, 4, ... up to n (n itself included): the points of the pass@k curve from n samples."""
    if n < 1:
        raise ValueError(f"pass@k needs n >= 1 samples per prompt, got n={n}.")
    ks = [2**i for i in range(int(math.log2(n)) + 1)]
    return ks if ks[-1] == n else [*ks, n]


def pass_at_k_curve(correct_counts: Sequence[int], n: int, ks: Sequence[int] | None = None) -> dict[int, float]:
    """Mean over prompts of the unbiased pass@k, ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code", eq. 1), for each k of ``ks`` (default :func:`pass_at_k_ks`).

    Args:
        correct_counts: per prompt, c = how many of its n samples are correct.
        n: samples per prompt (the same for every prompt).
        ks: the k to report, each in [1, n].

    Returns:
        {k: mean pass@k}.
    """
    if not correct_counts:
        raise ValueError("pass_at_k_curve needs at least one prompt.")
    ks = pass_at_k_ks(n) if ks is None else list(ks)
    return {k: statistics.fmean(pass_at_k(n, int(c), k) for c in correct_counts) for k in ks}


def distinct_correct(
    completions: Sequence[Sequence[str]],
    correct: Sequence[Sequence[bool]],
    *,
    normalise: Callable[[str], Any] = str.strip,
) -> list[int]:
    """Per prompt, the number of different correct completions among its samples.

    Args:
        completions: per prompt, its n sampled completions (text).
        correct: per prompt, whether each completion is correct (the gold verifier, not a proxy reward).
        normalise: maps a completion to the solution it stands for; two correct completions count once when their
            normalised forms are equal (default: strip white space).
    """
    if len(completions) != len(correct):
        raise ValueError(f"{len(completions)} prompts of completions but {len(correct)} of correctness flags.")
    counts = []
    for i, (texts, flags) in enumerate(zip(completions, correct, strict=True)):
        if len(texts) != len(flags):
            raise ValueError(f"prompt {i}: {len(texts)} completions but {len(flags)} correctness flags.")
        counts.append(len({normalise(t) for t, ok in zip(texts, flags, strict=True) if ok}))
    return counts


def proxy_gold_gap(proxy: Sequence[float], gold: Sequence[float]) -> dict[str, float]:
    """Mean proxy reward, mean gold score and ``gap = proxy - gold`` over the same completions (design document sec.
    8.2: a proxy that keeps rising while gold falls is the policy exploiting the proxy)."""
    if len(proxy) != len(gold) or not proxy:
        raise ValueError(f"proxy and gold need the same, non-zero length; got {len(proxy)} and {len(gold)}.")
    mean_proxy, mean_gold = statistics.fmean(proxy), statistics.fmean(gold)
    return {"proxy": mean_proxy, "gold": mean_gold, "gap": mean_proxy - mean_gold}


@torch.no_grad()
def sample_completions(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    samples: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    batch_size: int = 512,
) -> list[list[str]]:
    """``samples`` completions per prompt (text, special tokens dropped), sampled at ``temperature`` from the full
    distribution (no top-k / top-p); the global random state is restored afterwards, so training is unaffected."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    repeated = [p for p in prompts for _ in range(samples)]
    texts: list[str] = []
    side = tokenizer.padding_side
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        tokenizer.padding_side = "left"
        for start in range(0, len(repeated), batch_size):
            enc = tokenizer(
                repeated[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(device)
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        torch.random.set_rng_state(state)
        tokenizer.padding_side = side
        model.train(was_training)
    return [texts[i * samples : (i + 1) * samples] for i in range(len(prompts))]


@torch.no_grad()
def greedy_completions(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int, batch_size: int = 512):
    """One greedy completion per prompt (text, special tokens dropped)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    side = tokenizer.padding_side
    texts: list[str] = []
    try:
        tokenizer.padding_side = "left"
        for start in range(0, len(prompts), batch_size):
            enc = tokenizer(
                list(prompts[start : start + batch_size]), return_tensors="pt", padding=True, add_special_tokens=False
            ).to(device)
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return texts


def greedy_accuracy(
    model, tokenizer, prompts: Sequence[str], *, gold: Callable[[list[str], list[str]], list[bool]], max_new_tokens: int
) -> float:
    """The fraction of prompts whose greedy completion ``gold`` accepts."""
    completions = greedy_completions(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
    return statistics.fmean(float(bool(x)) for x in gold(list(prompts), completions))


def sampled_evaluation(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    gold: Callable[[list[str], list[str]], list[bool]],
    samples: int = 64,
    temperature: float = 1.0,
    max_new_tokens: int = 32,
    seed: int = 0,
    normalise: Callable[[str], Any] = str.strip,
    proxy: Callable[[list[str], list[str]], list[float]] | None = None,
) -> dict[str, Any]:
    """Reward-independent held-out numbers from ``samples`` completions per prompt.

    Args:
        gold: ``gold(prompts, completions) -> [bool]``, whether each completion is correct (one entry per completion,
            prompts repeated alongside).
        proxy: the training reward when it is a proxy of ``gold``: ``proxy(prompts, completions) -> [float]``.

    Returns:
        ``pass_at_k`` ({k: value} for k = 1, 2, 4, ..., ``samples``), ``distinct_correct`` (mean over prompts),
        ``distinct_correct_per_prompt``, ``gold`` (mean correctness of the samples), and with ``proxy`` also
        ``proxy`` and ``gap``.
    """
    sampled = sample_completions(
        model, tokenizer, prompts, samples=samples, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed
    )
    flat_prompts = [p for p in prompts for _ in range(samples)]
    flat = [t for row in sampled for t in row]
    flags = [bool(x) for x in gold(flat_prompts, flat)]
    per_prompt = [flags[i * samples : (i + 1) * samples] for i in range(len(prompts))]
    distinct = distinct_correct(sampled, per_prompt, normalise=normalise)
    result: dict[str, Any] = {
        "pass_at_k": pass_at_k_curve([sum(f) for f in per_prompt], samples),
        "distinct_correct": statistics.fmean(distinct),
        "distinct_correct_per_prompt": distinct,
        "gold": statistics.fmean(float(f) for f in flags),
    }
    if proxy is not None:
        gap = proxy_gold_gap([float(x) for x in proxy(flat_prompts, flat)], [float(f) for f in flags])
        result.update(proxy=gap["proxy"], gap=gap["gap"])
    return result


class SampledEvaluationCallback(TrainerCallback):
    """:func:`sampled_evaluation` at the end of the optimizer steps in ``steps``, kept in ``results[step]``; every
    process evaluates (under FSDP / ZeRO-3 a forward is a collective), the main process keeps the numbers.

    Example:
        >>> callback = SampledEvaluationCallback([100, 200], tokenizer, prompts, gold=my_verifier, samples=64)
        >>> trainer.add_callback(callback); trainer.train(); callback.results[200]["pass_at_k"][64]
    """

    def __init__(self, steps: Sequence[int], tokenizer, prompts: Sequence[str], **kwargs):
        self.steps = set(steps)
        self.tokenizer = tokenizer
        self.prompts = list(prompts)
        self.kwargs = kwargs
        self.results: dict[int, dict[str, Any]] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.steps:
            result = sampled_evaluation(model, self.tokenizer, self.prompts, **self.kwargs)
            if state.is_world_process_zero:
                self.results[state.global_step] = result


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


class GoldRecorder:
    """The gold score of the completions a run trains on, step by step, kept aside: wraps a training reward function
    so that each call also scores its completions with ``gold`` (never seen by the trainer, which gets the wrapped
    function's rewards unchanged). ``per_step[step]``: the gold values of the completions generated at that optimizer
    step (1-based; this process's share). Used to place gold's peak beside the hack detector's alarm (the default
    run, benchmarks/hack_study.py).

    Example:
        >>> recorder = GoldRecorder(length_bias.gold_reward)
        >>> trainer = GRPOExtTrainer(..., reward_funcs=[recorder.wrap(length_bias.proxy_reward)])
        >>> trainer.train(); gold_peak(recorder.means())
    """

    def __init__(self, gold: Callable[..., list[float]]):
        self.gold = gold
        self.per_step: dict[int, list[float]] = {}

    def wrap(self, reward: Callable) -> Callable:
        def reward_func(completions, **kwargs):
            state = kwargs.get("trainer_state")
            step = state.global_step + 1 if state is not None else 1
            self.per_step.setdefault(step, []).extend(float(g) for g in self.gold(completions, **kwargs))
            return reward(completions, **kwargs)

        reward_func.__name__ = getattr(reward, "__name__", "reward")
        return reward_func

    def means(self) -> dict[int, float]:
        """step -> the mean gold of the completions generated at that step."""
        return {step: statistics.fmean(values) for step, values in sorted(self.per_step.items()) if values}


def smoothed_gold(means: dict[int, float], *, smooth: int = 5) -> tuple[list[int], list[float]]:
    """A run's per-step gold (:meth:`GoldRecorder.means`) in step order and its centred mean over ``smooth`` measured
    steps (fewer at the ends): one training batch is noisy."""
    steps = sorted(means)
    values = [means[s] for s in steps]
    half = smooth // 2
    return steps, [statistics.fmean(values[max(0, i - half) : i + half + 1]) for i in range(len(values))]


def gold_peak(means: dict[int, float], *, smooth: int = 5) -> tuple[int, float, int | None]:
    """Gold's peak in a run's per-step gold: the maximum of :func:`smoothed_gold`. Returns (the peak's step, the
    smoothed gold there, the first later step where the smoothed gold is under half of it, or None)."""
    if not means:
        raise ValueError("gold_peak needs at least one measured step.")
    steps, smoothed = smoothed_gold(means, smooth=smooth)
    top = max(range(len(smoothed)), key=smoothed.__getitem__)
    halving = next((steps[i] for i in range(top, len(smoothed)) if smoothed[i] < smoothed[top] / 2), None)
    return steps[top], smoothed[top], halving
