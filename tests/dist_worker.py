"""Run under ``torchrun --nproc_per_node 2`` (gloo, CPU) by tests/test_distributed.py; writes rank-0 results as JSON."""

import json
import math
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer
from trl_grpo_ext.core import clip_cov_mask, kl_cov_mask, num_selected, prm_step_advantages, token_covariance
from trl_grpo_ext.prm import segment_completion

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equivalence  # noqa: E402

from trl_grpo_ext.trainer import AccelerateCollectives


def global_selection_check(accelerator):
    coll = AccelerateCollectives(accelerator)
    gen = torch.Generator().manual_seed(123)  # same stream on both ranks: each takes its own half
    logps_all, adv_all = torch.randn(8, 16, generator=gen), torch.randn(8, generator=gen)
    mask_all = (torch.rand(8, 16, generator=gen) > 0.2).long()
    rows = slice(4 * coll.rank, 4 * coll.rank + 4)
    logps, adv, mask = logps_all[rows], adv_all[rows], mask_all[rows]
    cov = token_covariance(logps, adv, mask, collectives=coll)
    kl = kl_cov_mask(logps, adv, mask, ratio=0.05, collectives=coll)
    clip = clip_cov_mask(
        logps,
        adv,
        mask,
        ratio=0.05,
        lb=-0.5,
        ub=2.0,
        collectives=coll,
        generator=torch.Generator().manual_seed(7 + coll.rank),
    )
    gathered = {name: accelerator.gather(t.contiguous()) for name, t in (("cov", cov), ("kl", kl), ("clip", clip))}
    ref_cov = token_covariance(logps_all, adv_all, mask_all)
    ref_kl = kl_cov_mask(logps_all, adv_all, mask_all, ratio=0.05)
    window = (ref_cov > -0.5) & (ref_cov < 2.0) & mask_all.bool()
    return {
        "cov_equal": bool(torch.allclose(gathered["cov"], ref_cov, atol=1e-6)),
        "kl_equal": bool(torch.equal(gathered["kl"], ref_kl)),
        "kl_count": int(gathered["kl"].sum()),
        "clip_count": int(gathered["clip"].sum()),
        "clip_in_window": bool((gathered["clip"] <= window).all()),
        "k": num_selected(int(mask_all.sum()), 0.05),
    }


def length_steps(prompts, completions, steps, **kwargs):
    """Deterministic step scores with spread (the ordinal sum of the step text, mod 7)."""
    return [[(sum(map(ord, s)) % 7) / 6 for s in row] for row in steps]


def prm_group_spanning_check(path, out_dir, accelerator):
    """One group of 4 completions, 2 on each rank: PRM advantages must equal the single-process ones on the group."""
    args = GRPOExtConfig(
        output_dir=os.path.join(out_dir, "prm"),
        per_device_train_batch_size=2,
        num_generations=4,
        max_completion_length=10,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        advantage_estimator="prm",
    )
    tok = testkit.build_char_tokenizer()
    trainer = GRPOExtTrainer(
        model=path,
        reward_funcs=[testkit.digit_fraction_reward],
        args=args,
        processing_class=tok,
        train_dataset=testkit.arithmetic_dataset(8, seed=0),
        step_reward_funcs=[length_steps],
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(accelerator.process_index)  # different samples on each rank
    out = trainer._generate_and_score_completions([testkit.arithmetic_dataset(1, seed=3)[0]] * 2)
    ids = [row[: int(m.sum())].tolist() for row, m in zip(out["completion_ids"], out["completion_mask"])]
    all_ids = gather_object(ids)
    all_adv = gather_object([row.tolist() for row in out["advantages"]])
    if not accelerator.is_main_process:
        return None
    segs = [segment_completion(tok, row) for row in all_ids]
    width = max(len(r) for r in all_adv)
    expected = prm_step_advantages(length_steps(None, None, [s.texts for s in segs]), [s.ends for s in segs], 4, width)
    got = torch.zeros(4, width)
    for i, row in enumerate(all_adv):
        got[i, : len(row)] = torch.tensor(row)
    expected = expected * (torch.arange(width) < torch.tensor([len(r) for r in all_ids]).unsqueeze(1))
    return {"max_abs_diff": float((got - expected).abs().max()), "nonzero": bool(expected.abs().sum() > 0)}


def tiny_training(path, out_dir):
    args = GRPOExtConfig(
        output_dir=os.path.join(out_dir, "run"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        save_strategy="no",
        disable_tqdm=True,
        beta=0.04,
        kl_control="adaptive",
        kl_horizon=50,
        token_clip="clip_cov",
        token_clip_scope="global",
        clip_cov_ratio=0.05,
        clip_cov_lb=-100.0,
        sample_filter="best_worst",
        advantage_std="population",
        loss_type="grpo",
        entropy_control="aepo",  # the reference's splice: each process puts its kept samples into its own rows
        aepo_adv_threshold=0.0,
    )
    trainer = GRPOExtTrainer(
        model=path,
        reward_funcs=[testkit.exact_match_reward, testkit.digit_fraction_reward],
        args=args,
        train_dataset=testkit.arithmetic_dataset(64, seed=0),
        processing_class=testkit.build_char_tokenizer(),
    )
    trainer.train()
    betas = trainer.accelerator.gather(torch.tensor([trainer.beta], dtype=torch.float64)).tolist()
    aepo = trainer.extensions["entropy_control"]
    state = [aepo.last_entropy, aepo.temperature]
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {
        "betas": betas,
        "aepo_state": gather_object([state]),
        "aepo_samples": sum(h.get("aepo/samples_used", 0.0) for h in logs),
        "losses_finite": all(math.isfinite(h["loss"]) for h in logs),
        "steps": len(logs),
        "selected_logged": all("clip_cov/selected_frac" in h for h in logs),
        "num_processes": trainer.accelerator.num_processes,
    }


def main():
    out_dir = sys.argv[1]
    accelerator = Accelerator(cpu=True)
    path = os.path.join(out_dir, "model")
    if accelerator.is_main_process:
        testkit.save_tiny_model(path)
    accelerator.wait_for_everyone()
    result = {"selection": global_selection_check(accelerator)}
    result["prm"] = prm_group_spanning_check(path, out_dir, accelerator)
    result["training"] = tiny_training(path, out_dir)
    trainer = equivalence.build_trainer(path, os.path.join(out_dir, "equiv"), per_device=4)
    local = equivalence.deterministic_quantities(trainer)
    gathered = gather_object([local])
    result["equivalence"] = {
        "advantages": [a for part in gathered for a in part["advantages"]],
        "keep": [k for part in gathered for k in part["keep"]],
        "betas": [part["beta"] for part in gathered],
        "num_items_in_batch": [part["num_items_in_batch"] for part in gathered],
    }
    if accelerator.is_main_process:
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
