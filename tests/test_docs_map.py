"""docs/index.md's maps of the package match the code: the "package at a glance" table names every module and folder
of ``trl_grpo_ext`` (and nothing that is not there), the families row every module of ``families/`` that holds no
member, and the adapter table every module of ``adapter/``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trl_grpo_ext"
INDEX = (ROOT / "docs" / "index.md").read_text()

pytestmark = pytest.mark.fast


def _section(title: str) -> str:
    start = INDEX.index(title)
    return INDEX[start : INDEX.index("\n## ", start + 1)]


def _library_rows() -> list[str]:
    rows = [line for line in _section("## The package at a glance").splitlines() if line.startswith("| ")]
    return [row for row in rows[1:] if "**lab**" not in row]  # after the header: the library's rows


def _named(text: str) -> set[str]:
    return set(re.findall(r"`([\w/]+(?:\.py|/))`", text))


def _entries(folder: Path) -> set[str]:
    modules = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
    folders = {f"{p.name}/" for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return modules | folders


def test_the_package_map_names_every_module_and_folder_and_only_those():
    modules_column = {name for row in _library_rows() for name in _named(row.split(" | ")[-1])}
    top = {name for name in modules_column if "/" not in name.rstrip("/")}
    assert top == _entries(PACKAGE), (sorted(top - _entries(PACKAGE)), sorted(_entries(PACKAGE) - top))


def test_the_families_row_names_each_module_that_is_no_members():
    """A member module is found by its registration; every other module of ``families/`` (the base, the slots, the
    checks) is named in the row, and every module the row names exists."""
    row = next(row for row in _library_rows() if "`families/`" in row)
    named = {name for name in _named(row) if name.endswith(".py")}
    folder = PACKAGE / "families"
    plumbing = {
        p.name
        for p in folder.glob("*.py")
        if p.name != "__init__.py" and ".register(" not in p.read_text() and "register_strategy(" not in p.read_text()
    }
    assert named <= {p.name for p in folder.glob("*.py")}, named
    assert plumbing <= named, sorted(plumbing - named)


def test_the_adapter_table_has_a_row_per_module():
    rows = _section("## How it hooks into TRL")
    documented = set(re.findall(r"^\| `(\w+\.py)` \|", rows, re.M))
    assert documented == _entries(PACKAGE / "adapter"), documented ^ _entries(PACKAGE / "adapter")
