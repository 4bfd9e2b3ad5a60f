"""Compatibility matrix: every TRL 1.16 feature (rows) x every family alone and all on (columns).

Each cell trains a tiny model for 2 steps and asserts "works" (finite losses, parameters changed, the family's metrics
logged and the family visibly acted) or "refused" (a ``ValueError`` whose message names the fields and the fix, listed
in ``REFUSED``). A new TRL feature is one ``ROWS`` entry; a new family member is one ``COLUMNS`` entry. docs/index.md
shows the same table (``test_docs_table_matches`` keeps the two in step).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TINY_ARGS, last_logs

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer
from trl_grpo_ext.config import AEPO_0_1_0

DOCS = Path(__file__).resolve().parent.parent / "docs" / "index.md"


@dataclass
class Env:
    """Paths and objects the cells share (built once per session)."""

    model_path: str
    long_model_path: str
    reward_model_path: str
    tokenizer: Any
    chat_tokenizer: Any
    dataset: Any
    chat_dataset: Any
    eval_dataset: Any


@pytest.fixture(scope="session")
def env(tiny_model_path, tmp_path_factory):
    from transformers import LlamaForSequenceClassification
    from trl.chat_template_utils import add_response_schema, qwen3_chat_template

    tokenizer = testkit.build_char_tokenizer()
    chat_tokenizer = testkit.build_char_tokenizer()
    chat_tokenizer.chat_template = qwen3_chat_template
    chat_tokenizer = add_response_schema(chat_tokenizer)  # Qwen3 tool-call parsing
    reward_dir = tmp_path_factory.mktemp("reward") / "model"
    config = testkit.tiny_config(tokenizer, num_labels=1)
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(reward_dir)
    tokenizer.save_pretrained(reward_dir)
    dataset = testkit.arithmetic_dataset(64, seed=0)
    chat = dataset.map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})
    return Env(
        model_path=tiny_model_path,
        long_model_path=testkit.save_tiny_model(
            tmp_path_factory.mktemp("long") / "model", max_position_embeddings=2048
        ),
        reward_model_path=str(reward_dir),
        tokenizer=tokenizer,
        chat_tokenizer=chat_tokenizer,
        dataset=dataset,
        chat_dataset=chat,
        eval_dataset=testkit.arithmetic_dataset(4, seed=9),
    )


def digit_steps(prompts, completions, steps, **kwargs):
    """Step reward: the fraction of digits in the step plus its number of 7s (varies for random text and digits)."""
    return [[sum(ch.isdigit() for ch in step) / len(step) + step.count("7") for step in row] for row in steps]


def scripted_rollout(prompts, trainer):
    """A ``rollout_func``: random digits, the middle two tokens marked as environment text (``env_mask`` 0)."""
    tok = trainer.processing_class
    gen = torch.Generator().manual_seed(trainer.state.global_step * 7919 + len(prompts))
    digits = tok.convert_tokens_to_ids(list("0123456789"))
    picks = torch.randint(0, 10, (len(prompts), 6), generator=gen).tolist()
    return {
        "prompt_ids": [tok(p, add_special_tokens=False)["input_ids"] for p in prompts],
        "completion_ids": [[digits[d] for d in row] for row in picks],
        "logprobs": None,
        "env_mask": [[1, 1, 0, 0, 1, 1] for _ in prompts],
    }


TOOL_CALL = '<tool_call>\n{"name": "bump", "arguments": {"n": 3}}\n</tool_call>'


def bump(n: int) -> str:
    """Add one to a number.

    Args:
        n: the number.
    """
    return str(n + 1)


class Counter:
    """An ``environment_factory`` environment: ``bump`` is its tool, ``get_reward`` reads its state."""

    def reset(self, **kwargs):
        self.value = 0

    def bump(self, n: int) -> str:
        """Add n to the counter.

        Args:
            n: how much to add.
        """
        self.value += n
        return str(self.value)


def counter_reward(environments, completions, **kwargs):
    return [float(env.value) + 0.1 * len(str(c)) for env, c in zip(environments, completions, strict=True)]


def script_first_turn(trainer):
    """Every rollout's first turn is a tool call; later turns (after the tool response) are generated."""
    original = trainer._generate_single_turn
    tok = trainer.processing_class
    call = tok(TOOL_CALL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    def scripted(prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs):
        if any("tool_response" in tok.decode(ids) for ids in prompt_ids):
            return original(prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs)
        return [list(call) for _ in prompt_ids], None

    trainer._generate_single_turn = scripted


def aepo_masks_tool_tokens(trainer):
    """AEPO's samples keep TRL's tool / env mask: some of their completion tokens are masked out of the loss (the
    term's chunks, or the spliced rows of TRL's batch)."""
    aepo = trainer.extensions.get("entropy_control")
    if trainer.args.entropy_control == "aepo":
        # a chunk with an all-zero loss mask holds no sample of this process (it only keeps the forwards in step)
        chunks = [c for c in aepo._chunks if bool(c["loss_mask"].any())]
        masks = [(c["loss_mask"], c["completion_mask"]) for c in chunks] + trainer.spliced_masks
        assert masks and any(bool((loss < mask).any()) for loss, mask in masks)


def aepo_splices_no_truncated_sample(trainer):
    """Under mask_truncated_completions every spliced row trains (a truncated one would only displace a TRL row)."""
    for loss, _ in getattr(trainer, "spliced_masks", []):
        assert bool((loss.sum(dim=1) > 0).all())


def record_spliced_masks(trainer):
    """Keep (loss mask, completion mask) of the rows AEPO splices into TRL's batch, for the row checks."""
    trainer.spliced_masks = []
    apply = trainer._apply_splice

    def spy(out, splice):
        apply(out, splice)
        rows = len(splice.rollout.completion_ids)
        # AEPO's splices only (one advantage for every sample); dynamic sampling's new groups (one advantage each) keep
        # TRL's own masks, truncated rows too
        if rows and splice.advantages is None:
            mask = out["completion_mask"][splice.rows]
            tool = out.get("tool_mask", torch.ones_like(out["completion_mask"]))[splice.rows]
            trainer.spliced_masks.append((mask * tool, mask))

    trainer._apply_splice = spy


def sevens_reward(completions, **kwargs):
    """How many 7s a completion holds (varies within a group of random digit strings)."""
    return [float(str(c).count("7")) for c in completions]


@dataclass
class Row:
    config: dict[str, Any] = field(default_factory=dict)
    trainer: Callable[[Env], dict[str, Any]] = lambda env: {}
    rewards: Callable[[Env], list] = lambda env: [testkit.exact_match_reward, testkit.digit_fraction_reward]
    chat: bool = False
    long_context: bool = False  # prompts that render tool schemas need more than the tiny model's 256 positions
    setup: Callable[[Any], None] = lambda trainer: None
    check: Callable[[Any], None] = lambda trainer: None  # a row-specific assertion after training


def _lora(env):
    from peft import LoraConfig

    return {"peft_config": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])}


ROWS: dict[str, Row] = {
    **{f"loss_type={t}": Row(config=dict(loss_type=t)) for t in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "sapo")},
    "loss_type=cispo": Row(config=dict(loss_type="cispo", epsilon_high=5.0)),
    "loss_type=vespo": Row(config=dict(loss_type="vespo")),
    "LoRA (peft_config)": Row(trainer=_lora),
    "num_iterations=2": Row(config=dict(num_iterations=2)),
    "steps_per_generation=2": Row(config=dict(steps_per_generation=2)),
    "GSPO (importance_sampling_level=sequence)": Row(config=dict(importance_sampling_level="sequence")),
    "epsilon_high=0.28": Row(config=dict(epsilon_high=0.28)),
    "delta=1.5": Row(config=dict(delta=1.5)),
    # TRL's reference mixing (TR-DPO style): the reference moves toward the policy every step
    "sync_ref_model": Row(
        config=dict(beta=0.04, sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=0.5),
        check=lambda trainer: reference_moved(trainer),
    ),
    "top_entropy_quantile=0.2": Row(config=dict(top_entropy_quantile=0.2)),
    "off_policy_mask_threshold": Row(config=dict(off_policy_mask_threshold=0.05, num_iterations=2)),
    # EOS favoured so that some completions end (at random a tiny model nearly never does): AEPO must find complete
    # samples among its hot ones, since truncated samples train nothing here and are never spliced.
    "mask_truncated_completions": Row(
        config=dict(
            mask_truncated_completions=True,
            max_completion_length=12,
            generation_kwargs={"sequence_bias": [[[testkit.build_char_tokenizer().eos_token_id], 3.0]]},
        ),
        check=lambda trainer: aepo_splices_no_truncated_sample(trainer),
    ),
    "scale_rewards=batch": Row(config=dict(scale_rewards="batch")),
    "scale_rewards=none": Row(config=dict(scale_rewards="none")),
    "multi_objective_aggregation=normalize_then_sum": Row(
        config=dict(multi_objective_aggregation="normalize_then_sum")
    ),
    "reward_weights": Row(config=dict(reward_weights=[1.0, 0.5])),
    "reward model": Row(rewards=lambda env: [testkit.digit_fraction_reward, env.reward_model_path]),
    "conversational prompts": Row(chat=True),
    "gradient_checkpointing": Row(config=dict(gradient_checkpointing=True)),
    "evaluation": Row(config=dict(eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)),
    # trainer.evaluate() before train(), then eval_on_start: nothing read may exist only inside the training loop.
    "evaluate before train (eval_on_start)": Row(
        config=dict(eval_strategy="steps", eval_steps=1, eval_on_start=True, per_device_eval_batch_size=8),
        setup=lambda trainer: trainer.evaluate(),
    ),
    "tools (scripted tool call)": Row(
        config=dict(max_completion_length=180),  # the call (65), the tool response (84), then generated text
        trainer=lambda env: {"tools": [bump]},
        chat=True,
        long_context=True,
        setup=script_first_turn,
        check=aepo_masks_tool_tokens,
    ),
    "environment_factory (scripted tool call)": Row(
        config=dict(max_completion_length=180),  # the call (65), the tool response (84), then generated text
        trainer=lambda env: {"environment_factory": Counter},
        rewards=lambda env: [counter_reward],
        chat=True,
        long_context=True,
        setup=script_first_turn,
    ),
    "rollout_func with env_mask": Row(
        trainer=lambda env: {"rollout_func": scripted_rollout},
        rewards=lambda env: [sevens_reward],
        check=aepo_masks_tool_tokens,
    ),
}


def _values(logs, key):
    return [h[key] for h in logs if key in h]


def acted_clip_cov(trainer, logs):
    return sum(_values(logs, "clip_cov/selected_tokens")) > 0


def acted_kl_cov(trainer, logs):
    return sum(_values(logs, "kl_cov/selected_tokens")) > 0 and _values(logs, "kl_cov/penalty_mean")


def reference_moved(trainer):
    """TRL's sync_ref_model mixed the policy into the reference (they were equal at the start)."""
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(trainer.model.name_or_path)
    assert not all(
        torch.equal(p, q) for p, q in zip(trainer.ref_model.parameters(), start.parameters(), strict=True)
    ), "sync_ref_model did not move the reference"


def acted_reset(trainer, logs):
    return max(_values(logs, "ref_reset/count") or [0]) >= 1


def acted_dppo(trainer, logs):
    return sum(_values(logs, "dppo/masked_frac")) > 0


def acted_filter(trainer, logs):
    return all(v < 1.0 for v in _values(logs, "filter/kept_frac")) and _values(logs, "filter/kept_frac")


#: True while dynamic sampling draws and scores new groups (the dynamic_sampling column's rewards vary only then).
_REFILLING = {"on": False}


def _flat_outside_refills(funcs: list) -> list:
    """The row's Python rewards, 0.0 for every completion TRL generated itself: every group of every batch has no
    signal, so dynamic sampling refills in every cell (its own groups get the row's rewards). A reward model (a path)
    is left as it is."""

    def flatten(func):
        @functools.wraps(func)
        def reward(prompts, completions, **kwargs):
            scores = func(prompts=prompts, completions=completions, **kwargs)
            return scores if _REFILLING["on"] else [0.0] * len(scores)

        return reward

    return [flatten(f) if callable(f) else f for f in funcs]


def _watch_refills(trainer) -> None:
    member = trainer.extensions["refill"]
    draw, on_generation = trainer.ext_rollouts.draw_prompts, member.on_generation

    def drawing(count, generator):
        _REFILLING["on"] = True
        return draw(count, generator)

    def refilling(batch):
        try:
            return on_generation(batch)
        finally:
            _REFILLING["on"] = False

    trainer.ext_rollouts.draw_prompts, member.on_generation = drawing, refilling


def acted_dynamic_sampling(trainer, logs):
    refilled, after = _values(logs, "dynamic/refilled_groups"), _values(logs, "dynamic/signal_frac_after")
    if not refilled or not all(0.0 <= v <= 1.0 for v in after):
        return False
    # TRL's groups are all flat: new groups were put in (a reward model's groups vary: nothing to refill)
    return sum(refilled) > 0 or any(isinstance(f, torch.nn.Module) for f in trainer.reward_funcs)


def acted_beta(trainer, logs):
    # beta moved (the controller's update after the last step or generation batch counts too)
    return len({*_values(logs, "kl/beta"), trainer.beta}) > 1


def acted_pass_at_k(trainer, logs):
    return _values(logs, "pkpo/k") and _values(logs, "pkpo/adv_abs_mean")


def acted_w_reinforce(trainer, logs):
    means = _values(logs, "w_reinforce/adv_mean")
    # the paper's form (+lambda / -1, no baseline) never averages to GRPO's 0; the "group" form only reweights
    return means and (trainer.args.w_reinforce_baseline == "group" or any(v != 0 for v in means))


def acted_entropy_advantage(trainer, logs):
    # it shapes inside every training loss: its metrics come with every logged step
    return all("entropy_adv/bonus_mean" in h and "entropy_adv/capped_frac" in h for h in logs)


def acted_aepo(trainer, logs):
    return _values(logs, "aepo/temperature") and sum(_values(logs, "aepo/samples_used")) > 0


def acted_prm(trainer, logs):
    return _values(logs, "prm/steps_mean") and any(v > 0 for v in _values(logs, "prm/adv_abs_mean"))


def acted_monitor(trainer, logs):
    return _values(logs, "diversity/distinct_2") and _values(logs, "entropy/mean")


@dataclass
class Column:
    config: dict[str, Any]
    acted: tuple[Callable[[Any, list[dict]], Any], ...]
    trainer: Callable[[Env], dict[str, Any]] = lambda env: {}
    rewards: Callable[[list], list] = lambda funcs: funcs  # applied to the row's reward functions
    setup: Callable[[Any], None] = lambda trainer: None


MONITOR = dict(diversity_metrics=["distinct", "repetition", "entropy"])
COLUMNS: dict[str, Column] = {
    "prm": Column(
        dict(advantage_estimator="prm"), (acted_prm,), trainer=lambda env: {"step_reward_funcs": [digit_steps]}
    ),
    "clip_cov": Column(
        dict(token_clip="clip_cov", clip_cov_ratio=0.05, clip_cov_lb=-100.0, clip_cov_ub=100.0), (acted_clip_cov,)
    ),
    "kl_cov": Column(dict(token_clip="kl_cov", kl_cov_ratio=0.05, num_iterations=2), (acted_kl_cov,)),
    # bounds for the tiny model, whose token probabilities are about 1 / vocabulary
    "dppo": Column(dict(token_clip="dppo", num_iterations=2, dppo_delta_low=1e-4, dppo_delta_high=1e-4), (acted_dppo,)),
    "best_of_n": Column(dict(sample_filter="best_of_n"), (acted_filter,)),
    "dynamic_sampling": Column(
        dict(refill="dynamic_sampling", dynamic_sampling_max_rounds=1),
        (acted_dynamic_sampling,),
        rewards=_flat_outside_refills,
        setup=_watch_refills,
    ),
    "ref_reset": Column(dict(beta=0.04, ref_update="reset", ref_reset_steps=1), (acted_reset,)),
    "adaptive_kl": Column(dict(kl_control="adaptive", beta=0.04, kl_target=0.01, kl_horizon=100), (acted_beta,)),
    "diversity_kl": Column(dict(kl_control="diversity", beta=0.04, kl_horizon=100), (acted_beta,)),
    # A whole batch regenerated (not the reference's quarter) so that two tiny steps surely find samples to train.
    "aepo": Column(dict(entropy_control="aepo", aepo_adv_threshold=0.0, aepo_regenerate_fraction=1.0), (acted_aepo,)),
    "aepo_term": Column(dict(entropy_control="aepo", aepo_adv_threshold=0.0, **AEPO_0_1_0), (acted_aepo,)),
    "pass_at_k": Column(dict(advantage_estimator="pass_at_k", pkpo_k=2), (acted_pass_at_k,)),
    "w_reinforce": Column(dict(advantage_weighting="w_reinforce"), (acted_w_reinforce,)),
    "entropy_advantage": Column(dict(advantage_weighting="entropy_advantage"), (acted_entropy_advantage,)),
    "monitor": Column(MONITOR, (acted_monitor,)),
    "all": Column(
        dict(
            advantage_estimator="prm",
            token_clip="clip_cov",
            clip_cov_ratio=0.05,
            clip_cov_lb=-100.0,
            clip_cov_ub=100.0,
            sample_filter="best_of_n",
            kl_control="adaptive",
            beta=0.04,
            kl_target=0.01,
            kl_horizon=100,
            entropy_control="aepo",
            aepo_adv_threshold=0.0,
            aepo_regenerate_fraction=1.0,
            advantage_weighting="w_reinforce",
            w_reinforce_baseline="group",
            **MONITOR,
        ),
        (acted_prm, acted_w_reinforce, acted_clip_cov, acted_filter, acted_beta, acted_aepo, acted_monitor),
        trainer=lambda env: {"step_reward_funcs": [digit_steps]},
    ),
}

TOKEN_LEVEL = "token-level covariance clipping needs token-level importance sampling"
DROPS_CLIP = "would silently drop the clip you asked for"
DPPO_PER_TOKEN = "DPPO's trust region is per token"
DPPO_LOSS = "shapes the ratio its own way"
#: (row, column) -> what the refusal says. Every other cell must work.
REFUSED: dict[tuple[str, str], str] = {
    ("GSPO (importance_sampling_level=sequence)", "clip_cov"): TOKEN_LEVEL,
    ("GSPO (importance_sampling_level=sequence)", "kl_cov"): TOKEN_LEVEL,
    ("GSPO (importance_sampling_level=sequence)", "all"): TOKEN_LEVEL,
    ("loss_type=cispo", "kl_cov"): DROPS_CLIP,
    ("epsilon_high=0.28", "kl_cov"): DROPS_CLIP,
    ("GSPO (importance_sampling_level=sequence)", "dppo"): DPPO_PER_TOKEN,
    ("loss_type=sapo", "dppo"): DPPO_LOSS,
    ("loss_type=cispo", "dppo"): DPPO_LOSS,
    ("loss_type=vespo", "dppo"): DPPO_LOSS,
    ("epsilon_high=0.28", "dppo"): "would silently drop the epsilon_high",
    ("sync_ref_model", "ref_reset"): "sync_ref_model also moves the reference",
    ("environment_factory (scripted tool call)", "aepo"): "entropy_control='aepo' cannot run with environment_factory",
    ("environment_factory (scripted tool call)", "aepo_term"): (
        "entropy_control='aepo' cannot run with environment_factory"
    ),
    ("environment_factory (scripted tool call)", "all"): "entropy_control='aepo' cannot run with environment_factory",
    ("environment_factory (scripted tool call)", "dynamic_sampling"): (
        "refill='dynamic_sampling' cannot run with environment_factory"
    ),
    ("multi_objective_aggregation=normalize_then_sum", "dynamic_sampling"): "new rows change that deviation",
}

CELLS = [(row, column) for row in ROWS for column in COLUMNS]


def _build(env, tmp_path, row: Row, column: Column):
    config = {**TINY_ARGS, "max_steps": 2, "output_dir": str(tmp_path), **column.config, **row.config}
    if row.chat:
        dataset, tokenizer = env.chat_dataset, env.chat_tokenizer
    else:
        dataset, tokenizer = env.dataset, env.tokenizer
    kwargs = {**column.trainer(env), **row.trainer(env)}
    if "eval_strategy" in row.config:
        kwargs["eval_dataset"] = env.eval_dataset
    trainer = GRPOExtTrainer(
        model=env.long_model_path if row.long_context else env.model_path,
        reward_funcs=column.rewards(row.rewards(env)),
        args=GRPOExtConfig(**config),
        train_dataset=dataset,
        processing_class=tokenizer,
        **kwargs,
    )
    row.setup(trainer)
    column.setup(trainer)
    record_spliced_masks(trainer)
    return trainer


def _trainable(trainer) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.mark.filterwarnings("ignore:.*not a percentage", "ignore:.*experimental feature")
@pytest.mark.parametrize(("row", "column"), CELLS, ids=[f"{r} x {c}" for r, c in CELLS])
def test_cell(env, tmp_path, row, column):
    if (row, column) in REFUSED:
        with pytest.raises(ValueError, match=re.escape(REFUSED[(row, column)])) as err:
            _build(env, tmp_path, ROWS[row], COLUMNS[column])
        assert "Fix:" in str(err.value)
        return
    trainer = _build(env, tmp_path, ROWS[row], COLUMNS[column])
    before = _trainable(trainer)
    trainer.train()
    logs = last_logs(trainer)
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    after = _trainable(trainer)
    assert any(not torch.equal(before[k], after[k]) for k in before), "no trainable parameter changed"
    for acted in COLUMNS[column].acted:
        assert acted(trainer, logs), f"{acted.__name__} failed: {logs}"
    ROWS[row].check(trainer)


def test_docs_table_matches():
    """docs/index.md's matrix lists every row and column and marks exactly the refused cells."""
    text = DOCS.read_text()
    table = text[text.index("<!-- compat-matrix -->") : text.index("<!-- /compat-matrix -->")]
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[1:] == list(COLUMNS)
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = dict(zip(header[1:], cells[1:], strict=True))
    assert list(rows) == list(ROWS)
    for (row, column), cell in ((rc, rows[rc[0]][rc[1]]) for rc in CELLS):
        assert (cell != "works") == ((row, column) in REFUSED), f"{row} x {column}: docs say {cell!r}"
