"""Dense linear algebra shared by the heads, the statistics and the compensators.

Everything here is batched over a leading class dimension: ``A`` has shape ``(..., d, d)``.
"""

from __future__ import annotations

import warnings

import torch

from ._deprecation import renamed_parameters

__all__ = [
    "NumericalWarning",
    "class_top_eigh",
    "logdet_from_cholesky",
    "orthonormalize",
    "psd_cholesky",
    "psd_factor",
    "randomized_top_eigh",
    "symmetrize",
    "top_eigh",
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
    shape = A.shape
    A = symmetrize(A).reshape(-1, shape[-2], shape[-1])
    L, info = torch.linalg.cholesky_ex(A)
    failed = info != 0
    if not failed.any():
        return L.reshape(shape)
    scale = A.diagonal(dim1=-2, dim2=-1).mean(-1).abs()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero matrix gets I-scale jitter
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
        failed = failed.clone()
        failed[idx] = still
        if not failed.any():
            return L.reshape(shape)
        jitter *= 10.0 if jitter >= 1e-6 else 100.0
    raise ValueError(
        f"{name}: could not be factorised even with {jitter:.1e} x mean(diag) added; "
        "it is not positive semi-definite (check the statistics)"
    )


def psd_factor(A: torch.Tensor) -> torch.Tensor:
    """A square factor ``F`` with ``F F^T = A`` for symmetric PSD ``A``, singular ones included.

    Cholesky where it succeeds. Singular matrices (e.g. covariances of classes with n <= d) get
    the Cholesky factor of ``A + 1e-9 mean(diag(A)) I``, a relative perturbation far below any
    sampling error; the few that still fail get ``U diag(sqrt(max(s, 0)))`` from an exact
    eigendecomposition.
    """
    A = symmetrize(A)
    F, info = torch.linalg.cholesky_ex(A)
    failed = (info != 0).nonzero(as_tuple=True)
    if failed[0].numel():
        B = A[failed]
        shift = 1e-9 * B.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(0.0)
        eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        G, info = torch.linalg.cholesky_ex(B + shift[..., None, None] * eye)
        still = (info != 0).nonzero(as_tuple=True)
        if still[0].numel():
            s, U = torch.linalg.eigh(B[still])
            G[still] = U * s.clamp_min(0.0).sqrt()[..., None, :]
        F[failed] = G
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


def orthonormalize(Y: torch.Tensor, *, tol: float = 1e-10) -> torch.Tensor:
    """Orthonormal basis of the columns of tall ``Y`` (``(..., d, k)``, ``k <= d``).

    Shifted CholeskyQR2 (Fukaya et al. 2020): two passes of ``Q <- Q chol(Q^T Q + s I)^{-T}``,
    made of GEMMs and a small ``k x k`` factorisation, several times faster than Householder QR
    for batches of tall matrices. Where it does not reach orthonormality to ``tol`` (a
    rank-deficient ``Y``), Householder QR takes over for that matrix.
    """
    k = Y.shape[-1]
    eye = torch.eye(k, dtype=Y.dtype, device=Y.device)
    Q, ok = Y, torch.ones(Y.shape[:-2], dtype=torch.bool, device=Y.device)
    shift: float | torch.Tensor
    for _ in range(2):
        G = Q.transpose(-1, -2) @ Q
        shift = 11 * (Y.shape[-2] * k + k * (k + 1)) * torch.finfo(Y.dtype).eps
        shift = shift * G.diagonal(dim1=-2, dim2=-1).sum(-1).clamp_min(torch.finfo(Y.dtype).tiny)
        L, info = torch.linalg.cholesky_ex(G + shift[..., None, None] * eye)
        ok &= info == 0
        L = torch.where(ok[..., None, None], L, eye)
        Q = torch.linalg.solve_triangular(L.transpose(-1, -2), Q, upper=True, left=False)
    err = (Q.transpose(-1, -2) @ Q - eye).abs().amax((-2, -1))
    bad = (~ok | ~(err <= tol)).nonzero(as_tuple=True)
    if bad[0].numel():
        Q[bad] = torch.linalg.qr(Y[bad])[0]
    return Q


#: Largest residual ``||A u - s u||``, relative to the top eigenvalue, at which randomized
#: eigenpairs count as converged: far below what moves an LR-RGDA score by 1e-6 relative, far
#: above float64 round-off
RESIDUAL_TOL = 1e-10
#: Power iterations after which a matrix that has not converged is decomposed exactly
MAX_POWER_ITERATIONS = 32


def randomized_top_eigh(
    A: torch.Tensor,
    rank: int,
    *,
    oversample: int = 16,
    n_iter: int = 4,
    generator: torch.Generator | None = None,
    test_matrix: torch.Tensor | None = None,
    tol: float | None = RESIDUAL_TOL,
    max_iter: int = MAX_POWER_ITERATIONS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``rank`` eigenpairs of symmetric PSD ``A`` by seeded randomized subspace iteration.

    A Gaussian test matrix with ``rank + oversample`` columns (drawn from ``generator``) is pushed
    through ``n_iter`` power iterations with QR re-orthonormalisation; the small projected matrix
    is then diagonalised exactly (Halko, Martinsson and Tropp 2011, algorithms 4.4 and 5.3).
    ``test_matrix`` of shape ``(..., d, k)`` replaces the draw (then ``k`` sets the oversampling).
    Falls back to :func:`top_eigh` when the sketch would not be smaller than ``d``.

    With ``tol``, the result is checked: a matrix whose top-``rank`` Ritz pairs have a residual
    ``max_i ||A u_i - s_i u_i||`` above ``tol * s_1`` gets ``n_iter`` more iterations, until it
    converges or has had ``max_iter``; then it is decomposed exactly. Spectra whose eigenvalues
    decay past ``rank`` converge in the first round (the check reuses the product ``A Q`` that the
    projection needs); spectra with nearly equal eigenvalues around ``rank`` cost more iterations
    or one exact decomposition, never a wrong model. ``tol=None`` skips the check.
    """
    d = A.shape[-1]
    k = test_matrix.shape[-1] if test_matrix is not None else min(rank + oversample, d)
    if k >= d:
        return top_eigh(A, rank)
    omega = test_matrix
    if omega is None:
        omega = torch.randn(
            (*A.shape[:-2], d, k), dtype=A.dtype, generator=generator, device="cpu"
        ).to(A.device)
    batch = A.shape[:-2]
    A = A.reshape(-1, d, d)
    Q = orthonormalize(A @ omega.reshape(-1, d, k))
    U = A.new_empty(A.shape[0], d, rank)
    s = A.new_empty(A.shape[0], rank)
    todo = torch.arange(A.shape[0], device=A.device)
    done_iter = 0
    while True:
        for _ in range(n_iter):
            Q = orthonormalize(A[todo] @ Q)
        done_iter += n_iter
        AQ = A[todo] @ Q
        theta, V = torch.linalg.eigh(symmetrize(Q.transpose(-1, -2) @ AQ))
        V, theta = V.flip(-1)[..., :rank], theta.flip(-1)[..., :rank]
        U[todo], s[todo] = Q @ V, theta.clamp_min(0.0)
        if tol is None:
            break
        residual = torch.linalg.vector_norm(AQ @ V - U[todo] * theta.unsqueeze(-2), dim=-2)
        open_ = residual.amax(-1) > tol * theta[..., 0].abs()
        if not open_.any():
            break
        if done_iter >= max_iter:
            rest = todo[open_]
            U[rest], s[rest] = top_eigh(A[rest], rank)
            break
        todo, Q = todo[open_], Q[open_]
    return U.reshape(*batch, d, rank), s.reshape(*batch, rank)


# Seeds of per-class test matrices: seed * _SEED_STRIDE + label % _SEED_STRIDE.
_SEED_STRIDE = 1_000_003


@renamed_parameters(random_state="seed")
def class_top_eigh(
    A: torch.Tensor,
    rank: int,
    labels,
    *,
    decomposition: str = "eigh",
    oversample: int = 16,
    n_iter: int = 4,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``rank`` eigenpairs of a block of per-class matrices ``A`` ``(k, d, d)``, class-seeded.

    ``decomposition="eigh"`` is :func:`top_eigh`. ``"randomized"`` is :func:`randomized_top_eigh`
    with ``rank + oversample`` columns, where class ``c``'s Gaussian test matrix is drawn from a
    generator seeded with ``(seed, c)``: the result for a class does not depend on which
    other classes share its block, nor on their order. When ``rank + oversample >= d`` the sketch
    would not be smaller than the matrix, and the exact decomposition is used. ``random_state``
    is a deprecated alias of ``seed``.

    Examples
    --------
    >>> import torch
    >>> A = torch.diag(torch.tensor([6.0, 5.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64))[None]
    >>> U, s = class_top_eigh(A, 2, [5], decomposition="randomized", oversample=2)
    >>> U.shape, torch.allclose(s, torch.tensor([[6.0, 5.0]], dtype=torch.float64))
    (torch.Size([1, 6, 2]), True)
    """
    if decomposition not in ("eigh", "randomized"):
        raise ValueError(f"decomposition must be 'eigh' or 'randomized'; got {decomposition!r}")
    labels = [int(c) for c in labels]
    d = A.shape[-1]
    if len(labels) != A.shape[0]:
        raise ValueError(f"class_top_eigh: {len(labels)} labels for {A.shape[0]} matrices")
    if decomposition == "eigh" or rank + oversample >= d:
        return top_eigh(A, rank)
    k = rank + oversample
    omega = torch.empty(len(labels), d, k, dtype=A.dtype)
    g = torch.Generator()
    for i, c in enumerate(labels):
        g.manual_seed(seed * _SEED_STRIDE + c % _SEED_STRIDE)
        omega[i] = torch.randn(d, k, dtype=A.dtype, generator=g)
    return randomized_top_eigh(A, rank, n_iter=n_iter, test_matrix=omega.to(A.device))
