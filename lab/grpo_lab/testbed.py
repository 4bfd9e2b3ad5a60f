"""The learning testbed: a task where GRPO learns on 2 CPU cores, and then collapses.

Task: add a two-digit and a one-digit number, ``"47+8="`` -> ``"55"``; 900 problems, about one in five held out (179;
a hash of the prompt decides, so the split is the same on every machine). The reward is a verifier: 1.0 when the
completion is exactly the sum.

Warm start: a tiny random Llama (128 wide, 4 layers, character tokenizer) fine-tuned with TRL's ``SFTTrainer`` on
answers from a *careless teacher*, who is right 30% of the time, one too high 40%, two too high 15% and one too low
15% (:data:`TEACHER_OFFSETS`). Supervised learning reproduces the teacher: the most likely answer is wrong, so greedy
accuracy starts low, while a correct answer is among 8 samples for about 90% of the problems (pass@8). Fresh teacher
samples (one epoch over 40,000 rows) make the model learn the teacher's *distribution* instead of memorising which
rows were wrong, so the warm start is the same kind of model on every seed and machine (not a knife's edge).

GRPO from there learns: the verifier rewards the minority correct answer and the policy moves onto it (greedy accuracy
rises by tens of points on every seed; docs/results.md has the numbers). Then the symptoms the anti-collapse tools
target show up: token entropy falls several-fold, the 8 samples of a prompt turn into copies of one answer
(within-prompt Distinct-2 falls), and pass@8 stays where it was while pass@1 climbs (RL sharpens what the model already
had; it does not widen it).

Everything here is offline: the model and tokenizer are built locally, the data is generated.

Example:
    >>> from grpo_lab import testbed
    >>> path = testbed.warm_start("/tmp/testbed", seed=0)            # cached after the first call (~45 s on 2 cores)
    >>> train = testbed.addition_problems(20_000, seed=1)            # columns: prompt, answer
    >>> trainer = GRPOExtTrainer(model=path, reward_funcs=[testbed.answer_reward],
    ...                          args=GRPOExtConfig(**testbed.grpo_settings(), output_dir="out"), train_dataset=train)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import statistics
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback

from trl_grpo_ext.core.diversity import distinct_n_batch, pass_at_k, repetition_rate

from . import testkit
from .evaluation import greedy_completions, proxy_gold_gap

#: The careless teacher's answer = the sum + an offset drawn with these probabilities.
TEACHER_OFFSETS: dict[int, float] = {0: 0.30, 1: 0.40, 2: 0.15, -1: 0.15}
#: Longest completion the task needs: three digits and the end-of-sequence token, plus a margin of two.
MAX_COMPLETION_LENGTH = 6
#: Samples per held-out prompt for pass@k, entropy and Distinct-2.
EVAL_SAMPLES = 8
#: The default tool combination of ``recipes/math_grpo.py`` on this testbed (GRPOExtConfig fields): a token clip, a KL
#: controller and entropy control in the same step. KL-Cov acts on the off-policy mini-batches (ratio 2e-2: about 3
#: tokens of the 192 per step; the paper's 2e-3 selects at most one here), adaptive KL anchors to the warm start with
#: beta capped at 0.3, AEPO steers entropy to 0.2 nats (about half the warm start's). The KL target 0.1 is out of reach
#: on this task, so beta climbs until its cap, where the anchor toward the warm start's wrong answers would cost
#: accuracy at the default cap of 1.0. No sample filter: PF-PPO answers an unreliable reward and this testbed's
#: verifier is exact. These values were chosen on all 179 held-out prompts before the validation / test halves
#: existed; docs/results.md says which results are measured where.
DEFAULT_TOOLS: dict[str, Any] = {
    "token_clip": "kl_cov",
    "kl_cov_ratio": 2e-2,
    "beta": 0.04,
    "kl_control": "adaptive",
    "kl_target": 0.1,
    "kl_horizon": 2000,
    "kl_beta_max": 0.3,
    "entropy_control": "aepo",
    "aepo_target_entropy": 0.2,
}
#: Every family at once, one member each, as the default was before it dropped the filter and capped beta: KL-Cov,
#: adaptive KL (beta cap 1.0), PF-PPO best-worst, AEPO. The ``singles`` and ``ablation`` studies measure it against
#: each member alone and without each member.
ALL_ON: dict[str, Any] = {
    **{k: v for k, v in DEFAULT_TOOLS.items() if k != "kl_beta_max"},
    "sample_filter": "best_worst",
}


def all_problems() -> list[str]:
    """The 900 prompts ``"a+b="`` with a in 10..99 and b in 0..9, in a fixed order."""
    return [f"{a}+{b}=" for a in range(10, 100) for b in range(10)]


def is_heldout(prompt: str) -> bool:
    """Whether ``prompt`` belongs to the held-out split (one prompt in five, by a hash: identical everywhere)."""
    return int(hashlib.sha1(prompt.encode()).hexdigest()[:8], 16) % 5 == 0


def solve(prompt: str) -> int:
    """The sum asked by ``"a+b="`` (parsed, never evaluated)."""
    left, right = prompt.rstrip("=").split("+")
    return int(left) + int(right)


#: Held-out splits of :func:`addition_problems`: all held-out prompts, or one of their two halves.
HELDOUT_SPLITS = ("heldout", "validation", "test")


def heldout_half(prompt: str) -> str:
    """``"validation"`` or ``"test"``: the half of the held-out prompts ``prompt`` belongs to (a second hash; the same
    on every machine). Validation is for choices (defaults, ratios, targets), test for reported results."""
    if not is_heldout(prompt):
        raise ValueError(f"{prompt!r} is a training prompt, not a held-out one.")
    return "validation" if int(hashlib.sha1(f"half|{prompt}".encode()).hexdigest()[:8], 16) % 2 == 0 else "test"


def addition_problems(n: int | None = None, *, seed: int = 0, split: str = "train") -> Dataset:
    """Rows with ``prompt`` and ``answer`` (a string).

    ``split="train"``: ``n`` prompts drawn with replacement from the 720 training prompts (a stream for GRPO).
    ``split="heldout"``: the held-out prompts, all 179 of them in a seeded order, or the first ``n`` of that order;
    ``"validation"`` / ``"test"``: the same for one half of them (:func:`heldout_half`).
    """
    if split not in ("train", *HELDOUT_SPLITS):
        raise ValueError(f"split must be 'train' or one of {HELDOUT_SPLITS}, got {split!r}.")
    pool = [p for p in all_problems() if is_heldout(p) == (split != "train")]
    if split in ("validation", "test"):
        pool = [p for p in pool if heldout_half(p) == split]
    rng = random.Random(seed)
    if split == "train":
        if n is None:
            raise ValueError("addition_problems(split='train') needs n, the number of rows to draw.")
        prompts = [rng.choice(pool) for _ in range(n)]
    else:
        rng.shuffle(pool)
        prompts = pool if n is None else pool[:n]
    return Dataset.from_list([{"prompt": p, "answer": str(solve(p))} for p in prompts])


def careless_answer(prompt: str, rng: random.Random) -> str:
    """One answer of the careless teacher: the sum plus an offset drawn from :data:`TEACHER_OFFSETS`."""
    offset = rng.choices(list(TEACHER_OFFSETS), weights=list(TEACHER_OFFSETS.values()))[0]
    return str(solve(prompt) + offset)


def teacher_rows(n: int, *, seed: int, salt: int, answer, eos_token: str = testkit.EOS) -> Dataset:
    """``n`` prompt-completion rows for TRL's ``SFTTrainer``: training prompts (:func:`addition_problems`, ``seed``)
    and a teacher's answers, ``answer(prompt, rng)`` with ``rng`` seeded by ``salt + seed`` (each teacher its own salt,
    so that two teachers' draws differ)."""
    rng = random.Random(salt + seed)
    prompts = addition_problems(n, seed=seed, split="train")["prompt"]
    return Dataset.from_list([{"prompt": p, "completion": answer(p, rng) + eos_token} for p in prompts])


def sft_dataset(n: int, *, seed: int = 0, eos_token: str = testkit.EOS) -> Dataset:
    """``n`` prompt-completion rows for TRL's ``SFTTrainer``: training prompts and the careless teacher's answers."""
    return teacher_rows(n, seed=seed, salt=10_007, answer=careless_answer, eos_token=eos_token)


def _text(completion: Any) -> str:
    if isinstance(completion, list):  # conversational
        return completion[-1]["content"] if completion else ""
    return completion


def answer_reward(completions, answer, **kwargs) -> list[float]:
    """The verifier: 1.0 when the completion, stripped of white space, is exactly the answer; else 0.0."""
    return [1.0 if _text(c).strip() == str(a) else 0.0 for c, a in zip(completions, answer, strict=True)]


#: The SFT settings of the addition task's warm starts (this testbed's and the testbeds built on its task).
SFT_SETTINGS: dict[str, Any] = {"learning_rate": 2e-3, "batch_size": 64, "hidden_size": 128, "num_layers": 4}


def warm_start(
    cache_dir: str,
    *,
    seed: int = 0,
    examples: int = 40_000,
    learning_rate: float = SFT_SETTINGS["learning_rate"],
    batch_size: int = SFT_SETTINGS["batch_size"],
    hidden_size: int = SFT_SETTINGS["hidden_size"],
    num_layers: int = SFT_SETTINGS["num_layers"],
    use_cpu: bool = True,
    log=print,
) -> str:
    """The SFT warm start for ``seed``, built once into ``cache_dir`` and reused; returns its path.

    A random tiny Llama (:func:`grpo_lab.testkit.build_tiny_model`) trained by TRL's ``SFTTrainer`` for one
    epoch on ``examples`` fresh rows of :func:`sft_dataset` (global batch ``batch_size``, linear decay from
    ``learning_rate``).
    Under ``accelerate`` / ``torchrun`` call it on every process, like any trainer: they train together and the main
    process writes the folder (to a temporary name, renamed when complete).
    """
    return sft_warm_start(
        cache_dir,
        kind="careless",
        dataset=sft_dataset,
        seed=seed,
        examples=examples,
        learning_rate=learning_rate,
        batch_size=batch_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        use_cpu=use_cpu,
        log=lambda path: log(
            f"[testbed] SFT warm start (seed {seed}, {examples} careless-teacher rows), cached in {path}"
        ),
    )


def sft_warm_start(
    cache_dir: str,
    *,
    kind: str,
    dataset,
    seed: int,
    examples: int,
    learning_rate: float,
    batch_size: int,
    hidden_size: int,
    num_layers: int,
    use_cpu: bool,
    log=lambda path: None,
) -> str:
    """A tiny random Llama fine-tuned by TRL's ``SFTTrainer`` for one epoch on ``dataset(examples, seed=seed)``
    (prompt-completion rows, built only when the folder is missing), saved with its tokenizer to a folder of
    ``cache_dir`` named after ``kind`` and every setting, and reused when it exists; returns its path.

    Every process trains (call it on every process under ``accelerate`` / ``torchrun``); the main one writes the folder
    to a temporary name and renames it when complete, so a half-written folder is never taken for a warm start.
    """
    from accelerate import PartialState
    from trl import SFTConfig, SFTTrainer

    name = f"{kind}-h{hidden_size}-l{num_layers}-n{examples}-lr{learning_rate:g}-b{batch_size}-s{seed}-v1"
    path = os.path.join(cache_dir, name)
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    state = PartialState()
    tokenizer = testkit.build_char_tokenizer()
    model = testkit.build_tiny_model(tokenizer, hidden_size=hidden_size, num_layers=num_layers, seed=seed)
    args = SFTConfig(
        output_dir=f"{path}-run",
        num_train_epochs=1,
        learning_rate=learning_rate,
        per_device_train_batch_size=max(1, batch_size // state.num_processes),
        use_cpu=use_cpu,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=seed,
    )
    if state.is_main_process:
        log(path)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset(examples, seed=seed), processing_class=tokenizer)
    trainer.train()
    tmp = f"{path}.tmp-{os.getpid()}"
    trainer.save_model(tmp)  # writes on the main process only
    if state.is_main_process:
        tokenizer.save_pretrained(tmp)
        if os.path.exists(os.path.join(path, "config.json")):  # another run finished it meanwhile
            import shutil

            shutil.rmtree(tmp)
        else:
            os.replace(tmp, path)  # a half-written folder is never mistaken for a finished warm start
    state.wait_for_everyone()
    return path


def teacher_testbed(name: str, *, kind: str, salt: int, answer, max_completion_length: int, max_steps: int):
    """The three functions every addition-task testbed with its own teacher defines: ``sft_dataset(n, *, seed,
    eos_token)`` (training prompts and ``answer(prompt, rng)``'s answers, seeded by ``salt + seed``),
    ``warm_start(cache_dir, *, seed, examples, use_cpu, log)`` (the SFT warm start in a folder named after ``kind``,
    the addition testbed's model size and SFT settings) and ``grpo_settings(**overrides)`` (the addition testbed's
    GRPO settings with this ``max_completion_length`` and ``max_steps``). Returns them in that order."""

    def sft_dataset(n: int, *, seed: int = 0, eos_token: str = testkit.EOS) -> Dataset:
        return teacher_rows(n, seed=seed, salt=salt, answer=answer, eos_token=eos_token)

    def warm_start(cache_dir: str, *, seed: int = 0, examples: int = 40_000, use_cpu: bool = True, log=print) -> str:
        return sft_warm_start(
            cache_dir, kind=kind, dataset=sft_dataset, seed=seed, examples=examples, use_cpu=use_cpu,
            log=lambda path: log(f"[{name}] SFT warm start (seed {seed}, {examples} rows), cached in {path}"),
            **SFT_SETTINGS,
        )  # fmt: skip

    def testbed_settings(**overrides) -> dict[str, Any]:
        return grpo_settings(**{"max_completion_length": max_completion_length, "max_steps": max_steps, **overrides})

    for func, what in ((sft_dataset, "SFT rows"), (warm_start, "SFT warm start"), (testbed_settings, "GRPO settings")):
        func.__doc__ = f"The {name} testbed's {what} (:func:`grpo_lab.testbed.teacher_testbed`)."
    return sft_dataset, warm_start, testbed_settings


def grpo_settings(**overrides) -> dict[str, Any]:
    """The testbed's GRPO budget and sampling, as ``GRPOExtConfig`` fields (``overrides`` on top).

    32 prompts x 8 completions are generated at once and used in 4 optimizer steps of 64 completions
    (``steps_per_generation=4``: the off-policy mini-batch regime of verl and of the Clip-Cov / KL-Cov paper, where
    TRL's PPO ratio clip is active); temperature 0.7; 600 optimizer steps, the learning rate decaying linearly from
    2e-4 to 0 (TRL's default schedule, so that the last model is not one draw from a policy still moving at full
    rate; docs/results.md gives the spread between checkpoints).
    """
    settings = dict(
        per_device_train_batch_size=64,
        steps_per_generation=4,
        num_generations=8,
        max_completion_length=MAX_COMPLETION_LENGTH,
        temperature=0.7,
        learning_rate=2e-4,
        lr_scheduler_type="linear",
        max_steps=600,
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=10,
    )
    settings.update(overrides)
    return settings


@torch.no_grad()
def evaluate(
    model,
    tokenizer,
    problems: Dataset,
    *,
    temperature: float = 0.7,
    samples: int = EVAL_SAMPLES,
    sampled_problems: int | None = None,
    seed: int = 0,
    max_new_tokens: int = MAX_COMPLETION_LENGTH,
    reward=None,
    proxy=None,
) -> dict[str, Any]:
    """Held-out numbers of a policy on ``problems`` (rows with ``prompt`` and ``answer``).

    ``reward`` says whether a completion is correct (TRL reward signature, 1.0 = correct; default
    :func:`answer_reward`); any offline task with an ``answer`` column can be evaluated this way.

    Returns ``answer_acc`` (greedy decoding, all problems), and from ``samples`` completions at ``temperature`` for
    the first ``sampled_problems`` problems (default: all of them): ``pass_at_1`` and ``pass_at_8`` (the unbiased
    estimator of Chen et al. 2021, with k = ``samples`` for the second), ``entropy`` (mean token entropy of the sampled
    completions, in nats, of the distribution they were sampled from: logits / temperature, as TRL logs it),
    ``distinct_2`` (Distinct-2 of the ``samples`` completions of a problem, averaged over problems) and three
    ``samples``.

    ``proxy``: where training optimises a proxy of ``reward`` (TRL reward signature; e.g.
    :func:`grpo_lab.testbeds.length_bias.proxy_reward`), the same sampled completions are also scored by it:
    ``proxy`` (its mean), ``gap`` (``proxy`` minus the mean gold score, i.e. ``pass_at_1``;
    :func:`grpo_lab.evaluation.proxy_gold_gap`), ``length`` (mean characters of a completion) and ``repetition``
    (mean fraction of a completion's character 3-grams that repeat an earlier one).
    """
    reward = answer_reward if reward is None else reward
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    prompts, answers = list(problems["prompt"]), list(problems["answer"])
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        greedy = greedy_completions(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=len(prompts))
        accuracy = statistics.mean(float(r >= 1.0) for r in reward(prompts=prompts, completions=greedy, answer=answers))

        sub = prompts if sampled_problems is None else prompts[:sampled_problems]
        repeated = [p for p in sub for _ in range(samples)]
        enc = tokenizer(repeated, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        torch.random.set_rng_state(generator_state)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    ids = out.sequences[:, enc["input_ids"].shape[1] :]  # (N, T)
    # Tokens up to and including the first end-of-sequence token are the completion (TRL's completion mask).
    is_eos = ids == tokenizer.eos_token_id
    after_eos = (is_eos.long().cumsum(1) - is_eos.long()) > 0
    mask = ~after_eos  # (N, T)
    logps = torch.log_softmax(torch.stack(out.logits, 1).float() / temperature, dim=-1)  # (N, T, V)
    token_entropy = -(logps.exp() * logps).nansum(-1)  # (N, T)
    entropy = float((token_entropy * mask).sum() / mask.sum().clamp(min=1))
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    repeated_answers = [a for a in answers[: len(sub)] for _ in range(samples)]
    correct = [float(r >= 1.0) for r in reward(prompts=repeated, completions=texts, answer=repeated_answers)]
    counts = [int(sum(correct[i * samples : (i + 1) * samples])) for i in range(len(sub))]
    content = mask & ~is_eos  # n-grams of the answer itself, without the end token
    result = {
        "answer_acc": accuracy,
        "pass_at_1": statistics.mean(pass_at_k(samples, c, 1) for c in counts),
        f"pass_at_{samples}": statistics.mean(pass_at_k(samples, c, samples) for c in counts),
        "entropy": entropy,
        "distinct_2": distinct_n_batch(ids, content, 2, group_size=samples),
    }
    if proxy is not None:
        scores = [float(r) for r in proxy(prompts=repeated, completions=texts, answer=repeated_answers)]
        gap = proxy_gold_gap(scores, correct)
        result.update(
            proxy=gap["proxy"],
            gap=gap["gap"],
            length=statistics.fmean(len(t) for t in texts),
            repetition=statistics.fmean(repetition_rate(list(t), 3) for t in texts),
        )
    result["samples"] = [f"{p} -> {t!r}" for p, t in zip(prompts[:3], greedy[:3])]
    return result


@contextlib.contextmanager
def whole_parameters(model):
    """``model`` with every parameter whole on this process inside the block, for :func:`evaluate`.

    A model loaded while a DeepSpeed ZeRO-3 config is active (``from_pretrained`` under ``zero.Init``) holds only
    this process's partition of each parameter and no engine to gather them: its parameters are gathered here (a
    collective: every process enters the block). Anything else is left as it is: a model trained under ZeRO-3 or
    FSDP gathers its parameters in every forward (every process must then evaluate too), and one process or DDP holds
    them whole.
    """
    partitioned = [p for p in model.parameters() if hasattr(p, "ds_id")]
    engine_managed = any(hasattr(module, "ds_grads_remaining") for module in model.modules())
    if not partitioned or engine_managed:
        yield model
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(partitioned):
        yield model


class CheckpointEvaluator(TrainerCallback):
    """Held-out numbers during training: ``evaluate(model)`` at the end of each optimizer step in ``steps``, kept in
    ``results[step]``. Every process evaluates (under FSDP / ZeRO-3 a forward is a collective); the main process keeps
    the numbers.

    :func:`evaluate` saves and restores the random-number state and the training mode it finds, so a run trains
    exactly as it would without this callback (tested). The spread over the last few checkpoints says whether a run
    has settled (docs/results.md gives it for this testbed).
    """

    def __init__(self, steps, evaluate):
        self.steps = set(steps)
        self.evaluate = evaluate
        self.results: dict[int, dict[str, Any]] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.steps:
            result = self.evaluate(model)
            if state.is_world_process_zero:
                self.results[state.global_step] = result


def checkpoint_steps(max_steps: int, every: int, count: int) -> list[int]:
    """The last ``count`` evaluation steps ``max_steps - every * (count - 1), ..., max_steps`` that are >= 1."""
    if every < 1 or count < 1:
        raise ValueError(f"checkpoint_steps needs every >= 1 and count >= 1, got every={every}, count={count}.")
    return [step for step in range(max_steps - every * (count - 1), max_steps + 1, every) if step >= 1]


__all__ = [
    "ALL_ON",
    "CheckpointEvaluator",
    "DEFAULT_TOOLS",
    "EVAL_SAMPLES",
    "HELDOUT_SPLITS",
    "MAX_COMPLETION_LENGTH",
    "TEACHER_OFFSETS",
    "addition_problems",
    "all_problems",
    "answer_reward",
    "careless_answer",
    "heldout_half",
    "checkpoint_steps",
    "evaluate",
    "grpo_settings",
    "is_heldout",
    "sft_dataset",
    "sft_warm_start",
    "solve",
    "warm_start",
    "whole_parameters",
]
