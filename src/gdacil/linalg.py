"""Deprecated: this module moved to :mod:`gdacil.stats.linalg`.

It re-exports that module's public names, with a ``FutureWarning`` on import, for one release.
"""

from ._deprecation import moved_module
from .stats.linalg import (
    NumericalWarning,
    class_top_eigh,
    lapack_top_eigh,
    logdet_from_cholesky,
    orthonormalize,
    psd_cholesky,
    psd_factor,
    randomized_top_eigh,
    reorthonormalize,
    symmetrize,
    top_eigh,
)

__all__ = [
    "NumericalWarning",
    "class_top_eigh",
    "lapack_top_eigh",
    "logdet_from_cholesky",
    "orthonormalize",
    "psd_cholesky",
    "psd_factor",
    "randomized_top_eigh",
    "reorthonormalize",
    "symmetrize",
    "top_eigh",
]

moved_module(__name__)
