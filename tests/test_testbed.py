"""The learning testbed: problems, split, careless teacher, verifier and held-out evaluation, by hand."""

import os
import random
from collections import Counter

import pytest
import torch

from grpo_lab import testbed, testkit
from trl_grpo_ext import GRPOExtConfig


def test_problems_and_split_are_fixed():
    problems = testbed.all_problems()
    assert len(problems) == 900 and problems[0] == "10+0=" and problems[-1] == "99+9="
    heldout = [p for p in problems if testbed.is_heldout(p)]
    # The split is a hash of the prompt: the same 179 prompts on every machine (these are the first ones).
    assert len(heldout) == 179
    assert heldout[:6] == ["11+1=", "11+8=", "11+9=", "12+0=", "12+6=", "12+9="]
    assert not testbed.is_heldout("47+8=")


def test_solve_parses_without_eval():
    assert testbed.solve("47+8=") == 55
    assert testbed.solve("99+9=") == 108
    assert testbed.solve("10+0=") == 10


def test_addition_problems_train_and_test():
    train = testbed.addition_problems(500, seed=3)
    assert len(train) == 500 and not any(testbed.is_heldout(p) for p in train["prompt"])
    assert all(str(testbed.solve(p)) == a for p, a in zip(train["prompt"], train["answer"], strict=True))
    assert train["prompt"] == testbed.addition_problems(500, seed=3)["prompt"]  # seeded
    test = testbed.addition_problems(split="heldout", seed=0)
    assert len(test) == 179 and all(testbed.is_heldout(p) for p in test["prompt"])
    assert sorted(test["prompt"]) == sorted(testbed.addition_problems(split="heldout", seed=1)["prompt"])
    assert len(testbed.addition_problems(8, split="heldout")) == 8
    with pytest.raises(ValueError, match="needs n"):
        testbed.addition_problems(split="train")
    with pytest.raises(ValueError, match="split must be"):
        testbed.addition_problems(5, split="dev")


def test_heldout_halves_partition_the_heldout_prompts():
    """Validation (choices) and test (reported results) are disjoint halves of the 179 held-out prompts, fixed by a
    hash (the same on every machine)."""
    validation = set(testbed.addition_problems(split="validation")["prompt"])
    test = set(testbed.addition_problems(split="test")["prompt"])
    assert not validation & test and validation | test == set(testbed.addition_problems(split="heldout")["prompt"])
    assert (len(validation), len(test)) == (91, 88)
    assert all(testbed.heldout_half(p) == "test" for p in test)
    with pytest.raises(ValueError, match="training prompt"):
        testbed.heldout_half("47+8=")


def test_careless_teacher_follows_its_offsets():
    rng = random.Random(0)
    offsets = Counter(int(testbed.careless_answer("47+8=", rng)) - 55 for _ in range(20_000))
    assert set(offsets) == set(testbed.TEACHER_OFFSETS)
    for offset, probability in testbed.TEACHER_OFFSETS.items():
        assert abs(offsets[offset] / 20_000 - probability) < 0.015
    # The teacher's most likely answer is wrong: that is what leaves room for RL.
    assert max(testbed.TEACHER_OFFSETS, key=testbed.TEACHER_OFFSETS.get) != 0


def test_sft_dataset_rows():
    rows = testbed.sft_dataset(200, seed=1)
    assert len(rows) == 200
    for prompt, completion in zip(rows["prompt"], rows["completion"], strict=True):
        assert completion.endswith(testkit.EOS)
        assert int(completion[: -len(testkit.EOS)]) - testbed.solve(prompt) in testbed.TEACHER_OFFSETS


def test_answer_reward_by_hand():
    completions = ["55", " 55\n", "55 ", "5", "555", "55.0", "", "55+0"]
    assert testbed.answer_reward(completions, ["55"] * 8) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    chat = [[{"role": "assistant", "content": "108"}], []]
    assert testbed.answer_reward(chat, ["108", "1"]) == [1.0, 0.0]


def test_grpo_settings_are_the_off_policy_regime():
    args = GRPOExtConfig(output_dir="unused", **testbed.grpo_settings())
    assert args.is_off_policy  # 4 optimizer steps per generation: TRL computes old log-probs, the PPO clip acts
    assert args.generation_batch_size == 256 and args.num_generations == 8
    assert testbed.grpo_settings(max_steps=7)["max_steps"] == 7
    # The learning rate decays to 0 at the last step (TRL's linear schedule), so the final model is not one draw
    # from a policy still moving at the full rate.
    assert args.lr_scheduler_type == "linear" and args.learning_rate == 2e-4
    GRPOExtConfig(output_dir="unused", **testbed.grpo_settings(**testbed.DEFAULT_TOOLS))  # the tools validate


def _always(value):
    def reward(completions, **kwargs):
        return [value] * len(completions)

    return reward


def test_evaluate_numbers_are_in_range_and_follow_the_reward(tiny_model_path, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    problems = testbed.addition_problems(6, split="heldout")
    result = testbed.evaluate(model, tokenizer, problems, sampled_problems=3, seed=0)
    assert set(result) == {"answer_acc", "pass_at_1", "pass_at_8", "entropy", "distinct_2", "samples"}
    vocab = len(tokenizer)
    assert 0.0 < result["entropy"] <= torch.log(torch.tensor(float(vocab))).item() + 1e-6  # a random model
    assert 0.0 <= result["distinct_2"] <= 1.0 and len(result["samples"]) == 3
    assert result == testbed.evaluate(model, tokenizer, problems, sampled_problems=3, seed=0)  # seeded
    right = testbed.evaluate(model, tokenizer, problems, sampled_problems=3, reward=_always(1.0))
    wrong = testbed.evaluate(model, tokenizer, problems, sampled_problems=3, reward=_always(0.0))
    for key in ("answer_acc", "pass_at_1", "pass_at_8"):
        assert right[key] == 1.0 and wrong[key] == 0.0
    # By default every problem is sampled: a reward right on the first problem only gives pass@8 = 1/6, not 1/3.
    first = problems["prompt"][0]

    def first_only(prompts, completions, **kwargs):
        return [1.0 if p == first else 0.0 for p in prompts]

    assert testbed.evaluate(model, tokenizer, problems, reward=first_only)["pass_at_8"] == pytest.approx(1 / 6)
    assert testbed.evaluate(model, tokenizer, problems, sampled_problems=3, reward=first_only)[
        "pass_at_8"
    ] == pytest.approx(1 / 3)
    for training in (True, False):  # the model's mode is restored
        model.train(training)
        testbed.evaluate(model, tokenizer, problems, sampled_problems=2)
        assert model.training is training


def test_evaluate_scores_the_same_samples_by_a_proxy(tiny_model_path, tokenizer):
    """A proxy is scored on the very completions the gold numbers come from: a proxy that returns a completion's
    length equals ``length``; the gap is proxy minus sampled gold; the gold numbers do not change."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    problems = testbed.addition_problems(6, split="heldout")
    plain = testbed.evaluate(model, tokenizer, problems, seed=0)

    def length(prompts, completions, **kwargs):
        return [float(len(c)) for c in completions]

    scored = testbed.evaluate(model, tokenizer, problems, seed=0, proxy=length)
    assert {k: v for k, v in scored.items() if k in plain} == plain
    assert scored["proxy"] == pytest.approx(scored["length"]) and scored["length"] > 0
    assert scored["gap"] == pytest.approx(scored["proxy"] - scored["pass_at_1"])
    assert 0.0 <= scored["repetition"] <= 1.0
    half = testbed.evaluate(model, tokenizer, problems, reward=_always(1.0), proxy=_always(0.5))
    assert half["proxy"] == 0.5 and half["gap"] == pytest.approx(-0.5)


def test_warm_start_is_built_once_and_cached(tmp_path):
    kwargs = dict(seed=0, examples=64, hidden_size=32, num_layers=1, log=lambda *a: None)
    path = testbed.warm_start(str(tmp_path), **kwargs)
    config = tmp_path / os.path.basename(path) / "config.json"
    stamp = config.stat().st_mtime_ns
    assert testbed.warm_start(str(tmp_path), **kwargs) == path
    assert config.stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # the temporary folder was renamed into place


def test_checkpoint_steps_by_hand():
    assert testbed.checkpoint_steps(600, 20, 6) == [500, 520, 540, 560, 580, 600]
    assert testbed.checkpoint_steps(600, 20, 1) == [600]
    assert testbed.checkpoint_steps(4, 20, 6) == [4]  # a short run keeps the steps it has
    assert testbed.checkpoint_steps(45, 20, 6) == [5, 25, 45]
    with pytest.raises(ValueError, match="every >= 1"):
        testbed.checkpoint_steps(600, 0, 6)


def test_checkpoint_evaluator_records_the_steps_and_leaves_the_run_unchanged(make_trainer, tokenizer):
    heldout = testbed.addition_problems(4, split="heldout")
    plain = make_trainer()
    plain.train()
    checkpoints = testbed.CheckpointEvaluator([1, 2], lambda model: testbed.evaluate(model, tokenizer, heldout))
    watched = make_trainer(trainer_kwargs={"callbacks": [checkpoints]})
    watched.train()
    assert sorted(checkpoints.results) == [1, 2]
    assert {"answer_acc", "pass_at_8", "entropy"} <= set(checkpoints.results[2])
    for (name, a), (_, b) in zip(plain.model.named_parameters(), watched.model.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
