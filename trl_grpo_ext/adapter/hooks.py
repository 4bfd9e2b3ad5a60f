"""The six ``GRPOTrainer`` methods the plugin overrides (TRL has no public hook for them), each calling TRL's own and
handing what it needs to a public ``ext_*`` method of ``GRPOExtTrainer``: the only place a TRL private method is
overridden.

    ``_calculate_rewards``: the (N, F) rewards TRL scored a batch with -> ``ext_on_rewards`` (checks), kept for
        ``_generate_and_score_completions`` (:data:`SCORED`).
    ``_generate_and_score_completions``: TRL's output before it shuffles and splits it -> ``ext_on_generation``
        (advantages, sample filters, rollouts).
    ``_compute_loss``: a micro-batch as its loss begins (``ext_loss_context``) open around TRL's loss
        (:data:`LOSS_CONTEXT`), then ``ext_finish_loss`` with the loss context the forward gave back
        (:data:`LOSS_RESULT`; the members' loss terms).
    ``_get_per_token_logps_and_entropies``: the first call inside ``_compute_loss`` is the policy's differentiable
        forward -> ``ext_on_policy_forward`` (advantage shaping, token clips).
    ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: ``ext_save_state`` / ``ext_load_state`` (the extensions'
        state, TRL's own pattern).

The call order these rely on (TRL calls ``_calculate_rewards`` inside ``_generate_and_score_completions``, and the
policy forward inside ``_compute_loss``) is pinned by ``tests/test_trl_contract.py``; an override that finds its
hand-off empty raises, naming the supported TRL versions.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Any

import trl
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from . import versions


class HandOff:
    """One value handed between two of the trainer's overrides where TRL 1.16 calls one inside the other and passes
    nothing between them (``_calculate_rewards`` inside ``_generate_and_score_completions``,
    ``_get_per_token_logps_and_entropies`` inside ``_compute_loss``).

    The value lives in a context variable for the length of the outer override's ``super()`` call (``with
    handoff.open(value) as slot``), not on the trainer: the trainer holds no state between its calls. The first inner
    call that wants the value takes it (:meth:`take`) or fills an empty slot (:meth:`put`). Outside the outer call, and
    for every later inner call of the same outer call, there is nothing to take or fill: a forward or a scoring that a
    member runs itself (AEPO's regenerated samples) can neither read nor overwrite the batch's value. Context variables
    are per thread (and per asyncio task), so two trainers in two threads never see each other's values.
    """

    def __init__(self, name: str):
        self.name = name
        self._slot: contextvars.ContextVar[list | None] = contextvars.ContextVar(f"trl_grpo_ext.{name}", default=None)

    @contextlib.contextmanager
    def open(self, value=None):
        if self._slot.get() is not None:
            raise RuntimeError(f"{self.name}: opened again inside its own call (TRL's call order changed?)")
        slot = [value]
        token = self._slot.set(slot)
        try:
            yield slot
        finally:
            self._slot.reset(token)

    def take(self):
        """The value, once per opening (None after it is taken, and while closed)."""
        slot = self._slot.get()
        if slot is None:
            return None
        value, slot[0] = slot[0], None
        return value

    def put(self, value) -> None:
        """Fill the open slot if it is still empty (the first inner call wins); nothing while closed."""
        slot = self._slot.get()
        if slot is not None and slot[0] is None:
            slot[0] = value


#: What TRL's own scoring of a generation batch gives the batch's hooks (rewards and rows as TRL scored them).
SCORED = HandOff("_generate_and_score_completions")
#: A micro-batch as its loss begins, for TRL's policy forward inside ``_compute_loss`` ...
LOSS_CONTEXT = HandOff("_compute_loss")
#: ... which gives back the micro-batch's loss context for the loss terms.
LOSS_RESULT = HandOff("_compute_loss result")


def _unsupported(outer: str, inner: str) -> RuntimeError:
    return RuntimeError(
        f"GRPOExtTrainer: TRL's {outer} did not call {inner}; this TRL version ({trl.__version__}) is not supported "
        f"(use trl{versions.supported_range()})."
    )


class TRLHooks(GRPOTrainer):
    """``GRPOTrainer`` with its private hooks routed to the plugin's ``ext_*`` methods (``GRPOExtTrainer`` defines
    them). Every override calls TRL's own method first (or around the plugin's work) and changes nothing else."""

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.ext_on_rewards(rewards_per_func)
        SCORED.put(
            dict(
                rewards_per_func=rewards_per_func,
                inputs=inputs,
                prompts=prompts,
                completions=completions,
                completion_ids_list=completion_ids_list,
            )
        )
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        timeouts = self.ext_reward_timeouts()
        with SCORED.open() as scored:  # TRL's own scoring of this batch fills it (_calculate_rewards)
            output = super()._generate_and_score_completions(inputs)
        if scored[0] is None:
            raise _unsupported("_generate_and_score_completions", "_calculate_rewards")
        self.ext_on_generation(output, scored[0], timeouts_before=timeouts)
        return output

    def _compute_loss(self, model, inputs):
        inputs, batch = self.ext_loss_context(inputs)
        # TRL's policy forward inside takes the micro-batch and gives back its loss context
        with LOSS_CONTEXT.open(batch), LOSS_RESULT.open() as ctx:
            loss = super()._compute_loss(model, inputs)
        if ctx[0] is None:
            raise _unsupported("_compute_loss", "_get_per_token_logps_and_entropies")
        return self.ext_finish_loss(loss, ctx[0])

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        batch = LOSS_CONTEXT.take()  # the first call inside _compute_loss: the policy's differentiable forward
        if batch is not None:
            logps, ctx = self.ext_on_policy_forward(logps, entropies, batch)
            LOSS_RESULT.put(ctx)
        return logps, entropies, aux

    def _save_checkpoint(self, model, trial):
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        self.ext_save_state(folder)  # first: a checkpoint with transformers' trainer_state.json has it
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.ext_load_state(checkpoint)

    # what GRPOExtTrainer defines
    def ext_on_rewards(self, rewards_per_func) -> None:
        raise NotImplementedError

    def ext_reward_timeouts(self) -> int:
        raise NotImplementedError

    def ext_on_generation(self, output: dict[str, Any], scored: dict[str, Any], *, timeouts_before: int) -> None:
        raise NotImplementedError

    def ext_loss_context(self, inputs):
        raise NotImplementedError

    def ext_finish_loss(self, loss, ctx):
        raise NotImplementedError

    def ext_on_policy_forward(self, logps, entropies, batch):
        raise NotImplementedError

    def ext_save_state(self, folder: str) -> None:
        raise NotImplementedError

    def ext_load_state(self, checkpoint: str) -> None:
        raise NotImplementedError


__all__ = ["LOSS_CONTEXT", "LOSS_RESULT", "SCORED", "HandOff", "TRLHooks"]
