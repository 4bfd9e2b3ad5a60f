"""Tiny-model runs and exact checks of each family inside the trainer, alone and all together."""

import json
import logging
import math

import pytest
import torch
from conftest import (
    LogpProbe,
    aggregate_single_process,
    assert_masked_equals_removed,
    last_logs,
    random_advantage_batch,
    scored_batch,
)
from transformers import AutoModelForCausalLM

from trl_grpo_ext import GRPOExtTrainer
from trl_grpo_ext.api import KEEP_KEY
from trl_grpo_ext.core import kl_cov_mask

FEATURES = {
    "population_std": dict(advantage_std="population"),
    "clip_cov": dict(token_clip="clip_cov", clip_cov_ratio=0.05, clip_cov_lb=-100.0, clip_cov_ub=100.0, beta=0.04),
    "clip_cov_global": dict(token_clip="clip_cov", token_clip_scope="global", clip_cov_ratio=0.05, clip_cov_lb=-100.0),
    "kl_cov": dict(token_clip="kl_cov", num_iterations=2, kl_cov_ratio=0.05),
    "best_of_n": dict(sample_filter="best_of_n"),
    "best_random": dict(sample_filter="best_random", beta=0.04),
    "best_worst": dict(sample_filter="best_worst", loss_type="grpo"),
    "nonzero_std": dict(sample_filter="nonzero_std"),
    "adaptive_kl": dict(kl_control="adaptive", beta=0.04, kl_target=0.01, kl_horizon=100),
    "all_clip_cov": dict(
        advantage_std="population",
        token_clip="clip_cov",
        clip_cov_ratio=0.05,
        clip_cov_lb=-100.0,
        sample_filter="best_worst",
        kl_control="adaptive",
        beta=0.04,
        kl_horizon=100,
        loss_type="grpo",
    ),
    "all_kl_cov": dict(
        advantage_std="population",
        token_clip="kl_cov",
        num_iterations=2,
        kl_cov_ratio=0.05,
        token_clip_scope="global",
        sample_filter="best_random",
        kl_control="adaptive",
        beta=0.04,
        kl_horizon=100,
    ),
}


def _expected_keys(cfg):
    """What the selected members declare they log every time they act (their ``metrics``)."""
    from trl_grpo_ext.families import FAMILIES

    selected = [registry.get(cfg[switch]) for switch, registry in FAMILIES.items() if cfg.get(switch)]
    return [key for member in selected for key in member.metrics]


@pytest.mark.parametrize("name", list(FEATURES))
def test_tiny_training_run(make_trainer, tiny_model_path, name):
    cfg = FEATURES[name]
    trainer = make_trainer(max_steps=4, **cfg)
    trainer.train()
    logs = last_logs(trainer)
    assert len(logs) == 4
    assert all(math.isfinite(h["loss"]) for h in logs)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    trained = dict(trainer.model.named_parameters())
    assert any(not torch.equal(p, trained[k].detach()) for k, p in initial.named_parameters())
    for key in _expected_keys(cfg):
        assert any(key in h for h in logs), f"{key} not logged"
    if cfg.get("kl_control") == "adaptive":
        betas = [h["kl/beta"] for h in logs]
        assert betas[0] == 0.04 and len(set(betas)) > 1
        assert all(cfg.get("kl_beta_min", 1e-4) <= b <= 1.0 for b in betas)


def test_best_of_n_keeps_the_best_rewarded_rows_of_the_batch_trl_scored(make_trainer):
    """best_of_n keeps one row per group (kept_frac 1/G) and logs the rewards of the rows it kept and dropped: their
    row-weighted mean is TRL's logged batch reward, and the kept rows' mean is at least the dropped rows' (the best
    of each group), strictly where some group's rewards differ."""
    trainer = make_trainer(max_steps=3, sample_filter="best_of_n")
    trainer.train()
    group = trainer.args.num_generations
    for h in last_logs(trainer):
        assert h["filter/kept_frac"] == pytest.approx(1 / group)
        kept, dropped = h["filter/kept_reward_mean"], h["filter/dropped_reward_mean"]
        assert (kept + (group - 1) * dropped) / group == pytest.approx(h["reward"], rel=1e-5, abs=1e-7), h
        assert kept >= dropped
        if h["frac_reward_zero_std"] < 1.0:
            assert kept > dropped, h


def test_adaptive_kl_steers_beta_from_the_kl_trl_measures(make_trainer):
    """The controller reads the KL TRL's loss uses (``kl/value`` equals TRL's own ``kl`` metric: one micro-batch and
    one process per step) and each step's beta is the controller's update of the previous one on it (a member that
    measured some other KL, or logged the new beta as the one used, fails here)."""
    from trl_grpo_ext.core.kl_control import AdaptiveKLController

    cfg = FEATURES["adaptive_kl"]
    trainer = make_trainer(max_steps=4, **cfg)
    trainer.train()
    logs = last_logs(trainer)
    assert all(h["kl/value"] == pytest.approx(h["kl"], rel=1e-4, abs=1e-9) for h in logs), logs
    assert any(h["kl/value"] > 0 for h in logs)
    replay = AdaptiveKLController(0.04, target=cfg["kl_target"], horizon=cfg["kl_horizon"], beta_min=1e-4, beta_max=1.0)
    rows = trainer.args.per_device_train_batch_size  # completions per optimizer step (one process, no accumulation)
    for before, after in zip(logs, logs[1:], strict=False):
        assert before["kl/beta"] == pytest.approx(replay.value, rel=1e-6)
        replay.update(before["kl/value"], n_steps=rows)
        assert after["kl/beta"] == pytest.approx(replay.value, rel=1e-6)
    assert trainer.beta == pytest.approx(replay.update(logs[-1]["kl/value"], n_steps=rows), rel=1e-6)


def test_population_std_advantages_in_batch(make_trainer, train_dataset):
    from trl_grpo_ext.core import group_relative_advantages

    trainer = make_trainer(advantage_std="population")
    out = scored_batch(trainer, train_dataset)
    rewards = torch.tensor(list(trainer._logs["rewards"]["exact_match_reward"])) + torch.tensor(
        list(trainer._logs["rewards"]["digit_fraction_reward"])
    )
    expected = group_relative_advantages(rewards, 4, std="population")
    torch.testing.assert_close(out["advantages"], expected)
    torch.testing.assert_close(torch.tensor(list(trainer._logs["advantages"])), expected)


@pytest.mark.filterwarnings("ignore:.*not a percentage")  # a large ratio on purpose: many tokens
def test_clip_cov_removes_exactly_the_selected_tokens_policy_gradient(make_trainer, train_dataset):
    trainer = make_trainer(
        token_clip="clip_cov", clip_cov_ratio=0.25, clip_cov_lb=-100.0, clip_cov_ub=100.0, beta=0.1, loss_type="bnpo"
    )
    probe = LogpProbe().install(trainer)
    inputs = random_advantage_batch(trainer, train_dataset)
    inputs["ref_per_token_logps"] = inputs["ref_per_token_logps"] + 0.5  # a non-zero KL gradient everywhere
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grad_clipped = probe.logps.grad.clone()
    selected = trainer._metrics["train"]["clip_cov/selected_frac"][-1]
    assert selected > 0
    # Reference: no clip, but token-level advantages zeroed where Clip-Cov selected: the policy term vanishes there,
    # the KL term stays; every other token is unchanged.
    ext = trainer.extensions.pop("token_clip")
    captured = {}

    class Capture(type(ext)):
        def modify_logps(self, logps, ctx):
            out = super().modify_logps(logps, ctx)
            captured["sel"] = ctx.selected
            return out

    trainer.extensions["token_clip"] = trainer.ext_build(Capture)
    trainer.model.zero_grad()
    trainer._compute_loss(trainer.model, inputs).backward()
    sel = captured["sel"]
    torch.testing.assert_close(probe.logps.grad, grad_clipped)  # same seed, same selection
    trainer.extensions.pop("token_clip")
    adv = inputs["advantages"].unsqueeze(1).expand_as(sel).masked_fill(sel, 0.0)
    trainer.model.zero_grad()
    ref_loss = trainer._compute_loss(trainer.model, {**inputs, "advantages": adv})
    ref_loss.backward()
    torch.testing.assert_close(probe.logps.grad, grad_clipped)
    mask = inputs["completion_mask"].bool()
    assert int(sel.sum()) == max(1, math.floor(0.25 * int(mask.sum())))


@pytest.mark.filterwarnings("ignore:.*not a percentage")  # a large ratio on purpose: many tokens
def test_kl_cov_penalty_value_and_gradient(make_trainer, train_dataset):
    trainer = make_trainer(
        token_clip="kl_cov", num_iterations=2, kl_cov_ratio=0.2, kl_cov_coef=0.7, loss_type="dr_grpo"
    )
    assert trainer.epsilon_low == math.inf and trainer.epsilon_high == math.inf  # paper: no PPO clip
    probe = LogpProbe().install(trainer)
    inputs = random_advantage_batch(trainer, train_dataset)
    old = inputs["old_per_token_logps"] + 0.3 * torch.randn(inputs["old_per_token_logps"].shape)
    inputs["old_per_token_logps"] = old
    with_penalty = trainer._compute_loss(trainer.model, inputs)
    with_penalty.backward()
    grad_with = probe.logps.grad.clone()
    logps = probe.logps.detach()
    mask = inputs["completion_mask"]
    sel = kl_cov_mask(logps, inputs["advantages"], mask, ratio=0.2)
    ext = trainer.extensions.pop("token_clip")
    trainer.model.zero_grad()
    without = trainer._compute_loss(trainer.model, inputs)
    without.backward()
    grad_without = probe.logps.grad.clone()

    def agg(x):
        return aggregate_single_process(trainer, x, inputs, "dr_grpo")

    torch.testing.assert_close(with_penalty - without, 0.7 * agg((logps - old).abs() * sel))
    weights = torch.zeros_like(logps, requires_grad=True)
    agg(weights).backward()
    expected_grad = 0.7 * torch.sign(logps - old) * sel * weights.grad
    torch.testing.assert_close(grad_with - grad_without, expected_grad)
    assert int(sel.sum()) == max(1, math.floor(0.2 * int(mask.sum())))
    assert ext.prefix == "kl_cov"


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "luspo", "sapo", "cispo", "vespo"])
def test_filtered_loss_equals_loss_on_kept_rows(make_trainer, train_dataset, loss_type):
    """Masking rows (with num_items recount and per-sequence rescale) == physically removing them, KL included."""
    trainer = make_trainer(
        sample_filter="best_worst", loss_type=loss_type, beta=0.2, epsilon_high=5.0, entropy_coef=0.01
    )
    out = scored_batch(trainer, train_dataset)
    keep = out[KEEP_KEY]
    assert 0 < int(keep.sum()) < keep.numel()
    assert_masked_equals_removed(trainer, out)


def test_every_row_filtered_trains_with_zero_loss_and_warns(make_trainer, caplog):
    def constant(completions, **kwargs):
        return [1.0] * len(completions)

    trainer = make_trainer(sample_filter="nonzero_std", reward_funcs=[constant], max_steps=2, loss_type="dapo")
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext"):
        trainer.train()
    logs = last_logs(trainer)
    assert [h["loss"] for h in logs] == [0.0, 0.0]
    assert all(h["filter/all_filtered"] == 1.0 and h["filter/kept_frac"] == 0.0 for h in logs)
    assert "dropped every completion" in caplog.text


def test_infinite_reward_is_refused(make_trainer):
    def broken(completions, **kwargs):
        return [float("inf")] + [0.0] * (len(completions) - 1)

    trainer = make_trainer(reward_funcs=[broken])
    with pytest.raises(ValueError, match=r"\['broken'\] returned an infinite reward"):
        trainer.train()


def test_plain_grpo_config_is_refused(tiny_model_path, tokenizer, train_dataset, tmp_path):
    from trl import GRPOConfig

    with pytest.raises(TypeError, match="GRPOExtConfig"):
        GRPOExtTrainer(
            model=tiny_model_path,
            reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
            args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none"),
            train_dataset=train_dataset,
            processing_class=tokenizer,
        )


def test_adaptive_kl_state_saved_and_resumed(make_trainer, tmp_path):
    cfg = dict(
        kl_control="adaptive",
        beta=0.04,
        kl_target=0.01,
        kl_horizon=50,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
    )
    full = make_trainer(**cfg)
    full.train()
    betas_full = [h["kl/beta"] for h in last_logs(full)]
    state = json.loads((tmp_path / "out" / "checkpoint-2" / "grpo_ext_state.json").read_text())
    assert state["kl_control"]["value"] == pytest.approx(betas_full[2])
    assert state["kl_control"]["num_updates"] == 2

    resumed = make_trainer(**cfg)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    betas_resumed = [h["kl/beta"] for h in last_logs(resumed)]
    assert betas_resumed[-2:] == pytest.approx(betas_full[-2:], rel=1e-6)
    assert resumed.beta == pytest.approx(full.beta, rel=1e-6)


def test_kl_cov_says_when_it_drops_trls_ratio_clip(make_trainer, caplog):
    import logging
    import math

    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.families.token_clip"):
        trainer = make_trainer(token_clip="kl_cov", num_iterations=2)
    assert "switches TRL's PPO ratio clip off (epsilon_low=0.2, epsilon_high=0.2" in caplog.text
    assert "kl_cov_ppo_clip=True" in caplog.text
    assert trainer.epsilon_low == math.inf and trainer.epsilon_high == math.inf
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.families.token_clip"):
        kept = make_trainer(token_clip="kl_cov", num_iterations=2, epsilon_high=0.28, kl_cov_ppo_clip=True)
    assert "ratio clip off" not in caplog.text and (kept.epsilon_low, kept.epsilon_high) == (0.2, 0.28)


@pytest.mark.parametrize(
    ("fields", "named"),
    [(dict(epsilon_high=0.28), "epsilon_high=0.28"), (dict(loss_type="cispo"), "loss_type='cispo'")],
)
def test_kl_cov_refuses_to_drop_a_clip_the_user_asked_for(make_trainer, fields, named):
    with pytest.raises(ValueError, match=r"kl_cov_ppo_clip=False.*" + named.replace("(", r"\(")) as err:
        make_trainer(token_clip="kl_cov", num_iterations=2, **fields)
    assert "set kl_cov_ppo_clip=True" in str(err.value)


def test_clip_cov_excludes_exactly_the_tokens_trls_ratio_clip_clipped(make_trainer):
    """Clip-Cov leaves the tokens TRL's PPO clip already clipped out of its selection; the fraction it logs
    (clip_cov/ppo_clipped_frac) is TRL's own clip_ratio/region_mean, step by step, once the ratio moves off 1
    (num_iterations=2, a large learning rate)."""
    trainer = make_trainer(
        max_steps=4, token_clip="clip_cov", num_iterations=2, learning_rate=0.2, epsilon=0.05, clip_cov_ratio=0.05
    )
    trainer.train()
    logs = last_logs(trainer)
    assert any(h["clip_ratio/region_mean"] > 0 for h in logs), logs
    for h in logs:
        assert h["clip_cov/ppo_clipped_frac"] == pytest.approx(h["clip_ratio/region_mean"], abs=1e-6), h


def test_diversity_kl_steers_beta_from_the_batchs_distinct_n(make_trainer):
    """kl_control='diversity': each batch's Distinct-N (kl/diversity) moves beta by the controller's rule, and the
    beta logged is the one the step used (the controller's replay gives every logged beta and the final one)."""
    from trl_grpo_ext.core.kl_control import DiversityKLController

    trainer = make_trainer(max_steps=4, kl_control="diversity", beta=0.04, kl_horizon=100, kl_diversity_target=0.9)
    trainer.train()
    logs = last_logs(trainer)
    args = trainer.args
    replay = DiversityKLController(
        0.04, args.kl_diversity_target, args.kl_horizon, beta_min=args.kl_beta_min, beta_max=args.kl_beta_max
    )
    rows = args.per_device_train_batch_size  # completions per generation batch (one process)
    assert all(0.0 < h["kl/diversity"] <= 1.0 for h in logs)
    for h in logs:
        assert h["kl/beta"] == pytest.approx(replay.value, rel=1e-6), h
        replay.update(h["kl/diversity"], n_steps=rows)
    assert trainer.beta == pytest.approx(replay.value, rel=1e-6)
    assert len({h["kl/beta"] for h in logs}) > 1  # it moved


@pytest.mark.parametrize("clip", ["clip_cov", "kl_cov"])
def test_token_clip_metrics_by_hand(make_trainer, train_dataset, clip):
    """What Clip-Cov / KL-Cov log for a micro-batch, recomputed from its log-probs and advantages: the selected
    fraction and count, the mean covariance of the valid and of the selected tokens, and KL-Cov's mean penalty
    |logp - old logp| over the selected tokens (old log-probs moved off the current ones so it is not 0)."""
    from trl_grpo_ext.core import kl_cov_penalty, token_covariance

    ratio = (
        {"clip_cov_ratio": 0.2, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}  # the tiny model's covariances are small
        if clip == "clip_cov"
        else {"kl_cov_ratio": 0.2}
    )
    trainer = make_trainer(token_clip=clip, num_iterations=2, beta=0.0, **ratio)
    probe = LogpProbe().install(trainer)
    member = trainer.extensions["token_clip"]
    seen = {}
    select = member.select_tokens

    def capture(logps, ctx):
        output = select(logps, ctx)  # (selected, metrics)
        seen["selected"] = output[0]
        return output

    member.select_tokens = capture
    inputs = scored_batch(trainer, train_dataset)
    noise = torch.randn(inputs["old_per_token_logps"].shape, generator=torch.Generator().manual_seed(0))
    inputs["old_per_token_logps"] = inputs["old_per_token_logps"] + 0.1 * noise
    trainer.model.zero_grad()
    trainer._compute_loss(trainer.model, inputs)
    logps, selected = probe.logps.detach(), seen["selected"]
    valid = inputs["completion_mask"].bool()
    cov = token_covariance(logps, inputs["advantages"], valid)
    assert 0 < int(selected.sum()) < int(valid.sum())
    logged = {key: values[-1] for key, values in trainer._metrics["train"].items() if key.startswith(f"{clip}/")}
    assert logged[f"{clip}/selected_frac"] == pytest.approx(float(selected.sum() / valid.sum()))
    assert logged[f"{clip}/selected_tokens"] == float(selected.sum())
    assert logged[f"{clip}/cov_mean"] == pytest.approx(float(cov[valid].mean()), rel=1e-5, abs=1e-7)
    assert logged[f"{clip}/selected_cov_mean"] == pytest.approx(float(cov[selected].mean()), rel=1e-5)
    if clip == "kl_cov":
        penalty = kl_cov_penalty(logps, inputs["old_per_token_logps"], selected)
        assert logged["kl_cov/penalty_mean"] == pytest.approx(float(penalty.sum() / selected.sum()), rel=1e-5)
        assert logged["kl_cov/penalty_mean"] > 0
