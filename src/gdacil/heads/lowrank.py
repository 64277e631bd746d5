"""LR-RGDA: RGDA whose class covariances are rank-r perturbations of a shared base.

With ``B = alpha2 Sigma_avg + alpha3 I`` and the top-r eigenpairs ``(U_c, s_c)`` of ``Sigma_c``,
``Sigma_c^reg ~= B + Ut_c Ut_c^T`` where ``Ut_c = sqrt(alpha1) U_c diag(sqrt(s_c))``. Woodbury and
the matrix determinant lemma give, with ``M_c = I_r + Ut_c^T B^{-1} Ut_c = R_c R_c^T``::

    g_c(x) = w_c^T x + b_c + 1/2 || R_c^{-1} Ut_c^T B^{-1} (x - mu_c) ||^2
    w_c = B^{-1} mu_c
    b_c = -1/2 mu_c^T B^{-1} mu_c - 1/2 (logdet B + logdet M_c) + log pi_c

which is the exact discriminant of the rank-r model plus ``1/2 x^T B^{-1} x`` (the same for every
class). ``R_c^{-1}`` is folded into the projection, so scoring is one GEMM against the stacked
``(C (r + 1), d)`` rows plus a squared norm.

We compute with the whitening ``V_c = L_B^{-1} Ut_c`` (``B = L_B L_B^T``): then
``M_c = I + V_c^T V_c`` and ``Ut_c^T B^{-1} = V_c^T L_B^{-1}``, both plain GEMMs.
"""

from __future__ import annotations

import torch

from .._validation import check_positive_int
from ..linalg import logdet_from_cholesky, psd_cholesky, randomized_top_eigh, top_eigh
from ..stats import ClassGaussians
from .base import GaussianHead, stack_rows
from .rgda import PAPER_ALPHAS, check_alphas

__all__ = ["LRRGDA"]

_SEED_STRIDE = 1_000_003


class LRRGDA(GaussianHead):
    """Low-rank regularised Gaussian discriminant analysis (the paper's LR-RGDA).

    Parameters
    ----------
    rank : int, default 64
        Rank ``r`` of each class's covariance perturbation (``r = d`` reproduces :class:`RGDA`).
    alpha1, alpha2, alpha3 : float >= 0, default (0.2, 2.0, 0.5)
        ``alpha2 Sigma_avg + alpha3 I`` must be positive definite (``alpha3 > 0`` guarantees it).
    decomposition : {"randomized", "eigh"}, default "randomized"
        How the top-r eigenpairs of each ``Sigma_c`` are found: seeded randomized subspace
        iteration with ``oversample`` extra columns and ``n_iter`` power iterations, or an exact
        symmetric eigendecomposition.
    oversample : int, default 16
    n_iter : int, default 4
    random_state : int, default 0
        Seed of the randomized decomposition. Each class draws its own test matrix from
        ``(random_state, label)``, so results do not depend on class order or batching.
    priors, device, dtype, class_batch_size
        See :class:`~gdacil.heads.base.GaussianHead`.

    Notes
    -----
    Refitting after classes were added (or changed) decomposes only the new or changed classes:
    the head caches each class's eigenpairs keyed by the statistics' revision of that class. The
    terms that depend on ``B`` (which moves with ``Sigma_avg``) are recomputed for all classes,
    which costs ``O(C d^2 r)`` in GEMMs.

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.heads import LRRGDA
    >>> g = torch.Generator().manual_seed(0)
    >>> X, y = torch.randn(600, 16, generator=g), torch.arange(600) % 3
    >>> X[y == 2] += 2.0
    >>> stats = ClassGaussians(16).update(X, y)
    >>> head = LRRGDA(rank=4).fit(stats)
    >>> head.predict(X[:5]).shape, head.rows_.shape
    (torch.Size([5]), torch.Size([3, 5, 16]))
    """

    def __init__(self, rank=64, alpha1=PAPER_ALPHAS[0], alpha2=PAPER_ALPHAS[1],
                 alpha3=PAPER_ALPHAS[2], *, decomposition="randomized", oversample=16, n_iter=4,
                 random_state=0, priors=None, device=None, dtype=torch.float64,
                 class_batch_size="auto"):
        super().__init__(priors=priors, device=device, dtype=dtype, class_batch_size=class_batch_size)
        self.rank = rank
        self.alpha1 = alpha1
        self.alpha2 = alpha2
        self.alpha3 = alpha3
        self.decomposition = decomposition
        self.oversample = oversample
        self.n_iter = n_iter
        self.random_state = random_state

    def _check_params(self) -> None:
        super()._check_params()
        check_positive_int(self.rank, "rank")
        check_alphas(self.alpha1, self.alpha2, self.alpha3)
        if self.decomposition not in ("randomized", "eigh"):
            raise ValueError(f"decomposition must be 'randomized' or 'eigh'; got {self.decomposition!r}")
        check_positive_int(self.oversample, "oversample", minimum=0)
        check_positive_int(self.n_iter, "n_iter", minimum=0)
        if not isinstance(self.random_state, int):
            raise ValueError(f"random_state must be an int seed; got {self.random_state!r}")

    # ------------------------------------------------------------ eigenpairs
    def _decomposition_key(self, dim: int) -> tuple:
        r = min(self.rank, dim)
        if self.decomposition == "eigh" or r + self.oversample >= dim:
            return ("eigh", r)
        return ("randomized", r, self.oversample, self.n_iter, self.random_state)

    def _eigenpairs(self, stats: ClassGaussians, block: int):
        """``(U, s)`` of every class, reusing cached pairs of unchanged classes."""
        key = self._decomposition_key(stats.dim)
        cache = getattr(self, "_eig_cache", {})
        if getattr(self, "_eig_cache_key", None) != key:
            cache = {}
        stale = [c for c in stats.classes if cache.get(c, (None,))[0] != stats.revision(c)]
        for start in range(0, len(stale), block):
            labels = stale[start : start + block]
            covs = stats.covariances(labels).to(self.device_)
            U, s = self._decompose(covs, labels, key)
            for i, c in enumerate(labels):
                cache[c] = (stats.revision(c), U[i], s[i])
        self._eig_cache = {c: cache[c] for c in stats.classes}
        self._eig_cache_key = key
        self.n_decomposed_ = len(stale)

    def _decompose(self, covs, labels, key):
        r = key[1]
        if key[0] == "eigh":
            return top_eigh(covs, r)
        d = covs.shape[-1]
        omega = torch.empty(len(labels), d, r + self.oversample, dtype=torch.float64)
        g = torch.Generator()
        for i, c in enumerate(labels):
            g.manual_seed(self.random_state * _SEED_STRIDE + int(c) % _SEED_STRIDE)
            omega[i] = torch.randn(d, r + self.oversample, dtype=torch.float64, generator=g)
        return randomized_top_eigh(covs, r, n_iter=self.n_iter, test_matrix=omega.to(covs.device))

    # ----------------------------------------------------------------- build
    def _build(self, stats, log_priors):
        a1, a2, a3 = check_alphas(self.alpha1, self.alpha2, self.alpha3)
        if a2 == 0.0 and a3 == 0.0:
            raise ValueError("LR-RGDA needs alpha2 > 0 or alpha3 > 0: its base "
                             "B = alpha2 Sigma_avg + alpha3 I must be positive definite")
        d = stats.dim
        eye = torch.eye(d, dtype=torch.float64, device=self.device_)
        avg = stats.average_covariance().to(self.device_) if a2 else torch.zeros_like(eye)
        L_B = psd_cholesky(a2 * avg + a3 * eye, name="LR-RGDA base B = alpha2 Sigma_avg + alpha3 I")
        L_B_inv = torch.linalg.solve_triangular(L_B, eye, upper=False)
        logdet_B = logdet_from_cholesky(L_B)
        r = min(self.rank, d)
        block = self._block_size(r + 1)
        self._eigenpairs(stats, block)

        mu = stats.means.to(self.device_)
        B_inv_mu = (L_B_inv.T @ (L_B_inv @ mu.T)).T
        quads, quad_biases, logdet_M = [], [], []
        labels = stats.classes
        for start in range(0, len(labels), block):
            pairs = [self._eig_cache[c] for c in labels[start : start + block]]
            U = torch.stack([p[1] for p in pairs])
            s = torch.stack([p[2] for p in pairs])
            Ut = U * (a1 * s).sqrt()[:, None, :]
            V = L_B_inv @ Ut                                            # (k, d, r)
            M = torch.eye(r, dtype=torch.float64, device=self.device_) + V.transpose(1, 2) @ V
            R = psd_cholesky(M, name="LR-RGDA core M_c")
            P = V.transpose(1, 2) @ L_B_inv                              # Ut^T B^{-1}, (k, r, d)
            A = torch.linalg.solve_triangular(R, P, upper=False)         # R^{-1} Ut^T B^{-1}
            quads.append(A)
            quad_biases.append(-(A @ mu[start : start + len(pairs), :, None])[:, :, 0])
            logdet_M.append(logdet_from_cholesky(R))
        bias = (-0.5 * (mu * B_inv_mu).sum(1) - 0.5 * (logdet_B + torch.cat(logdet_M))
                + log_priors.to(self.device_))
        return (*stack_rows(B_inv_mu, bias, torch.cat(quads), torch.cat(quad_biases)), 1.0)

    def _extra_memory(self) -> dict[str, int]:
        cache = getattr(self, "_eig_cache", {})
        return {"eigenpair_cache": sum(u.nbytes + s.nbytes for _, u, s in cache.values())}
