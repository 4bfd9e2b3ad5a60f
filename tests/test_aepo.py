"""AEPO: temperature switch, sample selection, loss term, and the trainer integration."""

import json
import logging
import math

import pytest
import torch
from conftest import last_logs, scored_batch

from grpo_lab import testkit
from trl_grpo_ext.config import AEPO_0_1_0
from trl_grpo_ext.core.aepo import (
    aepo_below_target,
    aepo_candidates,
    aepo_entropy_sums,
    aepo_per_token_loss,
    aepo_pick,
    aepo_sample_count,
)


def test_temperature_switch():
    """T_high under target, T_low above; equality by ``at_target``; nothing measured by ``unmeasured``."""
    kw = dict(target=0.5)
    assert aepo_below_target(0.3, **kw)  # entropy under target: sample hotter
    assert not aepo_below_target(0.9, **kw)
    assert not aepo_below_target(None, **kw)  # nothing measured, nothing assumed
    assert aepo_below_target(None, **kw, unmeasured="high")  # the reference starts from entropy 0
    # Exactly at the target: the reference's `if entropy <= entropy_base` samples hot; "low" samples cold.
    assert aepo_below_target(0.5, **kw)
    assert not aepo_below_target(0.5, **kw, at_target="low")


@pytest.mark.parametrize(
    "n, below, rule, expected",
    [
        # The reference: sample_num = min(60, n), halved with // above target.
        (100, True, "halve_count", 60),
        (40, True, "halve_count", 40),
        (40, False, "halve_count", 20),
        (1, False, "halve_count", 0),
        (100, False, "halve_count", 30),
        (0, True, "halve_count", 0),
        # Up to 0.1.0: min(n, cap), the cap halved above target (at least 1).
        (40, False, "halve_cap", 30),
        (1, False, "halve_cap", 1),
        (100, True, "halve_cap", 60),
        (7, False, "halve_cap", 7),
    ],
)
def test_sample_count_rules(n, below, rule, expected):
    assert aepo_sample_count(n, below_target=below, max_samples=60, cap_rule=rule) == expected


def test_cap_keeps_the_first_candidates_in_row_order():
    candidates = torch.tensor([False, True, True, False, True, True, True])
    assert aepo_pick(candidates, 3, order="first").tolist() == [False, True, True, False, True, False, False]
    assert aepo_pick(candidates, 0, order="first").tolist() == [False] * 7
    assert aepo_pick(candidates, 9, order="first").tolist() == candidates.tolist()
    drawn = [aepo_pick(candidates, 3, order="random", generator=torch.Generator().manual_seed(s)) for s in range(8)]
    assert all(int(d.sum()) == 3 and bool((d <= candidates).all()) for d in drawn)
    assert len({tuple(d.tolist()) for d in drawn}) > 1  # a draw, not the first three


def test_selection_threshold_and_cap():
    # Group 1: rewards 0, 1, 1, 0 -> advantages -0.866, +0.866, +0.866, -0.866 (sample std); group 2 flat.
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    assert aepo_candidates(rewards, 4, adv_threshold=0.05).tolist() == [False, True, True, False] + [False] * 4
    candidates = aepo_candidates(rewards, 4, adv_threshold=0.05)
    keep = aepo_pick(candidates, 10)
    assert keep.tolist() == [False, True, True, False, False, False, False, False]
    capped = aepo_pick(candidates, 1, order="random", generator=torch.Generator().manual_seed(0))
    assert int(capped.sum()) == 1 and (capped <= keep).all()
    first = aepo_pick(candidates, 1, order="first")
    assert first.tolist() == [False, True] + [False] * 6
    # A tiny positive advantage under the threshold does not count.
    assert not aepo_candidates(torch.tensor([0.0, 0.0, 0.0, 1e-3]), 4, adv_threshold=2.0).any()


def test_entropy_estimators_by_hand():
    logps = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -3.0, -9.0]])
    entropies = torch.tensor([[0.8, 1.1, 7.0], [0.4, 0.9, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    sampled = aepo_entropy_sums(logps=logps, entropies=entropies, mask=mask, estimator="sampled")
    exact = aepo_entropy_sums(logps=logps, entropies=entropies, mask=mask, estimator="exact")
    torch.testing.assert_close(sampled, torch.tensor([6.5, 4.0]))  # -mean(logp) = 1.625 (reference)
    torch.testing.assert_close(exact, torch.tensor([3.2, 4.0]))  # mean entropy 0.8
    with pytest.raises(ValueError, match="exact"):
        aepo_entropy_sums(logps=logps, entropies=None, mask=mask, estimator="exact")


def test_sampled_estimator_reads_hot_samples_above_the_entropy():
    # p = (0.7, 0.2, 0.1): H(p) = 0.8018 nats. Tokens drawn at T = 1.2 (q ~ p^(1/1.2)) have
    # q = (0.6454, 0.2272, 0.1274) and E_q[-log p] = 0.8894: the reference's estimator reads the hot batch 11% above
    # the policy's entropy.
    p = torch.tensor([0.7, 0.2, 0.1])
    q = p ** (1 / 1.2) / (p ** (1 / 1.2)).sum()
    logps = p.log().expand(1, 3)  # one position per vocabulary entry, weighted by how often it is drawn
    sampled = aepo_entropy_sums(logps=logps, entropies=None, mask=q.expand(1, 3), estimator="sampled")
    exact = -(p * p.log()).sum()
    torch.testing.assert_close(exact, torch.tensor(0.8018), atol=1e-4, rtol=0)
    torch.testing.assert_close(sampled[0] / sampled[1], torch.tensor(0.8894), atol=1e-4, rtol=0)


def test_loss_term_value_and_gradient():
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.5]])
    loss = aepo_per_token_loss(logps, old)
    torch.testing.assert_close(loss.detach(), torch.tensor([[-1.0, -math.exp(0.5)]]))
    loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.0, -math.exp(0.5)]]))  # REINFORCE at ratio 1: -1


@pytest.mark.parametrize("legacy", [False, True], ids=["reference", "0.1.0"])
def test_aepo_training_run_and_state(make_trainer, tmp_path, legacy):
    trainer = make_trainer(
        entropy_control="aepo",
        aepo_target_entropy=4.6,
        max_steps=4,
        steps_per_generation=2,
        save_strategy="steps",
        save_steps=2,
        reward_funcs=[testkit.digit_fraction_reward],
        **(AEPO_0_1_0 if legacy else {}),
    )
    trainer.train()
    logs = last_logs(trainer)
    gen_logs = [h for h in logs if "aepo/temperature" in h]
    # Reference: entropy starts at 0 (T_high); 0.1.0: nothing measured (T_low). Then ~4.5 < 4.6: hotter.
    assert gen_logs[0]["aepo/temperature"] == (0.8 if legacy else 1.2)
    assert gen_logs[1]["aepo/temperature"] == 1.2
    # 16 rows = 4 groups of 4: the reference regenerates the first quarter (one group), 0.1.0 all of them.
    assert all(h["aepo/regenerated"] == (16 if legacy else 4) for h in gen_logs)
    assert all(("aepo/loss" in h) == legacy and math.isfinite(h["loss"]) for h in logs)
    assert all(math.isfinite(h["aepo/extra_gen_time"]) and h["aepo/extra_gen_time"] >= 0 for h in gen_logs)
    # TRL's completion metrics describe the policy's own samples only.
    assert all(h["completions/mean_length"] <= trainer.max_completion_length for h in gen_logs)
    # The entropy that steers: exact (TRL's `entropy`) or -mean(logp) of the trained tokens, both near log(96) = 4.56.
    assert 4.0 < gen_logs[1]["aepo/entropy"] < 5.0
    state = json.loads((tmp_path / "out" / "checkpoint-4" / "grpo_ext_state.json").read_text())
    assert state["entropy_control"]["last_entropy"] == pytest.approx(trainer.extensions["entropy_control"].last_entropy)


def test_regenerated_rows_are_whole_groups(make_trainer, caplog):
    trainer = make_trainer(entropy_control="aepo")
    aepo = trainer.extensions["entropy_control"]
    assert aepo.regenerated_rows(16, 4) == 4  # a quarter of 4 groups
    assert aepo.regenerated_rows(64, 8) == 16  # a quarter of 8 groups
    assert aepo.regenerated_rows(8, 8) == 8  # at least one group
    assert aepo.regenerated_rows(24, 4) == 4  # floor(0.25 x 6) = 1 group, as the reference's len // 4
    trainer.args.aepo_regenerate_fraction = 1.0  # the member holds its own copy: a later edit does not reach it ...
    assert aepo.regenerated_rows(16, 4) == 4
    every = make_trainer(entropy_control="aepo", aepo_regenerate_fraction=1.0).extensions["entropy_control"]
    assert every.regenerated_rows(16, 4) == 16  # ... a config built with it does
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.families.entropy_control"):
        assert aepo.regenerated_rows(6, 4) == 6  # this process's rows split a group: all of them
    assert "split a group" in caplog.text


@pytest.mark.parametrize("mode", ["splice", "term"])
def test_aepo_composes_with_every_family(make_trainer, mode):
    def steps(prompts, completions, steps, **kwargs):
        return [[(len(s) % 3) / 2 for s in row] for row in steps]

    trainer = make_trainer(
        entropy_control="aepo",
        aepo_mode=mode,
        aepo_adv_threshold=0.0,
        advantage_estimator="prm",
        token_clip="clip_cov",
        clip_cov_lb=-100.0,
        clip_cov_ratio=0.05,
        sample_filter="best_worst",
        loss_type="grpo",
        kl_control="adaptive",
        beta=0.04,
        kl_horizon=50,
        max_steps=3,
        max_completion_length=8,
        diversity_metrics=["distinct", "entropy"],
        reward_funcs=[testkit.digit_fraction_reward],
        trainer_kwargs={"step_reward_funcs": [steps]},
    )
    trainer.train()
    logs = last_logs(trainer)
    assert len(logs) == 3 and all(math.isfinite(h["loss"]) for h in logs)
    assert sum(h["aepo/samples_used"] for h in logs) > 0
    for key in (
        "aepo/samples_used",
        "prm/adv_abs_mean",
        "clip_cov/selected_frac",
        "filter/kept_frac",
        "kl/beta",
        "diversity/distinct_2",
    ):
        assert any(key in h for h in logs), key


def test_aepo_refuses_the_entropy_bonus(make_trainer):
    with pytest.raises(ValueError, match="GRPOExtConfig.entropy_control='aepo'.*entropy_coef=0"):
        make_trainer(entropy_control="aepo", entropy_coef=0.01)
    with pytest.raises(ValueError, match="aepo_temperature_low"):
        make_trainer(entropy_control="aepo", aepo_temperature_low=1.5)


def _splice_spy(trainer):
    """Record TRL's batch before and after each splice, and the spliced rollout."""
    seen = []
    original = trainer._apply_splice

    def spy(out, splice):
        before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
        original(out, splice)
        seen.append((before, out, splice))

    trainer._apply_splice = spy
    return seen


def test_splice_puts_the_kept_samples_in_the_first_rows(make_trainer, train_dataset):
    trainer = make_trainer(
        entropy_control="aepo",
        aepo_adv_threshold=-10.0,  # every sample is a candidate
        aepo_regenerate_fraction=0.5,
        aepo_max_samples=3,
        beta=0.04,  # reference log-probs in the batch
        num_iterations=2,  # old log-probs in the batch
        max_completion_length=6,
    )
    seen = _splice_spy(trainer)
    scored_batch(trainer, train_dataset, num_prompts=2)  # 8 rows, 2 groups: one group regenerated, 3 kept
    ((before, out, splice),) = seen
    rollout = splice.rollout
    assert len(rollout.completion_ids) == 3 and splice.advantage == 1.0
    for i in range(3):
        n, p = len(rollout.completion_ids[i]), len(rollout.prompt_ids[i])
        assert out["completion_ids"][i, :n].tolist() == rollout.completion_ids[i]
        assert out["completion_mask"][i].tolist() == [1] * n + [0] * (out["completion_mask"].size(1) - n)
        assert out["prompt_ids"][i, -p:].tolist() == rollout.prompt_ids[i] and out["prompt_mask"][i].sum() == p
    torch.testing.assert_close(out["advantages"][:3], torch.ones(3))
    torch.testing.assert_close(out["advantages"][3:], before["advantages"][3:])  # the other rows are TRL's
    width = before["completion_ids"].size(1)
    torch.testing.assert_close(out["completion_ids"][3:, :width], before["completion_ids"][3:])
    torch.testing.assert_close(out["old_per_token_logps"][3:, :width], before["old_per_token_logps"][3:])
    # Old and reference log-probs of the spliced rows are those TRL computes for a row: recompute them by hand.
    ids = torch.cat([out["prompt_ids"][:3], out["completion_ids"][:3]], dim=1)
    attn = torch.cat([out["prompt_mask"][:3], out["completion_mask"][:3]], dim=1)
    t = out["completion_ids"].size(1)
    with torch.no_grad():
        old = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, t)[0]
        ref = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, attn, t)[0]
    mask = out["completion_mask"][:3].bool()
    torch.testing.assert_close(out["old_per_token_logps"][:3][mask], old[mask])
    torch.testing.assert_close(out["ref_per_token_logps"][:3][mask], ref[mask])
    assert int(out["num_items_in_batch"]) == int(out["completion_mask"].sum())


def test_spliced_rows_train_through_trls_clipped_loss(make_trainer, train_dataset):
    """The reference's samples go through the same PPO clip: no gradient once the ratio passes 1 + epsilon (the 0.1.0
    term's gradient there is -ratio: -1.3 at 1.3, test_loss_term_value_and_gradient)."""
    trainer = make_trainer(
        entropy_control="aepo", aepo_adv_threshold=-10.0, aepo_max_samples=2, max_completion_length=6
    )
    out = scored_batch(trainer, train_dataset, num_prompts=2)
    rows = {k: v[:2] if isinstance(v, torch.Tensor) and v.dim() > 0 else v for k, v in out.items()}
    torch.testing.assert_close(rows["advantages"], torch.ones(2))  # the two spliced rows
    ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1)
    attn = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1)
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attn, ids.size(1) - rows["prompt_ids"].size(1)
        )[0]
    grads = {}
    for ratio in (1.3, 1.1):
        trainer.model.zero_grad()
        inputs = {
            **rows,
            "old_per_token_logps": logps - math.log(ratio),
            "num_items_in_batch": rows["completion_mask"].sum(),
        }
        trainer._compute_loss(trainer.model, inputs).backward()
        grads[ratio] = sum(float(p.grad.abs().sum()) for p in trainer.model.parameters() if p.grad is not None)
    assert grads[1.3] == 0.0  # clipped: ratio 1.3 > 1 + epsilon_high = 1.2 with advantage 1
    assert grads[1.1] > 0.0


def test_aepo_warns_when_the_regenerated_samples_cannot_reach_the_cap(make_trainer, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.families.entropy_control"):
        make_trainer(entropy_control="aepo")  # 8 rows, 2 groups: one group regenerated, 4 samples < 60
    assert "regenerates 4 samples per generation batch, fewer than aepo_max_samples=60" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.families.entropy_control"):
        make_trainer(entropy_control="aepo", aepo_max_samples=4)
    assert "fewer than aepo_max_samples" not in caplog.text


@pytest.mark.parametrize("lora", [False, True], ids=["ref_model", "peft"])
def test_spliced_reference_logps_follow_trls_choice_of_reference(make_trainer, train_dataset, lora):
    """adapter.compat.reference_logps (which model is the reference: ref_model, or the PEFT base / "ref" adapter, copied
    from TRL 1.16), through the host as the splice calls it, gives TRL's own reference log-probs on TRL's rows."""
    kwargs = {}
    if lora:
        from peft import LoraConfig

        kwargs = {"peft_config": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])}
    trainer = make_trainer(entropy_control="aepo", aepo_mode="term", beta=0.04, trainer_kwargs=kwargs)
    assert (trainer.ref_model is None) == lora
    out = scored_batch(trainer, train_dataset, num_prompts=2)  # term mode: TRL's rows untouched
    chunk = {key: out[key] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    with torch.no_grad():
        ref = trainer.ext_rollouts.reference_logps(chunk)
    mask = out["completion_mask"].bool()
    torch.testing.assert_close(ref[mask], out["ref_per_token_logps"][mask])
