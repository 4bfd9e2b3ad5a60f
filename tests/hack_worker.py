"""Run under ``torchrun --nproc_per_node 2`` (gloo, CPU) by tests/test_hack_detector.py: the hack detector, an audit
(weight 0) and a rollback on two processes, GRPOExtTrainer and a plain trl.GRPOTrainer; writes every rank's view as
JSON."""

import json
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from safetensors.torch import load_file
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


def main():
    out_dir = sys.argv[1]
    accelerator = Accelerator(cpu=True)
    path = os.path.join(out_dir, "model")
    if accelerator.is_main_process:
        testkit.save_tiny_model(path)
    accelerator.wait_for_everyone()
    data, tokenizer = testkit.arithmetic_dataset(256, seed=0), testkit.build_char_tokenizer()
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
