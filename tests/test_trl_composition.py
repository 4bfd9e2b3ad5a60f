"""The families compose with TRL 1.16's own features: its masks, clips, modes, evaluation and generation backends.

Each test names the issue-13 cell it covers; the full feature x family sweep is tests/test_compat_matrix.py.
"""

import logging
import math

import pytest
import torch
from conftest import aggregate_single_process, last_logs, policy_logps, random_advantage_batch, scored_batch

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtConfig
from trl_grpo_ext.adapter.compat import policy_logps_at_temperature, vllm_importance_sampling_ratio
from trl_grpo_ext.adapter.rollouts import Rollout
from trl_grpo_ext.api import KEEP_KEY
from trl_grpo_ext.core.aepo import high_entropy_mask
from trl_grpo_ext.core.diversity import distinct_n_batch


def _capture_selection(trainer):
    """Replace the token clip by a subclass that records each call's selection and policy mask."""
    ext = trainer.extensions["token_clip"]
    seen = []

    class Capture(type(ext)):
        def modify_logps(self, logps, ctx):
            out = super().modify_logps(logps, ctx)
            seen.append((ctx.selected.clone(), ctx.policy_mask.clone()))
            return out

    trainer.extensions["token_clip"] = trainer.ext_build(Capture)
    return seen


def _spy_entropy_masks(trainer, monkeypatch):
    masks = []
    original = trainer.get_high_entropy_mask

    def spy(entropies, mask, threshold):
        result = original(entropies, mask, threshold)
        masks.append(result.clone())
        return result

    monkeypatch.setattr(trainer, "get_high_entropy_mask", spy)
    return masks


CLIPS = {
    "clip_cov": dict(token_clip="clip_cov", clip_cov_ratio=0.3, clip_cov_lb=-100.0, clip_cov_ub=100.0),
    "kl_cov": dict(token_clip="kl_cov", num_iterations=2, kl_cov_ratio=0.3),
}


# ---------------------------------------------------------------------------------------------- item 3: masks
@pytest.mark.filterwarnings("ignore:.*not a percentage")
@pytest.mark.parametrize("clip", list(CLIPS))
def test_token_clips_select_only_tokens_trls_entropy_mask_trains(make_trainer, train_dataset, monkeypatch, clip):
    trainer = make_trainer(top_entropy_quantile=0.2, max_completion_length=8, **CLIPS[clip])
    seen = _capture_selection(trainer)
    masks = _spy_entropy_masks(trainer, monkeypatch)
    inputs = random_advantage_batch(trainer, train_dataset)
    trainer._compute_loss(trainer.model, inputs)
    assert len(masks) == 2  # ours (in the log-prob hook), then TRL's own, on the same entropies
    torch.testing.assert_close(masks[0], masks[1])
    selected, policy_mask = seen[-1]
    torch.testing.assert_close(policy_mask, masks[1])
    assert selected.any()
    assert not (selected & ~masks[1]).any(), "a selection fell on a token TRL's entropy mask excludes"


@pytest.mark.filterwarnings("ignore:.*not a percentage")
def test_kl_cov_penalty_carries_trls_masks_and_vllm_is_ratio(make_trainer, train_dataset):
    """Loss(with KL-Cov) - loss(without) = coef x aggregate(|logp - old| x selected x off-policy mask x IS ratio)."""
    trainer = make_trainer(
        off_policy_mask_threshold=0.05, loss_type="dr_grpo", kl_cov_coef=0.7, max_completion_length=8, **CLIPS["kl_cov"]
    )
    seen = _capture_selection(trainer)
    inputs = random_advantage_batch(trainer, train_dataset)
    gen = torch.Generator().manual_seed(1)
    inputs["old_per_token_logps"] = inputs["old_per_token_logps"] + 0.5 * torch.randn(
        inputs["old_per_token_logps"].shape, generator=gen
    )
    rows = inputs["advantages"].size(0)
    ratio = torch.linspace(0.0, 2.0, rows).unsqueeze(1)  # (B, 1), row 0 masked by vLLM's sequence_mask mode
    inputs["importance_sampling_ratio"] = ratio
    trainer.use_vllm = True  # only the loss's IS branch reads these two
    trainer.vllm_importance_sampling_correction = True
    with_penalty = trainer._compute_loss(trainer.model, inputs).detach()
    selected, policy_mask = seen[-1]
    ext = trainer.extensions.pop("token_clip")
    without = trainer._compute_loss(trainer.model, inputs).detach()
    trainer.extensions["token_clip"] = ext
    with torch.no_grad():
        current = policy_logps(trainer, inputs)
    mask = inputs["completion_mask"]
    advantages = inputs["advantages"].unsqueeze(1)
    kl = (inputs["old_per_token_logps"] - current) * mask
    off_policy = ((advantages >= 0) | ((kl.sum(1, keepdim=True) / mask.sum(1, keepdim=True)) <= 0.05)).float()
    assert (off_policy == 0).any() and (off_policy == 1).any(), "the test needs both kept and dropped sequences"
    weight = off_policy * ratio
    torch.testing.assert_close(policy_mask, mask.bool() & (weight.expand_as(mask) > 0))
    assert not (selected & ~policy_mask).any()
    penalty = (current - inputs["old_per_token_logps"]).abs() * selected * weight
    expected = 0.7 * aggregate_single_process(trainer, penalty, inputs, "dr_grpo")
    torch.testing.assert_close(with_penalty - without, expected)


def test_policy_weight_is_none_when_trl_applies_no_factor(make_trainer, train_dataset):
    """No entropy mask, off-policy mask or vLLM ratio configured: the context carries no policy weight (so terms are
    not multiplied by a stand-in 1), and the policy mask is the loss mask."""
    trainer = make_trainer(**CLIPS["clip_cov"])
    ext = trainer.extensions["token_clip"]
    weights = []

    class Capture(type(ext)):
        def modify_logps(self, logps, ctx):
            weights.append(ctx.policy_weight)
            return super().modify_logps(logps, ctx)

    trainer.extensions["token_clip"] = trainer.ext_build(Capture)
    seen = _capture_selection(trainer)
    inputs = random_advantage_batch(trainer, train_dataset)
    trainer._compute_loss(trainer.model, inputs)
    assert weights == [None]
    _, policy_mask = seen[-1]
    torch.testing.assert_close(policy_mask, inputs["completion_mask"].bool())


def test_high_entropy_mask_hand_computed():
    entropies = torch.tensor([[0.1, 0.9, 0.5, 7.0], [0.3, 0.7, 0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    # valid entropies 0.1 0.9 0.5 0.3 0.7 0.2 0.0: top 3/7 -> the 1 - 3/7 quantile = 0.5 -> 0.9, 0.5, 0.7
    kept = high_entropy_mask(entropies, mask, quantile=3 / 7)
    expected = torch.tensor([[False, True, True, False], [False, True, False, False]])
    torch.testing.assert_close(kept, expected)
    torch.testing.assert_close(high_entropy_mask(entropies, mask, quantile=1.0), mask.bool())
    assert not high_entropy_mask(entropies, torch.zeros_like(mask), quantile=0.5).any()


def test_vllm_importance_sampling_ratio_hand_computed():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    sampling = torch.tensor([[-1.5, -1.0, float("nan")], [-1.0, -3.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # per-token differences: [0.5, -1, 0 (NaN)], [0, 2, 0 (masked)]
    token = vllm_importance_sampling_ratio(old, sampling, mask, mode="token_truncate", clip_min=0.5, clip_max=3.0)
    expected = torch.tensor([[math.exp(0.5), 0.5, 1.0], [1.0, 3.0, 1.0]])
    torch.testing.assert_close(token, expected)
    seq = vllm_importance_sampling_ratio(old, sampling, mask, mode="sequence_mask", clip_min=None, clip_max=3.0)
    torch.testing.assert_close(seq, torch.tensor([[math.exp(-0.5)], [0.0]]))  # e^2 > 3: masked
    with pytest.raises(ValueError, match="token_truncate"):
        vllm_importance_sampling_ratio(old, sampling, mask, mode="bogus", clip_min=None, clip_max=None)


# ---------------------------------------------------------------------------------------------- item 2: KL-Cov clips
def test_kl_cov_keeps_trls_clip_when_asked(make_trainer):
    trainer = make_trainer(
        token_clip="kl_cov", num_iterations=2, loss_type="cispo", epsilon_high=5.0, kl_cov_ppo_clip=True
    )
    assert trainer.epsilon_high == 5.0


# ---------------------------------------------------------------------------------------------- item 1: AEPO masks
def _scripted_rollout(env_mask_pattern):
    """A ``rollout_func`` that writes random digits and marks positions of ``env_mask_pattern`` (0) as env text."""

    def rollout(prompts, trainer):
        tok = trainer.processing_class
        gen = torch.Generator().manual_seed(trainer.state.global_step * 7919 + len(prompts))
        digits = tok.convert_tokens_to_ids(list("0123456789"))
        prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        width = len(env_mask_pattern)
        picks = torch.randint(0, 10, (len(prompts), width), generator=gen).tolist()
        completion_ids = [[digits[d] for d in row] for row in picks]
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": None,
            "env_mask": [list(env_mask_pattern) for _ in prompts],
        }

    return rollout


def _ones_reward(completions, **kwargs):
    return [float(str(c).count("1") + str(c).count("7")) for c in completions]


@pytest.mark.parametrize("mode", ["splice", "term"])
def test_aepo_keeps_the_env_mask_of_a_rollout_func(make_trainer, mode):
    pattern = [1, 1, 0, 0, 1, 1]
    trainer = make_trainer(
        entropy_control="aepo",
        aepo_mode=mode,
        aepo_adv_threshold=0.0,
        max_completion_length=len(pattern),
        max_steps=2,
        reward_funcs=[_ones_reward],
        trainer_kwargs={"rollout_func": _scripted_rollout(pattern)},
    )
    aepo = trainer.extensions["entropy_control"]
    masks = []
    if mode == "term":
        original = aepo._build_chunks

        def spy(*args, **kwargs):
            chunks = original(*args, **kwargs)
            masks.extend(c["loss_mask"] for c in chunks if c)
            return chunks

        aepo._build_chunks = spy
    else:
        apply = trainer._apply_splice

        def spy(out, splice):
            apply(out, splice)
            rows = len(splice.rollout.completion_ids)
            if rows:
                masks.append(out["completion_mask"][:rows] * out["tool_mask"][:rows])

        trainer._apply_splice = spy
    trainer.train()
    logs = last_logs(trainer)
    assert all(math.isfinite(h["loss"]) for h in logs)
    assert masks and sum(h["aepo/samples_used"] for h in logs) > 0
    for mask in masks:
        torch.testing.assert_close(mask, torch.tensor([pattern] * mask.size(0)))


def _rollout(prompt_ids, completion_ids, *, logprobs=None, temperature=None):
    return Rollout(prompt_ids, completion_ids, None, [None] * len(prompt_ids), logprobs, temperature)


def test_aepo_masks_truncated_completions_like_trl(make_trainer, train_dataset):
    trainer = make_trainer(entropy_control="aepo", mask_truncated_completions=True, max_completion_length=3)
    aepo = trainer.extensions["entropy_control"]
    eos = trainer.eos_token_ids[0]
    chunks = aepo._build_chunks(_rollout([[5, 6], [5, 6]], [[7, 8, 9], [7, eos]]), [0, 1])
    rows = torch.cat([c["loss_mask"] for c in chunks if c] if len(chunks) > 1 else [chunks[0]["loss_mask"]])
    torch.testing.assert_close(rows, torch.tensor([[0, 0, 0], [1, 1, 0]]))


def test_aepo_refuses_environment_factory(make_trainer):
    with pytest.raises(ValueError, match="environment_factory") as err:
        make_trainer(entropy_control="aepo", trainer_kwargs={"environment_factory": lambda: object()})
    assert "entropy_control='none'" in str(err.value)


def test_aepo_term_only_on_high_entropy_tokens(make_trainer, train_dataset):
    trainer = make_trainer(entropy_control="aepo", top_entropy_quantile=0.25, max_completion_length=8)
    aepo = trainer.extensions["entropy_control"]
    out = scored_batch(trainer, train_dataset)
    prompt_ids = [row[m.bool()].tolist() for row, m in zip(out["prompt_ids"], out["prompt_mask"], strict=True)]
    pairs = zip(out["completion_ids"], out["completion_mask"], strict=True)
    completion_ids = [row[m.bool()].tolist() for row, m in pairs]
    aepo._chunks = aepo._build_chunks(_rollout(prompt_ids, completion_ids), list(range(len(prompt_ids))))
    chunk = aepo._chunks[0]
    host = trainer.ext_rollouts
    logps, entropies = host.policy_logps(chunk, compute_entropy=True)
    captured = {}
    original = host.policy_logps

    def keep(c, *, compute_entropy=False):
        lp, ent = original(c, compute_entropy=compute_entropy)
        lp.retain_grad()
        captured["logps"] = lp
        return lp, ent

    host.policy_logps = keep
    from trl_grpo_ext.families.base import LossContext

    ctx = LossContext(inputs={}, mask=torch.ones(1, 1), mode="train", logps=torch.zeros(1, 1))
    trainer._step = 0
    loss, _ = aepo.extra_loss(ctx)  # (term, metrics)
    loss.backward()
    grad = captured["logps"].grad
    expected = high_entropy_mask(entropies.detach(), chunk["loss_mask"], quantile=0.25)
    assert expected.any() and (~expected & chunk["loss_mask"].bool()).any()
    assert torch.equal(grad != 0, expected)


# ---------------------------------------------------------------------------------------------- item 4: evaluation
def test_monitor_reads_training_batches_only_and_logs_eval_diversity(make_trainer, train_dataset):
    trainer = make_trainer(
        steps_per_generation=2,
        max_steps=4,
        eval_strategy="steps",
        eval_steps=1,
        per_device_eval_batch_size=8,
        diversity_metrics=["distinct", "repetition"],
        trainer_kwargs={"eval_dataset": testkit.arithmetic_dataset(4, seed=9)},
    )
    fed = []
    observe = trainer.collapse_monitor.observe_generation

    def spy(ids, mask, group_size, mode):
        fed.append((mode, distinct_n_batch(ids, mask, 2)))
        observe(ids, mask, group_size, mode)

    trainer.collapse_monitor.observe_generation = spy
    trainer.train()
    train_values = [v for mode, v in fed if mode == "train"]
    assert len(train_values) == 2 and any(mode == "eval" for mode, _ in fed)
    history = trainer.state.log_history
    logged = [h["diversity/distinct_2"] for h in history if "diversity/distinct_2" in h]
    assert logged == pytest.approx(train_values)  # one value per training generation batch, none from eval
    assert any("eval_diversity/distinct_2" in h for h in history)
    assert not any("alarm/collapse" in h and "eval_loss" in h for h in history)


def test_monitor_logs_every_generation_batch_of_a_step(make_trainer):
    """steps_per_generation < gradient_accumulation_steps: two generation batches per optimizer step; the step logs
    their mean (it used to log the last one only, silently dropping the other)."""
    trainer = make_trainer(
        gradient_accumulation_steps=2, steps_per_generation=1, max_steps=2, diversity_metrics=["distinct"]
    )
    fed = []
    observe = trainer.collapse_monitor.observe_generation

    def spy(ids, mask, group_size, mode):
        fed.append((trainer.state.global_step, distinct_n_batch(ids, mask, 2)))
        observe(ids, mask, group_size, mode)

    trainer.collapse_monitor.observe_generation = spy
    trainer.train()
    per_step = [[value for step, value in fed if step == s] for s in (0, 1)]
    assert [len(values) for values in per_step] == [2, 2]
    logged = [h["diversity/distinct_2"] for h in last_logs(trainer)]
    assert logged == pytest.approx([sum(values) / 2 for values in per_step])


def test_plain_trl_trainer_monitor_skips_eval_completions(tiny_model_path, tokenizer, train_dataset, tmp_path):
    from conftest import TINY_ARGS
    from trl import GRPOConfig, GRPOTrainer

    from trl_grpo_ext.callbacks import CollapseMonitor

    args = GRPOConfig(
        **{**TINY_ARGS, "max_steps": 4},
        output_dir=str(tmp_path),
        steps_per_generation=2,
        eval_strategy="steps",
        eval_steps=1,
        per_device_eval_batch_size=8,
    )
    trainer = GRPOTrainer(
        model=tiny_model_path,
        reward_funcs=[testkit.exact_match_reward],
        args=args,
        train_dataset=train_dataset,
        eval_dataset=testkit.arithmetic_dataset(4, seed=9),
        processing_class=tokenizer,
    )
    trainer.add_callback(CollapseMonitor(trainer, metrics=["distinct"]))
    trainer.train()
    steps = [h["step"] for h in trainer.state.log_history if "diversity/distinct_2" in h]
    assert steps == [1, 3]  # generation steps only; steps 2 and 4 reuse the batch and must not read eval text


def test_kl_diversity_and_monitor_measure_the_same_ids(make_trainer):
    trainer = make_trainer(
        kl_control="diversity",
        beta=0.04,
        kl_diversity_n=2,
        diversity_metrics=["distinct"],
        max_completion_length=8,
        max_steps=2,
    )
    trainer.train()
    for h in last_logs(trainer):  # the monitor's value comes from its background thread, at the same step
        assert h["kl/diversity"] == pytest.approx(h["diversity/distinct_2"], rel=1e-6)
    assert trainer.collapse_monitor._executor is None  # the background thread ended with training


def test_sample_filter_is_off_in_evaluation_unless_asked(make_trainer, train_dataset):
    trainer = make_trainer(sample_filter="best_of_n")
    out = scored_batch(trainer, train_dataset, mode="eval")
    assert KEEP_KEY not in out and "tool_mask" not in out
    trainer = make_trainer(sample_filter="best_of_n", pf_filter_eval=True)
    out = scored_batch(trainer, train_dataset, mode="eval")
    assert int(out[KEEP_KEY].sum()) == out[KEEP_KEY].numel() // trainer.num_generations_eval


# ---------------------------------------------------------------------------------------------- item 5
def test_population_std_without_scaling_is_refused():
    with pytest.raises(ValueError, match="scale_rewards='none'"):
        GRPOExtConfig(
            output_dir="x", advantage_std="population", scale_rewards="none", report_to="none", use_cpu=True, bf16=False
        )


def test_best_of_n_ranks_by_trls_advantage_under_normalize_then_sum(make_trainer, train_dataset):
    trainer = make_trainer(sample_filter="best_of_n", multi_objective_aggregation="normalize_then_sum")
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    # One group of 4: function 0 spreads widely, function 1 narrowly. The raw sum ranks row 0 first (10.0 + 0);
    # normalised per function, row 1 wins (function 1's outlier counts as much as function 0's).
    rewards_per_func = torch.tensor([[10.0, 0.0], [9.0, 1.0], [0.0, 0.0], [9.5, 0.0]])
    advantages = torch.tensor([0.2, 1.5, -1.8, 0.1])
    rows = dict(inputs=[{}] * 4, prompts=["p"] * 4, completions=["c"] * 4, completion_ids_list=[])
    scored = dict(rewards_per_func=rewards_per_func, **rows)
    output = {
        "completion_ids": torch.ones(4, 3, dtype=torch.long),
        "completion_mask": torch.ones(4, 3, dtype=torch.long),
        "advantages": advantages.clone(),
    }
    trainer._on_generation(output, scored)
    torch.testing.assert_close(output[KEEP_KEY], torch.tensor([False, True, False, False]))


# ---------------------------------------------------------------------------------------------- item 6: vLLM (faked)
class FakeVLLMGeneration:
    """Stands for TRL's ``VLLMGeneration``: records the temperature of each generate call and weight syncs."""

    def __init__(self, tokenizer, temperature=1.0):
        self.temperature = temperature
        self.calls = []
        self.syncs = 0
        self.digit = tokenizer.convert_tokens_to_ids("1")

    def sync_weights(self):
        self.syncs += 1

    def generate(self, prompts, images, num_generations, profiler):
        self.calls.append(self.temperature)
        completion_ids = [[self.digit, self.digit] for _ in prompts]
        logprobs = [[[-0.5], [-0.7]] for _ in prompts]
        return prompts, completion_ids, logprobs, None


def test_aepo_switches_vllm_temperature_per_call_without_a_second_sync(make_trainer, train_dataset):
    trainer = make_trainer(entropy_control="aepo")
    fake = FakeVLLMGeneration(trainer.processing_class, temperature=1.0)
    trainer.use_vllm = True
    trainer.vllm_generation = fake
    trainer._last_loaded_step = trainer.state.global_step  # TRL's own generation of this step synced already
    aepo = trainer.extensions["entropy_control"]
    prompts = [train_dataset[0]["prompt"]] * 4
    rollout = trainer.ext_rollouts.regenerate(prompts, temperature=1.2)
    completion_ids, logprobs = rollout.completion_ids, rollout.logprobs
    assert fake.calls == [1.2] and fake.temperature == 1.0  # set for the call, restored after
    assert fake.syncs == 0  # same step: the weights vLLM holds are current
    assert logprobs == [[-0.5, -0.7]] * 4  # vLLM's sampling log-probs reach AEPO (for the IS correction)
    assert rollout.temperature == 1.2
    trainer.vllm_importance_sampling_correction = True
    prompt_ids = [trainer.processing_class(p)["input_ids"] for p in prompts]
    chunks = aepo._build_chunks(_rollout(prompt_ids, completion_ids, logprobs=logprobs, temperature=1.2), [0, 1])
    # vLLM's log-probs at 1.2 are compared with the trainer's at 1.2, not with the old log-probs (training temperature)
    chunk = chunks[0]
    at_sampling = policy_logps_at_temperature(
        trainer,
        torch.cat([chunk["prompt_ids"], chunk["completion_ids"]], 1),
        torch.cat([chunk["prompt_mask"], chunk["completion_mask"]], 1),
        chunk["completion_ids"].size(1),
        temperature=1.2,
    )
    assert not torch.allclose(at_sampling, chunks[0]["old_logps"])
    expected = vllm_importance_sampling_ratio(
        at_sampling,
        torch.tensor([[-0.5, -0.7]] * 2),
        chunks[0]["loss_mask"].float(),
        mode=trainer.vllm_importance_sampling_mode,
        clip_min=trainer.args.vllm_importance_sampling_clip_min,
        clip_max=trainer.args.vllm_importance_sampling_clip_max,
    )
    torch.testing.assert_close(chunks[0]["is_ratio"], expected)


def test_aepo_warns_that_sleep_mode_costs_a_second_weight_push(make_trainer, caplog, monkeypatch):
    from trl_grpo_ext.families.entropy_control import AEPO

    trainer = make_trainer(entropy_control="aepo")
    monkeypatch.setattr(trainer.args, "use_vllm", True)
    monkeypatch.setattr(trainer.args, "vllm_enable_sleep_mode", True)
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.families.entropy_control"):
        trainer.ext_build(AEPO)
    assert "pushes the weights to vLLM twice" in caplog.text


def test_aepo_refuses_a_generation_kwargs_temperature_under_vllm(make_trainer, monkeypatch):
    """TRL's colocated vLLM applies ``generation_kwargs`` over its temperature at every call: AEPO's regeneration would
    sample at the user's value. Refused, naming the fix; without vLLM (TRL sets the GenerationConfig AEPO edits) it
    runs."""
    from trl_grpo_ext.families.entropy_control import AEPO

    trainer = make_trainer(entropy_control="aepo", generation_kwargs={"temperature": 0.9})
    monkeypatch.setattr(trainer.args, "use_vllm", True)
    with pytest.raises(ValueError, match=r"drop 'temperature' from generation_kwargs"):
        trainer.ext_build(AEPO)


class _Routed:
    """An environment that owns the prompt: its reset() returns it (the dataset row carries only a task id)."""

    def reset(self, task, **kwargs):
        return f"{task}+1="

    def noop(self, n: int) -> str:
        """Does nothing.

        Args:
            n: a number.
        """
        return str(n)


def test_environment_factory_datasets_may_omit_the_prompt_column(tiny_model_path, tmp_path):
    """TRL 1.16 makes ``prompt`` optional with ``environment_factory`` (the environment's reset() supplies it):
    a dataset of task ids builds and trains, as under plain TRL (the plugin used to refuse it, naming an impossible
    fix)."""
    from datasets import Dataset
    from trl.chat_template_utils import qwen3_chat_template

    from grpo_lab import testkit
    from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer

    tokenizer = testkit.build_char_tokenizer()
    tokenizer.chat_template = qwen3_chat_template
    model = testkit.build_tiny_model(tokenizer, max_position_embeddings=1024)
    model.save_pretrained(tmp_path / "chat")
    tokenizer.save_pretrained(tmp_path / "chat")
    args = GRPOExtConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        token_clip="clip_cov",
        clip_cov_lb=-100.0,
    )
    trainer = GRPOExtTrainer(
        model=str(tmp_path / "chat"),
        reward_funcs=[testkit.digit_fraction_reward],
        args=args,
        train_dataset=Dataset.from_list([{"task": str(i)} for i in range(8)]),
        processing_class=tokenizer,
        environment_factory=_Routed,
    )
    trainer.train()
    assert trainer.state.global_step == 1
