"""LR-RGDA: RGDA whose class covariances are rank-r perturbations of a shared base.

With ``B = alpha2 Sigma_avg + alpha3 I`` and the top-r eigenpairs ``(U_c, s_c)`` of ``Sigma_c``,
``Sigma_c^reg ~= B + Ut_c Ut_c^T`` where ``Ut_c = sqrt(alpha1) U_c diag(sqrt(s_c))``. Woodbury and
the matrix determinant lemma give, with ``M_c = I_r + Ut_c^T B^{-1} Ut_c``::

    g_c(x) = w_c^T x + b_c + 1/2 (x - mu_c)^T P_c^T M_c^{-1} P_c (x - mu_c),   P_c = Ut_c^T B^{-1}
    w_c = B^{-1} mu_c
    b_c = -1/2 mu_c^T B^{-1} mu_c - 1/2 (logdet B + logdet M_c) + log pi_c

which is the exact discriminant of the rank-r model plus ``1/2 x^T B^{-1} x`` (the same for every
class). We compute ``P_c = Ut_c^T B^{-1}`` with one GEMM against ``B^{-1}`` (from the Cholesky factor of
``B``), then ``M_c = I + P_c Ut_c``, an ``r x r`` product. Diagonalising
``P_c Ut_c = W_c diag(sigma_c^2) W_c^T`` folds ``M_c^{-1}`` into the projection,
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
from ..linalg import class_top_eigh, logdet_from_cholesky, psd_cholesky, symmetrize
from ..lowrank_stats import LowRankGaussians
from ..stats import ClassGaussians, ClassStatistics
from .base import GaussianHead
from .rgda import PAPER_ALPHAS, check_alphas

__all__ = ["LRRGDA"]


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
    which costs ``O(C d^2 r)`` in GEMMs: in float64 for float64 heads, in float32 (twice as
    fast) for heads stored in a lower precision. Eigendecompositions always run in float64.

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

    def _eigenpairs(self, stats: ClassStatistics, block: int):
        """``(U, s)`` of every class, reusing cached pairs of unchanged classes.

        :class:`~gdacil.LowRankGaussians` of rank ``q >= r`` already hold the top eigenpairs:
        the cache then holds views of their storage (no decomposition, no copy;
        ``n_decomposed_ = 0``) and ``decomposition`` is not used.
        """
        key = self._decomposition_key(stats.dim)
        if isinstance(stats, LowRankGaussians):
            if stats.rank < key[1]:
                raise ValueError(
                    f"LR-RGDA rank {self.rank} exceeds the rank q = {stats.rank} of the low-rank "
                    f"statistics; use rank <= {stats.rank}, or compress with rank >= {key[1]}")
            # views of the statistics' storage (copied only to reach another device)
            U, s = (t.to(self.device_) for t in stats.eigenpairs(rank=key[1]))
            self._eig_cache = {c: (stats.revision(c), U[i], s[i])
                               for i, c in enumerate(stats.classes)}
            self._eig_cache_key = ("stored", key[1])
            self.n_decomposed_ = 0
            return
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
        return class_top_eigh(covs, key[1], labels, decomposition=key[0],
                              oversample=self.oversample, n_iter=self.n_iter,
                              random_state=self.random_state)

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
        B_inv = symmetrize(L_B_inv.T @ L_B_inv)
        B_inv_mu = mu @ B_inv
        # heads stored below float64 run the per-class products in float32: twice the GEMM rate
        work = torch.float64 if self.dtype == torch.float64 else torch.float32
        B_inv_work = B_inv.to(work)
        labels = stats.classes
        C = len(labels)
        # rows are written block by block in the head's dtype: no float64 copy of all of them
        rows = torch.empty(C, r + 1, d, dtype=self.dtype, device=self.device_)
        bias = torch.empty(C, r + 1, dtype=torch.float64, device=self.device_)
        logdet_M = torch.empty(C, dtype=torch.float64, device=self.device_)
        kappa = torch.empty(C, r, dtype=torch.float64, device=self.device_)
        rows[:, 0] = B_inv_mu.to(self.dtype)
        for start in range(0, C, block):
            stop = min(C, start + block)
            pairs = [self._eig_cache[c] for c in labels[start:stop]]
            U = torch.stack([p[1] for p in pairs])
            s = torch.stack([p[2] for p in pairs])
            Ut = (U.to(torch.float64) * (a1 * s).sqrt()[:, None, :]).to(work)
            # the only O(d^2 r) product per class; it is all a refit must redo when B moves
            P = Ut.transpose(1, 2) @ B_inv_work                          # Ut^T B^{-1}, (k, r, d)
            # M_c - I = Ut^T B^{-1} Ut = W diag(sigma^2) W^T, sigma^2 descending
            sigma2, W = torch.linalg.eigh(symmetrize((P @ Ut).to(torch.float64)))
            sigma2, W = sigma2.flip(-1).clamp_min(0.0), W.flip(-1)
            A = (W.transpose(1, 2).to(work) @ P) / (1.0 + sigma2).sqrt()[:, :, None].to(work)
            A = A.to(torch.float64)                                      # A^T A = P^T M^-1 P
            rows[start:stop, 1:] = A.to(self.dtype)
            bias[start:stop, 1:] = -(A @ mu[start:stop, :, None])[:, :, 0]
            logdet_M[start:stop] = torch.log1p(sigma2).sum(-1)
            kappa[start:stop] = sigma2 / (1.0 + sigma2)
        mean_precision = (mu * B_inv_mu).sum(1)
        bias[:, 0] = (-0.5 * mean_precision - 0.5 * (logdet_B + logdet_M)
                      + log_priors.to(self.device_))
        self._bounds = {"kappa_": kappa, "mean_precision_": mean_precision,
                        "base_whitener_": L_B_inv}
        return rows, bias, 1.0

    def fit(self, stats: ClassGaussians) -> "LRRGDA":
        self.__dict__.pop("_screen_cache", None)
        super().fit(stats)
        for name, value in self._bounds.items():
            setattr(self, name, value.to(device=self.device_, dtype=self.dtype))
        del self._bounds
        self.linear_bias_ = self.bias_[:, 0].contiguous()
        return self

    # ------------------------------------------------------- pruned inference
    def top_k(self, X, k: int = 5, *, pruned: bool = True, screen_rank: int = 4,
              sample_batch: int = 2048):
        """The ``k`` best classes of every sample and their scores, exactly as the dense scores rank them.

        With ``pruned=True`` the full quadratic term is computed only where it can matter. A
        screening GEMM against the linear row and the first ``screen_rank`` (``j``) quadratic
        rows of every class gives, with ``t_i`` the whitened coordinates and ``m_c`` the
        Mahalanobis distance under ``B`` (which follows from the linear score)::

            lower_c = w_c^T x + b_c + 1/2 sum_{i <= j} kappa_ci t_i^2
            upper_c = lower_c + 1/2 kappa_{c,j+1} (m_c - sum_{i <= j} t_i^2)

        A class whose upper bound is below the ``k``-th best lower bound cannot be in the top
        ``k``; for the others (with a margin for rounding) the remaining ``r - j`` rows are
        scored, class by class, for just the samples that need them. ``last_pruning_`` reports
        the fraction of (sample, class) pairs scored in full and of classes any sample needed.

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
        out_scores, out_idx, pairs, classes = [], [], 0, 0
        for start in range(0, X.shape[0], sample_batch):
            chunk = X[start:start + sample_batch]
            scores, idx, n_pairs, n_classes = self._pruned_top_k(chunk, k, j)
            out_scores.append(scores)
            out_idx.append(idx)
            pairs += n_pairs
            classes += n_classes * len(chunk)
        self.last_pruning_ = {"pairs_scored_fraction": pairs / (X.shape[0] * C),
                              "classes_scored_fraction": classes / (X.shape[0] * C),
                              "screen_rank": j}
        return torch.cat(out_scores), self.classes_[torch.cat(out_idx).cpu()]

    def _screen_rows(self, j: int):
        """Contiguous copies of the first ``1 + j`` rows of every class, kept for reuse."""
        cached = getattr(self, "_screen_cache", None)
        if cached is None or cached[0] != j:
            cached = (j, self.rows_[:, : 1 + j].contiguous(), self.bias_[:, : 1 + j].contiguous())
            self._screen_cache = cached
        return cached[1], cached[2]

    def _bounds(self, X: torch.Tensor, j: int):
        """Lower bounds, upper bounds plus rounding margin ``(n, C)``, and the largest margin."""
        screen_rows, screen_bias = self._screen_rows(j)
        (n, d), C = X.shape, screen_rows.shape[0]
        lower = torch.empty(n, C, dtype=X.dtype, device=X.device)
        upper = torch.empty_like(lower)
        max_margin = torch.zeros(n, 1, dtype=X.dtype, device=X.device)
        sq_norm = (X @ self.base_whitener_.T).square().sum(1, keepdim=True)   # x^T B^{-1} x
        eps = 64 * torch.finfo(self.dtype).eps
        block = self._block_size(1 + j, n)
        for a in range(0, C, block):
            b = min(C, a + block)
            Z = torch.addmm(screen_bias[a:b].reshape(-1), X,
                            screen_rows[a:b].reshape(-1, d).T).view(n, b - a, 1 + j)
            lin, T2 = Z[:, :, 0], Z[:, :, 1:].square()
            kappa = self.kappa_[a:b, :j]
            low = lin + 0.5 * T2.sum(-1)
            wx = lin - self.linear_bias_[a:b]
            mahalanobis = sq_norm - 2.0 * wx + self.mean_precision_[a:b]  # (x-mu)^T B^-1 (x-mu)
            covered = (T2 * torch.where(kappa > 0, 1.0 / kappa, 0.0)).sum(-1)
            kappa_next = (self.kappa_[a:b, j] if j < self.kappa_.shape[1]
                          else torch.zeros_like(lin[0]))
            # rounding: the bound terms are differences of sums up to these magnitudes
            margin = eps * (low.abs() + sq_norm + 2.0 * wx.abs() + self.mean_precision_[a:b]
                            + covered)
            lower[:, a:b] = low
            upper[:, a:b] = (low + 0.5 * kappa_next * (mahalanobis - covered).clamp_min(0.0)
                             + margin)
            max_margin = torch.maximum(max_margin, margin.amax(1, keepdim=True))
        return lower, upper, max_margin

    def _pruned_top_k(self, X: torch.Tensor, k: int, j: int):
        lower, upper, max_margin = self._bounds(X, j)
        threshold = lower.topk(k, dim=1).values[:, -1:]
        cls, smp = (upper >= threshold - max_margin).T.nonzero(as_tuple=True)  # class-major
        labels, counts = torch.unique_consecutive(cls, return_counts=True)
        scores = torch.full_like(lower, -torch.inf)
        stop = 0
        for c, m in zip(labels.tolist(), counts.tolist()):
            idx = smp[stop:stop + m]
            stop += m
            rest = torch.addmm(self.bias_[c, 1 + j:], X[idx], self.rows_[c, 1 + j:].T)
            scores[idx, c] = lower[idx, c] + (0.5 * self.sign_) * rest.square().sum(1)
        best, idx = scores.topk(k, dim=1)
        return best, idx, len(smp), len(labels)

    def _extra_memory(self) -> dict[str, int]:
        cache = getattr(self, "_eig_cache", {})
        borrowed = getattr(self, "_eig_cache_key", ("",))[0] == "stored"  # views of the statistics
        report = {"eigenpair_cache": 0 if borrowed else
                  sum(u.nbytes + s.nbytes for _, u, s in cache.values())}
        if hasattr(self, "_screen_cache"):
            report["screening_rows"] = self._screen_cache[1].nbytes + self._screen_cache[2].nbytes
        if hasattr(self, "kappa_"):
            report["pruning_bounds"] = sum(t.nbytes for t in (
                self.kappa_, self.mean_precision_, self.base_whitener_, self.linear_bias_))
        return report
