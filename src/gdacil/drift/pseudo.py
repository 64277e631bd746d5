"""Sample pseudo-features of each class, push them through a map, re-estimate the moments.

This is the step HopDC and weak-nonlinear SLDC share: for every class ``c``,

    Z_c = mu_c + E_c L_c^T,   L_c L_c^T = Sigma_c (+ jitter I),   E_c: (M, d) standard normal
    Z_c' = push(Z_c)
    mu_c' = mean(Z_c'),   Sigma_c' = (1/M) sum (z' - mu_c')(z' - mu_c')^T   (float64)

with the ``1/M`` normalisation of the LR-RGDA paper [LR-RGDA] (the reference code uses
``1/(M-1)``; the difference is a factor ``1 - 1/M``). Classes are processed ``class_batch`` at
a time and written into a copy of the statistics, so peak memory is one block of samples, not
all classes.

Noise options:

- ``shared_noise=True`` (the reference code's choice): one ``E`` for every class, drawn once per
  call (common random numbers). Otherwise one ``E_c`` per class, drawn in ``labels`` order, so the
  draws do not depend on ``class_batch``.
- ``match_moments=True`` (not in [LR-RGDA] or the reference code): ``E`` is centred and whitened so
  that its sample mean is exactly 0 and its ``1/M`` sample covariance exactly ``I``. Then the
  pseudo-samples have exactly the stored mean and covariance, an affine ``push`` is reproduced
  exactly, and only the non-affine part of the map carries sampling error. Needs ``M > d``
  (``M <= d`` samples cannot have a full-rank covariance): ``True`` raises at ``fit`` otherwise,
  ``"auto"`` matches where ``M > d`` and otherwise draws plain samples with a ``UserWarning``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from .._validation import check_nonnegative, check_positive_int
from ..stats import ClassGaussians
from .base import make_generator

__all__ = ["PseudoSampling", "resample_moments", "standard_noise"]


def standard_noise(n: int, dim: int, generator: torch.Generator, *, match_moments: bool = False
                   ) -> torch.Tensor:
    """An ``(n, dim)`` float64 standard-normal block drawn from ``generator``.

    With ``match_moments`` it is centred and whitened: mean exactly 0, ``E^T E / n`` exactly ``I``.
    """
    E = torch.randn((n, dim), dtype=torch.float64, generator=generator)
    if not match_moments:
        return E
    if n <= dim:
        raise ValueError(f"match_moments needs more pseudo-samples than dimensions; got "
                         f"n_samples={n} for dimension {dim}")
    E -= E.mean(0)
    L = torch.linalg.cholesky(E.T @ E / n)
    return torch.linalg.solve_triangular(L, E.T, upper=False).T


def resample_moments(
    stats: ClassGaussians,
    labels: Sequence[int],
    push: Callable[[torch.Tensor], torch.Tensor],
    *,
    n_samples: int,
    generator: torch.Generator,
    shared_noise: bool = True,
    match_moments: bool = False,
    jitter: float = 0.0,
    damping: float = 0.0,
    class_batch: int = 8,
) -> ClassGaussians:
    """A copy of ``stats`` whose ``labels`` have the moments of their pushed pseudo-samples.

    Parameters
    ----------
    push : callable
        Maps a float64 ``(rows, d)`` tensor of pseudo-features (on ``stats.device``; the rows of a
        block of classes, grouped by class) to the same shape. Each row must depend only on itself.
        Its output is consumed (centred in place).
    n_samples : int
        ``M``, pseudo-samples per class.
    damping : float in [0, 1]
        Fraction of the old moments kept: ``mu <- (1 - damping) mu' + damping mu``, likewise
        ``Sigma``. The reference code's HopDC uses 0.1; the LR-RGDA paper has none (0).
    """
    d = stats.dim
    out = stats.copy()
    shared = (standard_noise(n_samples, d, generator, match_moments=match_moments)
              if shared_noise else None)
    for block, _, mu_old, cov_old in stats.iter_batches(class_batch, labels):
        if shared is not None:
            noise = shared
        else:
            noise = torch.stack([standard_noise(n_samples, d, generator,
                                                match_moments=match_moments) for _ in block])
        Z, _ = stats.sample(n_samples, generator=generator, labels=block, noise=noise,
                            jitter=jitter, batch_size=len(block))
        Z = push(Z).to(torch.float64).reshape(len(block), n_samples, d)
        means = Z.mean(1)
        Z -= means[:, None, :]
        covs = Z.transpose(1, 2) @ Z / n_samples
        if damping:
            means = (1.0 - damping) * means + damping * mu_old
            covs = (1.0 - damping) * covs + damping * cov_old
        out.set_moments(block, means, covs)
    return out


@dataclasses.dataclass(eq=False, kw_only=True)
class PseudoSampling:
    """The pseudo-sample hyperparameters, shared by the compensators that use this step.

    ``n_samples`` (M), ``shared_noise``, ``jitter`` and ``class_batch`` are passed to
    :func:`resample_moments`, and so is ``match_moments`` (``True``, ``False`` or ``"auto"``) as
    resolved at ``fit`` for the anchors' dimension (``match_moments_``); ``seed`` (an int, or a
    ``torch.Generator`` that every call advances) is the source of the noise.
    """

    n_samples: int = 2000
    shared_noise: bool = True
    match_moments: bool | str = False
    jitter: float = 0.0
    class_batch: int = 8
    seed: int | torch.Generator = 0
    if TYPE_CHECKING:  # set by the compensators' fit; not a dataclass field at run time
        match_moments_: bool = dataclasses.field(init=False)

    def _check_sampling_params(self) -> None:
        check_positive_int(self.n_samples, "n_samples")
        check_nonnegative(self.jitter, "jitter")
        check_positive_int(self.class_batch, "class_batch")
        make_generator(self.seed)
        if not (isinstance(self.match_moments, bool) or self.match_moments == "auto"):
            raise ValueError(f"match_moments must be True, False or 'auto'; "
                             f"got {self.match_moments!r}")

    def _resolve_match_moments(self, dim: int) -> bool:
        """Whether ``dim``-dimensional pseudo-samples are moment-matched (called by ``_fit``)."""
        if self.n_samples > dim or self.match_moments is False:
            return bool(self.match_moments)
        if self.match_moments is True:
            raise ValueError(f"match_moments=True needs more pseudo-samples than dimensions; got "
                             f"n_samples={self.n_samples} for dimension d={dim}: pass "
                             f"n_samples > {dim}, or match_moments='auto' (plain samples where "
                             f"n_samples <= d) or False")
        warnings.warn(f"match_moments='auto' draws plain (not moment-matched) pseudo-samples: "
                      f"n_samples={self.n_samples} is not above the dimension d={dim}; pass "
                      f"n_samples > {dim} to match the moments, or match_moments=False",
                      UserWarning, stacklevel=4)
        return False

    def _resample(self, stats: ClassGaussians, labels: Sequence[int],
                  push: Callable[[torch.Tensor], torch.Tensor], *, damping: float = 0.0
                  ) -> ClassGaussians:
        return resample_moments(
            stats, labels, push, n_samples=self.n_samples, generator=make_generator(self.seed),
            shared_noise=self.shared_noise, match_moments=self.match_moments_, jitter=self.jitter,
            damping=damping, class_batch=self.class_batch,
        )
