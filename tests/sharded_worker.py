"""Run under ``torchrun --nproc_per_node 2`` by tests/test_sharded.py: every family on, one engine (ddp / fsdp2 /
zero3), one mode; rank 1's rewards are constant, so its groups have no positive advantage and AEPO has nothing to
splice (or no term chunk) there by construction. Writes what each rank saw as JSON.

Modes: ``splice`` / ``term`` (AEPO's two modes, PRM advantages); ``dynamic``: dynamic sampling with AEPO's splice
(GRPO advantages, which dynamic sampling needs). There rank 1's batch is flat and the groups it draws have signal, so
rank 1 generates and splices new groups while rank 0, whose groups have signal, generates as many and splices none.

    python -m torch.distributed.run --nproc_per_node 2 tests/sharded_worker.py OUT ENGINE MODE [PRM_MODEL]
"""

from __future__ import annotations

import json
import math
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engines  # noqa: E402

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer  # noqa: E402
from trl_grpo_ext.config import AEPO_0_1_0  # noqa: E402

#: Set while dynamic sampling draws and scores new groups (mode "dynamic"): rank 1's rewards are flat only outside.
REFILLING = False


def rank_one_is_flat(completions, answer, **kwargs):
    """Exact match plus the digit fraction on rank 0; a constant on rank 1, whose groups then have advantage 0
    everywhere: AEPO has no candidate there, so rank 1's splice is empty (term mode: no chunk holds its samples)."""
    if dist.get_rank() == 1 and not REFILLING:
        return [0.5] * len(completions)
    exact = testkit.exact_match_reward(completions, answer, **kwargs)
    digits = testkit.digit_fraction_reward(completions, **kwargs)
    return [a + 0.5 * b for a, b in zip(exact, digits, strict=True)]


def digit_steps(prompts, completions, steps, **kwargs):
    return [[sum(ch.isdigit() for ch in s) / len(s) for s in row] for row in steps]


def main():
    out_dir, engine, aepo_mode = sys.argv[1:4]
    prm_model = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
    engine_fields = engines.enable(engine, out_dir)
    aepo = dict(entropy_control="aepo", aepo_adv_threshold=0.0)
    aepo.update(AEPO_0_1_0 if aepo_mode == "term" else dict(aepo_regenerate_fraction=1.0))
    prm = dict(advantage_estimator="prm", prm_outcome_coef=1.0)
    # term mode: nonzero_std, which keeps no row of rank 1 (its groups are flat); splice mode: best_worst
    sample_filter = dict(sample_filter="nonzero_std" if aepo_mode == "term" else "best_worst")
    # the token clip: KL-Cov over every process's tokens (global scope); in mode "dynamic" DPPO's trust region instead
    token_clip = dict(token_clip="kl_cov", token_clip_scope="global", kl_cov_ratio=0.05)
    if aepo_mode == "dynamic":
        token_clip = dict(token_clip="dppo", dppo_delta_low=0.05, dppo_delta_high=0.05)
        prm = dict(advantage_estimator="grpo")
        # the refill writes its groups first, then best-worst chooses among the refilled batch's samples
        sample_filter = dict(refill="dynamic_sampling", dynamic_sampling_max_rounds=2, sample_filter="best_worst")
        aepo = dict(entropy_control="aepo", aepo_adv_threshold=0.0, aepo_regenerate_fraction=1.0)
    elif prm_model is not None:
        prm.update(prm_model_name_or_path=prm_model, prm_step_separator="+")
    args = GRPOExtConfig(
        output_dir=os.path.join(out_dir, "run"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=6,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        bf16=False,
        seed=0,
        save_strategy="no",
        disable_tqdm=True,
        ddp_timeout=60,  # a collective one process never joins fails in a minute, not after the default 30
        loss_type="grpo",
        num_iterations=2,
        **token_clip,
        **sample_filter,
        beta=0.04,
        kl_control="adaptive",
        kl_target=0.01,
        kl_horizon=50,
        ref_update="reset",  # the reference becomes the policy after step 2: step 3's KL is 0 on every engine
        ref_reset_steps=2,
        diversity_metrics=["distinct", "repetition", "entropy"],
        eval_strategy="steps",
        eval_steps=3,
        per_device_eval_batch_size=4,
        eval_pass_at_k=[1, 2],
        eval_pass_greedy=True,
        **prm,
        **aepo,
        **engine_fields,
    )
    trainer = GRPOExtTrainer(
        model=os.path.join(out_dir, "model"),
        reward_funcs=[rank_one_is_flat],
        args=args,
        train_dataset=testkit.arithmetic_dataset(64, seed=0),
        eval_dataset=testkit.arithmetic_dataset(2, seed=9),  # one prompt per process: one greedy row on each
        processing_class=testkit.build_char_tokenizer(),
        step_reward_funcs=[digit_steps] if aepo_mode != "dynamic" else None,
    )
    spliced = []
    apply = trainer._apply_splice

    def count_splice(out, splice):
        spliced.append(len(splice.rollout.completion_ids))
        apply(out, splice)

    trainer._apply_splice = count_splice
    refills = []
    if aepo_mode == "dynamic":
        member = trainer.extensions["refill"]
        draw, on_generation = trainer.ext_rollouts.draw_prompts, member.on_generation

        def drawing(count, generator):
            global REFILLING
            REFILLING = True
            return draw(count, generator)

        def refilling(batch):
            global REFILLING
            try:
                output = on_generation(batch)  # (update, metrics) in training
            finally:
                REFILLING = False
            if batch.mode == "train":
                update = output[0]
                refills.append(0 if update.splice is None else len(update.splice.rows))
            return output

        trainer.ext_rollouts.draw_prompts, member.on_generation = drawing, refilling
    models = {"policy": trainer.model}
    if trainer.ref_model is not None:
        models["ref"] = trainer.ref_model
    log = engines.CollectiveLog().install(models) if engine == "ddp" else None
    trainer.train()
    aepo_member = trainer.extensions["entropy_control"]
    logs = [h for h in trainer.state.log_history if "loss" in h]
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    result = {
        "engine": trainer.accelerator.distributed_type.name,
        "sharded": engines.is_sharded(trainer),
        "losses": [h["loss"] for h in logs],
        "kls": [h["kl"] for h in logs],
        "dppo_shift": [h["dppo/prob_shift_mean"] for h in logs if "dppo/prob_shift_mean" in h],
        "betas": [h["kl/beta"] for h in logs] + [trainer.beta],
        "aepo_state": [aepo_member.last_entropy, aepo_member.temperature],
        "aepo_samples": [h.get("aepo/samples_used", 0.0) for h in logs],
        "aepo_chunk_rows": [int(c["loss_mask"].any(dim=1).sum()) for c in getattr(aepo_member, "_chunks", [])],
        "spliced_rows": spliced,
        "refilled_rows": refills,
        "rounds": [h.get("dynamic/rounds", 0.0) for h in logs],
        "eval": {k: v for h in evals for k, v in h.items() if k.startswith("eval_pass@k") or k == "eval_loss"},
        "events": None if log is None else log.events,
        "finite": all(math.isfinite(x) for x in [h["loss"] for h in logs]),
    }
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if dist.get_rank() == 0:
        with open(os.path.join(out_dir, f"{engine}_{aepo_mode}.json"), "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()  # the gloo threads joined before the interpreter exits, on every process


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
