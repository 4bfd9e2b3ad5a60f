"""A tiny name -> object registry with decorator registration, used by every family of the plugin.

Example:
    >>> from trl_grpo_ext.core.registry import Registry
    >>> SCALERS = Registry("scaler")
    >>> @SCALERS.register("double")
    ... def double(x):
    ...     return 2 * x
    >>> SCALERS.get("double")(3)
    6
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to implementations of one family (sample-filter strategies, token clips, KL controllers, ...).

    Args:
        family: what the registry holds, used in error messages ("token_clip", "kl_control", ...).
    """

    def __init__(self, family: str):
        self.family = family
        self._items: dict[str, T] = {}
        self._listeners: list[Callable[[str, T], None]] = []
        self._removal_listeners: list[Callable[[str], None]] = []

    def register(self, name: str, *, override: bool = False) -> Callable[[T], T]:
        """Decorator registering an object under ``name``; registering a name twice raises unless ``override``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"A {self.family} must be registered under a non-empty string name, got {name!r}.")

        def decorator(obj: T) -> T:
            if name in self._items and not override:
                raise ValueError(
                    f"The {self.family} '{name}' is already registered (by {self._items[name]!r}). Pick another name, "
                    f"or pass override=True to replace it on purpose."
                )
            self._items[name] = obj
            for listener in self._listeners:
                listener(name, obj)
            return obj

        return decorator

    def subscribe(self, listener: Callable[[str, T], None], on_unregister: Callable[[str], None] | None = None):
        """Call ``listener(name, obj)`` for every entry, those registered so far and every later one, and
        ``on_unregister(name)`` when one is removed (how one registry derives its entries from another's, e.g. a
        family member per core strategy)."""
        self._listeners.append(listener)
        if on_unregister is not None:
            self._removal_listeners.append(on_unregister)
        for name, obj in list(self._items.items()):
            listener(name, obj)

    def unregister(self, name: str) -> T:
        """Remove ``name`` (tests, notebooks re-running a cell); derived registries follow."""
        obj = self.get(name)
        del self._items[name]
        for listener in self._removal_listeners:
            listener(name)
        return obj

    def get(self, name: str) -> T:
        """The implementation registered under ``name``; a ``ValueError`` listing the valid names otherwise."""
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(
                f"Unknown {self.family} '{name}'. Valid names: {', '.join(sorted(self._items))}. "
                f"Register a new one with @{self.family.upper()}.register('{name}') before building the trainer."
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, names={self.names()})"
