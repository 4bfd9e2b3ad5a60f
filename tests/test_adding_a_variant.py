"""docs/index.md, "Adding a variant": a built-in variant added to the package touches exactly the files the page names.

The test does what the page says in a copy of the package and its docs: a token clip as a new module of
``trl_grpo_ext/families/``, its docs page, its row in docs/index.md's families table, and the switch's ``Literal`` in
its config section (config/token_clip.py). With the four edits the registry tests pass in the copy (the member trains
and logs its metric, ``--help`` lists it, its page is linked); leaving out any one of them fails one of those tests.
Nothing in trainer.py or families/__init__.py is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

MODULE = '''"""``token_clip: zero_guard``: detach the tokens whose ratio moved against their advantage."""

import torch

from .base import TOKEN_CLIPS, Extension


@TOKEN_CLIPS.register("zero_guard")
class ZeroGuard(Extension):
    metrics = ("zero_guard/detached_frac",)
    docs = "zero_guard.md"

    def modify_logps(self, logps, ctx):
        chosen = ctx.policy_mask & (torch.sign(logps.detach() - ctx.old_logps) * torch.sign(ctx.advantages) < 0)
        return torch.where(chosen, logps.detach(), logps), {"zero_guard/detached_frac": float(chosen.float().mean())}
'''
PAGE = "# Zero guard\n\n`token_clip: zero_guard` detaches the tokens whose ratio moved against their advantage.\n"
LITERAL = 'token_clip: Literal["none", "clip_cov", "kl_cov", "dppo"]'


def _copy(tmp: Path) -> Path:
    repo = tmp / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "trl_grpo_ext", repo / "trl_grpo_ext", ignore=ignore)
    shutil.copytree(ROOT / "docs", repo / "docs", ignore=shutil.ignore_patterns("images"))
    (repo / "tests").mkdir()
    for name in ("conftest.py", "test_registry.py"):
        shutil.copy(ROOT / "tests" / name, repo / "tests" / name)
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    return repo


def _edit(repo: Path, skip: str | None) -> None:
    """The four edits the page names, but ``skip``."""
    if skip != "module":
        (repo / "trl_grpo_ext" / "families" / "zero_guard.py").write_text(MODULE)
    if skip != "page":
        (repo / "docs" / "zero_guard.md").write_text(PAGE)
    if skip != "index":
        index = repo / "docs" / "index.md"
        text = index.read_text()
        row = next(line for line in text.splitlines() if line.startswith("| `token_clip` |"))
        switch, values, pages = row.split(" | ")  # "| `token_clip`", the values, "[...](...) |"
        pages = pages[: -len(" |")] + ", [zero guard](zero_guard.md) |"
        new_row = " | ".join([switch, values + ', `"zero_guard"`', pages])
        index.write_text(text.replace(row, new_row))
    if skip != "literal":
        config = repo / "trl_grpo_ext" / "config" / "token_clip.py"
        text = config.read_text()
        assert LITERAL in text, "the token_clip Literal moved: update this test"
        config.write_text(text.replace(LITERAL, LITERAL[:-1] + ', "zero_guard"]'))


def _run(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.slow
@pytest.mark.parametrize("skip", [None, "module", "page", "index", "literal"])
def test_a_built_in_variant_needs_exactly_the_four_edits_the_page_names(tmp_path, skip):
    page = (ROOT / "docs" / "index.md").read_text()
    section = page[page.index("## Adding a variant") : page.index("## Pure functions")]
    assert "touches four files" in section  # the count this test holds the page to
    repo = _copy(tmp_path)
    _edit(repo, skip)
    where = _run(repo, "-c", "import trl_grpo_ext; print(trl_grpo_ext.__file__)")
    assert where.stdout.strip().startswith(str(repo)), where.stdout + where.stderr  # the copy, not the install
    selected = "config_choices or docs_page or declares_metrics or zero_guard"
    run = _run(repo, "-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/test_registry.py", "-k", selected)
    report = run.stdout[-4000:] + run.stderr[-2000:]
    if skip is None:
        assert run.returncode == 0, report
        assert "test_every_registered_member_trains_and_logs_its_metrics[token_clip=zero_guard] PASSED" in run.stdout
    else:
        assert run.returncode == 1 and " FAILED" in run.stdout, f"without the {skip} edit nothing failed:\n{report}"
