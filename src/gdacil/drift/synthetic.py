"""Synthetic drift problems with a known drift field, for tests, benchmarks and demos.

Features live on the sphere of radius ``sqrt(d)``, like the non-affine LayerNorm features of the
reference code. The new backbone is the smooth map

    f(x) = sqrt(d) * normalize(x Q + warp * tanh(x W)),

a rotation ``Q = expm(rotation * S)`` (``S`` skew-symmetric) plus a ``tanh`` warp (``W`` Gaussian
with entries of standard deviation ``warp_scale / sqrt(d)``). Old classes are Gaussian clusters
(projected onto the sphere when drawn as samples); anchors come from clusters around perturbed
old-class means and around other random centres, with a wider spread.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from .._validation import check_positive_int
from ..stats import ClassGaussians

__all__ = ["DriftProblem", "sphere_drift_problem"]


@dataclasses.dataclass
class DriftProblem:
    """Old-class statistics, anchor pairs and the true drift map.

    ``oracle`` (statistics of the mapped class samples) is ``None`` when the statistics were built
    from moments rather than samples.
    """

    stats: ClassGaussians
    old_anchors: torch.Tensor
    new_anchors: torch.Tensor
    new_features: Callable[[torch.Tensor], torch.Tensor]
    oracle: ClassGaussians | None = None


def sphere_drift_problem(
    n_classes: int,
    n_anchors: int,
    dim: int,
    *,
    samples_per_class: int | None = 1000,
    rotation: float = 0.2,
    warp: float = 2.0,
    warp_scale: float = 3.0,
    spread: float = 0.7,
    rank: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> DriftProblem:
    """A drift problem on the sphere of radius ``sqrt(dim)`` (see the module docstring).

    With ``samples_per_class``, each class's statistics come from that many samples (projected
    onto the sphere; before projection, class ``c`` is ``N(mu_c, B_c B_c^T)`` with ``B_c`` of
    shape ``(dim, rank)`` and per-coordinate standard deviation about ``spread``) and ``oracle``
    from the same samples mapped by ``f``. With ``samples_per_class=None`` the statistics are
    built directly from moments (means on the sphere, covariances ``B B^T + (0.05 spread)^2 I``,
    ``rank`` defaulting to ``min(dim, 64)``), which is cheap at large ``dim`` and class counts,
    and there is no oracle.
    """
    C = check_positive_int(n_classes, "n_classes")
    N = check_positive_int(n_anchors, "n_anchors")
    d = check_positive_int(dim, "dim")
    g = torch.Generator().manual_seed(seed)
    radius = math.sqrt(d)

    def randn(*shape):
        return torch.randn(shape, generator=g, dtype=dtype)

    def sphere(X):
        return radius * torch.nn.functional.normalize(X, dim=-1)

    skew = randn(d, d)
    Q = torch.linalg.matrix_exp(rotation * (skew - skew.T) / math.sqrt(2 * d))
    W = randn(d, d) * (warp_scale / math.sqrt(d))

    def new_features(X: torch.Tensor) -> torch.Tensor:
        X = X.to(dtype)
        return sphere(X @ Q + warp * torch.tanh(X @ W))

    means = sphere(randn(C, d))
    n_centres = 4 * C
    centres = torch.cat([means + 0.5 * randn(C, d), sphere(randn(n_centres - C, d))])
    pick = torch.randint(n_centres, (N,), generator=g)
    old_anchors = sphere(centres[pick] + 0.8 * randn(N, d))
    labels = list(range(C))

    oracle = None
    if samples_per_class is not None:
        n = check_positive_int(samples_per_class, "samples_per_class")
        r = rank or d
        B = randn(C, d, r) * (spread / math.sqrt(r))
        X = sphere(means[:, None, :] + randn(C, n, r) @ B.transpose(1, 2)).reshape(-1, d)
        y = torch.arange(C).repeat_interleave(n)
        stats = ClassGaussians(d).update(X, y)
        oracle = ClassGaussians(d).update(new_features(X), y)
    else:
        r = rank or min(d, 64)
        stats = ClassGaussians(d)
        for start in range(0, C, 64):
            k = min(64, C - start)
            B = randn(k, d, r) * (spread / math.sqrt(r))
            covs = B @ B.transpose(1, 2)
            covs.diagonal(dim1=1, dim2=2).add_((0.05 * spread) ** 2)
            stats.add_classes(labels[start:start + k], means[start:start + k], covs,
                              torch.full((k,), 1000.0))
    return DriftProblem(stats, old_anchors, new_features(old_anchors), new_features, oracle)
