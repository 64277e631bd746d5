"""LR-RGDA: RGDA whose class covariances are rank-r perturbations of a shared base.

With ``B = alpha2 Sigma_avg + alpha3 I`` and the top-r eigenpairs ``(U_c, s_c)`` of ``Sigma_c``,
``Sigma_c^reg ~= B + Ut_c Ut_c^T`` where ``Ut_c = sqrt(alpha1) U_c diag(sqrt(s_c))``. Woodbury and
the matrix determinant lemma give, with ``M_c = I_r + Ut_c^T B^{-1} Ut_c``::

    g_c(x) = w_c^T x + b_c + 1/2 (x - mu_c)^T P_c^T M_c^{-1} P_c (x - mu_c),   P_c = Ut_c^T B^{-1}
    w_c = B^{-1} mu_c
    b_c = -1/2 mu_c^T B^{-1} mu_c - 1/2 (logdet B + logdet M_c) + log pi_c

which is the exact discriminant of the rank-r model plus ``1/2 x^T B^{-1} x`` (the same for every
class). We compute with the whitening ``V_c = L_B^{-1} Ut_c`` (``B = L_B L_B^T``): then
``M_c = I + V_c^T V_c`` and ``P_c = V_c^T L_B^{-1}``, plain GEMMs. Diagonalising
``V_c^T V_c = W_c diag(sigma_c^2) W_c^T`` folds ``M_c^{-1}`` into the projection,
``A_c = diag(1 + sigma_c^2)^{-1/2} W_c^T P_c``, so scoring is one GEMM against the stacked
``(C (r + 1), d)`` rows plus a squared norm: ``1/2 ||A_c (x - mu_c)||^2``.

Row ``i`` of ``A_c`` is ``sqrt(kappa_ci)`` times a unit direction in ``B``-whitened space, with
``kappa_ci = sigma_ci^2 / (1 + sigma_ci^2) < 1`` descending. That ordering is what exact pruned
inference (:meth:`LRRGDA.top_k`) uses: the first ``j`` rows give a lower bound of the quadratic
term and, with ``kappa_{c,j+1}`` times the rest of the ``B``-Mahalanobis distance, an upper bound.
"""

from __future__ import annotations

import torch

from .._validation import check_positive_int
from ..linalg import (
    logdet_from_cholesky,
    psd_cholesky,
    randomized_top_eigh,
    symmetrize,
    top_eigh,
)
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
        quads, quad_biases, logdet_M, kappa = [], [], [], []
        labels = stats.classes
        for start in range(0, len(labels), block):
            pairs = [self._eig_cache[c] for c in labels[start : start + block]]
            U = torch.stack([p[1] for p in pairs])
            s = torch.stack([p[2] for p in pairs])
            Ut = U * (a1 * s).sqrt()[:, None, :]
            V = L_B_inv @ Ut                                            # (k, d, r)
            # M_c - I = V^T V = W diag(sigma^2) W^T, sigma^2 descending
            sigma2, W = torch.linalg.eigh(symmetrize(V.transpose(1, 2) @ V))
            sigma2, W = sigma2.flip(-1).clamp_min(0.0), W.flip(-1)
            P = V.transpose(1, 2) @ L_B_inv                              # Ut^T B^{-1}, (k, r, d)
            A = (W.transpose(1, 2) @ P) / (1.0 + sigma2).sqrt()[:, :, None]  # A^T A = P^T M^-1 P
            quads.append(A)
            quad_biases.append(-(A @ mu[start : start + len(pairs), :, None])[:, :, 0])
            logdet_M.append(torch.log1p(sigma2).sum(-1))
            kappa.append(sigma2 / (1.0 + sigma2))
        mean_precision = (mu * B_inv_mu).sum(1)
        bias = (-0.5 * mean_precision - 0.5 * (logdet_B + torch.cat(logdet_M))
                + log_priors.to(self.device_))
        self._bounds = {"kappa_": torch.cat(kappa), "mean_precision_": mean_precision,
                        "base_whitener_": L_B_inv}
        return (*stack_rows(B_inv_mu, bias, torch.cat(quads), torch.cat(quad_biases)), 1.0)

    def fit(self, stats: ClassGaussians) -> "LRRGDA":
        super().fit(stats)
        for name, value in self._bounds.items():
            setattr(self, name, value.to(device=self.device_, dtype=self.dtype))
        del self._bounds
        self.linear_bias_ = self.bias_[:, 0].contiguous()
        return self

    # ------------------------------------------------------- pruned inference
    def top_k(self, X, k: int = 5, *, pruned: bool = True, screen_rank: int = 8,
              sample_batch: int = 256):
        """The ``k`` best classes of every sample and their scores, exactly as the dense scores rank them.

        With ``pruned=True`` the full quadratic term is computed only where it can matter. A
        screening GEMM against the linear row and the first ``screen_rank`` quadratic rows of
        every class gives, with ``t_i`` the whitened coordinates and ``m_c`` the Mahalanobis
        distance under ``B`` (which follows from the linear score)::

            lower_c = w_c^T x + b_c + 1/2 sum_{i <= j} kappa_ci t_i^2
            upper_c = lower_c + 1/2 kappa_{c,j+1} (m_c - sum_{i <= j} t_i^2)

        A class whose upper bound is below the ``k``-th best lower bound cannot be in the top
        ``k``; only the others are scored in full (with a margin for rounding). ``last_pruning_``
        reports the fraction of (sample, class) pairs and of classes scored in full.

        Returns
        -------
        scores : tensor ``(n, k)``, labels : int64 tensor ``(n, k)``; best first.
        """
        X = self._prepare(X)
        k = check_positive_int(k, "k")
        C, rows_per_class, _ = self.rows_.shape
        if k > C:
            raise ValueError(f"k = {k} exceeds the number of classes ({C})")
        j = min(check_positive_int(screen_rank, "screen_rank", minimum=0), rows_per_class - 1)
        if not pruned or j == rows_per_class - 1:
            scores, idx = self._decision(X).topk(k, dim=1)
            return scores, self.classes_[idx.cpu()]
        sample_batch = check_positive_int(sample_batch, "sample_batch")
        screen_rows = self.rows_[:, : 1 + j].contiguous()
        screen_bias = self.bias_[:, : 1 + j].contiguous()
        out_scores, out_idx, pairs, classes = [], [], 0, 0
        for start in range(0, X.shape[0], sample_batch):
            chunk = X[start:start + sample_batch]
            scores, idx, n_pairs, n_classes = self._pruned_top_k(chunk, k, screen_rows, screen_bias)
            out_scores.append(scores)
            out_idx.append(idx)
            pairs += n_pairs
            classes += n_classes * len(chunk)
        self.last_pruning_ = {"pairs_scored_fraction": pairs / (X.shape[0] * C),
                              "classes_scored_fraction": classes / (X.shape[0] * C)}
        return torch.cat(out_scores), self.classes_[torch.cat(out_idx).cpu()]

    def _pruned_top_k(self, X: torch.Tensor, k: int, screen_rows, screen_bias):
        n, (C, rows, d) = X.shape[0], screen_rows.shape
        j = rows - 1
        Z = torch.addmm(screen_bias.reshape(-1), X, screen_rows.reshape(-1, d).T).view(n, C, rows)
        lin, T2 = Z[:, :, 0], Z[:, :, 1:].square()
        kappa = self.kappa_[:, :j]
        lower = lin + 0.5 * T2.sum(-1)
        sq_norm = (X @ self.base_whitener_.T).square().sum(1, keepdim=True)   # x^T B^{-1} x
        wx = lin - self.linear_bias_
        mahalanobis = sq_norm - 2.0 * wx + self.mean_precision_               # (x-mu)^T B^-1 (x-mu)
        covered = (T2 * torch.where(kappa > 0, 1.0 / kappa, 0.0)).sum(-1)
        kappa_next = self.kappa_[:, j] if j < self.kappa_.shape[1] else torch.zeros_like(lin[0])
        upper = lower + 0.5 * kappa_next * (mahalanobis - covered).clamp_min(0.0)
        # rounding: the bound terms are differences of sums up to these magnitudes
        eps = 64 * torch.finfo(self.dtype).eps
        margin = eps * (lower.abs() + sq_norm + 2.0 * wx.abs() + self.mean_precision_ + covered)
        threshold = lower.topk(k, dim=1).values[:, -1:]
        candidate = upper + margin >= threshold - margin.amax(1, keepdim=True)
        cols = candidate.any(0).nonzero()[:, 0]
        exact = self._score_rows(X, self.rows_[cols], self.bias_[cols])
        scores = torch.full_like(lin, -torch.inf)
        scores[:, cols] = torch.where(candidate[:, cols], exact, -torch.inf)
        best, idx = scores.topk(k, dim=1)
        return best, idx, int(candidate.sum()), len(cols)

    def _extra_memory(self) -> dict[str, int]:
        cache = getattr(self, "_eig_cache", {})
        report = {"eigenpair_cache": sum(u.nbytes + s.nbytes for _, u, s in cache.values())}
        if hasattr(self, "kappa_"):
            report["pruning_bounds"] = sum(t.nbytes for t in (
                self.kappa_, self.mean_precision_, self.base_whitener_, self.linear_bias_))
        return report
