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

#: Consecutive classes per batched GEMM when the pruned top-k finishes its candidate pairs
_RESCORE_CLASSES = 16
#: ... scored against every sample (one plain GEMM, no gather) when one of them needs at least
#: this share of the samples: a padded, gathered GEMM then costs more
_DENSE_SHARE = 1 / 3


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
        rows of every class gives, with ``m_c`` the ``B``-Mahalanobis distance of ``x`` to
        ``mu_c`` (which follows from the linear score)::

            lower_c = w_c^T x + b_c + 1/2 ||A_c[:j] (x - mu_c)||^2
            upper_c = lower_c + 1/2 kappa_{c,j+1} m_c

        The ``k`` classes with the best lower bounds are scored exactly; the ``k``-th best of
        those scores is a floor that the ``k``-th best class reaches. Every (sample, class) pair
        whose upper bound reaches the floor (less a margin for rounding) then gets its remaining
        rows in rounds (``j -> 3j -> ... -> r`` rows), and after each round the pairs whose
        tightened bounds fall short are dropped. Rounds run class by class in batched GEMMs
        over just the samples that need each class. ``last_pruning_`` reports the fraction of
        (sample, class) pairs that passed screening and of classes any sample needed.

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

    def _screening(self, j: int) -> dict:
        """The first ``1 + j`` rows of every class (contiguous) and the per-class constants of
        the bounds, kept for reuse until the next ``fit``."""
        cached = getattr(self, "_screen_cache", None)
        if cached is None or cached["j"] != j:
            cached = {"j": j, "rows": self.rows_[:, : 1 + j].contiguous(),
                      "bias": self.bias_[:, : 1 + j].contiguous(),
                      # (x-mu)^T B^-1 (x-mu) = x^T B^-1 x - 2 (lin - b) + mu^T B^-1 mu
                      "offset": self.mean_precision_ + 2.0 * self.linear_bias_,
                      # kappa_{c,i+1} / 2 bounds the rest after i rows (0 after all r rows)
                      "half_kappa": 0.5 * torch.nn.functional.pad(self.kappa_, (0, 1))}
            self._screen_cache = cached
        return cached

    def _bounds(self, X: torch.Tensor, j: int):
        """Lower bounds of the scores and ``B``-Mahalanobis distances, both ``(n, C)``, and a
        per-sample rounding margin ``(n, 1)`` that covers every bound built from them."""
        screen = self._screening(j)
        rows, bias, offset = screen["rows"], screen["bias"], screen["offset"]
        (n, d), C = X.shape, rows.shape[0]
        lower = torch.empty(n, C, dtype=X.dtype, device=X.device)
        mahalanobis = torch.empty_like(lower)
        size = torch.zeros(n, 1, dtype=X.dtype, device=X.device)
        sq_norm = (X @ self.base_whitener_.T).square().sum(1, keepdim=True)   # x^T B^{-1} x
        block = self._block_size(1 + j, n)
        for a in range(0, C, block):
            b = min(C, a + block)
            Z = torch.addmm(bias[a:b].reshape(-1), X, rows[a:b].reshape(-1, d).T
                            ).view(n, b - a, 1 + j)
            lin, Q = Z[:, :, 0], Z[:, :, 1:]
            low = torch.add(lin, torch.linalg.vecdot(Q, Q), alpha=0.5 * self.sign_,
                            out=lower[:, a:b])
            torch.add(offset[a:b], lin, alpha=-2.0, out=mahalanobis[:, a:b]
                      ).add_(sq_norm).clamp_min_(0.0)
            # every term above is a sum of terms no larger than these magnitudes
            size = torch.maximum(size, low.abs().amax(1, keepdim=True)
                                 + 2.0 * lin.abs().amax(1, keepdim=True)
                                 + offset[a:b].abs().max())
        margin = 64 * torch.finfo(self.dtype).eps * (size + sq_norm)
        return lower, mahalanobis, margin

    def _pruned_top_k(self, X: torch.Tensor, k: int, j: int):
        """Screen with ``j`` rows, then add rows in rounds (``j -> 3j -> ... -> r``) to the
        pairs whose upper bound still reaches the ``k``-th best lower bound of their sample."""
        lower, mahalanobis, margin = self._bounds(X, j)
        r, half_kappa = self.rows_.shape[1] - 1, self._screening(j)["half_kappa"]
        # the exact scores of the k best lower bounds: k classes score at least their minimum
        floor = self._exact_scores(X, lower, lower.topk(k, dim=1).indices, j).amin(1, keepdim=True)
        threshold = floor - 2.0 * margin        # bounds and threshold carry one margin each
        # the rest of the quadratic term is at most kappa_{j+1} / 2 times the distance
        cls, smp = (torch.addcmul(lower, half_kappa[:, j], mahalanobis) >= threshold
                    ).T.nonzero(as_tuple=True)                           # sorted by class
        scored, classes = len(smp), len(torch.unique_consecutive(cls))
        low, dist = lower[smp, cls], mahalanobis[smp, cls]
        done = j
        while done < r:
            step = min(r, max(4, 3 * done))
            low += (0.5 * self.sign_) * self._row_norms(X, cls, smp, done, step)
            done = step
            if done == r:
                break
            lower[smp, cls] = low                          # still lower bounds, now tighter
            threshold = torch.maximum(lower.topk(k, dim=1).values[:, -1:], floor) - 2.0 * margin
            keep = torch.addcmul(low, half_kappa[cls, done], dist) >= threshold[smp, 0]
            cls, smp, low, dist = cls[keep], smp[keep], low[keep], dist[keep]
        scores = torch.full_like(lower, -torch.inf)
        scores[smp, cls] = low
        best, idx = scores.topk(k, dim=1)
        return best, idx, scored, classes

    def _exact_scores(self, X: torch.Tensor, lower: torch.Tensor, idx: torch.Tensor, j: int
                      ) -> torch.Tensor:
        """Scores ``(n, k)`` of the classes ``idx`` ``(n, k)``: their lower bounds after ``j``
        rows plus the remaining rows."""
        smp = torch.arange(len(idx), device=idx.device).repeat_interleave(idx.shape[1])
        order = torch.argsort(idx.reshape(-1), stable=True)
        cls, smp = idx.reshape(-1)[order], smp[order]
        rest = self._row_norms(X, cls, smp, j, self.rows_.shape[1] - 1)
        out = torch.empty(idx.numel(), dtype=lower.dtype, device=lower.device)
        out[order] = lower[smp, cls] + (0.5 * self.sign_) * rest
        return out.view_as(idx)

    def _row_norms(self, X: torch.Tensor, cls: torch.Tensor, smp: torch.Tensor, start: int,
                   stop: int) -> torch.Tensor:
        """``sum_{start < i <= stop} (A_ci x + b_ci)^2`` of the pairs ``(cls, smp)``, sorted by class.

        Classes go ``_RESCORE_CLASSES`` at a time: one batched GEMM of their rows (a view, never
        a copy: gathering rows costs more than the products) against their samples, padded to
        the largest count among them.
        """
        C, d = self.rows_.shape[0], X.shape[1]
        out = torch.zeros(len(cls), dtype=X.dtype, device=X.device)
        counts = torch.bincount(cls, minlength=C)
        first = torch.cumsum(counts, 0) - counts
        starts = list(range(0, C, _RESCORE_CLASSES)) + [C]
        offsets = torch.searchsorted(cls, torch.tensor(starts, device=cls.device)).tolist()
        rows, bias = self.rows_[:, 1 + start:1 + stop], self.bias_[:, 1 + start:1 + stop]
        n, width = X.shape[0], stop - start
        for c0, c1, p0, p1 in zip(starts, starts[1:], offsets, offsets[1:]):
            if p0 == p1:
                continue
            member, samples = cls[p0:p1] - c0, smp[p0:p1]
            most = int(counts[c0:c1].max())
            if most >= _DENSE_SHARE * n:
                Z = torch.addmm(bias[c0:c1].reshape(-1), X, rows[c0:c1].reshape(-1, d).T)
                Z = Z.view(n * (c1 - c0), width).index_select(0, samples * (c1 - c0) + member)
            else:                                 # padded batched GEMM of the needed samples
                at = member * most + torch.arange(p0, p1, device=cls.device) - first[cls[p0:p1]]
                Xg = X.new_zeros((c1 - c0) * most, d).index_copy_(0, at, X.index_select(0, samples))
                Z = torch.baddbmm(bias[c0:c1, None], Xg.view(c1 - c0, most, d),
                                  rows[c0:c1].transpose(1, 2))
                Z = Z.view(-1, width).index_select(0, at)
            out[p0:p1] = torch.linalg.vecdot(Z, Z)
        return out

    def _extra_memory(self) -> dict[str, int]:
        cache = getattr(self, "_eig_cache", {})
        borrowed = getattr(self, "_eig_cache_key", ("",))[0] == "stored"  # views of the statistics
        report = {"eigenpair_cache": 0 if borrowed else
                  sum(u.nbytes + s.nbytes for _, u, s in cache.values())}
        if hasattr(self, "_screen_cache"):
            report["screening_rows"] = sum(t.nbytes for t in self._screen_cache.values()
                                           if isinstance(t, torch.Tensor))
        if hasattr(self, "kappa_"):
            report["pruning_bounds"] = sum(t.nbytes for t in (
                self.kappa_, self.mean_precision_, self.base_whitener_, self.linear_bias_))
        return report
