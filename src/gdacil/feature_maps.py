"""Deprecated: this module moved to :mod:`gdacil.stats.feature_maps`.

It re-exports that module's public names, with a ``FutureWarning`` on import, for one release.
"""

from ._deprecation import moved_module
from .stats.feature_maps import (
    FeatureMap,
    Identity,
    RandomBuffer,
    RandomFourier,
    RandomReLU,
    auto_bandwidth,
)

__all__ = [
    "FeatureMap",
    "Identity",
    "RandomBuffer",
    "RandomFourier",
    "RandomReLU",
    "auto_bandwidth",
]

moved_module(__name__)
