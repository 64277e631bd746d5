"""gdacil: class-incremental learning with Gaussian discriminant analysis.

The core objects are :class:`ClassGaussians` (mergeable per-class statistics), its compressed
counterpart :class:`LowRankGaussians` (top eigenpairs per class, for tens of thousands of classes),
and the heads built from them (:mod:`gdacil.heads`), led by the low-rank regularised GDA
classifier :class:`LRRGDA`.
"""

import logging

from .stats import ClassGaussians, ClassStatistics, LowRankGaussians

# a library configures no logging: the application (or the gdacil command) adds handlers
logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"
__all__ = ["ClassGaussians", "ClassStatistics", "Learner", "LowRankGaussians", "__version__"]


def __getattr__(name: str):
    if name == "Learner":  # imported on first use: it pulls in backbones and heads
        from .learner import Learner

        return Learner
    from ._deprecation import MOVED_MODULES

    if f"{__name__}.{name}" in MOVED_MODULES:  # a module that moved: its shim warns
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'gdacil' has no attribute {name!r}")
