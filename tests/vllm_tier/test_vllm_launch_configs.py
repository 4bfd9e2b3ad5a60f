"""Every real-scale config of recipes/configs/ launched for one step as a user launches it, with the colocated vLLM it
names (``use_vllm: true, vllm_mode: colocate``), under the accelerate config it is meant for (FSDP2, DeepSpeed
ZeRO-3, DDP) on 2 CPU processes: the tiny stand-in of tests/launching.py (head_dim 32 for vLLM's CPU attention),
float32, a scaled-down batch, everything else the config's. Each process starts its own engine; TRL's weight sync
gathers the sharded parameters into it (the logged log-prob gap says it did)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from launching import ENGINE, REAL_SCALE, build_stand_in, launch, real_scale_command

SHIM = Path(__file__).with_name("vllm_launch.py")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm_stand_in(tmp_path_factory) -> Path:
    return build_stand_in(tmp_path_factory.mktemp("stand_in"), hidden_size=64, num_heads=2)


@pytest.mark.parametrize("config", sorted(REAL_SCALE))
def test_real_scale_config_launches_with_its_vllm(config, vllm_stand_in, tmp_path):
    accelerate, _ = REAL_SCALE[config]
    if accelerate.startswith("zero") and importlib.util.find_spec("deepspeed") is None:
        pytest.fail("DeepSpeed is missing from the vLLM venv: tests/vllm_tier/make_venv.sh installs it")
    settings = yaml.safe_load((Path("recipes/configs") / f"{config}.yaml").read_text())
    assert settings["use_vllm"] is True and settings["vllm_mode"] == "colocate"  # what users at scale run
    out = tmp_path / "run"
    train = launch(real_scale_command(config, vllm_stand_in, out, shim=SHIM, extra=[]), out)["train"]
    assert train["engine"] == ENGINE[accelerate][1] and train["num_processes"] == 2 and train["steps"] == 1
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    gaps = [
        h["sampling/sampling_logp_difference/mean"] for h in history if "sampling/sampling_logp_difference/mean" in h
    ]
    assert gaps and max(gaps) < 1e-2, gaps  # vLLM generated, with the trainer's (gathered) weights
