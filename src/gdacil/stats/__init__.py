"""The statistics family: per-class moments, the currency between backbones and heads.

Backbones produce features; the statistics summarise them per class and merge across batches,
shards and processes; compensators move them when the backbone drifts; heads are fitted from
them. The family, by what each keeps per class:

- :class:`ClassGaussians` (:mod:`gdacil.stats.gaussians`): count, mean and dense scatter matrix,
  merged exactly; :class:`ClassStatistics` is the interface that heads and compensators use;
- :class:`LowRankGaussians` (:mod:`gdacil.stats.lowrank`): count, mean and the covariance's top
  eigenpairs plus an isotropic residual, for tens of thousands of classes;
- :class:`PooledGaussians` (:mod:`gdacil.stats.pooled`): counts and means and one pooled
  within-class scatter, for the shared-covariance heads (RanPAC, ACIL, RBF-LDA).

and what they share: :mod:`gdacil.stats.linalg` (batched dense linear algebra, used by the heads
too) and :mod:`gdacil.stats.feature_maps` (seeded random feature maps applied before pooling).
Saved files name their class and format version (``gdacil.ClassGaussians/1``), not a module.
"""

from .gaussians import ClassGaussians, ClassStatistics
from .lowrank import LowRankGaussians
from .pooled import PooledGaussians

__all__ = ["ClassGaussians", "ClassStatistics", "LowRankGaussians", "PooledGaussians"]
