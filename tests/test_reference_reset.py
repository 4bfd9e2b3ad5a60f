"""``ref_update="reset"``: the reference becomes the policy on a schedule or when the KL term grows, optionally with
the optimizer's moments; composed with the KL controllers; refused where there is nothing to reset."""

import logging
import math

import pytest
import torch
from conftest import last_logs


def _same(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def _moments(trainer) -> list[torch.Tensor]:
    return [t for state in trainer.optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]


def test_every_step_the_reference_becomes_the_policy_and_the_next_kl_is_zero(make_trainer):
    trainer = make_trainer(beta=0.04, ref_update="reset", ref_reset_steps=1, max_steps=3)
    trainer.train()
    assert _same(trainer.model, trainer.ref_model)  # the last step's reset came after its optimizer step
    logs = last_logs(trainer)
    # the reference at a step's generation is the policy that generated (steps_per_generation 1): KL 0 on the
    # first micro-batch of every step after the first
    assert [round(h["kl"], 7) for h in logs[1:]] == [0.0] * (len(logs) - 1)
    assert [h["ref_reset/count"] for h in logs] == [1, 2, 3]
    assert trainer.extensions["ref_update"].state_dict() == {"count": 3, "last_reset": 3}
    # without the reset the policy drifts from its anchor
    plain = make_trainer(beta=0.04, max_steps=3)
    plain.train()
    assert not _same(plain.model, plain.ref_model) and last_logs(plain)[-1]["kl"] > 0


def test_the_kl_term_trigger_and_the_optimizer_moments(make_trainer):
    never = make_trainer(beta=0.04, ref_update="reset", ref_reset_kl_term=1e6, max_steps=2)
    never.train()
    assert never.extensions["ref_update"].count == 0 and not _same(never.model, never.ref_model)
    assert all(h["ref_reset/kl_term"] >= 0 for h in last_logs(never))
    always = make_trainer(beta=0.04, ref_update="reset", ref_reset_kl_term=1e-12, ref_reset_optimizer=True, max_steps=2)
    always.train()
    # step 1's KL is 0 (nothing moved yet): no reset; step 2's is > 0: reset, moments zeroed after its update
    assert always.extensions["ref_update"].count == 1 and _same(always.model, always.ref_model)
    assert all(float(t.abs().max()) == 0.0 for t in _moments(always))
    kept = make_trainer(beta=0.04, ref_update="reset", ref_reset_kl_term=1e-12, max_steps=2)
    kept.train()
    assert any(float(t.abs().max()) > 0 for t in _moments(kept))  # without ref_reset_optimizer the moments stay


def test_it_composes_with_adaptive_kl(make_trainer):
    trainer = make_trainer(
        beta=0.04, kl_control="adaptive", kl_target=0.01, kl_horizon=100, ref_update="reset", ref_reset_steps=2,
        max_steps=4,
    )  # fmt: skip
    trainer.train()
    logs = last_logs(trainer)
    assert all(math.isfinite(h["kl/beta"]) for h in logs) and logs[-1]["ref_reset/count"] == 2
    # kl/beta is the beta a step used: step 2's KL (0.025 > the target) raised it for step 3; step 2 ended with a
    # reset, so step 3's KL is 0 (below the target) and the controller lowered it for step 4 (its rule, nothing else)
    assert logs[2]["kl"] == 0.0 and logs[2]["kl/beta"] > logs[1]["kl/beta"] and logs[3]["kl/beta"] < logs[2]["kl/beta"]


def test_the_diversity_controller_is_untouched_by_a_reset(make_trainer):
    """The diversity controller reads Distinct-N, not the KL: below its target (0.9, which these runs never reach) it
    raises beta by its own rule, step for step as in the same run without resets, while the KL falls to 0."""
    fields = dict(beta=0.04, kl_control="diversity", kl_diversity_target=0.9, kl_horizon=10, max_steps=3)
    with_reset = make_trainer(ref_update="reset", ref_reset_steps=1, **fields)
    with_reset.train()
    without = make_trainer(**fields)
    without.train()
    betas = [h["kl/beta"] for h in last_logs(with_reset)]
    assert betas == pytest.approx([h["kl/beta"] for h in last_logs(without)]) and betas[-1] != betas[0]
    assert [round(h["kl"], 7) for h in last_logs(with_reset)][1:] == [0.0, 0.0]


def test_a_resumed_run_makes_its_policy_the_reference_and_says_so(make_trainer, tmp_path, caplog):
    first = make_trainer(
        beta=0.04, ref_update="reset", ref_reset_steps=2, max_steps=2, save_strategy="steps", save_steps=2
    )
    first.train()
    checkpoint = str(tmp_path / "out" / "checkpoint-2")
    resumed = make_trainer(
        beta=0.04, ref_update="reset", ref_reset_steps=2, max_steps=3, save_strategy="steps", save_steps=2
    )
    with caplog.at_level(logging.WARNING):
        resumed.train(resume_from_checkpoint=checkpoint)
    assert "the resumed policy becomes the reference now" in caplog.text
    member = resumed.extensions["ref_update"]
    assert member.count == 2 and member.last_reset == 2  # the checkpointed reset, then the one at the resume


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        (dict(ref_update="reset", ref_reset_steps=1), "beta=0 TRL builds no reference"),
        (dict(beta=0.04, ref_update="reset"), "needs a trigger"),
        (dict(beta=0.04, ref_update="reset", ref_reset_steps=0), "must be >= 1"),
        (dict(beta=0.04, ref_update="reset", ref_reset_kl_term=-1.0), "must be > 0"),
        (dict(beta=0.04, ref_reset_steps=5), "read by ref_update='reset' only"),
        (dict(beta=0.04, ref_update="reset", ref_reset_steps=1, sync_ref_model=True), "sync_ref_model also moves"),
    ],
)
def test_refusals_name_the_field_and_the_fix(tmp_path, fields, problem):
    import trl_grpo_ext.families  # noqa: F401  (the members' rules)
    from trl_grpo_ext import GRPOExtConfig

    with pytest.raises(ValueError, match=problem) as err:
        GRPOExtConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **fields)
    assert "Fix:" in str(err.value)


def test_with_peft_the_reference_adapter_becomes_the_trained_one_and_the_base_is_untouched(make_trainer):
    from peft import LoraConfig

    def adapter(model, name):
        return {
            n.replace(f".{name}.", "."): p.detach().clone() for n, p in model.named_parameters() if f".{name}." in n
        }

    def base(model):
        return {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" not in n}

    peft = {"peft_config": LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_alpha=8)}
    trainer = make_trainer(beta=0.04, ref_update="reset", ref_reset_steps=1, max_steps=3, trainer_kwargs=peft)
    model = trainer.model
    assert "ref" in model.peft_config and model.active_adapter == "default"
    ref0, base0 = adapter(model, "ref"), base(model)
    assert ref0.keys() == adapter(model, "default").keys() and all(
        torch.equal(ref0[k], v) for k, v in adapter(model, "default").items()
    )  # a copy of the fresh adapter: the reference is still the base model
    assert not any(p.requires_grad for n, p in model.named_parameters() if ".ref." in n)
    trainer.train()
    trained, ref = adapter(model, "default"), adapter(model, "ref")
    assert any(not torch.equal(ref0[k], v) for k, v in trained.items())  # the adapter learned
    assert all(torch.equal(ref[k], v) for k, v in trained.items())  # and the last reset copied it
    assert all(torch.equal(base0[k], v) for k, v in base(model).items())  # the base model never moved
    logs = last_logs(trainer)
    assert [round(h["kl"], 7) for h in logs[1:]] == [0.0] * (len(logs) - 1)
    assert [h["ref_reset/count"] for h in logs] == [1, 2, 3]
    # without the reset TRL scores the reference with the adapters disabled and the KL grows
    plain = make_trainer(beta=0.04, max_steps=3, trainer_kwargs=peft)
    plain.train()
    assert "ref" not in plain.model.peft_config and last_logs(plain)[-1]["kl"] > 0


def test_with_peft_modules_to_save_under_vllm_is_refused():
    """TRL's vLLM sync strips only the trained adapter's modules_to_save copies: a reference adapter's would reach
    vLLM under names it lacks, so that combination is refused with the fix (checked on the adapter's own helper)."""
    from types import SimpleNamespace

    from peft import LoraConfig, get_peft_model

    from grpo_lab import testkit
    from trl_grpo_ext.adapter import compat

    model = get_peft_model(
        testkit.build_tiny_model(testkit.build_char_tokenizer()),
        LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]),
    )

    def trainer(use_vllm):
        return SimpleNamespace(ref_model=None, beta=0.04, model=model, args=SimpleNamespace(use_vllm=use_vllm),
                               accelerator=SimpleNamespace(unwrap_model=lambda m: m))  # fmt: skip

    with pytest.raises(ValueError, match=r"modules_to_save.*Fix: train without modules_to_save"):
        compat.prepare_reference(trainer(True))
    assert "ref" not in model.peft_config
    assert compat.prepare_reference(trainer(False)) and "ref" in model.peft_config
    sources, targets = compat._reference_adapter_pairs(model)  # the modules_to_save copies pair by name like the rest
    names = {id(p): n for n, p in model.named_parameters()}
    assert any("modules_to_save.ref." in names[id(t)] for t in targets)
    assert [names[id(p)] for p in sources] == [names[id(t)].replace(".ref.", ".default.") for t in targets]
