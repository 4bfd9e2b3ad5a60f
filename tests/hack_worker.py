"""Run under ``torchrun --nproc_per_node 2`` (gloo, CPU) by tests/test_hack_detector.py: the hack detector, an audit
(weight 0) and a rollback on two processes, GRPOExtTrainer and a plain trl.GRPOTrainer; writes every rank's view as
JSON. ``hack_worker.py OUT validation``: validation gold on both trainers. ``hack_worker.py OUT fsdp2`` (or
``zero3``): the rollback that trains on (``collapse_rollback_then: screen``) with the parameters sharded across the two
processes (tests/engines.py), GRPOExtTrainer only."""

import json
import os
import sys

import engines
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from safetensors.torch import load_file
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer
from trl_grpo_ext.callbacks import CollapseMonitor
from trl_grpo_ext.detector import detector_from_config

COMMON = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=8,
    max_steps=16,
    learning_rate=3e-2,
    logging_steps=1,
    report_to="none",
    use_cpu=True,
    bf16=False,
    seed=0,
    save_strategy="steps",
    save_steps=2,
    disable_tqdm=True,
)


def fixed_text_reward(completions, **kwargs):
    return [testkit._text(c).count("7") / 4 for c in completions]


def sevens_audit(completions, **kwargs):
    """The audit: refuses a completion with two or more '7's (logged, never trained on)."""
    return [0.0 if testkit._text(c).count("7") >= 2 else 1.0 for c in completions]


def view(trainer, monitor) -> dict:
    """This rank's alarm, rollback and weights (a checksum, and whether they equal the restored checkpoint's)."""
    event, record = monitor.event, monitor.rollback
    model = trainer.accelerator.unwrap_model(trainer.model)
    saved = load_file(os.path.join(record["restored"], "model.safetensors"))
    live = model.state_dict()
    return {
        "event": [event.step, event.onset, event.source] if event else None,
        "checkpoint_step": record["checkpoint_step"],
        "global_step": trainer.state.global_step,
        "checksum": float(sum(p.double().sum() for p in model.parameters())),
        "equals_checkpoint": all(torch.equal(live[k].cpu(), v) for k, v in saved.items()),
        # the audit's disagreement as this rank logged it, step by step (every rank reads the gathered batch)
        "audit": [h.get("audit/disagreement") for h in trainer.state.log_history if "audit/flagged_frac" in h],
        "audit_series": monitor.detector.series.get("audit") if monitor.detector is not None else None,
    }


def full_checksum(model) -> float:
    """Sum of every parameter, whole: FSDP2's shards joined, ZeRO-3's partitions gathered (collectives: every process
    calls it at the same point)."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    if any(hasattr(p, "ds_tensor") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            return float(sum(p.detach().double().sum() for p in params))
    return float(sum((p.full_tensor() if isinstance(p, DTensor) else p).detach().double().sum() for p in params))


class Checksums(TrainerCallback):
    """The whole weights' checksum when each checkpoint is saved, and at each step's end (added after the monitor, so
    at the alarm step it sees the weights the rollback restored)."""

    def __init__(self, trainer):
        self.trainer, self.saved, self.step_end = trainer, {}, {}

    def on_save(self, args, state, control, **kwargs):
        self.saved[state.global_step] = full_checksum(self.trainer.model)

    def on_step_end(self, args, state, control, **kwargs):
        self.step_end[state.global_step] = full_checksum(self.trainer.model)


def sharded(out_dir: str, engine: str) -> None:
    """The continuing rollback with sharded parameters: restore the onset's checkpoint, screen the audit's flagged
    completions, train on to max_steps."""
    import torch.distributed as dist

    fields = engines.enable(engine, out_dir)
    path = os.path.join(out_dir, "model")
    if int(os.environ.get("RANK", "0")) == 0:
        testkit.save_tiny_model(path)
    args = GRPOExtConfig(
        **{**COMMON, **fields}, output_dir=os.path.join(out_dir, engine), ddp_timeout=60,
        diversity_metrics=["repetition", "prompt_info"], collapse_detector="drift", collapse_action="rollback",
        collapse_rollback_then="screen", collapse_shape_acts=True, reward_weights=[1.0, 0.0],
        collapse_audit_rewards=["sevens_audit"],
    )  # fmt: skip
    if dist.is_initialized():  # rank 0 has saved the model
        dist.barrier()
    trainer = GRPOExtTrainer(
        model=path, reward_funcs=[fixed_text_reward, sevens_audit], args=args,
        processing_class=testkit.build_char_tokenizer(), train_dataset=testkit.arithmetic_dataset(256, seed=0),
    )  # fmt: skip
    sums = Checksums(trainer)
    trainer.add_callback(sums)
    trainer.train()
    monitor, record = trainer.collapse_monitor, trainer.collapse_monitor.rollback
    answered = monitor.continued_from
    view = {
        "engine": trainer.accelerator.distributed_type.name,
        "sharded": engines.is_sharded(trainer),
        "record": None if record is None else [record["alarm_step"], record["checkpoint_step"], record["then"]],
        "answered": None if answered is None else [answered.step, answered.onset, answered.source],
        "global_step": trainer.state.global_step,
        "saved": sums.saved,
        "step_end": sums.step_end,
        "screened_after": [
            h.get("audit/screened", 0.0)
            for h in trainer.state.log_history
            if "loss" in h and answered is not None and h["step"] > answered.step
        ],
    }
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, view)
    if dist.get_rank() == 0:
        with open(os.path.join(out_dir, f"{engine}.json"), "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()


def _setup(out_dir: str):
    """The accelerator, the tiny model (saved once, by the main process), the training prompts and the tokenizer."""
    accelerator = Accelerator(cpu=True)
    path = os.path.join(out_dir, "model")
    if accelerator.is_main_process:
        testkit.save_tiny_model(path)
    accelerator.wait_for_everyone()
    return accelerator, path, testkit.arithmetic_dataset(256, seed=0), testkit.build_char_tokenizer()


def strict(completions, **kwargs):
    """Validation gold (weight 0: computed at evaluation, never trained on): the share of digits written, a metric the
    tiny random policy scores above 0 (an exact answer it never writes)."""
    return testkit.digit_fraction_reward(completions)


def validation(out_dir: str) -> None:
    """Validation gold on two processes, GRPOExtTrainer and a plain trl.GRPOTrainer: each rank's detector series of the
    evaluations (and their standard errors) against what TRL logged."""
    accelerator, path, data, tokenizer = _setup(out_dir)
    settings = {**COMMON, "max_steps": 6, "save_strategy": "no", "eval_strategy": "steps", "eval_steps": 2}
    settings.update(per_device_eval_batch_size=8, reward_weights=[1.0, 0.0])
    common = dict(model=path, reward_funcs=[fixed_text_reward, strict], train_dataset=data, processing_class=tokenizer,
                  eval_dataset=testkit.arithmetic_dataset(16, seed=9))  # fmt: skip

    def seen(trainer, monitor) -> dict:
        logged = [(h["step"], h["eval_rewards/strict/mean"], h["eval_rewards/strict/std"])
                  for h in trainer.state.log_history if "eval_rewards/strict/mean" in h]  # fmt: skip
        return {"logged": logged, "series": monitor.detector.series["validation"],
                "se": monitor.detector.series["validation_se"]}  # fmt: skip

    plugin = GRPOExtTrainer(
        **common, args=GRPOExtConfig(**settings, output_dir=os.path.join(out_dir, "plugin"),
        diversity_metrics=["repetition", "prompt_info"], collapse_detector="drift",
        collapse_validation_metric="rewards/strict/mean"),
    )  # fmt: skip
    plugin.train()
    result = {"plugin": gather_object([seen(plugin, plugin.collapse_monitor)])}
    plain = GRPOTrainer(**common, args=GRPOConfig(**settings, output_dir=os.path.join(out_dir, "plain")))
    monitor = CollapseMonitor(plain, metrics=["repetition", "prompt_info"], detector=detector_from_config(plugin.args),
                              validation_metric="rewards/strict/mean")  # fmt: skip
    plain.add_callback(monitor)
    plain.train()
    result["plain"] = gather_object([seen(plain, monitor)])
    result["samples"] = 16 * (plain.args.num_generations_eval or plain.args.num_generations)
    if accelerator.is_main_process:
        with open(os.path.join(out_dir, "validation.json"), "w") as f:
            json.dump(result, f)


def main():
    out_dir = sys.argv[1]
    if len(sys.argv) > 2:
        return validation(out_dir) if sys.argv[2] == "validation" else sharded(out_dir, sys.argv[2])
    accelerator, path, data, tokenizer = _setup(out_dir)
    plugin = GRPOExtTrainer(
        model=path, reward_funcs=[fixed_text_reward, sevens_audit], train_dataset=data, processing_class=tokenizer,
        args=GRPOExtConfig(
            **COMMON, output_dir=os.path.join(out_dir, "plugin"), diversity_metrics=["repetition", "prompt_info"],
            collapse_detector="drift", collapse_action="rollback", collapse_shape_acts=True,
            reward_weights=[1.0, 0.0], collapse_audit_rewards=["sevens_audit"],
        ),
    )  # fmt: skip
    plugin.train()
    result = {"plugin": gather_object([view(plugin, plugin.collapse_monitor)])}
    plain = GRPOTrainer(
        model=path, reward_funcs=[fixed_text_reward, sevens_audit], train_dataset=data, processing_class=tokenizer,
        args=GRPOConfig(**COMMON, output_dir=os.path.join(out_dir, "plain"), reward_weights=[1.0, 0.0]),
    )  # fmt: skip
    monitor = CollapseMonitor(
        plain, metrics=["repetition", "prompt_info"], alarm_action="rollback", shape_acts=True,
        detector=detector_from_config(plugin.args),  # the plugin's, from the config defaults
        audit_rewards=["sevens_audit"],
    )  # fmt: skip
    plain.add_callback(monitor)
    plain.train()
    result["plain"] = gather_object([view(plain, monitor)])
    if accelerator.is_main_process:
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
