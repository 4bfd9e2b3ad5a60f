"""advantage_estimator='prm' inside the trainer: step functions, PRM models, composition, errors."""

import math
import random

import pytest
import torch
from conftest import last_logs, scored_batch
from datasets import Dataset

from grpo_lab import testkit
from trl_grpo_ext.core import group_relative_advantages, prm_step_advantages
from trl_grpo_ext.prm import CausalLMPRM, TokenClassificationPRM, segment_completion
from trl_grpo_ext.prm.training import tokenize_prm_example, train_prm


def length_steps(prompts, completions, steps, **kwargs):
    """A deterministic step score with spread under a random policy."""
    return [[(len(s) % 3) / 2 for s in row] for row in steps]


def expected_prm(trainer, out, *, outcome_coef=0.0, rewards=None):
    ids, mask = out["completion_ids"], out["completion_mask"]
    segs = [segment_completion(trainer._tokenizer, ids[i, : int(mask[i].sum())].tolist()) for i in range(ids.size(0))]
    step_rewards = length_steps(None, None, [s.texts for s in segs])
    adv = prm_step_advantages(step_rewards, [s.ends for s in segs], 4, ids.size(1))
    if outcome_coef:
        adv = adv + outcome_coef * group_relative_advantages(rewards, 4).unsqueeze(1)
    return adv * mask


def test_prm_advantages_from_step_functions(make_trainer, train_dataset):
    trainer = make_trainer(
        advantage_estimator="prm", max_completion_length=8, trainer_kwargs={"step_reward_funcs": [length_steps]}
    )
    out = scored_batch(trainer, train_dataset)
    assert out["advantages"].shape == out["completion_ids"].shape
    torch.testing.assert_close(out["advantages"], expected_prm(trainer, out))
    metrics = {key: values[-1] for key, values in trainer._metrics["train"].items()}
    mask = out["completion_mask"]
    ids = out["completion_ids"]
    segs = [segment_completion(trainer._tokenizer, ids[i, : int(mask[i].sum())].tolist()) for i in range(ids.size(0))]
    step_rewards = length_steps(None, None, [s.texts for s in segs])
    counts = [len(r) for r in step_rewards]
    flat = [v for r in step_rewards for v in r]
    assert metrics["prm/steps_mean"] == pytest.approx(sum(counts) / len(counts))
    assert metrics["prm/no_step_frac"] == pytest.approx(sum(c == 0 for c in counts) / len(counts))
    assert metrics["prm/step_reward_mean"] == pytest.approx(sum(flat) / len(flat))
    assert metrics["prm/adv_abs_mean"] == pytest.approx(float((out["advantages"].abs() * mask).sum() / mask.sum()))


def test_prm_outcome_mix(make_trainer, train_dataset):
    trainer = make_trainer(
        advantage_estimator="prm",
        prm_outcome_coef=0.5,
        max_completion_length=8,
        reward_funcs=[testkit.digit_fraction_reward],
        trainer_kwargs={"step_reward_funcs": length_steps},
    )
    out = scored_batch(trainer, train_dataset)
    rewards = torch.tensor(list(trainer._logs["rewards"]["digit_fraction_reward"]))
    torch.testing.assert_close(out["advantages"], expected_prm(trainer, out, outcome_coef=0.5, rewards=rewards))


def test_prm_needs_a_source_and_step_funcs_need_prm(make_trainer):
    with pytest.raises(ValueError, match="needs step rewards"):
        make_trainer(advantage_estimator="prm")
    with pytest.raises(ValueError, match="only with advantage_estimator='prm'"):
        make_trainer(trainer_kwargs={"step_reward_funcs": [length_steps]})


def test_wrong_step_count_is_a_clear_error(make_trainer, train_dataset):
    def one_score(prompts, completions, steps, **kw):
        return [[1.0] for _ in steps]

    trainer = make_trainer(
        advantage_estimator="prm",
        max_completion_length=12,
        prm_step_separator="1",
        trainer_kwargs={"step_reward_funcs": [one_score]},
    )
    with pytest.raises(ValueError, match="'one_score' returned 1 scores for completion"):
        for _ in range(5):  # some completion of these batches has 0 or >= 2 steps
            scored_batch(trainer, train_dataset)


def test_prm_composes_with_every_family(make_trainer):
    trainer = make_trainer(
        advantage_estimator="prm",
        max_steps=3,
        max_completion_length=8,
        prm_outcome_coef=0.5,
        token_clip="kl_cov",
        num_iterations=2,
        kl_cov_ratio=0.05,
        sample_filter="best_worst",
        kl_control="adaptive",
        beta=0.04,
        kl_horizon=50,
        loss_type="grpo",
        advantage_std="population",
        reward_funcs=[testkit.digit_fraction_reward],
        trainer_kwargs={"step_reward_funcs": length_steps},
    )
    trainer.train()
    logs = last_logs(trainer)
    assert len(logs) == 3 and all(math.isfinite(h["loss"]) for h in logs)
    for key in ("prm/adv_abs_mean", "kl_cov/selected_frac", "filter/kept_frac", "kl/beta"):
        assert any(key in h for h in logs), key


# --------------------------------------------------------------------------------------------- PRM models
def _prm_rows(n, seed):
    """Stepwise-supervision rows: a step is correct when its last digit is even (learnable by a tiny model)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        steps = [f"{rng.randint(0, 9)}+{rng.randint(0, 9)}={rng.randint(0, 18)}" for _ in range(rng.randint(1, 3))]
        rows.append(
            {
                "prompt": f"{rng.randint(0, 9)}+{rng.randint(0, 9)}=",
                "completions": steps,
                "labels": [int(s[-1]) % 2 == 0 for s in steps],
            }
        )
    return rows


@pytest.fixture(scope="module")
def trained_prm(tmp_path_factory):
    from transformers import LlamaForTokenClassification

    tok = testkit.build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForTokenClassification(testkit.tiny_config(tok, num_labels=2))
    path = str(tmp_path_factory.mktemp("prm") / "prm")
    train_prm(
        model,
        tok,
        Dataset.from_list(_prm_rows(600, 0)),
        path,
        num_train_epochs=6,
        learning_rate=3e-3,
        per_device_train_batch_size=32,
        use_cpu=True,
    )
    return path


def test_tokenize_prm_example_layout():
    tok = testkit.build_char_tokenizer()
    row = tokenize_prm_example({"prompt": "1+1=", "completions": ["2", "ok"], "labels": [True, False]}, tok)
    assert tok.decode(row["input_ids"]) == "1+1=2\nok\n"
    assert row["labels"] == [-100] * 4 + [-100, 1] + [-100, -100, 0]
    with pytest.raises(ValueError, match="one label per step"):
        tokenize_prm_example({"prompt": "", "completions": ["a"], "labels": []}, tok)


def test_trained_token_classification_prm_scores_steps(trained_prm):
    prm = TokenClassificationPRM(trained_prm)
    rows = _prm_rows(100, 1)
    scores = prm([r["prompt"] for r in rows], None, [r["completions"] for r in rows])
    pairs = [(s, y) for row, sc in zip(rows, scores) for s, y in zip(sc, row["labels"])]
    accuracy = sum((s > 0.5) == y for s, y in pairs) / len(pairs)
    assert accuracy > 0.9, accuracy
    # Same numbers as a hand-built forward pass at the step-label positions.
    ex = tokenize_prm_example(rows[0], prm.tokenizer)
    with torch.no_grad():
        probs = prm.model(input_ids=torch.tensor([ex["input_ids"]])).logits.softmax(-1)[0, :, 1]
    positions = [i for i, y in enumerate(ex["labels"]) if y != -100]
    torch.testing.assert_close(torch.tensor(scores[0]), probs[positions])


def test_grpo_run_with_prm_model(trained_prm, make_trainer):
    trainer = make_trainer(
        advantage_estimator="prm",
        max_steps=2,
        max_completion_length=8,
        prm_model_name_or_path=trained_prm,
        prm_batch_size=3,
        reward_funcs=[testkit.digit_fraction_reward],
    )
    trainer.train()
    logs = last_logs(trainer)
    assert all(math.isfinite(h["loss"]) for h in logs)
    scored = [h["prm/step_reward_mean"] for h in logs if "prm/step_reward_mean" in h]
    assert scored and all(0.0 <= v <= 1.0 for v in scored)


def test_causal_lm_prm_scores_at_tags(tiny_model_path):
    tok = testkit.build_char_tokenizer()
    prm = CausalLMPRM(tiny_model_path, step_tag="#", good_token="+", bad_token="-", batch_size=2)
    prompts, steps = ["1+2=", "4+4="], [["3", "x y"], ["8"]]
    scores = prm(prompts, None, steps)
    assert [len(s) for s in scores] == [2, 1]
    text = "1+2= 3 #\nx y #\n"
    ids = tok.encode(text, add_special_tokens=False)
    with torch.no_grad():
        logits = prm.model(input_ids=torch.tensor([ids])).logits[0]
    tag_positions = [i for i, t in enumerate(ids) if t == prm.tag_id]
    pair = logits[tag_positions][:, [prm.good_id, prm.bad_id]].softmax(-1)[:, 0]
    torch.testing.assert_close(torch.tensor(scores[0]), pair)
    with pytest.raises(ValueError, match="prm_causal_step_tag='ки' is 2 tokens"):
        CausalLMPRM(tiny_model_path, step_tag="ки")
