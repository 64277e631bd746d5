"""Dense linear algebra shared by the heads, the statistics and the compensators.

Everything here is batched over a leading class dimension: ``A`` has shape ``(..., d, d)``.
"""

from __future__ import annotations

import warnings

import torch

__all__ = [
    "NumericalWarning",
    "symmetrize",
    "psd_cholesky",
    "logdet_from_cholesky",
    "psd_factor",
    "top_eigh",
    "randomized_top_eigh",
]


class NumericalWarning(UserWarning):
    """A matrix needed extra regularisation to be factorised."""


def symmetrize(A: torch.Tensor) -> torch.Tensor:
    """Return ``(A + A^T) / 2`` over the last two dimensions."""
    return 0.5 * (A + A.transpose(-1, -2))


def psd_cholesky(
    A: torch.Tensor,
    *,
    initial_jitter: float = 1e-10,
    max_tries: int = 8,
    name: str = "matrix",
) -> torch.Tensor:
    """Cholesky factor of symmetric positive (semi-)definite matrices, escalating jitter.

    Matrices that factor as they are come back untouched. For those that fail, a multiple of the
    identity, ``jitter * mean(diag(A))`` with ``jitter`` growing tenfold from ``initial_jitter``,
    is added until they factor, and a :class:`NumericalWarning` says how much was needed.

    Raises
    ------
    ValueError
        If ``A`` holds NaN or inf, or is still not factorisable after ``max_tries`` escalations.
    """
    if not torch.isfinite(A).all():
        raise ValueError(f"{name} contains NaN or inf; cannot factorise it")
    A = symmetrize(A)
    L, info = torch.linalg.cholesky_ex(A)
    failed = info != 0
    if not failed.any():
        return L
    scale = A.diagonal(dim1=-2, dim2=-1).mean(-1).abs().clamp_min(torch.finfo(A.dtype).tiny)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    jitter = initial_jitter
    for _ in range(max_tries):
        idx = failed.nonzero(as_tuple=True)
        shifted = A[idx] + (jitter * scale[idx])[..., None, None] * eye
        L_fix, info_fix = torch.linalg.cholesky_ex(shifted)
        L[idx] = L_fix
        still = info_fix != 0
        n_fixed = int((~still).sum())
        if n_fixed:
            warnings.warn(
                f"{name}: {n_fixed} matrix(es) not positive definite; added "
                f"{jitter:.1e} x mean(diag) to the diagonal to factorise",
                NumericalWarning,
                stacklevel=2,
            )
        new_failed = torch.zeros_like(failed)
        new_failed[idx] = still
        failed = new_failed
        if not failed.any():
            return L
        jitter *= 10.0 if jitter >= 1e-6 else 100.0
    raise ValueError(
        f"{name}: could not be factorised even with {jitter:.1e} x mean(diag) added; "
        "it is not positive semi-definite (check the statistics)"
    )


def psd_factor(A: torch.Tensor) -> torch.Tensor:
    """A square factor ``F`` with ``F F^T = A`` for symmetric PSD ``A``, singular ones included.

    Cholesky where it succeeds; otherwise ``U diag(sqrt(max(s, 0)))`` from an eigendecomposition,
    which is exact for rank-deficient matrices (e.g. covariances of classes with n <= d).
    """
    A = symmetrize(A)
    F, info = torch.linalg.cholesky_ex(A)
    failed = (info != 0).nonzero(as_tuple=True)
    if failed[0].numel():
        s, U = torch.linalg.eigh(A[failed])
        F[failed] = U * s.clamp_min(0.0).sqrt()[..., None, :]
    return F


def logdet_from_cholesky(L: torch.Tensor) -> torch.Tensor:
    """``log det(L L^T)`` from a Cholesky factor."""
    return 2.0 * L.diagonal(dim1=-2, dim2=-1).log().sum(-1)


def top_eigh(A: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-``rank`` eigenpairs of symmetric ``A``, eigenvalues descending and clamped at 0.

    Returns ``(U, s)`` with ``U`` of shape ``(..., d, rank)`` and ``s`` of shape ``(..., rank)``.
    """
    s, U = torch.linalg.eigh(symmetrize(A))
    s = s.flip(-1)[..., :rank].clamp_min(0.0)
    U = U.flip(-1)[..., :rank]
    return U, s


def randomized_top_eigh(
    A: torch.Tensor,
    rank: int,
    *,
    oversample: int = 16,
    n_iter: int = 4,
    generator: torch.Generator | None = None,
    test_matrix: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``rank`` eigenpairs of symmetric PSD ``A`` by seeded randomized subspace iteration.

    A Gaussian test matrix with ``rank + oversample`` columns (drawn from ``generator``) is pushed
    through ``n_iter`` power iterations with QR re-orthonormalisation; the small projected matrix
    is then diagonalised exactly (Halko, Martinsson and Tropp 2011, algorithms 4.4 and 5.3).
    ``test_matrix`` of shape ``(..., d, k)`` replaces the draw (then ``k`` sets the oversampling).
    Falls back to :func:`top_eigh` when the sketch would not be smaller than ``d``.
    """
    d = A.shape[-1]
    k = test_matrix.shape[-1] if test_matrix is not None else min(rank + oversample, d)
    if k >= d:
        return top_eigh(A, rank)
    A = symmetrize(A)
    omega = test_matrix
    if omega is None:
        omega = torch.randn(
            (*A.shape[:-2], d, k), dtype=A.dtype, generator=generator, device="cpu"
        ).to(A.device)
    Q, _ = torch.linalg.qr(A @ omega)
    for _ in range(n_iter):
        Q, _ = torch.linalg.qr(A @ Q)
    T = Q.transpose(-1, -2) @ A @ Q
    s, V = torch.linalg.eigh(symmetrize(T))
    s = s.flip(-1)[..., :rank].clamp_min(0.0)
    U = Q @ V.flip(-1)[..., :rank]
    return U, s
