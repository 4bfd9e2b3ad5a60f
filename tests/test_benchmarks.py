"""The GPU check and its wheel list run here on the CPU (the GPU run itself needs a GPU machine)."""

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def benchmarks_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("gpu_check", "gpu_wheels", "overhead", "math_reward_speed", "diversity_speed"):
        sys.modules.pop(name, None)


def test_gpu_check_runs_tiny_on_cpu(benchmarks_on_path, tmp_path, capsys):
    import gpu_check

    out = tmp_path / "gpu.json"
    argv = ["--tiny", "--steps", "2", "--batch", "8", "--completion_length", "4", "--out", str(out)]
    results = gpu_check.main([*argv, "--only", "AEPO", "all on"])
    assert set(results) == {"trl", "trl beta=0.04", "AEPO", "all on"}  # the chosen configs and their baselines
    assert all(r["step_time_s"] > 0 for r in results.values())
    assert results["trl"]["ext_fraction"] is None and 0 < results["all on"]["ext_fraction"] < 1
    assert json.loads(out.read_text())["device"] == "cpu (tiny)"
    printed = capsys.readouterr().out
    assert "all on" in printed and "vs trl" in printed


def test_gpu_check_pads_the_tokenizer_to_qwens_vocabulary(benchmarks_on_path):
    import gpu_check

    tok = gpu_check.padded_char_tokenizer(151_936)
    assert len(tok) == 151_936
    ids = tok("12+3=", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "12+3=" and tok.decode([151_935]) != ""


def test_gpu_wheels_lists_pinned_dependencies_without_torch(benchmarks_on_path, tmp_path):
    import gpu_wheels

    reqs = gpu_wheels.main([str(tmp_path), "--list"])
    names = {r.split("==")[0] for r in reqs}
    assert {"trl", "transformers", "accelerate", "datasets"} <= names
    assert not any(gpu_wheels.EXCLUDED.match(n) for n in names)
    lines = (tmp_path / "requirements.txt").read_text().split()
    assert lines[-1].startswith("trl_grpo_ext==") and all("==" in line for line in lines)


def test_equivalent_answers_of_the_reward_benchmark_are_timed_and_mostly_right(benchmarks_on_path):
    """The rows behind the per-answer bound's default: right answers in another form, scored by the real reward."""
    import math_reward_speed

    from trl_grpo_ext.rewards.math import math_accuracy

    times = math_reward_speed.equivalent_answer_times()
    assert len(times) == len(math_reward_speed.EQUIVALENT) and all(t > 0 for t in times)
    scores = [math_accuracy(c, g) for c, g in math_reward_speed.EQUIVALENT]
    assert sum(scores) >= len(scores) - 2  # math-verify misses e^{i pi} = -1; the rest are recognised
