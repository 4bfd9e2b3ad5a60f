"""Reference updates (``ref_update``): when the KL anchor moves.

``"reset"``: ProRL's reference reset (Liu et al. 2025, "ProRL: Prolonged Reinforcement Learning Expands Reasoning
Boundaries", arXiv 2505.24864, sec. 3: a hard reset of the reference to the current policy when the KL term
dominates or validation stalls; slime's ``--ref-update-interval`` and ``--reset-optimizer-states``): every
``ref_reset_steps`` optimizer steps and/or when a step's KL term ``beta x KL`` exceeds ``ref_reset_kl_term``, TRL's
reference model becomes the current policy, and with ``ref_reset_optimizer`` the optimizer's moments start afresh.
With PEFT, TRL's reference is the adapter-disabled base model; the member gives it TRL's ``"ref"`` adapter (a frozen
copy of the trained adapter, so the reference starts as the base model) and a reset copies the trained adapter into
it: the base model is never touched and every adapter checkpoint stays whole.
The decision is made at the end of an optimizer step from the step's KL summed over every process (all decide
alike); the copy happens in a callback after the optimizer stepped, where no forward or backward is in flight.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback

from ..api import Out
from ..names import config_error
from .base import Callbacks, Host, LossContext, Off, ReferenceModel
from .interfaces import REFERENCE_UPDATES, ReferenceUpdateBase
from .kl_control import StepKL

logger = logging.getLogger(__name__)

REFERENCE_UPDATES.register("none")(Off)


class _AtStepEnd(TrainerCallback):
    """Runs the member's pending reset after the optimizer step, and re-anchors a resumed run."""

    def __init__(self, member: ReferenceReset):
        self.member = member

    def on_train_begin(self, args, state, control, **kwargs):
        self.member.reanchor_if_resumed()

    def on_step_end(self, args, state, control, **kwargs):
        self.member.reset_if_due(state.global_step)


@REFERENCE_UPDATES.register("reset")
class ReferenceReset(ReferenceUpdateBase):
    """The reference becomes the current policy on a schedule and/or when the KL term grows past a bound.

    Logs ``ref_reset/kl_term`` (beta x the step's per-token mean k3 KL to the reference) every optimizer step and
    ``ref_reset/count`` (resets so far). Its state (resets so far, the step of the last) is checkpointed; the
    reference's weights are not: a run resumed after a reset makes the resumed policy its reference at its first step
    (a reset there), with a warning. The KL controllers see the KL fall to about 0 after a reset and move beta as
    their rule says (adaptive KL lowers it toward its target; docs/adaptive_kl.md).
    """

    @dataclass(frozen=True)
    class Args(ReferenceUpdateBase.Args):  # the config fields it reads
        beta: float
        ref_reset_steps: int | None
        ref_reset_kl_term: float | None
        ref_reset_optimizer: bool

    args: Args
    metrics = ("ref_reset/kl_term", "ref_reset/count")
    example_config = {"beta": 0.04, "ref_reset_steps": 1}
    docs = "adaptive_kl.md"

    @classmethod
    def check_combination(cls, args, members) -> None:
        if args.beta == 0.0:
            raise config_error(
                "ref_update",
                args.ref_update,
                "with beta=0 TRL builds no reference model and the loss has no KL term: there is nothing to reset",
                "set beta > 0 (e.g. beta=0.04), or ref_update='none'",
            )
        if args.sync_ref_model:
            raise config_error(
                "ref_update",
                args.ref_update,
                "TRL's sync_ref_model also moves the reference (it mixes the policy into it every "
                "ref_model_sync_steps), so two rules would fight over it",
                "use one: sync_ref_model=False for the reset, or ref_update='none' for TRL's mixing",
            )

    def __init__(self, args: Args, host: Host, *, reference: ReferenceModel, callbacks: Callbacks):
        super().__init__(args, host, reference=reference, callbacks=callbacks)
        if not reference.prepare_reference():
            raise config_error(
                "ref_update", "reset", "this run has no reference model to reset", "set beta > 0, or ref_update='none'"
            )
        self.count = 0
        self.last_reset = 0
        self._step_kl = StepKL()
        self._due = False
        self._resumed_after_reset = False
        callbacks.add_callback(_AtStepEnd(self))

    def after_loss(self, ctx: LossContext) -> Out[None]:
        if ctx.mode != "train":
            return None
        host = self.host
        measured = self._step_kl.add(ctx, host)
        if measured is None:
            return None
        kl_mean = measured[0]
        term = host.beta * kl_mean if kl_mean == kl_mean else 0.0  # no valid token: no KL term
        step = host.global_step + 1  # the optimizer step this loss belongs to
        args = self.args
        every = args.ref_reset_steps is not None and step - self.last_reset >= args.ref_reset_steps
        bound = args.ref_reset_kl_term is not None and term > args.ref_reset_kl_term
        self._due = every or bound
        return None, {"ref_reset/kl_term": term, "ref_reset/count": self.count + int(self._due)}

    def reset_if_due(self, step: int) -> None:
        """After the optimizer step: the reset decided at its end (every process alike)."""
        if not self._due:
            return
        self._due = False
        self._reset(step)

    def reanchor_if_resumed(self) -> None:
        if self._resumed_after_reset:
            self._resumed_after_reset = False
            logger.warning(
                "ref_update='reset': resumed after %d reset(s) (the last at step %d); the reference's weights are "
                "not in the checkpoint, so the resumed policy becomes the reference now (a reset at the resume).",
                self.count,
                self.last_reset,
            )
            self._reset(self.host.global_step)

    def _reset(self, step: int) -> None:
        self.reference.reset_reference()
        if self.args.ref_reset_optimizer:
            self.reference.reset_optimizer_moments()
        self.count += 1
        self.last_reset = step

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "last_reset": self.last_reset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state.get("count", 0))
        self.last_reset = int(state.get("last_reset", 0))
        self._resumed_after_reset = self.count > 0
