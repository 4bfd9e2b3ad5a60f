"""docs/index.md, "Adding a variant": a built-in variant added to the package touches exactly the files the page names.

The test does what the page says in a copy of the package and its docs: a token clip as a new module of
``trl_grpo_ext/families/``, its docs page and its row in docs/index.md's families table: three files. The switch's
values are its registry's names (no ``Literal`` to extend: ``--help`` and the parser read the registry). A variant with
a parameter declares it in its module, in its ``Args`` with a default and help: still three files (the config composes
the built-in members' parameters, ``config.members``); the test checks ``--help``, the docstring, the command line
and the config's number check reach it and the member reads its value. With the edits the registry tests pass in the
copy (the member trains and logs its metric, ``--help`` lists it, its page is linked); leaving out any one of them
fails one of those tests. Nothing in trainer.py, families/__init__.py or config/ is touched.
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

from .interfaces import TOKEN_CLIPS, TokenClipBase


@TOKEN_CLIPS.register("zero_guard")
class ZeroGuard(TokenClipBase):
    metrics = ("zero_guard/detached_frac",)
    docs = "zero_guard.md"

    def modify_logps(self, logps, ctx):
        chosen = ctx.policy_mask & (torch.sign(logps.detach() - ctx.old_logps) * torch.sign(ctx.advantages) < 0)
        return torch.where(chosen, logps.detach(), logps), {"zero_guard/detached_frac": float(chosen.float().mean())}
'''
#: The same member with one parameter, ``zero_guard_margin``: how far the log-ratio must have moved.
MODULE_WITH_PARAMETER = '''"""``token_clip: zero_guard``: detach tokens moved against their advantage by a margin."""

from dataclasses import dataclass, field

import torch

from .interfaces import TOKEN_CLIPS, TokenClipBase


@TOKEN_CLIPS.register("zero_guard")
class ZeroGuard(TokenClipBase):
    metrics = ("zero_guard/detached_frac",)
    docs = "zero_guard.md"

    @dataclass(frozen=True)
    class Args(TokenClipBase.Args):
        zero_guard_margin: float = field(
            default=0.0, metadata={"help": "How far a token's log-ratio must have moved for zero_guard to detach it."}
        )

    args: Args

    def modify_logps(self, logps, ctx):
        moved = logps.detach() - ctx.old_logps
        against = torch.sign(moved) * torch.sign(ctx.advantages) < 0
        chosen = ctx.policy_mask & against & (moved.abs() >= self.args.zero_guard_margin)
        return torch.where(chosen, logps.detach(), logps), {"zero_guard/detached_frac": float(chosen.float().mean())}
'''
PAGE = "# Zero guard\n\n`token_clip: zero_guard` detaches the tokens whose ratio moved against their advantage.\n"


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


def _edit(repo: Path, skip: str | None, *, parameter: bool) -> None:
    """The edits the page names, but ``skip`` (with ``parameter``, the module declares it: no other file changes)."""
    if skip != "module":
        module = MODULE_WITH_PARAMETER if parameter else MODULE
        (repo / "trl_grpo_ext" / "families" / "zero_guard.py").write_text(module)
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


def _run(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600, check=False
    )


CASES = [
    *[(False, skip) for skip in (None, "module", "page", "index")],
    (True, None),
]

#: With the parameter: ``--help`` documents it, the config and the command line set it, and the member reads the value.
PARAMETER_CHECK = """
import dataclasses, io, contextlib
from trl import TrlParser
from trl_grpo_ext import GRPOExtConfig
from trl_grpo_ext.families import TOKEN_CLIPS
from trl_grpo_ext.families.base import member_args
help_text = io.StringIO()
with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):
    TrlParser((GRPOExtConfig,)).parse_args_and_config(["--help"])
assert "--zero_guard_margin" in help_text.getvalue() and "log-ratio must have moved" in help_text.getvalue()
assert "zero_guard_margin (`float`, *optional*, defaults to `0.0`)" in GRPOExtConfig.__doc__
argv = ["--output_dir", "out", "--use_cpu", "--token_clip", "zero_guard", "--zero_guard_margin", "0.25"]
(config,) = TrlParser((GRPOExtConfig,)).parse_args_and_config(argv)
assert member_args(config, TOKEN_CLIPS.get("zero_guard")).zero_guard_margin == 0.25
try:
    GRPOExtConfig(output_dir="out", use_cpu=True, token_clip="zero_guard", zero_guard_margin="0.1")
except ValueError as error:
    assert "zero_guard_margin" in str(error), error
else:
    raise AssertionError("a string margin was accepted")
print("PARAMETER OK")
"""


@pytest.mark.slow
@pytest.mark.parametrize(("parameter", "skip"), CASES, ids=[f"parameter={p}-skip={s}" for p, s in CASES])
def test_a_built_in_variant_needs_exactly_the_edits_the_page_names(tmp_path, parameter, skip):
    page = (ROOT / "docs" / "index.md").read_text()
    section = " ".join(page[page.index("## Adding a variant") : page.index("## Pure functions")].split())
    assert "touches three files" in section and "fourth" not in section  # the count this test holds the page to
    repo = _copy(tmp_path)
    _edit(repo, skip, parameter=parameter)
    where = _run(repo, "-c", "import trl_grpo_ext; print(trl_grpo_ext.__file__)")
    assert where.stdout.strip().startswith(str(repo)), where.stdout + where.stderr  # the copy, not the install
    selected = "config_choices or docs_page or declares_metrics or zero_guard"  # docs_page: both ways
    run = _run(repo, "-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/test_registry.py", "-k", selected)
    report = run.stdout[-4000:] + run.stderr[-2000:]
    if parameter:
        checked = _run(repo, "-c", PARAMETER_CHECK)
        assert "PARAMETER OK" in checked.stdout, checked.stdout[-3000:] + checked.stderr[-3000:]
    if skip is None:
        assert run.returncode == 0, report
        assert "test_every_registered_member_trains_and_logs_its_metrics[token_clip=zero_guard] PASSED" in run.stdout
        assert "test_config_choices_are_the_registry_names[token_clip] PASSED" in run.stdout
    else:
        assert run.returncode == 1 and " FAILED" in run.stdout, f"without the {skip} edit nothing failed:\n{report}"
