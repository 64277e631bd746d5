"""gdacil: class-incremental learning with Gaussian discriminant analysis.

The core objects are :class:`ClassGaussians` (mergeable per-class statistics) and the heads built
from them (:mod:`gdacil.heads`), led by the low-rank regularised GDA classifier :class:`LRRGDA`.
"""

from .stats import ClassGaussians

__version__ = "0.1.0"
__all__ = ["ClassGaussians", "__version__"]
