"""Dense linear algebra shared by the heads, the statistics and the compensators.

Everything here is batched over a leading class dimension: ``A`` has shape ``(..., d, d)``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from .._deprecation import renamed_parameters

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


def top_eigh(A: torch.Tensor, rank: int, *, return_smallest: bool = False):
    """Exact top-``rank`` eigenpairs of symmetric ``A``, eigenvalues descending and clamped at 0.

    Returns ``(U, s)`` with ``U`` of shape ``(..., d, rank)`` and ``s`` of shape ``(..., rank)``,
    and with ``return_smallest`` also every matrix's smallest eigenvalue ``(...,)`` (unclamped:
    how far a matrix is from positive semi-definite).

    Float32 and float64 matrices on the CPU go through LAPACK's tridiagonal route, which only
    forms the eigenvectors it returns (:func:`lapack_top_eigh`, with SciPy installed): at
    ``d = 768, rank = 64`` about 1.5x faster than a full ``torch.linalg.eigh``, reading each
    matrix's upper triangle (``A`` is symmetric to round-off). Elsewhere the full decomposition
    of ``(A + A^T) / 2`` is taken; both agree to round-off.
    """
    try:
        U, s, smallest = _top_eigh_lapack(A, rank)
    except LapackError:
        # MRRR (?stemr) can fail to converge on tightly clustered eigenvalues of a finite
        # matrix; the full divide-and-conquer decomposition does not (a NaN or inf still fails)
        if not torch.isfinite(A).all():
            raise
        U = None
    if U is None:
        full, V = torch.linalg.eigh(symmetrize(A))
        U, s, smallest = V.flip(-1)[..., :rank], full.flip(-1)[..., :rank], full[..., 0]
    s = s.clamp_min(0.0)
    return (U, s, smallest) if return_smallest else (U, s)


def _top_eigh_lapack(A: torch.Tensor, rank: int):
    """:func:`top_eigh` through :func:`lapack_top_eigh` where it applies, else ``(None,) * 3``."""
    if not (A.device.type == "cpu" and A.dtype in (torch.float32, torch.float64)
            and 0 < rank < A.shape[-1] and A.numel() and _lapack() is not None):
        return None, None, None
    d = A.shape[-1]
    # LAPACK reads one triangle, here the upper one of each row-major matrix (the lower
    # triangle of its column-major transpose, passed without a copy)
    vectors, values, lowest = zip(*(lapack_top_eigh(a.T, rank)
                                    for a in A.detach().reshape(-1, d, d).numpy()))
    U = torch.from_numpy(np.stack(vectors)).reshape(*A.shape[:-1], rank)
    s = torch.from_numpy(np.stack(values)).reshape(*A.shape[:-2], rank)
    return U, s, torch.tensor(lowest, dtype=A.dtype).reshape(A.shape[:-2])


def lapack_top_eigh(a: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Top-``rank`` eigenpairs (descending) and the smallest eigenvalue of one symmetric matrix
    ``a``, of which only the lower triangle is read.

    Householder tridiagonalisation (``?sytrd``, the bulk of the cost), the top eigenpairs of the
    tridiagonal matrix by MRRR (``?stemr``), its smallest eigenvalue by bisection (``?stebz``),
    and the eigenvectors carried back by the Householder reflectors (``?ormqr``): what LAPACK's
    ``?syevr`` does for an index range, plus the smallest eigenvalue at almost no cost.
    """
    lapack, p = _lapack(), "d" if a.dtype == np.float64 else "s"
    if lapack is None:
        raise ModuleNotFoundError("lapack_top_eigh needs SciPy: pip install scipy")
    sytrd, stemr, stebz, ormqr = (getattr(lapack, p + name)
                                  for name in ("sytrd", "stemr", "stebz", "ormqr"))
    d = a.shape[0]
    lwork = int(getattr(lapack, p + "sytrd_lwork")(d, lower=1)[0])
    reflectors, diag, off, tau, info = sytrd(a, lower=1, lwork=lwork)
    _check_lapack(info, "sytrd")
    found, w, z, info = stemr(diag, np.append(off, 0.0).astype(a.dtype), 3, 0.0, 0.0,
                              d - rank + 1, d, compute_v=1)
    _check_lapack(info, "stemr")
    if found != rank:
        raise ValueError(f"lapack_top_eigh: found {found} of {rank} eigenpairs")
    lowest = stebz(diag, off, 3, 0.0, 0.0, 1, 1, 0.0, "E")
    _check_lapack(lowest[-1], "stebz")
    z = np.asfortranarray(z[:, :rank])
    v, tau = reflectors[1:, : d - 1], tau[: d - 1]
    lwork = int(ormqr("L", "N", v, tau, z[1:], -1)[1][0])
    z[1:], _, info = ormqr("L", "N", v, tau, z[1:], lwork)
    _check_lapack(info, "ormqr")
    return z[:, ::-1], w[:rank][::-1], float(lowest[1][0])


def _lapack():
    """``scipy.linalg.lapack``, or None without SciPy (an optional dependency: it comes with the
    ``sklearn`` extra)."""
    try:
        from scipy.linalg import lapack
    except ImportError:
        return None
    return lapack


class LapackError(ValueError):
    """A LAPACK routine reported a failure (its ``info`` was not 0)."""


def _check_lapack(info: int, routine: str) -> None:
    if info != 0:
        raise LapackError(f"LAPACK ?{routine} failed (info={info}); the matrix holds NaN or inf, "
                         "or is too ill-conditioned for its precision")


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


def reorthonormalize(U: torch.Tensor) -> torch.Tensor:
    """``U (U^T U)^{-1/2}``-like cleanup of columns that are orthonormal to a few digits (e.g.
    float32 eigenvectors): one pass of CholeskyQR, ``U L^{-T}`` with ``L L^T = U^T U``. For
    ``|U^T U - I| << 1`` this is orthonormal to round-off and moves each column by about its
    loss of orthogonality; for anything else use :func:`orthonormalize`."""
    L = torch.linalg.cholesky(U.transpose(-1, -2) @ U)
    return torch.linalg.solve_triangular(L.transpose(-1, -2), U, upper=True, left=False)


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
