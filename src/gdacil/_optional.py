"""Imports of optional dependencies, failing with the pip line that installs them."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingDependencyError", "require"]


class MissingDependencyError(ImportError):
    """An optional package that a feature needs is not installed (or fails to import)."""


def require(module: str, *, feature: str, install: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the install line.

    Parameters
    ----------
    module : str
        Module to import, e.g. ``"transformers"``.
    feature : str
        What needs it, e.g. ``"the 'minilm' backbone"``.
    install : str
        The command that fixes it, e.g. ``"pip install 'gdacil[text]'"``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDependencyError(
            f"{feature} needs the Python package '{module.split('.')[0]}', which could not be "
            f"imported ({err}); install it with: {install}"
        ) from err
