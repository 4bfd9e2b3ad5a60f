"""Contract tests on the TRL internals trl_grpo_ext relies on (TRL 1.14-1.16, trl_grpo_ext.adapter.versions): an upgrade
that breaks them fails here, loudly. CI runs this file on every supported TRL minor."""

import inspect

import pytest
import torch
import trl
from conftest import aggregate_single_process, policy_logps, scored_batch
from trl import GRPOConfig, GRPOTrainer

from trl_grpo_ext.adapter import versions
from trl_grpo_ext.adapter.compat import combined_rewards, per_token_kl

#: Tiny trainers, seconds in all: in the edit-loop tier (tests/conftest.py).
pytestmark = pytest.mark.fast


def params(fn):
    return list(inspect.signature(fn).parameters)


def test_trl_version_is_supported_and_the_range_is_the_packages():
    assert versions.minor(trl.__version__) in versions.SUPPORTED, trl.__version__
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'"trl{versions.supported_range()}"' in pyproject  # the range pip enforces is the range CI tests


@pytest.mark.parametrize("version", ["1.13.2", "1.17.0", "1.17.0.dev0", "2.0.0"])
def test_a_trl_outside_the_range_is_refused_at_import_with_the_fix(version, monkeypatch):
    monkeypatch.delenv(versions.ALLOW_UNTESTED, raising=False)
    with pytest.raises(ImportError, match=rf"TRL {version} is installed\. Fix: pip install 'trl>=1\.14,<1\.17'"):
        versions.check_installed(version)
    monkeypatch.setenv(versions.ALLOW_UNTESTED, "1")
    with pytest.warns(UserWarning, match=f"TRL {version} is installed"):
        assert versions.check_installed(version) == versions.minor(version)


@pytest.mark.parametrize("version", ["1.14.0", "1.14.2", "1.15.0", "1.16.0", "1.16.3"])
def test_a_supported_trl_is_accepted(version):
    assert versions.check_installed(version) == version[:4]


def test_hook_signatures():
    assert params(GRPOTrainer._calculate_rewards) == [
        "self",
        "inputs",
        "prompts",
        "completions",
        "completion_ids_list",
    ]
    assert params(GRPOTrainer._generate_and_score_completions) == ["self", "inputs"]
    assert params(GRPOTrainer._compute_loss) == ["self", "model", "inputs"]
    # TRL 1.14 forwards *args to _full_logits_logps; 1.15 and 1.16 take them (adapter.versions)
    assert params(versions.logps_signature_source(GRPOTrainer))[:7] == [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
    ]
    assert params(GRPOTrainer._save_checkpoint) == ["self", "model", "trial"]
    assert params(GRPOTrainer._load_optimizer_and_scheduler) == ["self", "checkpoint"]
    # AEPO regenerates through TRL's own generation path and unpacks its 8 outputs.
    assert params(GRPOTrainer._generate) == ["self", "prompts"]
    assert "return prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images" in (
        inspect.getsource(GRPOTrainer._generate)
    )


def test_loss_reads_tool_mask_and_live_beta():
    src = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]' in src
    assert "self._get_per_token_logps_and_entropies(" in src
    assert "per_token_loss = per_token_loss + self.beta * per_token_kl" in src
    assert "if advantages.dim() == 1:" in src  # (B, T) advantages pass through
    gen = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "if self.beta != 0.0:" in gen
    assert "rewards_per_func = self._calculate_rewards(" in gen
    prep = inspect.getsource(GRPOTrainer._prepare_inputs)
    assert "self._generate_and_score_completions(generation_batch)" in prep
    assert prep.index("_generate_and_score_completions") < prep.index("shuffle_sequence_dict")


def test_trainer_attributes_and_output_keys(make_trainer, train_dataset):
    trainer = make_trainer(cls=GRPOTrainer, config_cls=GRPOConfig, beta=0.04)
    for name in (
        "beta",
        "epsilon_low",
        "epsilon_high",
        "loss_type",
        "num_generations",
        "num_generations_eval",
        "reward_weights",
        "reward_func_names",
        "scale_rewards",
        "max_completion_length",
        "_metrics",
        "_logs",
        "_step",
        "accelerator",
    ):
        assert hasattr(trainer, name), name
    out = scored_batch(trainer, train_dataset)
    assert {
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "advantages",
        "num_items_in_batch",
        "ref_per_token_logps",
    } <= set(out)
    assert out["advantages"].shape == (8,) and out["num_items_in_batch"].dim() == 0
    assert len(trainer._logs["advantages"]) == 8
    # TRL's logged reward is the nan-mean of the weighted sum we recompute.
    rewards = torch.tensor(list(trainer._logs["rewards"]["exact_match_reward"]))
    shaping = torch.tensor(list(trainer._logs["rewards"]["digit_fraction_reward"]))
    combined = combined_rewards(torch.stack([rewards, shaping], 1), trainer.reward_weights)
    assert trainer._metrics["train"]["reward"][-1] == pytest.approx(combined.nanmean().item())


LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "luspo", "sapo", "cispo", "vespo"]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("training", [True, False])
def test_aggregation_parity_with_trl_loss(make_trainer, train_dataset, loss_type, training):
    """On-policy (ratio 1) TRL's loss of token-level advantages -X is its aggregation of a known per-token term."""
    trainer = make_trainer(cls=GRPOTrainer, config_cls=GRPOConfig, loss_type=loss_type, epsilon_high=5.0)
    out = scored_batch(trainer, train_dataset, mode="train" if training else "eval")
    trainer.current_gradient_accumulation_steps = 2
    x = torch.randn(out["completion_mask"].shape, generator=torch.Generator().manual_seed(0))
    inputs = {**out, "advantages": -x}
    loss = trainer._compute_loss(trainer.model, inputs)
    if loss_type == "sapo":
        temp = torch.where(-x > 0, trainer.args.sapo_temperature_pos, trainer.args.sapo_temperature_neg)
        per_token = 2.0 / temp * x
    elif loss_type in ("cispo", "vespo"):
        logps = policy_logps(trainer, out)
        per_token = x * logps.detach()
    else:
        per_token = x
    expected = aggregate_single_process(trainer, per_token, out, loss_type, training=training, accumulation=2)
    torch.testing.assert_close(loss.detach(), expected.detach())


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_kl_term_parity_with_trl(make_trainer, train_dataset, loss_type):
    trainer = make_trainer(cls=GRPOTrainer, config_cls=GRPOConfig, loss_type=loss_type, beta=0.3)
    out = scored_batch(trainer, train_dataset)
    ref = out["ref_per_token_logps"] + 0.3 * torch.randn(out["ref_per_token_logps"].shape)
    inputs = {**out, "advantages": torch.zeros(8), "ref_per_token_logps": ref}
    loss = trainer._compute_loss(trainer.model, inputs)
    logps = policy_logps(trainer, out)
    expected = 0.3 * aggregate_single_process(trainer, per_token_kl(logps.detach(), ref), out, loss_type)
    torch.testing.assert_close(loss.detach(), expected)
    assert trainer._metrics["train"]["kl"][-1] == pytest.approx(
        (per_token_kl(logps.detach(), ref) * out["completion_mask"]).sum().item() / out["completion_mask"].sum().item(),
        rel=1e-5,
    )


def test_reward_kwargs_parity_with_trl(make_trainer, train_dataset):
    """adapter.compat.reward_kwargs (what the AEPO scoring and the PRM step functions pass reward functions) equals what
    TRL 1.16's own _calculate_rewards passes, key by key, on the same rows."""
    from trl_grpo_ext.adapter.compat import reward_kwargs

    seen = []

    def spy(prompts, completions, completion_ids, **kwargs):
        seen.append(kwargs)
        return [0.0] * len(prompts)

    trainer = make_trainer(reward_funcs=[spy])
    rows = [dict(train_dataset[i], extra=i) for i in range(4)]
    trainer._calculate_rewards(rows, [r["prompt"] for r in rows], ["1"] * 4, [[1]] * 4)
    ours = reward_kwargs(trainer, rows)
    (theirs,) = seen
    assert set(ours) == set(theirs) and ours["extra"] == theirs["extra"] == [0, 1, 2, 3]
    assert ours["answer"] == theirs["answer"] and ours["trainer_state"] is theirs["trainer_state"]
    assert ours["log_extra"] == theirs["log_extra"] and ours["log_metric"] == theirs["log_metric"]


def test_policy_weight_parity_with_trls_loss_gradient(make_trainer, train_dataset):
    """adapter.compat.trl_policy_weight (what the KL-Cov penalty and the token clips multiply by) is the factor TRL
    1.16's own loss applies: with the entropy mask and the off-policy mask both active, on-policy (ratio 1) and beta 0,
    the gradient of TRL's dapo loss on each token's log-prob is -advantage x weight / the token count, so it is zero
    exactly where the weight is."""
    from conftest import LogpProbe

    trainer = make_trainer(loss_type="dapo", beta=0.0, top_entropy_quantile=0.5, off_policy_mask_threshold=0.5)
    probe = LogpProbe().install(trainer)
    inputs = scored_batch(trainer, train_dataset)
    gen = torch.Generator().manual_seed(0)
    inputs["advantages"] = torch.randn(inputs["advantages"].shape, generator=gen)
    inputs["old_per_token_logps"] = None  # on-policy: TRL's ratio is exactly 1
    # the rows with a negative advantage were sampled far from the policy: TRL's off-policy mask drops them
    with torch.no_grad():
        current = policy_logps(trainer, inputs)
    far = (inputs["advantages"] < 0).unsqueeze(1)
    inputs["sampling_per_token_logps"] = torch.where(far, current + 3.0, current)
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    weight = probe.ctx.policy_weight
    mask = inputs["completion_mask"].float()
    assert weight is not None and 0 < float((weight * mask).sum()) < float(mask.sum())  # both masks cut something
    assert not bool((weight[far.expand_as(weight)] > 0).any())  # the off-policy rows are out
    leaf = probe.logps.detach().clone().requires_grad_(True)
    per_token = -inputs["advantages"].unsqueeze(1) * weight * leaf
    aggregate_single_process(trainer, per_token, inputs, "dapo").backward()
    torch.testing.assert_close(probe.logps.grad, leaf.grad)
    assert bool(((probe.logps.grad != 0) == ((weight > 0) & mask.bool())).all())


@pytest.mark.parametrize("settings", [{}, {"mask_truncated_completions": True, "pad_to_multiple_of": 8}])
def test_rollout_tensors_parity_with_trls_padding(make_trainer, train_dataset, settings):
    """rollouts.rollout_tensors (how AEPO's and dynamic sampling's rows are padded before they join TRL's batch) pads
    exactly as TRL 1.16's _generate_and_score_completions pads its own batch: the same rows, given as the token lists
    TRL's _generate returns, come back as TRL's prompt / completion ids and masks."""
    from trl_grpo_ext.adapter.rollouts import Rollout, rollout_tensors

    trainer = make_trainer(max_completion_length=6, **settings)
    generated = {}
    original = trainer._generate

    def spy(prompts):
        out = original(prompts)
        generated["prompt_ids"], generated["completion_ids"] = out[0], out[1]
        return out

    trainer._generate = spy
    out = scored_batch(trainer, train_dataset)
    rollout = Rollout(generated["prompt_ids"], generated["completion_ids"], None, [None] * len(out["prompt_ids"]), None)
    ours = rollout_tensors(rollout, trainer.ext_rollouts)
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
        torch.testing.assert_close(ours[key], out[key], msg=key)
    if settings:  # both settings acted: widths rounded up to 8, a row cut at max_completion_length masked whole
        assert ours["completion_ids"].size(1) % 8 == 0 and ours["prompt_ids"].size(1) % 8 == 0
        assert bool((ours["completion_mask"].sum(1) == 0).any())


def test_logps_at_temperature_parity_with_trls_fused_head(make_trainer, train_dataset):
    """``policy_logps_at_temperature`` at the training temperature is TRL's own (fused-head) log-probs; at another it
    is the model's logits divided by that temperature (what vLLM's ``processed_logprobs`` report for AEPO's rows)."""
    from trl_grpo_ext.adapter.compat import policy_logps_at_temperature

    trainer = make_trainer(temperature=0.7)
    out = scored_batch(trainer, train_dataset)
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    mask = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    width = out["completion_ids"].size(1)
    valid = out["completion_mask"].bool()
    with torch.no_grad():
        trl_logps = policy_logps(trainer, out)
    ours = policy_logps_at_temperature(trainer, ids, mask, width, temperature=0.7)
    torch.testing.assert_close(ours[valid], trl_logps[valid], atol=1e-5, rtol=1e-5)
    hot = policy_logps_at_temperature(trainer, ids, mask, width, temperature=1.5)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=mask, fused_lm_head=False).logits[:, -width - 1 : -1]
    by_hand = torch.log_softmax(logits / 1.5, dim=-1).gather(-1, out["completion_ids"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(hot[valid], by_hand[valid], atol=1e-5, rtol=1e-5)
    assert (hot[valid] - trl_logps[valid]).abs().max() > 0.05  # the temperature really changed them


def test_the_rollout_service_calls_trls_methods_not_the_plugins_overrides(make_trainer, train_dataset, monkeypatch):
    """The rollout service (AEPO's and dynamic sampling's scoring and forwards outside TRL's batch) and the reference
    forward call TRL's own ``GRPOTrainer`` methods, never the adapter's overrides: no re-entry into the hooks, whose
    hand-offs rely on TRL's call order. With the overrides made to fail, they still score and forward; and a scored
    infinite reward is still refused (the checks run explicitly)."""
    from trl_grpo_ext.adapter.compat import reference_logps
    from trl_grpo_ext.adapter.hooks import TRLHooks

    trainer = make_trainer(entropy_control="aepo", beta=0.04)
    out = scored_batch(trainer, train_dataset)

    def reentered(*args, **kwargs):
        raise AssertionError("the rollout service re-entered the plugin's override")

    for name in ("_calculate_rewards", "_get_per_token_logps_and_entropies", "_generate_and_score_completions"):
        monkeypatch.setattr(TRLHooks, name, reentered)
    rows = [dict(row) for row in train_dataset.select(range(4))]
    rewards = trainer.ext_rollouts.score(rows, [r["prompt"] for r in rows], ["1"] * 4, [[1]] * 4)
    assert rewards.shape == (4,) and bool(torch.isfinite(rewards).all())
    chunk = {key: out[key][:2] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    logps, _ = trainer.ext_rollouts.policy_logps(chunk)
    assert logps.shape == chunk["completion_ids"].shape
    ids = torch.cat([chunk["prompt_ids"], chunk["completion_ids"]], 1)
    mask = torch.cat([chunk["prompt_mask"], chunk["completion_mask"]], 1)
    assert reference_logps(trainer, ids, mask, chunk["completion_ids"].size(1)).shape == logps.shape
    trainer.reward_funcs[0] = lambda completions, **kwargs: [float("inf")] * len(completions)
    with pytest.raises(ValueError, match="infinite reward"):
        trainer.ext_rollouts.score(rows, [r["prompt"] for r in rows], ["1"] * 4, [[1]] * 4)
