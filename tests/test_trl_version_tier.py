"""The older supported TRL versions (trl_grpo_ext.adapter.versions.SUPPORTED): the fast tier (the TRL contract and
parity tests, the member contract, one tiny run of every family member) in a venv per version.

``bash tests/trl_versions/make_venvs.sh`` makes ``.venv-trl-1.14`` and ``.venv-trl-1.15`` (seconds: the main
environment's packages with only TRL replaced, at the patch releases of ``tests/trl_versions/versions.txt``). Without
them this test is skipped, saying how to make them; CI makes them and sets ``TRL_GRPO_EXT_REQUIRE_TRL_TIERS=1``, which
turns the skip into a failure. The newest version (the main environment's) runs the whole suite.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from trl_grpo_ext.adapter import versions

ROOT = Path(__file__).resolve().parents[1]
PINNED = (ROOT / "tests" / "trl_versions" / "versions.txt").read_text().split()

pytestmark = pytest.mark.slow


def test_every_older_supported_minor_is_pinned_once():
    assert sorted(versions.minor(v) for v in PINNED) == list(versions.SUPPORTED[:-1])


@pytest.mark.parametrize("version", PINNED)
def test_fast_tier_passes_on_older_trl(version):
    python = ROOT / f".venv-trl-{versions.minor(version)}" / "bin" / "python"
    if not python.exists():
        message = f"no venv for TRL {version}: `bash tests/trl_versions/make_venvs.sh` makes them (seconds)"
        if os.environ.get("TRL_GRPO_EXT_REQUIRE_TRL_TIERS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled")
    probe = subprocess.run(
        [str(python), "-c", "import trl; print(trl.__version__)"], env=env, capture_output=True, text=True, check=True
    )
    assert probe.stdout.strip() == version, f"{python} has TRL {probe.stdout.strip()}, not {version}: remake it"
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", "tests"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"TRL {version}'s fast tier ran past 900 s: {str(error.stdout)[-3000:]}")
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in summary and " failed" not in summary, summary
