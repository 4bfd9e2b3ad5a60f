"""The contract between the trainer and a family member: its output side, and the error both sides raise.

The class side (a member class checked when it is registered, and a selection when the config is validated) is
:mod:`~trl_grpo_ext.families.registration`.

- **What a member returns is checked where the trainer receives it** (:class:`Receiver`): the metrics a hook
  returns with its value (``(value, metrics)``: keys the member declares, real numbers), which the receiver logs;
  the update type its family may return (a sample filter's advantages are refused), shapes, dtypes, lengths,
  finiteness and ranges of advantages (and that none carries a gradient graph), keep flags, token selections,
  log-probs, loss terms, beta and a member's checkpointed state (JSON, finite). A violation is a
  :class:`MemberContractError` naming the member, the hook and the step, and what to return instead; a NaN advantage
  never reaches the weights (it used to leave every weight NaN after one step, the error coming a step later from
  sampling, naming nothing).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..api import FAMILY_INTERFACES, HOOKS, GenerationUpdate, RefillUpdate, Splice  # noqa: F401  (HOOKS re-exported)
from ..names import MemberContractError


# ---------------------------------------------------------------------------------------------------- outputs
def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r:.60}"


class Receiver:
    """Checks what members return, where the trainer receives it. One per trainer; ``step`` is read at each check.

    Args:
        step: a callable giving the current global step (named in the errors).
        log: ``log(mode, key, value)``, where the metrics a hook returns go (the trainer's metrics of ``mode``).
    """

    def __init__(self, step, *, log: Callable[[str, str, float], None]):
        self._step_of = step
        self._log = log
        self._declared: dict[type, re.Pattern] = {}

    def fail(self, member, hook: str, problem: str, fix: str) -> MemberContractError:
        """The error for ``member`` (an instance, or its class name) at ``hook``."""
        name = member if isinstance(member, str) else type(member).__name__
        return MemberContractError(f"{name}.{hook} at step {self._step_of()}: {problem}. Fix: {fix}")

    # ------------------------------------------------------------------ metrics
    def value(self, member, hook: str, output, *, mode: str):
        """A hook's output: its value, or ``(value, metrics)``, whose metrics are logged under ``mode`` once each key
        is found among the member's declared ones (``metrics`` / ``optional_metrics``) and each value is a real
        number (NaN passes: "undefined in this batch" is a measurement). Returns the value."""
        if not (isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], Mapping)):
            return output
        value, metrics = output
        declared = self._declared_pattern(type(member))
        checked = {}
        for key, number in metrics.items():
            if not isinstance(key, str) or not declared.fullmatch(key):
                declares = sorted(type(member).metrics) + sorted(getattr(type(member), "optional_metrics", ()))
                raise self.fail(
                    member,
                    hook,
                    f"returned the metric {key!r}, which it does not declare (it declares {declares})",
                    f"add {key!r} to its class's `metrics` (logged every time it acts) or `optional_metrics` (logged "
                    "in some steps only): dashboards, plots and wandb's metric groups read those",
                )
            if isinstance(number, torch.Tensor) and number.numel() == 1:
                number = number.item()
            if isinstance(number, bool) or not isinstance(number, numbers.Real):
                raise self.fail(
                    member, hook, f"returned the metric {key!r} as {_describe(number)}", "return a float (float(x))"
                )
            checked[key] = float(number)
        for key, number in checked.items():
            self._log(mode, key, number)
        return value

    def _declared_pattern(self, cls: type) -> re.Pattern:
        pattern = self._declared.get(cls)
        if pattern is None:
            keys = (*cls.metrics, *getattr(cls, "optional_metrics", ()))  # type: ignore[attr-defined]
            # "{name}" placeholders stand for any text without "/": split keeps them at the odd places
            parts = (re.split(r"({\w*})", key) for key in keys)
            alternatives = ("".join(r"[^/]+" if i % 2 else re.escape(p) for i, p in enumerate(ps)) for ps in parts)
            pattern = self._declared[cls] = re.compile("|".join(f"(?:{a})" for a in alternatives) or r"(?!)")
        return pattern

    def nothing(self, member, hook: str, output, *, mode: str) -> None:
        """The output of a hook that returns no value (``after_loss``): None, or ``(None, metrics)``."""
        value = self.value(member, hook, output, mode=mode)
        if value is not None:
            raise self.fail(member, hook, f"returned {_describe(value)}", "return None, or (None, metrics)")

    # ------------------------------------------------------------------ generation side
    def generation_update(
        self, member, update, *, rows: int, family: str, mode: str, width=None, functions: int | None = None
    ):
        """``on_generation``'s return (its metrics logged under ``mode``): None, or an update of the type the member's
        ``family`` returns (:data:`~trl_grpo_ext.families.interfaces.FAMILY_INTERFACES`; a plain ``GenerationUpdate``
        setting only the family's fields passes too) whose (N,) / (N, T') advantages are finite floats and (N,) keep
        flags are booleans, N = ``rows`` (every process's rows); a refill's splice comes in a ``RefillUpdate`` with
        ``functions`` rewards per sample."""
        update = self.value(member, "on_generation", update, mode=mode)
        if update is None:
            return None
        interface = FAMILY_INTERFACES[family]
        returns = "None" if interface.update_type is None else f"None or {interface.update_type.__name__}(...)"
        if not isinstance(update, GenerationUpdate):
            raise self.fail(
                member,
                "on_generation",
                f"returned {_describe(update)}",
                f"a {family} member returns {returns} (trl_grpo_ext.families.interfaces)",
            )
        foreign = [
            name
            for name in (f.name for f in dataclasses.fields(GenerationUpdate))
            if getattr(update, name) is not None and name not in interface.update_fields
        ]
        if foreign:
            raise self.fail(
                member,
                "on_generation",
                f"set {foreign}, which a {family} member does not return (its family returns "
                f"{sorted(interface.update_fields) or 'nothing'}: {interface.protocol.__name__})",
                f"return {returns}; {', '.join(foreign)} belong(s) to another family's member",
            )
        if update.advantages is not None:
            advantages = update.advantages
            self.advantages(member, "on_generation", advantages, rows=rows, what="advantages of every process")
            if advantages.dim() == 2 and width is not None and advantages.size(1) != width():
                raise self.fail(
                    member,
                    "on_generation",
                    f"token-level advantages of width {advantages.size(1)}; the batch's completions (every process's, "
                    f"padded to the longest) have {width()} tokens",
                    f"return ({rows}, {width()}) advantages, one per completion token (or ({rows},) per row): "
                    "batch.global_completions() gives the ids and mask of that width",
                )
        if update.keep is not None:
            keep = update.keep
            if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool or tuple(keep.shape) != (rows,):
                raise self.fail(
                    member,
                    "on_generation",
                    f"keep is {_describe(keep)}, not a ({rows},) bool tensor (one flag per row of every process)",
                    "return keep as a torch.bool tensor over the gathered rows",
                )
        if update.splice is not None and not isinstance(update.splice, Splice):
            raise self.fail(
                member,
                "on_generation",
                f"splice is {_describe(update.splice)}",
                "return a trl_grpo_ext.api.Splice",
            )
        if family == "refill" and update.splice is not None:
            self._refill(member, update, functions)
        return update

    def _refill(self, member, update, functions: int | None) -> None:
        """A refill's splice comes with what the members after it read of the new samples: their rows, dataset rows
        and rewards per function."""
        splice = update.splice
        n = len(splice.rollout.completion_ids)
        per_func = getattr(update, "rewards_per_func", None)
        problem = None
        if not isinstance(update, RefillUpdate):
            problem = f"returned a splice in a {type(update).__name__}"
        elif splice.rows is None:
            problem = "returned a splice without rows (a refill names the rows its samples replace)"
        elif len(update.inputs) != n:
            problem = f"returned {len(update.inputs)} dataset rows (inputs) for a splice of {n} samples"
        elif (
            not isinstance(per_func, torch.Tensor)
            or not per_func.is_floating_point()
            or tuple(per_func.shape) != (n, functions if functions is not None else per_func.size(-1))
        ):
            problem = f"returned rewards_per_func {_describe(per_func)} for {n} samples and {functions} functions"
        if problem is not None:
            raise self.fail(
                member,
                "on_generation",
                problem,
                "return RefillUpdate(splice=Splice(rollout, rows=[...], advantages=...), inputs=<one dataset row per "
                "sample>, rewards_per_func=<(samples, reward functions) floats>) (trl_grpo_ext.api)",
            )

    def advantages(self, member, hook: str, advantages, *, rows: int, what: str = "advantages") -> torch.Tensor:
        """(rows,) or (rows, T) finite floating advantages."""
        if not isinstance(advantages, torch.Tensor) or not advantages.is_floating_point():
            raise self.fail(member, hook, f"{what} are {_describe(advantages)}", "return a floating-point torch tensor")
        if advantages.dim() not in (1, 2) or advantages.size(0) != rows:
            raise self.fail(
                member,
                hook,
                f"{what} have shape {tuple(advantages.shape)}; the batch has {rows} rows",
                f"return ({rows},) per-row or ({rows}, T) per-token advantages",
            )
        if advantages.requires_grad:
            raise self.fail(
                member,
                hook,
                f"{what} carry a gradient graph (requires_grad): TRL's loss would send the policy gradient through "
                "them",
                "return them detached (advantages.detach()): an advantage weighs a log-probability, it is no output "
                "to train",
            )
        bad = ~torch.isfinite(advantages)
        if bool(bad.any()):
            rows_bad = sorted({int(i) for i in bad.nonzero()[:, 0].tolist()})[:8]
            raise self.fail(
                member,
                hook,
                f"{what} hold {int(bad.sum())} non-finite value(s) (rows {rows_bad}); one step on them would make "
                "every weight NaN",
                "give unscorable or degenerate samples advantage 0 (torch.nan_to_num), and check the rewards",
            )
        return advantages

    def group_advantages(self, member, advantages, *, rows: int, mode: str = "train"):
        """``group_advantages``' return: None, or (rows,) finite floats."""
        advantages = self.value(member, "group_advantages", advantages, mode=mode)
        if advantages is None:
            return None
        return self.advantages(member, "group_advantages", advantages, rows=rows)

    def state(self, member, state) -> dict:
        """``state_dict()``'s return: a dict that JSON can write (the extensions' state file), without NaN or inf."""
        if not isinstance(state, dict):
            raise self.fail(member, "state_dict", f"returned {_describe(state)}", "return a dict (empty: no state)")
        try:
            json.dumps(state, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise self.fail(
                member,
                "state_dict",
                f"returned a state the checkpoint's JSON state file cannot hold ({error})",
                "return plain numbers, strings, lists and dicts (tensor.tolist(), float(x)), finite, so a checkpoint "
                "can save it",
            ) from None
        return state

    # ------------------------------------------------------------------ loss side
    def shaped_advantages(
        self, member, advantages, *, given: torch.Tensor, rows: int, width: int, mode: str
    ) -> torch.Tensor:
        """``shape_advantages``' return: (B,) or (B, T) finite floats for this micro-batch (the advantages it was
        ``given``, returned unchanged, pass without a check)."""
        advantages = self.value(member, "shape_advantages", advantages, mode=mode)
        if advantages is given:
            return advantages
        self.advantages(member, "shape_advantages", advantages, rows=rows)
        if advantages.dim() == 2 and advantages.size(1) != width:
            raise self.fail(
                member,
                "shape_advantages",
                f"token-level advantages of width {advantages.size(1)}; the micro-batch's completions have {width}",
                f"return ({rows}, {width}) advantages (or ({rows},) per row)",
            )
        return advantages

    def selection(self, member, selected, *, like: torch.Tensor, mode: str):
        """``select_tokens``' return: None or a bool tensor shaped like the log-probs."""
        selected = self.value(member, "select_tokens", selected, mode=mode)
        if selected is None:
            return None
        if not isinstance(selected, torch.Tensor) or selected.dtype != torch.bool or selected.shape != like.shape:
            raise self.fail(
                member,
                "select_tokens",
                f"returned {_describe(selected)}, not a bool mask of shape {tuple(like.shape)}",
                "return a torch.bool tensor shaped like logps (True: the tokens the member acts on), or None",
            )
        return selected

    def logps(self, member, logps, *, like: torch.Tensor, mode: str) -> torch.Tensor:
        """``modify_logps``' return: finite floats shaped like the input (``like``), still differentiable where it was
        (the input returned unchanged passes without a check)."""
        logps = self.value(member, "modify_logps", logps, mode=mode)
        if logps is like:
            return logps
        if not isinstance(logps, torch.Tensor) or logps.shape != like.shape or not logps.is_floating_point():
            raise self.fail(
                member,
                "modify_logps",
                f"returned {_describe(logps)}; the log-probs are {tuple(like.shape)} {like.dtype}",
                "return a tensor shaped like the logps it was given",
            )
        if like.requires_grad and not logps.requires_grad:
            raise self.fail(
                member,
                "modify_logps",
                "returned log-probs detached from the graph: the policy loss would have no gradient",
                "build the result from the given logps without .detach() / torch.no_grad()",
            )
        if not bool(torch.isfinite(logps).all()):
            raise self.fail(
                member, "modify_logps", "returned non-finite log-probs", "keep the log-probs finite (no log(0))"
            )
        return logps

    def loss_term(self, member, term, *, mode: str):
        """``extra_loss``' return: None or a finite 0-d floating tensor."""
        term = self.value(member, "extra_loss", term, mode=mode)
        if term is None:
            return None
        if not isinstance(term, torch.Tensor) or term.dim() != 0 or not term.is_floating_point():
            raise self.fail(
                member,
                "extra_loss",
                f"returned {_describe(term)}",
                "return a 0-d floating tensor (aggregate a per-token term with self.aggregate(per_token, ctx)), or "
                "None",
            )
        if not bool(torch.isfinite(term)):
            raise self.fail(
                member, "extra_loss", f"returned {float(term)}", "keep the term finite (check its inputs for inf / NaN)"
            )
        return term

    def beta(self, member, value) -> float:
        """What a member sets beta to (``beta_control.set_beta``): a finite real >= 0 (TRL multiplies its KL term by
        it)."""
        number = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
        if isinstance(number, bool) or not isinstance(number, numbers.Real) or not math.isfinite(number) or number < 0:
            raise self.fail(
                member,
                "beta_control.set_beta",
                f"set beta to {_describe(value)}",
                "set a finite beta >= 0 (clamp the controller's output, e.g. to [kl_beta_min, kl_beta_max])",
            )
        return float(number)


__all__ = ["HOOKS", "MemberContractError", "Receiver"]
