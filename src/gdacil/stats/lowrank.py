"""Low-rank class statistics: per-class top-q eigenpairs instead of a dense d x d covariance.

A dense float64 covariance costs ``8 d^2`` bytes per class (4.7 MB at d = 768), 47 GB for ten
thousand classes. :class:`LowRankGaussians` keeps, per class, the count and mean (float64), the
top-``q`` eigenpairs ``(U_c, s_c)`` of the covariance (eigenvectors in a storage dtype, float32 or
float64; eigenvalues float64, descending) and the variance the eigenpairs miss, spread evenly over
the remaining ``d - q`` directions::

    Sigma_c ~= U_c diag(s_c) U_c^T + sigma_c^2 (I - U_c U_c^T),
    sigma_c^2 = (tr Sigma_c - sum(s_c)) / (d - q)                  (0 when q = d)

so the model keeps the trace of every covariance, and ``q = d`` is the covariance itself. That is
``(d q + q + d + 2)`` numbers per class: 197 kB at d = 768, q = 64 in float32.

The unweighted average covariance ``Sigma_avg`` (the LDA covariance, and the base of RGDA and
LR-RGDA) is kept exact by a float64 ``d x d`` running sum of the *full* class covariances, added
when a class is compressed. Which operations keep ``Sigma_avg`` exact:

- exact: building from dense statistics (:meth:`LowRankGaussians.from_dense`), adding new classes
  from dense moments (:meth:`~LowRankGaussians.add_classes`), merging new classes from
  :class:`~gdacil.ClassGaussians` or from other :class:`LowRankGaussians` (their sums add), in any
  order; changing means only (``set_moments`` without covariances).
- not exact: removing classes (:meth:`~LowRankGaussians.remove_classes`,
  :meth:`~LowRankGaussians.subset`) subtracts the stored *model* of each removed class, and
  replacing covariances (:meth:`~LowRankGaussians.set_moments`, what drift compensators do)
  subtracts the model of the old covariance and adds the new dense one. The full old covariance
  is no longer known, so the sum then carries the old class's compression error
  ``Sigma_c - model_c``: a matrix with zero trace (the trace stays exact), supported outside the
  top-``q`` subspace, and zero when ``q = d``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch

from .._deprecation import renamed_parameters
from .._validation import (
    PSD_RTOL,
    SYMMETRY_RTOL,
    all_finite,
    as_dtype,
    check_nonnegative,
    check_positive_int,
    check_seed,
    dtype_name,
    first_nonfinite,
    not_psd_error,
)
from .gaussians import ClassGaussians, ClassStatistics
from .linalg import class_top_eigh, reorthonormalize, symmetrize, top_eigh

__all__ = ["LowRankFactors", "LowRankGaussians", "build_in_processes"]

#: Largest ``|U^T U - I|`` of loaded eigenvectors, by storage dtype: two orders of magnitude above
#: the rounding of orthonormal float64 columns to that dtype
_ORTHONORMAL_TOL = {torch.float32: 1e-5, torch.float64: 1e-8}
_STORAGE_DTYPES = ("float64", "float32")


class LowRankFactors(NamedTuple):
    """Sampling factors of low-rank statistics: ``F_c = scales_c I + basis_c diag(gains_c) basis_c^T``.

    ``F_c`` is the symmetric square root of ``Sigma_c + jitter I`` under the low-rank model:
    ``gains = sqrt(s + jitter) - sqrt(sigma^2 + jitter)`` and ``scales = sqrt(sigma^2 + jitter)``.
    """

    basis: torch.Tensor  # (k, d, q) orthonormal eigenvectors, in the storage dtype
    gains: torch.Tensor  # (k, q)
    scales: torch.Tensor  # (k,)


class LowRankGaussians(ClassStatistics):
    """Per-class count, mean, top-``q`` covariance eigenpairs and isotropic residual variance.

    Drop-in statistics for every head and compensator (see :class:`~gdacil.stats.ClassStatistics`
    for the shared interface). Classes enter compressed from dense moments; LR-RGDA with
    ``rank <= q`` uses the stored eigenpairs directly, and the other heads see the dense
    reconstruction ``U diag(s) U^T + sigma^2 (I - U U^T)`` block by block. See the module
    docstring for which operations keep the average covariance exact.

    Parameters
    ----------
    dim : int
        Feature dimension ``d``.
    rank : int
        ``q``, eigenpairs kept per class (``1 <= q <= d``).
    ddof : {0, 1}, default 0
        Normalisation of the covariances the statistics hold (only checked when merging dense
        statistics, which must use the same).
    dtype : {"float64", "float32"} or torch.dtype, default "float64"
        Storage dtype of the eigenvectors (the dominant cost, ``C d q`` numbers). Counts, means,
        eigenvalues, residual variances and the covariance sum are always float64.
    decomposition : {"eigh", "randomized"}, default "eigh"
        How covariances are compressed: exact symmetric eigendecomposition (on the CPU, LAPACK's
        tridiagonal route forming only the ``q`` eigenvectors kept,
        :func:`gdacil.stats.linalg.top_eigh`), or seeded randomized subspace iteration with
        ``oversample`` extra columns and ``n_iter`` power iterations, each class's test matrix drawn
        from ``(seed, label)`` so results do not depend on batching or class order
        (:func:`gdacil.stats.linalg.class_top_eigh`). ``"eigh"`` also yields each covariance's
        smallest eigenvalue, which is how :meth:`add_classes` and :meth:`merge` check positive
        semi-definiteness (no separate Cholesky).
    decomposition_dtype : {"float64", "float32"}, default "float64"
        Precision of the ``"eigh"`` decomposition. ``"float32"`` is about 2x faster; its
        eigenvectors are re-orthonormalised in float64, and the models it gives differ from the
        float64 ones by about 1e-6 relative (``gdacil bench scale`` reports how many decisions
        change). The trace, hence the residual variance, is always taken in float64.
    oversample : int, default 16
    n_iter : int, default 4
    seed : int, default 0
        Every random choice (the randomized decomposition's test matrices) takes this seed. The
        former name ``random_state`` is a deprecated alias; files saved with it still load.
    device : None, str or torch.device, default None
        Where the statistics live (None: the CPU).

    Notes
    -----
    Memory per class is ``8 (2 + 2 d + q) + itemsize * d q`` bytes, plus one ``d x d`` float64
    sum for all classes: :meth:`memory_report` lists every tensor. Low-rank statistics cannot
    absorb more samples of a class they already hold (a low-rank merge is not exact): accumulate
    dense :class:`~gdacil.ClassGaussians` for the classes being learnt, then compress and
    :meth:`merge` them as new classes.

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians, LowRankGaussians
    >>> g = torch.Generator().manual_seed(0)
    >>> X, y = torch.randn(400, 16, generator=g), torch.arange(400) % 4
    >>> dense = ClassGaussians(16).update(X, y)
    >>> low = LowRankGaussians.from_dense(dense, rank=4)
    >>> low.eigenvectors.shape, low.eigenvalues.shape
    (torch.Size([4, 16, 4]), torch.Size([4, 4]))
    >>> torch.allclose(low.average_covariance(), dense.average_covariance())   # exact
    True
    >>> bool(torch.allclose(low.covariances().diagonal(dim1=1, dim2=2).sum(1),
    ...                     dense.covariances().diagonal(dim1=1, dim2=2).sum(1)))  # traces kept
    True
    """

    _FORMAT: ClassVar[str] = "gdacil.LowRankGaussians/1"
    _per_class: ClassVar[tuple[str, ...]] = (
        "_counts", "_means", "_eigenvectors", "_eigenvalues", "_residual_variances")
    _shared: ClassVar[tuple[str, ...]] = ("_covariance_sum",)
    # every growth step copies the dominant eigenvector tensor: grow by a quarter, not double
    _growth: ClassVar[float] = 1.25

    @renamed_parameters(random_state="seed")
    def __init__(self, dim: int, rank: int, *, ddof: int = 0, dtype="float64",
                 decomposition: str = "eigh", decomposition_dtype="float64",
                 oversample: int = 16, n_iter: int = 4, seed: int = 0,
                 device: torch.device | str | None = None):
        super().__init__(dim, ddof=ddof, device=device)
        self.rank = check_positive_int(rank, "rank")
        if self.rank > self.dim:
            raise ValueError(f"rank {rank} exceeds the feature dimension {self.dim}: a covariance "
                             f"has at most {self.dim} eigenpairs")
        self.dtype = as_dtype(dtype, allowed=_STORAGE_DTYPES)
        if decomposition not in ("eigh", "randomized"):
            raise ValueError(f"decomposition must be 'eigh' or 'randomized'; got {decomposition!r}")
        self.decomposition = decomposition
        self._decomposition_checks_psd = decomposition == "eigh"   # see ClassStatistics
        self.decomposition_dtype = as_dtype(decomposition_dtype, allowed=_STORAGE_DTYPES)
        if decomposition == "randomized" and self.decomposition_dtype != torch.float64:
            raise ValueError("decomposition_dtype='float32' applies to decomposition='eigh'; the "
                             "randomized decomposition checks its convergence in float64")
        self.oversample = check_positive_int(oversample, "oversample", minimum=0)
        self.n_iter = check_positive_int(n_iter, "n_iter", minimum=0)
        self.seed = check_seed(seed)
        f64: dict[str, Any] = {"dtype": torch.float64, "device": self.device}
        self._eigenvectors = torch.zeros(0, dim, self.rank, dtype=self.dtype, device=self.device)
        self._eigenvalues = torch.zeros(0, self.rank, **f64)
        self._residual_variances = torch.zeros(0, **f64)
        self._covariance_sum = torch.zeros(dim, dim, **f64)

    def __repr__(self) -> str:
        return (f"LowRankGaussians(dim={self.dim}, rank={self.rank}, n_classes={self.n_classes}, "
                f"ddof={self.ddof}, dtype={self._config()['dtype']})")

    def _config(self) -> dict[str, Any]:
        return {"dim": self.dim, "rank": self.rank, "ddof": self.ddof,
                "dtype": dtype_name(self.dtype),
                "decomposition": self.decomposition,
                "decomposition_dtype": dtype_name(self.decomposition_dtype),
                "oversample": self.oversample,
                "n_iter": self.n_iter, "seed": self.seed}

    # ------------------------------------------------------------------ views
    @property
    def eigenvectors(self) -> torch.Tensor:
        """``U``, shape ``(C, d, q)``, in the storage dtype; columns orthonormal."""
        return self._eigenvectors[: self.n_classes]

    @property
    def eigenvalues(self) -> torch.Tensor:
        """``s``, shape ``(C, q)``, float64, descending."""
        return self._eigenvalues[: self.n_classes]

    @property
    def residual_variances(self) -> torch.Tensor:
        """``sigma^2``, shape ``(C,)``, float64: the variance per direction outside ``U``."""
        return self._residual_variances[: self.n_classes]

    def eigenpairs(self, labels: Sequence[int] | None = None, rank: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-``rank`` eigenpairs ``(U[:, :, :rank], s[:, :rank])`` of ``labels``.

        With ``labels=None`` (all classes, storage order) these are views of the storage, not
        copies. ``rank`` defaults to ``q``; asking for more than ``q`` is a ``ValueError``.
        """
        rank = self.rank if rank is None else check_positive_int(rank, "rank")
        if rank > self.rank:
            raise ValueError(f"rank {rank} exceeds the {self.rank} eigenpairs these statistics "
                             f"keep per class; compress with rank >= {rank}")
        if labels is None:
            return self.eigenvectors[:, :, :rank], self.eigenvalues[:, :rank]
        pos = self.positions(labels).to(self.device)
        return (self._eigenvectors.index_select(0, pos)[:, :, :rank],
                self._eigenvalues.index_select(0, pos)[:, :rank])

    def covariances(self, labels: Sequence[int] | None = None) -> torch.Tensor:
        """Dense reconstructions ``U diag(s) U^T + sigma^2 (I - U U^T)``, float64, ``(k, d, d)``.

        Callers materialise class blocks (e.g. :meth:`iter_batches`), never all classes at once.
        """
        if labels is None:
            pos = torch.arange(self.n_classes, device=self.device)
        else:
            pos = self.positions(labels).to(self.device)
        return self._model_covariances(pos)

    def _model_covariances(self, pos: torch.Tensor) -> torch.Tensor:
        U = self._eigenvectors.index_select(0, pos).to(torch.float64)
        s = self._eigenvalues.index_select(0, pos)
        res = self._residual_variances.index_select(0, pos)
        cov = (U * (s - res[:, None])[:, None, :]) @ U.transpose(1, 2)
        cov.diagonal(dim1=-2, dim2=-1).add_(res[:, None])
        return symmetrize(cov)

    def average_covariance(self, batch_size: int = 64) -> torch.Tensor:
        """``Sigma_avg = (1/C) sum_c Sigma_c`` from the running float64 sum of full covariances.

        Exact (as exact as the dense statistics') after compressing and merging new classes;
        see the module docstring for the operations after which it is not. ``batch_size`` is
        accepted for interface compatibility and unused: nothing is materialised.
        """
        if self.n_classes == 0:
            raise ValueError("average_covariance: no classes")
        return symmetrize(self._covariance_sum / self.n_classes)

    # ------------------------------------------------------- building and editing
    @classmethod
    @renamed_parameters(random_state="seed")
    def from_dense(cls, stats: ClassGaussians, rank: int, *, decomposition: str = "eigh",
                   decomposition_dtype="float64", oversample: int = 16, n_iter: int = 4,
                   seed: int = 0, dtype="float64", batch_size: int = 32) -> LowRankGaussians:
        """Compress dense statistics, ``batch_size`` classes at a time.

        Counts, means, ``ddof`` and device are kept; the average covariance is exact. Peak
        memory beyond the input and output is one block of ``batch_size`` covariances and their
        decomposition. See the class for the parameters.
        """
        if not isinstance(stats, ClassGaussians):
            raise TypeError(f"from_dense expects ClassGaussians; got {type(stats).__name__}")
        out = cls(stats.dim, rank, ddof=stats.ddof, dtype=dtype, decomposition=decomposition,
                  decomposition_dtype=decomposition_dtype, oversample=oversample, n_iter=n_iter, seed=seed,
                  device=stats.device)
        return out.reserve(stats.n_classes).merge(stats, batch_size=batch_size)

    def merge(self, other: ClassStatistics, *, batch_size: int = 32) -> LowRankGaussians:
        """Add ``other``'s classes, which must all be new. Returns ``self``.

        ``other`` is a :class:`~gdacil.ClassGaussians` (compressed ``batch_size`` classes at a
        time) or a :class:`LowRankGaussians` of rank at least ``q`` (a higher rank is truncated,
        the dropped eigenvalues joining the residual variance). Both keep the average
        covariance exact. A class that is already present is a ``ValueError``: merging more
        samples into a compressed class cannot be done exactly; merge the dense statistics
        first, then compress. The merge is all or nothing: if a block fails (e.g. the
        covariance sum would overflow float64), the classes merged before it are removed again.
        """
        if not isinstance(other, (ClassGaussians, LowRankGaussians)):
            raise TypeError(f"can only merge ClassGaussians or LowRankGaussians, got "
                            f"{type(other).__name__}")
        if other.dim != self.dim:
            raise ValueError(f"cannot merge statistics of dimension {other.dim} into {self.dim}")
        if other.ddof != self.ddof:
            raise ValueError(f"cannot merge statistics with ddof={other.ddof} into ddof={self.ddof}")
        present = [c for c in other.classes if c in self]
        if present:
            raise ValueError(
                f"classes {present[:20]} are already present: low-rank statistics cannot merge "
                "new samples into an existing class exactly; merge the dense ClassGaussians of "
                "those classes before compressing, or remove the classes first")
        if not other.n_classes:
            return self
        self._make_room(other.n_classes)  # one growth step for all of other's classes
        if isinstance(other, ClassGaussians):
            with self.rollback_on_error([]):  # a failing block takes the earlier ones back out
                for block, counts, means, covs in other.iter_batches(batch_size):
                    self._add_moments(block, counts.to(self.device), means.to(self.device),
                                      covs.to(self.device))
            return self
        if other.rank < self.rank:
            raise ValueError(f"cannot merge rank-{other.rank} statistics into rank-{self.rank} "
                             "ones: the missing eigenpairs are not known")
        U, s = other.eigenpairs(rank=self.rank)
        res = other.residual_variances
        if other.rank > self.rank:  # fold the dropped eigenvalues into the isotropic residual
            dropped = other.eigenvalues[:, self.rank :].sum(1)
            res = (res * (self.dim - other.rank) + dropped) / (self.dim - self.rank)
        total = self._checked_sum(self._covariance_sum + other._covariance_sum.to(self.device),
                                  other.classes)
        self._append_rows(other.classes, {
            "_counts": other.counts.to(self.device), "_means": other.means.to(self.device),
            "_eigenvectors": U.to(device=self.device, dtype=self.dtype),
            "_eigenvalues": s.to(self.device), "_residual_variances": res.to(self.device)})
        self._covariance_sum.copy_(total)
        return self

    def _checked_sum(self, total: torch.Tensor, labels: list[int]) -> torch.Tensor:
        """``total`` (a new covariance sum), refused if it holds NaN or inf, before any change."""
        if not all_finite(total):
            raise ValueError(
                f"LowRankGaussians: the covariances of classes {labels[:10]} would make the "
                "running covariance sum NaN or inf (float64 overflow); nothing was changed. "
                "Rescale the features")
        return total

    def _compress(self, covs: torch.Tensor, labels: list[int], *, refuse_indefinite: bool):
        """``(U, s, sigma^2)`` of float64 covariances ``(k, d, d)``. With ``refuse_indefinite``
        (and ``decomposition="eigh"``), a covariance whose smallest eigenvalue is below
        ``-PSD_RTOL`` times its trace is refused, as :func:`check_covariances` would."""
        trace = covs.diagonal(dim1=-2, dim2=-1).sum(-1)
        if self.decomposition == "eigh":
            U, s, smallest = top_eigh(covs.to(self.decomposition_dtype), self.rank,
                                      return_smallest=True)
            if refuse_indefinite:
                bad = (smallest.double() < -PSD_RTOL * trace.clamp_min(0.0)).nonzero()
                if bad.numel():
                    raise not_psd_error(labels[int(bad[0])], source="LowRankGaussians")
            if self.decomposition_dtype != torch.float64:
                U = reorthonormalize(U.double())
            s = s.double()
        else:
            U, s = class_top_eigh(covs, self.rank, labels, decomposition=self.decomposition,
                                  oversample=self.oversample, n_iter=self.n_iter,
                                  seed=self.seed)
        if self.rank == self.dim:
            res = torch.zeros_like(s[:, 0])
        else:
            res = ((trace - s.sum(-1)) / (self.dim - self.rank)).clamp_min(0.0)
        return U.to(self.dtype), s, res

    def _add_moments(self, labels, counts, means, covs) -> None:
        U, s, res = self._compressed(covs, labels, refuse_indefinite=True)
        total = self._checked_sum(self._covariance_sum + covs.sum(0), labels)
        self._append_rows(labels, {"_counts": counts, "_means": means, "_eigenvectors": U,
                                   "_eigenvalues": s, "_residual_variances": res})
        self._covariance_sum.copy_(total)

    def _compressed(self, covs: torch.Tensor, labels: list[int], *,
                    refuse_indefinite: bool = False):
        """:meth:`_compress`, refusing (before any change) eigenpairs that came out NaN or inf."""
        U, s, res = self._compress(covs, labels, refuse_indefinite=refuse_indefinite)
        for t in (U, s, res):
            if not all_finite(t):
                raise ValueError(f"LowRankGaussians: compressing the covariance of class "
                                 f"{labels[first_nonfinite(t)]} gave NaN or inf (values too "
                                 "large for float64); nothing was changed. Rescale the features")
        return U, s, res

    def _write_covariances(self, labels, pos, covs) -> None:
        """Re-compress the new covariances. The sum loses the old *model* and gains the new
        covariance (see the module docstring: exact only if the old class was exactly its model)."""
        old = self._model_covariances(pos)
        U, s, res = self._compressed(covs, labels)
        total = self._checked_sum(self._covariance_sum + (covs.sum(0) - old.sum(0)), labels)
        self._covariance_sum.copy_(total)
        self._eigenvectors[pos] = U
        self._eigenvalues[pos] = s
        self._residual_variances[pos] = res

    def _check_loaded(self, labels, rows, shared, source) -> None:
        """Loaded eigenpairs must be finite, with eigenvalues and residual variances >= 0 and
        orthonormal eigenvectors (within ``_ORTHONORMAL_TOL`` of the storage dtype); the
        covariance sum finite and symmetric (not necessarily PSD: removing classes leaves their
        compression error in it, a zero-trace matrix)."""
        U, s, res = rows["_eigenvectors"], rows["_eigenvalues"], rows["_residual_variances"]
        for name, t in (("eigenvectors", U), ("eigenvalues", s), ("residual variance", res)):
            if not all_finite(t):
                raise ValueError(f"{source}: the {name} of class {labels[first_nonfinite(t)]} "
                                 "contain NaN or inf")
        negative = (s < 0).any(1) | (res < 0)
        if bool(negative.any()):
            c = labels[int(negative.nonzero()[0, 0])]
            raise ValueError(f"{source}: class {c} has a negative eigenvalue or residual variance; "
                             "a covariance has none")
        tol = _ORTHONORMAL_TOL[self.dtype]
        eye = torch.eye(self.rank, dtype=torch.float64, device=U.device)
        for start in range(0, len(labels), 64):
            block = U[start:start + 64].to(torch.float64)
            err = (block.transpose(1, 2) @ block - eye).abs().amax((1, 2))
            if bool((err > tol).any()):
                i = int((err > tol).nonzero()[0, 0])
                raise ValueError(f"{source}: the eigenvectors of class {labels[start + i]} are not "
                                 f"orthonormal (max |U^T U - I| = {float(err[i]):.2g}, tolerance "
                                 f"{tol:g})")
        total = shared["_covariance_sum"]
        if not all_finite(total):
            raise ValueError(f"{source}: the covariance sum contains NaN or inf")
        asym = float((total - total.T).abs().max())
        if asym > SYMMETRY_RTOL * float(total.abs().max()):
            raise ValueError(f"{source}: the covariance sum is not symmetric "
                             f"(max |S - S^T| = {asym:.3g})")

    def _keep(self, keep: list[int], batch_size: int = 32) -> None:
        """Keep the classes at positions ``keep``; the sum loses the removed classes' models."""
        kept = set(keep)
        dropped = [i for i in range(self.n_classes) if i not in kept]
        if not kept:
            self._covariance_sum.zero_()
        for start in range(0, len(dropped) if kept else 0, batch_size):
            pos = torch.tensor(dropped[start : start + batch_size], device=self.device)
            self._covariance_sum -= self._model_covariances(pos).sum(0)
        super()._keep(keep)

    # ----------------------------------------------------------------- sampling
    def sampling_factors(self, labels: Sequence[int] | None = None, *, jitter: float = 0.0,
                         batch_size: int = 64, dtype: torch.dtype = torch.float64
                         ) -> LowRankFactors:
        """Symmetric square roots of ``Sigma_c + jitter I`` under the model, as :class:`LowRankFactors`.

        Sampling with them gives ``mu + U sqrt(s) U^T e + sigma (I - U U^T) e`` for standard-normal
        ``e`` in ``R^d``: the two terms are independent (orthogonal projections of ``e``), so
        this is ``N(mu, U diag(s) U^T + sigma^2 (I - U U^T))``, and a ``d``-dimensional noise
        block means the same as for :class:`~gdacil.ClassGaussians` (shared noise works).
        With ``labels=None`` the basis is a view of the stored eigenvectors (no copy); it keeps
        the storage dtype, and ``dtype`` applies to the gains and scales. ``batch_size`` is
        accepted for interface compatibility and unused.
        """
        jitter = check_nonnegative(jitter, "jitter")
        if labels is None:
            U, s, res = self.eigenvectors, self.eigenvalues, self.residual_variances
        else:
            pos = self.positions(labels).to(self.device)
            U = self._eigenvectors.index_select(0, pos)
            s = self._eigenvalues.index_select(0, pos)
            res = self._residual_variances.index_select(0, pos)
        scales = (res + jitter).sqrt()
        gains = (s + jitter).sqrt() - scales[:, None]
        return LowRankFactors(U, gains.to(dtype), scales.to(dtype))

    def _block_factors(self, labels, jitter, dtype) -> LowRankFactors:
        return self.sampling_factors(labels, jitter=jitter, dtype=dtype)

    def _check_factors(self, factors, k: int) -> None:
        if not isinstance(factors, LowRankFactors):
            raise TypeError(f"factors must be the LowRankFactors of sampling_factors(); got "
                             f"{type(factors).__name__}")
        U, g, sc = factors
        if U.ndim != 3 or U.shape[:2] != (k, self.dim) or g.shape != (k, U.shape[2]) \
                or sc.shape != (k,):
            raise ValueError(f"factors must hold a basis ({k}, {self.dim}, q), gains ({k}, q) and "
                             f"scales ({k},); got {tuple(U.shape)}, {tuple(g.shape)}, "
                             f"{tuple(sc.shape)}")

    def _slice_factors(self, factors, start: int, stop: int) -> LowRankFactors:
        return LowRankFactors(*(t[start:stop] for t in factors))

    def _deviations(self, factors, noise: torch.Tensor) -> torch.Tensor:
        U, g, sc = (t.to(device=self.device, dtype=torch.float64) for t in factors)
        return sc[:, None, None] * noise + ((noise @ U) * g[:, None, :]) @ U.transpose(1, 2)


def build_in_processes(moments, labels: Sequence[int], *, processes: int, block: int = 100,
                       **params) -> LowRankGaussians:
    """:class:`LowRankGaussians` of ``labels``, compressed by ``processes`` worker processes.

    ``moments(block_labels)`` returns ``(means, covariances, counts)`` of a list of labels; it
    must be picklable (a module-level function or an object of one), since it runs in freshly
    spawned workers (not forked: the OpenMP and BLAS thread pools of this process do not survive
    a fork safely), so a script that calls it needs the ``if __name__ == "__main__":`` guard.
    Worker ``i`` adds a contiguous ``1/processes`` share of ``labels``, ``block`` at a time, with
    one thread, and saves its statistics (safetensors) to a temporary folder; they are merged in
    order. A worker whose caller is killed stops at its next block and removes that folder. Each class's compression depends on that class alone, so the result
    is that of :meth:`LowRankGaussians.add_classes` of every label in one process, the float64
    sum of the covariances (summed in another order) to round-off. ``params`` go to
    :class:`LowRankGaussians` (``dim`` and ``rank`` included).

    The speed-up comes from LAPACK's tridiagonalisation, which is bound by memory traffic within
    one process: on 2 cores, two single-threaded workers compress about 1.7x as fast as one
    process with two threads.
    """
    import multiprocessing
    import tempfile

    labels = [int(c) for c in labels]
    processes = check_positive_int(processes, "processes")
    cut = [len(labels) * i // processes for i in range(processes + 1)]
    shares = [labels[a:b] for a, b in itertools.pairwise(cut) if b > a]
    with tempfile.TemporaryDirectory(prefix="gdacil-build-") as tmp:
        paths = [str(Path(tmp) / f"share{i}.safetensors") for i in range(len(shares))]
        jobs = [(moments, share, block, params, path, os.getpid())
                for share, path in zip(shares, paths)]
        with _single_threaded_children(), multiprocessing.get_context("spawn").Pool(
                len(shares)) as pool:
            pool.starmap(_build_share, jobs)
        out = LowRankGaussians(**params)
        for path in paths:
            out.merge(LowRankGaussians.load(path))
    return out


#: Thread-count variables of OpenMP, MKL and OpenBLAS, read when each library loads
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@contextlib.contextmanager
def _single_threaded_children():
    """Processes started inside inherit one thread per library. Set in the environment before
    they start: a limit set once a library is loaded misses the BLAS that SciPy loads later, and
    two processes whose thread pools spin over two cores run many times slower."""
    saved = {name: os.environ.get(name) for name in _THREAD_VARIABLES}
    os.environ.update(dict.fromkeys(_THREAD_VARIABLES, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _build_share(moments, labels: list[int], block: int, params: dict, path: str,
                 parent: int) -> None:
    stats = LowRankGaussians(**params)
    for start in range(0, len(labels), block):
        if os.getppid() != parent:  # the caller was killed: nobody will merge or clean up
            shutil.rmtree(Path(path).parent, ignore_errors=True)
            os._exit(1)
        part = labels[start:start + block]
        stats.add_classes(part, *moments(part))
    stats.save(path)
