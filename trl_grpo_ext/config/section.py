"""What every config section shares: the base class, the error helpers and the bounds its fields declare."""

from __future__ import annotations

import math
import types
import typing

from ..names import config_error


def bounds(low: float, high: float | None, why: str, example: str) -> tuple:
    """A field's bounds, refusing finite but absurd values: ``low <= value <= high`` (``high`` None: no upper bound),
    with ``why`` and an ``example`` in the error; a list field's every item is checked. A section declares them in its
    ``field_bounds`` (``{"kl_target": bounds(0.0, 100.0, "...", "kl_target=0.1")}``), beside its fields: not in the
    fields' metadata, which transformers' argument parser passes on to ``argparse``."""
    return (low, high, why, example)


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
