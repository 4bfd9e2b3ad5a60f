"""Launching recipes/math_grpo.py with a shipped config on this CPU machine: the real-scale configs' stand-ins (a tiny
local model with a chat template, one small local file per dataset format, a scaled-down batch) and the launch
itself. Shared by tests/test_launch_configs.py (transformers' generation) and
tests/vllm_tier/test_vllm_launch_configs.py (TRL's colocated vLLM)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_lab import testkit

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "math_grpo.py"
CONFIGS = sorted(p.stem for p in (ROOT / "recipes" / "configs").glob("*.yaml"))
ACCELERATE = sorted(p.stem for p in (ROOT / "recipes" / "accelerate").glob("*.yaml"))

#: real-scale config -> (accelerate config it is meant for, dataset format of its stand-in file)
REAL_SCALE = {
    "qwen2.5-7b_dapo17k_all_on": ("fsdp2", "dapo"),
    "qwen2.5-math-1.5b_gsm8k_pf_adaptive_kl": ("multi_gpu", "gsm8k"),
    "qwen2.5-math-7b_math_clip_cov": ("fsdp2", "math"),
    "qwen2.5-math-7b_math_kl_cov": ("zero3", "math"),
}
#: What a CPU cannot run of a real-scale config besides its generation engine, replaced for the launch (every other
#: value is the config's).
CPU_SCALE_DOWN = [
    "--bf16", "false", "--dtype", "float32",
    "--max_steps", "1", "--max_completion_length", "8", "--per_device_train_batch_size", "4",
    "--gradient_accumulation_steps", "1", "--num_generations", "4", "--report_to", "none", "--save_strategy", "no",
]  # fmt: skip
#: accelerate config -> (engine it names, recipe flags a CPU needs for it, what summary.json must report)
ENGINE = {
    "multi_gpu": (["--use_cpu", "true"], "MULTI_CPU"),  # DDP; on a CPU accelerate calls it MULTI_CPU (gloo)
    "fsdp2": (["--use_cpu", "true"], "FSDP"),
    "zero3": ([], "DEEPSPEED"),  # accelerate refuses DeepSpeed with use_cpu; without a GPU the device is the CPU
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def env() -> dict:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "DS_ACCELERATOR": "cpu",
    }


def launch(cmd: list[str], out: Path) -> dict:
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"launch hung past 300 s: {error.stderr!s:.3000}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads((out / "summary.json").read_text())


def real_scale_command(config: str, stand_in: Path, out: Path, *, shim: Path, extra: list[str]) -> list[str]:
    """``accelerate launch`` of a real-scale config under the accelerate config it is meant for, on 2 processes,
    through ``shim`` (which patches what this CPU machine needs first), with the stand-in model and dataset."""
    accelerate, fmt = REAL_SCALE[config]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", f"recipes/accelerate/{accelerate}.yaml"]
    cmd += ["--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port())]
    cmd += [str(shim), str(RECIPE), "--config", f"recipes/configs/{config}.yaml"]
    cmd += ["--model_name_or_path", str(stand_in / "model"), "--dataset_name", str(stand_in / f"{fmt}.jsonl")]
    return [*cmd, *CPU_SCALE_DOWN, *extra, *ENGINE[accelerate][0], "--output_dir", str(out)]


def build_stand_in(root: Path, **model_kwargs) -> Path:
    """A tiny model whose tokenizer has a chat template (the real datasets' prompts are chat messages) and one small
    local file per dataset format, with the columns the formats read, in ``root``."""
    from trl.chat_template_utils import qwen3_chat_template

    tokenizer = testkit.build_char_tokenizer()
    tokenizer.chat_template = qwen3_chat_template
    testkit.build_tiny_model(tokenizer, max_position_embeddings=1024, **model_kwargs).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    sums = [(f"{a}+{b}", a + b) for a in range(1, 9) for b in range(1, 5)]
    rows = {
        "gsm8k": [{"question": f"What is {q}?", "answer": f"{q} = {s}\n#### {s}"} for q, s in sums],
        "math": [{"problem": f"What is {q}?", "solution": f"${q} = \\boxed{{{s}}}$"} for q, s in sums],
        "dapo": [
            {"prompt": [{"role": "user", "content": f"What is {q}?"}], "reward_model": {"ground_truth": str(s)}}
            for q, s in sums
        ],
    }
    for name, items in rows.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    return root
