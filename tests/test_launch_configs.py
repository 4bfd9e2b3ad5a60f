"""Every shipped config launches: each file of recipes/configs/ trains one step through ``recipes/math_grpo.py``, the
real-scale ones under the accelerate config of recipes/accelerate/ they are meant for, on 2 CPU processes.

Real-scale configs keep every training value except what this machine cannot run (``launching.CPU_SCALE_DOWN``): the
model is a tiny local one with a chat template, the dataset a local file in the config's format, float32 instead of
bf16, one step of a tiny batch; here generation is transformers' (tests/vllm_tier/test_vllm_launch_configs.py
launches the same configs with their colocated vLLM, in the vLLM venv). The sharded engines run through
tests/shimmed_launch.py (tests/engines.py says what it patches in accelerate on a machine without a GPU). The offline
configs run on one process, in the test's interpreter.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from launching import (
    ACCELERATE,
    CONFIGS,
    ENGINE,
    REAL_SCALE,
    RECIPE,
    ROOT,
    build_stand_in,
    free_port,
    launch,
    real_scale_command,
)

SHIM = Path(__file__).with_name("shimmed_launch.py")

pytestmark = pytest.mark.slow

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


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> Path:
    return build_stand_in(tmp_path_factory.mktemp("stand_in"))


@pytest.mark.parametrize("config", sorted(REAL_SCALE))
def test_real_scale_config_launches_under_its_engine(config, stand_in, tmp_path, request):
    accelerate, _ = REAL_SCALE[config]
    engine = ENGINE[accelerate][1]
    if accelerate.startswith("zero"):
        request.getfixturevalue("deepspeed_ops")
    out = tmp_path / "run"
    # transformers' generate (tests/vllm_tier/test_vllm_launch_configs.py launches them with the configs' vLLM)
    cmd = real_scale_command(config, stand_in, out, shim=SHIM, extra=["--use_vllm", "false"])
    train = launch(cmd, out)["train"]
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
    summary = launch(cmd, out)
    assert summary["train"]["engine"] == "DEEPSPEED" and summary["train"]["num_processes"] == 2
    for run in ("vanilla", "final"):
        assert list(summary[run]["answer_acc_checkpoints"]) == ["2", "4"]
    assert {"start", "vanilla", "final"} <= set(summary)
