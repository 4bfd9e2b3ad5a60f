"""pytest plugin for ``benchmarks/trl_suite.py``: runs TRL's own GRPO tests with one plugin arm in place of TRL's
``GRPOTrainer`` / ``GRPOConfig``, and writes each test's outcome.

Environment (set by the runner):

* ``TRL_GRPO_EXT_SUITE_SETTINGS``: the arm's settings as JSON, or absent for ``plain`` (TRL's own classes, nothing
  changed). Otherwise ``trl.GRPOTrainer`` becomes ``GRPOExtTrainer`` and ``trl.GRPOConfig`` a ``GRPOExtConfig`` whose
  ``__post_init__`` first applies the settings: a plugin field always (TRL's tests set none), a TRL field (``beta``,
  ``num_iterations``) only where the test left TRL's default, so a test's own choice stands.
* ``TRL_GRPO_EXT_SUITE_REPORT``: where to write ``{"tests": {node id: {"outcome": ..., "error": ...}}, "__arm__":
  {"trainers": built, "members": {"<switch>:<member class>": trainers that built it}}}`` (JSON).
* ``TRL_GRPO_EXT_SUITE_ONLY``: a file of node ids, one a line: the other tests are deselected.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
from pathlib import Path

_OUTCOMES: dict[str, dict] = {}
#: What the arm built: trainers, and per "<switch or observer>:<class>" how many of them built it.
_ARM: dict = {"trainers": 0, "members": {}}


def _install_arm(settings: dict) -> None:
    import trl
    from trl import GRPOConfig

    from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer
    from trl_grpo_ext.config import PLUGIN_FIELDS

    trl_defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}

    class SuiteArmConfig(GRPOExtConfig):
        def __post_init__(self):
            for name, value in settings.items():
                if name in PLUGIN_FIELDS or getattr(self, name) == trl_defaults[name]:
                    setattr(self, name, value)
            super().__post_init__()

    # a module-level name, so the trainer can pickle its args (TrainingArguments are saved with checkpoints)
    SuiteArmConfig.__module__, SuiteArmConfig.__qualname__ = __name__, "SuiteArmConfig"
    globals()["SuiteArmConfig"] = SuiteArmConfig
    trl.GRPOConfig = SuiteArmConfig

    class SuiteArmTrainer(GRPOExtTrainer):
        """``GRPOExtTrainer``, counting the trainers built and the members they built (the report's ``__arm__``)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            _ARM["trainers"] += 1
            for key, member in self.extensions.items():
                built = f"{key}:{type(member).__name__}"
                _ARM["members"][built] = _ARM["members"].get(built, 0) + 1

    trl.GRPOTrainer = SuiteArmTrainer


def pytest_configure(config):
    import_utils = importlib.import_module("trl.import_utils")
    # The tests' testing_utils imports this; TRL 1.16 dropped it (only the sklearn tests read it).
    if not hasattr(import_utils, "is_joblib_available"):
        import_utils.is_joblib_available = lambda: importlib.util.find_spec("joblib") is not None
    settings = os.environ.get("TRL_GRPO_EXT_SUITE_SETTINGS")
    if settings is not None:
        _install_arm(json.loads(settings))


def pytest_collection_modifyitems(config, items):
    only = os.environ.get("TRL_GRPO_EXT_SUITE_ONLY")
    if only is None:
        return
    keep = set(Path(only).read_text().split("\n")) - {""}
    selected = [item for item in items if item.nodeid in keep]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in keep])
    items[:] = selected


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        entry = _OUTCOMES.setdefault(report.nodeid, {"outcome": "passed", "error": ""})
        if report.outcome != "passed" and entry["outcome"] == "passed":
            entry["outcome"] = report.outcome if report.when == "call" or report.skipped else "error"
            if report.skipped:
                entry["error"] = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
            else:
                crash = getattr(report.longrepr, "reprcrash", None)
                entry["error"] = crash.message if crash is not None else str(report.longrepr)[-500:]


def pytest_sessionfinish(session):
    path = os.environ.get("TRL_GRPO_EXT_SUITE_REPORT")
    if path:
        Path(path).write_text(json.dumps({"__arm__": _ARM, "tests": _OUTCOMES}, indent=1, sort_keys=True))
