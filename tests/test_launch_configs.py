"""Every shipped config launches: each file of recipes/configs/ trains one step through ``recipes/math_grpo.py``, the
real-scale ones under the accelerate config of recipes/accelerate/ they are meant for, on 2 CPU processes.

Real-scale configs keep every training value except what this machine cannot run (listed in ``CPU_STAND_IN``): the
model is a tiny local one with a chat template, the dataset a local file in the config's format, no vLLM (it needs a
GPU), float32 instead of bf16, one step of a tiny batch. The sharded engines run through tests/shimmed_launch.py
(tests/engines.py says what it patches in accelerate on a machine without a GPU). The offline configs run on one
process, in the test's interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port

from trl_grpo_ext import testkit

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "math_grpo.py"
SHIM = Path(__file__).with_name("shimmed_launch.py")
CONFIGS = sorted(p.stem for p in (ROOT / "recipes" / "configs").glob("*.yaml"))
ACCELERATE = sorted(p.stem for p in (ROOT / "recipes" / "accelerate").glob("*.yaml"))

pytestmark = pytest.mark.slow

#: real-scale config -> (accelerate config it is meant for, dataset format of its stand-in file)
REAL_SCALE = {
    "qwen2.5-7b_dapo17k_all_on": ("fsdp2", "dapo"),
    "qwen2.5-math-1.5b_gsm8k_pf_adaptive_kl": ("multi_gpu", "gsm8k"),
    "qwen2.5-math-7b_math_clip_cov": ("fsdp2", "math"),
    "qwen2.5-math-7b_math_kl_cov": ("zero3", "math"),
}
#: What a CPU cannot run of a real-scale config, replaced for the launch (every other value is the config's).
CPU_STAND_IN = [
    "--use_vllm", "false", "--bf16", "false", "--dtype", "float32",
    "--max_steps", "1", "--max_completion_length", "8", "--per_device_train_batch_size", "4",
    "--gradient_accumulation_steps", "1", "--num_generations", "4", "--report_to", "none", "--save_strategy", "no",
]  # fmt: skip
#: accelerate config -> (engine it names, recipe flags a CPU needs for it, what summary.json must report)
ENGINE = {
    "multi_gpu": (["--use_cpu", "true"], "MULTI_CPU"),  # DDP; on a CPU accelerate calls it MULTI_CPU (gloo)
    "fsdp2": (["--use_cpu", "true"], "FSDP"),
    "zero3": ([], "DEEPSPEED"),  # accelerate refuses DeepSpeed with use_cpu; without a GPU the device is the CPU
}
OFFLINE = [c for c in CONFIGS if c not in REAL_SCALE]
#: Offline configs: one step, a small warm start and held-out set.
OFFLINE_QUICK = [
    "--max_steps", "1", "--sft_num_examples", "256", "--sft_warm_start_epochs", "0", "--eval_num_problems", "4",
    "--eval_sampled_problems", "2", "--num_train_examples", "256", "--per_device_train_batch_size", "16",
    "--compare_vanilla", "false", "--disable_tqdm", "true",
]  # fmt: skip


def test_every_config_is_covered():
    """A new config or accelerate file must be added here (and run) or it fails this test."""
    assert set(REAL_SCALE) <= set(CONFIGS) and len(OFFLINE) + len(REAL_SCALE) == len(CONFIGS)
    assert set(ENGINE) == set(ACCELERATE) == {engine for engine, _ in REAL_SCALE.values()}


def _env() -> dict:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "DS_ACCELERATOR": "cpu",
    }


def _launch(cmd: list[str], out: Path) -> dict:
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"launch hung past 300 s: {error.stderr!s:.3000}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> Path:
    """A tiny model whose tokenizer has a chat template (the real datasets' prompts are chat messages) and one small
    local file per dataset format, with the columns the formats read."""
    from trl.chat_template_utils import qwen3_chat_template

    root = tmp_path_factory.mktemp("stand_in")
    tokenizer = testkit.build_char_tokenizer()
    tokenizer.chat_template = qwen3_chat_template
    testkit.build_tiny_model(tokenizer, max_position_embeddings=1024).save_pretrained(root / "model")
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


@pytest.mark.parametrize("config", sorted(REAL_SCALE))
def test_real_scale_config_launches_under_its_engine(config, stand_in, tmp_path, request):
    accelerate, fmt = REAL_SCALE[config]
    flags, engine = ENGINE[accelerate]
    if accelerate.startswith("zero"):
        request.getfixturevalue("deepspeed_ops")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", f"recipes/accelerate/{accelerate}.yaml"]
    cmd += ["--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port())]
    cmd += [str(SHIM), str(RECIPE), "--config", f"recipes/configs/{config}.yaml"]
    cmd += ["--model_name_or_path", str(stand_in / "model"), "--dataset_name", str(stand_in / f"{fmt}.jsonl")]
    cmd += [*CPU_STAND_IN, *flags, "--output_dir", str(out)]
    train = _launch(cmd, out)["train"]
    assert train["engine"] == engine and train["num_processes"] == 2 and train["steps"] == 1
    if accelerate != "multi_gpu":  # FSDP2 / ZeRO-3 really split the policy across the two processes
        split, total = map(int, train["sharded_parameters"].split(" of "))
        assert split == total > 0, train["sharded_parameters"]
    assert "vanilla_final_entropy" in train  # the recipe trained vanilla first, then the tools (two Trainers)


@pytest.mark.parametrize("config", OFFLINE)
def test_offline_config_launches(config, tmp_path_factory, tmp_path, monkeypatch):
    """The recipe on one process, in this interpreter (what ``accelerate launch`` does on one process, without paying
    for a fresh interpreter per config): one step of each offline config."""
    from test_recipe import load_recipe

    monkeypatch.chdir(ROOT)
    recipe = load_recipe()
    out = tmp_path / "run"
    cache = tmp_path_factory.getbasetemp() / "launch_cache"  # one warm start per task, shared by the configs
    argv = ["--config", f"recipes/configs/{config}.yaml", *OFFLINE_QUICK, "--output_dir", str(out)]
    script_args, training_args, model_args = recipe.make_parser().parse_args_and_config(
        [*argv, "--cache_dir", str(cache)]
    )
    summary = recipe.main(script_args, training_args, model_args)
    assert summary["train"]["steps"] == 1 and {"start", "final"} <= set(summary)
    assert (out / "summary.json").exists()


def test_default_recipe_under_zero3_evaluates_on_every_process(stand_in, tmp_path, deepspeed_ops):
    """The embedded default under ZeRO-3: the warm start, the held-out evaluations of the partitioned start model and
    of both trained models, and the checkpoint evaluations run on every process (a forward is a collective there)."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "recipes/accelerate/zero3.yaml"]
    cmd += ["--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port())]
    cmd += [str(SHIM), str(RECIPE), "--max_steps", "4", "--sft_num_examples", "256", "--eval_num_problems", "8"]
    cmd += ["--eval_sampled_problems", "4", "--num_train_examples", "512", "--eval_checkpoint_every", "2"]
    cmd += ["--per_device_train_batch_size", "32", "--use_cpu", "false", "--disable_tqdm", "true"]
    cmd += ["--output_dir", str(out), "--cache_dir", str(tmp_path / "cache")]
    summary = _launch(cmd, out)
    assert summary["train"]["engine"] == "DEEPSPEED" and summary["train"]["num_processes"] == 2
    for run in ("vanilla", "final"):
        assert list(summary[run]["answer_acc_checkpoints"]) == ["2", "4"]
    assert {"start", "vanilla", "final"} <= set(summary)
