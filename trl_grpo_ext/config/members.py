"""The config section of the built-in members' own parameters: the fields a member of this package declares in its
``Args`` with a default and ``help`` (peft's config beside its method), composed into the flat config like a family
section's, so a method with a parameter is one module (its docs page and its families-table row aside).

A member's ``Args`` field without a default is a config field it reads (a section's, TRL's); one with a default and
``help`` metadata is its own parameter. A parameter of a member registered from outside the package is not a field of
``GRPOExtConfig`` (the config's fields never depend on what was imported before it): such a member's run config is a
subclass of ``GRPOExtConfig`` declaring the field (``check_selection`` says so).
"""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from collections.abc import Iterable
from typing import Any

from ..names import MemberContractError, in_package, is_parameter, parameter_default
from .section import ConfigSection


def member_parameters(
    members: Iterable[tuple[str, Any]], taken: Iterable[str] = ()
) -> dict[str, tuple[Any, dataclasses.Field, list[str]]]:
    """field name -> (its resolved type, the ``Args`` field, the labels of the members declaring it) for every
    parameter the ``members`` (``(label, class)`` pairs, e.g. ``('token_clip="dppo"', DPPO)``) of this package declare
    (:func:`is_parameter`; members from elsewhere are left out), in the order they declare them. Two members may share
    a parameter only with the same type, default and help; a parameter named like a field in ``taken`` (the sections'
    and TRL's: it would redefine that field's default) is refused: ``MemberContractError`` names them."""
    found: dict[str, tuple[Any, dataclasses.Field, list[str]]] = {}
    taken = frozenset(taken)
    for label, member in members:
        if not in_package(member):
            continue
        hints = typing.get_type_hints(member.Args)
        for f in filter(is_parameter, dataclasses.fields(member.Args)):
            if f.name in taken:
                raise MemberContractError(
                    f"{label}: {member.__name__}.Args gives {f.name!r}, a field the config already has, a default: as "
                    "a parameter it would redefine that field's default. Fix: declare it without a default (the "
                    "member reads the config's), or name the parameter with the member's prefix."
                )
            if f.name not in found:
                found[f.name] = (hints[f.name], f, [label])
                continue
            kind, other, owners = found[f.name]
            if (kind, parameter_default(other), other.metadata.get("help")) != (
                hints[f.name],
                parameter_default(f),
                f.metadata.get("help"),
            ):
                raise MemberContractError(
                    f"{label} ({member.__name__}.Args) and {', '.join(owners)} both declare the parameter {f.name!r}, "
                    "with a different type, default or help. Fix: rename one, or declare it alike in both."
                )
            owners.append(label)
    return found


def _doc_entry(name: str, kind: Any, f: dataclasses.Field, owners: list[str]) -> str:
    shown = kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")
    text = f"{f.metadata['help']} (A parameter of {', '.join(f'`{o}`' for o in owners)}.)"
    indent = " " * 12
    return (
        f"        {name} (`{shown}`, *optional*, defaults to `{parameter_default(f)!r}`):\n"
        + textwrap.fill(text, width=120, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)
        + "\n"
    )


def parameters_section(members: Iterable[tuple[str, Any]], taken: Iterable[str] = ()) -> type[ConfigSection]:
    """``MemberParametersConfig``: a config section (a dataclass of :class:`ConfigSection`) with one field per
    parameter of :func:`member_parameters` (``taken``: the other fields' names), its default and ``help`` the
    member's, and its docstring section."""
    found = member_parameters(members, taken)
    fields = [
        (name, kind, dataclasses.field(default=f.default, default_factory=f.default_factory, metadata=dict(f.metadata)))
        for name, (kind, f, _) in found.items()
    ]
    section = dataclasses.make_dataclass("MemberParametersConfig", fields, bases=(ConfigSection,))
    section.__module__ = __name__
    entries = "".join(_doc_entry(name, kind, f, owners) for name, (kind, f, owners) in found.items())
    title = "\n    > The built-in members' own parameters (declared in each member's `Args`)\n\n"
    section.__doc__ = title + entries if entries else ""
    return section
