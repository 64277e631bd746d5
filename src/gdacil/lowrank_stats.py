"""Deprecated: this module moved to :mod:`gdacil.stats.lowrank`.

It re-exports that module's public names, with a ``FutureWarning`` on import, for one release.
"""

from ._deprecation import moved_module
from .stats.lowrank import LowRankFactors, LowRankGaussians, build_in_processes

__all__ = ["LowRankFactors", "LowRankGaussians", "build_in_processes"]

moved_module(__name__)
