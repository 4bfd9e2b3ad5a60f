"""refill='dynamic_sampling' in the trainer: groups without signal replaced by new groups with signal (their
tokens, TRL's group-normalised advantages, masks, old log-probs), "replace" duplicating the batch's own groups, "filter"
masking what no round refilled, the dataset checked at construction, and tiny training runs alone and with the other
families. The 2-process, sharded-engine runs are in tests/test_sharded.py (mode "dynamic")."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_masked_equals_removed, last_logs

from grpo_lab import testkit
from trl_grpo_ext.core.advantages import group_relative_advantages


def has_signal(prompt: str) -> bool:
    """The prompts whose groups get varied rewards: digit sums not divisible by 3 (about two thirds of the dataset)."""
    return sum(int(ch) for ch in prompt if ch.isdigit()) % 3 != 0


def flat_or_length(prompts, completions, **kwargs):
    """1.0 for every completion of a prompt without signal; the completion's length for the others."""
    return [float(len(c)) if has_signal(p) else 1.0 for p, c in zip(prompts, completions, strict=True)]


def only_prompt(target: str):
    """A reward with signal for ``target``'s groups only (every drawn prompt is flat, bar a 1-in-256 draw)."""

    def reward(prompts, completions, **kwargs):
        return [float(len(c)) if p == target else 1.0 for p, c in zip(prompts, completions, strict=True)]

    return reward


def batch_of(dataset, flat_first: bool = True, group: int = 4):
    """Two prompt groups: one flat, one with signal (in that order when ``flat_first``)."""
    flat = next(r for r in dataset if not has_signal(r["prompt"]))
    signal = next(r for r in dataset if has_signal(r["prompt"]))
    pair = (flat, signal) if flat_first else (signal, flat)
    return [row for row in pair for _ in range(group)]


def generate(trainer, rows):
    trainer.model.train(True)
    trainer.current_gradient_accumulation_steps = 1
    splices = []
    apply = trainer._apply_splice

    def watch(out, splice):
        splices.append(splice)
        apply(out, splice)

    trainer._apply_splice = watch
    return trainer._generate_and_score_completions(rows), splices


def metric(trainer, name):
    return trainer._metrics["train"][name][-1]


def test_refill_puts_a_new_group_with_signal_in_place_of_the_flat_one(make_trainer, train_dataset):
    trainer = make_trainer(
        refill="dynamic_sampling",
        dynamic_sampling_max_rounds=5,
        reward_funcs=[flat_or_length],
        max_completion_length=8,
        beta=0.04,
    )
    out, splices = generate(trainer, batch_of(train_dataset))
    (splice,) = splices
    assert splice.rows == [0, 1, 2, 3] and not splice.copies
    new = splice.rollout
    prompts = trainer.processing_class.batch_decode(new.prompt_ids)
    assert len(set(prompts)) == 1 and has_signal(prompts[0])  # one new group, from a prompt with signal
    rewards = torch.tensor(flat_or_length(prompts, new.completions))
    assert rewards.std() > 0
    torch.testing.assert_close(out["advantages"][:4], group_relative_advantages(rewards, 4))  # TRL's formula
    for i, ids in enumerate(new.completion_ids):  # the new tokens, TRL's padding
        width = len(ids)
        assert out["completion_ids"][i, :width].tolist() == list(ids)
        assert out["completion_mask"][i, :width].all() and not out["completion_mask"][i, width:].any()
    # the reference log-probs of the new rows are recomputed (beta > 0), the kept group keeps its own
    ref = trainer._get_per_token_logps_and_entropies(
        trainer.ref_model if trainer.ref_model is not None else trainer.model,
        torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1),
        torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1),
        out["completion_ids"].size(1),
    )[0]
    mask = out["completion_mask"].bool()
    torch.testing.assert_close(out["ref_per_token_logps"][mask], ref[mask], rtol=1e-4, atol=1e-5)
    assert "tool_mask" not in out  # every row trains: nothing masked
    assert metric(trainer, "dynamic/signal_frac_before") == 0.5 and metric(trainer, "dynamic/signal_frac_after") == 1.0
    assert metric(trainer, "dynamic/refilled_groups") == 1.0 and metric(trainer, "dynamic/rounds") >= 1
    assert metric(trainer, "dynamic/kept_frac") == 1.0 and metric(trainer, "dynamic/extra_gen_time") >= 0  # logged


def test_no_flat_group_no_round_no_splice(make_trainer, train_dataset):
    trainer = make_trainer(refill="dynamic_sampling", reward_funcs=[flat_or_length], max_completion_length=8)
    signal = [r for r in train_dataset if has_signal(r["prompt"])][:2]
    out, splices = generate(trainer, [r for r in signal for _ in range(4)])
    assert splices == [] and metric(trainer, "dynamic/rounds") == 0
    assert metric(trainer, "dynamic/refilled_groups") == 0 and metric(trainer, "dynamic/kept_frac") == 1.0


@pytest.mark.parametrize("fill", ["filter", "replace"])
def test_what_no_round_refilled(make_trainer, train_dataset, fill):
    rows = batch_of(train_dataset, flat_first=False)  # group 0 has signal, group 1 is flat
    trainer = make_trainer(
        refill="dynamic_sampling",
        dynamic_sampling_max_rounds=1,
        dynamic_sampling_fill=fill,
        reward_funcs=[only_prompt(rows[0]["prompt"])],
        max_completion_length=8,
    )
    out, splices = generate(trainer, rows)
    assert metric(trainer, "dynamic/rounds") == 1 and metric(trainer, "dynamic/refilled_groups") == 0
    if fill == "filter":  # DAPO: masked, as nonzero_std masks it
        assert splices == []
        assert out["tool_mask"][:4].bool().all() and not out["tool_mask"][4:].any()
        assert metric(trainer, "dynamic/kept_frac") == 0.5 and metric(trainer, "dynamic/signal_frac_after") == 0.5
    else:  # Polaris: group 1 becomes a copy of group 0, advantages and tokens included
        (splice,) = splices
        assert splice.copies == [(k, 4 + k) for k in range(4)]
        for key in ("completion_ids", "completion_mask", "prompt_ids", "advantages"):
            torch.testing.assert_close(out[key][4:], out[key][:4])
        assert "tool_mask" not in out and metric(trainer, "dynamic/duplicated_groups") == 1.0
        assert metric(trainer, "dynamic/signal_frac_after") == 1.0


def test_zero_rounds_is_nonzero_std(make_trainer, train_dataset):
    rows = batch_of(train_dataset)
    outs = {}
    for name, extra in (
        ("dynamic", dict(refill="dynamic_sampling", dynamic_sampling_max_rounds=0)),
        ("nonzero_std", dict(sample_filter="nonzero_std")),
    ):
        trainer = make_trainer(
            reward_funcs=[flat_or_length],
            max_completion_length=8,
            **extra,
        )
        outs[name] = generate(trainer, rows)[0]
    torch.testing.assert_close(outs["dynamic"]["tool_mask"], outs["nonzero_std"]["tool_mask"])
    assert not outs["dynamic"]["tool_mask"][:4].any()


def test_a_streaming_dataset_refills_from_this_processs_share_of_the_stream(make_trainer, train_dataset):
    """An ``IterableDataset`` cannot be indexed: the refill takes the stream's next rows (one process: all of them, in
    order), restarting it when it ends."""
    stream = train_dataset.select(range(6)).to_iterable_dataset()
    trainer = make_trainer(
        refill="dynamic_sampling",
        dynamic_sampling_max_rounds=1,
        reward_funcs=[flat_or_length],
        trainer_kwargs={"train_dataset": stream},
    )
    rollouts = trainer.ext_rollouts
    first = [row["prompt"] for row in rollouts.draw_prompts(4, torch.Generator())]
    second = [row["prompt"] for row in rollouts.draw_prompts(4, torch.Generator())]
    expected = [row["prompt"] for row in train_dataset.select(range(6))]
    assert first == expected[:4] and second == expected[4:6] + expected[:2]
    trainer.args.max_steps = 2
    trainer.train()  # TRL's own loader reads the same stream beside it
    assert trainer.state.global_step == 2


def test_an_empty_stream_is_named_at_the_first_refill(make_trainer, train_dataset):
    from datasets import IterableDataset

    trainer = make_trainer(refill="dynamic_sampling", reward_funcs=[flat_or_length])
    trainer.train_dataset = IterableDataset.from_generator(lambda: iter(()))
    with pytest.raises(ValueError, match=r"train_dataset \(a stream\) holds no row for this process"):
        trainer.ext_rollouts.draw_prompts(2, torch.Generator())


def test_refilled_groups_get_the_configured_estimators_advantages(make_trainer, train_dataset):
    """PKPO: the new group's advantages are its pass@k weights at the run's k (times n / k), as TRL's own groups'."""
    from trl_grpo_ext.core.pkpo import pass_at_k_weights

    trainer = make_trainer(
        refill="dynamic_sampling",
        dynamic_sampling_max_rounds=5,
        advantage_estimator="pass_at_k",
        pkpo_k=2,
        reward_funcs=[flat_or_length],
        max_completion_length=8,
    )
    out, (splice,) = generate(trainer, batch_of(train_dataset))
    prompts = trainer.processing_class.batch_decode(splice.rollout.prompt_ids)
    rewards = torch.tensor(flat_or_length(prompts, splice.rollout.completions))
    expected = (pass_at_k_weights(rewards, 4, 2) * (4 / 2)).float()
    torch.testing.assert_close(out["advantages"][:4], expected)
    torch.testing.assert_close(splice.advantages, expected)


@pytest.mark.parametrize(
    "others",
    [
        {},
        dict(  # the other exploration methods, a token clip, the KL controller, "replace", off-policy reuse
            dynamic_sampling_fill="replace",
            advantage_estimator="pass_at_k",
            pkpo_k=2,
            pkpo_anneal_fraction=0.5,  # k reaches 1, where PKPO's advantages have both signs for W-REINFORCE to weight
            advantage_weighting="w_reinforce",
            w_reinforce_baseline="group",
            token_clip="kl_cov",
            kl_control="adaptive",
            beta=0.04,
            num_iterations=2,
            diversity_metrics=["distinct", "entropy"],
        ),
        dict(  # AEPO's splice after the refill's, Clip-Cov, GRPO advantages
            token_clip="clip_cov",
            kl_control="adaptive",
            beta=0.04,
            entropy_control="aepo",
            aepo_regenerate_fraction=0.5,
            advantage_weighting="entropy_advantage",
            loss_type="grpo",
        ),
    ],
    ids=["alone", "with_pkpo_w_reinforce_kl_cov_adaptive_kl", "with_aepo_entropy_adv_clip_cov"],
)
def test_trains_alone_and_with_the_other_families(make_trainer, others):
    trainer = make_trainer(
        refill="dynamic_sampling",
        dynamic_sampling_max_rounds=2,
        reward_funcs=[flat_or_length, testkit.exact_match_reward],
        max_completion_length=6,
        max_steps=3,
        **others,
    )
    trainer.train()
    logs = last_logs(trainer)
    generation = [h for h in logs if "dynamic/rounds" in h]
    assert generation and all(math.isfinite(h["loss"]) for h in logs)
    assert all(0.0 <= h["dynamic/signal_frac_after"] <= 1.0 for h in generation)
    assert all(h["dynamic/signal_frac_after"] >= h["dynamic/signal_frac_before"] for h in generation)
    assert sum(h["dynamic/refilled_groups"] + h["dynamic/duplicated_groups"] for h in generation) > 0
    for member in trainer.extensions.values():  # every other member acted too: its metrics are logged
        assert all(any(key in h for h in logs) for key in member.metrics if not key.startswith("filter/")), member


def _rollout(n: int):
    from trl_grpo_ext.adapter.rollouts import Rollout

    return Rollout([[1]] * n, [[2, 3]] * n, None, ["x"] * n, None, None)


def test_splices_are_placed_on_rows_no_earlier_splice_took(caplog):
    """AEPO's "first rows" are the first rows dynamic sampling's refill did not write or copy onto; samples beyond the
    free rows are dropped with a warning (the splice itself stays: applying it is a collective)."""
    from trl_grpo_ext.adapter.rollouts import Splice, place_splices

    refill = Splice(_rollout(2), rows=[0, 1], advantages=torch.zeros(2), copies=[(6, 2), (7, 3)])
    aepo = Splice(_rollout(3), advantage=1.0)
    placed = place_splices([refill, aepo], batch_rows=8)
    assert placed[0] is refill and placed[1].rows == [4, 5, 6]  # rows 0-1 written, 2-3 copied onto
    assert placed[1].rollout.completion_ids == aepo.rollout.completion_ids and placed[1].advantage == 1.0
    assert place_splices([aepo], batch_rows=8)[0].rows == [0, 1, 2]  # alone: the first rows, as before
    with caplog.at_level("WARNING"):
        (_, crowded) = place_splices([Splice(_rollout(6), rows=[0, 1, 2, 3, 4, 5]), aepo], batch_rows=8)
    assert crowded.rows == [6, 7] and len(crowded.rollout.completion_ids) == 2
    assert "1 of its samples are dropped" in caplog.text
    (_, empty) = place_splices([Splice(_rollout(8), rows=list(range(8))), aepo], batch_rows=8)
    assert empty.rows == [] and empty.rollout.completion_ids == []


def test_aepo_does_not_overwrite_the_groups_dynamic_sampling_refilled(make_trainer, train_dataset):
    trainer = make_trainer(
        refill="dynamic_sampling",
        dynamic_sampling_max_rounds=5,
        entropy_control="aepo",
        aepo_adv_threshold=-10.0,  # every regenerated sample is a candidate
        aepo_regenerate_fraction=1.0,
        reward_funcs=[flat_or_length],
        max_completion_length=8,
    )
    out, splices = generate(trainer, batch_of(train_dataset))  # the flat group (rows 0-3) is refilled
    refill, aepo = splices
    assert refill.rows == [0, 1, 2, 3]
    assert aepo.rows and not set(aepo.rows) & set(refill.rows)
    assert aepo.rows == list(range(4, 4 + len(aepo.rows)))
    for i, row in enumerate(refill.rows):  # the refilled group is still in the batch after AEPO's splice
        ids = refill.rollout.completion_ids[i]
        assert out["completion_ids"][row, : len(ids)].tolist() == list(ids)


def test_a_sample_filter_chooses_among_the_refilled_groups_samples(make_trainer, train_dataset):
    """The refill's new group is in the batch the sample filter reads (rewards, prompts, completions, ids), and the
    filter's best-worst choice in that group is made on the new samples' rewards."""
    from trl_grpo_ext.api import KEEP_KEY

    trainer = make_trainer(
        refill="dynamic_sampling",
        dynamic_sampling_max_rounds=5,
        sample_filter="best_worst",
        reward_funcs=[flat_or_length],
        max_completion_length=8,
    )
    seen = []
    member = trainer.extensions.sample_filter
    choose = member.on_generation
    member.on_generation = lambda batch: seen.append(batch) or choose(batch)
    rows = batch_of(train_dataset)  # rows 0-3 flat (refilled), 4-7 with signal
    out, (splice,) = generate(trainer, rows)
    (batch,) = seen
    assert splice.rows == [0, 1, 2, 3]
    assert batch.completions[:4] == splice.rollout.completions
    assert batch.completion_ids_list[:4] == [list(ids) for ids in splice.rollout.completion_ids]
    assert len(set(batch.prompts[:4])) == 1 and has_signal(batch.prompts[0]) and batch.prompts[0] != rows[0]["prompt"]
    assert [row["prompt"] for row in batch.inputs[:4]] == batch.prompts[:4] and batch.prompts[4:] == [
        row["prompt"] for row in rows[4:]
    ]
    new_rewards = torch.tensor(flat_or_length(batch.prompts[:4], batch.completions[:4]))
    torch.testing.assert_close(batch.rewards[:4], new_rewards)
    torch.testing.assert_close(batch.rewards_per_func[:4, 0], new_rewards)
    keep = out[KEEP_KEY]
    for group in (slice(0, 4), slice(4, 8)):  # best-worst: one highest and one lowest reward of each group train
        kept = batch.rewards[group][keep[group]]
        assert int(keep[group].sum()) == 2 and set(kept.tolist()) == {
            batch.rewards[group].max().item(),
            batch.rewards[group].min().item(),
        }
    assert torch.equal(out["tool_mask"].bool().any(dim=1), keep)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_the_groups_a_refill_masks_leave_the_loss_as_if_removed(make_trainer, train_dataset, loss_type):
    """The row rescale follows the keep flags whoever returned them: with no sample filter, the group dynamic sampling
    left without signal (no round allowed) weighs in the loss and its gradient as if it were removed, KL included."""
    from trl_grpo_ext.api import KEEP_KEY

    trainer = make_trainer(
        refill="dynamic_sampling",
        dynamic_sampling_max_rounds=0,
        loss_type=loss_type,
        beta=0.2,
        reward_funcs=[flat_or_length],
        max_completion_length=8,
    )
    out, splices = generate(trainer, batch_of(train_dataset))
    assert splices == [] and out[KEEP_KEY].tolist() == [False] * 4 + [True] * 4
    assert_masked_equals_removed(trainer, out)


def test_a_refill_returning_a_splice_without_its_rewards_is_named(make_trainer, train_dataset, monkeypatch):
    """The members after a refill read its new samples' rewards and dataset rows: a splice without them is refused,
    naming the member and what to return."""
    from trl_grpo_ext.api import RefillUpdate
    from trl_grpo_ext.families.contracts import MemberContractError

    trainer = make_trainer(refill="dynamic_sampling", dynamic_sampling_max_rounds=5, reward_funcs=[flat_or_length])
    member = trainer.extensions.refill
    refill = member.on_generation

    def without_rewards(batch):
        update, metrics = refill(batch)
        return RefillUpdate(splice=update.splice, keep=update.keep, inputs=update.inputs), metrics

    member.on_generation = without_rewards
    with pytest.raises(
        MemberContractError, match=r"DynamicSampling\.on_generation at step 0: returned rewards_per_func"
    ):
        generate(trainer, batch_of(train_dataset))
