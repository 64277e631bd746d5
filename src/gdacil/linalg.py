"""Deprecated: this module moved to :mod:`gdacil.stats.linalg`.

It re-exports that module's public names, with a ``FutureWarning`` on import, for one release.
"""

from ._deprecation import moved_module

moved_module(__name__, globals())
