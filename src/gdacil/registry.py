"""Named registries: map a short name to a factory, with errors that list the known names."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["Registry", "RegistryUnion", "UnknownNameError"]


class UnknownNameError(KeyError, ValueError):
    """Raised for a name a :class:`Registry` does not hold; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Mapping[str, Callable[..., Any]]):
    """A read-mostly mapping ``name -> factory``.

    Parameters
    ----------
    kind : str
        What the registry holds ("backbone", "dataset", ...); used in error messages.
    factories : mapping, optional
        Entries to register at once (``name -> factory``).

    Examples
    --------
    >>> reg = Registry("widget")
    >>> @reg.register("round")
    ... def make_round(radius=1.0):
    ...     return ("round", radius)
    >>> reg.build("round", radius=2.0)
    ('round', 2.0)
    """

    def __init__(self, kind: str, factories: Mapping[str, Callable[..., Any]] | None = None):
        self.kind = kind
        self._factories: dict[str, Callable[..., Any]] = {}
        for name, factory in (factories or {}).items():
            self.register(name, factory)

    def register(self, name: str, factory: Callable[..., Any] | None = None):
        """Register ``factory`` under ``name``; without ``factory``, return a decorator."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings; got {name!r}")

        def add(f: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._factories[name] = f
            return f

        return add if factory is None else add(factory)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        try:
            return self._factories[name]
        except (KeyError, TypeError):
            known = ", ".join(sorted(self._factories)) or "(none)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._factories))

    def __len__(self) -> int:
        return len(self._factories)

    def build(self, name: str, /, **kwargs) -> Any:
        """Call the factory registered under ``name`` with ``kwargs``."""
        return self[name](**kwargs)


class RegistryUnion(Registry):
    """A read-only view of several registries, looked up in order at every access (names
    registered later in any of them appear here too).

    Examples
    --------
    >>> a, b = Registry("widget"), Registry("gadget")
    >>> both = RegistryUnion("thing", a, b)
    >>> _ = b.register("bell", lambda: "ring")
    >>> sorted(both), both.build("bell")
    (['bell'], 'ring')
    """

    def __init__(self, kind: str, *registries: Registry):
        self.kind = kind
        self._registries = registries

    @property  # a read-only view of the registries' factories (__init__ does not set it)
    def _factories(self) -> dict[str, Callable[..., Any]]:  # type: ignore[override]
        merged: dict[str, Callable[..., Any]] = {}
        for registry in self._registries:
            merged.update(registry._factories)
        return merged

    def register(self, name: str, factory: Callable[..., Any] | None = None):
        raise TypeError(f"register a {self.kind} in one of the registries this view combines "
                        f"({', '.join(r.kind for r in self._registries)})")

