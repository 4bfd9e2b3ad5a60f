"""The older supported TRL versions (trl_grpo_ext.adapter.versions.SUPPORTED): the fast tier (the TRL contract and
parity tests, the member contract, one tiny run of every family member) in a venv per version.

``bash tests/trl_versions/make_venvs.sh`` makes ``.venv-trl-1.14`` and ``.venv-trl-1.15`` (seconds: the main
environment's packages with only TRL replaced, at the patch releases of ``tests/trl_versions/versions.txt``). Without
them this test is skipped, saying how to make them; CI makes them and sets ``TRL_GRPO_EXT_REQUIRE_TRL_TIERS=1``, which
turns the skip into a failure. The newest version (the main environment's) runs the whole suite.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import run_pytest_in_venv

from trl_grpo_ext.adapter import versions

ROOT = Path(__file__).resolve().parents[1]
PINNED = (ROOT / "tests" / "trl_versions" / "versions.txt").read_text().split()

pytestmark = pytest.mark.slow


def test_every_older_supported_minor_is_pinned_once():
    assert sorted(versions.minor(v) for v in PINNED) == list(versions.SUPPORTED[:-1])


@pytest.mark.parametrize("version", PINNED)
def test_fast_tier_passes_on_older_trl(version):
    python = ROOT / f".venv-trl-{versions.minor(version)}" / "bin" / "python"
    if python.exists():
        installed = subprocess.run(
            [str(python), "-c", "import trl; print(trl.__version__)"], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert installed == version, f"{python} has TRL {installed}, not {version}: remake it"
    run_pytest_in_venv(
        python,
        ["-m", "not slow", "tests"],
        required_by="TRL_GRPO_EXT_REQUIRE_TRL_TIERS",
        missing=f"no venv for TRL {version}: `bash tests/trl_versions/make_venvs.sh` makes them (seconds)",
        timeout=900,
        skips=True,  # the comparison with TRL's own kernel needs Triton on 1.15
    )
