"""Deprecations: renamed keyword arguments and moved modules keep working, with a
``FutureWarning``."""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = [
    "MOVED_MODULES",
    "accepted_parameters",
    "current_names",
    "moved_module",
    "renamed_parameters",
]

_R = TypeVar("_R")


def renamed_parameters(**renames: str) -> Callable[[Callable[..., _R]], Callable[..., _R]]:
    """Decorate a function (or ``__init__``) so that each keyword ``old=new`` of ``renames`` is
    accepted as a deprecated alias of ``new``.

    Passing the old name emits a ``FutureWarning`` naming the new one; passing both raises a
    ``TypeError``. The signature seen by ``inspect`` (and so by ``get_params``) is the
    function's own, without the aliases; ``__renamed_parameters__`` lists them. Type checkers
    see a function of any arguments, so code using an alias type-checks while the alias lasts.

    Examples
    --------
    >>> import warnings
    >>> @renamed_parameters(random_state="seed")
    ... def draw(*, seed=0):
    ...     return seed
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     draw(random_state=3)
    3
    >>> print(caught[0].message)
    draw: the keyword 'random_state' is deprecated and will be removed; use 'seed'
    """

    def decorate(func: Callable[..., _R]) -> Callable[..., _R]:
        owner = func.__qualname__.removesuffix(".__init__")

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if renames.keys() & kwargs.keys():
                kwargs = _renamed(kwargs, renames, owner)
            return func(*args, **kwargs)

        wrapper.__renamed_parameters__ = dict(renames)  # type: ignore[attr-defined]
        return wrapper

    return decorate


def _renamed(kwargs: dict[str, Any], renames: Mapping[str, str], owner: str, *,
             warn: bool = True) -> dict[str, Any]:
    out = dict(kwargs)
    for old, new in renames.items():
        if old not in out:
            continue
        if new in out:
            raise TypeError(f"{owner}: got both {new!r} and its deprecated alias {old!r}; "
                            f"pass {new!r} only")
        if warn:
            warnings.warn(f"{owner}: the keyword {old!r} is deprecated and will be removed; "
                          f"use {new!r}", FutureWarning, stacklevel=3)
        out[new] = out.pop(old)
    return out


def _renames_of(func: Callable[..., Any]) -> dict[str, str]:
    return dict(getattr(func, "__renamed_parameters__", {}))


def current_names(func: Callable[..., Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with the deprecated keywords of ``func`` (a class: its ``__init__``) under
    their current names, silently: for saved metadata and files written before a rename."""
    func = getattr(func, "__init__", func) if isinstance(func, type) else func
    return _renamed(dict(config), _renames_of(func), "", warn=False)


def accepted_parameters(func: Callable[..., Any]) -> set[str]:
    """The keywords ``func`` (a class: its ``__init__``) accepts, deprecated aliases included."""
    func = getattr(func, "__init__", func) if isinstance(func, type) else func
    names = set(inspect.signature(func).parameters) - {"self"}
    return names | set(_renames_of(func))


#: Modules that moved, old name -> new name. Each old module stays one release as a shim that
#: re-exports the new module's public names and warns on import (:func:`moved_module`); nothing
#: in gdacil or its tests imports a shim.
MOVED_MODULES: dict[str, str] = {
    "gdacil.feature_maps": "gdacil.stats.feature_maps",
    "gdacil.linalg": "gdacil.stats.linalg",
    "gdacil.lowrank_stats": "gdacil.stats.lowrank",
    "gdacil.pooled_stats": "gdacil.stats.pooled",
}


def moved_module(old: str, namespace: dict[str, Any] | None = None) -> None:
    """Warn that module ``old`` moved to ``MOVED_MODULES[old]``: called by the shim left at the
    old name, the ``FutureWarning`` points at the import of the code using it. With
    ``namespace`` (the shim's ``globals()``), first give the shim the new module's public names
    (its ``__all__``)."""
    if namespace is not None:
        new = importlib.import_module(MOVED_MODULES[old])
        namespace["__all__"] = list(new.__all__)
        namespace.update({name: getattr(new, name) for name in new.__all__})
    # 1: here, 2: the shim's body, 3: the import (the import system's frames are skipped)
    warnings.warn(f"{old} is deprecated and will be removed; import from {MOVED_MODULES[old]}",
                  FutureWarning, stacklevel=3)
