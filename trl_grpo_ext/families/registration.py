"""The member contract's class side, checked when a class is registered and when a selection is validated (the
output side is :mod:`~trl_grpo_ext.families.contracts`, where the trainer receives what members return).

- :func:`check_member_class` (run by every family registry, through ``names.member_contract`` and
  ``Extension.check_registration``): the class is an :class:`~trl_grpo_ext.families.base.Extension` subclass built as
  ``(args, host, **services)`` with known services, it implements a hook its family needs itself (a family base's
  no-op does not count) with the parameters the trainer passes, it overrides no hook outside its family's interface,
  no public method of it is a misspelt hook, and its ``Args`` is a frozen dataclass of its base's ``Args``. A user's
  variant that breaks one fails at its ``@REGISTRY.register(...)`` line with the class, the rule and the fix, instead
  of at the first step (or never, as a silent no-op).
- :func:`check_selection` (``GRPOExtConfig.validate``): the rules of the selected members, by named service and
  declared field, then each member's own ``check_combination``.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any

from ..api import FAMILY_INTERFACES, HOOKS
from ..names import MemberContractError, config_error, in_package, is_parameter, parameter_default


def _signature(parameters: list[str]) -> str:
    return f"({', '.join(['self', *parameters])})"


def services_of(member: type) -> list[str]:
    """The services ``member``'s constructor names (its keyword-only parameters)."""
    parameters = inspect.signature(member).parameters.values()
    return [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]


def args_fields(member: Any) -> frozenset[str]:
    """The config fields a member class reads: the fields of its ``Args``."""
    return frozenset(f.name for f in dataclasses.fields(member.Args))


def check_member_class(obj: Any, *, family: str, name: str, root: type, services: dict[str, Any]) -> None:
    """Refuse, at registration, a class derived from ``root`` (``Extension``) that cannot be a member of ``family``
    (the registry's switch), naming it, the rule and the fix; ``services`` are the ones a constructor may name. The
    family's ``Off`` member (``is_off``) implements nothing and is accepted. Called by
    ``Extension.check_registration``, which each registry runs (``names.member_contract``)."""
    where = f"{family}={name!r}"
    cls = obj.__name__
    _check_constructor(obj, where, services)
    old = next((klass for klass in obj.__mro__ if "config_fields" in vars(klass)), None)
    if old is not None:  # the class or a base of its own still declares the fields the old way
        raise MemberContractError(
            f"{where}: {old.__name__}.config_fields is no longer read: a member declares the config fields it reads "
            f"as its own frozen dataclass. Fix: write @dataclass(frozen=True) class "
            f"Args({old.__mro__[1].__name__}.Args): with one typed line per field, and annotate args: Args (see "
            "docs/index.md, 'Adding a variant')."
        )
    settings = obj.Args
    for klass in obj.__mro__[1:]:  # its Args derives from each base's: a base's helpers read their fields
        base_args = vars(klass).get("Args")
        if base_args is not None and not (isinstance(settings, type) and issubclass(settings, base_args)):
            raise MemberContractError(
                f"{where}: {cls}.Args does not derive from {klass.__name__}.Args, whose fields {klass.__name__}'s "
                f"helpers read. Fix: class Args({klass.__name__}.Args)."
            )
    params = vars(settings).get("__dataclass_params__")  # set by @dataclass on the class itself, not inherited
    if params is None or not params.frozen:
        raise MemberContractError(
            f"{where}: {cls}.Args is not a frozen dataclass of its own: a member's settings are read-only. Fix: put "
            "@dataclass(frozen=True) on it."
        )
    undocumented = [f.name for f in dataclasses.fields(settings) if is_parameter(f) and not f.metadata.get("help")]
    if undocumented:
        raise MemberContractError(
            f"{where}: {cls}.Args gives {undocumented} a default but no help: a field with a default is the member's "
            "own parameter, a config field whose --help and docs come from it. Fix: declare it as "
            "`name: float = field(default=..., metadata={'help': '...'})`, or without a default if it is a config "
            "field the member reads."
        )
    if getattr(obj, "is_off", False):
        return
    interface = FAMILY_INTERFACES[family]
    retired = [hook for hook in RETIRED_HOOKS if _implements(obj, hook)]
    if retired:
        raise MemberContractError(
            f"{where}: {cls}.{retired[0]} is no hook since 0.2.0 (the trainer never calls it): "
            f"{RETIRED_HOOKS[retired[0]]}. Fix: remove it, or make it private (_{retired[0]}) if it is a helper."
        )
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
    # the trainer calls a member only through its family's hooks (one typed slot per family): another hook the class
    # overrides would never run
    foreign = [hook for hook in HOOKS if hook not in (*interface.hooks, *_STATE) and _implements(obj, hook)]
    if foreign:
        raise MemberContractError(
            f"{where}: {cls}.{foreign[0]} is no {family} hook: the trainer calls a {family} member's "
            f"{', '.join(interface.hooks)} only (and state_dict / load_state_dict), so it would never run. Fix: do the "
            f"work in one of those, or register the class in the family whose interface has {foreign[0]} "
            "(trl_grpo_ext.families.interfaces)."
        )
    # every hook the class overrides takes the parameters the trainer passes
    for hook in HOOKS:
        if getattr(obj, hook) is getattr(root, hook):
            continue
        expected = list(inspect.signature(getattr(root, hook)).parameters)[1:]
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


_STATE = ("state_dict", "load_state_dict")  # every member's: the checkpointed state
#: Hooks that were and are no more (a member still defining one would silently never run): name -> what replaced it.
RETIRED_HOOKS = {
    "loss_scale": "the trainer rescales each micro-batch's per-sequence loss to its kept rows itself (pf_rescale), "
    "whichever member (a sample filter, a refill) returned the keep flags",
}


def _check_constructor(obj: type, where: str, services: dict[str, Any]) -> None:
    """The trainer builds a member as ``obj(args, host, **services)``: two positional parameters, and keyword-only
    ones each naming one of ``services`` (``families.base.SERVICES``)."""
    cls, parameters = obj.__name__, inspect.signature(obj).parameters.values()
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = [p.name for p in parameters if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    unknown = [name for name in services_of(obj) if name not in services]
    if len(positional) != 2 or variadic or unknown:
        problem = (
            f"names the unknown service(s) {unknown} (the services: {list(services)})"
            if unknown
            else f"takes ({', '.join(p.name for p in parameters)})"
        )
        raise MemberContractError(
            f"{where}: {cls}.__init__ {problem}: the trainer builds every member as {cls}(args, host, **services), "
            "passing each service its constructor names as a keyword-only parameter. Fix: def __init__(self, args: "
            "Args, host: Host, *, rollouts: RolloutService): super().__init__(args, host) (only the services you use; "
            "settings come in args, declared in its Args)."
        )


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
    config's ``ValueError`` naming the field and the fix: first the rules by named service and declared fields, which
    hold for any member, then each member's own :meth:`~trl_grpo_ext.families.base.Extension.check_combination`
    (inherited by its subclasses, so a variant of a built-in keeps the built-in's rules). No rule reads a switch's
    value."""
    selected = [cls for cls in members.values() if not getattr(cls, "is_off", False)]
    known = {f.name: f for f in dataclasses.fields(args)}
    for switch, member in members.items():
        unknown = sorted(f for f in args_fields(member) if f not in known)
        if unknown:
            raise MemberContractError(
                f"{switch}={getattr(args, switch)!r}: {member.__name__}.Args declares {unknown}, which are "
                f"not fields of {type(args).__name__}. Fix: list the fields the member reads by their exact names (a "
                "parameter of a member registered outside trl_grpo_ext: subclass GRPOExtConfig with the field, its "
                "default and help, and pass that config as args)."
            )
        if in_package(member):
            continue  # the package's members' parameters are the config's fields (a subclass may change a default)
        for f in filter(is_parameter, dataclasses.fields(member.Args)):
            theirs = parameter_default(known[f.name])
            if parameter_default(f) != theirs:
                raise MemberContractError(
                    f"{switch}={getattr(args, switch)!r}: {member.__name__}.Args gives {f.name!r} the default "
                    f"{parameter_default(f)!r}, but {type(args).__name__}'s is {theirs!r}: the member "
                    "gets the config's value, so its default would mislead. Fix: give both the same default, or "
                    "drop the member's."
                )
    if args.prm_model_name_or_path is not None and not any("scoring" in services_of(m) for m in selected):
        raise config_error(
            "prm_model_name_or_path",
            args.prm_model_name_or_path,
            f"a PRM model is only used by a member that scores steps (advantage_estimator='prm'; got "
            f"{args.advantage_estimator!r})",
            "set advantage_estimator='prm' or drop prm_model_name_or_path",
        )
    if args.advantage_std != "sample" and not any("advantage_std" in args_fields(m) for m in selected):
        estimator = members["advantage_estimator"].__name__
        raise config_error(
            "advantage_std",
            args.advantage_std,
            f"no selected member reads it ({estimator}, advantage_estimator={args.advantage_estimator!r}, computes "
            "its advantages without a standard deviation), so it would do nothing",
            "keep advantage_std='sample', or use advantage_estimator='grpo' (or 'prm')",
        )
    setters = [switch for switch, m in members.items() if "beta_control" in services_of(m)]
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


__all__ = ["args_fields", "check_member_class", "check_selection", "services_of"]
