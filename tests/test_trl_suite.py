"""The pieces of ``benchmarks/trl_suite.py`` (TRL's own GRPO tests per family member), without TRL's tests: the Hub
stand-ins load by their Hub ids from a folder, the pytest plugin swaps TRL's classes for an arm and reports each
test's outcome, and the comparison sorts an arm's failures into refusals and regressions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import trl_suite  # noqa: E402


def test_every_registered_member_gets_an_arm_with_its_example_settings():
    from trl_grpo_ext.families.base import services_of
    from trl_grpo_ext.names import FAMILIES

    arms = trl_suite.arms()
    for switch, registry in FAMILIES.items():
        for name in registry.names():
            member = registry.get(name)
            if member.is_off or name == "grpo" or "scoring" in services_of(member):
                assert not any(a.get(switch) == name for a in arms.values())
                continue
            (settings,) = [a for a in arms.values() if a.get(switch) == name]
            expected = {k: v for k, v in member.example_config.items() if k != "pkpo_k"}
            assert {k: v for k, v in settings.items() if k != switch} == expected
    assert arms["off"] == {} and arms["monitor"]["collapse_detector"] == "drift"


def test_an_arms_failures_are_sorted_into_refusals_and_regressions():
    plain = {
        "t::a": {"outcome": "passed", "error": ""},
        "t::b": {"outcome": "passed", "error": ""},
        "t::c": {"outcome": "passed", "error": ""},
        "t::d": {"outcome": "failed", "error": "OSError: Hub"},
    }
    arm = {
        "t::a": {"outcome": "passed", "error": ""},
        "t::b": {"outcome": "failed", "error": "ValueError: GRPOExtConfig.sample_filter='x': ... Fix: ..."},
        "t::c": {"outcome": "error", "error": "RuntimeError: shape mismatch"},
    }
    result = trl_suite.compare(plain, arm)
    assert result["ran"] == 3 and result["passed"] == 1 and result["failed"] == 1 and result["error"] == 1
    assert list(result["refusals"]) == ["t::b"] and list(result["regressions"]) == ["t::c"]


@pytest.mark.slow
def test_the_standins_load_by_hub_id_and_the_plugin_runs_an_arm(tmp_path):
    """A TRL-style test module, run by the plugin from the stand-ins' folder: with an arm, ``from trl import
    GRPOTrainer, GRPOConfig`` gives the plugin's classes with the arm's settings, and the Hub ids load offline."""
    from grpo_lab.hub_standins import build_standins

    standins = build_standins(tmp_path / "standins")
    tests = tmp_path / "suite"
    tests.mkdir()
    (tests / "test_probe.py").write_text(
        "from datasets import load_dataset\n"
        "from trl import GRPOConfig, GRPOTrainer\n\n"
        "def test_arm(tmp_path):\n"
        "    data = load_dataset('trl-internal-testing/zen', 'conversational_prompt_only', split='train')\n"
        "    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=3, num_generations=3,\n"
        "                      max_completion_length=4, max_steps=1, report_to='none', use_cpu=True, bf16=False)\n"
        "    trainer = GRPOTrainer(model='trl-internal-testing/tiny-Qwen2ForCausalLM-2.5',\n"
        "        reward_funcs='trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5', args=args,\n"
        "        train_dataset=data)\n"
        "    assert args.token_clip == 'clip_cov' and args.num_iterations == 1\n"
        "    trainer.train()\n\n"
        "def test_fails():\n"
        "    raise ValueError('GRPOExtConfig.x=1: refused. Fix: y')\n"
    )
    report = tmp_path / "report.json"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRL_GRPO_EXT_SUITE_REPORT": str(report),
        "TRL_GRPO_EXT_SUITE_SETTINGS": json.dumps({"token_clip": "clip_cov", "clip_cov_ratio": 0.2}),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "trl_suite_plugin", "-p", "no:cacheprovider", str(tests)],
        cwd=standins,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    record = json.loads(report.read_text())
    outcomes = {k.rsplit("::", 1)[1]: v for k, v in record["tests"].items()}
    assert outcomes["test_arm"]["outcome"] == "passed", proc.stdout[-3000:]
    assert outcomes["test_fails"]["outcome"] == "failed" and "GRPOExtConfig.x=1" in outcomes["test_fails"]["error"]
    assert record["__arm__"] == {
        "trainers": 1,
        "members": {"advantage_estimator:OutcomeAdvantage": 1, "token_clip:ClipCov": 1},
    }
