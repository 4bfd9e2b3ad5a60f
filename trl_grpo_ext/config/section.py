"""What every config section shares: the base class, the error helpers and the bounds its fields declare."""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Sequence
from dataclasses import field

from ..names import config_error, registry_for


def bounds(low: float, high: float | None, why: str, example: str) -> tuple:
    """A field's bounds, refusing finite but absurd values: ``low <= value <= high`` (``high`` None: no upper bound),
    with ``why`` and an ``example`` in the error; a list field's every item is checked. A section declares them in its
    ``field_bounds`` (``{"kl_target": bounds(0.0, 100.0, "...", "kl_target=0.1")}``), beside its fields: not in the
    fields' metadata, which transformers' argument parser passes on to ``argparse``."""
    return (low, high, why, example)


class RegisteredNames(Sequence):
    """The names registered in a family's registry, read each time they are used: a family switch's ``choices`` for
    ``argparse`` (transformers' parser passes a field's metadata on), so ``--help`` lists, and the command line and a
    YAML config accept, every member, a variant the user registered before parsing included. Its values are written
    once, by the ``@REGISTRY.register(name)`` lines."""

    def __init__(self, switch: str):
        self.switch = switch

    def __getitem__(self, index):
        return registry_for(self.switch).names()[index]

    def __len__(self) -> int:
        return len(registry_for(self.switch).names())

    def __contains__(self, name: object) -> bool:
        return name in registry_for(self.switch)

    def __repr__(self) -> str:
        return repr(registry_for(self.switch).names())


def family_switch(switch: str, *, default: str, help: str) -> typing.Any:
    """A family switch's field: a ``str`` naming a member of the family's registry (checked when the config is
    validated), whose parser choices are the registry's names (:class:`RegisteredNames`). Typed ``str``, not a
    ``Literal``: the registry is open, so a user's variant is as valid a value as a built-in one."""
    return field(default=default, metadata={"help": help, "choices": RegisteredNames(switch)})


def _fail(field_name: str, value, problem: str, fix: str) -> None:
    raise config_error(field_name, value, problem, fix)


def _type_name(annotation) -> str:
    """``"float"``, ``"int|None"``, ``"list[int]"``, ...: a field's type, whether still the annotation string or already
    resolved (transformers' argument parser replaces ``field.type`` with the resolved type in place)."""
    if isinstance(annotation, str):
        return annotation.replace(" ", "")
    args = typing.get_args(annotation)
    if annotation in (int, float, bool, str):
        return annotation.__name__
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return "|".join(names) + ("|None" if type(None) in args else "")
    if typing.get_origin(annotation) is list and args:
        return f"list[{_type_name(args[0])}]"
    return str(annotation).replace(" ", "")


def _check_number(field_name: str, value, *, integer: bool = False, whole=None) -> None:
    """``value`` is a finite int (or float when not ``integer``); booleans and strings are refused."""
    shown = value if whole is None else whole
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = " (a YAML value in quotes is a string: drop the quotes)" if isinstance(value, str) else ""
        _fail(field_name, shown, f"must be {'an integer' if integer else 'a number'}{hint}", "write a plain number")
    if integer and not isinstance(value, int):
        problem = "must hold integers" if whole is not None else "must be an integer"
        _fail(field_name, shown, problem, "write whole numbers")
    if not math.isfinite(value):
        _fail(field_name, shown, "must be finite", "write a finite number")


class ConfigSection:
    """One family's part of ``GRPOExtConfig``: its fields (with their defaults and ``help``), their bounds, its
    docstring section, its switches, :meth:`check` (its own fields) and :meth:`check_across` (its rules that read
    another section's or TRL's fields)."""

    #: The section's family switches (``GRPOExtConfig.FAMILY_SWITCHES`` is made from them).
    switches: typing.ClassVar[tuple[str, ...]] = ()
    #: Its fields' bounds: field -> :func:`bounds` (read per section: ``section.__dict__``, not inherited).
    field_bounds: typing.ClassVar[dict[str, tuple]] = {}

    def check(self) -> None:
        """Checks of this section's own fields; a bad value raises ``ValueError`` naming the field and the fix."""

    def check_across(self) -> None:
        """This section's rules that read another section's or TRL's fields (run after every section's ``check``)."""
