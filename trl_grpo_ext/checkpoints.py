"""The one scanner of a run's checkpoint folders: what a resume (``resume_from_checkpoint=True``) and a collapse
rollback may return to, and why a folder is refused.

A folder ``output_dir/checkpoint-<step>`` is *usable* when the files that loading it reads are there and parse:

- ``trainer_state.json`` (written last by transformers, in place: a kill can leave it truncated) exists and parses;
- the extensions' state file (:data:`STATE_FILE`), when present and asked for, parses;
- for a rollback also the weights (any ``model*`` / ``pytorch_model*`` / ``adapter_model*`` entry, or DeepSpeed's
  ``global_step*`` folder) and, when the optimizer is restored with them, the optimizer and scheduler files
  (transformers' ``_load_optimizer_and_scheduler`` silently skips both when either is missing, which left the hacked
  run's Adam moments in place while the record said "restored").

A rollback also takes only checkpoints of its own run: an ``output_dir`` reused from an earlier run holds that run's
folders, and restoring one of them would give the user someone else's weights. The collapse monitor keeps the steps
its run (and the runs it resumed from) saved, and :func:`rollback_target` is given them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field

#: File written into each checkpoint folder with the state of every extension (GRPOExtTrainer).
STATE_FILE = "grpo_ext_state.json"
#: transformers' names (``transformers.trainer.TRAINER_STATE_NAME``, ``OPTIMIZER_NAME``, ``SCHEDULER_NAME``,
#: ``transformers.trainer_utils.PREFIX_CHECKPOINT_DIR``; a contract test checks they still agree).
TRAINER_STATE = "trainer_state.json"
SCHEDULER = "scheduler.pt"
PREFIX = "checkpoint"
_FOLDER = re.compile(rf"^{PREFIX}-(\d+)$")
_WEIGHTS = ("model", "pytorch_model", "adapter_model", "global_step")
_OPTIMIZER = ("optimizer", "global_step")


def checkpoint_folders(output_dir: str) -> dict[int, str]:
    """Every ``checkpoint-<step>`` folder of ``output_dir``: step -> path (whatever it holds)."""
    if not os.path.isdir(output_dir):
        return {}
    found = {}
    for name in os.listdir(output_dir):
        match = _FOLDER.match(name)
        path = os.path.join(output_dir, name)
        if match and os.path.isdir(path):
            found[int(match.group(1))] = path
    return found


def _parses(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"{os.path.basename(path)} is damaged ({error})"
    return None


def checkpoint_damage(
    folder: str, *, ext_state: bool = True, weights: bool = False, optimizer: bool = False
) -> str | None:
    """Why ``folder`` cannot be loaded, or None. Always: its ``trainer_state.json`` exists and parses; with
    ``ext_state`` the extensions' state file parses when present; with ``weights`` the model's weights are there; with
    ``optimizer`` the optimizer's and the scheduler's files are there too (DeepSpeed keeps both in its
    ``global_step*`` folder)."""
    state = os.path.join(folder, TRAINER_STATE)
    if not os.path.exists(state):
        return f"it has no {TRAINER_STATE} (saving was interrupted)"
    damage = _parses(state)
    if damage is None and ext_state and os.path.exists(os.path.join(folder, STATE_FILE)):
        damage = _parses(os.path.join(folder, STATE_FILE))
    if damage is not None or not (weights or optimizer):
        return damage
    entries = os.listdir(folder)
    if weights and not any(name.startswith(_WEIGHTS) for name in entries):
        return "it holds no model weights (model.safetensors, pytorch_model*, adapter_model*, global_step*)"
    if optimizer:
        deepspeed = any(name.startswith("global_step") for name in entries)
        if not any(name.startswith(_OPTIMIZER) for name in entries):
            return "it has no optimizer state (optimizer.pt): restoring it would keep the current Adam moments"
        if not deepspeed and SCHEDULER not in entries:
            return f"it has no {SCHEDULER}: restoring it would keep the current learning-rate schedule"
    return None


def last_complete_checkpoint(output_dir: str, *, ext_state: bool = True, log=None) -> str:
    """The newest ``checkpoint-N`` folder of ``output_dir`` that :func:`checkpoint_damage` accepts; damaged or
    incomplete newer ones (a kill while saving) are skipped, each passed to ``log(folder, why)``. Raises
    ``ValueError`` when there is none."""
    for _, folder in sorted(checkpoint_folders(output_dir).items(), reverse=True):
        damage = checkpoint_damage(folder, ext_state=ext_state)
        if damage is None:
            return folder
        if log is not None:
            log(folder, damage)
    raise ValueError(
        f"resume_from_checkpoint=True: no complete checkpoint (a {PREFIX}-N folder whose {TRAINER_STATE} parses) in "
        f"output_dir={output_dir!r}. Fix: pass the checkpoint's path, or start without resuming."
    )


@dataclass
class RollbackTarget:
    """What :func:`rollback_target` found: the ``step`` and ``folder`` to restore (None: nothing usable), whether
    the optimizer and scheduler can be restored with the weights (``complete``), and the newer candidates it passed
    over with the reason (``skipped``: folder -> why)."""

    step: int | None
    folder: str | None
    complete: bool
    skipped: dict[str, str] = field(default_factory=dict)


def rollback_target(output_dir: str, *, before: int, own_steps: Collection[int] | None) -> RollbackTarget:
    """The checkpoint a rollback returns to: the newest one saved at or before step ``before`` by this run
    (``own_steps``: the steps the run saved; None accepts every folder) whose weights, optimizer and scheduler are all
    there and parse. When no such complete one exists, the newest whose weights are there (``complete`` False: the
    optimizer and scheduler stay the current ones, and the caller says so); else nothing."""
    skipped: dict[str, str] = {}
    weights_only: tuple[int, str] | None = None
    for step, folder in sorted(checkpoint_folders(output_dir).items(), reverse=True):
        if step > before:
            continue
        if own_steps is not None and step not in own_steps:
            skipped[folder] = "saved by another run in this output_dir (not a step this run saved)"
            continue
        damage = checkpoint_damage(folder, weights=True, optimizer=True)
        if damage is None:
            return RollbackTarget(step, folder, True, skipped)
        skipped[folder] = damage
        if weights_only is None and checkpoint_damage(folder, weights=True) is None:
            weights_only = (step, folder)
    if weights_only is not None:
        return RollbackTarget(weights_only[0], weights_only[1], False, skipped)
    return RollbackTarget(None, None, False, skipped)


def rollback_refusal(save_strategy, save_total_limit) -> tuple[str, str] | None:
    """Why a run with these settings cannot roll back, as ``(problem, fix)``, or None: a rollback returns to a
    checkpoint saved before the alarm's onset, so checkpoints must be saved every few steps and all kept. The config
    (``collapse_action``) and the plain-TRL monitor (``alarm_action``) both ask it."""
    strategy = getattr(save_strategy, "value", save_strategy)
    if strategy != "steps":
        return (
            "a rollback returns to a checkpoint saved before the alarm's onset, but save_strategy is "
            f"{str(strategy)!r}",
            "set save_strategy='steps' and save_steps (e.g. 25), or use collapse_action='stop'",
        )
    if save_total_limit is not None:
        return (
            f"save_total_limit={save_total_limit} deletes older checkpoints, and the one saved before the alarm's "
            "onset may be among them (a rollback then finds nothing to return to)",
            "set save_total_limit=None (keep every checkpoint), or use collapse_action='stop'",
        )
    return None


__all__ = [
    "PREFIX",
    "SCHEDULER",
    "STATE_FILE",
    "TRAINER_STATE",
    "RollbackTarget",
    "checkpoint_damage",
    "checkpoint_folders",
    "last_complete_checkpoint",
    "rollback_refusal",
    "rollback_target",
]
