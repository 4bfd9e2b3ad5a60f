"""The math recipe: every shipped config validates offline; the recipe runs in 1 and 2 processes."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port

from trl_grpo_ext import GRPOExtConfig
from trl_grpo_ext.data import load_math_dataset
from trl_grpo_ext.rewards import REWARD_FUNCS, STEP_REWARD_FUNCS

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "math_grpo.py"
CONFIGS = sorted((ROOT / "recipes" / "configs").glob("*.yaml"))


def load_recipe():
    spec = importlib.util.spec_from_file_location("math_grpo", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["math_grpo"] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_shipped_config_validates(config, monkeypatch):
    recipe = load_recipe()
    monkeypatch.setattr(sys, "argv", ["math_grpo.py"])
    # Real-scale configs ask for bf16 on GPUs: validate them here with use_cpu (nothing else changes, no network).
    script_args, training_args, model_args = recipe.make_parser().parse_args_and_config(
        recipe.resolve_argv(["--config", str(config), "--use_cpu", "true"])
    )
    assert isinstance(training_args, GRPOExtConfig)
    for name in script_args.reward_funcs:
        REWARD_FUNCS.get(name)
    if training_args.advantage_estimator == "prm":
        assert script_args.step_reward_funcs
        for name in script_args.step_reward_funcs:
            STEP_REWARD_FUNCS.get(name)
    assert model_args.model_name_or_path


def test_default_args_match_default_yaml():
    recipe = load_recipe()
    parser = recipe.make_parser()
    embedded = parser.parse_args_and_config(recipe.resolve_argv([]))
    from_file = parser.parse_args_and_config(["--config", str(ROOT / "recipes/configs/default.yaml")])
    assert vars(embedded[0]) == vars(from_file[0])  # script arguments
    assert vars(embedded[2]) == vars(from_file[2])  # model arguments
    assert embedded[1].to_dict() == from_file[1].to_dict()  # GRPOExtConfig


USER_MODULE = """
import torch
from trl_grpo_ext.families import TOKEN_CLIPS
from trl_grpo_ext.families.interfaces import TokenClipBase


@TOKEN_CLIPS.register("recipe_user_clip")
class RecipeUserClip(TokenClipBase):
    def modify_logps(self, logps, ctx):
        return logps
"""


def test_a_users_member_is_selected_through_ext_import(tmp_path, monkeypatch):
    """``--ext_import my_module`` (command line or YAML) imports the user's module before the switches are parsed, so
    the member it registers is a valid ``--token_clip``; an unimportable name stops with the fix."""
    from trl_grpo_ext.families import TOKEN_CLIPS

    recipe = load_recipe()
    (tmp_path / "user_clips.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cpu = ["--use_cpu", "true", "--bf16", "false"]
    try:
        argv = ["--ext_import", "user_clips", "--token_clip", "recipe_user_clip", *cpu]
        assert recipe.import_extensions(argv) == ["user_clips"]
        script_args, training_args, _ = recipe.make_parser().parse_args_and_config(recipe.resolve_argv(argv))
        assert (training_args.token_clip, script_args.ext_import) == ("recipe_user_clip", ["user_clips"])
        TOKEN_CLIPS.unregister("recipe_user_clip")
        sys.modules.pop("user_clips")
        config = tmp_path / "run.yaml"
        default = (ROOT / "recipes/configs/default.yaml").read_text()
        config.write_text(default + "\next_import: [user_clips]\ntoken_clip: recipe_user_clip\n")
        assert recipe.import_extensions(["--config", str(config)]) == ["user_clips"]
        _, training_args, _ = recipe.make_parser().parse_args_and_config(["--config", str(config), *cpu])
        assert training_args.token_clip == "recipe_user_clip"
    finally:
        if "recipe_user_clip" in TOKEN_CLIPS:
            TOKEN_CLIPS.unregister("recipe_user_clip")
        sys.modules.pop("user_clips", None)
    with pytest.raises(SystemExit, match=r"--ext_import no_such_module: cannot import it.*PYTHONPATH"):
        recipe.import_extensions(["--ext_import", "no_such_module"])


def test_offline_hub_dataset_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="Hub is switched off"):
        load_math_dataset("openai/gsm8k", config="main")


def test_local_gsm8k_file(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps({"question": "1+1?", "answer": "one plus one\n#### 2"}) + "\n")
    data = load_math_dataset(str(path), dataset_format="gsm8k")
    assert data[0]["prompt"][-1] == {"role": "user", "content": "1+1?"}
    assert data[0]["solution"].endswith("#### 2")
    with pytest.raises(ValueError, match="'plain' dataset row needs"):
        load_math_dataset(str(path))


#: A shortened default: the same testbed and tools, a tiny warm start, one generation batch, a few held-out problems.
QUICK = [
    "--max_steps",
    "4",
    "--sft_num_examples",
    "256",
    "--eval_num_problems",
    "8",
    "--eval_sampled_problems",
    "4",
    "--num_train_examples",
    "512",
    "--logging_steps",
    "1",
    "--disable_tqdm",
    "true",
]
SUMMARY_KEYS = ("answer_acc", "pass_at_1", "pass_at_8", "entropy", "distinct_2")


def _run(cmd, tmp_path):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def check_summary(summary: dict, runs: set[str]) -> None:
    """The documented shape of summary.json: the held-out numbers of each run, in range."""
    assert runs <= set(summary), summary.keys()
    for run in runs:
        for key in SUMMARY_KEYS:
            value = summary[run][key]
            assert isinstance(value, float), (run, key, value)
            if key == "entropy":
                assert 0.0 <= value < 10.0, (run, key, value)
            else:
                assert 0.0 <= value <= 1.0, (run, key, value)


def run_recipe(tmp_path, *flags, launcher=None):
    """Run the recipe offline with ``flags`` (plus its own output and cache folders under ``tmp_path``): (the
    finished process, the output folder, its summary.json). ``launcher``: what starts it (default: this Python)."""
    out = tmp_path / "run"
    cmd = [
        *(launcher or [sys.executable]),
        str(RECIPE),
        *flags,
        "--output_dir",
        str(out),
        "--cache_dir",
        str(tmp_path / "c"),
    ]
    proc = _run(cmd, tmp_path)
    return proc, out, json.loads((out / "summary.json").read_text())


def test_recipe_default_runs_vanilla_and_tools(tmp_path):
    """The embedded default: the length-biased reward, vanilla and the diversity-driven KL term side by side, gold
    beside the proxy, and when the collapse alarm fired."""
    proc, out, summary = run_recipe(
        tmp_path,
        *QUICK,
        "--eval_checkpoint_every",
        "2",
    )
    check_summary(summary, {"start", "vanilla", "final"})
    for run in ("start", "vanilla", "final"):  # gold (the summary keys) beside the proxy it was trained on
        m = summary[run]
        assert m["gap"] == pytest.approx(m["proxy"] - m["pass_at_1"]) and m["length"] > 0
        assert 0.0 <= m["repetition"] <= 1.0
    for run in ("vanilla", "final"):  # the held-out accuracy at steps 2 and 4 (the final model) and their mean
        checkpoints = summary[run]["answer_acc_checkpoints"]
        assert list(checkpoints) == ["2", "4"] and checkpoints["4"] == summary[run]["answer_acc"]
        assert summary[run]["answer_acc_last_mean"] == pytest.approx((checkpoints["2"] + checkpoints["4"]) / 2)
    assert "held-out accuracy, mean of the last 2 checkpoints (steps 2-4)" in proc.stdout
    assert summary["task"] == "length_bias"
    train = summary["train"]
    assert train["steps"] == 4 and train["num_processes"] == 1
    assert train["tools"] == {"kl_control": "diversity"}
    assert isinstance(train["alarm_steps"], list) and isinstance(train["vanilla_alarm_steps"], list)
    assert (out / "vanilla" / "trainer_state.json").exists() and (out / "trainer_state.json").exists()
    assert (out / "plots" / "training.png").stat().st_size > 1000
    assert (out / "plots" / "collapse.png").stat().st_size > 1000
    assert "math_grpo summary" in proc.stdout and "tools vs vanilla: gold" in proc.stdout
    assert "collapse alarm (repetition / Distinct-2 of the training batches): vanilla " in proc.stdout
    # the hack detector's alarm (or "never") beside gold's peak on the training batches, for both runs
    for prefix, name in (("vanilla_", "vanilla"), ("", "tools")):
        assert f"{prefix}hack_alarm" in train and f"{prefix}gold_peak" in train
        assert 1 <= train[f"{prefix}gold_peak"]["step"] <= 4 and 0.0 <= train[f"{prefix}gold_peak"]["gold"] <= 1.0
        assert f"hack detector ({name}): shape (gold-free) " in proc.stdout
        assert "signals" in (train[f"{prefix}hack_alarm"] or {"signals": {}})  # each signal's first alarm, or never
    assert "gold of its training batches peaked at step" in proc.stdout


def test_recipe_addition_config_runs_the_default_tools(tmp_path):
    """The addition testbed (the default until 0.2.0): one right answer per prompt, the default tools."""
    proc, out, summary = run_recipe(
        tmp_path,
        "--config",
        str(ROOT / "recipes" / "configs" / "addition.yaml"),
        *QUICK,
    )
    check_summary(summary, {"start", "vanilla", "final"})
    assert summary["task"] == "addition" and "gap" not in summary["final"]
    assert summary["train"]["tools"] == {"token_clip": "kl_cov", "kl_control": "adaptive", "entropy_control": "aepo"}
    assert "tools vs vanilla: accuracy" in proc.stdout


def test_recipe_without_vanilla(tmp_path):
    _, out, summary = run_recipe(
        tmp_path,
        *QUICK,
        "--compare_vanilla",
        "false",
    )
    check_summary(summary, {"start", "final"})
    assert "vanilla" not in summary and not (out / "vanilla").exists()


def test_recipe_chains_task_with_prm(tmp_path):
    """The multi-step task the PRM configs use: steps, step accuracy, the vanilla baseline without step rewards."""
    _, _, summary = run_recipe(
        tmp_path,
        "--config",
        str(ROOT / "recipes" / "configs" / "prm.yaml"),
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "8",
        "--sft_warm_start_epochs",
        "0",
        "--eval_num_problems",
        "4",
        "--eval_sampled_problems",
        "2",
        "--num_train_examples",
        "64",
    )
    check_summary(summary, {"start", "vanilla", "final"})
    assert summary["task"] == "chains" and 0.0 <= summary["final"]["step_acc"] <= 1.0
    assert summary["train"]["tools"] == {"advantage_estimator": "prm"}


def test_recipe_runs_two_processes(tmp_path):
    _, _, summary = run_recipe(
        tmp_path,
        *QUICK,
        "--compare_vanilla",
        "false",
        "--per_device_train_batch_size",
        "32",
        launcher=[
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
        ],
    )
    check_summary(summary, {"start", "final"})  # the same result shape as one process
    assert summary["train"]["steps"] == 4 and summary["train"]["num_processes"] == 2


def test_recipe_forks_task_prints_reward_independent_metrics(tmp_path):
    """The many-answers task: greedy accuracy, pass@k from 64 samples (k = 1 .. 64) and distinct right answers of the
    start, vanilla and the tools, on the test half of the held-out prompts; a pass@k plot with the three curves."""
    proc, out, summary = run_recipe(
        tmp_path,
        "--config",
        str(ROOT / "recipes" / "configs" / "forks.yaml"),
        "--max_steps",
        "2",
        "--sft_num_examples",
        "256",
        "--eval_num_problems",
        "4",
        "--num_train_examples",
        "256",
    )
    assert summary["task"] == "forks"
    for run in ("start", "vanilla", "final"):
        m = summary[run]
        assert list(m["pass_at_k"]) == ["1", "2", "4", "8", "16", "32", "64"]
        assert all(0.0 <= m[f"pass_at_{k}"] <= 1.0 for k in (1, 8, 16, 64)) and 0.0 <= m["answer_acc"] <= 1.0
        assert 0.0 <= m["distinct_correct"] <= 64
        assert m["pass_at_1"] <= m["pass_at_64"]
    assert (
        "distinct right answers per prompt" in proc.stdout and "tools vs vanilla: distinct right answers" in proc.stdout
    )
    assert (out / "plots" / "pass_at_k.png").stat().st_size > 5000
