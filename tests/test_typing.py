"""The member interfaces type-check: mypy on the families and the pure core, on members written against their family's
interface and registered in its typed registry (they pass), and on ones whose hooks or outputs break it (refused, hook
by hook, and at the register line)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CASES = Path(__file__).with_name("typing_cases")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy: pip install -e '.[test]'"),
]


def _mypy(*paths) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--no-error-summary",
        "--cache-dir",
        str(ROOT / ".mypy_cache"),
        *map(str, paths),
    ]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_families_core_and_a_member_written_against_them_type_check():
    proc = _mypy("trl_grpo_ext/families", "trl_grpo_ext/core", CASES / "good_member.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_member_breaking_the_hook_signatures_does_not():
    proc = _mypy(CASES / "bad_member.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert 'Return type "list[int]" of "select_tokens" incompatible' in proc.stdout, proc.stdout
    assert 'Return type "float" of "extra_loss" incompatible' in proc.stdout, proc.stdout


def test_a_member_returning_another_familys_output_is_refused_at_its_register_line():
    """The registries are typed by the family Protocols (trl_grpo_ext.families.interfaces)."""
    proc = _mypy(CASES / "bad_member.py")
    assert '"type[KeepsRows]"; expected "type[AdvantageEstimator]"' in proc.stdout, proc.stdout
    assert '"type[WritesAdvantages]"; expected "type[SampleFilter]"' in proc.stdout, proc.stdout


def test_a_member_misreading_the_config_is_refused():
    """``self.args`` is the member's own frozen ``Args``: a misspelt field, a config field it does not declare, or a
    field used as the wrong type fails mypy."""
    proc = _mypy(CASES / "bad_member.py")
    assert '"Args" has no attribute "clip_cov_ration"' in proc.stdout, proc.stdout
    assert '"Args" has no attribute "beta"' in proc.stdout, proc.stdout
    assert 'Unsupported operand types for + ("float" and "str")' in proc.stdout, proc.stdout


def test_a_member_misusing_the_host_is_refused():
    """``self.host`` is typed as the Host protocol and each service as its own: a misspelt member, setting beta or
    saving a checkpoint through the host, a wrongly typed beta or another service's method fails mypy."""
    proc = _mypy(CASES / "bad_member.py")
    assert '"Host" has no attribute "global_steps"' in proc.stdout, proc.stdout
    assert '"Host" has no attribute "log"' in proc.stdout, proc.stdout  # metrics are returned, not logged
    assert 'Property "beta" defined in "Host" is read-only' in proc.stdout, proc.stdout
    assert '"Host" has no attribute "save_checkpoint"' in proc.stdout, proc.stdout
    assert 'Argument 1 to "set_beta" of "BetaControl" has incompatible type "str"; expected "float"' in proc.stdout
    assert '"BetaControl" has no attribute "drop_ratio_clip"' in proc.stdout, proc.stdout


def test_a_member_writing_what_its_hook_reads_is_refused():
    """The generation batch and the loss context are frozen, TRL's output and the inputs read-only: a member returns
    what it changes."""
    proc = _mypy(CASES / "bad_member.py")
    assert 'Property "selected" defined in "LossContext" is read-only' in proc.stdout, proc.stdout
    assert 'Property "keep" defined in "GenerationBatch" is read-only' in proc.stdout, proc.stdout
    assert proc.stdout.count('Unsupported target for indexed assignment ("Mapping[str, Any]")') == 2, proc.stdout


def test_a_member_returning_a_metric_that_is_no_number_is_refused():
    """A hook returns ``(value, metrics)`` (``trl_grpo_ext.api.Out``): the metrics map keys to floats."""
    proc = _mypy(CASES / "bad_member.py")
    assert 'Dict entry 0 has incompatible type "str": "str"; expected "str": "float"' in proc.stdout, proc.stdout
