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
        symbol: the name users import the registry by, for the hint of an unknown name ("TOKEN_CLIPS"; default
            ``family`` in capitals).
    """

    def __init__(self, family: str, *, symbol: str | None = None, check: Callable[..., None] | None = None):
        self.family = family
        self.symbol = symbol or family.upper()
        #: Called as ``check(obj, name=name)`` before ``obj`` is registered; raises to refuse it (the families set it
        #: to their member contract where they are created, ``trl_grpo_ext.names.member_contract``).
        self.check = check
        self._items: dict[str, T] = {}

    def register(self, name: str, *, override: bool = False) -> Callable[[T], T]:
        """Decorator registering an object under ``name``; registering a name twice raises unless ``override``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"A {self.family} must be registered under a non-empty string name, got {name!r}.")

        def decorator(obj: T) -> T:
            if self.check is not None:
                self.check(obj, name=name)
            if name in self._items and not override:
                raise ValueError(
                    f"The {self.family} '{name}' is already registered (by {self._items[name]!r}). Pick another name, "
                    f"or pass override=True to replace it on purpose."
                )
            self._items[name] = obj
            return obj

        return decorator

    def unregister(self, name: str) -> T:
        """Remove ``name`` (tests, notebooks re-running a cell)."""
        obj = self.get(name)
        del self._items[name]
        return obj

    def get(self, name: str) -> T:
        """The implementation registered under ``name``; a ``ValueError`` listing the valid names otherwise."""
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(
                f"Unknown {self.family} '{name}'. Valid names: {', '.join(sorted(self._items))}. "
                f"Register a new one with @{self.symbol}.register('{name}') before building the trainer."
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, names={self.names()})"
