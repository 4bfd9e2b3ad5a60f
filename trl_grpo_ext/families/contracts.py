"""The contract between the trainer and a family member, checked in one place.

Two sides, both here:

- **A member class is checked when it is registered** (:func:`check_member_class`, run by every family registry's
  ``register``): it is an :class:`~trl_grpo_ext.families.base.Extension` subclass built from the host alone, it
  implements a hook its family needs with the family interface's parameters
  (:data:`~trl_grpo_ext.families.interfaces.FAMILY_INTERFACES`), its ``config_fields`` is a tuple of names of
  ``GRPOExtConfig`` fields and its ``host_capabilities`` are known ones. A user's variant that breaks one of these
  fails at its ``@REGISTRY.register(...)`` line, with the class, the rule and the fix, instead of at the first step.
- **What a member returns is checked where the trainer receives it** (:class:`Receiver`): the update type its family
  may return (a sample filter's advantages are refused), shapes, dtypes, lengths, finiteness and ranges of
  advantages, keep flags, token selections, log-probs, loss terms, loss scales and beta. A
  violation is a :class:`MemberContractError` naming the member, the hook and the step, and what to return instead;
  a NaN advantage never reaches the weights (it used to leave every weight NaN after one step, the error coming a
  step later from sampling, naming nothing).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import math
import numbers
from typing import Any

import torch

#: The hooks the trainer calls on every member (``Extension``'s), in the order it calls them.
HOOKS = (
    "on_generation",
    "group_advantages",
    "loss_scale",
    "shape_advantages",
    "select_tokens",
    "modify_logps",
    "extra_loss",
    "after_loss",
    "state_dict",
    "load_state_dict",
)


class MemberContractError(ValueError):
    """A member class, or what a member returned, breaks the contract between the trainer and its members."""


def _config_field_names() -> frozenset[str]:
    from ..config import GRPOExtConfig

    return frozenset(f.name for f in dataclasses.fields(GRPOExtConfig))


def _signature(parameters: list[str]) -> str:
    return f"({', '.join(['self', *parameters])})"


def check_member_class(obj: Any, *, family: str, name: str) -> None:
    """Refuse, at registration, a class that cannot be a member of ``family`` (the registry's switch), naming it, the
    rule and the fix. The family's ``Off`` member (``is_off``) implements nothing and is accepted."""
    from .base import CAPABILITIES, Extension

    where = f"{family}={name!r}"
    if not (isinstance(obj, type) and issubclass(obj, Extension)):
        shown = getattr(obj, "__name__", repr(obj))
        raise MemberContractError(
            f"{where}: {shown} is not a class derived from trl_grpo_ext.families.Extension (a {family} member is an "
            f"Extension subclass whose hooks the trainer calls). Fix: write class {shown.title().replace('_', '')}"
            "(Extension) with the hook your function implements (see docs/index.md, 'Adding a variant')."
        )
    cls = obj.__name__
    try:
        inspect.signature(obj).bind(object())
    except TypeError:
        raise MemberContractError(
            f"{where}: {cls}({', '.join(inspect.signature(obj).parameters)}) cannot be built from the host alone: the "
            f"trainer builds every member as {cls}(host). Fix: def __init__(self, host): super().__init__(host) (read "
            "settings from self.args, declared in config_fields)."
        ) from None
    for klass in obj.__mro__:  # the class's own config_fields and its bases' (a base need not be registered)
        fields = vars(klass).get("config_fields", ())
        owner = klass.__name__
        if isinstance(fields, str) or not isinstance(fields, (tuple, list, frozenset, set)):
            raise MemberContractError(
                f"{where}: {owner}.config_fields = {fields!r} is a {type(fields).__name__}, not a tuple of field "
                f"names (a one-name tuple needs its comma). Fix: config_fields = ({fields!r},)"
                if isinstance(fields, str)
                else f"{where}: {owner}.config_fields = {fields!r} must be a tuple of GRPOExtConfig field names."
            )
        unknown = sorted(f for f in fields if not isinstance(f, str) or f not in _config_field_names())
        if unknown:
            raise MemberContractError(
                f"{where}: {owner}.config_fields declares {unknown}, which are not GRPOExtConfig fields. Fix: list the "
                "fields the member reads by their exact names (a field of your own: subclass GRPOExtConfig and pass "
                "it as args)."
            )
    capabilities = getattr(obj, "host_capabilities", ())
    if isinstance(capabilities, str) or set(capabilities) - set(CAPABILITIES):
        raise MemberContractError(
            f"{where}: {cls}.host_capabilities = {capabilities!r}: each must be one of {list(CAPABILITIES)}, in a "
            "tuple. Fix: declare the capabilities the member uses, e.g. host_capabilities = ('rollout',)."
        )
    if getattr(obj, "is_off", False):
        return
    from .interfaces import FAMILY_INTERFACES

    interface = FAMILY_INTERFACES[family]
    misspelt = _misspelt_hooks(obj)
    if misspelt:
        written, meant = misspelt[0]
        raise MemberContractError(
            f"{where}: {cls}.{written} is no hook; the trainer never calls it (did you mean {meant}?). Fix: rename it "
            f"{meant}, or make it private (_{written}) if it is a helper."
        )
    implemented = [hook for hook in interface.hooks if _implements(obj, hook)]
    if not set(implemented) & set(interface.required):
        raise MemberContractError(
            f"{where}: {cls} implements none of {list(interface.required)}: {interface.why}. Fix: override "
            f"{' or '.join(interface.required)} with the signature of trl_grpo_ext.families.interfaces."
            f"{interface.protocol.__name__}."
        )
    # every hook the class overrides (its family's and the others the trainer calls on every member) takes the
    # parameters the trainer passes
    for hook in HOOKS:
        if getattr(obj, hook) is getattr(Extension, hook):
            continue
        expected = list(inspect.signature(getattr(Extension, hook)).parameters)[1:]
        try:
            got = list(inspect.signature(getattr(obj, hook)).parameters)[1:]
        except (TypeError, ValueError):  # not introspectable (a C callable): the call will tell
            continue
        try:  # the trainer passes the arguments by position
            inspect.signature(getattr(obj, hook)).bind(None, *expected)
        except TypeError:
            owner = f"interfaces.{interface.protocol.__name__}" if hook in interface.hooks else "base.Extension"
            raise MemberContractError(
                f"{where}: {cls}.{hook}{_signature(got)} cannot be called as {hook}{_signature(expected)} (the "
                f"trainer passes {len(expected)} argument(s) by position). Fix: use the signature of "
                f"trl_grpo_ext.families.{owner}.{hook}."
            ) from None


def _is_family_base(klass: type) -> bool:
    """Whether ``klass`` is one of the library's family bases (``Extension`` and the ``*Base`` classes of
    ``families.interfaces``), whose hooks are no-ops: inheriting one implements nothing."""
    return klass.__module__ in ("trl_grpo_ext.families.base", "trl_grpo_ext.families.interfaces") and (
        klass.__name__ == "Extension" or klass.__name__.endswith("Base")
    )


def _implements(obj: type, hook: str) -> bool:
    """Whether ``obj`` (or a base of its own, not a family base) defines ``hook``."""
    for klass in obj.__mro__:
        if hook in vars(klass):
            return not _is_family_base(klass)
    return False


def _misspelt_hooks(obj: type) -> list[tuple[str, str]]:
    """Public methods of ``obj``'s own classes (not the family bases) that look like a hook but are none
    (``after_los`` for ``after_loss``): the trainer would never call them."""
    found = []
    for klass in obj.__mro__:
        if klass is object or _is_family_base(klass):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in HOOKS or not callable(value):
                continue
            close = difflib.get_close_matches(name, HOOKS, n=1, cutoff=0.85)
            if close:
                found.append((name, close[0]))
    return found


# ---------------------------------------------------------------------------------------------------- combinations
def check_selection(args, members: dict[str, Any]) -> None:
    """The rules of the selected members (family switch -> member class, "off" members included), raised as the
    config's ``ValueError`` naming the field and the fix: first the rules by capability and declared fields, which hold
    for any member, then each member's own :meth:`~trl_grpo_ext.families.base.Extension.check_combination` (inherited
    by its subclasses, so a variant of a built-in keeps the built-in's rules). No rule reads a switch's value."""
    from ..names import config_error
    from .base import config_fields_of

    selected = [cls for cls in members.values() if not getattr(cls, "is_off", False)]
    if args.prm_model_name_or_path is not None and not any("scoring_model" in m.host_capabilities for m in selected):
        raise config_error(
            "prm_model_name_or_path",
            args.prm_model_name_or_path,
            f"a PRM model is only used by a member that scores steps (advantage_estimator='prm'; got "
            f"{args.advantage_estimator!r})",
            "set advantage_estimator='prm' or drop prm_model_name_or_path",
        )
    if args.advantage_std != "sample" and not any("advantage_std" in config_fields_of(m) for m in selected):
        estimator = members["advantage_estimator"].__name__
        raise config_error(
            "advantage_std",
            args.advantage_std,
            f"no selected member reads it ({estimator}, advantage_estimator={args.advantage_estimator!r}, computes "
            "its advantages without a standard deviation), so it would do nothing",
            "keep advantage_std='sample', or use advantage_estimator='grpo' (or 'prm')",
        )
    setters = [switch for switch, m in members.items() if "set_beta" in m.host_capabilities]
    if setters and args.beta == 0.0:
        raise config_error(
            "beta",
            args.beta,
            f"{setters[0]}={getattr(args, setters[0])!r} needs a starting beta > 0: with beta=0 TRL creates no "
            "reference model and the KL term can never switch on",
            "set beta to a start value in [kl_beta_min, kl_beta_max], e.g. beta=0.04",
        )
    for member in selected:
        member.check_combination(args, members)


# ---------------------------------------------------------------------------------------------------- outputs
def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r:.60}"


class Receiver:
    """Checks what members return, where the trainer receives it. One per trainer; ``step`` is read at each check.

    Args:
        step: a callable giving the current global step (named in the errors).
    """

    def __init__(self, step):
        self._step_of = step

    def fail(self, member, hook: str, problem: str, fix: str) -> MemberContractError:
        """The error for ``member`` (an instance, or its class name) at ``hook``."""
        name = member if isinstance(member, str) else type(member).__name__
        return MemberContractError(f"{name}.{hook} at step {self._step_of()}: {problem}. Fix: {fix}")

    # ------------------------------------------------------------------ generation side
    def generation_update(self, member, update, *, rows: int, family: str, width=None):
        """``on_generation``'s return: None, or an update of the type the member's ``family`` returns
        (:data:`~trl_grpo_ext.families.interfaces.FAMILY_INTERFACES`; a plain ``GenerationUpdate`` setting only the
        family's fields passes too) whose (N,) / (N, T') advantages are finite floats and (N,) keep flags are booleans,
        N = ``rows`` (every process's rows)."""
        from ..adapter.rollouts import Splice
        from .base import GenerationUpdate
        from .interfaces import FAMILY_INTERFACES

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
                "return a trl_grpo_ext.adapter.rollouts.Splice",
            )
        return update

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

    def group_advantages(self, member, advantages, *, rows: int):
        """``group_advantages``' return: None, or (rows,) finite floats."""
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
    def shaped_advantages(self, member, advantages, *, given: torch.Tensor, rows: int, width: int) -> torch.Tensor:
        """``shape_advantages``' return: (B,) or (B, T) finite floats for this micro-batch (the advantages it was
        ``given``, returned unchanged, pass without a check)."""
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

    def selection(self, member, selected, *, like: torch.Tensor):
        """``select_tokens``' return: None or a bool tensor shaped like the log-probs."""
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

    def logps(self, member, logps, *, like: torch.Tensor) -> torch.Tensor:
        """``modify_logps``' return: finite floats shaped like the input (``like``), still differentiable where it was
        (the input returned unchanged passes without a check)."""
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

    def loss_term(self, member, term):
        """``extra_loss``' return: None or a finite 0-d floating tensor."""
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

    def loss_scale(self, member, scale) -> float:
        """``loss_scale``' return: a finite real >= 0."""
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale < 0:
            raise self.fail(
                member,
                "loss_scale",
                f"returned {_describe(scale)}",
                "return a finite float >= 0 (1.0 leaves the micro-batch's loss as it is)",
            )
        return float(scale)

    def beta(self, member, value) -> float:
        """What a member assigns to ``host.beta``: a finite real >= 0 (TRL multiplies its KL term by it)."""
        number = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
        if isinstance(number, bool) or not isinstance(number, numbers.Real) or not math.isfinite(number) or number < 0:
            raise self.fail(
                member,
                "host.beta",
                f"set beta to {_describe(value)}",
                "set a finite beta >= 0 (clamp the controller's output, e.g. to [kl_beta_min, kl_beta_max])",
            )
        return float(number)


__all__ = ["HOOKS", "MemberContractError", "Receiver", "check_member_class", "check_selection"]
